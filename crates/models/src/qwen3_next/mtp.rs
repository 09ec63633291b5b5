//! The multi-token-prediction (MTP) head of Qwen3.5 / Qwen3.6 / Qwen3-Next checkpoints (`mtp.*`;
//! llama.cpp's block `n_layer` with `nextn.*` tensors), after vLLM's
//! `Qwen3NextMultiTokenPredictor`. From the target's hidden state `h` at position `p` and the
//! token `t` at `p + 1` it predicts the token at `p + 2`:
//!
//! `x = fc([norm_e(embed(t)); norm_h(h)])`, one gated full-attention decoder layer at position
//! `p`, a final norm, then the target's own LM head. The embedding and LM head are the target's.
//!
//! `h` is what the target's LM head reads, *after* its final norm: vLLM's `Qwen3NextModel`
//! returns its hidden states normed and feeds those to the head. Drafting further tokens feeds the
//! head's own normed output back as `h`, with the token it drafted, at the next position.
//!
//! The head's attention layer keeps its keys and values in a one-layer [`SequenceCache`] of its
//! own ([`DraftHead::new_cache`]), not in the target's paged pool: they serve drafting only, so
//! they never enter the prefix cache, and a rejected draft's are dropped with
//! [`SequenceCache::truncate`] (the head has no recurrent state, so any position will do).
//! Position `i` of that cache holds the head's row for target position `i` (its RoPE position).

use candle_core::{DType, Device, Tensor};

use super::attention::GatedAttention;
use super::{load_attention, load_ffn, FeedForward, HybridConfig, Qwen3Next};
use crate::error::{ModelError, Result};
use crate::layers::RmsNorm;
use crate::linear::Linear;
use crate::paged_kv::KvShape;
use crate::weights::SafetensorsWeights;
use crate::{advance_all, batch_rows, BatchEntry, DraftHead, HeadRows, SequenceCache};

pub(super) struct MtpHead {
    pub(super) embedding_norm: RmsNorm,
    pub(super) hidden_norm: RmsNorm,
    /// `hidden × 2·hidden`: the normed embedding's columns first, then the hidden state's.
    pub(super) fc: Linear,
    pub(super) input_norm: RmsNorm,
    pub(super) attention: GatedAttention,
    pub(super) post_attention_norm: RmsNorm,
    pub(super) ffn: FeedForward,
    pub(super) norm: RmsNorm,
}

impl MtpHead {
    /// The head under `mtp.` when the checkpoint has one (`mtp.fc.weight`), all or nothing.
    pub(super) fn from_safetensors(
        cfg: &HybridConfig,
        w: &SafetensorsWeights,
    ) -> Result<Option<Self>> {
        if cfg.mtp_num_hidden_layers == Some(0) || !w.has_model_tensor("mtp.fc.weight") {
            return Ok(None);
        }
        check_one_layer(cfg)?;
        let norm = |name: &str| {
            RmsNorm::new_offset_by_one(w.model_tensor(&format!("mtp.{name}"))?, cfg.rms_norm_eps)
        };
        let p = "mtp.layers.0";
        Ok(Some(Self {
            embedding_norm: norm("pre_fc_norm_embedding.weight")?,
            hidden_norm: norm("pre_fc_norm_hidden.weight")?,
            fc: super::dense_linear(w.model_tensor("mtp.fc.weight")?)?,
            input_norm: norm("layers.0.input_layernorm.weight")?,
            attention: load_attention(cfg, w, &format!("{p}.self_attn"))?,
            post_attention_norm: norm("layers.0.post_attention_layernorm.weight")?,
            ffn: load_ffn(cfg, w, &format!("{p}.mlp"), cfg.is_moe_layer(cfg.num_hidden_layers))?,
            norm: norm("norm.weight")?,
        }))
    }
}

/// Every released checkpoint has one MTP layer; vLLM would take turns over several.
pub(super) fn check_one_layer(cfg: &HybridConfig) -> Result<()> {
    match cfg.mtp_num_hidden_layers {
        None | Some(1) => Ok(()),
        Some(n) => Err(ModelError::BadConfig(format!(
            "the checkpoint has {n} multi-token-prediction layers; only a head of one is supported"
        ))),
    }
}

impl DraftHead for Qwen3Next {
    fn new_cache(&self, context: usize) -> SequenceCache {
        let shape = KvShape {
            kv_heads: self.cfg.num_key_value_heads,
            head_dim: self.cfg.head_dim,
            window: None,
        };
        SequenceCache::standalone(
            &[Some(shape)],
            crate::KvType::F32,
            crate::RecurrentState::none(1),
            context.min(self.cfg.max_position_embeddings),
        )
    }

    fn predict(
        &self,
        hidden: &[f32],
        tokens: &[u32],
        cache: &mut SequenceCache,
    ) -> Result<HeadRows> {
        let head = self.mtp.as_ref().ok_or_else(|| {
            ModelError::BadConfig("the checkpoint has no multi-token-prediction head".into())
        })?;
        let width = self.cfg.hidden_size;
        crate::check_head_rows(hidden, tokens, width)?;
        let states = Tensor::from_slice(hidden, (tokens.len(), width), &Device::Cpu)?;
        let embedded = head.embedding_norm.forward(&self.embed.forward(tokens)?)?;
        let joined = Tensor::cat(&[embedded, head.hidden_norm.forward(&states)?], 1)?;
        let mut x = head.fc.forward(&joined)?;
        let mut batch = [BatchEntry::new(tokens, cache)];
        let (rows, _) = batch_rows(&batch)?;
        let attended = head.attention.forward(
            &head.input_norm.forward(&x)?,
            0,
            &self.rotary,
            &mut batch,
            &rows,
        )?;
        x = (x + attended)?;
        x = (&x + head.ffn.forward(&head.post_attention_norm.forward(&x)?)?)?;
        advance_all(&mut batch);
        let out = head.norm.forward(&x)?;
        let logits = self.head.forward(&out)?.to_dtype(DType::F32)?;
        Ok(HeadRows { logits: logits.to_vec2()?, hidden: out.to_dtype(DType::F32)?.to_vec2()? })
    }
}

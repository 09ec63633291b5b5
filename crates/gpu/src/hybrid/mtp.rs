//! The hybrid's multi-token-prediction head on the device (llama.cpp's block `n_layer`, with
//! `nextn.*` tensors), as the CPU's `qwen3_next::mtp` runs it: from the target's final hidden
//! state `h` at a position and the token `t` after it, `x = eh_proj([enorm(embed(t));
//! hnorm(h)])`, one gated full-attention layer with the block's MoE or MLP, the shared head norm,
//! then the target's own LM head. The head's keys and values sit in the device mirror of the
//! one-layer cache [`DraftHead::new_cache`] makes, positions counted from that cache's start as
//! on the CPU; in f16, and for at most [`HEAD_CONTEXT`] positions, since each sequence's takes
//! device memory of its own (the drafter starts the head afresh past them).

use spindle_models::{
    batch_rows, BatchEntry, DraftHead, HeadRows, HybridConfig, KvShape, KvType, ModelError,
    RecurrentState, SequenceCache, WeightSource,
};

use std::sync::Arc;

use super::{feed_forward, FeedForward, GpuHybrid};
use crate::attention::PagedRows;
use crate::buffer::GpuTensor;
use crate::device::Gpu;
use crate::error::Result;
use crate::gated_attention::{GatedAttention, GatedAttentionShape};
use crate::kv_pools::{KvPools, LayerPools};
use crate::loading::{model_error, upload_matrix, upload_vector};
use crate::matmul::GpuMatrix;
use crate::placement::Placement;
use crate::rope::{RopeAngles, RopeTable};
use crate::step::Step;

/// Most positions the head's cache holds: on Qwen3.5-35B-A3B 16 MiB a sequence in f16, where
/// the model's 262,144 would take 512 MiB (and more than one buffer binding may hold).
pub const HEAD_CONTEXT: usize = 8192;

pub(super) struct MtpHead {
    embedding_norm: GpuTensor,
    hidden_norm: GpuTensor,
    /// `hidden × 2·hidden`: the normed embedding's columns first, then the hidden state's.
    fc: GpuMatrix,
    input_norm: GpuTensor,
    attention: GatedAttention,
    post_attention_norm: GpuTensor,
    ffn: FeedForward,
    norm: GpuTensor,
    /// The device's copies of the head's caches (pools of their own, one layer each, whatever
    /// blocks of the target run on the CPU).
    pools: KvPools,
}

impl MtpHead {
    /// The head of `cfg`'s file, `None` where it has none; its experts go on the device.
    pub(super) fn load(
        gpu: &Gpu,
        cfg: &HybridConfig,
        w: &mut WeightSource,
        shape: GatedAttentionShape,
    ) -> spindle_models::Result<Option<Self>> {
        match cfg.mtp_num_hidden_layers.unwrap_or(0) {
            0 => return Ok(None),
            1 => {}
            n => {
                return Err(ModelError::BadConfig(format!(
                    "the file has {n} multi-token-prediction layers; only a head of one is \
                     supported"
                )))
            }
        }
        let p = format!("blk.{}", cfg.num_hidden_layers);
        let norm = |w: &mut WeightSource, name: &str| {
            upload_vector(gpu, w, &format!("{p}.{name}.weight"), 0.0)
        };
        let embedding_norm = norm(w, "nextn.enorm")?;
        let hidden_norm = norm(w, "nextn.hnorm")?;
        let input_norm = norm(w, "attn_norm")?;
        let post_attention_norm = norm(w, "post_attention_norm")?;
        let head_norm = norm(w, "nextn.shared_head_norm")?;
        let moe = w.contains(&format!("{p}.ffn_gate_inp.weight"));
        Ok(Some(MtpHead {
            embedding_norm,
            hidden_norm,
            fc: upload_matrix(gpu, w.weight(&format!("{p}.nextn.eh_proj.weight"))?)?,
            input_norm,
            attention: GatedAttention::load(gpu, w, &p, shape)?,
            post_attention_norm,
            ffn: feed_forward(gpu, cfg, w, &p, (moe, &Placement::on_device()))?,
            norm: head_norm,
            pools: KvPools::default(),
        }))
    }

    pub(super) fn matrices(&self) -> impl Iterator<Item = &GpuMatrix> {
        let ffn: Vec<&GpuMatrix> = match &self.ffn {
            FeedForward::Moe(moe) => moe.matrices().collect(),
            FeedForward::Dense(mlp) => mlp.matrices().into(),
        };
        [&self.fc].into_iter().chain(self.attention.matrices()).chain(ffn)
    }

    pub(super) fn stacks(&self) -> Vec<&GpuMatrix> {
        match &self.ffn {
            FeedForward::Moe(moe) => moe.stacks(),
            FeedForward::Dense(_) => Vec::new(),
        }
    }
}

impl GpuHybrid {
    /// The head's attention layer: the model's full-attention shape.
    fn head_kv_shape(&self) -> KvShape {
        KvShape {
            kv_heads: self.cfg.num_key_value_heads,
            head_dim: self.cfg.head_dim,
            window: None,
        }
    }

    /// Records the head over `tokens.len()` rows: `hidden` (rows of the hidden width) and the
    /// embedded `tokens`, through its layer (keys and values into `place`) to its normed output
    /// and the logits.
    fn record_head(
        &self,
        step: &mut Step<'_>,
        head: &MtpHead,
        (hidden, tokens): (&GpuTensor, &[u32]),
        place: HeadPlace<'_>,
    ) -> Result<(GpuTensor, GpuTensor)> {
        let k = &self.kernels;
        let eps = self.cfg.rms_norm_eps as f32;
        let width = self.cfg.hidden_size;
        let embedded = k.embed.forward(step, &self.embed, tokens)?;
        let embedded = k.norm.forward(step, &embedded, &head.embedding_norm, eps)?;
        let states = k.norm.forward(step, hidden, &head.hidden_norm, eps)?;
        let joined = step.gpu.output(tokens.len() * 2 * width);
        for row in 0..tokens.len() {
            step.copy(&embedded, row * width, &joined, 2 * row * width, width)?;
            step.copy(&states, row * width, &joined, (2 * row + 1) * width, width)?;
        }
        let x = k.products.forward(step, &head.fc, &joined)?;
        let h = k.norm.forward(step, &x, &head.input_norm, eps)?;
        let attended =
            k.attention.forward(step, &k.products, &head.attention, &h, place.pools, place.rope)?;
        let x = k.add.forward(step, &x, &attended)?;
        let h = k.norm.forward(step, &x, &head.post_attention_norm, eps)?;
        let out = match &head.ffn {
            FeedForward::Moe(moe) => k.ffn.moe(step, &k.products, moe, &h)?,
            FeedForward::Dense(mlp) => k.ffn.mlp(step, &k.products, mlp, &h)?,
        };
        let x = k.add.forward(step, &x, &out)?;
        let normed = k.norm.forward(step, &x, &head.norm, eps)?;
        let logits =
            k.products.forward(step, self.head.as_ref().unwrap_or(&self.embed), &normed)?;
        Ok((logits, normed))
    }
}

/// Where the head's layer keeps its keys and values, and its rows' rotations.
struct HeadPlace<'a> {
    pools: (&'a [(Arc<LayerPools>, PagedRows)], usize),
    rope: &'a RopeTable,
}

impl DraftHead for GpuHybrid {
    fn new_cache(&self, context: usize) -> SequenceCache {
        SequenceCache::standalone(
            &[Some(self.head_kv_shape())],
            KvType::F16,
            RecurrentState::none(1),
            context.min(self.cfg.max_position_embeddings).min(HEAD_CONTEXT),
        )
    }

    fn predict(
        &self,
        hidden: &[f32],
        tokens: &[u32],
        cache: &mut SequenceCache,
    ) -> spindle_models::Result<HeadRows> {
        let head = self.mtp.as_ref().ok_or_else(|| {
            ModelError::BadConfig("the model has no multi-token-prediction head here".into())
        })?;
        let width = self.cfg.hidden_size;
        spindle_models::check_head_rows(hidden, tokens, width)?;
        let batch = [BatchEntry::new(tokens, cache)];
        batch_rows(&batch)?;
        let angles = RopeAngles::of_batch(&self.rotary, &batch);
        let shapes = [Some(self.head_kv_shape())];
        let (logits, normed) = (|| {
            let groups = head.pools.groups(&self.gpu, &shapes, &batch)?;
            let rope = angles.upload(&self.gpu)?;
            let hidden = self.gpu.upload_for_step(hidden)?;
            let place = HeadPlace { pools: (&groups, 0), rope: &rope };
            let (logits, normed) = self.gpu.run(|step| {
                let (logits, normed) = self.record_head(step, head, (&hidden, tokens), place)?;
                Ok((step.read(&logits), step.read(&normed)))
            })?;
            Ok((logits.values()?, normed.values()?))
        })()
        .map_err(model_error)?;
        batch[0].cache.advance(tokens.len());
        let vocab = self.cfg.vocab_size;
        Ok(HeadRows {
            logits: logits.chunks_exact(vocab).map(<[f32]>::to_vec).collect(),
            hidden: normed.chunks_exact(width).map(<[f32]>::to_vec).collect(),
        })
    }
}

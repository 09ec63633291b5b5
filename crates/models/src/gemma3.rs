//! Gemma 3 text decoder. Mirrors HF `modeling_gemma3.py` (Gemma3TextModel).
//!
//! Differences from Llama: embeddings scaled by `sqrt(hidden)`; RMSNorm scales by `1 + w`;
//! "sandwich" norms after attention and after the MLP; per-head RMSNorm on q and k; scores
//! scaled by `query_pre_attn_scalar^-0.5`; GELU-tanh MLP; five sliding-window layers
//! (local RoPE base) for each global layer (global RoPE base, optionally linearly scaled).

use candle_core::Tensor;

use crate::activation::Activation;
use crate::config::TransformerConfig;
use crate::error::Result;
use crate::first_blocks::FirstBlocks;
use crate::layers::{self, AttentionShape, GatedMlp, RmsNorm, RopeStyle, Rotary};
use crate::linear::{Embedding, Linear};
use crate::rope::RopeScaling;
use crate::weights::WeightSource;
use crate::{advance_all, batch_rows, logit_rows, BatchEntry, CausalLm, KvShape, RowRange};

struct Layer {
    input_norm: RmsNorm,
    q: Linear,
    k: Linear,
    v: Linear,
    o: Linear,
    q_norm: RmsNorm,
    k_norm: RmsNorm,
    post_attn_norm: RmsNorm,
    pre_ffn_norm: RmsNorm,
    mlp: GatedMlp,
    post_ffn_norm: RmsNorm,
    /// Some(window) on sliding-window layers, None on global ones.
    window: Option<usize>,
}

pub struct Gemma3 {
    stack: Stack,
    norm: RmsNorm,
    head: Linear,
}

/// The scaled embedding and the blocks: the whole model's, or the first ones of a model whose
/// later blocks run on a GPU.
pub(crate) struct Stack {
    cfg: TransformerConfig,
    embed: Embedding,
    embed_scale: f64,
    layers: Vec<Layer>,
    local_rotary: Rotary,
    global_rotary: Rotary,
}

/// An RMSNorm of `w`'s tensor `name`: HF checkpoints store `w` for a `1 + w` scale,
/// llama.cpp's converter stores `1 + w`.
fn norm(w: &mut WeightSource, name: &str, eps: f64) -> Result<RmsNorm> {
    let t = w.dense(name)?;
    match w {
        WeightSource::Safetensors(_) => RmsNorm::new_offset_by_one(t, eps),
        _ => Ok(RmsNorm::new(t, eps)),
    }
}

impl Gemma3 {
    pub fn load(cfg: TransformerConfig, w: &mut WeightSource) -> Result<Self> {
        // The largest tensor first, while little else is in memory: loading it briefly needs
        // twice its size (the file's bytes, then candle's copy) and then its tiles.
        let (embed, head) = w.embedding_and_head()?;
        let blocks = cfg.num_hidden_layers;
        let stack = Stack::load(cfg, w, embed, blocks)?;
        let norm = norm(w, "output_norm.weight", stack.cfg.rms_norm_eps)?;
        Ok(Self { stack, norm, head })
    }
}

impl Stack {
    /// The blocks `0..blocks` of the model of `cfg` in `w`, after `embed`.
    pub(crate) fn load(
        cfg: TransformerConfig,
        w: &mut WeightSource,
        embed: Embedding,
        blocks: usize,
    ) -> Result<Self> {
        let eps = cfg.rms_norm_eps;
        let norm = |w: &mut WeightSource, name: String| norm(w, &name, eps);
        // No capacity from the header: a damaged block count would be allocated before the
        // first missing layer is found.
        let mut layers = Vec::new();
        for i in 0..blocks.min(cfg.num_hidden_layers) {
            let b = format!("blk.{i}");
            let global = (i + 1) % cfg.sliding_window_pattern == 0;
            layers.push(Layer {
                input_norm: norm(w, format!("{b}.attn_norm.weight"))?,
                q: w.linear(&format!("{b}.attn_q"))?,
                k: w.linear(&format!("{b}.attn_k"))?,
                v: w.linear(&format!("{b}.attn_v"))?,
                o: w.linear(&format!("{b}.attn_output"))?,
                q_norm: norm(w, format!("{b}.attn_q_norm.weight"))?,
                k_norm: norm(w, format!("{b}.attn_k_norm.weight"))?,
                post_attn_norm: norm(w, format!("{b}.post_attention_norm.weight"))?,
                pre_ffn_norm: norm(w, format!("{b}.ffn_norm.weight"))?,
                mlp: GatedMlp::new(
                    w.weight(&format!("{b}.ffn_gate.weight"))?,
                    w.weight(&format!("{b}.ffn_up.weight"))?,
                    w.linear(&format!("{b}.ffn_down"))?,
                    Activation::GeluTanh,
                )?,
                post_ffn_norm: norm(w, format!("{b}.post_ffw_norm.weight"))?,
                window: if global { None } else { cfg.sliding_window },
            });
        }
        let hd = cfg.head_dim();
        Ok(Self {
            embed_scale: (cfg.hidden_size as f64).sqrt(),
            local_rotary: Rotary::new(
                hd,
                cfg.rope_local_base_freq,
                &RopeScaling::None,
                RopeStyle::Halves,
            ),
            global_rotary: Rotary::new(hd, cfg.rope_theta, &cfg.rope_scaling, RopeStyle::Halves),
            cfg,
            embed,
            layers,
        })
    }

    /// The residual stream of `batch`'s tokens `ids` (`rows`: each entry's) after the blocks.
    fn residual_stream(
        &self,
        batch: &mut [BatchEntry<'_>],
        rows: &[RowRange],
        ids: &[u32],
    ) -> Result<Tensor> {
        let mut x = (self.embed.forward(ids)? * self.embed_scale)?;
        for (i, l) in self.layers.iter().enumerate() {
            let attn = self.attention(i, &l.input_norm.forward(&x)?, batch, rows)?;
            x = (&x + l.post_attn_norm.forward(&attn)?)?;
            let mlp = l.mlp.forward(&l.pre_ffn_norm.forward(&x)?)?;
            x = (&x + l.post_ffn_norm.forward(&mlp)?)?;
        }
        Ok(x)
    }

    /// Attention of layer `i` for the batch's rows `x`: projections and per-head norms over all
    /// rows, then each sequence rotates, extends its cache and attends on its own.
    fn attention(
        &self,
        i: usize,
        x: &Tensor,
        batch: &mut [BatchEntry<'_>],
        rows: &[(usize, usize)],
    ) -> Result<Tensor> {
        let l = &self.layers[i];
        let hd = self.cfg.head_dim();
        let (heads, kv_heads) = (self.cfg.num_attention_heads, self.cfg.num_kv_heads());
        let tokens = x.dim(0)?;
        // Each head's query and key normalised (a row of `hd` at a time).
        let per_head = |t: Tensor, norm: &RmsNorm, heads: usize| -> Result<Tensor> {
            Ok(norm.forward(&t.reshape((tokens, heads, hd))?)?.reshape((tokens, heads * hd))?)
        };
        let q = per_head(l.q.forward(x)?, &l.q_norm, heads)?;
        let k = per_head(l.k.forward(x)?, &l.k_norm, kv_heads)?;
        let v = l.v.forward(x)?;
        let rotary = if l.window.is_some() { &self.local_rotary } else { &self.global_rotary };
        let scale = self.cfg.query_pre_attn_scalar.unwrap_or(hd as f64).powf(-0.5) as f32;
        let shape = AttentionShape { heads, kv_heads, head_dim: hd, scale, window: l.window };
        let rotate = |x: &Tensor, start| rotary.apply(x, start);
        let out = layers::attend_sequences(i, [&q, &k, &v], &shape, batch, rows, rotate)?;
        l.o.forward(&out)
    }
}

impl FirstBlocks for Stack {
    fn forward(
        &self,
        batch: &mut [BatchEntry<'_>],
        rows: &[RowRange],
        ids: &[u32],
    ) -> Result<Vec<f32>> {
        Ok(self.residual_stream(batch, rows, ids)?.flatten_all()?.to_vec1()?)
    }
}

impl CausalLm for Gemma3 {
    fn config(&self) -> &TransformerConfig {
        &self.stack.cfg
    }

    fn kv_shapes(&self) -> Vec<Option<KvShape>> {
        let cfg = &self.stack.cfg;
        let (kv_heads, head_dim) = (cfg.num_kv_heads(), cfg.head_dim());
        let layers = self.stack.layers.iter();
        layers.map(|l| Some(KvShape { kv_heads, head_dim, window: l.window })).collect()
    }

    fn forward_batch(&self, batch: &mut [BatchEntry<'_>]) -> Result<Vec<Vec<f32>>> {
        let (rows, ids) = batch_rows(batch)?;
        let x = self.stack.residual_stream(batch, &rows, &ids)?;
        advance_all(batch);
        layers::logits_of_rows(&x, &logit_rows(batch, &rows), &self.norm, &self.head)
    }
}

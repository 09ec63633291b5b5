//! Llama-family decoder (Llama 2/3, SmolLM2, Mistral) and Qwen2 / Qwen2.5, which adds biases to
//! the q/k/v projections. Mirrors HF `modeling_llama.py` / `modeling_qwen2.py`.
//!
//! Per layer: `x += o(attn(rope(q(norm(x))), rope(k(..)), v(..)))`, then
//! `x += down(silu(gate(norm(x))) * up(norm(x)))`.

use candle_core::Tensor;

use crate::activation::Activation;
use crate::config::{Architecture, TransformerConfig};
use crate::error::Result;
use crate::first_blocks::FirstBlocks;
use crate::layers::{self, AttentionShape, GatedMlp, RmsNorm, RopeStyle, Rotary};
use crate::linear::{Embedding, Linear};
use crate::weights::WeightSource;
use crate::{advance_all, batch_rows, logit_rows, BatchEntry, CausalLm, RowRange};

struct Attention {
    q: Linear,
    k: Linear,
    v: Linear,
    o: Linear,
}

struct Layer {
    attn_norm: RmsNorm,
    attn: Attention,
    ffn_norm: RmsNorm,
    mlp: GatedMlp,
}

pub struct Llama {
    stack: Stack,
    norm: RmsNorm,
    head: Linear,
}

/// The embedding and the blocks: the whole model's, or the first ones of a model whose later
/// blocks run on a GPU.
pub(crate) struct Stack {
    cfg: TransformerConfig,
    embed: Embedding,
    layers: Vec<Layer>,
    rotary: Rotary,
}

impl Llama {
    pub fn load(cfg: TransformerConfig, w: &mut WeightSource) -> Result<Self> {
        // The largest tensor first, while little else is in memory: loading it briefly needs
        // twice its size (the file's bytes, then candle's copy) and then its tiles.
        let (embed, head) = w.embedding_and_head()?;
        let blocks = cfg.num_hidden_layers;
        let stack = Stack::load(cfg, w, embed, blocks)?;
        let norm = RmsNorm::new(w.dense("output_norm.weight")?, stack.cfg.rms_norm_eps);
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
        // llama.cpp's converter permutes llama q/k rows for its interleaved rotary; Qwen2 and
        // HF checkpoints keep HF's half-split layout.
        let style = match (cfg.architecture, &w) {
            (Architecture::Llama, WeightSource::Gguf(_)) => RopeStyle::Interleaved,
            _ => RopeStyle::Halves,
        };
        let rotary = Rotary::new(cfg.head_dim(), cfg.rope_theta, &cfg.rope_scaling, style);
        let eps = cfg.rms_norm_eps;
        // No capacity from the header: a damaged block count would be allocated before the
        // first missing layer is found.
        let mut layers = Vec::new();
        for i in 0..blocks.min(cfg.num_hidden_layers) {
            let b = format!("blk.{i}");
            layers.push(Layer {
                attn_norm: RmsNorm::new(w.dense(&format!("{b}.attn_norm.weight"))?, eps),
                attn: Attention {
                    q: w.linear(&format!("{b}.attn_q"))?,
                    k: w.linear(&format!("{b}.attn_k"))?,
                    v: w.linear(&format!("{b}.attn_v"))?,
                    o: w.linear(&format!("{b}.attn_output"))?,
                },
                ffn_norm: RmsNorm::new(w.dense(&format!("{b}.ffn_norm.weight"))?, eps),
                mlp: GatedMlp::new(
                    w.weight(&format!("{b}.ffn_gate.weight"))?,
                    w.weight(&format!("{b}.ffn_up.weight"))?,
                    w.linear(&format!("{b}.ffn_down"))?,
                    Activation::Silu,
                )?,
            });
        }
        Ok(Self { cfg, embed, layers, rotary })
    }

    /// The residual stream of `batch`'s tokens `ids` (`rows`: each entry's) after the blocks.
    fn residual_stream(
        &self,
        batch: &mut [BatchEntry<'_>],
        rows: &[RowRange],
        ids: &[u32],
    ) -> Result<Tensor> {
        let mut x = self.embed.forward(ids)?;
        for (i, layer) in self.layers.iter().enumerate() {
            x = (&x + self.attention(i, &layer.attn_norm.forward(&x)?, batch, rows)?)?;
            x = (&x + layer.mlp.forward(&layer.ffn_norm.forward(&x)?)?)?;
        }
        Ok(x)
    }

    /// Attention of layer `i` for the batch's rows `x`: projections over all rows, then each
    /// sequence rotates, extends its cache and attends on its own.
    fn attention(
        &self,
        i: usize,
        x: &Tensor,
        batch: &mut [BatchEntry<'_>],
        rows: &[(usize, usize)],
    ) -> Result<Tensor> {
        let a = &self.layers[i].attn;
        let hd = self.cfg.head_dim();
        let (q, k, v) = (a.q.forward(x)?, a.k.forward(x)?, a.v.forward(x)?);
        let shape = AttentionShape {
            heads: self.cfg.num_attention_heads,
            kv_heads: self.cfg.num_kv_heads(),
            head_dim: hd,
            scale: 1.0 / (hd as f32).sqrt(),
            window: None,
        };
        let rotate = |x: &Tensor, start| self.rotary.apply(x, start);
        let out = layers::attend_sequences(i, [&q, &k, &v], &shape, batch, rows, rotate)?;
        a.o.forward(&out)
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

impl CausalLm for Llama {
    fn config(&self) -> &TransformerConfig {
        &self.stack.cfg
    }

    fn forward_batch(&self, batch: &mut [BatchEntry<'_>]) -> Result<Vec<Vec<f32>>> {
        let (rows, ids) = batch_rows(batch)?;
        let x = self.stack.residual_stream(batch, &rows, &ids)?;
        advance_all(batch);
        layers::logits_of_rows(&x, &logit_rows(batch, &rows), &self.norm, &self.head)
    }
}

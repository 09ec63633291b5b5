//! The first blocks of a hybrid GGUF model on the CPU, for a model whose later blocks run on a
//! GPU (llama.cpp's `--n-gpu-layers` short of the block count): the token embedding and blocks
//! `0..n`, whose keys and values stay in the host's KV pool and whose DeltaNet states stay in
//! the caches, moved on here. What they hand on is the residual stream after block `n - 1`.

use candle_core::Tensor;

use super::gguf::layer;
use super::{run_blocks, HybridConfig, Layer};
use crate::error::{ModelError, Result};
use crate::layers::{RopeStyle, Rotary};
use crate::linear::Embedding;
use crate::weights::WeightSource;
use crate::{BatchEntry, RowRange};

pub struct FirstBlocks {
    embed: Embedding,
    layers: Vec<Layer>,
    rotary: Rotary,
}

impl FirstBlocks {
    /// The embedding and blocks `0..blocks` of the model of `cfg` in the llama.cpp file of
    /// `w`, as the CPU model loads them.
    pub fn load_gguf(cfg: &HybridConfig, w: &mut WeightSource, blocks: usize) -> Result<Self> {
        if blocks > cfg.num_hidden_layers {
            return Err(ModelError::BadConfig(format!(
                "{blocks} blocks on the CPU of a model with {}",
                cfg.num_hidden_layers
            )));
        }
        let layers = (cfg.layer_types().into_iter().enumerate().take(blocks))
            .map(|(i, kind)| layer(cfg, w, i, kind))
            .collect::<Result<Vec<_>>>()?;
        Ok(FirstBlocks {
            embed: Embedding::new(w.weight("token_embd.weight")?)?,
            layers,
            rotary: Rotary::new(
                cfg.rotary_dim(),
                cfg.rope_theta(),
                &cfg.rope_scaling,
                RopeStyle::Halves,
            ),
        })
    }

    /// How many blocks run here.
    pub fn blocks(&self) -> usize {
        self.layers.len()
    }

    /// The residual stream after the last of these blocks, one row of the hidden width per
    /// token of `ids` (the batch's tokens in order; `rows`: each entry's first row and rows).
    /// The entries' caches hold these blocks' new keys, values and states after it; their
    /// positions move on only when the whole model has run.
    pub fn forward(
        &self,
        batch: &mut [BatchEntry<'_>],
        rows: &[RowRange],
        ids: &[u32],
    ) -> Result<Vec<f32>> {
        let x = self.embed.forward(ids)?;
        let x: Tensor = run_blocks(&self.layers, x, &self.rotary, batch, rows)?;
        Ok(x.flatten_all()?.to_vec1()?)
    }
}

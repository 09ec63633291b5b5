//! The first blocks of a hybrid GGUF model on the CPU (see [`FirstBlocks`]): their DeltaNet
//! states stay in the caches and move on here.

use candle_core::Tensor;

use super::gguf::layer;
use super::{run_blocks, HybridConfig, Layer};
use crate::error::{ModelError, Result};
use crate::first_blocks::{FirstBlocks, EMBEDDING};
use crate::layers::{RopeStyle, Rotary};
use crate::linear::Embedding;
use crate::weights::WeightSource;
use crate::{BatchEntry, RowRange};

pub struct HybridFirstBlocks {
    embed: Embedding,
    layers: Vec<Layer>,
    rotary: Rotary,
}

impl HybridFirstBlocks {
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
        Ok(HybridFirstBlocks {
            embed: Embedding::new(w.weight(EMBEDDING)?)?,
            layers,
            rotary: Rotary::new(
                cfg.rotary_dim(),
                cfg.rope_theta(),
                &cfg.rope_scaling,
                RopeStyle::Halves,
            ),
        })
    }
}

impl FirstBlocks for HybridFirstBlocks {
    fn forward(
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

//! A model's first blocks on the CPU, for a model whose later blocks run on a GPU (llama.cpp's
//! `--n-gpu-layers` short of the block count): the token embedding and blocks `0..n` with the
//! CPU model's own code, their keys and values in the host's KV pool and their recurrent
//! states (a hybrid's) in the caches. What they hand on is the residual stream after block
//! `n - 1`; the entries' positions move on only once the whole model has run.

use crate::config::{Architecture, TransformerConfig};
use crate::error::{ModelError, Result};
use crate::linear::Embedding;
use crate::weights::WeightSource;
use crate::{gemma3, llama, BatchEntry, RowRange};

pub trait FirstBlocks: Send + Sync {
    /// The residual stream after the last of these blocks, one row of the hidden width per
    /// token of `ids` (the batch's tokens in order; `rows`: each entry's first row and rows).
    fn forward(
        &self,
        batch: &mut [BatchEntry<'_>],
        rows: &[RowRange],
        ids: &[u32],
    ) -> Result<Vec<f32>>;
}

/// The embedding and blocks `0..blocks` of the dense model of `cfg` (Llama family, Qwen2,
/// Gemma 3) in `w`, as the CPU model loads them.
pub fn dense_first_blocks(
    cfg: &TransformerConfig,
    w: &mut WeightSource,
    blocks: usize,
) -> Result<Box<dyn FirstBlocks>> {
    if blocks > cfg.num_hidden_layers {
        return Err(ModelError::BadConfig(format!(
            "{blocks} blocks on the CPU of a model with {}",
            cfg.num_hidden_layers
        )));
    }
    let embed = Embedding::new(w.weight(EMBEDDING)?)?;
    Ok(match cfg.architecture {
        Architecture::Llama | Architecture::Qwen2 => {
            Box::new(llama::Stack::load(cfg.clone(), w, embed, blocks)?)
        }
        Architecture::Gemma3 => Box::new(gemma3::Stack::load(cfg.clone(), w, embed, blocks)?),
        other => {
            return Err(ModelError::BadConfig(format!("{other:?} is not a dense model")));
        }
    })
}

/// The token embedding's tensor, in llama.cpp's naming (the names `WeightSource` reads).
pub(crate) const EMBEDDING: &str = "token_embd.weight";

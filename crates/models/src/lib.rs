//! Model architectures on candle, and loading their weights from GGUF or safetensors.
//!
//! Weights are immutable after loading; everything a sequence accumulates lives in a
//! [`SequenceCache`] that the caller owns and passes to [`CausalLm::forward`]:
//!
//! ```no_run
//! # fn main() -> spindle_models::Result<()> {
//! let model = spindle_models::load_gguf(std::path::Path::new("model.gguf"))?;
//! let mut cache = model.new_cache(2048);
//! let logits = model.forward(&[1, 2, 3], &mut cache)?; // prefill
//! let next = model.forward(&[4], &mut cache)?;        // one decode step
//! # Ok(()) }
//! ```

mod activation;
mod block_quants;
mod cache;
mod config;
mod delta_rule;
mod dense;
mod draft_head;
mod error;
mod first_blocks;
mod gated_deltanet;
mod gemma3;
mod gguf_metadata;
mod huge_pages;
mod isa;
mod k_quants;
mod kv_mirror;
mod kv_type;
mod layers;
mod linear;
mod linear_state;
mod llama;
mod moe;
mod paged_attention;
mod paged_kv;
mod projections;
mod q4_k;
mod q6_k;
mod quantized;
mod qwen3_next;
pub mod random_dense;
pub mod random_gemma;
pub mod random_hybrid;
mod rollback;
mod rope;
mod small_matmul;
#[cfg(test)]
mod test_data;
mod weight;
mod weights;

use std::collections::HashMap;
use std::path::Path;

use candle_core::quantized::gguf_file;

pub use cache::{DeviceRecurrentState, RecurrentState, SequenceCache};
pub use config::{Architecture, TransformerConfig};
pub use draft_head::{check_head_rows, DraftHead, HeadRows};
pub use error::{ModelError, Result};
pub use first_blocks::{dense_first_blocks, FirstBlocks};
pub use kv_type::KvType;
pub use qwen3_next::{gguf_experts, HybridConfig, HybridFirstBlocks, Mixer};
pub use rope::RopeScaling;
// The layers the GPU kernels are checked against.
pub use kv_mirror::KvMirror;
pub use layers::{GatedMlp, RmsNorm, RopeStyle, Rotary};
pub use moe::{routed_sum, Routing};
pub use paged_kv::{KvShape, PagedKv};
/// The steps of the Gated DeltaNet layer on plain slices, which the GPU kernels are checked
/// against.
pub mod linear_attention {
    pub use crate::delta_rule::{recurrent, DeltaHeads, DeltaInputs};
    pub use crate::gated_deltanet::{
        causal_conv_silu, gated_rms_norm, l2_normalize, sigmoid, softplus, DeltaNetShape, Mixing,
    };
    pub use crate::linear_state::LinearAttentionState;
}
// The matrix kernels, public for the benchmarks that weigh them against each other.
pub use block_quants::{BlockFormat, BlockMatrix};
pub use k_quants::supported as k_quant_kernels_run;
pub use q4_k::Q4KMatrix;
pub use q6_k::Q6KMatrix;
pub use quantized::QuantizedMatrix;
// The weights as stored, for model implementations outside this crate (the GPU's).
pub use weight::Weight;
pub use weights::WeightSource;
use weights::{GgufStorage, GgufWeights, SafetensorsWeights};

/// A decoder-only language model that predicts the next token.
pub trait CausalLm: Send + Sync {
    fn config(&self) -> &TransformerConfig;

    /// Runs `tokens` after the positions `cache` already holds and returns the logits
    /// (vocabulary-sized) for the token that follows the last of them.
    fn forward(&self, tokens: &[u32], cache: &mut SequenceCache) -> Result<Vec<f32>> {
        let mut logits = self.forward_batch(&mut [BatchEntry::new(tokens, cache)])?;
        Ok(logits.pop().expect("one entry, one result"))
    }

    /// Runs several sequences in one pass: the row-wise work (projections, experts, norms) on
    /// all their tokens together, attention and recurrences per sequence. Every kernel reduces
    /// each row in a fixed order, so each sequence's logits are bitwise what it gets alone.
    /// Per entry, the logits of its last `logit_rows` rows, one vocabulary after another.
    fn forward_batch(&self, batch: &mut [BatchEntry<'_>]) -> Result<Vec<Vec<f32>>>;

    /// The key/value shape of each layer; `None` for layers without softmax attention.
    fn kv_shapes(&self) -> Vec<Option<KvShape>> {
        let cfg = self.config();
        let shape =
            KvShape { kv_heads: cfg.num_kv_heads(), head_dim: cfg.head_dim(), window: None };
        vec![Some(shape); cfg.num_hidden_layers]
    }

    /// The recurrent state before any token (empty for models without linear attention).
    fn initial_recurrent_state(&self) -> RecurrentState {
        RecurrentState::none(self.config().num_hidden_layers)
    }

    /// The head that drafts tokens from this model's hidden states, when its checkpoint carries
    /// one (the target's hidden states are kept in a cache after
    /// [`SequenceCache::keep_hidden_states`]).
    fn draft_head(&self) -> Option<&dyn DraftHead> {
        None
    }

    /// An empty cache with storage of its own for at most `context` positions (capped at the
    /// model's own limit), keeping keys and values in f32: the cache the reference checks use.
    fn new_cache(&self, context: usize) -> SequenceCache {
        let limit = context.min(self.config().max_position_embeddings);
        SequenceCache::standalone(
            &self.kv_shapes(),
            KvType::F32,
            self.initial_recurrent_state(),
            limit,
        )
    }
}

/// One sequence's share of a batched forward pass: its new tokens, its cache, and how many of
/// its last rows want logits (1 for a prompt chunk or a decode step; a speculative round's
/// drafts want one per token, to check each against what the model itself would pick).
pub struct BatchEntry<'a> {
    pub tokens: &'a [u32],
    pub cache: &'a mut SequenceCache,
    pub logit_rows: usize,
}

impl<'a> BatchEntry<'a> {
    /// An entry that wants the logits after its last token only.
    pub fn new(tokens: &'a [u32], cache: &'a mut SequenceCache) -> Self {
        Self { tokens, cache, logit_rows: 1 }
    }

    /// Whether the entry verifies drafts (it wants logits for more than one row): recurrent
    /// layers then run its tokens one at a time, as decoding them would, and keep the state
    /// after each, so that its cache can go back to any of them.
    pub fn verifies(&self) -> bool {
        self.logit_rows > 1
    }
}

/// `(first row, rows)` of one entry in a batch's concatenated rows.
pub type RowRange = (usize, usize);

/// The start of every batched forward pass: checks each entry has room (before any work, so a
/// refusal changes no cache), and returns where each entry's rows lie in the concatenated rows
/// and all the tokens in that order.
pub fn batch_rows(batch: &[BatchEntry<'_>]) -> Result<(Vec<RowRange>, Vec<u32>)> {
    let mut rows = Vec::with_capacity(batch.len());
    let mut ids = Vec::new();
    for entry in batch {
        if entry.logit_rows == 0 || entry.logit_rows > entry.tokens.len() {
            return Err(ModelError::BadConfig(format!(
                "logits for {} rows of an entry of {} tokens",
                entry.logit_rows,
                entry.tokens.len()
            )));
        }
        entry.cache.check_room(entry.tokens.len())?;
        rows.push((ids.len(), entry.tokens.len()));
        ids.extend_from_slice(entry.tokens);
    }
    Ok((rows, ids))
}

/// Per entry, the rows whose logits it wants: `(first row, rows)` in the concatenated rows.
pub fn logit_rows(batch: &[BatchEntry<'_>], rows: &[RowRange]) -> Vec<RowRange> {
    batch
        .iter()
        .zip(rows)
        .map(|(entry, &(first, len))| (first + len - entry.logit_rows, entry.logit_rows))
        .collect()
}

/// The end of every batched forward pass: each cache now holds its entry's tokens.
pub(crate) fn advance_all(batch: &mut [BatchEntry<'_>]) {
    for entry in batch {
        if entry.verifies() {
            entry.cache.advance_verified(entry.tokens.len());
        } else {
            entry.cache.advance(entry.tokens.len());
        }
    }
}

/// Loads a `.gguf` file's model (its tokenizer is read by `spindle_chat::read_tokenizer_metadata`).
pub fn load_gguf(path: &Path) -> Result<Box<dyn CausalLm>> {
    open_gguf(path, GgufStorage::AsStored)
}

/// Loads a `.gguf` file with every weight dequantized to f32 and run as dense f32 matmuls:
/// several times larger and slower, but free of activation quantization, so its logits can be
/// compared tightly with an f32 reference (transformers) to check the model math itself.
pub fn load_gguf_f32(path: &Path) -> Result<Box<dyn CausalLm>> {
    open_gguf(path, GgufStorage::F32)
}

fn open_gguf(path: &Path, storage: GgufStorage) -> Result<Box<dyn CausalLm>> {
    let gguf = GgufWeights::open(path, storage)?;
    if names_a_hybrid(gguf.metadata()) {
        let gguf = gguf.without_tokenizer();
        let metadata = gguf.metadata().clone();
        let model = qwen3_next::Qwen3Next::load_gguf(&mut WeightSource::Gguf(gguf), &metadata)?;
        return Ok(Box::new(model));
    }
    let cfg = TransformerConfig::from_gguf(gguf.metadata())?;
    build(cfg, &mut WeightSource::Gguf(gguf.without_tokenizer()))
}

/// Whether a GGUF header's `general.architecture` is a hybrid one (`qwen3next`, `qwen35moe`,
/// `qwen35`).
fn names_a_hybrid(metadata: &HashMap<String, gguf_file::Value>) -> bool {
    let arch = metadata.get("general.architecture").and_then(|v| v.to_string().ok());
    arch.is_some_and(|a| qwen3_next::GGUF_ARCHITECTURES.contains(&a.as_str()))
}

/// Whether the `.gguf` file at `path` holds a hybrid model (for [`open_hybrid`]) rather than a
/// dense one (for [`open_dense`]), by its header's architecture, as [`load_gguf`] decides.
pub fn is_hybrid_gguf(path: &Path) -> Result<bool> {
    Ok(names_a_hybrid(GgufWeights::open(path, GgufStorage::AsStored)?.metadata()))
}

/// Loads a folder with `config.json` and `*.safetensors`.
pub fn load_safetensors(dir: &Path) -> Result<Box<dyn CausalLm>> {
    let config_path = dir.join("config.json");
    let text = std::fs::read_to_string(&config_path)
        .map_err(|source| ModelError::Io { path: config_path, source })?;
    if let Some(hybrid) = qwen3_next::HybridConfig::detect(&text)? {
        let source = SafetensorsWeights::open(dir, Architecture::Qwen3Next)?;
        return Ok(Box::new(qwen3_next::Qwen3Next::load_safetensors(hybrid, &source)?));
    }
    let cfg = TransformerConfig::from_hf_json(&text)?;
    let source = SafetensorsWeights::open(dir, cfg.architecture)?;
    build(cfg, &mut WeightSource::Safetensors(source))
}

/// The configuration and weights, as stored, of a dense transformer (a `.gguf` file, or a
/// folder with `config.json` and `*.safetensors`), for a model built elsewhere; hybrid
/// checkpoint folders are refused (their GGUF files open with [`open_hybrid`]).
pub fn open_dense(path: &Path) -> Result<(TransformerConfig, WeightSource)> {
    if path.is_dir() {
        let config_path = path.join("config.json");
        let text = std::fs::read_to_string(&config_path)
            .map_err(|source| ModelError::Io { path: config_path, source })?;
        if qwen3_next::HybridConfig::detect(&text)?.is_some() {
            return Err(ModelError::BadConfig(
                "a hybrid model's checkpoint folder: hybrid models open from llama.cpp GGUF files \
                 only (see open_hybrid)"
                    .into(),
            ));
        }
        let cfg = TransformerConfig::from_hf_json(&text)?;
        let source = SafetensorsWeights::open(path, cfg.architecture)?;
        return Ok((cfg, WeightSource::Safetensors(source)));
    }
    let gguf = GgufWeights::open(path, GgufStorage::AsStored)?;
    // Before the tokenizer keys go: a file without `*.vocab_size` counts its tokens.
    let cfg = TransformerConfig::from_gguf(gguf.metadata())?;
    Ok((cfg, WeightSource::Gguf(gguf.without_tokenizer())))
}

/// The configuration and weights, as stored, of a hybrid model's `.gguf` file (`qwen3next`,
/// `qwen35moe`, `qwen35`), for a model built elsewhere.
pub fn open_hybrid(path: &Path) -> Result<(HybridConfig, WeightSource)> {
    let gguf = GgufWeights::open(path, GgufStorage::AsStored)?.without_tokenizer();
    let vocab = gguf.dims("token_embd.weight")?.first().copied().unwrap_or(0);
    let tied = gguf.dims("output.weight").is_err();
    let cfg = HybridConfig::from_gguf(gguf.metadata(), vocab, tied)?;
    Ok((cfg, WeightSource::Gguf(gguf)))
}

fn build(cfg: TransformerConfig, weights: &mut WeightSource) -> Result<Box<dyn CausalLm>> {
    Ok(match cfg.architecture {
        Architecture::Llama | Architecture::Qwen2 => Box::new(llama::Llama::load(cfg, weights)?),
        Architecture::Gemma3 => Box::new(gemma3::Gemma3::load(cfg, weights)?),
        Architecture::Qwen3Next => {
            return Err(ModelError::BadConfig(
                "hybrid Qwen GGUF files name their architecture qwen3next, qwen35moe or qwen35"
                    .into(),
            ))
        }
    })
}

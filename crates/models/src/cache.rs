//! Per-sequence state, owned by the caller and passed into `forward`, so the weights stay
//! immutable and shared between sequences: attention keys/values, and for linear-attention
//! layers their recurrent state. Cloning a cache is a snapshot of the sequence.

use candle_core::Tensor;
use candle_nn::kv_cache::KvCache;

use crate::error::{ModelError, Result};
use crate::gated_deltanet::LinearAttentionState;

/// Initial capacity of each layer's key/value buffers (they grow by this much when full).
const INITIAL_CAPACITY: usize = 512;

/// The keys and values of every processed token of one sequence, for every attention layer,
/// and the state of every linear-attention layer.
pub struct SequenceCache {
    layers: Vec<KvCache>,
    /// `Some` for the linear-attention layers of a hybrid model.
    linear: Vec<Option<LinearAttentionState>>,
    len: usize,
    limit: usize,
}

impl SequenceCache {
    /// An empty cache for `num_layers` layers that refuses to grow past `limit` positions.
    pub fn new(num_layers: usize, limit: usize) -> Self {
        Self::hybrid(vec![None; num_layers], limit)
    }

    /// An empty cache for a model whose layer `i` is linear attention where `linear[i]` holds
    /// its initial state, and softmax attention where it is `None`.
    pub(crate) fn hybrid(linear: Vec<Option<LinearAttentionState>>, limit: usize) -> Self {
        let layers = linear.iter().map(|_| KvCache::new(2, INITIAL_CAPACITY.min(limit.max(1)))).collect();
        Self { layers, linear, len: 0, limit }
    }

    /// Positions already processed.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Most positions this cache may hold.
    pub fn limit(&self) -> usize {
        self.limit
    }

    /// Fails before any work is done when `new_tokens` more would not fit.
    pub fn check_room(&self, new_tokens: usize) -> Result<()> {
        let needed = self.len + new_tokens;
        if needed > self.limit {
            return Err(ModelError::ContextExceeded { needed, limit: self.limit });
        }
        Ok(())
    }

    /// Appends a layer's new keys/values (1, kv_heads, new, d) and returns all of them so far.
    pub fn append(&mut self, layer: usize, k: &Tensor, v: &Tensor) -> Result<(Tensor, Tensor)> {
        Ok(self.layers[layer].append(&k.contiguous()?, &v.contiguous()?)?)
    }

    /// An independent copy: the sequence can go on from here while this copy stays as it is.
    /// (candle's key/value buffers are written in place, so a shallow clone would share them.)
    pub fn snapshot(&self) -> Result<Self> {
        let mut copy = Self::hybrid(self.linear.clone(), self.limit);
        for (from, to) in self.layers.iter().zip(&mut copy.layers) {
            if let (Some(k), Some(v)) = (from.k()?, from.v()?) {
                to.append(&k.contiguous()?.copy()?, &v.contiguous()?.copy()?)?;
            }
        }
        copy.len = self.len;
        Ok(copy)
    }

    /// The recurrent state of linear-attention layer `layer`.
    pub(crate) fn linear_state(&mut self, layer: usize) -> Result<&mut LinearAttentionState> {
        self.linear[layer]
            .as_mut()
            .ok_or_else(|| ModelError::BadConfig(format!("layer {layer} has no linear-attention state")))
    }

    /// Records that `n` more positions were processed by every layer.
    pub fn advance(&mut self, n: usize) {
        self.len += n;
    }
}

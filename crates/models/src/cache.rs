//! Per-sequence attention state, owned by the caller and passed into `forward`, so the weights
//! stay immutable and shared between sequences.

use candle_core::Tensor;
use candle_nn::kv_cache::KvCache;

use crate::error::{ModelError, Result};

/// Initial capacity of each layer's key/value buffers (they grow by this much when full).
const INITIAL_CAPACITY: usize = 512;

/// The keys and values of every processed token of one sequence, for every layer.
pub struct SequenceCache {
    layers: Vec<KvCache>,
    len: usize,
    limit: usize,
}

impl SequenceCache {
    /// An empty cache for `num_layers` layers that refuses to grow past `limit` positions.
    pub fn new(num_layers: usize, limit: usize) -> Self {
        let layers = (0..num_layers).map(|_| KvCache::new(2, INITIAL_CAPACITY.min(limit.max(1)))).collect();
        Self { layers, len: 0, limit }
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

    /// Records that `n` more positions were processed by every layer.
    pub fn advance(&mut self, n: usize) {
        self.len += n;
    }
}

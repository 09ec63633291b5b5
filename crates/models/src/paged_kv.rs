//! Attention keys and values of all sequences, in fixed-size blocks of positions. A sequence
//! names its blocks in a block table; sequences that share a prompt prefix name the same blocks,
//! so the prefix is stored once. Which blocks are free is decided outside (the scheduler's block
//! pool); this module only stores and moves the numbers.
//!
//! Layout per attention layer: block after block, each `kv_heads × block_size × head_dim` f32, so
//! a sequence's keys of one head are runs of `block_size × head_dim` floats, which attention reads
//! in place.
//! The storage is allocated zeroed, which the OS commits lazily: an unused pool costs no memory.
//! Sequences of one batch attend in parallel: many may read a layer at once, one writes.

use std::sync::RwLock;

use candle_core::{Device, Tensor};

use crate::error::{ModelError, Result};
use crate::paged_attention::HeadRuns;

/// Key/value sizes of one attention layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KvShape {
    pub kv_heads: usize,
    pub head_dim: usize,
}

impl KvShape {
    /// Floats of keys (or of values) one position takes.
    fn floats(self) -> usize {
        self.kv_heads * self.head_dim
    }
}

/// The block storage of every attention layer of one model.
pub struct PagedKv {
    block_size: usize,
    blocks: usize,
    /// `None` for layers without softmax attention (the linear-attention layers of a hybrid).
    layers: Vec<Option<LayerStore>>,
}

struct LayerStore {
    shape: KvShape,
    keys: RwLock<Vec<f32>>,
    values: RwLock<Vec<f32>>,
}

impl PagedKv {
    /// Storage for `blocks` blocks of `block_size` positions for layers shaped `shapes`.
    pub fn new(shapes: &[Option<KvShape>], blocks: usize, block_size: usize) -> Self {
        assert!(block_size > 0, "blocks hold at least one position");
        let layers = shapes
            .iter()
            .map(|shape| {
                shape.map(|shape| {
                    let floats = blocks * block_size * shape.floats();
                    LayerStore { shape, keys: RwLock::new(vec![0.0; floats]), values: RwLock::new(vec![0.0; floats]) }
                })
            })
            .collect();
        Self { block_size, blocks, layers }
    }

    /// Bytes one block takes across all layers (keys and values).
    pub fn block_bytes(shapes: &[Option<KvShape>], block_size: usize) -> usize {
        shapes.iter().flatten().map(|s| 2 * s.floats() * block_size * std::mem::size_of::<f32>()).sum()
    }

    /// The shape of each layer's keys/values (`None` for layers without softmax attention).
    pub fn shapes(&self) -> Vec<Option<KvShape>> {
        self.layers.iter().map(|l| l.as_ref().map(|l| l.shape)).collect()
    }

    pub fn block_size(&self) -> usize {
        self.block_size
    }

    fn layer(&self, layer: usize) -> Result<&LayerStore> {
        self.layers
            .get(layer)
            .and_then(Option::as_ref)
            .ok_or_else(|| ModelError::BadConfig(format!("layer {layer} keeps no keys and values")))
    }

    /// Float offset of (block, head, position in block) in a layer's storage.
    fn offset(&self, shape: KvShape, block: u32, head: usize, within: usize) -> usize {
        ((block as usize * shape.kv_heads + head) * self.block_size + within) * shape.head_dim
    }

    fn check_blocks(&self, table: &[u32]) -> Result<()> {
        match table.iter().find(|&&b| b as usize >= self.blocks) {
            Some(b) => Err(ModelError::BadConfig(format!("block {b} is outside the pool of {} blocks", self.blocks))),
            None => Ok(()),
        }
    }

    /// Writes keys and values `(1, kv_heads, new, head_dim)` at positions `start..start + new` of
    /// the sequence whose blocks are `table`.
    pub fn write(&self, layer: usize, table: &[u32], start: usize, k: &Tensor, v: &Tensor) -> Result<()> {
        let store = self.layer(layer)?;
        let (_, heads, new, d) = k.dims4()?;
        if heads != store.shape.kv_heads || d != store.shape.head_dim {
            return Err(ModelError::BadConfig(format!("layer {layer} got keys of {heads}×{d}, expected {:?}", store.shape)));
        }
        if (start + new).div_ceil(self.block_size) > table.len() {
            return Err(ModelError::BadConfig(format!("positions up to {} need more blocks than the {} given", start + new, table.len())));
        }
        self.check_blocks(table)?;
        for (tensor, storage) in [(k, &store.keys), (v, &store.values)] {
            let src = tensor.flatten_all()?.to_vec1::<f32>()?;
            let mut dst = storage.write().expect("KV storage lock");
            for head in 0..heads {
                for i in 0..new {
                    let pos = start + i;
                    let at = self.offset(store.shape, table[pos / self.block_size], head, pos % self.block_size);
                    let from = (head * new + i) * d;
                    dst[at..at + d].copy_from_slice(&src[from..from + d]);
                }
            }
        }
        Ok(())
    }

    /// Calls `f` with the keys and values of positions `0..len` of the sequence whose blocks are
    /// `table`, per key/value head, read where they are stored.
    pub(crate) fn with_head_runs<R>(&self, layer: usize, table: &[u32], len: usize, f: impl FnOnce(&[HeadRuns<'_>]) -> R) -> Result<R> {
        let store = self.layer(layer)?;
        self.check_blocks(table)?;
        if len.div_ceil(self.block_size) > table.len() {
            return Err(ModelError::BadConfig(format!("positions up to {len} need more blocks than the {} given", table.len())));
        }
        let (keys, values) = (store.keys.read().expect("KV storage lock"), store.values.read().expect("KV storage lock"));
        let d = store.shape.head_dim;
        let heads: Vec<HeadRuns> = (0..store.shape.kv_heads)
            .map(|head| HeadRuns {
                runs: (0..len.div_ceil(self.block_size))
                    .map(|i| {
                        let n = (len - i * self.block_size).min(self.block_size);
                        let at = self.offset(store.shape, table[i], head, 0);
                        (&keys[at..at + n * d], &values[at..at + n * d])
                    })
                    .collect(),
            })
            .collect();
        Ok(f(&heads))
    }

    /// Keys and values `(1, kv_heads, len, head_dim)` of positions `0..len` of the sequence whose
    /// blocks are `table`.
    pub fn gather(&self, layer: usize, table: &[u32], len: usize) -> Result<(Tensor, Tensor)> {
        let store = self.layer(layer)?;
        let KvShape { kv_heads, head_dim } = store.shape;
        self.check_blocks(table)?;
        let gather = |storage: &RwLock<Vec<f32>>| -> Result<Tensor> {
            let src = storage.read().expect("KV storage lock");
            let mut out = Vec::with_capacity(kv_heads * len * head_dim);
            for head in 0..kv_heads {
                let mut pos = 0;
                for &block in table {
                    if pos >= len {
                        break;
                    }
                    let run = (len - pos).min(self.block_size);
                    let at = self.offset(store.shape, block, head, 0);
                    out.extend_from_slice(&src[at..at + run * head_dim]);
                    pos += run;
                }
            }
            Ok(Tensor::from_vec(out, (1, kv_heads, len, head_dim), &Device::Cpu)?)
        };
        Ok((gather(&store.keys)?, gather(&store.values)?))
    }

    /// Copies the first `positions` positions of block `from` into block `to` in every layer
    /// (a sequence taking over a partly filled shared block before writing past it).
    pub fn copy_positions(&self, from: u32, to: u32, positions: usize) -> Result<()> {
        self.check_blocks(&[from, to])?;
        for store in self.layers.iter().flatten() {
            for storage in [&store.keys, &store.values] {
                let mut data = storage.write().expect("KV storage lock");
                for head in 0..store.shape.kv_heads {
                    let src = self.offset(store.shape, from, head, 0);
                    let dst = self.offset(store.shape, to, head, 0);
                    data.copy_within(src..src + positions * store.shape.head_dim, dst);
                }
            }
        }
        Ok(())
    }

    /// The raw contents of `block` in every layer, keys then values per layer (for the disk tier).
    pub fn read_block(&self, block: u32) -> Result<Vec<f32>> {
        self.check_blocks(&[block])?;
        let mut out = Vec::new();
        for store in self.layers.iter().flatten() {
            let floats = store.shape.floats() * self.block_size;
            let at = self.offset(store.shape, block, 0, 0);
            for storage in [&store.keys, &store.values] {
                out.extend_from_slice(&storage.read().expect("KV storage lock")[at..at + floats]);
            }
        }
        Ok(out)
    }

    /// Floats [`read_block`](Self::read_block) returns for one block.
    pub fn block_floats(&self) -> usize {
        self.layers.iter().flatten().map(|s| 2 * s.shape.floats() * self.block_size).sum()
    }

    /// Overwrites `block` in every layer with what [`read_block`](Self::read_block) returned.
    pub fn write_block(&self, block: u32, data: &[f32]) -> Result<()> {
        self.check_blocks(&[block])?;
        if data.len() != self.block_floats() {
            return Err(ModelError::BadConfig(format!("a block holds {} floats, got {}", self.block_floats(), data.len())));
        }
        let mut from = 0;
        for store in self.layers.iter().flatten() {
            let floats = store.shape.floats() * self.block_size;
            let at = self.offset(store.shape, block, 0, 0);
            for storage in [&store.keys, &store.values] {
                storage.write().expect("KV storage lock")[at..at + floats].copy_from_slice(&data[from..from + floats]);
                from += floats;
            }
        }
        Ok(())
    }
}

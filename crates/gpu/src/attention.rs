//! Causal softmax attention over a paged KV pool (block tables as the CPU's `PagedKv` keeps
//! them), for a prefill chunk's queries or a decode step's one, of any number of sequences in
//! one dispatch; and writing a step's keys and values into the pool.

use crate::buffer::{GpuBytes, GpuTensor};
use crate::device::Gpu;
use crate::error::{GpuError, Result};
use crate::kernel::{count, Kernel};
use crate::step::Step;

/// Widest head the kernel holds (each of its 64 lanes keeps 4 output dimensions).
pub const MAX_HEAD_DIM: usize = 256;

/// The heads of one attention layer.
#[derive(Clone, Copy, Debug)]
pub struct AttentionShape {
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    /// Multiplies each dot product (usually `1/sqrt(head_dim)`).
    pub scale: f32,
    /// A sliding window: keys further back than this many positions are not seen.
    pub window: Option<usize>,
}

impl AttentionShape {
    fn check(&self) -> Result<()> {
        let &AttentionShape { heads, kv_heads, head_dim, .. } = self;
        if head_dim == 0
            || head_dim > MAX_HEAD_DIM
            || kv_heads == 0
            || heads == 0
            || !heads.is_multiple_of(kv_heads)
        {
            return Err(GpuError::BadInput(format!(
                "{heads} heads over {kv_heads} key/value heads of width {head_dim} \
                 (at most {MAX_HEAD_DIM}; heads a multiple of key/value heads)"
            )));
        }
        Ok(())
    }
}

/// One sequence's keys and values, `(capacity, kv_heads, head_dim)` each, of which the first
/// `len` positions are filled.
pub struct KvCache {
    pub keys: GpuTensor,
    pub values: GpuTensor,
    pub len: usize,
}

/// One layer's keys and values of many sequences: `blocks` blocks of `block_size` slots, each
/// slot `(kv_heads, head_dim)`.
pub struct KvPool {
    keys: GpuTensor,
    values: GpuTensor,
    block_size: usize,
    blocks: usize,
}

impl KvPool {
    pub fn new(gpu: &Gpu, blocks: usize, block_size: usize, kv_width: usize) -> Result<Self> {
        if blocks == 0 || block_size == 0 || kv_width == 0 {
            return Err(GpuError::BadInput(format!(
                "a pool of {blocks} blocks of {block_size} slots of {kv_width} values"
            )));
        }
        let len = blocks * block_size * kv_width;
        Ok(KvPool { keys: gpu.zeros(len)?, values: gpu.zeros(len)?, block_size, blocks })
    }

    /// Copies the first `positions` slots of block `from` into block `to`, keys and values,
    /// through `staging` (at least a block long): a buffer cannot be copied into itself.
    pub(crate) fn copy_positions(
        &self,
        step: &mut Step<'_>,
        (from, to, positions): (u32, u32, usize),
        staging: &GpuTensor,
    ) -> Result<()> {
        let (from, to) = (from as usize, to as usize);
        if from >= self.blocks || to >= self.blocks || positions > self.block_size {
            return Err(GpuError::BadInput(format!(
                "{positions} positions from block {from} to block {to} of a pool of {} blocks of {}",
                self.blocks, self.block_size
            )));
        }
        let block = self.keys.len() / self.blocks;
        let len = positions * (block / self.block_size);
        for rows in [&self.keys, &self.values] {
            step.copy(rows, from * block, staging, 0, len)?;
            step.copy(staging, 0, rows, to * block, len)?;
        }
        Ok(())
    }

    /// Values one block holds (keys or values alone).
    pub(crate) fn block_len(&self) -> usize {
        self.keys.len() / self.blocks
    }
}

/// Where a row of a step sits: its position in its sequence, whose block table starts at
/// `table_start` of the step's tables.
#[derive(Clone, Copy, Debug)]
pub struct QueryPlace {
    pub row: usize,
    pub position: usize,
    pub table_start: usize,
}

/// Keys and values as the attention kernel reads them: blocks of `block_size` positions.
struct StoredKv<'a> {
    keys: &'a GpuTensor,
    values: &'a GpuTensor,
    block_size: usize,
}

/// Rows of a step with their places, and the block tables they name, on the device.
pub struct PagedRows {
    places: Vec<QueryPlace>,
    tables: Vec<u32>,
    places_on_device: GpuBytes,
    tables_on_device: GpuBytes,
}

impl PagedRows {
    pub fn upload(gpu: &Gpu, places: Vec<QueryPlace>, tables: Vec<u32>) -> Result<Self> {
        let words = places
            .iter()
            .flat_map(|p| [(p.row, "row"), (p.position, "position"), (p.table_start, "table")])
            .map(|(n, what)| count(n, what))
            .collect::<Result<Vec<u32>>>()?;
        Ok(PagedRows {
            places_on_device: gpu.upload_indices(&words, "query places")?,
            tables_on_device: gpu.upload_indices(&tables, "block tables")?,
            places,
            tables,
        })
    }

    /// Fails unless every row is below `rows` and every position up to each row's own lies in
    /// blocks of its table within a pool of `blocks` blocks of `block_size`.
    fn check(&self, rows: usize, blocks: usize, block_size: usize) -> Result<()> {
        for p in &self.places {
            let last = p.table_start + p.position / block_size;
            let fits = p.row < rows
                && last < self.tables.len()
                && self.tables[p.table_start..=last].iter().all(|&b| (b as usize) < blocks);
            if !fits {
                return Err(GpuError::BadInput(format!(
                    "{p:?} against {rows} rows, tables of {} entries and a pool of {blocks} \
                     blocks of {block_size}",
                    self.tables.len()
                )));
            }
        }
        Ok(())
    }
}

pub struct Attention {
    attend: Kernel,
    write: Kernel,
}

impl Attention {
    pub fn new(gpu: &Gpu) -> Result<Self> {
        Ok(Attention {
            attend: Kernel::new(gpu, "attention", include_str!("shaders/attention.wgsl"))?,
            write: Kernel::new(gpu, "kv_write", include_str!("shaders/kv_write.wgsl"))?,
        })
    }

    /// Stores rows `rows` of `keys` and `values` `(rows, kv_heads, head_dim)` at their places
    /// in `pool`.
    pub fn write(
        &self,
        step: &mut Step<'_>,
        keys: &GpuTensor,
        values: &GpuTensor,
        pool: &KvPool,
        rows: &PagedRows,
    ) -> Result<()> {
        let width = pool.keys.len() / (pool.blocks * pool.block_size);
        if keys.len() != values.len() || !keys.len().is_multiple_of(width) {
            return Err(GpuError::BadInput(format!(
                "{} keys and {} values for slots of {width}",
                keys.len(),
                values.len()
            )));
        }
        rows.check(keys.len() / width, pool.blocks, pool.block_size)?;
        let params = [
            count(rows.places.len(), "rows")?,
            count(width, "key width")?,
            count(pool.block_size, "block size")?,
        ];
        let buffers = [
            &keys.buffer,
            &values.buffer,
            &pool.keys.buffer,
            &pool.values.buffer,
            &rows.tables_on_device.buffer,
            &rows.places_on_device.buffer,
        ];
        let groups = count((rows.places.len() * width).div_ceil(64), "groups")?;
        self.write.record(step, &buffers, &params, (groups, 1));
        Ok(())
    }

    /// Writes into `out` `(rows, heads, head_dim)` the attention of each query row of `q`
    /// (shaped alike) that `queries` names, over its sequence's positions in `pool` up to its
    /// own (its keys and values already written there).
    pub fn paged(
        &self,
        step: &mut Step<'_>,
        q: &GpuTensor,
        pool: &KvPool,
        queries: &PagedRows,
        shape: AttentionShape,
        out: &GpuTensor,
    ) -> Result<()> {
        shape.check()?;
        let row = shape.heads * shape.head_dim;
        let kv_width = shape.kv_heads * shape.head_dim;
        if !q.len().is_multiple_of(row)
            || out.len() != q.len()
            || pool.keys.len() != pool.blocks * pool.block_size * kv_width
        {
            return Err(GpuError::BadInput(format!(
                "{} query values and {} outputs for rows of {row}, over a pool of {} values \
                 for slots of {kv_width}",
                q.len(),
                out.len(),
                pool.keys.len()
            )));
        }
        queries.check(q.len() / row, pool.blocks, pool.block_size)?;
        let kv = StoredKv { keys: &pool.keys, values: &pool.values, block_size: pool.block_size };
        self.dispatch(step, q, kv, queries, shape, out)
    }

    /// The outputs `(tokens, heads, head_dim)` of queries `q` `(tokens, heads, head_dim)` at
    /// the last `tokens` positions of one sequence's contiguous `cache` (their own keys and
    /// values already in it).
    pub fn forward(
        &self,
        step: &mut Step<'_>,
        q: &GpuTensor,
        cache: &KvCache,
        shape: AttentionShape,
    ) -> Result<GpuTensor> {
        shape.check()?;
        let row = shape.heads * shape.head_dim;
        let tokens = q.len() / row;
        let kv_width = shape.kv_heads * shape.head_dim;
        if q.len() != tokens * row
            || tokens > cache.len
            || cache.keys.len() < cache.len * kv_width
            || cache.values.len() != cache.keys.len()
        {
            return Err(GpuError::BadInput(format!(
                "{} query values for rows of {row}, a cache of {} positions held in {} keys and {} values",
                q.len(),
                cache.len,
                cache.keys.len(),
                cache.values.len()
            )));
        }
        // The whole cache is one block.
        let past = cache.len - tokens;
        let places = (0..tokens).map(|t| QueryPlace { row: t, position: past + t, table_start: 0 });
        let queries = PagedRows::upload(step.gpu, places.collect(), vec![0])?;
        let out = step.gpu.output(q.len());
        let capacity = (cache.keys.len() / kv_width).max(1);
        let kv = StoredKv { keys: &cache.keys, values: &cache.values, block_size: capacity };
        self.dispatch(step, q, kv, &queries, shape, &out)?;
        Ok(out)
    }

    fn dispatch(
        &self,
        step: &mut Step<'_>,
        q: &GpuTensor,
        StoredKv { keys, values, block_size }: StoredKv<'_>,
        queries: &PagedRows,
        shape: AttentionShape,
        out: &GpuTensor,
    ) -> Result<()> {
        let params = [
            count(queries.places.len(), "queries")?,
            count(shape.heads, "heads")?,
            count(shape.kv_heads, "key/value heads")?,
            count(shape.head_dim, "head width")?,
            count(block_size, "block size")?,
            count(shape.window.unwrap_or(0), "window")?,
            shape.scale.to_bits(),
        ];
        let buffers = [
            &q.buffer,
            &keys.buffer,
            &values.buffer,
            &out.buffer,
            &queries.tables_on_device.buffer,
            &queries.places_on_device.buffer,
        ];
        let groups = count(queries.places.len() * shape.heads, "query heads")?;
        self.attend.record(step, &buffers, &params, (groups, 1));
        Ok(())
    }
}

//! Causal softmax attention over a paged KV pool (block tables as the CPU's `PagedKv` keeps
//! them), for a prefill chunk's queries or a decode step's one, of any number of sequences in
//! one dispatch; and writing a step's keys and values into the pool.

use crate::buffer::{GpuBytes, GpuTensor};
use crate::device::Gpu;
use crate::error::{GpuError, Result};
use crate::kernel::{count, Kernel};
use crate::step::{Readback, Step};

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

/// How a pool stores keys and values: as f32, or as f16 two to a word (the host pool's
/// `--kv-cache-type`, at half the memory).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KvFormat {
    F32,
    F16,
}

impl KvFormat {
    /// Values one 32-bit word holds.
    fn per_word(self) -> usize {
        match self {
            KvFormat::F32 => 1,
            KvFormat::F16 => 2,
        }
    }

    /// The pool's bindings and how kernels read and write them, appended to theirs.
    fn shader(self) -> &'static str {
        match self {
            KvFormat::F32 => include_str!("shaders/kv_f32.wgsl"),
            KvFormat::F16 => include_str!("shaders/kv_f16.wgsl"),
        }
    }
}

/// One layer's keys and values of many sequences: `blocks` blocks of `block_size` slots, each
/// slot `(kv_heads, head_dim)`, in `format`.
pub struct KvPool {
    /// Words of the format, `blocks × block_size × kv_width / per_word` each.
    keys: GpuTensor,
    values: GpuTensor,
    block_size: usize,
    blocks: usize,
    kv_width: usize,
    format: KvFormat,
}

impl KvPool {
    /// A pool of zeros; f16 slots need an even width (two values to a word).
    pub fn new(
        gpu: &Gpu,
        (blocks, block_size): (usize, usize),
        kv_width: usize,
        format: KvFormat,
    ) -> Result<Self> {
        if blocks == 0
            || block_size == 0
            || kv_width == 0
            || !kv_width.is_multiple_of(format.per_word())
        {
            return Err(GpuError::BadInput(format!(
                "a pool of {blocks} blocks of {block_size} slots of {kv_width} {format:?} values"
            )));
        }
        let words = blocks * block_size * kv_width / format.per_word();
        Ok(KvPool {
            keys: gpu.zeros(words)?,
            values: gpu.zeros(words)?,
            block_size,
            blocks,
            kv_width,
            format,
        })
    }

    pub fn format(&self) -> KvFormat {
        self.format
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

    /// Words one block holds (keys or values alone).
    pub(crate) fn block_len(&self) -> usize {
        self.keys.len() / self.blocks
    }

    /// Slots (positions) of a block.
    pub(crate) fn block_size(&self) -> usize {
        self.block_size
    }

    /// Bytes of one stored value (f16: 2, f32: 4).
    pub(crate) fn value_bytes(&self) -> usize {
        4 / self.format.per_word()
    }

    /// Where block `block` starts in `keys` and `values` (in words), refused past the pool.
    fn block_start(&self, block: u32) -> Result<usize> {
        match block as usize {
            b if b < self.blocks => Ok(b * self.block_len()),
            b => Err(GpuError::BadInput(format!("block {b} of a pool of {}", self.blocks))),
        }
    }

    /// Block `block`'s keys and values as stored (words: slot after slot, `kv_width` values
    /// each), as they are at this point of the step.
    pub(crate) fn read_block(&self, step: &mut Step<'_>, block: u32) -> Result<[Readback; 2]> {
        let (at, len) = (self.block_start(block)?, self.block_len());
        Ok([step.read_range(&self.keys, at, len)?, step.read_range(&self.values, at, len)?])
    }

    /// Overwrites block `block`'s keys and values with `words`, laid out as
    /// [`KvPool::read_block`] gives them, before the next submission runs.
    pub(crate) fn write_block(&self, gpu: &Gpu, block: u32, words: [&[f32]; 2]) -> Result<()> {
        let (at, len) = (self.block_start(block)?, self.block_len());
        if words.iter().any(|w| w.len() != len) {
            return Err(GpuError::BadInput(format!(
                "a block of {len} words, got {:?}",
                words.map(<[f32]>::len)
            )));
        }
        gpu.write(&self.keys, at, words[0]);
        gpu.write(&self.values, at, words[1]);
        Ok(())
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
    format: KvFormat,
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

/// The attention and pool-writing kernels, for each pool format.
pub struct Attention {
    attend: [Kernel; 2],
    write: [Kernel; 2],
}

impl Attention {
    pub fn new(gpu: &Gpu) -> Result<Self> {
        let kernels = |name, source: &str| -> Result<[Kernel; 2]> {
            let [f32, f16] =
                [KvFormat::F32, KvFormat::F16].map(|f| format!("{source}\n{}", f.shader()));
            Ok([Kernel::new(gpu, name, &f32)?, Kernel::new(gpu, name, &f16)?])
        };
        Ok(Attention {
            attend: kernels("attention", include_str!("shaders/attention.wgsl"))?,
            write: kernels("kv_write", include_str!("shaders/kv_write.wgsl"))?,
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
        let width = pool.kv_width;
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
            &pool.keys.buffer,
            &pool.values.buffer,
            &values.buffer,
            &rows.tables_on_device.buffer,
            &rows.places_on_device.buffer,
        ];
        let words = rows.places.len() * width / pool.format.per_word();
        let groups = count(words.div_ceil(64), "groups")?;
        self.write[pool.format as usize].record(step, &buffers, &params, (groups, 1));
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
        if !q.len().is_multiple_of(row) || out.len() != q.len() || pool.kv_width != kv_width {
            return Err(GpuError::BadInput(format!(
                "{} query values and {} outputs for rows of {row}, over a pool of slots of {} \
                 for slots of {kv_width}",
                q.len(),
                out.len(),
                pool.kv_width
            )));
        }
        queries.check(q.len() / row, pool.blocks, pool.block_size)?;
        let kv = StoredKv {
            keys: &pool.keys,
            values: &pool.values,
            block_size: pool.block_size,
            format: pool.format,
        };
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
        let kv = StoredKv {
            keys: &cache.keys,
            values: &cache.values,
            block_size: capacity,
            format: KvFormat::F32,
        };
        self.dispatch(step, q, kv, &queries, shape, &out)?;
        Ok(out)
    }

    fn dispatch(
        &self,
        step: &mut Step<'_>,
        q: &GpuTensor,
        StoredKv { keys, values, block_size, format }: StoredKv<'_>,
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
        self.attend[format as usize].record(step, &buffers, &params, (groups, 1));
        Ok(())
    }
}

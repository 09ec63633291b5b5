//! Attention keys and values of all sequences, in fixed-size blocks of positions. A sequence
//! names its blocks in a block table; sequences that share a prompt prefix name the same blocks,
//! so the prefix is stored once. Which blocks are free is decided outside (the scheduler's block
//! pool); this module only stores and moves the numbers.
//!
//! Layout per attention layer: block after block, each `kv_heads × block_size` rows of
//! `head_dim` values in the pool's [`KvType`], so a sequence's keys of one head are runs of
//! `block_size` rows, which attention reads in place. A row is converted to that type when it
//! is written, by itself, so what is stored does not depend on the batch.
//! The storage is allocated zeroed, which the OS commits lazily: an unused pool costs no memory.
//! Sequences of one batch attend in parallel: many may read a layer at once, one writes.

// Not std's: a panic while a step writes (a model fault the engine survives) must not poison
// the storage for every later step.
use parking_lot::{Mutex, RwLock};
use std::sync::{Arc, OnceLock};

use candle_core::Tensor;

use crate::error::{ModelError, Result};
use crate::kv_mirror::KvMirror;
use crate::kv_type::{encode_bf16, encode_f16, encode_q8_0, KvRows, KvType};
use crate::paged_attention::HeadRuns;

/// Key/value sizes of one attention layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KvShape {
    pub kv_heads: usize,
    pub head_dim: usize,
    /// A sliding-window layer's window: a query sees this many positions up to its own.
    pub window: Option<usize>,
}

impl KvShape {
    /// Bytes of keys (or of values) one position takes when stored as `kind`.
    fn bytes(self, kind: KvType) -> usize {
        self.kv_heads * kind.row_bytes(self.head_dim)
    }
}

/// One layer's keys or values, in the elements of their type.
enum KvBuffer {
    F32(Vec<f32>),
    F16(Vec<u16>),
    Bf16(Vec<u16>),
    Q8_0(Vec<u8>),
}

impl KvBuffer {
    fn zeroed(kind: KvType, units: usize) -> Self {
        match kind {
            KvType::F32 => KvBuffer::F32(vec![0.0; units]),
            KvType::F16 => KvBuffer::F16(vec![0; units]),
            KvType::Bf16 => KvBuffer::Bf16(vec![0; units]),
            KvType::Q8_0 => KvBuffer::Q8_0(vec![0; units]),
        }
    }

    /// The elements `at..at + units`.
    fn rows(&self, at: usize, units: usize) -> KvRows<'_> {
        match self {
            KvBuffer::F32(x) => KvRows::F32(&x[at..at + units]),
            KvBuffer::F16(x) => KvRows::F16(&x[at..at + units]),
            KvBuffer::Bf16(x) => KvRows::Bf16(&x[at..at + units]),
            KvBuffer::Q8_0(x) => KvRows::Q8_0(&x[at..at + units]),
        }
    }

    /// Stores the values `row` (whole rows) from element `at` on, converted to the type.
    fn write(&mut self, at: usize, row: &[f32]) {
        match self {
            KvBuffer::F32(x) => x[at..at + row.len()].copy_from_slice(row),
            KvBuffer::F16(x) => encode_f16(row, &mut x[at..at + row.len()]),
            KvBuffer::Bf16(x) => encode_bf16(row, &mut x[at..at + row.len()]),
            KvBuffer::Q8_0(x) => {
                encode_q8_0(row, &mut x[at..at + KvType::Q8_0.row_units(row.len())])
            }
        }
    }

    fn copy_within(&mut self, from: usize, units: usize, to: usize) {
        match self {
            KvBuffer::F32(x) => x.copy_within(from..from + units, to),
            KvBuffer::F16(x) | KvBuffer::Bf16(x) => x.copy_within(from..from + units, to),
            KvBuffer::Q8_0(x) => x.copy_within(from..from + units, to),
        }
    }

    /// Copies `units` elements at `from` of `source` (of the same type) to `to`.
    fn copy_from(&mut self, to: usize, source: &KvBuffer, from: usize, units: usize) {
        match (self, source) {
            (KvBuffer::F32(x), KvBuffer::F32(y)) => {
                x[to..to + units].copy_from_slice(&y[from..from + units])
            }
            (KvBuffer::F16(x), KvBuffer::F16(y)) | (KvBuffer::Bf16(x), KvBuffer::Bf16(y)) => {
                x[to..to + units].copy_from_slice(&y[from..from + units])
            }
            (KvBuffer::Q8_0(x), KvBuffer::Q8_0(y)) => {
                x[to..to + units].copy_from_slice(&y[from..from + units])
            }
            _ => unreachable!("pools of one type"),
        }
    }

    /// Gives the whole memory pages within elements `at..at + units` back to the OS.
    fn release(&mut self, at: usize, units: usize) {
        match self {
            KvBuffer::F32(x) => release_pages(&mut x[at..at + units]),
            KvBuffer::F16(x) | KvBuffer::Bf16(x) => release_pages(&mut x[at..at + units]),
            KvBuffer::Q8_0(x) => release_pages(&mut x[at..at + units]),
        }
    }

    /// Appends the elements `at..at + units` to `out` as little-endian bytes.
    fn append_bytes(&self, at: usize, units: usize, out: &mut Vec<u8>) {
        match self {
            KvBuffer::F32(x) => {
                x[at..at + units].iter().for_each(|v| out.extend_from_slice(&v.to_le_bytes()))
            }
            KvBuffer::F16(x) | KvBuffer::Bf16(x) => {
                x[at..at + units].iter().for_each(|v| out.extend_from_slice(&v.to_le_bytes()))
            }
            KvBuffer::Q8_0(x) => out.extend_from_slice(&x[at..at + units]),
        }
    }

    /// Overwrites elements from `at` on with `bytes` as [`append_bytes`](Self::append_bytes)
    /// wrote them.
    fn set_bytes(&mut self, at: usize, bytes: &[u8]) {
        match self {
            KvBuffer::F32(x) => {
                for (v, b) in x[at..].iter_mut().zip(bytes.chunks_exact(4)) {
                    *v = f32::from_le_bytes(b.try_into().expect("4 bytes"));
                }
            }
            KvBuffer::F16(x) | KvBuffer::Bf16(x) => {
                for (v, b) in x[at..].iter_mut().zip(bytes.chunks_exact(2)) {
                    *v = u16::from_le_bytes(b.try_into().expect("2 bytes"));
                }
            }
            KvBuffer::Q8_0(x) => x[at..at + bytes.len()].copy_from_slice(bytes),
        }
    }
}

/// The block storage of every attention layer of one model.
pub struct PagedKv {
    kind: KvType,
    block_size: usize,
    blocks: usize,
    /// `None` for layers without softmax attention (the linear-attention layers of a hybrid).
    layers: Vec<Option<LayerStore>>,
    /// Where the rows live when a device computes in this pool (the host's stay unwritten).
    mirror: OnceLock<Arc<dyn KvMirror>>,
    /// Blocks written on the host outside a model pass (a disk import, a copy) while no mirror
    /// held the rows: a mirror taking them over takes these along.
    host_written: Mutex<Vec<u32>>,
}

struct LayerStore {
    shape: KvShape,
    keys: RwLock<KvBuffer>,
    values: RwLock<KvBuffer>,
}

impl PagedKv {
    /// Storage as `kind` for `blocks` blocks of `block_size` positions for layers shaped
    /// `shapes`, whose head size `kind` must fit ([`KvType::fits`]).
    pub fn new(shapes: &[Option<KvShape>], kind: KvType, blocks: usize, block_size: usize) -> Self {
        assert!(block_size > 0, "blocks hold at least one position");
        let layers = shapes
            .iter()
            .map(|shape| {
                shape.map(|shape| {
                    assert!(
                        kind.fits(shape.head_dim),
                        "{kind} cannot store heads of {}",
                        shape.head_dim
                    );
                    let units =
                        blocks * block_size * shape.kv_heads * kind.row_units(shape.head_dim);
                    LayerStore {
                        shape,
                        keys: RwLock::new(KvBuffer::zeroed(kind, units)),
                        values: RwLock::new(KvBuffer::zeroed(kind, units)),
                    }
                })
            })
            .collect();
        let (mirror, host_written) = (OnceLock::new(), Mutex::default());
        Self { kind, block_size, blocks, layers, mirror, host_written }
    }

    /// Hands the rows to `mirror` for good: copies outside a model pass, and the disk tier's
    /// reads and writes, go there. Blocks the host wrote before (a disk import ahead of the
    /// first pass) are written to the mirror now.
    pub fn mirror_to(&self, mirror: Arc<dyn KvMirror>) -> Result<()> {
        self.mirror
            .set(mirror.clone())
            .map_err(|_| ModelError::BadConfig("a KV pool already mirrored".into()))?;
        let mut written = std::mem::take(&mut *self.host_written.lock());
        written.sort_unstable();
        written.dedup();
        for block in written {
            let mut rows = Vec::new();
            for (_, store) in self.stores().filter(|(layer, _)| mirror.holds(*layer)) {
                self.append_host_rows(store, block, &mut rows);
            }
            mirror.write_block(block, &rows)?;
        }
        Ok(())
    }

    /// The layers with keys and values, numbered among all layers.
    fn stores(&self) -> impl Iterator<Item = (usize, &LayerStore)> {
        self.layers.iter().enumerate().filter_map(|(i, store)| Some((i, store.as_ref()?)))
    }

    /// The layers whose rows the host holds: all without a mirror, else those it does not.
    fn host_stores(&self) -> impl Iterator<Item = &LayerStore> {
        let mirror = self.mirror.get();
        self.stores()
            .filter(move |(layer, _)| !mirror.is_some_and(|m| m.holds(*layer)))
            .map(|(_, store)| store)
    }

    /// Fails when the rows live in a mirror, for what reads or writes the host's rows.
    fn host_rows(&self, what: &str) -> Result<()> {
        match self.mirror.get() {
            Some(_) => Err(ModelError::BadConfig(format!(
                "{what}: this pool's rows live on another device"
            ))),
            None => Ok(()),
        }
    }

    /// Bytes one block takes across all layers (keys and values) stored as `kind`.
    pub fn block_bytes(shapes: &[Option<KvShape>], kind: KvType, block_size: usize) -> usize {
        shapes.iter().flatten().map(|s| 2 * s.bytes(kind) * block_size).sum()
    }

    pub fn kv_type(&self) -> KvType {
        self.kind
    }

    /// The widest sliding window of the layers that have one.
    pub fn widest_window(&self) -> Option<usize> {
        self.layers.iter().flatten().filter_map(|l| l.shape.window).max()
    }

    /// Gives the memory of `blocks` in the sliding-window layers back to the OS, for blocks
    /// whose positions no query will see in those layers again (a sequence more than a window
    /// past them, and no cached prefix that could resume within a window of them). Their rows
    /// there are undefined until written again; the other layers keep theirs.
    pub fn release_window_rows(&self, blocks: &[u32]) -> Result<()> {
        self.check_blocks(blocks)?;
        // Runs of consecutive blocks in one piece: a block need not fill whole pages.
        let mut sorted = blocks.to_vec();
        sorted.sort_unstable();
        sorted.dedup();
        let mut runs: Vec<(u32, u32)> = Vec::new();
        for block in sorted {
            match runs.last_mut() {
                Some((_, end)) if *end == block => *end += 1,
                _ => runs.push((block, block + 1)),
            }
        }
        for store in self.layers.iter().flatten().filter(|l| l.shape.window.is_some()) {
            for storage in [&store.keys, &store.values] {
                let mut storage = storage.write();
                for &(first, end) in &runs {
                    let at = self.offset(store.shape, first, 0, 0);
                    storage.release(at, self.offset(store.shape, end, 0, 0) - at);
                }
            }
        }
        Ok(())
    }

    /// The shape of each layer's keys/values (`None` for layers without softmax attention).
    pub fn shapes(&self) -> Vec<Option<KvShape>> {
        self.layers.iter().map(|l| l.as_ref().map(|l| l.shape)).collect()
    }

    pub fn block_size(&self) -> usize {
        self.block_size
    }

    /// Blocks held.
    pub fn blocks(&self) -> usize {
        self.blocks
    }

    fn layer(&self, layer: usize) -> Result<&LayerStore> {
        self.layers
            .get(layer)
            .and_then(Option::as_ref)
            .ok_or_else(|| ModelError::BadConfig(format!("layer {layer} keeps no keys and values")))
    }

    /// Element offset of (block, head, position in block) in a layer's storage.
    fn offset(&self, shape: KvShape, block: u32, head: usize, within: usize) -> usize {
        ((block as usize * shape.kv_heads + head) * self.block_size + within)
            * self.row_units(shape)
    }

    /// Elements of one head's row at one position.
    fn row_units(&self, shape: KvShape) -> usize {
        self.kind.row_units(shape.head_dim)
    }

    fn check_blocks(&self, table: &[u32]) -> Result<()> {
        match table.iter().find(|&&b| b as usize >= self.blocks) {
            Some(b) => Err(ModelError::BadConfig(format!(
                "block {b} is outside the pool of {} blocks",
                self.blocks
            ))),
            None => Ok(()),
        }
    }

    /// Writes keys and values `(1, kv_heads, new, head_dim)` at positions `start..start + new` of
    /// the sequence whose blocks are `table`.
    pub fn write(
        &self,
        layer: usize,
        table: &[u32],
        start: usize,
        k: &Tensor,
        v: &Tensor,
    ) -> Result<()> {
        let store = self.layer(layer)?;
        let (_, heads, new, d) = k.dims4()?;
        if heads != store.shape.kv_heads || d != store.shape.head_dim {
            return Err(ModelError::BadConfig(format!(
                "layer {layer} got keys of {heads}×{d}, expected {:?}",
                store.shape
            )));
        }
        if (start + new).div_ceil(self.block_size) > table.len() {
            return Err(ModelError::BadConfig(format!(
                "positions up to {} need more blocks than the {} given",
                start + new,
                table.len()
            )));
        }
        self.check_blocks(table)?;
        for (tensor, storage) in [(k, &store.keys), (v, &store.values)] {
            let src = tensor.flatten_all()?.to_vec1::<f32>()?;
            let mut dst = storage.write();
            for head in 0..heads {
                for i in 0..new {
                    let pos = start + i;
                    let at = self.offset(
                        store.shape,
                        table[pos / self.block_size],
                        head,
                        pos % self.block_size,
                    );
                    let from = (head * new + i) * d;
                    dst.write(at, &src[from..from + d]);
                }
            }
        }
        Ok(())
    }

    /// Calls `f` with the keys and values of positions `0..len` of the sequence whose blocks are
    /// `table`, per key/value head, read where they are stored.
    pub(crate) fn with_head_runs<R>(
        &self,
        layer: usize,
        table: &[u32],
        len: usize,
        f: impl FnOnce(&[HeadRuns<'_>]) -> R,
    ) -> Result<R> {
        let store = self.layer(layer)?;
        self.check_blocks(table)?;
        if len.div_ceil(self.block_size) > table.len() {
            return Err(ModelError::BadConfig(format!(
                "positions up to {len} need more blocks than the {} given",
                table.len()
            )));
        }
        let (keys, values) = (store.keys.read(), store.values.read());
        let row = self.row_units(store.shape);
        let heads: Vec<HeadRuns> = (0..store.shape.kv_heads)
            .map(|head| HeadRuns {
                runs: (0..len.div_ceil(self.block_size))
                    .map(|i| {
                        let n = (len - i * self.block_size).min(self.block_size);
                        let at = self.offset(store.shape, table[i], head, 0);
                        (keys.rows(at, n * row), values.rows(at, n * row))
                    })
                    .collect(),
            })
            .collect();
        Ok(f(&heads))
    }

    /// Copies positions `0..len` of the sequence whose blocks are `table` into `to` (a pool of
    /// the same type and shapes) at the blocks `to_table`, bit for bit.
    pub fn copy_sequence(
        &self,
        table: &[u32],
        len: usize,
        to: &PagedKv,
        to_table: &[u32],
    ) -> Result<()> {
        self.host_rows("copying a sequence")?;
        to.host_rows("copying a sequence")?;
        if to.kind != self.kind || to.shapes() != self.shapes() {
            return Err(ModelError::BadConfig(format!(
                "cannot copy {} keys into a pool of {}",
                self.kind, to.kind
            )));
        }
        if len.div_ceil(self.block_size) > table.len()
            || len.div_ceil(to.block_size) > to_table.len()
        {
            return Err(ModelError::BadConfig(format!(
                "positions up to {len} need more blocks than the tables give"
            )));
        }
        self.check_blocks(table)?;
        to.check_blocks(to_table)?;
        for (store, target) in
            self.layers.iter().zip(&to.layers).filter_map(|(s, t)| s.as_ref().zip(t.as_ref()))
        {
            let row = self.row_units(store.shape);
            for (source, dest) in [(&store.keys, &target.keys), (&store.values, &target.values)] {
                let (source, mut dest) = (source.read(), dest.write());
                for head in 0..store.shape.kv_heads {
                    for pos in 0..len {
                        let from = self.offset(
                            store.shape,
                            table[pos / self.block_size],
                            head,
                            pos % self.block_size,
                        );
                        let at = to.offset(
                            store.shape,
                            to_table[pos / to.block_size],
                            head,
                            pos % to.block_size,
                        );
                        dest.copy_from(at, &source, from, row);
                    }
                }
            }
        }
        Ok(())
    }

    /// Copies the first `positions` positions of block `from` into block `to` in every layer
    /// (a sequence taking over a partly filled shared block before writing past it).
    pub fn copy_positions(&self, from: u32, to: u32, positions: usize) -> Result<()> {
        self.check_blocks(&[from, to])?;
        match self.mirror.get() {
            Some(mirror) => mirror.copy_positions(from, to, positions)?,
            None => self.host_written.lock().push(to),
        }
        for store in self.host_stores() {
            for storage in [&store.keys, &store.values] {
                let mut data = storage.write();
                for head in 0..store.shape.kv_heads {
                    let src = self.offset(store.shape, from, head, 0);
                    let dst = self.offset(store.shape, to, head, 0);
                    data.copy_within(src, positions * self.row_units(store.shape), dst);
                }
            }
        }
        Ok(())
    }

    /// The contents of `block` in every layer as stored, keys then values per layer, each
    /// head's rows in position order, as little-endian bytes (for the disk tier); from the
    /// mirror where the rows live there.
    pub fn read_block(&self, block: u32) -> Result<Vec<u8>> {
        self.check_blocks(&[block])?;
        let mirrored = match self.mirror.get() {
            Some(mirror) => Some((mirror, mirror.read_block(block)?)),
            None => None,
        };
        let mut out = Vec::with_capacity(self.bytes_per_block());
        let mut from_mirror = 0;
        for (layer, store) in self.stores() {
            match &mirrored {
                Some((mirror, rows)) if mirror.holds(layer) => {
                    let bytes = self.layer_block_bytes(store);
                    out.extend_from_slice(&rows[from_mirror..from_mirror + bytes]);
                    from_mirror += bytes;
                }
                _ => self.append_host_rows(store, block, &mut out),
            }
        }
        Ok(out)
    }

    /// Appends a layer's keys and values of `block` as the host holds them, laid out as
    /// [`PagedKv::read_block`] gives them.
    fn append_host_rows(&self, store: &LayerStore, block: u32, out: &mut Vec<u8>) {
        let units = store.shape.kv_heads * self.block_size * self.row_units(store.shape);
        let at = self.offset(store.shape, block, 0, 0);
        for storage in [&store.keys, &store.values] {
            storage.read().append_bytes(at, units, out);
        }
    }

    /// Bytes of a layer's keys and values in one block.
    fn layer_block_bytes(&self, store: &LayerStore) -> usize {
        2 * store.shape.bytes(self.kind) * self.block_size
    }

    /// Bytes [`read_block`](Self::read_block) returns for one block.
    pub fn bytes_per_block(&self) -> usize {
        Self::block_bytes(&self.shapes(), self.kind, self.block_size)
    }

    /// Overwrites `block` in every layer with what [`read_block`](Self::read_block) returned.
    pub fn write_block(&self, block: u32, data: &[u8]) -> Result<()> {
        self.check_blocks(&[block])?;
        if data.len() != self.bytes_per_block() {
            return Err(ModelError::BadConfig(format!(
                "a block holds {} bytes, got {}",
                self.bytes_per_block(),
                data.len()
            )));
        }
        let mirror = self.mirror.get();
        if mirror.is_none() {
            self.host_written.lock().push(block);
        }
        let (mut from, mut mirrored) = (0, Vec::new());
        for (layer, store) in self.stores() {
            let bytes = self.layer_block_bytes(store);
            let rows = &data[from..from + bytes];
            from += bytes;
            if mirror.is_some_and(|m| m.holds(layer)) {
                mirrored.extend_from_slice(rows);
                continue;
            }
            let (keys, values) = rows.split_at(bytes / 2);
            let at = self.offset(store.shape, block, 0, 0);
            store.keys.write().set_bytes(at, keys);
            store.values.write().set_bytes(at, values);
        }
        match mirror {
            Some(mirror) => mirror.write_block(block, &mirrored),
            None => Ok(()),
        }
    }
}

/// Returns the whole pages inside `region` to the OS, which backs them with zeros when next
/// touched: the pool stays allocated, its resident memory shrinks. Elsewhere than Linux the
/// memory stays as it is.
fn release_pages<T>(region: &mut [T]) {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: sysconf has no preconditions.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(1) as usize;
        let start = region.as_mut_ptr() as usize;
        let end = start + std::mem::size_of_val(region);
        let (first, last) = (start.next_multiple_of(page), end / page * page);
        // SAFETY: the pages lie inside `region`, borrowed mutably, so nobody reads them now;
        // MADV_DONTNEED on private anonymous memory only replaces their contents with zeros,
        // which are valid values of every element type here.
        if first < last
            && unsafe {
                libc::madvise(first as *mut libc::c_void, last - first, libc::MADV_DONTNEED)
            } != 0
        {
            let error = std::io::Error::last_os_error();
            tracing::debug!(%error, "KV pages stay resident");
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = region;
}

#[cfg(test)]
mod tests {
    use candle_core::Device;

    use super::*;

    const SHAPES: [Option<KvShape>; 2] =
        [Some(KvShape { kv_heads: 2, head_dim: 64, window: None }), None];

    /// Keys and values `(1, 2, new, 64)` that differ per position and head.
    fn rows(new: usize, seed: f32) -> Tensor {
        let x: Vec<f32> = (0..2 * new * 64).map(|i| (i as f32 * 0.37 + seed).sin() * 3.0).collect();
        Tensor::from_vec(x, (1, 2, new, 64), &Device::Cpu).unwrap()
    }

    /// Head `head`'s values of positions `0..len`, as attention reads them.
    fn read(kv: &PagedKv, table: &[u32], len: usize, head: usize) -> (Vec<f32>, Vec<f32>) {
        kv.with_head_runs(0, table, len, |heads| {
            let mut scratch = Vec::new();
            let mut keys = Vec::new();
            let mut values = Vec::new();
            for &(k, v) in &heads[head].runs {
                keys.extend_from_slice(k.to_f32_on(crate::isa::Isa::best(), &mut scratch));
                values.extend_from_slice(v.to_f32_on(crate::isa::Isa::best(), &mut scratch));
            }
            (keys, values)
        })
        .unwrap()
    }

    #[test]
    fn a_panic_while_the_storage_is_written_leaves_it_usable() {
        let kv = PagedKv::new(&SHAPES, KvType::ALL[0], 8, 4);
        let fault = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let _writing = kv.layers[0].as_ref().unwrap().keys.write();
            panic!("a model fault mid-write");
        }));
        assert!(fault.is_err());
        let (k, v) = (rows(4, 0.5), rows(4, 1.5));
        kv.write(0, &[1], 0, &k, &v).unwrap();
        let (keys, _) = read(&kv, &[1], 4, 0);
        assert_eq!(keys.len(), 4 * 64);
    }

    #[test]
    fn written_rows_read_back_within_the_types_precision_and_move_bit_for_bit() {
        for kind in KvType::ALL {
            let kv = PagedKv::new(&SHAPES, kind, 8, 4);
            assert_eq!(PagedKv::block_bytes(&SHAPES, kind, 4), 2 * 2 * 4 * kind.row_bytes(64));
            let (k, v) = (rows(6, 0.5), rows(6, 1.5));
            let table = [5, 2];
            kv.write(0, &table, 0, &k, &v).unwrap();
            let want = |t: &Tensor, head: usize| {
                t.get(0)
                    .unwrap()
                    .get(head)
                    .unwrap()
                    .flatten_all()
                    .unwrap()
                    .to_vec1::<f32>()
                    .unwrap()
            };
            for head in 0..2 {
                let (keys, values) = read(&kv, &table, 6, head);
                for (got, want) in [(keys, want(&k, head)), (values, want(&v, head))] {
                    let worst =
                        got.iter().zip(&want).map(|(g, w)| (g - w).abs()).fold(0f32, f32::max);
                    let bound = match kind {
                        KvType::F32 => 0.0,
                        KvType::F16 => 3.0 * 2f32.powi(-11),
                        KvType::Bf16 => 3.0 * 2f32.powi(-8),
                        KvType::Q8_0 => 3.0 / 127.0 * 0.5 + 3.0 * 2f32.powi(-11),
                    };
                    assert!(worst <= bound, "{kind}: off by {worst}");
                }
            }
            // Through the disk tier's bytes into other blocks, and into another pool: the same bits.
            let other = PagedKv::new(&SHAPES, kind, 8, 8);
            kv.copy_sequence(&table, 6, &other, &[3]).unwrap();
            for (block, into) in [(5, 0), (2, 7)] {
                let bytes = kv.read_block(block).unwrap();
                assert_eq!(bytes.len(), kv.bytes_per_block());
                kv.write_block(into, &bytes).unwrap();
            }
            for head in 0..2 {
                let original = read(&kv, &table, 6, head);
                assert_eq!(read(&kv, &[0, 7], 6, head), original, "{kind}: blocks through bytes");
                assert_eq!(read(&other, &[3], 6, head), original, "{kind}: copied sequence");
            }
            assert!(kv.write_block(0, &[0; 3]).is_err());
        }
    }

    #[test]
    fn released_window_rows_are_only_those_of_the_blocks_in_windowed_layers() {
        let shape = |window| Some(KvShape { kv_heads: 2, head_dim: 64, window });
        // 32 positions of 2 heads of 64 f32: 16 KiB per block, so whole pages inside each.
        let shapes = [shape(Some(40)), None, shape(None)];
        let kv = PagedKv::new(&shapes, KvType::F32, 4, 32);
        assert_eq!(kv.widest_window(), Some(40));
        assert_eq!(PagedKv::new(&SHAPES, KvType::F32, 1, 4).widest_window(), None);
        let table = [3, 1, 0];
        let (k, v) = (rows(96, 0.5), rows(96, 1.5));
        for layer in [0, 2] {
            kv.write(layer, &table, 0, &k, &v).unwrap();
        }
        let bytes = |block| kv.read_block(block).unwrap();
        let before: Vec<Vec<u8>> = (0..4).map(bytes).collect();
        kv.release_window_rows(&[1]).unwrap();
        for block in [0, 2, 3] {
            assert_eq!(bytes(block), before[block as usize], "block {block} kept");
        }
        // A block's bytes: the windowed layer's keys, its values, then the global layer's.
        let (after, half) = (bytes(1), before[1].len() / 4);
        assert_eq!(after[2 * half..], before[1][2 * half..], "the global layer kept its rows");
        let zeroed = after[..2 * half].iter().zip(&before[1]).filter(|(a, b)| a != b).count();
        assert!(zeroed > 0, "no page of the windowed layer's rows was released");
        assert!(after[..2 * half].iter().zip(&before[1]).all(|(&a, &b)| a == b || a == 0));
        // A run of blocks, given unordered and repeated, goes in one piece.
        kv.release_window_rows(&[3, 2, 3]).unwrap();
        assert_eq!(bytes(0), before[0]);
        let mut kept = 0;
        for block in [2, 3] {
            let (after, before) = (bytes(block), &before[block as usize]);
            assert_eq!(after[2 * half..], before[2 * half..]);
            assert!(after[..2 * half].iter().zip(before).all(|(&a, &b)| a == b || a == 0));
            kept += after[..2 * half].iter().filter(|&&b| b != 0).count();
        }
        // Of the 2 × 32 KiB run (keys, values), at most a page at either end of each stays.
        assert!(kept <= 4 * 4096, "{kept} bytes kept");
        assert!(kv.release_window_rows(&[4]).is_err(), "outside the pool");
    }

    /// A mirror of the layers from `first_layer` on, keeping the blocks written to it and the
    /// copies asked of it.
    #[derive(Default)]
    struct Written {
        first_layer: usize,
        blocks: Mutex<Vec<(u32, Vec<u8>)>>,
        copies: Mutex<Vec<(u32, u32, usize)>>,
    }

    impl KvMirror for Written {
        fn holds(&self, layer: usize) -> bool {
            layer >= self.first_layer
        }

        fn copy_positions(&self, from: u32, to: u32, positions: usize) -> Result<()> {
            self.copies.lock().push((from, to, positions));
            Ok(())
        }

        fn read_block(&self, block: u32) -> Result<Vec<u8>> {
            let written = self.blocks.lock();
            let found = written.iter().rev().find(|(b, _)| *b == block);
            found.map(|(_, bytes)| bytes.clone()).ok_or(ModelError::BadConfig("unwritten".into()))
        }

        fn write_block(&self, block: u32, data: &[u8]) -> Result<()> {
            self.blocks.lock().push((block, data.to_vec()));
            Ok(())
        }
    }

    /// Blocks the host wrote before a mirror took the rows over (a disk import ahead of the
    /// first model pass, a copy of one) go to the mirror with them; later ones go straight
    /// there, and reading comes from there.
    #[test]
    fn a_mirror_takes_over_the_blocks_the_host_wrote_before_it() {
        let kv = PagedKv::new(
            &[Some(KvShape { kv_heads: 2, head_dim: 64, window: None })],
            KvType::F16,
            8,
            4,
        );
        let bytes: Vec<u8> = (0..kv.bytes_per_block()).map(|i| (i * 7 % 251) as u8).collect();
        kv.write_block(3, &bytes).unwrap();
        kv.copy_positions(3, 5, 4).unwrap();
        let mirror = Arc::new(Written::default());
        kv.mirror_to(mirror.clone()).unwrap();
        let handed: Vec<u32> = mirror.blocks.lock().iter().map(|(b, _)| *b).collect();
        assert_eq!(handed, [3, 5]);
        for block in [3, 5] {
            assert_eq!(kv.read_block(block).unwrap(), bytes, "block {block} from the mirror");
        }
        kv.write_block(6, &bytes).unwrap();
        assert_eq!(mirror.blocks.lock().len(), 3, "written to the mirror once it holds the rows");
    }

    /// Where the first blocks run on the CPU, a mirror holds only the later layers' rows: a
    /// block's bytes split between host and mirror, and join again, in the host's layout;
    /// copies of positions happen in both; attention reads the host's layers where they are.
    #[test]
    fn a_mirror_of_the_later_layers_leaves_the_first_ones_on_the_host() {
        let shape = Some(KvShape { kv_heads: 2, head_dim: 64, window: None });
        let kv = PagedKv::new(&[shape, None, shape, shape], KvType::F16, 8, 4);
        let mirror = Arc::new(Written { first_layer: 2, ..Written::default() });
        kv.mirror_to(mirror.clone()).unwrap();
        let bytes: Vec<u8> = (0..kv.bytes_per_block()).map(|i| (i * 7 % 251) as u8).collect();
        kv.write_block(3, &bytes).unwrap();
        let third = bytes.len() / 3;
        let handed = mirror.blocks.lock().clone();
        assert_eq!(handed, [(3, bytes[third..].to_vec())], "the mirror gets layers 2 and 3");
        assert_eq!(kv.read_block(3).unwrap(), bytes, "host rows then the mirror's");
        // Layer 0's first two positions of head 1, as attention reads them from the host.
        let first_two = |block: u32| {
            let (keys, values) = read(&kv, &[block], 2, 1);
            [keys, values].map(|rows| rows.iter().map(|x| x.to_bits()).collect::<Vec<_>>())
        };
        let written = first_two(3);
        assert!(written.iter().flatten().any(|&x| x != 0));
        kv.copy_positions(3, 5, 2).unwrap();
        assert_eq!(*mirror.copies.lock(), [(3, 5, 2)]);
        assert_eq!(first_two(5), written, "the host copied its layer's positions");
        let moved = kv.read_block(5);
        assert!(moved.is_err(), "block 5 was never written to the mirror: {moved:?}");
        assert_eq!(kv.bytes_per_block(), 3 * (2 * 2 * 64 * 2 * 4));
    }
}

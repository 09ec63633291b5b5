//! The device's keys and values for each `PagedKv` a caller's caches point into: the same
//! blocks, numbered alike, so block tables, shared prefixes and preemption work unchanged
//! (the host pool itself stays unwritten, and the OS never commits its pages). The device
//! pools are the host pool's mirror, so the prefix cache's copy of a partly filled shared
//! block happens here, and the disk tier's blocks are read from and written to here (in the
//! host pool's layout, so a file saved by a GPU server loads on a CPU one and back). A device
//! pool lives while its host pool does. Where a model's first blocks run on the CPU, their
//! layers' rows stay in the host pool and the device mirrors the later layers only.

use std::sync::{Arc, Mutex, Weak};

use spindle_models::{BatchEntry, KvMirror, KvShape, KvType, ModelError, PagedKv};

use crate::attention::{KvFormat, KvPool, PagedRows, QueryPlace};
use crate::device::Gpu;
use crate::error::{GpuError, Result};

/// One device pool per softmax-attention layer on the device, in layer order (linear-attention
/// layers, which keep no keys, have none).
pub(crate) struct LayerPools {
    pub(crate) layers: Vec<KvPool>,
    /// Each pool's heads, as the host pool's layers with keys and values.
    shapes: Vec<KvShape>,
}

#[derive(Default)]
pub(crate) struct KvPools {
    /// The first layer on the device: the host pool keeps the rows of those before.
    first_layer: usize,
    by_host: Mutex<Vec<(Weak<PagedKv>, Arc<LayerPools>)>>,
}

impl KvPools {
    /// Pools of the layers from `first_layer` on.
    pub(crate) fn from_layer(first_layer: usize) -> Self {
        KvPools { first_layer, by_host: Mutex::default() }
    }

    /// The entries of `batch` grouped by the storage their caches use, each group with its
    /// device pools (made on first sight, as large as the host's) and its rows' places.
    pub(crate) fn groups(
        &self,
        gpu: &Arc<Gpu>,
        shapes: &[Option<KvShape>],
        batch: &[BatchEntry<'_>],
    ) -> Result<Vec<(Arc<LayerPools>, PagedRows)>> {
        let mut by_host = self.by_host.lock().unwrap_or_else(|e| e.into_inner());
        // Pools whose host storage is gone free their device memory here.
        by_host.retain(|(host, _)| host.strong_count() > 0);
        let mut groups: Vec<(Arc<LayerPools>, Vec<usize>)> = Vec::new();
        for (i, entry) in batch.iter().enumerate() {
            let host = entry.cache.storage();
            let found = by_host.iter().find(|(h, _)| std::ptr::eq(h.as_ptr(), Arc::as_ptr(host)));
            let pools = match found {
                Some((_, pools)) => pools.clone(),
                None => {
                    let pools = Arc::new(device_pools(gpu, shapes, host, self.first_layer)?);
                    let first_layer = self.first_layer;
                    let mirror = DeviceRows { gpu: gpu.clone(), pools: pools.clone(), first_layer };
                    host.mirror_to(Arc::new(mirror))
                        .map_err(|e| GpuError::BadInput(e.to_string()))?;
                    by_host.push((Arc::downgrade(host), pools.clone()));
                    pools
                }
            };
            match groups.iter_mut().find(|(p, _)| Arc::ptr_eq(p, &pools)) {
                Some((_, members)) => members.push(i),
                None => groups.push((pools, vec![i])),
            }
        }
        drop(by_host);
        groups
            .into_iter()
            .map(|(pools, members)| Ok((pools, paged_rows(gpu, batch, &members)?)))
            .collect()
    }
}

/// A host pool's rows on the device, of the layers from `first_layer` on.
struct DeviceRows {
    gpu: Arc<Gpu>,
    pools: Arc<LayerPools>,
    first_layer: usize,
}

impl KvMirror for DeviceRows {
    fn holds(&self, layer: usize) -> bool {
        layer >= self.first_layer
    }

    fn copy_positions(&self, from: u32, to: u32, positions: usize) -> spindle_models::Result<()> {
        let block = self.pools.layers.iter().map(KvPool::block_len).max().unwrap_or(0);
        let staging = self.gpu.output(block);
        let copied = self.gpu.run(|step| {
            for pool in &self.pools.layers {
                pool.copy_positions(step, (from, to, positions), &staging)?;
            }
            Ok(())
        });
        copied.map_err(|e| ModelError::Gpu(e.to_string()))
    }

    fn read_block(&self, block: u32) -> spindle_models::Result<Vec<u8>> {
        let read = || -> Result<Vec<u8>> {
            let pools = &self.pools.layers;
            let reads = self.gpu.run(|step| {
                pools.iter().map(|pool| pool.read_block(step, block)).collect::<Result<Vec<_>>>()
            })?;
            let mut out = Vec::new();
            for ((pool, shape), rows) in pools.iter().zip(&self.pools.shapes).zip(reads) {
                let layout = RowLayout::of(pool, shape);
                for rows in rows {
                    layout.to_host(bytemuck::cast_slice(&rows.values()?), &mut out);
                }
            }
            Ok(out)
        };
        read().map_err(|e| ModelError::Gpu(e.to_string()))
    }

    /// `data` is as long as the host pool's block (`PagedKv::write_block` checked it).
    fn write_block(&self, block: u32, data: &[u8]) -> spindle_models::Result<()> {
        let mut rest = data;
        for (pool, shape) in self.pools.layers.iter().zip(&self.pools.shapes) {
            let layout = RowLayout::of(pool, shape);
            let (keys, tail) = rest.split_at(layout.bytes());
            let (values, tail) = tail.split_at(layout.bytes());
            rest = tail;
            let words = [layout.to_device(keys), layout.to_device(values)];
            pool.write_block(&self.gpu, block, [&words[0], &words[1]])
                .map_err(|e| ModelError::Gpu(e.to_string()))?;
        }
        Ok(())
    }
}

/// A block's keys (or values) of one layer: on the device slot after slot, every head's row in
/// each; on the host (`PagedKv`) head after head, every slot's row in each.
struct RowLayout {
    heads: usize,
    slots: usize,
    /// Bytes of one head's row at one slot.
    row: usize,
}

impl RowLayout {
    fn of(pool: &KvPool, shape: &KvShape) -> Self {
        let row = shape.head_dim * pool.value_bytes();
        RowLayout { heads: shape.kv_heads, slots: pool.block_size(), row }
    }

    fn bytes(&self) -> usize {
        self.heads * self.slots * self.row
    }

    /// Appends `device`'s rows to `out` in the host's order.
    fn to_host(&self, device: &[u8], out: &mut Vec<u8>) {
        for head in 0..self.heads {
            for slot in 0..self.slots {
                out.extend_from_slice(&device[(slot * self.heads + head) * self.row..][..self.row]);
            }
        }
    }

    /// `host`'s rows in the device's order, as the 32-bit words the pool holds.
    fn to_device(&self, host: &[u8]) -> Vec<f32> {
        let mut device = vec![0u8; self.bytes()];
        for head in 0..self.heads {
            for slot in 0..self.slots {
                let from = &host[(head * self.slots + slot) * self.row..][..self.row];
                device[(slot * self.heads + head) * self.row..][..self.row].copy_from_slice(from);
            }
        }
        device.chunks_exact(4).map(|w| f32::from_le_bytes([w[0], w[1], w[2], w[3]])).collect()
    }
}

fn device_pools(
    gpu: &Gpu,
    shapes: &[Option<KvShape>],
    host: &PagedKv,
    first_layer: usize,
) -> Result<LayerPools> {
    // A sliding-window layer keeps every block of the host's numbering too (the host only
    // gives the memory of blocks out of every window back, and the kernel never reads
    // positions out of a query's window), so every layer's pool is the host's size.
    if host.shapes() != shapes {
        return Err(GpuError::BadInput(format!(
            "a cache shaped {:?} for a model whose layers are {shapes:?}",
            host.shapes()
        )));
    }
    let format = match host.kv_type() {
        KvType::F32 => KvFormat::F32,
        KvType::F16 => KvFormat::F16,
        other => {
            return Err(GpuError::BadInput(format!(
                "keys and values in {other} on the GPU: it stores them as f16 or f32"
            )))
        }
    };
    let blocks = (host.blocks(), host.block_size());
    let on_device: Vec<KvShape> = shapes.iter().skip(first_layer).flatten().copied().collect();
    let layers = on_device
        .iter()
        .map(|s| KvPool::new(gpu, blocks, s.kv_heads * s.head_dim, format))
        .collect::<Result<_>>()?;
    Ok(LayerPools { layers, shapes: on_device })
}

/// Places of every row of `batch` (its entries' tokens in order) in the block tables of its
/// cache, for the entries `members` (indices into `batch`) that share one storage.
fn paged_rows(gpu: &Gpu, batch: &[BatchEntry<'_>], members: &[usize]) -> Result<PagedRows> {
    let starts: Vec<usize> = batch
        .iter()
        .scan(0, |row, e| {
            let start = *row;
            *row += e.tokens.len();
            Some(start)
        })
        .collect();
    let (mut places, mut tables) = (Vec::new(), Vec::new());
    for &m in members {
        let entry = &batch[m];
        let table_start = tables.len();
        tables.extend_from_slice(entry.cache.blocks());
        let past = entry.cache.len();
        places.extend((0..entry.tokens.len()).map(|t| QueryPlace {
            row: starts[m] + t,
            position: past + t,
            table_start,
        }));
    }
    PagedRows::upload(gpu, places, tables)
}

//! `--kv-cache-memory` with `--device gpu`: the pools live in device memory, one buffer per
//! attention layer for keys and one for values, so `auto` is sized from what the device reports
//! free once the model's weights are there (not from system RAM), and any size is held to what
//! the device binds in one buffer: a larger pool would fail every request, so it is cut (`auto`)
//! or refused at start (a size given). A hybrid's blocks that `--n-gpu-layers` leaves on the
//! CPU keep their keys and values in system RAM: `auto` sizes the device's share and gives
//! those layers as much each.

use spindle_gpu::{Gpu, ModelBytes, PlacementRequest};
use spindle_hub::ModelFiles;
use spindle_models::{KvShape, Mixer, PagedKv};
use spindle_runner::{CacheConfig, ModelBundle};

use crate::byte_size::human_bytes;

/// Share (in tenths) of the device memory left by the weights that `auto` gives the KV pool.
const AUTO_TENTHS: u64 = 7;
/// `auto`'s pool where the weights do not all fit (routed experts spill to system RAM): this
/// share of the device's memory, the rest for the weights placed there.
const SPILLING_SHARE: u64 = 8;
/// `auto`'s pool where the device reports no memory (DX12).
const UNKNOWN_DEVICE: u64 = 1 << 30;
const AUTO_MIN: u64 = 256 << 20;

/// What sizing a pool on the device takes of the model and the device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeviceRoom {
    /// What the device reports free, `None` where it reports nothing.
    pub available: Option<u64>,
    /// The model's weights (and DeltaNet states) on the device.
    pub weights: u64,
    /// Layers whose keys and values the device's pools hold.
    pub attention_layers: u64,
    /// Layers whose keys and values stay in system RAM (of the blocks on the CPU).
    pub host_attention_layers: u64,
    /// The most one buffer binding holds.
    pub max_binding: u64,
}

impl DeviceRoom {
    /// The model of `files` on `gpu`, with its MTP head and its blocks on the device as
    /// `request` asks.
    pub fn of(gpu: &Gpu, files: &ModelFiles, request: &PlacementRequest) -> anyhow::Result<Self> {
        let (weights, attention_layers, host_attention_layers) = match files {
            ModelFiles::Gguf(path) if spindle_models::is_hybrid_gguf(path)? => {
                let (cfg, weights) = spindle_models::open_hybrid(path)?;
                on_device(&ModelBytes::of_hybrid(&cfg, &weights), request)
            }
            ModelFiles::Gguf(path) => {
                let (cfg, weights) = spindle_models::open_dense(path)?;
                on_device(&ModelBytes::of_dense(cfg.num_hidden_layers, &weights), request)
            }
            ModelFiles::Safetensors { dir } => {
                let (cfg, _) = spindle_models::open_dense(dir)?;
                // Float weights go up as f32: at most twice their stored (16-bit) bytes.
                (2 * safetensors_bytes(dir)?, cfg.num_hidden_layers, 0)
            }
        };
        Ok(DeviceRoom {
            available: gpu.memory().map(|m| m.available),
            weights,
            attention_layers: attention_layers as u64,
            host_attention_layers: host_attention_layers as u64,
            max_binding: gpu.max_binding_bytes(),
        })
    }

    /// The largest pool whose every layer's keys fit one binding.
    fn most(&self) -> u64 {
        2 * self.attention_layers * self.max_binding
    }

    /// `auto`'s pool: 70% of the device memory the weights leave (an eighth of the usable
    /// memory where they do not all fit and experts spill), at most [`DeviceRoom::most`], and
    /// as much a layer again for the layers in system RAM; unbounded here where the device
    /// holds no layer's keys (system RAM sizes the pool then).
    pub fn auto_bytes(&self) -> usize {
        if self.attention_layers == 0 {
            return usize::MAX;
        }
        let on_device = self.device_auto_bytes();
        let layers = self.attention_layers + self.host_attention_layers;
        (on_device as u128 * layers as u128 / self.attention_layers as u128) as usize
    }

    /// The device's share of `auto`'s pool.
    fn device_auto_bytes(&self) -> u64 {
        let auto = match self.available {
            None => UNKNOWN_DEVICE,
            Some(free) => {
                // A sixteenth is the placement's, kept for activations.
                let usable = free - free / 16;
                match usable.checked_sub(self.weights) {
                    Some(left) if left / 10 * AUTO_TENTHS >= AUTO_MIN => left / 10 * AUTO_TENTHS,
                    _ => usable / SPILLING_SHARE,
                }
            }
        };
        auto.max(AUTO_MIN).min(self.most())
    }
}

/// A model of `bytes` placed as `request` asks: its weights and one sequence's states on the
/// device, its attention layers there, and those on the CPU.
fn on_device(bytes: &ModelBytes, request: &PlacementRequest) -> (u64, usize, usize) {
    let blocks = bytes.experts.len();
    let on_cpu = request.n_gpu_layers.map_or(0, |n| blocks.saturating_sub(n));
    let head = if request.draft_head { bytes.draft_head } else { 0 };
    let experts: u64 = bytes.experts[on_cpu..].iter().sum();
    let states = bytes.device_share(bytes.states_per_sequence, Mixer::Linear, on_cpu);
    let weights = bytes.dense - bytes.cpu_weights(on_cpu) + experts + head + states;
    let full = |mixers: &[Mixer]| mixers.iter().filter(|&&m| m == Mixer::Full).count();
    (weights, full(&bytes.block_mixers[on_cpu..]), full(&bytes.block_mixers[..on_cpu]))
}

/// Refuses a pool (`cache`, sized for `bundle`'s model once every share is taken from it: a
/// draft model's, the rollback states') whose keys of one attention layer would not fit one
/// buffer binding of `gpu`; `given` is `--kv-cache-memory` as the user gave it.
pub fn check_binds(
    gpu: &Gpu,
    bundle: &ModelBundle,
    cache: &CacheConfig,
    given: usize,
) -> anyhow::Result<()> {
    let blocks = cache.kv_blocks(bundle);
    let layer = |shape: KvShape| {
        blocks * PagedKv::block_bytes(&[Some(shape)], cache.kv_type, cache.block_size) / 2
    };
    let largest = bundle.model.kv_shapes().into_iter().flatten().map(layer).max().unwrap_or(0);
    let binding = gpu.max_binding_bytes() as usize;
    if largest > binding {
        anyhow::bail!(
            "--kv-cache-memory {}: on this GPU an attention layer's keys would take {} in one \
             buffer, more than the {} it binds at once; give at most {}",
            human_bytes(given),
            human_bytes(largest),
            human_bytes(binding),
            human_bytes((given as u128 * binding as u128 / largest as u128) as usize)
        );
    }
    Ok(())
}

/// The bytes of a checkpoint folder's safetensors files.
fn safetensors_bytes(dir: &std::path::Path) -> anyhow::Result<u64> {
    let mut bytes = 0;
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if path.extension().is_some_and(|e| e == "safetensors") {
            bytes += std::fs::metadata(&path)?.len();
        }
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;

    fn room(available: Option<u64>, weights: u64) -> DeviceRoom {
        let max_binding = 2 * GIB;
        DeviceRoom {
            available,
            weights,
            attention_layers: 10,
            host_attention_layers: 0,
            max_binding,
        }
    }

    #[test]
    fn auto_takes_the_device_memory_the_weights_leave() {
        // 24 GiB free, 22.5 usable, 12.5 of weights: 70% of the 10 left.
        let bytes = room(Some(24 * GIB), 12 * GIB + GIB / 2).auto_bytes();
        assert_eq!(bytes as u64, 10 * GIB / 10 * 7);
        // Weights that do not fit (experts spill): an eighth of the usable memory.
        assert_eq!(room(Some(16 * GIB), 21 * GIB).auto_bytes() as u64, (16 * GIB - GIB) / 8);
        // Nothing reported: 1 GiB.
        assert_eq!(room(None, GIB).auto_bytes() as u64, GIB);
        // No layer gets more than one binding: 10 layers, keys and values, 128 MiB each.
        let small = DeviceRoom { max_binding: 128 << 20, ..room(Some(80 * GIB), GIB) };
        assert_eq!(small.auto_bytes() as u64, 20 * (128 << 20));
        // 10 layers on the device, 5 in system RAM: the pool is half again the device's share.
        let split =
            DeviceRoom { host_attention_layers: 5, ..room(Some(24 * GIB), 12 * GIB + GIB / 2) };
        assert_eq!(split.auto_bytes() as u64, 10 * GIB / 10 * 7 * 15 / 10);
        // No layer's keys on the device: nothing here bounds the pool.
        let none = DeviceRoom { attention_layers: 0, host_attention_layers: 15, ..split };
        assert_eq!(none.auto_bytes(), usize::MAX);
    }
}

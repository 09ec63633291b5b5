//! `--kv-cache-memory` with `--device gpu`: the pools live in device memory, one buffer per
//! attention layer for keys and one for values, so `auto` is sized from what the device reports
//! free once the model's weights are there (not from system RAM), and any size is held to what
//! the device binds in one buffer: a larger pool would fail every request, so it is cut (`auto`)
//! or refused at start (a size given).

use spindle_gpu::{dense_device_bytes, Gpu, ModelBytes};
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
    /// The model's weights (and DeltaNet states) on the device, all of them.
    pub weights: u64,
    /// Layers whose keys and values the pool holds.
    pub attention_layers: u64,
    /// The most one buffer binding holds.
    pub max_binding: u64,
}

impl DeviceRoom {
    /// The model of `files` on `gpu`, with its MTP head where `draft_head`.
    pub fn of(gpu: &Gpu, files: &ModelFiles, draft_head: bool) -> anyhow::Result<Self> {
        let (weights, attention_layers) = match files {
            ModelFiles::Gguf(path) if spindle_models::is_hybrid_gguf(path)? => {
                let (cfg, weights) = spindle_models::open_hybrid(path)?;
                let bytes = ModelBytes::of_hybrid(&cfg, &weights);
                let head = if draft_head { bytes.draft_head } else { 0 };
                let all = bytes.dense + bytes.experts.iter().sum::<u64>() + head;
                let full = cfg.layer_types().into_iter().filter(|&m| m == Mixer::Full).count();
                (all + bytes.states_per_sequence, full)
            }
            ModelFiles::Gguf(path) => {
                let (cfg, weights) = spindle_models::open_dense(path)?;
                (dense_device_bytes(&weights), cfg.num_hidden_layers)
            }
            ModelFiles::Safetensors { dir } => {
                let (cfg, _) = spindle_models::open_dense(dir)?;
                // Float weights go up as f32: at most twice their stored (16-bit) bytes.
                (2 * safetensors_bytes(dir)?, cfg.num_hidden_layers)
            }
        };
        Ok(DeviceRoom {
            available: gpu.memory().map(|m| m.available),
            weights,
            attention_layers: attention_layers.max(1) as u64,
            max_binding: gpu.max_binding_bytes(),
        })
    }

    /// The largest pool whose every layer's keys fit one binding.
    fn most(&self) -> u64 {
        2 * self.attention_layers * self.max_binding
    }

    /// `auto`'s pool: 70% of the device memory the weights leave (an eighth of the usable
    /// memory where they do not all fit and experts spill), at most [`DeviceRoom::most`].
    pub fn auto_bytes(&self) -> usize {
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
        auto.max(AUTO_MIN).min(self.most()) as usize
    }
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
        DeviceRoom { available, weights, attention_layers: 10, max_binding: 2 * GIB }
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
    }
}

//! `--device cpu | gpu | gpu:N`: where model steps are to run. The CPU is the default; a GPU is
//! opened at startup so `serve` says which adapter it found, or why there is none, before
//! anything else loads. Dense Llama-family models (Llama, SmolLM2, Qwen2.5), Gemma 3 and the
//! hybrid Qwen3.5 / Qwen3.5-MoE / Qwen3-Next GGUFs run on it (their routed experts placed by
//! `placement_flags`).

use std::str::FromStr;
use std::sync::Arc;

use anyhow::Context;
use spindle_gpu::{Gpu, GpuHybrid, GpuLlama, ModelBytes, Placement, PlacementRequest};
use spindle_hub::ModelFiles;
use spindle_models::{CausalLm, KvType};

use crate::placement_flags::refuse_for_checkpoint;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeviceChoice {
    Cpu,
    /// The adapter of that index in `spindle_gpu::Gpu::adapters`; `None`: the first real GPU.
    Gpu(Option<usize>),
}

impl FromStr for DeviceChoice {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        let bad = || format!("unknown device `{text}`; expected cpu, gpu or gpu:N");
        match text.split_once(':') {
            None if text == "cpu" => Ok(Self::Cpu),
            None if text == "gpu" => Ok(Self::Gpu(None)),
            Some(("gpu", index)) => index.parse().map(|i| Self::Gpu(Some(i))).map_err(|_| bad()),
            _ => Err(bad()),
        }
    }
}

/// Opens the GPU `choice` names (`None` for the CPU), or fails with what was tried and found.
pub fn open(choice: DeviceChoice) -> anyhow::Result<Option<Arc<Gpu>>> {
    let DeviceChoice::Gpu(index) = choice else { return Ok(None) };
    quiet_mesa_device_select();
    Ok(Some(Arc::new(Gpu::open(index).context("--device")?)))
}

/// The startup line about the GPU the model steps run on (once, whichever models are served),
/// keys and values stored there as `kv_type`.
pub fn announce_line(gpu: &Gpu, kv_type: KvType) -> String {
    format!(
        "GPU {}: model steps run here, keys and values in {kv_type} on the device; a hybrid \
         model's DeltaNet states stay there between steps (and go back there after rejected \
         drafts), read back only for prefix-cache snapshots",
        gpu.adapter()
    )
}

/// Where the model of a GGUF `files` goes on `gpu`: the placement `request` asks for, planned
/// from the file's header against the device memory `gpu` reports free now (which
/// `--gpu-memory-limit` overrides); `None` for a checkpoint folder, which runs whole on the
/// device (the placement flags that would change that are refused).
pub fn plan_placement(
    gpu: &Gpu,
    files: &ModelFiles,
    request: &PlacementRequest,
) -> anyhow::Result<Option<Placement>> {
    let bytes = match files {
        ModelFiles::Gguf(path) if spindle_models::is_hybrid_gguf(path)? => {
            let (config, weights) = spindle_models::open_hybrid(path)?;
            ModelBytes::of_hybrid(&config, &weights)
        }
        ModelFiles::Gguf(path) => {
            let (config, weights) = spindle_models::open_dense(path)?;
            ModelBytes::of_dense(config.num_hidden_layers, &weights)
        }
        ModelFiles::Safetensors { dir } => {
            let (config, _) = spindle_models::open_dense(dir)?;
            refuse_for_checkpoint(request, config.num_hidden_layers)?;
            return Ok(None);
        }
    };
    let request = PlacementRequest { device_memory: gpu.memory(), ..request.clone() };
    Ok(Some(Placement::plan(&bytes, &request)?))
}

/// Loads the model of `files` onto `gpu`: a dense one (Llama family or Gemma 3) as `GpuLlama`,
/// a hybrid GGUF (by its header's architecture) as `GpuHybrid`, its blocks and routed experts
/// where `placement` says (all on the device without one); others are refused, naming why.
pub fn load_on_gpu(
    gpu: &Arc<Gpu>,
    files: &ModelFiles,
    placement: Option<&Placement>,
) -> spindle_models::Result<Box<dyn CausalLm>> {
    let path = match files {
        ModelFiles::Gguf(path) if spindle_models::is_hybrid_gguf(path)? => {
            let (config, mut weights) = spindle_models::open_hybrid(path)?;
            let on_device = Placement::on_device();
            let placement = placement.unwrap_or(&on_device);
            return Ok(Box::new(GpuHybrid::load_placed(
                gpu.clone(),
                config,
                &mut weights,
                placement,
            )?));
        }
        ModelFiles::Gguf(path) => path,
        ModelFiles::Safetensors { dir } => dir,
    };
    let (config, mut weights) = spindle_models::open_dense(path)?;
    let cpu_blocks = placement.map_or(0, |p| p.cpu_blocks);
    Ok(Box::new(GpuLlama::load_placed(gpu.clone(), config, &mut weights, cpu_blocks)?))
}

/// Mesa's device-select layer, loaded with any Mesa Vulkan driver, asks the display server
/// which GPU is the default and prints an `error:` line when there is none (a headless server,
/// where XDG_RUNTIME_DIR is unset); without a display it has nothing to choose by, so it is
/// switched off there. Runs before the engine starts any thread that reads the environment.
fn quiet_mesa_device_select() {
    if std::env::var_os("XDG_RUNTIME_DIR").is_none()
        && std::env::var_os("NODEVICE_SELECT").is_none()
    {
        std::env::set_var("NODEVICE_SELECT", "1");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn devices_parse_and_unknown_ones_are_named() {
        assert_eq!("cpu".parse(), Ok(DeviceChoice::Cpu));
        assert_eq!("gpu".parse(), Ok(DeviceChoice::Gpu(None)));
        assert_eq!("gpu:2".parse(), Ok(DeviceChoice::Gpu(Some(2))));
        for bad in ["tpu", "gpu:", "gpu:x", "cpu:0", "gpu:-1"] {
            let err = bad.parse::<DeviceChoice>().unwrap_err();
            assert!(err.contains(&format!("`{bad}`")) && err.contains("gpu:N"), "{err}");
        }
    }
}

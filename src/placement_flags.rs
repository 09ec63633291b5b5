//! llama.cpp's placement flags for a model on the GPU that the device cannot hold whole:
//! `--cpu-moe`, `--n-cpu-moe N`, `--n-gpu-layers N`, `--fit` and `--gpu-memory-limit`. Routed
//! experts left in system RAM, and the blocks `--n-gpu-layers` leaves off the device, run on
//! Spindle's CPU kernels; everything else stays on the device (`spindle_gpu::Placement` plans
//! it). A value Spindle cannot honour is refused, naming the flag, never ignored.

use clap::Args;
use spindle_gpu::{Placement, PlacementRequest};

use crate::byte_size::{human_bytes, parse_bytes};

#[derive(Args, Clone, Debug)]
pub struct PlacementFlags {
    /// With --device gpu: keep every block's routed experts in system RAM and run them on the
    /// CPU (llama.cpp's --cpu-moe); attention, DeltaNet, router, shared expert and KV stay on
    /// the device.
    #[arg(long)]
    cpu_moe: bool,
    /// With --device gpu: keep the routed experts of blocks 0..N in system RAM (llama.cpp's
    /// --n-cpu-moe).
    #[arg(long, default_value_t = 0)]
    n_cpu_moe: usize,
    /// With --device gpu: blocks on the device: all (the default, also `auto` or -1) or N, the
    /// last N blocks of a hybrid MoE model, the first ones running whole on the CPU (weights,
    /// keys, values and DeltaNet states in system RAM). Dense models run whole on the GPU.
    #[arg(long, value_parser = parse_gpu_layers, allow_hyphen_values = true)]
    n_gpu_layers: Option<GpuLayers>,
    /// With --device gpu: on (the default) puts everything but the routed experts on the device,
    /// reserves the KV cache and DeltaNet states, then routed experts block by block while
    /// --gpu-memory-limit, or else the device memory Vulkan reports free, holds; the rest stay
    /// in system RAM. Where even that does not fit (and --n-gpu-layers is not given), the first
    /// blocks run whole on the CPU. off: only the flags move anything.
    #[arg(long, default_value = "on", default_missing_value = "on", num_args = 0..=1,
          value_parser = parse_on_off)]
    fit: bool,
    /// With --device gpu: device memory the model may take (e.g. 6GiB), a sixteenth of it kept
    /// for activations. Without it --fit plans against what Vulkan reports free, or Metal's
    /// recommended working set (DX12 reports nothing: there nothing spills by size).
    #[arg(long, value_parser = parse_bytes)]
    gpu_memory_limit: Option<usize>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum GpuLayers {
    All,
    Count(usize),
}

fn parse_gpu_layers(text: &str) -> Result<GpuLayers, String> {
    match text {
        "all" | "auto" | "-1" => Ok(GpuLayers::All),
        n => n.parse().map(GpuLayers::Count).map_err(|_| {
            format!("--n-gpu-layers `{text}`: expected a number of blocks, all, auto or -1")
        }),
    }
}

fn parse_on_off(text: &str) -> Result<bool, String> {
    match text {
        "on" => Ok(true),
        "off" => Ok(false),
        _ => Err(format!("--fit `{text}`: expected on or off")),
    }
}

impl PlacementFlags {
    /// The request for a GPU whose KV pools take `kv_bytes` and whose steps run up to
    /// `sequences` at once; on the CPU (`gpu` false), any placement asked for is refused.
    pub fn request(
        &self,
        gpu: bool,
        kv_bytes: usize,
        sequences: usize,
    ) -> anyhow::Result<PlacementRequest> {
        let n_gpu_layers = match self.n_gpu_layers {
            None | Some(GpuLayers::All) => None,
            Some(GpuLayers::Count(n)) => Some(n),
        };
        if !gpu {
            let asked = [
                (self.cpu_moe, "--cpu-moe"),
                (self.n_cpu_moe > 0, "--n-cpu-moe"),
                (n_gpu_layers.is_some_and(|n| n > 0), "--n-gpu-layers"),
                (self.gpu_memory_limit.is_some(), "--gpu-memory-limit"),
            ];
            if let Some((_, flag)) = asked.iter().find(|(asked, _)| *asked) {
                anyhow::bail!("{flag} places a model on a GPU; add --device gpu");
            }
        }
        Ok(PlacementRequest {
            cpu_moe: self.cpu_moe,
            n_cpu_moe: self.n_cpu_moe,
            n_gpu_layers,
            fit: self.fit,
            memory_limit: self.gpu_memory_limit.map(|b| b as u64),
            // Asked of the device by whoever opened it (`device_flag::plan_placement`).
            device_memory: None,
            kv_bytes: kv_bytes as u64,
            sequences,
            // `--spec-mtp`'s, set beside these flags.
            draft_head: false,
        })
    }
}

/// Refuses, for a checkpoint folder (whose bytes the placement does not read: it runs whole on
/// the device), every placement flag that would change where something runs.
pub fn refuse_for_checkpoint(request: &PlacementRequest, blocks: usize) -> anyhow::Result<()> {
    let asked = [
        (request.cpu_moe, "--cpu-moe".to_string()),
        (request.n_cpu_moe > 0, format!("--n-cpu-moe {}", request.n_cpu_moe)),
        (request.memory_limit.is_some(), "--gpu-memory-limit".to_string()),
        (request.n_gpu_layers.is_some_and(|n| n < blocks), "--n-gpu-layers".to_string()),
    ];
    if let Some((_, flag)) = asked.iter().find(|(asked, _)| *asked) {
        anyhow::bail!(
            "{flag}: a checkpoint folder runs whole on the GPU (placement reads a GGUF file's \
             header: give the model as a GGUF file)"
        );
    }
    Ok(())
}

/// The startup line: which blocks run whole on the CPU, which blocks' routed experts are in
/// system RAM, and the device memory the placement takes against its budget and where that
/// came from.
pub fn placement_line(placement: &Placement) -> String {
    let cpu = match placement.cpu_blocks {
        0 => String::new(),
        n => format!(
            "blocks 0-{} whole on the CPU, the last {} on the GPU (as --n-gpu-layers {})",
            n - 1,
            placement.blocks - n,
            placement.blocks - n
        ),
    };
    let (first, host) = (placement.cpu_blocks, placement.host_blocks());
    let experts = match (placement.moe_blocks, host - first, first) {
        (0, _, 0) => "every block on the GPU".to_string(),
        (0, _, _) => String::new(),
        (_, 0, 0) => "every routed expert on the GPU".to_string(),
        (_, 0, _) => "every routed expert of the GPU's blocks on the GPU".to_string(),
        (_, _, _) => format!(
            "routed experts of blocks {first}-{} ({} of {} MoE blocks) in system RAM on the \
             CPU, the rest on the GPU (as --n-cpu-moe {host})",
            host - 1,
            placement.host_moe_blocks,
            placement.moe_blocks,
        ),
    };
    let cpu = match (cpu.is_empty(), experts.is_empty()) {
        (false, false) => format!("{cpu}; "),
        _ => cpu,
    };
    let in_ram = match placement.host_weights {
        0 => String::new(),
        bytes => format!("; {} of weights in system RAM", human_bytes(bytes as usize)),
    };
    let used = placement.device_weights + placement.reserved;
    let budget = match (placement.budget, placement.limit) {
        (Some(budget), Some(limit)) => format!(
            "of a budget of {} ({limit}; a sixteenth kept for activations)",
            human_bytes(budget as usize)
        ),
        _ => "(no budget: no --gpu-memory-limit, and --fit off or no device memory reported)"
            .to_string(),
    };
    let head = if placement.draft_head { ", MTP head included" } else { "" };
    let kv = format!("KV cache {}", human_bytes(placement.kv_bytes as usize));
    let reserve = match placement.reserved - placement.kv_bytes {
        0 => kv,
        states => format!("{kv}, DeltaNet states {}", human_bytes(states as usize)),
    };
    format!(
        "placement: {cpu}{experts}{in_ram}; device memory {} planned (weights {}{head}, \
         {reserve}) {budget}",
        human_bytes(used as usize),
        human_bytes(placement.device_weights as usize),
    )
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        flags: PlacementFlags,
    }

    fn request(args: &[&str], gpu: bool) -> anyhow::Result<PlacementRequest> {
        let cli = Cli::try_parse_from(std::iter::once("spindle").chain(args.iter().copied()))?;
        cli.flags.request(gpu, 1024, 4)
    }

    #[test]
    fn the_flags_parse_as_llama_cpp_users_write_them() {
        let plain = request(&[], true).unwrap();
        assert_eq!(plain, PlacementRequest { kv_bytes: 1024, sequences: 4, ..Default::default() });
        let r = request(&["--n-cpu-moe", "3", "--fit", "off", "--gpu-memory-limit", "2GiB"], true)
            .unwrap();
        assert_eq!((r.n_cpu_moe, r.fit, r.memory_limit), (3, false, Some(2 << 30)));
        assert!(request(&["--cpu-moe", "--fit"], true).unwrap().cpu_moe);
        for all in ["all", "auto", "-1"] {
            assert_eq!(request(&["--n-gpu-layers", all], true).unwrap().n_gpu_layers, None);
        }
        assert_eq!(request(&["--n-gpu-layers", "99"], true).unwrap().n_gpu_layers, Some(99));
        let bad = request(&["--n-gpu-layers", "many"], true).unwrap_err().to_string();
        assert!(bad.contains("--n-gpu-layers `many`"), "{bad}");
        assert!(request(&["--fit", "maybe"], true).is_err());
    }

    /// What the startup line says of a dense model and a hybrid, whole or split.
    #[test]
    fn the_placement_line_names_the_blocks_on_the_cpu_and_the_experts_in_ram() {
        use spindle_gpu::ModelBytes;
        use spindle_models::Mixer;
        let model = |experts: u64| ModelBytes {
            dense: 4000,
            experts: vec![experts; 4],
            states_per_sequence: 0,
            draft_head: 0,
            block_weights: vec![1000; 4],
            block_mixers: vec![Mixer::Full; 4],
        };
        let line = |bytes: &ModelBytes, args: &[&str]| {
            placement_line(&Placement::plan(bytes, &request(args, true).unwrap()).unwrap())
        };
        let dense = line(&model(0), &[]);
        assert!(dense.starts_with("placement: every block on the GPU; device memory"), "{dense}");
        assert!(dense.contains("B, KV cache 1.0 KiB) (no budget") && !dense.contains("DeltaNet"));
        let recurrent = ModelBytes {
            states_per_sequence: 40,
            block_mixers: vec![Mixer::Linear, Mixer::Linear, Mixer::Linear, Mixer::Full],
            ..model(0)
        };
        let hybrid = line(&recurrent, &[]);
        assert!(hybrid.contains(", KV cache 1.0 KiB, DeltaNet states 160.0 B)"), "{hybrid}");
        let split = line(&model(0), &["--n-gpu-layers", "1"]);
        let cpu = "blocks 0-2 whole on the CPU, the last 1 on the GPU (as --n-gpu-layers 1)";
        assert!(split.starts_with(&format!("placement: {cpu}; 2.9 KiB of weights")), "{split}");
        let hybrid = line(&model(500), &["--n-gpu-layers", "3", "--n-cpu-moe", "2"]);
        let experts = "routed experts of blocks 1-1 (2 of 4 MoE blocks) in system RAM on the CPU, \
                       the rest on the GPU (as --n-cpu-moe 2)";
        assert!(hybrid.contains(&format!("(as --n-gpu-layers 3); {experts}; ")), "{hybrid}");
        let whole = line(&model(500), &["--n-gpu-layers", "3"]);
        assert!(whole.contains("; every routed expert of the GPU's blocks on the GPU"), "{whole}");
    }

    #[test]
    fn placement_on_the_cpu_or_of_a_checkpoint_is_refused_naming_the_flag() {
        let on_cpu = request(&["--n-cpu-moe", "2"], false).unwrap_err().to_string();
        assert_eq!(on_cpu, "--n-cpu-moe places a model on a GPU; add --device gpu");
        assert!(request(&["--fit", "on"], false).is_ok(), "--fit is the default anyway");
        let experts = request(&["--cpu-moe"], true).unwrap();
        let refusal = refuse_for_checkpoint(&experts, 30).unwrap_err().to_string();
        assert!(refusal.starts_with("--cpu-moe: a checkpoint folder runs whole"), "{refusal}");
        let layers = request(&["--n-gpu-layers", "12"], true).unwrap();
        let refusal = refuse_for_checkpoint(&layers, 30).unwrap_err().to_string();
        assert!(refusal.starts_with("--n-gpu-layers: a checkpoint folder"), "{refusal}");
        assert!(refuse_for_checkpoint(&layers, 12).is_ok());
        assert!(refuse_for_checkpoint(&request(&[], true).unwrap(), 30).is_ok());
    }
}

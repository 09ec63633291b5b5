//! The hybrid model with routed experts left in system RAM (`Placement`: `--cpu-moe`,
//! `--n-cpu-moe`, and `--fit` under a device-memory limit forced small enough that experts
//! spill) against the same file with every expert on the GPU. On the qwen3_5_moe fixture's F32
//! GGUF (8 MoE blocks of 8 experts, top 2), where the CPU's experts multiply in f32 as the
//! device does: the same greedy tokens, logits within 1e-4. On the tiny random Q4_K
//! Qwen3.5-MoE GGUF of `hybrid.rs`, where the CPU's kernels round activations to 8 bits: logits
//! within a recorded bound. Either way one submission more per spilled block, and a sequence's
//! logits bitwise the same alone and batched in the spilled configuration too.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use spindle_gpu::{Gpu, GpuHybrid, ModelBytes, Placement, PlacementRequest};

use crate::harness::gpu_or_skip;
use crate::hybrid::{same_alone_and_batched, tiny_hybrid};
use crate::model::{agreement, greedy_on_gpu};

/// Largest logit difference between routed experts on the CPU and on the GPU with f32 weights:
/// both multiply in f32, in other orders (measured on lavapipe: see the README's GPU section).
pub(crate) const F32_TOLERANCE: f32 = 1e-4;

/// The same with Q4_K experts: the CPU's quantized kernels round each row of activations to 8
/// bits (Q8_K) before the product, the device multiplies in f32 (measured on lavapipe over a
/// 6-token prompt and 7 steps: 6.0e-1; the CPU's own default path differs from its f32 path by
/// 1.4 on this model, and picks 2 of its 8 greedy tokens otherwise, near-ties of a random model).
const Q4K_TOLERANCE: f32 = 1.0;

const PROMPT: [u32; 6] = [3, 141, 59, 26, 5, 35];
const STEPS: usize = 8;

/// The qwen3_5_moe fixture's F32 GGUF (tests/data/hybrid).
pub(crate) fn f32_fixture() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/data/hybrid/qwen3_5_moe/model.gguf")
}

pub(crate) fn placed(
    path: &Path,
    gpu: Arc<Gpu>,
    request: &PlacementRequest,
) -> (GpuHybrid, Placement) {
    let (cfg, mut weights) = spindle_models::open_hybrid(path).unwrap();
    let placement = Placement::plan(&ModelBytes::of_hybrid(&cfg, &weights), request).unwrap();
    (GpuHybrid::load_placed(gpu, cfg, &mut weights, &placement).unwrap(), placement)
}

/// `request`'s placement of the model at `path` against the all-GPU run, 8 greedy steps:
/// `spilled` blocks' experts in system RAM, two more submissions a step for each (the part
/// after it, and its shared expert, which the device runs while the CPU runs the routed ones),
/// logits within `tolerance`; returns how many greedy tokens agree.
fn against_all_on_the_gpu(
    path: &Path,
    request: &PlacementRequest,
    spilled: usize,
    tolerance: f32,
) -> usize {
    // A device of its own: the other tests' submissions would mix into its count.
    let device = Arc::new(Gpu::open(None).unwrap());
    let (all_gpu, _) = placed(path, device.clone(), &PlacementRequest::default());
    let (gpu, placement) = placed(path, device.clone(), request);
    assert_eq!(placement.host_moe_blocks, spilled, "{placement:?}");
    let before = device.submissions();
    let run = greedy_on_gpu(&gpu, &PROMPT, STEPS);
    let submissions = device.submissions() - before;
    let parts = STEPS * (1 + spilled);
    assert_eq!(submissions, (parts + STEPS * spilled) as u64, "a part and a shared expert");
    let (agreed, worst) = agreement(&all_gpu, &run);
    eprintln!(
        "{}: {spilled} of {} blocks' experts in system RAM; {agreed}/{STEPS} greedy tokens agree \
         with all on the GPU; max logit difference {worst:.2e}",
        path.file_name().unwrap().to_string_lossy(),
        placement.moe_blocks
    );
    assert!(worst <= tolerance, "logits differ by {worst}");
    agreed
}

#[test]
fn every_routed_expert_in_system_ram_decodes_the_all_gpu_greedy_tokens() {
    if gpu_or_skip().is_none() {
        return;
    }
    let request = PlacementRequest { cpu_moe: true, ..PlacementRequest::default() };
    let agreed = against_all_on_the_gpu(&f32_fixture(), &request, 8, F32_TOLERANCE);
    assert_eq!(agreed, STEPS, "greedy tokens differ");
}

/// A limit that leaves room for the last five blocks' experts only: `--fit` spills the first
/// three.
#[test]
fn fit_under_a_small_device_limit_spills_experts_and_decodes_the_same_tokens() {
    let (cfg, weights) = spindle_models::open_hybrid(&f32_fixture()).unwrap();
    let bytes = ModelBytes::of_hybrid(&cfg, &weights);
    assert!(bytes.experts.iter().all(|&b| b > 0), "{bytes:?}");
    let kv_bytes = 1 << 20;
    let kept: u64 = bytes.experts[3..].iter().sum();
    let needed = bytes.dense + kv_bytes + bytes.states_per_sequence + kept;
    // The budget is the limit less a sixteenth; half a block's experts to spare.
    let limit = (needed + bytes.experts[2] / 2) * 16 / 15 + 16;
    let request =
        PlacementRequest { memory_limit: Some(limit), kv_bytes, ..PlacementRequest::default() };
    assert_eq!(Placement::plan(&bytes, &request).unwrap().host_blocks(), 3);
    if gpu_or_skip().is_none() {
        return;
    }
    let agreed = against_all_on_the_gpu(&f32_fixture(), &request, 3, F32_TOLERANCE);
    assert_eq!(agreed, STEPS, "greedy tokens differ");
}

/// Q4_K experts on the CPU: the logits stay within the bound of its 8-bit activations.
#[test]
fn quantized_experts_in_system_ram_stay_within_the_cpu_kernels_rounding() {
    if gpu_or_skip().is_none() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let request = PlacementRequest { cpu_moe: true, ..PlacementRequest::default() };
    against_all_on_the_gpu(&tiny_hybrid(dir.path()), &request, 4, Q4K_TOLERANCE);
}

#[test]
fn a_spilled_sequence_gets_the_same_logits_alone_and_among_others() {
    let Some(device) = gpu_or_skip() else { return };
    let dir = tempfile::tempdir().unwrap();
    let request = PlacementRequest { n_cpu_moe: 3, ..PlacementRequest::default() };
    let (gpu, placement) = placed(&tiny_hybrid(dir.path()), device.clone(), &request);
    assert_eq!(placement.host_moe_blocks, 3);
    same_alone_and_batched(&gpu);
}

/// A Vulkan adapter reports its largest device-local heap, what is free of it no more than its
/// size; lavapipe's (a CPU device) is system RAM. Metal reports its working set, DX12 nothing.
#[test]
fn a_vulkan_adapter_reports_its_device_memory() {
    let Some(gpu) = gpu_or_skip() else { return };
    let info = gpu.info();
    let memory = gpu.memory();
    eprintln!("{} ({:?}, {:?}): {memory:?}", info.name, info.backend, info.device_type);
    if info.backend != wgpu::Backend::Vulkan {
        assert_eq!(memory, None);
        return;
    }
    let memory = memory.expect("a Vulkan adapter reports its heaps");
    assert!(memory.total > 0 && memory.available <= memory.total, "{memory:?}");
    let cpu = info.device_type == wgpu::DeviceType::Cpu;
    assert!(!cpu || memory.system_ram, "a CPU device's heap is system RAM: {memory:?}");
    assert!(memory.to_string().starts_with(&format!("{}: ", memory.source)));
}

//! `--n-gpu-layers` short of the block count: the hybrid's first blocks run whole on the CPU
//! (`spindle_models`' kernels, their keys and values in the host pool, their DeltaNet states in
//! the caches) and the device goes on from the residual stream they hand over. On the
//! qwen3_5_moe fixture's F32 GGUF (8 blocks: three DeltaNet, one attention, twice), against the
//! same file all on the GPU: the same greedy tokens, logits within the f32 bound of the
//! experts-in-RAM tests; one submission a step still; a sequence bitwise the same alone and
//! batched; drafts verified and gone back on both sides; the cache's state, read back, the
//! CPU blocks' and the device's together.

use std::sync::Arc;

use spindle_gpu::{Gpu, GpuHybrid, PlacementRequest};
use spindle_models::CausalLm;

use crate::harness::gpu_or_skip;
use crate::hybrid::{same_alone_and_batched, verifying_decodes_as_plain_steps};
use crate::model::{agreement, argmax, greedy_on_gpu};
use crate::placement::{f32_fixture, placed, F32_TOLERANCE};

const PROMPT: [u32; 6] = [3, 141, 59, 26, 5, 35];
const STEPS: usize = 8;

/// The fixture with its last `n_gpu_layers` blocks on `gpu`.
fn split(gpu: Arc<Gpu>, n_gpu_layers: usize) -> GpuHybrid {
    let request = PlacementRequest { n_gpu_layers: Some(n_gpu_layers), ..Default::default() };
    let (model, placement) = placed(&f32_fixture(), gpu, &request);
    assert_eq!(placement.cpu_blocks, 8 - n_gpu_layers.min(8), "{placement:?}");
    model
}

/// Blocks 0-2 (DeltaNet), 0-3 (with the first attention block) and all eight on the CPU.
#[test]
fn the_first_blocks_on_the_cpu_decode_the_all_gpu_greedy_tokens() {
    if gpu_or_skip().is_none() {
        return;
    }
    // A device of its own: the other tests' submissions would mix into its count.
    let device = Arc::new(Gpu::open(None).unwrap());
    let (all_gpu, _) = placed(&f32_fixture(), device.clone(), &PlacementRequest::default());
    for n_gpu_layers in [5, 4, 0] {
        let gpu = split(device.clone(), n_gpu_layers);
        let before = device.submissions();
        let run = greedy_on_gpu(&gpu, &PROMPT, STEPS);
        assert_eq!(device.submissions() - before, STEPS as u64, "one submission a step");
        let (agreed, worst) = agreement(&all_gpu, &run);
        eprintln!(
            "--n-gpu-layers {n_gpu_layers}: {agreed}/{STEPS} greedy tokens agree with all on the \
             GPU; max logit difference {worst:.2e}"
        );
        assert!(worst <= F32_TOLERANCE, "--n-gpu-layers {n_gpu_layers}: logits differ by {worst}");
        assert_eq!(agreed, STEPS, "--n-gpu-layers {n_gpu_layers}: greedy tokens differ");
    }
}

/// Blocks 0-4 on the CPU, 5-7 (two DeltaNet, one attention) on the device.
#[test]
fn a_sequence_split_between_cpu_and_gpu_gets_the_same_logits_alone_and_among_others() {
    let Some(device) = gpu_or_skip() else { return };
    same_alone_and_batched(&split(device.clone(), 3));
}

/// Rejected drafts go back in the CPU blocks' states (from the cache's history) and in the
/// device's (its history rows), and no state is read back from the device.
#[test]
fn drafts_verified_across_cpu_and_gpu_go_back_on_both() {
    let Some(device) = gpu_or_skip() else { return };
    verifying_decodes_as_plain_steps(&split(device.clone(), 3));
}

/// A cache's state read back (for a snapshot, the disk tier) holds the CPU blocks' layers from
/// the cache and the device's from the device, within the f32 bound of the all-GPU run's; set
/// again from the host (the device's let go), it decodes bitwise as the state never moved.
#[test]
fn a_split_state_reads_back_whole_and_goes_on_from_the_host() {
    let Some(device) = gpu_or_skip() else { return };
    let (all_gpu, _) = placed(&f32_fixture(), device.clone(), &PlacementRequest::default());
    let gpu = split(device.clone(), 5);
    let prompt_on = |model: &GpuHybrid| {
        let mut cache = model.new_cache(64);
        let next = argmax(&model.forward(&PROMPT, &mut cache).unwrap());
        (cache, next)
    };
    let ((mut kept, next), (on_all, _)) = (prompt_on(&gpu), prompt_on(&all_gpu));
    let (split_state, all_state) = (kept.recurrent().to_floats(), on_all.recurrent().to_floats());
    assert_eq!(split_state.len(), all_state.len());
    let worst = split_state.iter().zip(&all_state).map(|(a, b)| (a - b).abs()).fold(0.0, f32::max);
    eprintln!("DeltaNet states split and all on the GPU: max difference {worst:.2e}");
    assert!(worst <= F32_TOLERANCE, "states differ by {worst}");
    let (mut moved, _) = prompt_on(&gpu);
    moved.set_recurrent_floats(&moved.recurrent().to_floats()).unwrap();
    assert!(moved.recurrent_on_device().is_none());
    let uploads = gpu.state_traffic().uploads;
    let want = gpu.forward(&[next], &mut kept).unwrap();
    let got = gpu.forward(&[next], &mut moved).unwrap();
    assert_eq!(gpu.state_traffic().uploads, uploads + 1, "the device's layers went up again");
    assert!(want.iter().zip(&got).all(|(a, b)| a.to_bits() == b.to_bits()), "logits differ");
}

/// The MTP head (on the device, with pools of its own) drafts alike whichever blocks of the
/// target run on the CPU: from the same hidden states and tokens, its logits bitwise the same
/// on the split model as on the all-GPU one.
#[test]
fn the_mtp_head_of_a_split_model_drafts_as_the_all_gpu_ones() {
    let Some(device) = gpu_or_skip() else { return };
    let with_head = |n_gpu_layers| PlacementRequest {
        n_gpu_layers,
        draft_head: true,
        ..PlacementRequest::default()
    };
    let (all_gpu, _) = placed(&f32_fixture(), device.clone(), &with_head(None));
    let (gpu, placement) = placed(&f32_fixture(), device.clone(), &with_head(Some(5)));
    assert!(placement.draft_head && placement.cpu_blocks == 3, "{placement:?}");
    let mut cache = gpu.new_cache(64);
    cache.keep_hidden_states();
    gpu.forward(&PROMPT, &mut cache).unwrap();
    let (_, hidden) = cache.hidden_states().expect("kept");
    let tokens = [141, 59, 26, 5, 35, 8];
    let drafts = |model: &GpuHybrid| {
        let head = model.draft_head().expect("the fixture has an MTP head");
        let mut head_cache = head.new_cache(64);
        head.predict(hidden, &tokens, &mut head_cache).unwrap().logits
    };
    let (want, got) = (drafts(&all_gpu), drafts(&gpu));
    assert_eq!(want.len(), tokens.len());
    for (row, (a, b)) in want.iter().zip(&got).enumerate() {
        assert!(a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits()), "row {row} differs");
    }
}

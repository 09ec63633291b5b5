//! Whole dense models on the GPU path (`GpuLlama`) against the CPU engine: the same greedy
//! tokens, logits within recorded bounds, and a sequence's logits bitwise the same alone and
//! batched with others in a shared paged pool.

use std::path::Path;
use std::sync::Arc;

use spindle_gpu::{Gpu, GpuLlama};
use spindle_models::random_dense::{write_random_dense, DenseShape};
use spindle_models::{
    BatchEntry, CausalLm, KvType, PagedKv, RecurrentState, SequenceCache, TransformerConfig,
};

use crate::harness::{gpu_or_skip, same_bits};

/// Largest logit difference between the paths on the tiny f32 model (measured on lavapipe:
/// 5.1e-6; logits of a few units, f32 sums of 32 to 512 terms through two layers).
const TINY_LOGIT_TOLERANCE: f32 = 1e-4;

fn argmax(logits: &[f32]) -> u32 {
    (0..logits.len()).fold(0, |best, i| if logits[i] > logits[best] { i } else { best }) as u32
}

fn load_on_gpu(path: &Path, gpu: Arc<Gpu>) -> GpuLlama {
    let (cfg, mut weights) = spindle_models::open_dense(path).unwrap();
    GpuLlama::load(gpu, cfg, &mut weights).unwrap()
}

/// Greedy decoding of `prompt` for `steps` tokens on both paths, each fed its own choice;
/// returns the steps whose top-1 agreed and the largest logit difference while they did.
fn greedy_on_both(
    cpu: &dyn CausalLm,
    gpu: &GpuLlama,
    prompt: &[u32],
    steps: usize,
) -> (usize, f32) {
    let (mut cpu_cache, mut gpu_cache) = (cpu.new_cache(512), gpu.new_cache(512));
    let (mut cpu_next, mut gpu_next) = (prompt.to_vec(), prompt.to_vec());
    let mut worst = 0.0f32;
    for step in 0..steps {
        let want = cpu.forward(&cpu_next, &mut cpu_cache).unwrap();
        let got = gpu.forward(&gpu_next, &mut gpu_cache).unwrap();
        let (a, b) = (argmax(&want), argmax(&got));
        worst = worst.max(got.iter().zip(&want).map(|(g, w)| (g - w).abs()).fold(0.0, f32::max));
        if a != b {
            return (step, worst);
        }
        (cpu_next, gpu_next) = (vec![a], vec![b]);
    }
    (steps, worst)
}

fn tiny_model(dir: &Path) -> DenseShape {
    let shape = DenseShape { vocab: 512, context: 256, ..DenseShape::tiny(512) };
    write_random_dense(dir, &shape, 41, &[]).unwrap();
    shape
}

#[test]
fn the_tiny_model_on_the_gpu_decodes_the_cpu_engines_greedy_tokens() {
    if gpu_or_skip().is_none() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    tiny_model(dir.path());
    let cpu = spindle_models::load_safetensors(dir.path()).unwrap();
    // A device of its own: the other tests' submissions would mix into its count.
    let device = Arc::new(Gpu::open(None).unwrap());
    let gpu = load_on_gpu(dir.path(), device.clone());
    let before = device.submissions();
    let (agreed, worst) = greedy_on_both(cpu.as_ref(), &gpu, &[3, 141, 59, 26, 5], 24);
    eprintln!("tiny model: {agreed}/24 greedy tokens agree; max logit difference {worst:.2e}");
    assert_eq!(agreed, 24, "greedy tokens differ at step {agreed}");
    assert!(worst <= TINY_LOGIT_TOLERANCE, "logits differ by {worst}");
    assert_eq!(device.submissions() - before, 24, "one submission a step");
}

/// A cache in a pool shared with other sequences, on the blocks given (out of order, so the
/// block tables are no identity).
fn shared_cache(cfg: &TransformerConfig, pool: &Arc<PagedKv>, blocks: Vec<u32>) -> SequenceCache {
    let limit = blocks.len() * pool.block_size();
    SequenceCache::resume(
        pool.clone(),
        blocks,
        0,
        RecurrentState::none(cfg.num_hidden_layers),
        limit,
    )
}

#[test]
fn a_sequence_gets_the_same_logits_alone_and_among_others_in_a_shared_pool() {
    if gpu_or_skip().is_none() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    tiny_model(dir.path());
    let gpu = load_on_gpu(dir.path(), gpu_or_skip().unwrap().clone());
    let cfg = gpu.config().clone();
    let target: Vec<u32> = (0..21).map(|i| (i * 37 + 11) % 512).collect();
    // Alone, in a standalone cache: a prompt, then two decode steps.
    let mut alone = gpu.new_cache(64);
    let mut want = vec![gpu.forward(&target, &mut alone).unwrap()];
    for token in [7, 300] {
        want.push(gpu.forward(&[token], &mut alone).unwrap());
    }
    // Among others, every cache in one pool of 8-position blocks, scattered.
    let pool = Arc::new(PagedKv::new(&gpu.kv_shapes(), KvType::F32, 16, 8));
    let mut mine = shared_cache(&cfg, &pool, vec![9, 2, 14, 5]);
    let mut other = shared_cache(&cfg, &pool, vec![0, 11, 7, 3]);
    let mut third = shared_cache(&cfg, &pool, vec![15, 1]);
    let other_prompt: Vec<u32> = (0..13).map(|i| (i * 5 + 1) % 512).collect();
    let mut got = gpu
        .forward_batch(&mut [
            BatchEntry::new(&other_prompt, &mut other),
            BatchEntry::new(&target, &mut mine),
            BatchEntry { tokens: &[4, 8, 15], cache: &mut third, logit_rows: 3 },
        ])
        .unwrap();
    assert_eq!(got[2].len(), 3 * cfg.vocab_size, "three rows of logits");
    let mut steps = vec![got.swap_remove(1)];
    for token in [7, 300] {
        let mut batched = gpu
            .forward_batch(&mut [
                BatchEntry::new(&[token], &mut mine),
                BatchEntry::new(&[42], &mut other),
                BatchEntry::new(&[16, 23], &mut third),
            ])
            .unwrap();
        steps.push(batched.swap_remove(0));
    }
    for (step, (a, b)) in want.iter().zip(&steps).enumerate() {
        same_bits(&format!("step {step} alone and batched"), a, b);
    }
    // A step that does not fit is refused before any work: the caches are unchanged.
    let too_long = vec![1; 20];
    assert!(gpu.forward_batch(&mut [BatchEntry::new(&too_long, &mut third)]).is_err());
    assert_eq!(third.len(), 3 + 2 + 2);
}

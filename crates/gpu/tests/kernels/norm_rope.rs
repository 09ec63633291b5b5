//! RMSNorm and RoPE against `spindle_models::{RmsNorm, Rotary}`.

use candle_core::{Device, Tensor};
use spindle_gpu::{AddRows, RmsNorm, Rope, RopePairs, RopeShape, RopeTable};
use spindle_models::{RopeScaling, RopeStyle, Rotary};

use crate::harness::{check, computed, gpu_or_skip, rng, same_bits, uniform};

/// Per value, relative to the largest `|y|` of its row: the GPU's tree and the CPU's running
/// sum of squares round differently, then one division and one product (measured on lavapipe: 2.2e-7).
const NORM_TOLERANCE: f64 = 1e-6;
/// Per value, absolute (inputs in [-1, 1), cos/sin from the same table): two products and a
/// sum, which a device may fuse (measured on lavapipe: 0, the CPU's bits).
const ROPE_TOLERANCE: f64 = 1e-6;

#[test]
fn rms_norm_matches_the_cpu_and_does_not_depend_on_the_rows_beside() {
    let Some(gpu) = gpu_or_skip() else { return };
    let mut rng = rng(3);
    let norm = RmsNorm::new(gpu).unwrap();
    // Widths under, at and past the 64 lanes, Qwen's head norms (128) and a hidden size.
    for (rows, dim) in [(1, 7), (5, 64), (9, 128), (3, 897)] {
        let x = uniform(&mut rng, rows * dim);
        let w = uniform(&mut rng, dim);
        let eps = 1e-6;
        let (on_gpu, weight) = (gpu.upload(&x).unwrap(), gpu.upload(&w).unwrap());
        let got = computed(gpu, |step| norm.forward(step, &on_gpu, &weight, eps));
        let cpu = spindle_models::RmsNorm::new(
            Tensor::from_vec(w.clone(), dim, &Device::Cpu).unwrap(),
            eps as f64,
        );
        let want: Vec<f32> = cpu
            .forward(&Tensor::from_vec(x.clone(), (rows, dim), &Device::Cpu).unwrap())
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1()
            .unwrap();
        let scale: Vec<f64> = want
            .chunks(dim)
            .flat_map(|row| {
                let top = row.iter().fold(0.0f64, |m, v| m.max(v.abs() as f64));
                vec![top; dim]
            })
            .collect();
        let want: Vec<f64> = want.iter().map(|&v| v as f64).collect();
        check(&format!("rms_norm {rows}x{dim}"), &got, &want, &scale, NORM_TOLERANCE);
        let last = gpu.upload(&x[(rows - 1) * dim..]).unwrap();
        let last_alone = computed(gpu, |step| norm.forward(step, &last, &weight, eps));
        same_bits("rms_norm last row alone", &last_alone, &got[(rows - 1) * dim..]);
    }
}

#[test]
fn rope_matches_the_cpu_in_both_pairings_and_partial_rotation() {
    let Some(gpu) = gpu_or_skip() else { return };
    let mut rng = rng(5);
    let rope = Rope::new(gpu).unwrap();
    let yarn = RopeScaling::Yarn {
        factor: 4.0,
        original_max_positions: 4096,
        beta_fast: 32.0,
        beta_slow: 1.0,
        attention_factor: 1.1,
        truncate: true,
    };
    // (heads, head_dim, rotary_dim, tokens, first position): full rotation, Qwen3-Next's
    // quarter rotation, far positions.
    let cases = [(3, 64, 64, 5, 0), (2, 256, 64, 3, 17), (4, 128, 128, 9, 40_000)];
    for (pairs, style) in
        [(RopePairs::Halves, RopeStyle::Halves), (RopePairs::Interleaved, RopeStyle::Interleaved)]
    {
        for scaling in [RopeScaling::None, yarn.clone()] {
            for (heads, head_dim, rotary_dim, tokens, start) in cases {
                let rotary = Rotary::new(rotary_dim, 1_000_000.0, &scaling, style);
                let x = uniform(&mut rng, tokens * heads * head_dim);
                let (cos, sin) = rotary.cos_sin(start, tokens);
                let table =
                    RopeTable { cos: gpu.upload(&cos).unwrap(), sin: gpu.upload(&sin).unwrap() };
                let on_gpu = gpu.upload(&x).unwrap();
                let shape = RopeShape { heads, head_dim, rotary_dim, pairs };
                gpu.run(|step| rope.apply(step, &on_gpu, shape, &table)).unwrap();
                let got = gpu.download(&on_gpu).unwrap();
                // The CPU turns (1, heads, tokens, rotary_dim); the rest of each head stays.
                let t =
                    Tensor::from_vec(x.clone(), (tokens, heads, head_dim), &Device::Cpu).unwrap();
                let part = t
                    .narrow(2, 0, rotary_dim)
                    .unwrap()
                    .transpose(0, 1)
                    .unwrap()
                    .unsqueeze(0)
                    .unwrap();
                let turned = rotary
                    .apply(&part, start)
                    .unwrap()
                    .squeeze(0)
                    .unwrap()
                    .transpose(0, 1)
                    .unwrap();
                let rest = t.narrow(2, rotary_dim, head_dim - rotary_dim).unwrap();
                let want: Vec<f64> = Tensor::cat(&[&turned, &rest], 2)
                    .unwrap()
                    .flatten_all()
                    .unwrap()
                    .to_vec1::<f32>()
                    .unwrap()
                    .iter()
                    .map(|&v| v as f64)
                    .collect();
                let what = format!(
                    "rope {pairs:?} {scaling:?} {heads}x{head_dim}/{rotary_dim} from {start}"
                );
                check(&what, &got, &want, &vec![1.0; want.len()], ROPE_TOLERANCE);
            }
        }
    }
}

#[test]
fn a_bias_is_added_to_every_row_exactly() {
    let Some(gpu) = gpu_or_skip() else { return };
    let mut rng = rng(3);
    let kernel = AddRows::new(gpu).unwrap();
    let (rows, width) = (7, 129);
    let (x, bias) = (uniform(&mut rng, rows * width), uniform(&mut rng, width));
    let (on_gpu, row) = (gpu.upload(&x).unwrap(), gpu.upload(&bias).unwrap());
    let got = computed(gpu, |step| kernel.forward(step, &on_gpu, &row));
    let want: Vec<f32> = x.iter().enumerate().map(|(i, v)| v + bias[i % width]).collect();
    same_bits("bias added", &got, &want);
    let short = gpu.upload(&bias[..100]).unwrap();
    assert!(gpu.run(|step| kernel.forward(step, &on_gpu, &short)).is_err());
}

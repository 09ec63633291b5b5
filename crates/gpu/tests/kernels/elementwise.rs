//! The value-by-value kernels (one shader, an operation appended each) against f64 references:
//! the gated MLP's activations, and a scale on every row.

use spindle_gpu::Elementwise;

use crate::harness::{check, computed, gpu_or_skip, rng, same_bits, uniform};

/// Per output value, relative to `max(1, |want|)`: f32 arithmetic and the device's `exp`
/// against f64 (measured on lavapipe: silu 1.3e-7, gelu 1.3e-7).
const GATED_TOLERANCE: f64 = 1e-6;

/// An activation's f64 reference.
type Activation = fn(f64) -> f64;

fn gelu_tanh(x: f64) -> f64 {
    0.5 * x * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x.powi(3))).tanh())
}

fn silu(x: f64) -> f64 {
    x / (1.0 + (-x).exp())
}

#[test]
fn gated_activations_match_f64_over_a_wide_range() {
    let Some(gpu) = gpu_or_skip() else { return };
    let mut rng = rng(17);
    // A ragged length; gates out to ±12 (past where a naive tanh's exponentials overflow at
    // the cube) plus the far tails, where GELU is 0 or the identity.
    let mut gate: Vec<f32> = uniform(&mut rng, 1000).iter().map(|g| g * 12.0).collect();
    gate.extend([0.0, -0.0, 80.0, -80.0, 1e20, -1e20]);
    let up = uniform(&mut rng, gate.len());
    let (g, u) = (gpu.upload(&gate).unwrap(), gpu.upload(&up).unwrap());
    let cases: [(&str, Elementwise, Activation); 2] = [
        ("silu_mul", Elementwise::silu_mul(gpu).unwrap(), silu),
        ("gelu_mul", Elementwise::gelu_mul(gpu).unwrap(), gelu_tanh),
    ];
    for (name, kernel, act) in cases {
        let got = computed(gpu, |step| kernel.forward(step, &g, &u));
        let want: Vec<f64> =
            gate.iter().zip(&up).map(|(&g, &u)| act(g as f64) * u as f64).collect();
        let scale: Vec<f64> = want.iter().map(|w| w.abs().max(1.0)).collect();
        check(name, &got, &want, &scale, GATED_TOLERANCE);
    }
    let gelu = Elementwise::gelu_mul(gpu).unwrap();
    let short = gpu.upload(&up[..999]).unwrap();
    assert!(gpu.run(|step| gelu.forward(step, &g, &short)).is_err(), "lengths differ");
}

#[test]
fn a_one_value_row_scales_every_value_exactly() {
    let Some(gpu) = gpu_or_skip() else { return };
    let mut rng = rng(19);
    let x = uniform(&mut rng, 3 * 640 + 5);
    let scale = (640f64).sqrt() as f32;
    let mul = Elementwise::mul(gpu).unwrap();
    let (on_gpu, row) = (gpu.upload(&x).unwrap(), gpu.upload(&[scale]).unwrap());
    let got = computed(gpu, |step| mul.forward_rows(step, &on_gpu, &row));
    let want: Vec<f32> = x.iter().map(|v| v * scale).collect();
    same_bits("scaled", &got, &want);
    // Rows of another width: each value times its column's.
    let widths = uniform(&mut rng, 5);
    let row = gpu.upload(&widths).unwrap();
    let got = computed(gpu, |step| mul.forward_rows(step, &on_gpu, &row));
    let want: Vec<f32> = x.iter().enumerate().map(|(i, v)| v * widths[i % 5]).collect();
    same_bits("scaled by columns", &got, &want);
    let uneven = gpu.upload(&widths[..4]).unwrap();
    assert!(gpu.run(|step| mul.forward_rows(step, &on_gpu, &uneven)).is_err());
}

//! The MLP's gate activations, fused with the product by `up`, and the exponential they and
//! attention's softmax share. Plain arithmetic the compiler vectorizes: candle's `gelu` calls
//! the library's `tanhf` per value, which was a fifth of Gemma 3's prefill.

use candle_core::{Device, Tensor};
use rayon::prelude::*;

use crate::dense::with_values;
use crate::error::Result;
use crate::isa::Isa;

/// Values per parallel task.
const CHUNK: usize = 1 << 14;

/// The MLP's gate activation.
#[derive(Clone, Copy, Debug)]
pub enum Activation {
    Silu,
    /// GELU, tanh approximation (`gelu_pytorch_tanh`).
    GeluTanh,
}

impl Activation {
    /// `act(gate) · up`, element by element.
    pub(crate) fn gated(self, gate: &Tensor, up: &Tensor) -> Result<Tensor> {
        let shape = gate.shape().clone();
        let mut out: Vec<f32> = gate.contiguous()?.flatten_all()?.to_vec1()?;
        with_values(up, |up| {
            assert_eq!(out.len(), up.len(), "gate and up differ in size");
            out.par_chunks_mut(CHUNK).zip(up.par_chunks(CHUNK)).for_each(|(g, u)| self.apply(g, u));
            Ok(())
        })?;
        Ok(Tensor::from_vec(out, shape, &Device::Cpu)?)
    }

    /// [`Self::gated`] of the halves of `y = [gate | up]`, `(tokens, 2·width) → (tokens,
    /// width)`, read in place as a stacked gate/up product leaves them (cutting them out first
    /// copied both, and a prefill chunk's MLP buffers are its largest).
    pub(crate) fn gated_halves(self, y: &Tensor) -> Result<Tensor> {
        let (tokens, both) = y.dims2()?;
        let width = both / 2;
        let out = with_values(y, |y| {
            let mut out = Vec::with_capacity(tokens * width);
            y.chunks_exact(both).for_each(|row| out.extend_from_slice(&row[..width]));
            out.par_chunks_mut(width)
                .zip(y.par_chunks_exact(both))
                .for_each(|(g, row)| self.apply(g, &row[width..]));
            Ok(out)
        })?;
        Ok(Tensor::from_vec(out, (tokens, width), &Device::Cpu)?)
    }

    /// `gate ← act(gate) · up` with the widest copy this CPU runs.
    fn apply(self, gate: &mut [f32], up: &[f32]) {
        match Isa::best() {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: the CPU runs the AVX2 set (AVX-512 includes it).
            Isa::Avx2 | Isa::Avx512 => unsafe { gated_fma(self, gate, up) },
            _ => gated_portable(self, gate, up),
        }
    }
}

/// [`gated_portable`] compiled with hardware fused multiply-add (the same bits: `mul_add` is
/// exact either way, a library call without it).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn gated_fma(act: Activation, gate: &mut [f32], up: &[f32]) {
    gated_portable(act, gate, up)
}

#[inline(always)]
fn gated_portable(act: Activation, gate: &mut [f32], up: &[f32]) {
    match act {
        Activation::Silu => gate.iter_mut().zip(up).for_each(|(g, u)| *g = silu(*g) * u),
        Activation::GeluTanh => gate.iter_mut().zip(up).for_each(|(g, u)| *g = gelu_tanh(*g) * u),
    }
}

/// `x · σ(x)`, with `e^−|x|` so the exponential never overflows.
#[inline(always)]
fn silu(x: f32) -> f32 {
    let e = exp_nonpositive(-x.abs());
    let sigmoid = if x >= 0.0 { 1.0 / (1.0 + e) } else { e / (1.0 + e) };
    x * sigmoid
}

/// `x/2 · (1 + tanh(√(2/π)·(x + 0.044715·x³)))`, with `tanh u = sign(u)·(1 − e)/(1 + e)` for
/// `e = e^−2|u|`.
#[inline(always)]
fn gelu_tanh(x: f32) -> f32 {
    const SQRT_2_OVER_PI: f32 = 0.797_884_6;
    let u = SQRT_2_OVER_PI * (x + 0.044715 * x * x * x);
    let e = exp_nonpositive(-2.0 * u.abs());
    let tanh = ((1.0 - e) / (1.0 + e)).copysign(u);
    0.5 * x * (1.0 + tanh)
}

/// `eˣ` for `x ≤ 0` within 2 ulp, in plain arithmetic the compiler vectorizes (the library's
/// `expf` is a call per score): `x = n·ln 2 + r` with `|r| ≤ ln 2 / 2`, a degree-6 Taylor
/// polynomial for `eʳ`, and `2ⁿ` put into the exponent bits. Below −87 the result is 0; above 0, 1.
#[inline(always)]
pub(crate) fn exp_nonpositive(x: f32) -> f32 {
    const SHIFT: f32 = 12_582_912.0; // 1.5·2²³: adding it rounds to an integer
    const LN2_HI: f32 = 0.693_145_75;
    const LN2_LO: f32 = 1.428_606_8e-6;
    // Softmax also passes scores it then discards (keys a row does not see), which may be
    // positive or infinite: clamped, they cannot overflow the exponent arithmetic.
    let clamped = x.clamp(-87.0, 0.0);
    let shifted = clamped.mul_add(std::f32::consts::LOG2_E, SHIFT);
    let n = shifted - SHIFT;
    let r = (-n).mul_add(LN2_LO, (-n).mul_add(LN2_HI, clamped));
    let mut p: f32 = 1.0 / 720.0;
    for c in [1.0 / 120.0, 1.0 / 24.0, 1.0 / 6.0, 0.5, 1.0, 1.0] {
        p = p.mul_add(r, c);
    }
    // n's integer from the shifted sum's low bits (one ulp is 1 there), not `n as i32`: that
    // cast saturates, which compiles to scalar compares, and the softmax then runs unvectorized.
    let whole = shifted.to_bits() as i32 - SHIFT.to_bits() as i32;
    let scale = f32::from_bits(((whole + 127).max(0) as u32) << 23);
    if x < -87.0 {
        0.0
    } else {
        p * scale
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exp_is_within_two_ulp_down_to_the_smallest_normal() {
        for i in 0..=870_000 {
            let x = -(i as f32) * 1e-4;
            let (got, want) = (exp_nonpositive(x) as f64, (x as f64).exp());
            let ulp = (f32::EPSILON as f64) * want.max(f32::MIN_POSITIVE as f64);
            assert!((got - want).abs() <= 2.0 * ulp, "exp({x}) = {got}, not {want}");
        }
        assert_eq!(exp_nonpositive(0.0), 1.0);
        assert_eq!(exp_nonpositive(-200.0), 0.0);
        assert_eq!(exp_nonpositive(f32::NEG_INFINITY), 0.0);
    }

    /// Within 8 ulp of the exact value, or of `|x|` where `1 + tanh` cancels.
    fn close(got: f32, want: f64, x: f32) -> bool {
        (got as f64 - want).abs() <= 8.0 * f32::EPSILON as f64 * (want.abs() + x.abs() as f64)
    }

    #[test]
    fn activations_match_their_definitions() {
        for i in -200_000..=200_000 {
            let x = i as f32 * 1e-4;
            let xd = x as f64;
            let silu_exact = xd / (1.0 + (-xd).exp());
            let u = (2.0 / std::f64::consts::PI).sqrt() * (xd + 0.044715 * xd.powi(3));
            let gelu_exact = 0.5 * xd * (1.0 + u.tanh());
            assert!(close(silu(x), silu_exact, x), "silu({x}) = {}, not {silu_exact}", silu(x));
            assert!(close(gelu_tanh(x), gelu_exact, x), "gelu({x}) = {}", gelu_tanh(x));
        }
        assert_eq!(silu(-100.0), 0.0);
        assert_eq!(gelu_tanh(100.0), 100.0);
    }

    #[test]
    fn every_copy_gives_the_same_bits() {
        let gate: Vec<f32> =
            (0..CHUNK + 77).map(|i| ((i * 7919 % 2003) as f32 - 1000.0) / 97.0).collect();
        let up: Vec<f32> = (0..gate.len()).map(|i| (i as f32 * 0.37).sin()).collect();
        let tensor = |v: &[f32]| Tensor::from_vec(v.to_vec(), v.len(), &Device::Cpu).unwrap();
        for act in [Activation::Silu, Activation::GeluTanh] {
            let mut portable = gate.clone();
            gated_portable(act, &mut portable, &up);
            let got: Vec<f32> = act.gated(&tensor(&gate), &tensor(&up)).unwrap().to_vec1().unwrap();
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&got), bits(&portable), "{act:?}");
        }
    }

    #[test]
    fn halves_of_a_stacked_product_give_the_bits_of_separate_gate_and_up() {
        let (tokens, width) = (5, 333);
        let y: Vec<f32> =
            (0..tokens * 2 * width).map(|i| ((i * 7919 % 2003) as f32 - 1000.0) / 97.0).collect();
        let stacked = Tensor::from_vec(y, (tokens, 2 * width), &Device::Cpu).unwrap();
        let gate = stacked.narrow(1, 0, width).unwrap().contiguous().unwrap();
        let up = stacked.narrow(1, width, width).unwrap().contiguous().unwrap();
        let bits = |t: Tensor| -> Vec<Vec<u32>> {
            let rows = t.to_vec2::<f32>().unwrap();
            rows.iter().map(|r| r.iter().map(|x| x.to_bits()).collect()).collect()
        };
        for act in [Activation::Silu, Activation::GeluTanh] {
            let whole = act.gated_halves(&stacked).unwrap();
            assert_eq!(whole.dims2().unwrap(), (tokens, width));
            assert_eq!(bits(whole), bits(act.gated(&gate, &up).unwrap()), "{act:?}");
        }
    }
}

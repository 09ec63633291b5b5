//! Matrix multiplication against Q4_1 weights with AVX2.
//!
//! candle 0.11 has SIMD dot products for Q4_0 and the k-quants but only a scalar one for Q4_1,
//! which made it ~75% of SmolLM2's decode time. This follows ggml's scheme: activations are
//! quantized per 32-value block to Q8_1 exactly as ggml's x86 code does (so results match
//! llama.cpp), and a block's dot product is `d₄·d₈·Σ(q₄·q₈) + m₄·s₈`.
//! Each output element is reduced in a fixed order, independent of how many rows `x` has.

use candle_core::Tensor;
use half::f16;
use rayon::prelude::*;

use crate::dense::{check_cols, each_row};
use crate::error::{ModelError, Result};

const BLOCK: usize = 32;
/// Bytes of one Q4_1 block: f16 scale, f16 minimum, 16 bytes of packed nibbles.
const BLOCK_BYTES: usize = 20;

/// A Q4_1 matrix of `rows` outputs × `cols` inputs, in GGUF's block layout.
pub struct Q4_1Matrix {
    rows: usize,
    cols: usize,
    data: Vec<u8>,
}

/// One block of Q8_1-quantized activations.
#[derive(Clone)]
struct Q8Block {
    d: f32,
    s: f32,
    qs: [i8; BLOCK],
}

impl Q4_1Matrix {
    pub fn new(rows: usize, cols: usize, data: Vec<u8>) -> Result<Self> {
        if !cols.is_multiple_of(BLOCK) || data.len() != rows * cols / BLOCK * BLOCK_BYTES {
            return Err(ModelError::BadConfig(format!(
                "Q4_1 tensor of {rows}x{cols} has {} bytes",
                data.len()
            )));
        }
        Ok(Self { rows, cols, data })
    }

    /// x: (tokens, cols) → (tokens, rows)
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        check_cols(x, self.rows, self.cols, "q4_1 matmul")?;
        let x: Vec<f32> = x.contiguous()?.flatten_all()?.to_vec1()?;
        let quantized: Vec<Vec<Q8Block>> = x.chunks(self.cols).map(quantize_q8_1).collect();
        let row_bytes = self.cols / BLOCK * BLOCK_BYTES;
        each_row(self.data.par_chunks(row_bytes), quantized.len(), self.rows, |w, out| dot_rows(w, &quantized, out))
    }
}

/// ggml's x86 `quantize_row_q8_1`: scale by `127 / amax`, round half to even, and store
/// `s` from the unrounded scale.
fn quantize_q8_1(x: &[f32]) -> Vec<Q8Block> {
    x.chunks(BLOCK)
        .map(|xs| {
            let amax = xs.iter().fold(0f32, |a, v| a.max(v.abs()));
            let d = amax / 127.0;
            let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
            let mut qs = [0i8; BLOCK];
            let mut sum = 0i32;
            for (q, v) in qs.iter_mut().zip(xs) {
                *q = round_small(v * id) as i8;
                sum += *q as i32;
            }
            Q8Block { d: f16::from_f32(d).to_f32(), s: f16::from_f32(d * sum as f32).to_f32(), qs }
        })
        .collect()
}

/// `x.round_ties_even()` for `|x| < 2²²`, in two additions that vectorize (the library call
/// does not): adding 1.5·2²³ leaves no fraction bits, so the sum rounds to an integer, ties to
/// even.
fn round_small(x: f32) -> f32 {
    const SHIFT: f32 = 12_582_912.0;
    (x + SHIFT) - SHIFT
}

/// `out[t]` = the weight row `w` · token `t`'s activations, for every token.
fn dot_rows(w: &[u8], xs: &[Vec<Q8Block>], out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") && std::arch::is_x86_feature_detected!("f16c") {
        // Tokens in groups: each weight block is unpacked once per group, and each token's
        // sum runs through the same steps in the same order as alone.
        let mut groups = xs.chunks(avx2::GROUP).zip(out.chunks_mut(avx2::GROUP));
        // SAFETY: the CPU supports the features the function is compiled for.
        groups.try_for_each(|(x, o)| unsafe { avx2::dot_row_group(w, x, o) }).expect("groups fit");
        return;
    }
    out.iter_mut().zip(xs).for_each(|(o, x)| *o = dot_row_scalar(w, x));
}

#[cfg(test)]
fn dot_row(w: &[u8], x: &[Q8Block]) -> f32 {
    let mut out = [0f32];
    dot_rows(w, std::slice::from_ref(&x.to_vec()), &mut out);
    out[0]
}

fn block_scales(b: &[u8]) -> (f32, f32) {
    (f16::from_le_bytes([b[0], b[1]]).to_f32(), f16::from_le_bytes([b[2], b[3]]).to_f32())
}

fn dot_row_scalar(w: &[u8], x: &[Q8Block]) -> f32 {
    let mut total = 0f32;
    for (b, xb) in w.chunks(BLOCK_BYTES).zip(x) {
        let (d, m) = block_scales(b);
        let mut isum = 0i32;
        for j in 0..BLOCK / 2 {
            isum += (b[4 + j] & 0x0F) as i32 * xb.qs[j] as i32;
            isum += (b[4 + j] >> 4) as i32 * xb.qs[j + BLOCK / 2] as i32;
        }
        total += d * xb.d * isum as f32 + m * xb.s;
    }
    total
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    use super::{Q8Block, BLOCK_BYTES};

    /// Tokens per pass over a weight row.
    pub const GROUP: usize = 4;

    /// `out[t]` = `w` · `xs[t]` for up to [`GROUP`] tokens; `Err` for a bigger group.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn dot_row_group(w: &[u8], xs: &[Vec<Q8Block>], out: &mut [f32]) -> Result<(), ()> {
        if xs.len() > GROUP || out.len() != xs.len() {
            return Err(());
        }
        let low_nibbles = _mm_set1_epi8(0x0F);
        let ones = _mm256_set1_epi16(1);
        let mut acc = [_mm256_setzero_ps(); GROUP];
        let mut mins = [0f32; GROUP];
        for (i, b) in w.chunks_exact(BLOCK_BYTES).enumerate() {
            // The block's f16 scale and minimum, converted exactly.
            let scales = _mm_cvtph_ps(_mm_cvtsi32_si128(i32::from_le_bytes([b[0], b[1], b[2], b[3]])));
            let (d, m) = (_mm_cvtss_f32(scales), _mm_cvtss_f32(_mm_movehdup_ps(scales)));
            let packed = _mm_loadu_si128(b.as_ptr().add(4) as *const __m128i);
            let lo = _mm_and_si128(packed, low_nibbles);
            let hi = _mm_and_si128(_mm_srli_epi16(packed, 4), low_nibbles);
            // Values 0..15 come from the low nibbles, 16..31 from the high ones.
            let q4 = _mm256_set_m128i(hi, lo);
            for (t, x) in xs.iter().enumerate() {
                let xb = &x[i];
                let q8 = _mm256_loadu_si256(xb.qs.as_ptr() as *const __m256i);
                let pairs = _mm256_maddubs_epi16(q4, q8);
                let sums = _mm256_cvtepi32_ps(_mm256_madd_epi16(pairs, ones));
                acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(d * xb.d), sums, acc[t]);
                mins[t] += m * xb.s;
            }
        }
        for (t, o) in out.iter_mut().enumerate() {
            let half = _mm_add_ps(_mm256_castps256_ps128(acc[t]), _mm256_extractf128_ps(acc[t], 1));
            let quad = _mm_add_ps(half, _mm_movehl_ps(half, half));
            let one = _mm_add_ss(quad, _mm_movehdup_ps(quad));
            *o = _mm_cvtss_f32(one) + mins[t];
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::quantized::{GgmlDType, QTensor};
    use candle_core::Device;

    fn sample(n: usize, seed: u32) -> Vec<f32> {
        (0..n).map(|i| (((i as u32).wrapping_mul(2654435761).wrapping_add(seed) % 1000) as f32 / 500.0) - 1.0).collect()
    }

    #[test]
    fn matches_the_exact_product_within_activation_quantization_error() {
        let (rows, cols, tokens) = (48, 128, 3);
        let w = Tensor::from_vec(sample(rows * cols, 7), (rows, cols), &Device::Cpu).unwrap();
        let q = QTensor::quantize(&w, GgmlDType::Q4_1).unwrap();
        let ours = Q4_1Matrix::new(rows, cols, q.data().unwrap().to_vec()).unwrap();
        let dense = q.dequantize(&Device::Cpu).unwrap().to_vec2::<f32>().unwrap();
        let x = sample(tokens * cols, 3);
        let got = ours.forward(&Tensor::from_vec(x.clone(), (tokens, cols), &Device::Cpu).unwrap()).unwrap();
        let got = got.to_vec2::<f32>().unwrap();
        for (t, xs) in x.chunks(cols).enumerate() {
            let amax = xs.iter().fold(0f32, |a, v| a.max(v.abs()));
            for (r, w) in dense.iter().enumerate() {
                let exact: f32 = w.iter().zip(xs).map(|(a, b)| a * b).sum();
                // Rounding each activation to a multiple of amax/127 moves it by at most
                // amax/254; f16 scales add a little more.
                let bound = w.iter().map(|v| v.abs()).sum::<f32>() * amax / 254.0 * 1.01 + 1e-3;
                assert!((exact - got[t][r]).abs() <= bound, "{exact} vs {} (bound {bound})", got[t][r]);
            }
        }
    }

    #[test]
    fn small_rounding_is_round_ties_even() {
        for x in [0.5f32, 1.5, 2.5, -0.5, -2.5, 126.5, -127.0, 3.49999, 0.0, -0.0, 1e-30] {
            assert_eq!(round_small(x), x.round_ties_even(), "{x}");
        }
        for i in -300_000..300_000 {
            let x = i as f32 * 0.000_431;
            assert_eq!(round_small(x), x.round_ties_even(), "{x}");
        }
    }

    #[test]
    fn simd_and_scalar_agree_and_rows_are_batch_invariant() {
        let (rows, cols) = (16, 256);
        let w = Tensor::from_vec(sample(rows * cols, 11), (rows, cols), &Device::Cpu).unwrap();
        let data = QTensor::quantize(&w, GgmlDType::Q4_1).unwrap().data().unwrap().to_vec();
        let x = sample(cols, 5);
        let xq = quantize_q8_1(&x);
        let row = &data[..cols / BLOCK * BLOCK_BYTES];
        assert!((dot_row(row, &xq) - dot_row_scalar(row, &xq)).abs() < 1e-3);
        let m = Q4_1Matrix::new(rows, cols, data).unwrap();
        // Six tokens run as a group of four and a group of two; each must equal itself alone.
        let batch: Vec<f32> = (0..6).flat_map(|t| sample(cols, 99 + t)).collect();
        let among = m.forward(&Tensor::from_vec(batch.clone(), (6, cols), &Device::Cpu).unwrap()).unwrap();
        for (t, x) in batch.chunks(cols).enumerate() {
            let alone = m.forward(&Tensor::from_vec(x.to_vec(), (1, cols), &Device::Cpu).unwrap()).unwrap();
            assert_eq!(alone.get(0).unwrap().to_vec1::<f32>().unwrap(), among.get(t).unwrap().to_vec1::<f32>().unwrap(), "token {t}");
        }
    }
}

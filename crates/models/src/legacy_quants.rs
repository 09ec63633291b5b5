//! Matrix multiplication against ggml's 32-value block formats Q4_1, Q5_0 and Q5_1, with AVX2.
//!
//! candle 0.11 has SIMD dot products for Q4_0, Q8_0 and the k-quants but only scalar ones for
//! these: Q4_1 made ~75% of SmolLM2's decode time, and Q5_0 (what Q4_K_M files use for
//! matrices whose width is no multiple of 256, e.g. Qwen2.5-0.5B's 896) ~95% of Qwen2.5's.
//! This follows ggml's scheme: activations are quantized per block to 8 bits exactly as ggml's
//! x86 code does (so results match llama.cpp), and a block's dot product is
//! `d·d₈·Σ(q·q₈) + m·s₈`, with `q` offset by −16 and no minimum for Q5_0. Each output element is reduced in a fixed order, independent of how many
//! rows `x` has.

use candle_core::quantized::GgmlDType;
use candle_core::Tensor;
use half::f16;
use rayon::prelude::*;

use crate::dense::{check_cols, each_row};
use crate::error::{ModelError, Result};

const BLOCK: usize = 32;

/// Which block format a [`BlockMatrix`] holds.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum BlockFormat {
    /// f16 scale, f16 minimum, 16 bytes of nibbles: `d·q + m`, q in 0..16.
    Q4_1,
    /// f16 scale, 32 high bits, 16 bytes of nibbles: `d·(q − 16)`, q in 0..32.
    Q5_0,
    /// f16 scale, f16 minimum, 32 high bits, 16 bytes of nibbles: `d·q + m`, q in 0..32.
    Q5_1,
}

impl BlockFormat {
    pub fn of(dtype: GgmlDType) -> Option<Self> {
        match dtype {
            GgmlDType::Q4_1 => Some(Self::Q4_1),
            GgmlDType::Q5_0 => Some(Self::Q5_0),
            GgmlDType::Q5_1 => Some(Self::Q5_1),
            _ => None,
        }
    }

    #[inline(always)]
    fn block_bytes(self) -> usize {
        match self {
            Self::Q4_1 => 20,
            Self::Q5_0 => 22,
            Self::Q5_1 => 24,
        }
    }

    /// Where the packed nibbles start.
    #[inline(always)]
    fn nibbles_at(self) -> usize {
        self.block_bytes() - BLOCK / 2
    }

    /// The high (fifth) bits of the 32 values, bit `i` for value `i`.
    #[inline(always)]
    fn high_bits(self, b: &[u8]) -> u32 {
        match self {
            Self::Q4_1 => 0,
            Self::Q5_0 => u32::from_le_bytes([b[2], b[3], b[4], b[5]]),
            Self::Q5_1 => u32::from_le_bytes([b[4], b[5], b[6], b[7]]),
        }
    }

    /// The block's scale `d` and minimum `m` (0 for Q5_0).
    fn scales(self, b: &[u8]) -> (f32, f32) {
        let d = f16::from_le_bytes([b[0], b[1]]).to_f32();
        match self {
            Self::Q5_0 => (d, 0.0),
            Self::Q4_1 | Self::Q5_1 => (d, f16::from_le_bytes([b[2], b[3]]).to_f32()),
        }
    }

    /// Subtracted from every quant: Q5_0 is symmetric around 16.
    #[inline(always)]
    fn offset(self) -> u8 {
        if self == Self::Q5_0 {
            16
        } else {
            0
        }
    }

    /// The 32 unsigned quants of a block, in value order.
    fn quants(self, b: &[u8]) -> [u8; BLOCK] {
        let (nibbles, high) = (&b[self.nibbles_at()..], self.high_bits(b));
        std::array::from_fn(|i| {
            let nibble =
                if i < BLOCK / 2 { nibbles[i] & 0x0F } else { nibbles[i - BLOCK / 2] >> 4 };
            nibble | (((high >> i) & 1) as u8) << 4
        })
    }
}

/// A block-quantized matrix of `rows` outputs × `cols` inputs, in GGUF's block layout.
pub struct BlockMatrix {
    format: BlockFormat,
    rows: usize,
    cols: usize,
    data: Vec<u8>,
}

/// One block of 8-bit activations (ggml's Q8_1: Q8_0 plus `s = d·Σq`).
#[derive(Clone)]
struct Q8Block {
    d: f32,
    s: f32,
    qs: [i8; BLOCK],
}

impl BlockMatrix {
    pub fn new(format: BlockFormat, rows: usize, cols: usize, data: Vec<u8>) -> Result<Self> {
        if !cols.is_multiple_of(BLOCK) || data.len() != rows * cols / BLOCK * format.block_bytes() {
            return Err(ModelError::BadConfig(format!(
                "{format:?} tensor of {rows}x{cols} has {} bytes",
                data.len()
            )));
        }
        Ok(Self { format, rows, cols, data })
    }

    /// x: (tokens, cols) → (tokens, rows)
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        check_cols(x, self.rows, self.cols, "block-quantized matmul")?;
        let x: Vec<f32> = x.contiguous()?.flatten_all()?.to_vec1()?;
        let quantized: Vec<Vec<Q8Block>> = x.chunks(self.cols).map(quantize_q8_1).collect();
        let row_bytes = self.cols / BLOCK * self.format.block_bytes();
        let format = self.format;
        each_row(self.data.par_chunks(row_bytes), quantized.len(), self.rows, |w, out| {
            dot_rows(format, w, &quantized, out)
        })
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
fn dot_rows(format: BlockFormat, w: &[u8], xs: &[Vec<Q8Block>], out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2")
        && std::arch::is_x86_feature_detected!("fma")
        && std::arch::is_x86_feature_detected!("f16c")
    {
        // Tokens in groups: each weight block is unpacked once per group, and each token's
        // sum runs through the same steps in the same order as alone.
        let mut groups = xs.chunks(avx2::GROUP).zip(out.chunks_mut(avx2::GROUP));
        // SAFETY: the CPU supports the features the function is compiled for.
        groups
            .try_for_each(|(x, o)| unsafe { avx2::dot_row_group(format, w, x, o) })
            .expect("groups fit");
        return;
    }
    out.iter_mut().zip(xs).for_each(|(o, x)| *o = dot_row_scalar(format, w, x));
}

#[cfg(test)]
fn dot_row(format: BlockFormat, w: &[u8], x: &[Q8Block]) -> f32 {
    let mut out = [0f32];
    dot_rows(format, w, std::slice::from_ref(&x.to_vec()), &mut out);
    out[0]
}

fn dot_row_scalar(format: BlockFormat, w: &[u8], x: &[Q8Block]) -> f32 {
    let mut total = 0f32;
    for (b, xb) in w.chunks(format.block_bytes()).zip(x) {
        let (d, m) = format.scales(b);
        let offset = format.offset() as i32;
        let isum: i32 = format
            .quants(b)
            .iter()
            .zip(&xb.qs)
            .map(|(&q, &q8)| (q as i32 - offset) * q8 as i32)
            .sum();
        total += d * xb.d * isum as f32 + m * xb.s;
    }
    total
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    use super::{BlockFormat, Q8Block};

    /// Tokens per pass over a weight row.
    pub const GROUP: usize = 4;

    /// `out[t]` = `w` · `xs[t]` for up to [`GROUP`] tokens; `Err` for a bigger group.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn dot_row_group(
        format: BlockFormat,
        w: &[u8],
        xs: &[Vec<Q8Block>],
        out: &mut [f32],
    ) -> Result<(), ()> {
        if xs.len() > GROUP || out.len() != xs.len() {
            return Err(());
        }
        let (with_minimum, offset) = (format != BlockFormat::Q5_0, format.offset());
        let ones = _mm256_set1_epi16(1);
        let mut acc = [_mm256_setzero_ps(); GROUP];
        let mut mins = [0f32; GROUP];
        for (i, b) in w.chunks_exact(format.block_bytes()).enumerate() {
            // The f16 scale and (where the format has one) minimum, converted exactly.
            let scales =
                _mm_cvtph_ps(_mm_cvtsi32_si128(i32::from_le_bytes([b[0], b[1], b[2], b[3]])));
            let d = _mm_cvtss_f32(scales);
            let m = if with_minimum { _mm_cvtss_f32(_mm_movehdup_ps(scales)) } else { 0.0 };
            let q = quants(format, b, offset);
            for (t, x) in xs.iter().enumerate() {
                let xb = &x[i];
                let q8 = _mm256_loadu_si256(xb.qs.as_ptr() as *const __m256i);
                // maddubs multiplies unsigned by signed bytes: signed quants lend their sign
                // to the activations.
                let pairs = if offset == 0 {
                    _mm256_maddubs_epi16(q, q8)
                } else {
                    _mm256_maddubs_epi16(_mm256_sign_epi8(q, q), _mm256_sign_epi8(q8, q))
                };
                let sums = _mm256_cvtepi32_ps(_mm256_madd_epi16(pairs, ones));
                acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(d * xb.d), sums, acc[t]);
                if with_minimum {
                    mins[t] += m * xb.s;
                }
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

    /// A block's 32 quants as bytes in value order, less `offset`.
    #[target_feature(enable = "avx2")]
    unsafe fn quants(format: BlockFormat, b: &[u8], offset: u8) -> __m256i {
        let low_nibbles = _mm_set1_epi8(0x0F);
        let packed = _mm_loadu_si128(b.as_ptr().add(format.nibbles_at()) as *const __m128i);
        let lo = _mm_and_si128(packed, low_nibbles);
        let hi = _mm_and_si128(_mm_srli_epi16(packed, 4), low_nibbles);
        // Values 0..15 come from the low nibbles, 16..31 from the high ones.
        let mut q = _mm256_set_m128i(hi, lo);
        if format != BlockFormat::Q4_1 {
            q = _mm256_or_si256(
                q,
                _mm256_and_si256(spread_bits(format.high_bits(b)), _mm256_set1_epi8(0x10)),
            );
        }
        if offset != 0 {
            q = _mm256_sub_epi8(q, _mm256_set1_epi8(offset as i8));
        }
        q
    }

    /// Byte `i` is 0xFF where bit `i` of `bits` is set, else 0.
    #[target_feature(enable = "avx2")]
    unsafe fn spread_bits(bits: u32) -> __m256i {
        // Byte i receives byte i/8 of `bits`; OR-ing every bit but bit i%8 makes it all ones
        // exactly when that bit is set.
        let by_byte = _mm256_shuffle_epi8(
            _mm256_set1_epi32(bits as i32),
            _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0),
        );
        let others = _mm256_set1_epi64x(0x7fbfdfeff7fbfdfe);
        _mm256_cmpeq_epi8(_mm256_or_si256(by_byte, others), _mm256_set1_epi64x(-1))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::quantized::{GgmlDType, QTensor};
    use candle_core::Device;

    fn sample(n: usize, seed: u32) -> Vec<f32> {
        (0..n)
            .map(|i| {
                (((i as u32).wrapping_mul(2654435761).wrapping_add(seed) % 1000) as f32 / 500.0)
                    - 1.0
            })
            .collect()
    }

    const FORMATS: [(GgmlDType, BlockFormat); 3] = [
        (GgmlDType::Q4_1, BlockFormat::Q4_1),
        (GgmlDType::Q5_0, BlockFormat::Q5_0),
        (GgmlDType::Q5_1, BlockFormat::Q5_1),
    ];

    #[test]
    fn matches_the_exact_product_within_activation_quantization_error() {
        for (dtype, format) in FORMATS {
            matches_the_exact_product(dtype, format);
        }
    }

    fn matches_the_exact_product(dtype: GgmlDType, format: BlockFormat) {
        let (rows, cols, tokens) = (48, 128, 3);
        let w = Tensor::from_vec(sample(rows * cols, 7), (rows, cols), &Device::Cpu).unwrap();
        let q = QTensor::quantize(&w, dtype).unwrap();
        let ours = BlockMatrix::new(format, rows, cols, q.data().unwrap().to_vec()).unwrap();
        let dense = q.dequantize(&Device::Cpu).unwrap().to_vec2::<f32>().unwrap();
        let x = sample(tokens * cols, 3);
        let got = ours
            .forward(&Tensor::from_vec(x.clone(), (tokens, cols), &Device::Cpu).unwrap())
            .unwrap();
        let got = got.to_vec2::<f32>().unwrap();
        for (t, xs) in x.chunks(cols).enumerate() {
            let amax = xs.iter().fold(0f32, |a, v| a.max(v.abs()));
            for (r, w) in dense.iter().enumerate() {
                let exact: f32 = w.iter().zip(xs).map(|(a, b)| a * b).sum();
                // Rounding each activation to a multiple of amax/127 moves it by at most
                // amax/254; f16 scales add a little more.
                let bound = w.iter().map(|v| v.abs()).sum::<f32>() * amax / 254.0 * 1.01 + 1e-3;
                assert!(
                    (exact - got[t][r]).abs() <= bound,
                    "{format:?}: {exact} vs {} (bound {bound})",
                    got[t][r]
                );
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
    fn quants_decode_as_candle_dequantizes() {
        let (rows, cols) = (4, 64);
        let w = Tensor::from_vec(sample(rows * cols, 13), (rows, cols), &Device::Cpu).unwrap();
        for (dtype, format) in FORMATS {
            let q = QTensor::quantize(&w, dtype).unwrap();
            let dense = q
                .dequantize(&Device::Cpu)
                .unwrap()
                .flatten_all()
                .unwrap()
                .to_vec1::<f32>()
                .unwrap();
            let data = q.data().unwrap();
            let ours: Vec<f32> = data
                .chunks(format.block_bytes())
                .flat_map(|b| {
                    let (d, m) = format.scales(b);
                    format.quants(b).map(|q| d * (q as f32 - format.offset() as f32) + m)
                })
                .collect();
            assert_eq!(ours, dense, "{format:?}");
        }
    }

    #[test]
    fn simd_and_scalar_agree_and_rows_are_batch_invariant() {
        for (dtype, format) in FORMATS {
            simd_and_scalar_agree_and_batch_invariant(dtype, format);
        }
    }

    fn simd_and_scalar_agree_and_batch_invariant(dtype: GgmlDType, format: BlockFormat) {
        let (rows, cols) = (16, 256);
        let w = Tensor::from_vec(sample(rows * cols, 11), (rows, cols), &Device::Cpu).unwrap();
        let data = QTensor::quantize(&w, dtype).unwrap().data().unwrap().to_vec();
        let x = sample(cols, 5);
        let xq = quantize_q8_1(&x);
        let row = &data[..cols / BLOCK * format.block_bytes()];
        let (simd, scalar) = (dot_row(format, row, &xq), dot_row_scalar(format, row, &xq));
        assert!((simd - scalar).abs() < 1e-3, "{format:?}: {simd} vs {scalar}");
        let m = BlockMatrix::new(format, rows, cols, data).unwrap();
        // Six tokens run as a group of four and a group of two; each must equal itself alone.
        let batch: Vec<f32> = (0..6).flat_map(|t| sample(cols, 99 + t)).collect();
        let among =
            m.forward(&Tensor::from_vec(batch.clone(), (6, cols), &Device::Cpu).unwrap()).unwrap();
        for (t, x) in batch.chunks(cols).enumerate() {
            let alone =
                m.forward(&Tensor::from_vec(x.to_vec(), (1, cols), &Device::Cpu).unwrap()).unwrap();
            assert_eq!(
                alone.get(0).unwrap().to_vec1::<f32>().unwrap(),
                among.get(t).unwrap().to_vec1::<f32>().unwrap(),
                "{format:?} token {t}"
            );
        }
    }
}

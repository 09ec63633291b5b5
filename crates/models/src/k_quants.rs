//! What the K-quant kernels (`q4_k`, `q6_k`) share: activations quantized to 8 bits per
//! 256-value block, and the product's outer loop over 16-row tiles and groups of tokens.
//!
//! Each output is reduced block by block in the same order whatever tokens share its pass, so a
//! token's results do not depend on its batch.

use candle_core::{Device, Tensor};
use rayon::prelude::*;

use crate::dense::{check_cols, with_values, SharedOutput};
use crate::error::Result;
use crate::isa::Isa;

/// Values per K-quant block.
pub(crate) const BLOCK: usize = 256;
/// Weight rows per tile: one AVX-512 register of 32-bit sums.
pub(crate) const TILE_ROWS: usize = 16;
/// Tokens sharing one pass over a tile: a verification pass of up to 7 draft rows reads its
/// weights once.
pub(crate) const GROUP: usize = 8;
/// Smaller matrices run on the calling thread: handing them to the pool costs more than it
/// saves (and MoE experts already run in parallel with each other).
const PARALLEL_MIN_WEIGHTS: usize = 1 << 21;
/// Inputs quantized in parallel from this many values (a prefill chunk, not a decode step).
const PARALLEL_MIN_VALUES: usize = 1 << 17;

/// The copy of the K-quant kernels this machine runs: portable, AVX2 (`vpmaddubsw` into 16-bit
/// sub-block sums, scaled by `vpmaddwd`), or AVX-512 (`vpdpbusd` on whole 16-row tiles). Every
/// copy performs the portable reference's integer and float operations in its order, so all
/// give the same bits (tested).
pub(crate) fn best_copy() -> Isa {
    Isa::best().for_integer_dots()
}

/// Whether this CPU runs the K-quant kernels (AVX2 or AVX-512 VNNI; others keep candle's).
pub fn supported() -> bool {
    best_copy() != Isa::Portable
}

/// Whether a `rows × cols` matrix fits the tiling.
pub(crate) fn fits(rows: usize, cols: usize) -> bool {
    rows.is_multiple_of(TILE_ROWS) && cols.is_multiple_of(BLOCK) && rows > 0 && cols > 0
}

/// Sums of 16 tile rows for up to [`GROUP`] tokens: `sums[t][r]`.
pub(crate) type TileSums = [[f32; TILE_ROWS]; GROUP];

/// `x (tokens, cols) → (tokens, rows)`: `tile_dot(tile, acts, extra, first, group, sums)`
/// fills the sums of tile `tile` for tokens `first..first + group`; `extra` is what `prepare`
/// derives from the quantized activations once per product.
pub(crate) fn tiled_product<E: Sync>(
    x: &Tensor,
    rows: usize,
    cols: usize,
    name: &'static str,
    prepare: impl FnOnce(&Activations) -> E,
    tile_dot: impl Fn(usize, &Activations, &E, usize, usize, &mut TileSums) + Sync,
) -> Result<Tensor> {
    check_cols(x, rows, cols, name)?;
    let acts = with_values(x, |x| Ok(Activations::quantize(x, cols)))?;
    let extra = prepare(&acts);
    let tokens = acts.tokens();
    let mut out = vec![0f32; tokens * rows];
    let target = SharedOutput::new(&mut out);
    let tile_outputs = |tile: usize| {
        let target = &target;
        for first in (0..tokens).step_by(GROUP) {
            let group = GROUP.min(tokens - first);
            let mut sums = [[0f32; TILE_ROWS]; GROUP];
            tile_dot(tile, &acts, &extra, first, group, &mut sums);
            for (t, row_sums) in sums[..group].iter().enumerate() {
                let at = (first + t) * rows + tile * TILE_ROWS;
                // SAFETY: only this tile's task writes these 16 columns.
                unsafe { target.write(at, row_sums) };
            }
        }
    };
    let tiles = rows / TILE_ROWS;
    if rows * cols >= PARALLEL_MIN_WEIGHTS {
        (0..tiles).into_par_iter().for_each(tile_outputs);
    } else {
        (0..tiles).for_each(tile_outputs);
    }
    Ok(Tensor::from_vec(out, (tokens, rows), &Device::Cpu)?)
}

/// For the kernels' tests: `product` of `q` (rows × cols) on 3 tokens is the product of the
/// dequantized weights within what the 8-bit activations move it: each activation by at most
/// half a level (amax/254 of its block).
#[cfg(test)]
pub(crate) fn assert_within_activation_rounding(
    q: &candle_core::quantized::QTensor,
    product: impl Fn(&Tensor) -> Result<Tensor>,
) {
    let (rows, cols) = q.shape().dims2().unwrap();
    let tokens = 3;
    let dense = q.dequantize(&Device::Cpu).unwrap().to_vec2::<f32>().unwrap();
    let x = crate::test_data::sample(tokens * cols, 3);
    let input = Tensor::from_vec(x.clone(), (tokens, cols), &Device::Cpu).unwrap();
    let got = product(&input).unwrap().to_vec2::<f32>().unwrap();
    assert_eq!((got.len(), got[0].len()), (tokens, rows));
    for (t, xs) in x.chunks(cols).enumerate() {
        for (r, w) in dense.iter().enumerate() {
            let exact: f32 = w.iter().zip(xs).map(|(a, b)| a * b).sum();
            let bound = w.iter().zip(xs.chunks(BLOCK).flat_map(|b| {
                let amax = b.iter().fold(0f32, |a, v| a.max(v.abs()));
                std::iter::repeat_n(amax / 254.0, BLOCK)
            }));
            let bound = bound.map(|(w, e)| w.abs() * e).sum::<f32>() * 1.01 + 1e-4;
            assert!(
                (exact - got[t][r]).abs() <= bound,
                "({t}, {r}): {exact} vs {} (bound {bound})",
                got[t][r]
            );
        }
    }
}

/// For the kernels' tests: on every kernel copy, `product` of 64 tokens (extreme values
/// among them) gives `reference`'s bits (`[token][row]` from the quantized activations), and
/// runs of 1–5 and 13 tokens from the fourth, and each token alone, give the same bits as in
/// the batch of 64.
#[cfg(test)]
pub(crate) fn assert_copies_give_the_reference_in_any_batch(
    rows: usize,
    cols: usize,
    product: impl Fn(&Tensor, Isa) -> Result<Tensor>,
    reference: impl Fn(&Activations) -> Vec<Vec<f32>>,
) {
    let tokens = 64;
    let mut batch: Vec<f32> =
        (0..tokens).flat_map(|t| crate::test_data::sample(cols, 99 + t)).collect();
    batch[5] = 1e4;
    batch[cols + 7] = -1e4;
    batch[2 * cols..2 * cols + BLOCK].fill(0.0);
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    let want: Vec<Vec<u32>> =
        reference(&Activations::quantize(&batch, cols)).iter().map(|r| bits(r)).collect();
    assert_eq!((want.len(), want[0].len()), (tokens as usize, rows));
    let kernels = Isa::integer_dot_copies();
    assert!(kernels.len() > 1 || !cfg!(target_arch = "x86_64"), "no SIMD copy ran");
    for kernel in kernels {
        let run = |from: usize, n: usize| -> Vec<Vec<u32>> {
            let x = batch[from * cols..(from + n) * cols].to_vec();
            let y = product(&Tensor::from_vec(x, (n, cols), &Device::Cpu).unwrap(), kernel);
            y.unwrap().to_vec2::<f32>().unwrap().iter().map(|r| bits(r)).collect()
        };
        assert!(run(0, tokens as usize) == want, "{kernel:?}: 64 tokens differ from the reference");
        for n in [1, 2, 3, 4, 5, 13] {
            assert!(run(3, n) == want[3..3 + n], "{kernel:?}: {n} tokens differ");
        }
        for (t, want) in want.iter().enumerate() {
            assert!(run(t, 1)[0] == *want, "{kernel:?}: token {t} alone differs");
        }
    }
}

/// For the kernels' tests: on every kernel copy, each token of a pass of 1..=[`GROUP`] tokens
/// at every offset in a batch of [`GROUP`] gets the bits it gets in a pass of its own (a
/// verification pass of k drafts is k + 1 rows: each must round as it would alone).
/// `tile_dot(kernel, acts, first, group, sums)` is one pass over one tile.
#[cfg(test)]
pub(crate) fn assert_a_tokens_bits_in_a_pass_are_its_bits_alone(
    cols: usize,
    tile_dot: impl Fn(Isa, &Activations, usize, usize, &mut TileSums),
) {
    let batch: Vec<f32> =
        (0..GROUP as u32).flat_map(|t| crate::test_data::sample(cols, 31 + t)).collect();
    let acts = Activations::quantize(&batch, cols);
    let bits = |s: &[f32; TILE_ROWS]| s.map(f32::to_bits);
    for kernel in Isa::integer_dot_copies() {
        let pass = |first, group| {
            let mut sums = [[0f32; TILE_ROWS]; GROUP];
            tile_dot(kernel, &acts, first, group, &mut sums);
            sums
        };
        let alone: Vec<_> = (0..GROUP).map(|t| bits(&pass(t, 1)[0])).collect();
        for group in 1..=GROUP {
            for first in 0..=GROUP - group {
                for (t, sums) in pass(first, group)[..group].iter().enumerate() {
                    assert_eq!(
                        bits(sums),
                        alone[first + t],
                        "{kernel:?}: token {t} of {group} from {first}"
                    );
                }
            }
        }
    }
}

/// Activations quantized to 8 bits per 256-value block, one token after another.
pub(crate) struct Activations {
    pub cols: usize,
    /// Per block: the step between quantization levels.
    pub d: Vec<f32>,
    pub quants: Vec<i8>,
    /// Per block and sub-block pair: the sums of the two sub-blocks' quants as an i16 pair.
    pub pair_sums: Vec<i32>,
}

impl Activations {
    /// `x` is `(tokens, cols)` row-major; `cols` a multiple of 256. Symmetric rounding to
    /// the nearest level (ties to even) of `amax / 127`.
    pub fn quantize(x: &[f32], cols: usize) -> Self {
        let blocks = x.len() / BLOCK;
        let mut out = Self {
            cols,
            d: vec![0.0; blocks],
            quants: vec![0; x.len()],
            pair_sums: vec![0; blocks * 4],
        };
        let kernel = best_copy();
        let quantize =
            |(((xs, qs), d), sums): BlockSlices| *d = quantize_block(kernel, xs, qs, sums);
        if x.len() >= PARALLEL_MIN_VALUES {
            let blocks =
                x.par_chunks(BLOCK).zip(out.quants.par_chunks_mut(BLOCK)).zip(out.d.par_iter_mut());
            blocks.zip(out.pair_sums.par_chunks_mut(4)).with_min_len(16).for_each(quantize);
        } else {
            let blocks = x.chunks(BLOCK).zip(out.quants.chunks_mut(BLOCK)).zip(out.d.iter_mut());
            blocks.zip(out.pair_sums.chunks_mut(4)).for_each(quantize);
        }
        out
    }

    pub fn tokens(&self) -> usize {
        self.quants.len() / self.cols.max(1)
    }
}

/// Quantizes one block into `qs` and the sums of its sub-block pairs; returns its step.
/// `kernel` is [`best_copy`] or one of the copies the tests compare.
fn quantize_block(kernel: Isa, xs: &[f32], qs: &mut [i8], pair_sums: &mut [i32]) -> f32 {
    debug_assert_eq!(kernel, kernel.for_integer_dots(), "not a copy of the integer kernels");
    match kernel {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `Isa::for_integer_dots` found the features the function is compiled for.
        Isa::Avx512 => unsafe { vnni::quantize_block(xs, qs, pair_sums) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as above.
        Isa::Avx2 => unsafe { avx2::quantize_block(xs, qs, pair_sums) },
        _ => quantize_block_reference(xs, qs, pair_sums),
    }
}

fn quantize_block_reference(xs: &[f32], qs: &mut [i8], pair_sums: &mut [i32]) -> f32 {
    let amax = xs.iter().fold(0f32, |a, v| a.max(v.abs()));
    let inverse = if amax > 0.0 { 127.0 / amax } else { 0.0 };
    for (q, v) in qs.iter_mut().zip(xs) {
        *q = (v * inverse).round_ties_even() as i8;
    }
    for (pair, sums) in qs.chunks_exact(64).zip(pair_sums) {
        let sum = |s: &[i8]| s.iter().map(|&q| q as i32).sum::<i32>();
        *sums = (sum(&pair[..32]) & 0xFFFF) | (sum(&pair[32..]) << 16);
    }
    if amax > 0.0 {
        1.0 / inverse
    } else {
        0.0
    }
}

/// One block's input, quants, step and pair sums.
type BlockSlices<'a> = (((&'a [f32], &'a mut [i8]), &'a mut f32), &'a mut [i32]);

#[cfg(target_arch = "x86_64")]
mod vnni {
    use std::arch::x86_64::*;

    use super::BLOCK;

    /// [`super::quantize_block_reference`], 16 values at a time (`vcvtps2dq` rounds to
    /// nearest even, as `round_ties_even`).
    #[target_feature(enable = "avx512f,avx512bw")]
    pub unsafe fn quantize_block(xs: &[f32], qs: &mut [i8], pair_sums: &mut [i32]) -> f32 {
        assert!(xs.len() == BLOCK && qs.len() == BLOCK && pair_sums.len() == 4);
        let mut amax = _mm512_setzero_ps();
        for i in 0..BLOCK / 16 {
            amax = _mm512_max_ps(amax, _mm512_abs_ps(_mm512_loadu_ps(xs.as_ptr().add(16 * i))));
        }
        let amax = _mm512_reduce_max_ps(amax);
        let inverse = if amax > 0.0 { 127.0 / amax } else { 0.0 };
        let scale = _mm512_set1_ps(inverse);
        for (half, sums) in pair_sums.iter_mut().enumerate() {
            let mut sub_sums = [0i32; 2];
            for (sub, sum) in sub_sums.iter_mut().enumerate() {
                let mut acc = _mm512_setzero_si512();
                for j in 0..2 {
                    let at = half * 64 + sub * 32 + j * 16;
                    let q = _mm512_cvtps_epi32(_mm512_mul_ps(
                        _mm512_loadu_ps(xs.as_ptr().add(at)),
                        scale,
                    ));
                    _mm_storeu_si128(
                        qs.as_mut_ptr().add(at) as *mut __m128i,
                        _mm512_cvtsepi32_epi8(q),
                    );
                    acc = _mm512_add_epi32(acc, q);
                }
                *sum = _mm512_reduce_add_epi32(acc);
            }
            *sums = (sub_sums[0] & 0xFFFF) | (sub_sums[1] << 16);
        }
        if amax > 0.0 {
            1.0 / inverse
        } else {
            0.0
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    use super::BLOCK;

    /// [`super::quantize_block_reference`], 8 values at a time (`vcvtps2dq` rounds to
    /// nearest even, as `round_ties_even`; the levels lie within ±127, so packing does not
    /// saturate).
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn quantize_block(xs: &[f32], qs: &mut [i8], pair_sums: &mut [i32]) -> f32 {
        assert!(xs.len() == BLOCK && qs.len() == BLOCK && pair_sums.len() == 4);
        let sign = _mm256_set1_ps(-0.0);
        let mut amax = _mm256_setzero_ps();
        for i in 0..BLOCK / 8 {
            let x = _mm256_andnot_ps(sign, _mm256_loadu_ps(xs.as_ptr().add(8 * i)));
            amax = _mm256_max_ps(amax, x);
        }
        let amax = _mm_max_ps(_mm256_castps256_ps128(amax), _mm256_extractf128_ps(amax, 1));
        let amax = _mm_max_ps(amax, _mm_movehl_ps(amax, amax));
        let amax = _mm_cvtss_f32(_mm_max_ss(amax, _mm_shuffle_ps(amax, amax, 1)));
        let inverse = if amax > 0.0 { 127.0 / amax } else { 0.0 };
        let scale = _mm256_set1_ps(inverse);
        // `packs` interleaves 128-bit lanes; this puts the 32 bytes back in order.
        let order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
        let ones = _mm256_set1_epi16(1);
        for (half, sums) in pair_sums.iter_mut().enumerate() {
            let mut sub_sums = [0i32; 2];
            for (sub, sum) in sub_sums.iter_mut().enumerate() {
                let at = half * 64 + sub * 32;
                let q = |j: usize| {
                    let x = _mm256_loadu_ps(xs.as_ptr().add(at + 8 * j));
                    _mm256_cvtps_epi32(_mm256_mul_ps(x, scale))
                };
                let words = [_mm256_packs_epi32(q(0), q(1)), _mm256_packs_epi32(q(2), q(3))];
                let bytes = _mm256_packs_epi16(words[0], words[1]);
                let bytes = _mm256_permutevar8x32_epi32(bytes, order);
                _mm256_storeu_si256(qs.as_mut_ptr().add(at) as *mut __m256i, bytes);
                let s = _mm256_madd_epi16(_mm256_add_epi16(words[0], words[1]), ones);
                let s = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
                let s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0b01_00_11_10));
                *sum = _mm_cvtsi128_si32(_mm_add_epi32(s, _mm_shuffle_epi32(s, 0b10_11_00_01)));
            }
            *sums = (sub_sums[0] & 0xFFFF) | (sub_sums[1] << 16);
        }
        if amax > 0.0 {
            1.0 / inverse
        } else {
            0.0
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_data::sample;

    #[test]
    fn simd_quantization_equals_the_reference() {
        let mut x = sample(BLOCK * 3, 5);
        x[7] = -3.5;
        x[BLOCK..2 * BLOCK].fill(0.0);
        x[2 * BLOCK + 9] = f32::MIN_POSITIVE;
        for kernel in Isa::integer_dot_copies() {
            for xs in x.chunks(BLOCK) {
                let (mut qa, mut qb, mut sa, mut sb) =
                    ([0i8; BLOCK], [0i8; BLOCK], [0i32; 4], [0i32; 4]);
                let da = quantize_block(kernel, xs, &mut qa, &mut sa);
                let db = quantize_block_reference(xs, &mut qb, &mut sb);
                assert_eq!((da.to_bits(), qa, sa), (db.to_bits(), qb, sb), "{kernel:?}");
            }
        }
    }
}

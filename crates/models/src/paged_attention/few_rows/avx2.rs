//! The few-row layout on AVX2: 8 keys' scores of one row per register, from keys transposed 8
//! at a time; the same arithmetic in the same order as the AVX-512 copy and the wide layout.

use std::arch::x86_64::*;

use std::ops::Range;

use super::{attend_with, online, score_with, ChunkScorer, HeadRunsSlice, Isa, Rows};

/// Keys per register.
pub(super) const KEY_LANES: usize = 8;
/// Blocks of 8 keys scored together (independent chains of fused multiply-adds per row; with
/// four rows, their sums and the keys fill the 16 registers but one).
const BLOCKS_AT_ONCE: usize = 2;
/// Keys scored together.
const CHUNK: usize = KEY_LANES * BLOCKS_AT_ONCE;

/// [`super::attend`] on AVX2.
///
/// # Safety
/// The CPU runs AVX2, FMA and F16C; [`super::takes`] allows the task.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn attend(
    runs: HeadRunsSlice<'_>,
    rows: &Rows<'_>,
    d: usize,
    scale: f32,
) -> Vec<f32> {
    // SAFETY: this function's features; the caller's promise.
    unsafe { attend_with(Isa::Avx2, runs, rows, d, scale) }
}

/// [`super::softmax`] on AVX2.
#[target_feature(enable = "avx2,fma")]
pub(super) fn softmax(
    probs: &mut [f32],
    tiles: &[Range<usize>],
    range: (usize, usize),
    factors: &mut [f32],
) -> f32 {
    online::row_softmax(probs, tiles, range, factors)
}

/// [`super::score`] on AVX2.
///
/// # Safety
/// The CPU runs AVX2, FMA and F16C; `d` is a multiple of 8.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn score(
    runs: HeadRunsSlice<'_>,
    queries: &[&[f32]],
    d: usize,
    scale: f32,
    probs: &mut [f32],
) {
    // SAFETY: this function's features; the caller's promise.
    unsafe { score_with::<Avx2Chunks>(runs, queries, d, scale, probs) }
}

/// The AVX2 copy: 8 keys per register, two registers per row at once.
struct Avx2Chunks;

impl ChunkScorer for Avx2Chunks {
    const ISA: Isa = Isa::Avx2;
    const KEY_LANES: usize = KEY_LANES;
    const CHUNK: usize = CHUNK;

    #[inline(always)]
    unsafe fn transpose(keys: &[f32], d: usize, transposed: &mut [f32]) {
        // SAFETY: the caller's promise.
        unsafe { transpose(keys, d, transposed) }
    }

    #[inline(always)]
    unsafe fn scaled_scores<const ROWS: usize>(
        transposed: &[f32],
        queries: [&[f32]; ROWS],
        d: usize,
        scale: f32,
        scaled: &mut [[f32; super::CHUNK]; ROWS],
    ) {
        // SAFETY: the caller's promise.
        let sums = unsafe { scores::<ROWS>(transposed, queries, d) };
        for (sums, scaled) in sums.iter().zip(scaled) {
            for (sum, out) in sums.iter().zip(scaled.chunks_exact_mut(KEY_LANES)) {
                // SAFETY: 8 floats out; the caller's promise.
                unsafe {
                    _mm256_storeu_ps(out.as_mut_ptr(), _mm256_mul_ps(*sum, _mm256_set1_ps(scale)))
                };
            }
        }
    }
}

/// Per row and key of the transposed chunk, `Σ_c query[c] · key[c]`, one fused chain in
/// dimension order (the keys past the chunk's end are zero; their scores are not kept).
#[target_feature(enable = "avx2,fma")]
#[inline]
fn scores<const ROWS: usize>(
    transposed: &[f32],
    queries: [&[f32]; ROWS],
    d: usize,
) -> [[__m256; BLOCKS_AT_ONCE]; ROWS] {
    assert!(transposed.len() == CHUNK * d && queries.iter().all(|q| q.len() == d));
    let mut sums = [[_mm256_setzero_ps(); BLOCKS_AT_ONCE]; ROWS];
    for c in 0..d {
        // SAFETY: block `b`'s dimension `c` is 8 floats inside `transposed`.
        let keys: [__m256; BLOCKS_AT_ONCE] = std::array::from_fn(|b| unsafe {
            _mm256_loadu_ps(transposed.as_ptr().add((b * d + c) * KEY_LANES))
        });
        for (sums, q) in sums.iter_mut().zip(queries) {
            // SAFETY: `c < d = q.len()`.
            let x = _mm256_set1_ps(unsafe { *q.get_unchecked(c) });
            for (s, k) in sums.iter_mut().zip(keys) {
                *s = _mm256_fmadd_ps(x, k, *s);
            }
        }
    }
    sums
}

/// Writes the keys `keys` (`m × d`, `m ≤ CHUNK`) transposed in blocks of 8: block `b`'s
/// dimension `c` holds keys `8b..8b + 8` at `transposed[(b·d + c)·8..]`, missing keys zero.
#[target_feature(enable = "avx2")]
fn transpose(keys: &[f32], d: usize, transposed: &mut [f32]) {
    let m = keys.len() / d;
    assert!(m <= CHUNK && d.is_multiple_of(KEY_LANES) && transposed.len() == CHUNK * d);
    for (b, out) in transposed.chunks_exact_mut(d * KEY_LANES).enumerate() {
        let present = m.saturating_sub(b * KEY_LANES).min(KEY_LANES);
        for c in (0..d).step_by(KEY_LANES) {
            let mut tile = [_mm256_setzero_ps(); KEY_LANES];
            for (j, row) in tile.iter_mut().enumerate().take(present) {
                // SAFETY: key `8b + j < m` has `d` values, `c + 8 ≤ d`.
                *row = unsafe { _mm256_loadu_ps(keys.as_ptr().add((b * KEY_LANES + j) * d + c)) };
            }
            for (i, column) in transpose8(tile).iter().enumerate() {
                // SAFETY: `c + i < d` rows of 8 in `out`.
                unsafe { _mm256_storeu_ps(out.as_mut_ptr().add((c + i) * KEY_LANES), *column) };
            }
        }
    }
}

/// The 8 × 8 transpose: pairs of rows interleaved, then pairs of pairs, then the 128-bit halves
/// exchanged.
#[target_feature(enable = "avx2")]
#[inline]
fn transpose8(r: [__m256; 8]) -> [__m256; 8] {
    let mut t = [_mm256_setzero_ps(); 8];
    for i in (0..8).step_by(2) {
        t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
        t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
    }
    let mut u = [_mm256_setzero_ps(); 8];
    for i in [0, 4] {
        u[i] = _mm256_shuffle_ps::<0x44>(t[i], t[i + 2]);
        u[i + 1] = _mm256_shuffle_ps::<0xEE>(t[i], t[i + 2]);
        u[i + 2] = _mm256_shuffle_ps::<0x44>(t[i + 1], t[i + 3]);
        u[i + 3] = _mm256_shuffle_ps::<0xEE>(t[i + 1], t[i + 3]);
    }
    for k in 0..4 {
        t[k] = _mm256_permute2f128_ps::<0x20>(u[k], u[k + 4]);
        t[k + 4] = _mm256_permute2f128_ps::<0x31>(u[k], u[k + 4]);
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_data::sample;

    #[test]
    fn keys_transpose_in_full_and_partial_blocks() {
        if !matches!(Isa::best(), Isa::Avx2 | Isa::Avx512) {
            return;
        }
        let d = 24;
        for m in [1, 7, 8, 9, CHUNK] {
            let keys = sample(m * d, m as u32);
            let mut got = vec![f32::NAN; CHUNK * d];
            // SAFETY: the CPU runs AVX2 (checked above).
            unsafe { transpose(&keys, d, &mut got) };
            for j in 0..CHUNK {
                for c in 0..d {
                    let (b, lane) = (j / KEY_LANES, j % KEY_LANES);
                    let want = if j < m { keys[j * d + c] } else { 0.0 };
                    assert_eq!(got[(b * d + c) * KEY_LANES + lane], want, "{m} keys, {j}, {c}");
                }
            }
        }
    }
}

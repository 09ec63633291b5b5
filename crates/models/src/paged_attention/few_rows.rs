//! Attention of a task with few query rows: a decode step, where a key/value head serves one to
//! four query heads. The wide layout keeps one row per lane, so such a task would leave most
//! lanes idle; here one register holds 16 keys' scores of one row on AVX-512 (8 on AVX2:
//! `avx2`), from keys transposed a register's width at a time. The arithmetic is the wide
//! layout's in the same order (a score is one fused chain over the dimensions, scaled after;
//! the softmax is the same online recurrence over the same tiles, [`super::online`]; the
//! outputs add `p·v` key by key), so a row gets the same bits on either path.

mod avx2;

use std::arch::x86_64::*;

use std::ops::Range;

use super::{online, outputs, HeadRunsSlice, Isa, Rows, PREFETCH_RUNS};

/// Query rows a task may have to take this path.
pub(super) const FEW_ROWS: usize = 4;
/// Keys per register.
const KEY_LANES: usize = 16;
/// Blocks of 16 keys scored together (independent chains of fused multiply-adds per row).
const BLOCKS_AT_ONCE: usize = 4;
/// Keys scored together.
const CHUNK: usize = KEY_LANES * BLOCKS_AT_ONCE;

/// Whether a task of `rows` rows of `d` dimensions takes this layout on `isa`: whole registers
/// of dimensions.
pub(super) fn takes(isa: Isa, rows: usize, d: usize) -> bool {
    let lanes = match isa {
        Isa::Avx512 => KEY_LANES,
        Isa::Avx2 => avx2::KEY_LANES,
        Isa::Portable => return false,
    };
    rows <= FEW_ROWS && d.is_multiple_of(lanes)
}

/// The outputs (`rows × d`) of up to [`FEW_ROWS`] rows over the keys of `runs`, by the copy for
/// `isa`.
///
/// # Safety
/// The CPU runs `isa`; [`takes`] allows the task.
pub(super) unsafe fn attend(
    isa: Isa,
    runs: HeadRunsSlice<'_>,
    rows: &Rows<'_>,
    d: usize,
    scale: f32,
) -> Vec<f32> {
    match isa {
        // SAFETY: the caller's promise.
        Isa::Avx512 => unsafe { attend_avx512(runs, rows, d, scale) },
        // SAFETY: as above.
        _ => unsafe { avx2::attend(runs, rows, d, scale) },
    }
}

/// [`attend_with`] compiled for AVX-512.
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
unsafe fn attend_avx512(
    runs: HeadRunsSlice<'_>,
    rows: &Rows<'_>,
    d: usize,
    scale: f32,
) -> Vec<f32> {
    // SAFETY: this function's features; the caller's promise.
    unsafe { attend_with(Isa::Avx512, runs, rows, d, scale) }
}

/// The scores, the softmax row by row, then the outputs tile by tile. Probabilities are kept
/// row by row (`rows × keys`).
///
/// # Safety
/// The CPU runs `isa`, which the caller is compiled for; [`takes`] allows the task.
#[inline(always)]
unsafe fn attend_with(
    isa: Isa,
    runs: HeadRunsSlice<'_>,
    rows: &Rows<'_>,
    d: usize,
    scale: f32,
) -> Vec<f32> {
    let keys: usize = runs.iter().map(|(k, _)| k.values() / d).sum();
    let count = rows.queries.len();
    let mut probs = vec![0f32; count * keys];
    // SAFETY: the caller's promise.
    unsafe { score(isa, runs, &rows.queries, d, scale, &mut probs) };
    let spans = online::tiles(rows.base, keys);
    let mut factors = vec![1f32; count * spans.len()];
    let mut sums = vec![0f32; count];
    for (r, &range) in rows.ranges.iter().enumerate() {
        let row = &mut probs[r * keys..][..keys];
        let factors = &mut factors[r * spans.len()..][..spans.len()];
        sums[r] = online::row_softmax(row, &spans, range, factors);
    }
    let (parts, tiles) = online::tiled(runs, d, rows.base);
    assert_eq!(tiles.len(), spans.len(), "tiles of {keys} keys");
    let mut out = vec![0f32; count * d];
    let mut scratch = Vec::new();
    let mut first = 0;
    for (t, tile) in tiles.iter().enumerate() {
        for (r, o) in out.chunks_exact_mut(d).enumerate() {
            online::rescale(o, factors[r * spans.len() + t]);
        }
        for i in tile.clone() {
            if let Some((_, ahead)) = parts.get(i + PREFETCH_RUNS) {
                ahead.prefetch();
            }
            let values = parts[i].1.to_f32_on(isa, &mut scratch);
            // SAFETY: the caller's promise.
            unsafe { outputs::add_on(isa, values, &probs[first..], (1, keys), d, &mut out) };
            first += values.len() / d;
        }
    }
    for (o, &sum) in out.chunks_exact_mut(d).zip(&sums) {
        online::finish(o, sum);
    }
    out
}

/// `probs[r · keys + j]` = `scale · Σ_c queries[r][c] · key j[c]` for the `keys` keys of `runs`,
/// up to [`FEW_ROWS`] rows, by the copy for `isa`.
///
/// # Safety
/// The CPU runs `isa`; [`takes`] allows the rows.
pub(super) unsafe fn score(
    isa: Isa,
    runs: HeadRunsSlice<'_>,
    queries: &[&[f32]],
    d: usize,
    scale: f32,
    probs: &mut [f32],
) {
    match isa {
        // SAFETY: the caller's promise.
        Isa::Avx512 => unsafe { score_avx512(runs, queries, d, scale, probs) },
        // SAFETY: as above.
        _ => unsafe { avx2::score(runs, queries, d, scale, probs) },
    }
}

/// [`score`] on AVX-512.
///
/// # Safety
/// The CPU runs AVX-512F (with the AVX2 set); `d` is a multiple of 16.
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
unsafe fn score_avx512(
    runs: HeadRunsSlice<'_>,
    queries: &[&[f32]],
    d: usize,
    scale: f32,
    probs: &mut [f32],
) {
    // SAFETY: this function's features; the caller's promise.
    unsafe { score_with::<Avx512Chunks>(runs, queries, d, scale, probs) }
}

/// What the AVX-512 and AVX2 copies of the scoring differ in: the keys a register and a chunk
/// hold, and how a chunk is transposed and scored.
pub(super) trait ChunkScorer {
    /// The instruction set the copy runs on.
    const ISA: Isa;
    /// Keys per register.
    const KEY_LANES: usize;
    /// Keys scored together, at most [`CHUNK`].
    const CHUNK: usize;

    /// The keys `keys` (`m × d`, `m ≤ Self::CHUNK`) transposed into `transposed`
    /// (`Self::CHUNK × d`) a register of keys at a time, missing keys zero.
    ///
    /// # Safety
    /// The CPU runs `Self::ISA`.
    unsafe fn transpose(keys: &[f32], d: usize, transposed: &mut [f32]);

    /// Per row, the scores of the transposed chunk's keys times `scale`, in
    /// `scaled[r][..Self::CHUNK]`.
    ///
    /// # Safety
    /// The CPU runs `Self::ISA`.
    unsafe fn scaled_scores<const ROWS: usize>(
        transposed: &[f32],
        queries: [&[f32]; ROWS],
        d: usize,
        scale: f32,
        scaled: &mut [[f32; CHUNK]; ROWS],
    );
}

/// [`score`] by the copy `S`, for the row count at hand.
///
/// # Safety
/// The CPU runs `S::ISA`, which the caller is compiled for.
#[inline(always)]
pub(super) unsafe fn score_with<S: ChunkScorer>(
    runs: HeadRunsSlice<'_>,
    queries: &[&[f32]],
    d: usize,
    scale: f32,
    probs: &mut [f32],
) {
    assert!(d.is_multiple_of(S::KEY_LANES), "head size {d}");
    // SAFETY: the caller's promise.
    unsafe {
        match queries.len() {
            1 => score_rows::<S, 1>(runs, queries, d, scale, probs),
            2 => score_rows::<S, 2>(runs, queries, d, scale, probs),
            3 => score_rows::<S, 3>(runs, queries, d, scale, probs),
            count => {
                assert_eq!(count, FEW_ROWS, "few-row attention of {count} rows");
                score_rows::<S, FEW_ROWS>(runs, queries, d, scale, probs)
            }
        }
    }
}

/// [`score_with`] chunk by chunk: keys gathered across runs, then transposed and scored.
///
/// # Safety
/// As [`score_with`].
#[inline(always)]
unsafe fn score_rows<S: ChunkScorer, const ROWS: usize>(
    runs: HeadRunsSlice<'_>,
    queries: &[&[f32]],
    d: usize,
    scale: f32,
    probs: &mut [f32],
) {
    let queries: [&[f32]; ROWS] = std::array::from_fn(|r| &queries[r][..d]);
    let keys = probs.len() / ROWS;
    let mut pending = Vec::with_capacity(S::CHUNK * d);
    let mut transposed = vec![0f32; S::CHUNK * d];
    let mut scaled = [[0f32; CHUNK]; ROWS];
    let mut scratch = Vec::new();
    let mut scored = 0;
    for (i, &(run, _)) in runs.iter().enumerate() {
        if let Some((ahead, _)) = runs.get(i + PREFETCH_RUNS) {
            ahead.prefetch();
        }
        let mut rest = run.to_f32_on(S::ISA, &mut scratch);
        while !rest.is_empty() {
            let take = (S::CHUNK * d - pending.len()).min(rest.len());
            pending.extend_from_slice(&rest[..take]);
            rest = &rest[take..];
            let n = pending.len() / d;
            if n == S::CHUNK || scored + n == keys {
                // SAFETY: the caller's promise.
                unsafe {
                    S::transpose(&pending, d, &mut transposed);
                    S::scaled_scores::<ROWS>(&transposed, queries, d, scale, &mut scaled);
                }
                for (r, scaled) in scaled.iter().enumerate() {
                    probs[r * keys + scored..][..n].copy_from_slice(&scaled[..n]);
                }
                scored += n;
                pending.clear();
            }
        }
    }
    assert_eq!(scored, keys, "scores of {keys} keys");
}

/// The AVX-512 copy: 16 keys per register, four registers per row at once.
struct Avx512Chunks;

impl ChunkScorer for Avx512Chunks {
    const ISA: Isa = Isa::Avx512;
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
        scaled: &mut [[f32; CHUNK]; ROWS],
    ) {
        // SAFETY: the caller's promise.
        let sums = unsafe { scores::<ROWS>(transposed, queries, d) };
        for (sums, scaled) in sums.iter().zip(scaled) {
            for (sum, out) in sums.iter().zip(scaled.chunks_exact_mut(KEY_LANES)) {
                // SAFETY: 16 floats out; the caller's promise.
                unsafe {
                    _mm512_storeu_ps(out.as_mut_ptr(), _mm512_mul_ps(*sum, _mm512_set1_ps(scale)))
                };
            }
        }
    }
}

/// Per row and key of the transposed chunk, `Σ_c query[c] · key[c]`, one fused chain in
/// dimension order (the keys past the chunk's end are zero; their scores are not kept).
#[target_feature(enable = "avx512f")]
#[inline]
fn scores<const ROWS: usize>(
    transposed: &[f32],
    queries: [&[f32]; ROWS],
    d: usize,
) -> [[__m512; BLOCKS_AT_ONCE]; ROWS] {
    assert!(transposed.len() == CHUNK * d && queries.iter().all(|q| q.len() == d));
    let mut sums = [[_mm512_setzero_ps(); BLOCKS_AT_ONCE]; ROWS];
    for c in 0..d {
        // SAFETY: block `b`'s dimension `c` is 16 floats inside `transposed`.
        let keys: [__m512; BLOCKS_AT_ONCE] = std::array::from_fn(|b| unsafe {
            _mm512_loadu_ps(transposed.as_ptr().add((b * d + c) * KEY_LANES))
        });
        for (sums, q) in sums.iter_mut().zip(queries) {
            // SAFETY: `c < d = q.len()`.
            let x = _mm512_set1_ps(unsafe { *q.get_unchecked(c) });
            for (s, k) in sums.iter_mut().zip(keys) {
                *s = _mm512_fmadd_ps(x, k, *s);
            }
        }
    }
    sums
}

/// One row's online softmax ([`online::row_softmax`]) by the copy for `isa` (the
/// exponential's fused multiply-adds in hardware): the probabilities in place, each tile's
/// factor in `factors`; returns the sum.
///
/// # Safety
/// The CPU runs `isa`, AVX2 or AVX-512.
pub(super) unsafe fn softmax(
    isa: Isa,
    probs: &mut [f32],
    tiles: &[Range<usize>],
    range: (usize, usize),
    factors: &mut [f32],
) -> f32 {
    match isa {
        // SAFETY: the caller's promise.
        Isa::Avx512 => unsafe { softmax_avx512(probs, tiles, range, factors) },
        // SAFETY: as above.
        _ => unsafe { avx2::softmax(probs, tiles, range, factors) },
    }
}

/// [`online::row_softmax`] compiled for AVX-512.
#[target_feature(enable = "avx512f,avx2,fma")]
fn softmax_avx512(
    probs: &mut [f32],
    tiles: &[Range<usize>],
    range: (usize, usize),
    factors: &mut [f32],
) -> f32 {
    online::row_softmax(probs, tiles, range, factors)
}

/// Writes the keys `keys` (`m × d`, `m ≤ CHUNK`) transposed in blocks of 16: block `b`'s
/// dimension `c` holds keys `16b..16b + 16` at `transposed[(b·d + c)·16..]`, missing keys zero.
#[target_feature(enable = "avx512f")]
fn transpose(keys: &[f32], d: usize, transposed: &mut [f32]) {
    let m = keys.len() / d;
    assert!(m <= CHUNK && d.is_multiple_of(KEY_LANES) && transposed.len() == CHUNK * d);
    for (b, out) in transposed.chunks_exact_mut(d * KEY_LANES).enumerate() {
        let present = m.saturating_sub(b * KEY_LANES).min(KEY_LANES);
        for c in (0..d).step_by(KEY_LANES) {
            let mut tile = [_mm512_setzero_ps(); KEY_LANES];
            for (j, row) in tile.iter_mut().enumerate().take(present) {
                // SAFETY: key `16b + j < m` has `d` values, `c + 16 ≤ d`.
                *row = unsafe { _mm512_loadu_ps(keys.as_ptr().add((b * KEY_LANES + j) * d + c)) };
            }
            for (i, column) in transpose16(tile).iter().enumerate() {
                // SAFETY: `c + i < d` rows of 16 in `out`.
                unsafe { _mm512_storeu_ps(out.as_mut_ptr().add((c + i) * KEY_LANES), *column) };
            }
        }
    }
}

/// The 16 × 16 transpose: pairs of rows interleaved, then pairs of pairs, then the 128-bit
/// quarters exchanged twice.
#[target_feature(enable = "avx512f")]
#[inline]
fn transpose16(r: [__m512; 16]) -> [__m512; 16] {
    let mut t = [_mm512_setzero_ps(); 16];
    for i in (0..16).step_by(2) {
        t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
        t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
    }
    let mut u = [_mm512_setzero_ps(); 16];
    for i in (0..16).step_by(4) {
        u[i] = _mm512_shuffle_ps::<0x44>(t[i], t[i + 2]);
        u[i + 1] = _mm512_shuffle_ps::<0xEE>(t[i], t[i + 2]);
        u[i + 2] = _mm512_shuffle_ps::<0x44>(t[i + 1], t[i + 3]);
        u[i + 3] = _mm512_shuffle_ps::<0xEE>(t[i + 1], t[i + 3]);
    }
    for i in [0, 8] {
        for k in 0..4 {
            t[i + k] = _mm512_shuffle_f32x4::<0x88>(u[i + k], u[i + k + 4]);
            t[i + k + 4] = _mm512_shuffle_f32x4::<0xDD>(u[i + k], u[i + k + 4]);
        }
    }
    for k in 0..8 {
        u[k] = _mm512_shuffle_f32x4::<0x88>(t[k], t[k + 8]);
        u[k + 8] = _mm512_shuffle_f32x4::<0xDD>(t[k], t[k + 8]);
    }
    u
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_data::sample;

    #[test]
    fn keys_transpose_in_full_and_partial_blocks() {
        if Isa::best() != Isa::Avx512 {
            return;
        }
        let d = 32;
        for m in [1, 7, 16, 17, 40, CHUNK] {
            let keys = sample(m * d, m as u32);
            let mut got = vec![f32::NAN; CHUNK * d];
            // SAFETY: the CPU runs AVX-512F (checked above).
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

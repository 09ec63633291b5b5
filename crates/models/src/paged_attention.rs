//! Causal attention of a sequence's new queries, reading keys and values where the paged KV
//! store keeps them (no gathered copy of the sequence's cache per layer and step).
//!
//! The query heads that share a key/value head run together at one position (so they see the
//! same keys), every key and value loaded serving all of them. Each row is still computed alone
//! in a fixed order: a score is a 16-lane fused multiply-add dot product whose lanes are added
//! pairwise (8, 4, 2, 1 apart), the softmax adds its terms in key order, and the output adds
//! `p·v` key by key. So a row's result does not depend on the rows beside it (batch, chunking)
//! nor on the CPU: the AVX-512 copy and the portable one give the same bits.
//!
//! Keys and values stored as f16, bf16 or q8_0 are converted to f32 a block at a time as they
//! are read (into a block-sized buffer that stays in the L1 cache), and the kernels then run
//! on those floats exactly as on f32 blocks: the same products in the same order.

use rayon::prelude::*;

use crate::activation::exp_nonpositive;
use crate::isa::Isa;
use crate::kv_type::KvRows;

/// Query rows per pass at most (accumulators held in registers).
const MAX_ROWS: usize = 8;
/// Dot-product lanes.
const LANES: usize = 16;

/// One key/value head's cached positions: per block, `(keys, values)` of `positions × head_dim`.
pub struct HeadRuns<'a> {
    pub runs: Vec<(KvRows<'a>, KvRows<'a>)>,
}

/// Key and value runs `(positions × d each)` in position order.
type HeadRunsSlice<'a> = &'a [(KvRows<'a>, KvRows<'a>)];

/// Which keys query rows see.
#[derive(Clone, Copy)]
pub struct Visibility {
    /// Positions before the first new query.
    pub past: usize,
    /// Keys further back than this are out of a sliding window.
    pub window: Option<usize>,
}

impl Visibility {
    /// The keys `first..=last` the query at new index `i` sees.
    fn range(self, i: usize) -> (usize, usize) {
        let last = self.past + i;
        let first = self.window.map_or(0, |w| (last + 1).saturating_sub(w));
        (first, last)
    }
}

/// `q`: `(heads, new, d)`, heads sharing key/value head `h` being `h·group .. (h+1)·group`.
/// Returns `(heads, new, d)`.
pub fn attend(
    heads: &[HeadRuns<'_>],
    q: &[f32],
    query_heads: usize,
    new: usize,
    d: usize,
    scale: f32,
    visibility: Visibility,
) -> Vec<f32> {
    let group = query_heads / heads.len().max(1);
    // One task per key/value head and position: a prefill's new positions spread over the
    // cores, a decode step's heads too.
    let tasks: Vec<(usize, usize)> =
        (0..heads.len()).flat_map(|h| (0..new).map(move |i| (h, i))).collect();
    let outputs: Vec<Vec<f32>> = tasks
        .par_iter()
        .map(|&(h, i)| {
            let (first, last) = visibility.range(i);
            let keys = visible_runs(&heads[h], d, first, last + 1);
            let rows: Vec<usize> = (h * group..(h + 1) * group).collect();
            rows.chunks(MAX_ROWS)
                .flat_map(|rows| {
                    let queries: Vec<&[f32]> =
                        rows.iter().map(|&head| &q[(head * new + i) * d..][..d]).collect();
                    attend_rows(&keys, &queries, d, scale)
                })
                .collect()
        })
        .collect();
    let mut out = vec![0f32; q.len()];
    for (&(h, i), o) in tasks.iter().zip(&outputs) {
        for (head, o) in (h * group..(h + 1) * group).zip(o.chunks_exact(d)) {
            out[(head * new + i) * d..][..d].copy_from_slice(o);
        }
    }
    out
}

/// The parts of `head`'s runs holding positions `first..end`.
fn visible_runs<'a>(
    head: &HeadRuns<'a>,
    d: usize,
    first: usize,
    end: usize,
) -> Vec<(KvRows<'a>, KvRows<'a>)> {
    let mut at = 0;
    let mut runs = Vec::new();
    for &(keys, values) in &head.runs {
        let n = keys.values() / d;
        let (from, to) = (first.clamp(at, at + n) - at, end.clamp(at, at + n) - at);
        if from < to {
            runs.push((keys.rows(d, from, to), values.rows(d, from, to)));
        }
        at += n;
    }
    runs
}

/// The outputs (`rows × d`) of query rows that all see the keys of `runs`.
fn attend_rows(runs: HeadRunsSlice<'_>, queries: &[&[f32]], d: usize, scale: f32) -> Vec<f32> {
    let isa = match Isa::best() {
        Isa::Avx512 if !d.is_multiple_of(LANES) => Isa::Avx2,
        isa => isa,
    };
    attend_rows_on(isa, runs, queries, d, scale)
}

/// [`attend_rows`] with the copy for `isa`, which the CPU must run (the AVX-512 copy needs `d` a
/// multiple of 16).
fn attend_rows_on(
    isa: Isa,
    runs: HeadRunsSlice<'_>,
    queries: &[&[f32]],
    d: usize,
    scale: f32,
) -> Vec<f32> {
    match isa {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: the CPU has the features the copy is compiled for (the caller's promise).
        Isa::Avx512 => unsafe { avx512::attend_rows(runs, queries, d, scale) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as above.
        Isa::Avx2 => unsafe { attend_rows_avx2(runs, queries, d, scale) },
        // SAFETY: the portable copy runs anywhere.
        _ => unsafe { attend_rows_with(Isa::Portable, runs, queries, d, scale) },
    }
}

/// The portable copy compiled with hardware fused multiply-add (without it `mul_add` is a
/// library call) and F16C conversions.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn attend_rows_avx2(
    runs: HeadRunsSlice<'_>,
    queries: &[&[f32]],
    d: usize,
    scale: f32,
) -> Vec<f32> {
    // SAFETY: this function's features are those of the AVX2 copy.
    unsafe { attend_rows_with(Isa::Avx2, runs, queries, d, scale) }
}

/// Scores block by block, the softmax per row, then the outputs block by block, each block's
/// keys or values converted to f32 (when stored otherwise) just before they are used.
///
/// # Safety
/// The CPU runs `isa`.
// No closures on this path: a closure is compiled on its own, without the caller's `fma`, and
// then each `mul_add` in it is a library call (it was ~19% of a prefill).
#[inline(always)]
unsafe fn attend_rows_with(
    isa: Isa,
    runs: HeadRunsSlice<'_>,
    queries: &[&[f32]],
    d: usize,
    scale: f32,
) -> Vec<f32> {
    let mut passes = Passes::new(runs, queries.len(), d);
    let mut scratch = Vec::new();
    let mut first = 0;
    for &(keys, _) in runs {
        let keys = keys.to_f32_on(isa, &mut scratch);
        // SAFETY: the caller's promise.
        unsafe { scores_on(isa, keys, queries, d, scale, &mut passes, first) };
        first += keys.len() / d;
    }
    passes.softmax();
    let mut first = 0;
    for &(_, values) in runs {
        let values = values.to_f32_on(isa, &mut scratch);
        // SAFETY: the caller's promise.
        unsafe { outputs_on(isa, values, &mut passes, first, d) };
        first += values.len() / d;
    }
    passes.out
}

/// Scores of the keys `keys` (those from key `first` on) by the kernels of `isa`.
#[inline(always)]
unsafe fn scores_on(
    isa: Isa,
    keys: &[f32],
    queries: &[&[f32]],
    d: usize,
    scale: f32,
    passes: &mut Passes,
    first: usize,
) {
    #[cfg(target_arch = "x86_64")]
    if isa == Isa::Avx512 {
        // SAFETY: the caller's promise.
        return unsafe {
            avx512::scores(keys, queries, d, scale, &mut passes.probs, passes.keys, first)
        };
    }
    let _ = isa;
    scores_portable(keys, queries, d, scale, &mut passes.probs, passes.keys, first)
}

/// Adds the values `values` (those from key `first` on) to the outputs by the kernels of `isa`.
#[inline(always)]
unsafe fn outputs_on(isa: Isa, values: &[f32], passes: &mut Passes, first: usize, d: usize) {
    #[cfg(target_arch = "x86_64")]
    if isa == Isa::Avx512 {
        // SAFETY: the caller's promise.
        return unsafe {
            avx512::outputs(values, &passes.probs, passes.keys, first, d, &mut passes.out)
        };
    }
    let _ = isa;
    outputs_portable(values, &passes.probs, passes.keys, first, d, &mut passes.out)
}

/// The buffers of attention's three passes over `rows` query rows: scores, a softmax per
/// row, then the outputs.
struct Passes {
    keys: usize,
    /// `rows × keys`
    probs: Vec<f32>,
    /// `rows × d`
    out: Vec<f32>,
}

impl Passes {
    #[inline(always)]
    fn new(runs: HeadRunsSlice<'_>, rows: usize, d: usize) -> Self {
        let keys: usize = runs.iter().map(|(k, _)| k.values() / d).sum();
        Self { keys, probs: vec![0f32; rows * keys], out: vec![0f32; rows * d] }
    }

    #[inline(always)]
    fn softmax(&mut self) {
        for row in self.probs.chunks_exact_mut(self.keys.max(1)) {
            softmax(row);
        }
    }
}

/// `probs[r · keys + j]` = `scale · (query r · key j)` for the keys `ks`, key `first` on.
#[inline(always)]
fn scores_portable(
    ks: &[f32],
    queries: &[&[f32]],
    d: usize,
    scale: f32,
    probs: &mut [f32],
    keys: usize,
    first: usize,
) {
    for (j, k) in (first..).zip(ks.chunks_exact(d)) {
        for (r, q) in queries.iter().enumerate() {
            probs[r * keys + j] = dot(q, k) * scale;
        }
    }
}

/// `out[r] += Σ_j probs[r · keys + j] · value j` for the values `vs`, key `first` on, in key
/// order.
#[inline(always)]
fn outputs_portable(
    vs: &[f32],
    probs: &[f32],
    keys: usize,
    first: usize,
    d: usize,
    out: &mut [f32],
) {
    for (j, v) in (first..).zip(vs.chunks_exact(d)) {
        for (r, o) in out.chunks_exact_mut(d).enumerate() {
            let p = probs[r * keys + j];
            for (o, x) in o.iter_mut().zip(v) {
                *o = p.mul_add(*x, *o);
            }
        }
    }
}

/// 16 running fused sums (lane `l` takes elements `l, l + 16, ...`) added pairwise 8, 4, 2
/// and 1 lanes apart, then the tail in order.
#[inline(always)]
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut lanes = [0f32; LANES];
    let body = a.len() - a.len() % LANES;
    for (xa, xb) in a[..body].chunks_exact(LANES).zip(b[..body].chunks_exact(LANES)) {
        for l in 0..LANES {
            lanes[l] = xa[l].mul_add(xb[l], lanes[l]);
        }
    }
    let mut sum = fold_lanes(lanes);
    for (x, y) in a[body..].iter().zip(&b[body..]) {
        sum = x.mul_add(*y, sum);
    }
    sum
}

#[inline(always)]
fn fold_lanes(mut lanes: [f32; LANES]) -> f32 {
    for apart in [8, 4, 2, 1] {
        for l in 0..apart {
            lanes[l] += lanes[l + apart];
        }
    }
    lanes[0]
}

/// In place, terms added in order.
#[inline(always)]
fn softmax(scores: &mut [f32]) {
    let mut max = f32::NEG_INFINITY;
    for &s in scores.iter() {
        max = max.max(s);
    }
    let mut sum = 0f32;
    for s in scores.iter_mut() {
        *s = exp_nonpositive(*s - max);
        sum += *s;
    }
    for s in scores.iter_mut() {
        *s /= sum;
    }
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use std::arch::x86_64::*;

    use super::{attend_rows_with, HeadRunsSlice, Isa, LANES, MAX_ROWS};

    /// [`super::attend_rows_with`] with AVX-512 scores, outputs and conversions.
    #[target_feature(enable = "avx512f,avx2,fma,f16c")]
    pub unsafe fn attend_rows(
        runs: HeadRunsSlice<'_>,
        queries: &[&[f32]],
        d: usize,
        scale: f32,
    ) -> Vec<f32> {
        // SAFETY: the caller checked the features these copies are compiled for.
        unsafe { attend_rows_with(Isa::Avx512, runs, queries, d, scale) }
    }

    /// [`super::scores_portable`] for `d` a multiple of 16: tiles of 4 queries × 4 keys.
    #[target_feature(enable = "avx512f")]
    pub unsafe fn scores(
        ks: &[f32],
        queries: &[&[f32]],
        d: usize,
        scale: f32,
        probs: &mut [f32],
        keys: usize,
        j0: usize,
    ) {
        let n = ks.len() / d;
        for r0 in (0..queries.len()).step_by(4) {
            // Short tiles repeat their last row or key; the repeats are not stored.
            let q = |i: usize| queries[(r0 + i).min(queries.len() - 1)].as_ptr();
            let qp = [q(0), q(1), q(2), q(3)];
            for k0 in (0..n).step_by(4) {
                let k = |i: usize| ks.as_ptr().add((k0 + i).min(n - 1) * d);
                let kp = [k(0), k(1), k(2), k(3)];
                let mut acc = [[_mm512_setzero_ps(); 4]; 4];
                for c in (0..d).step_by(LANES) {
                    let kv = [
                        _mm512_loadu_ps(kp[0].add(c)),
                        _mm512_loadu_ps(kp[1].add(c)),
                        _mm512_loadu_ps(kp[2].add(c)),
                        _mm512_loadu_ps(kp[3].add(c)),
                    ];
                    for (a, &qr) in acc.iter_mut().zip(&qp) {
                        let qv = _mm512_loadu_ps(qr.add(c));
                        for (a, kv) in a.iter_mut().zip(&kv) {
                            *a = _mm512_fmadd_ps(qv, *kv, *a);
                        }
                    }
                }
                for (i, a) in acc.iter().enumerate().take(queries.len() - r0) {
                    let sums = fold4(a);
                    for (t, sum) in sums.iter().enumerate().take(n - k0) {
                        probs[(r0 + i) * keys + j0 + k0 + t] = sum * scale;
                    }
                }
            }
        }
    }

    /// [`super::fold_lanes`] of four registers at once: each step adds the same lane pairs
    /// (8, 4, 2, then 1 apart), with the registers' halves and quarters side by side.
    #[target_feature(enable = "avx512f")]
    unsafe fn fold4(x: &[__m512; 4]) -> [f32; 4] {
        // [a0..7 + a8..15 | b0..7 + b8..15], likewise c and d (128-bit quarters: 0,1 + 2,3).
        let ab = _mm512_add_ps(
            _mm512_shuffle_f32x4(x[0], x[1], 0b01_00_01_00),
            _mm512_shuffle_f32x4(x[0], x[1], 0b11_10_11_10),
        );
        let cd = _mm512_add_ps(
            _mm512_shuffle_f32x4(x[2], x[3], 0b01_00_01_00),
            _mm512_shuffle_f32x4(x[2], x[3], 0b11_10_11_10),
        );
        // One quarter each: lanes l + l+4 of a, b, c, d.
        let abcd = _mm512_add_ps(
            _mm512_shuffle_f32x4(ab, cd, 0b10_00_10_00),
            _mm512_shuffle_f32x4(ab, cd, 0b11_01_11_01),
        );
        // Within each quarter: l + l+2, then l + l+1.
        let twos = _mm512_add_ps(abcd, _mm512_permute_ps(abcd, 0b01_00_11_10));
        let ones = _mm512_add_ps(twos, _mm512_permute_ps(twos, 0b10_11_00_01));
        let mut lanes = [0f32; 16];
        _mm512_storeu_ps(lanes.as_mut_ptr(), ones);
        [lanes[0], lanes[4], lanes[8], lanes[12]]
    }

    /// [`super::outputs_portable`] for `d` a multiple of 16, up to [`MAX_ROWS`] rows.
    #[target_feature(enable = "avx512f")]
    pub unsafe fn outputs(
        vs: &[f32],
        probs: &[f32],
        keys: usize,
        first: usize,
        d: usize,
        out: &mut [f32],
    ) {
        match out.len() / d {
            1 => outputs_of::<1>(vs, probs, keys, first, d, out),
            2 => outputs_of::<2>(vs, probs, keys, first, d, out),
            3 => outputs_of::<3>(vs, probs, keys, first, d, out),
            4 => outputs_of::<4>(vs, probs, keys, first, d, out),
            5 => outputs_of::<5>(vs, probs, keys, first, d, out),
            6 => outputs_of::<6>(vs, probs, keys, first, d, out),
            7 => outputs_of::<7>(vs, probs, keys, first, d, out),
            rows => {
                assert_eq!(rows, MAX_ROWS);
                outputs_of::<MAX_ROWS>(vs, probs, keys, first, d, out)
            }
        }
    }

    /// `ROWS` rows' accumulators in registers, 32 output floats at a time (then 16), so each
    /// broadcast probability serves two products. The accumulators start from `out` (what the
    /// earlier blocks added), so a row's sums run through all keys in order, block after block.
    #[target_feature(enable = "avx512f")]
    unsafe fn outputs_of<const ROWS: usize>(
        vs: &[f32],
        probs: &[f32],
        keys: usize,
        first: usize,
        d: usize,
        out: &mut [f32],
    ) {
        assert!(
            probs.len() >= ROWS * keys && out.len() == ROWS * d && first + vs.len() / d <= keys
        );
        let pairs = d / (2 * LANES) * 2 * LANES;
        for c in (0..pairs).step_by(2 * LANES) {
            let mut acc = [[_mm512_setzero_ps(); 2]; ROWS];
            for (r, a) in acc.iter_mut().enumerate() {
                *a = [
                    _mm512_loadu_ps(out.as_ptr().add(r * d + c)),
                    _mm512_loadu_ps(out.as_ptr().add(r * d + c + LANES)),
                ];
            }
            for (j, v) in (first..).zip(vs.chunks_exact(d)) {
                let v = [
                    _mm512_loadu_ps(v.as_ptr().add(c)),
                    _mm512_loadu_ps(v.as_ptr().add(c + LANES)),
                ];
                for (r, a) in acc.iter_mut().enumerate() {
                    let p = _mm512_set1_ps(*probs.get_unchecked(r * keys + j));
                    a[0] = _mm512_fmadd_ps(p, v[0], a[0]);
                    a[1] = _mm512_fmadd_ps(p, v[1], a[1]);
                }
            }
            for (r, a) in acc.iter().enumerate() {
                _mm512_storeu_ps(out.as_mut_ptr().add(r * d + c), a[0]);
                _mm512_storeu_ps(out.as_mut_ptr().add(r * d + c + LANES), a[1]);
            }
        }
        for c in (pairs..d).step_by(LANES) {
            let mut acc = [_mm512_setzero_ps(); ROWS];
            for (r, a) in acc.iter_mut().enumerate() {
                *a = _mm512_loadu_ps(out.as_ptr().add(r * d + c));
            }
            for (j, v) in (first..).zip(vs.chunks_exact(d)) {
                let v = _mm512_loadu_ps(v.as_ptr().add(c));
                for (r, a) in acc.iter_mut().enumerate() {
                    *a = _mm512_fmadd_ps(_mm512_set1_ps(*probs.get_unchecked(r * keys + j)), v, *a);
                }
            }
            for (r, a) in acc.iter().enumerate() {
                _mm512_storeu_ps(out.as_mut_ptr().add(r * d + c), *a);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kv_type::{encode_bf16, encode_f16, encode_q8_0, KvType};

    fn sample(n: usize, seed: u32) -> Vec<f32> {
        (0..n)
            .map(|i| {
                (((i as u32).wrapping_mul(2654435761).wrapping_add(seed) % 1000) as f32 / 500.0)
                    - 1.0
            })
            .collect()
    }

    /// Rows of f32 stored as `kind`.
    enum Stored {
        F32(Vec<f32>),
        Halves(KvType, Vec<u16>),
        Bytes(Vec<u8>),
    }

    impl Stored {
        fn new(kind: KvType, x: &[f32]) -> Self {
            match kind {
                KvType::F32 => Stored::F32(x.to_vec()),
                KvType::F16 | KvType::Bf16 => {
                    let mut halves = vec![0u16; x.len()];
                    if kind == KvType::F16 {
                        encode_f16(x, &mut halves)
                    } else {
                        encode_bf16(x, &mut halves)
                    }
                    Stored::Halves(kind, halves)
                }
                KvType::Q8_0 => {
                    let mut bytes = vec![0u8; kind.row_units(x.len())];
                    encode_q8_0(x, &mut bytes);
                    Stored::Bytes(bytes)
                }
            }
        }

        fn rows(&self) -> KvRows<'_> {
            match self {
                Stored::F32(x) => KvRows::F32(x),
                Stored::Halves(KvType::F16, x) => KvRows::F16(x),
                Stored::Halves(_, x) => KvRows::Bf16(x),
                Stored::Bytes(x) => KvRows::Q8_0(x),
            }
        }

        /// The values attention reads: the stored ones converted back.
        fn dequantized(&self) -> Vec<f32> {
            self.rows().to_f32_on(Isa::best(), &mut Vec::new()).to_vec()
        }
    }

    /// Keys/values `(positions, d)` of one head cut into runs of `block` positions.
    fn runs<'a>(keys: KvRows<'a>, values: KvRows<'a>, d: usize, block: usize) -> HeadRuns<'a> {
        let positions = keys.values() / d;
        let cuts = (0..positions).step_by(block).map(|at| (at, (at + block).min(positions)));
        HeadRuns {
            runs: cuts
                .map(|(from, to)| (keys.rows(d, from, to), values.rows(d, from, to)))
                .collect(),
        }
    }

    fn f32_runs<'a>(keys: &'a [f32], values: &'a [f32], d: usize, block: usize) -> HeadRuns<'a> {
        runs(KvRows::F32(keys), KvRows::F32(values), d, block)
    }

    fn bits(x: &[f32]) -> Vec<u32> {
        x.iter().map(|f| f.to_bits()).collect()
    }

    /// Textbook attention in f64.
    fn reference(
        q: &[f32],
        k: &[f32],
        v: &[f32],
        d: usize,
        scale: f32,
        range: (usize, usize),
    ) -> Vec<f64> {
        let scores: Vec<f64> = (range.0..=range.1)
            .map(|j| (0..d).map(|c| q[c] as f64 * k[j * d + c] as f64).sum::<f64>() * scale as f64)
            .collect();
        let max = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let e: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
        let total: f64 = e.iter().sum();
        (0..d)
            .map(|c| {
                (range.0..=range.1).zip(&e).map(|(j, p)| p / total * v[j * d + c] as f64).sum()
            })
            .collect()
    }

    #[test]
    fn matches_textbook_attention_with_causal_and_window_masks() {
        let (kv_heads, group, d, past, new) = (2, 3, 48, 9, 4);
        let total = past + new;
        let keys: Vec<Vec<f32>> = (0..kv_heads).map(|h| sample(total * d, 10 + h as u32)).collect();
        let values: Vec<Vec<f32>> =
            (0..kv_heads).map(|h| sample(total * d, 20 + h as u32)).collect();
        let heads: Vec<HeadRuns> =
            (0..kv_heads).map(|h| f32_runs(&keys[h], &values[h], d, 5)).collect();
        let q = sample(kv_heads * group * new * d, 3);
        for window in [None, Some(4)] {
            let out =
                attend(&heads, &q, kv_heads * group, new, d, 0.3, Visibility { past, window });
            for head in 0..kv_heads * group {
                for i in 0..new {
                    let range = Visibility { past, window }.range(i);
                    let row = &q[(head * new + i) * d..][..d];
                    let want =
                        reference(row, &keys[head / group], &values[head / group], d, 0.3, range);
                    for (got, want) in out[(head * new + i) * d..][..d].iter().zip(want) {
                        assert!(
                            (*got as f64 - want).abs() < 1e-5,
                            "head {head} query {i} window {window:?}: {got} vs {want}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn a_row_does_not_depend_on_the_rows_beside_it_or_the_block_size() {
        let (group, d, past, new) = (8, 64, 30, 6);
        let total = past + new;
        let q = sample(group * new * d, 3);
        let visibility = Visibility { past, window: None };
        for kind in KvType::ALL {
            let (keys, values) = (
                Stored::new(kind, &sample(total * d, 1)),
                Stored::new(kind, &sample(total * d, 2)),
            );
            let together = attend(
                &[runs(keys.rows(), values.rows(), d, 16)],
                &q,
                group,
                new,
                d,
                0.125,
                visibility,
            );
            // Each query alone, as a decode step would run it, over other block boundaries.
            for i in 0..new {
                let qi: Vec<f32> =
                    (0..group).flat_map(|h| q[(h * new + i) * d..][..d].to_vec()).collect();
                let seen = past + i + 1;
                let (k, v) = (keys.rows().rows(d, 0, seen), values.rows().rows(d, 0, seen));
                let alone = attend(
                    &[runs(k, v, d, 7)],
                    &qi,
                    group,
                    1,
                    d,
                    0.125,
                    Visibility { past: past + i, window: None },
                );
                for h in 0..group {
                    assert_eq!(
                        bits(&alone[h * d..][..d]),
                        bits(&together[(h * new + i) * d..][..d]),
                        "{kind}: head {h} query {i}"
                    );
                }
            }
        }
    }

    /// The portable kernels over all keys in one piece: the order every copy must keep.
    fn one_piece(
        keys: &[f32],
        values: &[f32],
        queries: &[&[f32]],
        d: usize,
        scale: f32,
    ) -> Vec<f32> {
        let total = keys.len() / d;
        let mut probs = vec![0f32; queries.len() * total];
        let mut out = vec![0f32; queries.len() * d];
        scores_portable(keys, queries, d, scale, &mut probs, total, 0);
        probs.chunks_exact_mut(total).for_each(softmax);
        outputs_portable(values, &probs, total, 0, d, &mut out);
        out
    }

    #[test]
    fn every_copy_gives_the_same_bits_for_every_kv_type() {
        // d = 80: the AVX-512 outputs run a pair of registers, then one; d = 96 for q8_0.
        for (kind, d) in
            [(KvType::F32, 80), (KvType::F16, 80), (KvType::Bf16, 80), (KvType::Q8_0, 96)]
        {
            let total = 23;
            let (keys, values) = (
                Stored::new(kind, &sample(total * d, 5)),
                Stored::new(kind, &sample(total * d, 6)),
            );
            let head = runs(keys.rows(), values.rows(), d, 8);
            for rows in [1, 3, 8] {
                let queries: Vec<Vec<f32>> = (0..rows).map(|h| sample(d, 40 + h as u32)).collect();
                let queries: Vec<&[f32]> = queries.iter().map(Vec::as_slice).collect();
                let want =
                    bits(&one_piece(&keys.dequantized(), &values.dequantized(), &queries, d, 0.2));
                for isa in Isa::available() {
                    assert_eq!(
                        bits(&attend_rows_on(isa, &head.runs, &queries, d, 0.2)),
                        want,
                        "{kind}, {rows} rows, {isa:?}"
                    );
                }
            }
        }
    }

    #[test]
    fn attention_over_stored_types_is_attention_over_their_values_in_f32() {
        let (kv_heads, group, d, past, new) = (2, 4, 64, 20, 5);
        let total = past + new;
        let q = sample(kv_heads * group * new * d, 7);
        for kind in [KvType::F16, KvType::Bf16, KvType::Q8_0] {
            let stored: Vec<(Stored, Stored)> = (0..kv_heads)
                .map(|h| {
                    (
                        Stored::new(kind, &sample(total * d, 30 + h as u32)),
                        Stored::new(kind, &sample(total * d, 50 + h as u32)),
                    )
                })
                .collect();
            let as_f32: Vec<(Vec<f32>, Vec<f32>)> =
                stored.iter().map(|(k, v)| (k.dequantized(), v.dequantized())).collect();
            let typed: Vec<HeadRuns> =
                stored.iter().map(|(k, v)| runs(k.rows(), v.rows(), d, 16)).collect();
            let floats: Vec<HeadRuns> = as_f32.iter().map(|(k, v)| f32_runs(k, v, d, 16)).collect();
            for window in [None, Some(9)] {
                let visibility = Visibility { past, window };
                let got = attend(&typed, &q, kv_heads * group, new, d, 0.125, visibility);
                assert_eq!(
                    bits(&got),
                    bits(&attend(&floats, &q, kv_heads * group, new, d, 0.125, visibility)),
                    "{kind} {window:?}"
                );
            }
        }
    }
}

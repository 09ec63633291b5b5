//! Causal attention of a sequence's new queries, reading keys and values where the paged KV
//! store keeps them (no gathered copy of the sequence's cache per layer and step).
//!
//! The query heads that share a key/value head run together at one position (so they see the
//! same keys), every key and value loaded serving all of them. Each row is still computed alone
//! in a fixed order: a score is a 16-lane fused multiply-add dot product whose lanes are added
//! pairwise (8, 4, 2, 1 apart), the softmax adds its terms in key order, and the output adds
//! `p·v` key by key. So a row's result does not depend on the rows beside it (batch, chunking)
//! nor on the CPU: the AVX-512 copy and the portable one give the same bits.

use rayon::prelude::*;


/// Query rows per pass at most (accumulators held in registers).
const MAX_ROWS: usize = 8;
/// Dot-product lanes.
const LANES: usize = 16;

/// One key/value head's cached positions: per block, `(keys, values)` of `positions × head_dim`.
pub struct HeadRuns<'a> {
    pub runs: Vec<(&'a [f32], &'a [f32])>,
}

/// Key and value runs `(positions × d each)` in position order.
type HeadRunsSlice<'a> = &'a [(&'a [f32], &'a [f32])];

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
pub fn attend(heads: &[HeadRuns<'_>], q: &[f32], query_heads: usize, new: usize, d: usize, scale: f32, visibility: Visibility) -> Vec<f32> {
    let group = query_heads / heads.len().max(1);
    // One task per key/value head and position: a prefill's new positions spread over the
    // cores, a decode step's heads too.
    let tasks: Vec<(usize, usize)> = (0..heads.len()).flat_map(|h| (0..new).map(move |i| (h, i))).collect();
    let outputs: Vec<Vec<f32>> = tasks
        .par_iter()
        .map(|&(h, i)| {
            let (first, last) = visibility.range(i);
            let keys = visible_runs(&heads[h], d, first, last + 1);
            let rows: Vec<usize> = (h * group..(h + 1) * group).collect();
            rows.chunks(MAX_ROWS)
                .flat_map(|rows| {
                    let queries: Vec<&[f32]> = rows.iter().map(|&head| &q[(head * new + i) * d..][..d]).collect();
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
fn visible_runs<'a>(head: &HeadRuns<'a>, d: usize, first: usize, end: usize) -> Vec<(&'a [f32], &'a [f32])> {
    let mut at = 0;
    let mut runs = Vec::new();
    for &(keys, values) in &head.runs {
        let n = keys.len() / d;
        let (from, to) = (first.clamp(at, at + n) - at, end.clamp(at, at + n) - at);
        if from < to {
            runs.push((&keys[from * d..to * d], &values[from * d..to * d]));
        }
        at += n;
    }
    runs
}

/// The outputs (`rows × d`) of query rows that all see the keys of `runs`.
fn attend_rows(runs: HeadRunsSlice<'_>, queries: &[&[f32]], d: usize, scale: f32) -> Vec<f32> {
    #[cfg(target_arch = "x86_64")]
    {
        if d.is_multiple_of(LANES) && std::arch::is_x86_feature_detected!("avx512f") && std::arch::is_x86_feature_detected!("fma") {
            // SAFETY: the CPU has the features the copy is compiled for.
            return unsafe { avx512::attend_rows(runs, queries, d, scale) };
        }
        if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
            // SAFETY: as above.
            return unsafe { attend_rows_fma(runs, queries, d, scale) };
        }
    }
    attend_rows_portable(runs, queries, d, scale)
}

/// The portable copy compiled with hardware fused multiply-add (without it `mul_add` is a
/// library call).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn attend_rows_fma(runs: HeadRunsSlice<'_>, queries: &[&[f32]], d: usize, scale: f32) -> Vec<f32> {
    attend_rows_portable(runs, queries, d, scale)
}

// No closures on this path: a closure is compiled on its own, without the caller's `fma`, and
// then each `mul_add` in it is a library call (it was ~19% of a prefill).
#[inline(always)]
fn attend_rows_portable(runs: HeadRunsSlice<'_>, queries: &[&[f32]], d: usize, scale: f32) -> Vec<f32> {
    let mut passes = Passes::new(runs, queries.len(), d);
    scores_portable(runs, queries, d, scale, &mut passes.probs, passes.keys);
    passes.softmax();
    outputs_portable(runs, &passes.probs, passes.keys, d, &mut passes.out);
    passes.out
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
        let keys: usize = runs.iter().map(|(k, _)| k.len() / d).sum();
        Self { keys, probs: vec![0f32; rows * keys], out: vec![0f32; rows * d] }
    }

    #[inline(always)]
    fn softmax(&mut self) {
        for row in self.probs.chunks_exact_mut(self.keys.max(1)) {
            softmax(row);
        }
    }
}

/// `probs[r · keys + j]` = `scale · (query r · key j)`.
#[inline(always)]
fn scores_portable(runs: HeadRunsSlice<'_>, queries: &[&[f32]], d: usize, scale: f32, probs: &mut [f32], keys: usize) {
    let mut j = 0;
    for &(ks, _) in runs {
        for k in ks.chunks_exact(d) {
            for (r, q) in queries.iter().enumerate() {
                probs[r * keys + j] = dot(q, k) * scale;
            }
            j += 1;
        }
    }
}

/// `out[r]` = `Σ_j probs[r · keys + j] · value j`, in key order.
#[inline(always)]
fn outputs_portable(runs: HeadRunsSlice<'_>, probs: &[f32], keys: usize, d: usize, out: &mut [f32]) {
    let mut j = 0;
    for &(_, vs) in runs {
        for v in vs.chunks_exact(d) {
            for (r, o) in out.chunks_exact_mut(d).enumerate() {
                let p = probs[r * keys + j];
                for (o, x) in o.iter_mut().zip(v) {
                    *o = p.mul_add(*x, *o);
                }
            }
            j += 1;
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

/// `eˣ` for `x ≤ 0` within 2 ulp, in plain arithmetic the compiler vectorizes (the library's
/// `expf` is a call per score): `x = n·ln 2 + r` with `|r| ≤ ln 2 / 2`, a degree-6 Taylor
/// polynomial for `eʳ`, and `2ⁿ` put into the exponent bits. Below −87 the result is 0.
#[inline(always)]
fn exp_nonpositive(x: f32) -> f32 {
    const SHIFT: f32 = 12_582_912.0; // 1.5·2²³: adding it rounds to an integer
    const LN2_HI: f32 = 0.693_145_75;
    const LN2_LO: f32 = 1.428_606_8e-6;
    let clamped = x.max(-87.0);
    let n = clamped.mul_add(std::f32::consts::LOG2_E, SHIFT) - SHIFT;
    let r = (-n).mul_add(LN2_LO, (-n).mul_add(LN2_HI, clamped));
    let mut p: f32 = 1.0 / 720.0;
    for c in [1.0 / 120.0, 1.0 / 24.0, 1.0 / 6.0, 0.5, 1.0, 1.0] {
        p = p.mul_add(r, c);
    }
    let scale = f32::from_bits(((n as i32 + 127).max(0) as u32) << 23);
    if x < -87.0 { 0.0 } else { p * scale }
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use std::arch::x86_64::*;

    use super::{HeadRunsSlice, Passes, LANES, MAX_ROWS};

    /// [`super::attend_rows_portable`] with AVX-512 scores and outputs.
    #[target_feature(enable = "avx512f,fma")]
    pub unsafe fn attend_rows(runs: HeadRunsSlice<'_>, queries: &[&[f32]], d: usize, scale: f32) -> Vec<f32> {
        let mut passes = Passes::new(runs, queries.len(), d);
        // SAFETY: the caller checked the features these copies are compiled for.
        unsafe { scores(runs, queries, d, scale, &mut passes.probs, passes.keys) };
        passes.softmax();
        unsafe { outputs(runs, &passes.probs, passes.keys, d, &mut passes.out) };
        passes.out
    }

    /// [`super::scores_portable`] for `d` a multiple of 16: tiles of 4 queries × 4 keys.
    #[target_feature(enable = "avx512f")]
    pub unsafe fn scores(runs: HeadRunsSlice<'_>, queries: &[&[f32]], d: usize, scale: f32, probs: &mut [f32], keys: usize) {
        let mut j0 = 0;
        for &(ks, _) in runs {
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
                        let kv = [_mm512_loadu_ps(kp[0].add(c)), _mm512_loadu_ps(kp[1].add(c)), _mm512_loadu_ps(kp[2].add(c)), _mm512_loadu_ps(kp[3].add(c))];
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
            j0 += n;
        }
    }

    /// [`super::fold_lanes`] of four registers at once: each step adds the same lane pairs
    /// (8, 4, 2, then 1 apart), with the registers' halves and quarters side by side.
    #[target_feature(enable = "avx512f")]
    unsafe fn fold4(x: &[__m512; 4]) -> [f32; 4] {
        // [a0..7 + a8..15 | b0..7 + b8..15], likewise c and d (128-bit quarters: 0,1 + 2,3).
        let ab = _mm512_add_ps(_mm512_shuffle_f32x4(x[0], x[1], 0b01_00_01_00), _mm512_shuffle_f32x4(x[0], x[1], 0b11_10_11_10));
        let cd = _mm512_add_ps(_mm512_shuffle_f32x4(x[2], x[3], 0b01_00_01_00), _mm512_shuffle_f32x4(x[2], x[3], 0b11_10_11_10));
        // One quarter each: lanes l + l+4 of a, b, c, d.
        let abcd = _mm512_add_ps(_mm512_shuffle_f32x4(ab, cd, 0b10_00_10_00), _mm512_shuffle_f32x4(ab, cd, 0b11_01_11_01));
        // Within each quarter: l + l+2, then l + l+1.
        let twos = _mm512_add_ps(abcd, _mm512_permute_ps(abcd, 0b01_00_11_10));
        let ones = _mm512_add_ps(twos, _mm512_permute_ps(twos, 0b10_11_00_01));
        let mut lanes = [0f32; 16];
        _mm512_storeu_ps(lanes.as_mut_ptr(), ones);
        [lanes[0], lanes[4], lanes[8], lanes[12]]
    }

    /// [`super::outputs_portable`] for `d` a multiple of 16, up to [`MAX_ROWS`] rows.
    #[target_feature(enable = "avx512f")]
    pub unsafe fn outputs(runs: HeadRunsSlice<'_>, probs: &[f32], keys: usize, d: usize, out: &mut [f32]) {
        match out.len() / d {
            1 => outputs_of::<1>(runs, probs, keys, d, out),
            2 => outputs_of::<2>(runs, probs, keys, d, out),
            3 => outputs_of::<3>(runs, probs, keys, d, out),
            4 => outputs_of::<4>(runs, probs, keys, d, out),
            5 => outputs_of::<5>(runs, probs, keys, d, out),
            6 => outputs_of::<6>(runs, probs, keys, d, out),
            7 => outputs_of::<7>(runs, probs, keys, d, out),
            rows => {
                assert_eq!(rows, MAX_ROWS);
                outputs_of::<MAX_ROWS>(runs, probs, keys, d, out)
            }
        }
    }

    /// `ROWS` rows' accumulators in registers, 32 output floats at a time (then 16), so each
    /// broadcast probability serves two products.
    #[target_feature(enable = "avx512f")]
    unsafe fn outputs_of<const ROWS: usize>(runs: HeadRunsSlice<'_>, probs: &[f32], keys: usize, d: usize, out: &mut [f32]) {
        assert!(probs.len() >= ROWS * keys && out.len() == ROWS * d);
        let pairs = d / (2 * LANES) * 2 * LANES;
        for c in (0..pairs).step_by(2 * LANES) {
            let mut acc = [[_mm512_setzero_ps(); 2]; ROWS];
            let mut j = 0;
            for &(_, vs) in runs {
                for v in vs.chunks_exact(d) {
                    let v = [_mm512_loadu_ps(v.as_ptr().add(c)), _mm512_loadu_ps(v.as_ptr().add(c + LANES))];
                    for (r, a) in acc.iter_mut().enumerate() {
                        let p = _mm512_set1_ps(*probs.get_unchecked(r * keys + j));
                        a[0] = _mm512_fmadd_ps(p, v[0], a[0]);
                        a[1] = _mm512_fmadd_ps(p, v[1], a[1]);
                    }
                    j += 1;
                }
            }
            for (r, a) in acc.iter().enumerate() {
                _mm512_storeu_ps(out.as_mut_ptr().add(r * d + c), a[0]);
                _mm512_storeu_ps(out.as_mut_ptr().add(r * d + c + LANES), a[1]);
            }
        }
        for c in (pairs..d).step_by(LANES) {
            let mut acc = [_mm512_setzero_ps(); ROWS];
            let mut j = 0;
            for &(_, vs) in runs {
                for v in vs.chunks_exact(d) {
                    let v = _mm512_loadu_ps(v.as_ptr().add(c));
                    for (r, a) in acc.iter_mut().enumerate() {
                        *a = _mm512_fmadd_ps(_mm512_set1_ps(*probs.get_unchecked(r * keys + j)), v, *a);
                    }
                    j += 1;
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

    fn sample(n: usize, seed: u32) -> Vec<f32> {
        (0..n).map(|i| (((i as u32).wrapping_mul(2654435761).wrapping_add(seed) % 1000) as f32 / 500.0) - 1.0).collect()
    }

    /// Keys/values `(positions, d)` of one head cut into runs of `block` positions.
    fn runs<'a>(keys: &'a [f32], values: &'a [f32], d: usize, block: usize) -> HeadRuns<'a> {
        HeadRuns { runs: keys.chunks(block * d).zip(values.chunks(block * d)).collect() }
    }

    /// Textbook attention in f64.
    fn reference(q: &[f32], k: &[f32], v: &[f32], d: usize, scale: f32, range: (usize, usize)) -> Vec<f64> {
        let scores: Vec<f64> = (range.0..=range.1).map(|j| (0..d).map(|c| q[c] as f64 * k[j * d + c] as f64).sum::<f64>() * scale as f64).collect();
        let max = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let e: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
        let total: f64 = e.iter().sum();
        (0..d).map(|c| (range.0..=range.1).zip(&e).map(|(j, p)| p / total * v[j * d + c] as f64).sum()).collect()
    }

    #[test]
    fn matches_textbook_attention_with_causal_and_window_masks() {
        let (kv_heads, group, d, past, new) = (2, 3, 48, 9, 4);
        let total = past + new;
        let keys: Vec<Vec<f32>> = (0..kv_heads).map(|h| sample(total * d, 10 + h as u32)).collect();
        let values: Vec<Vec<f32>> = (0..kv_heads).map(|h| sample(total * d, 20 + h as u32)).collect();
        let heads: Vec<HeadRuns> = (0..kv_heads).map(|h| runs(&keys[h], &values[h], d, 5)).collect();
        let q = sample(kv_heads * group * new * d, 3);
        for window in [None, Some(4)] {
            let out = attend(&heads, &q, kv_heads * group, new, d, 0.3, Visibility { past, window });
            for head in 0..kv_heads * group {
                for i in 0..new {
                    let range = Visibility { past, window }.range(i);
                    let row = &q[(head * new + i) * d..][..d];
                    let want = reference(row, &keys[head / group], &values[head / group], d, 0.3, range);
                    for (got, want) in out[(head * new + i) * d..][..d].iter().zip(want) {
                        assert!((*got as f64 - want).abs() < 1e-5, "head {head} query {i} window {window:?}: {got} vs {want}");
                    }
                }
            }
        }
    }

    #[test]
    fn a_row_does_not_depend_on_the_rows_beside_it_or_the_block_size() {
        let (group, d, past, new) = (8, 64, 30, 6);
        let total = past + new;
        let (keys, values) = (sample(total * d, 1), sample(total * d, 2));
        let q = sample(group * new * d, 3);
        let visibility = Visibility { past, window: None };
        let together = attend(&[runs(&keys, &values, d, 16)], &q, group, new, d, 0.125, visibility);
        // Each query alone, as a decode step would run it, over other block boundaries.
        for i in 0..new {
            let qi: Vec<f32> = (0..group).flat_map(|h| q[(h * new + i) * d..][..d].to_vec()).collect();
            let seen = past + i + 1;
            let alone = attend(&[runs(&keys[..seen * d], &values[..seen * d], d, 7)], &qi, group, 1, d, 0.125, Visibility { past: past + i, window: None });
            for h in 0..group {
                assert_eq!(&alone[h * d..][..d], &together[(h * new + i) * d..][..d], "head {h} query {i}");
            }
        }
    }

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

    #[test]
    fn simd_and_portable_copies_give_the_same_bits() {
        let (d, total) = (80, 23);
        let (keys, values) = (sample(total * d, 5), sample(total * d, 6));
        let runs: Vec<(&[f32], &[f32])> = keys.chunks(8 * d).zip(values.chunks(8 * d)).collect();
        for rows in [1, 3, 8] {
            let queries: Vec<Vec<f32>> = (0..rows).map(|h| sample(d, 40 + h as u32)).collect();
            let queries: Vec<&[f32]> = queries.iter().map(Vec::as_slice).collect();
            let mut probs = vec![0f32; rows * total];
            let mut portable = vec![0f32; rows * d];
            scores_portable(&runs, &queries, d, 0.2, &mut probs, total);
            probs.chunks_exact_mut(total).for_each(softmax);
            outputs_portable(&runs, &probs, total, d, &mut portable);
            assert_eq!(attend_rows(&runs, &queries, d, 0.2), portable, "{rows} rows");
        }
    }
}

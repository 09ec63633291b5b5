//! Causal attention of a sequence's new queries, reading keys and values where the paged KV
//! store keeps them (no gathered copy of the sequence's cache per layer and step).
//!
//! One task takes one key/value head and a few consecutive new positions: every query row of
//! those positions that shares the head (up to [`TASK_ROWS`]) sees each key block converted
//! and loaded once. A decode step whose tasks would leave cores idle runs each task in phases
//! split across them (`split`: scores by ranges of keys, the softmax by rows, outputs by ranges
//! of dimensions), or, where the few-row layout is not available, splits each head's query
//! rows. Each row is still computed alone in a fixed order: a score is the fused
//! multiply-add chain of its `d` products in dimension order (scaled after), the softmax adds
//! its terms in key order, and the output adds `p·v` key by key. Keys a row does not see get
//! probability zero, which adds nothing, bit for bit. So a row's result does not depend on the
//! rows beside it (batch, chunking, task, phases), nor on the CPU: the SIMD copies give the
//! portable copy's bits.
//!
//! Scores keep one row per lane (queries transposed), so no sum is folded across lanes; a task
//! of at most four rows (a decode step) keeps a register of keys per row instead, 16 on AVX-512
//! and 8 on AVX2 (`few_rows`).
//! Keys and values stored as f16, bf16 or q8_0 are converted to f32 a run at a time as they are
//! read (values by ranges of dimensions in phases), then used exactly as f32 runs.

#[cfg(target_arch = "x86_64")]
mod few_rows;
#[cfg(target_arch = "x86_64")]
mod split;

use rayon::prelude::*;

use crate::activation::exp_nonpositive;
use crate::isa::Isa;
use crate::kv_type::KvRows;

/// Query rows per task at most (when a key/value head serves fewer query heads, a task takes
/// several positions).
const TASK_ROWS: usize = 16;
/// Query rows per register pass at most (accumulators held in registers).
const MAX_ROWS: usize = 8;
/// Output lanes per register.
const LANES: usize = 16;
/// How many runs ahead of the one being read a decode task prefetches ([`KvRows::prefetch`]).
const PREFETCH_RUNS: usize = 2;

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

/// Query rows that share their keys: each row's query and the keys `first..=last` it sees,
/// counted from the first key of the runs.
struct Rows<'q> {
    queries: Vec<&'q [f32]>,
    ranges: Vec<(usize, usize)>,
}

/// One task's keys and values (those its rows see, from the first any sees) and query rows.
struct Task<'a> {
    runs: Vec<(KvRows<'a>, KvRows<'a>)>,
    rows: Rows<'a>,
}

impl Task<'_> {
    /// Keys of the runs.
    fn keys(&self, d: usize) -> usize {
        self.runs.iter().map(|(k, _)| k.values() / d).sum()
    }
}

/// `q`: `(heads, new, d)`, heads sharing key/value head `h` being `h·group .. (h+1)·group`.
/// `threads`: the threads this sequence's attention may keep busy (its share of the pool when
/// the sequences of a batch attend at once), which decides how the work is cut, never a bit of
/// it. Returns `(heads, new, d)`.
#[allow(clippy::too_many_arguments)]
pub fn attend(
    heads: &[HeadRuns<'_>],
    q: &[f32],
    query_heads: usize,
    new: usize,
    d: usize,
    scale: f32,
    visibility: Visibility,
    threads: usize,
) -> Vec<f32> {
    let group = query_heads / heads.len().max(1);
    let isa = isa_for(d);
    let (first, last) = visibility.range(0);
    let tasks = Tasks::plan(heads.len(), group, new, threads.max(1), |rows| {
        splittable(isa, rows, d, last + 1 - first)
    });
    let list: Vec<Task> = tasks
        .list
        .iter()
        .map(|&(h, first_i, first_head)| {
            let last_i = (first_i + tasks.positions).min(new) - 1;
            let (from, to) = (visibility.range(first_i).0, visibility.range(last_i).1);
            let runs = visible_runs(&heads[h].runs, d, from, to + 1);
            let mut rows = Rows { queries: Vec::new(), ranges: Vec::new() };
            for i in first_i..=last_i {
                let (first, last) = visibility.range(i);
                for head in h * group + first_head..h * group + tasks.part_end(first_head) {
                    rows.queries.push(&q[(head * new + i) * d..][..d]);
                    rows.ranges.push((first - from, last - from));
                }
            }
            Task { runs, rows }
        })
        .collect();
    let outputs: Vec<Vec<f32>> = match tasks.phases {
        #[cfg(target_arch = "x86_64")]
        true => split::attend(isa, &list, d, scale),
        _ => list.par_iter().map(|t| attend_rows_on(isa, &t.runs, &t.rows, d, scale)).collect(),
    };
    let mut out = vec![0f32; q.len()];
    for (&(h, first_i, first_head), o) in tasks.list.iter().zip(&outputs) {
        let part = tasks.part_end(first_head) - first_head;
        for (row, o) in o.chunks_exact(d).enumerate() {
            let (i, head) = (first_i + row / part, h * group + first_head + row % part);
            out[(head * new + i) * d..][..d].copy_from_slice(o);
        }
    }
    out
}

/// How attention is cut into tasks: per key/value head, groups of positions and of the query
/// heads that share it, at most [`TASK_ROWS`] rows each.
struct Tasks {
    /// `(key/value head, first position, first query head of the group)` per task.
    list: Vec<(usize, usize, usize)>,
    positions: usize,
    /// Query heads per task.
    part: usize,
    group: usize,
    /// Whether each task runs in phases split across threads ([`split`]).
    phases: bool,
}

impl Tasks {
    /// `splittable`: whether a task of that many rows can run in phases.
    fn plan(
        kv_heads: usize,
        group: usize,
        new: usize,
        threads: usize,
        splittable: impl Fn(usize) -> bool,
    ) -> Self {
        let group = group.max(1);
        let positions = (TASK_ROWS / group).max(1);
        let whole = kv_heads * new.div_ceil(positions);
        // Whole tasks that leave a thread idle a large share of the time (fewer tasks than
        // threads, or a short last round of few) run in phases when they can; otherwise, when
        // fewer than the threads (a decode step of a model with few key/value heads), the
        // query heads of one key/value head split, each part reading the keys again.
        let uneven = !whole.is_multiple_of(threads) && whole < 4 * threads;
        let phases = uneven && splittable(group.min(TASK_ROWS) * positions.min(new));
        let parts = if whole < threads && !phases { threads.div_ceil(whole.max(1)) } else { 1 };
        let part = group.div_ceil(parts).min(TASK_ROWS);
        let list = (0..kv_heads)
            .flat_map(|h| {
                (0..new).step_by(positions).flat_map(move |i| {
                    (0..group).step_by(part).map(move |first_head| (h, i, first_head))
                })
            })
            .collect();
        Self { list, positions, part, group, phases }
    }

    /// One past the last query head (within its group) of the part starting at `first_head`.
    fn part_end(&self, first_head: usize) -> usize {
        (first_head + self.part).min(self.group)
    }
}

/// Whether a task of `rows` rows of `d` dimensions over `keys` keys can run in phases on `isa`
/// ([`split`]).
fn splittable(isa: Isa, rows: usize, d: usize, keys: usize) -> bool {
    #[cfg(target_arch = "x86_64")]
    return split::splittable(isa, rows, d, keys);
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (isa, rows, d, keys);
        false
    }
}

/// The parts of `runs` holding positions `first..end`.
fn visible_runs<'a>(
    runs: HeadRunsSlice<'a>,
    d: usize,
    first: usize,
    end: usize,
) -> Vec<(KvRows<'a>, KvRows<'a>)> {
    let mut at = 0;
    let mut visible = Vec::new();
    for &(keys, values) in runs {
        let n = keys.values() / d;
        let (from, to) = (first.clamp(at, at + n) - at, end.clamp(at, at + n) - at);
        if from < to {
            visible.push((keys.rows(d, from, to), values.rows(d, from, to)));
        }
        at += n;
    }
    visible
}

/// The copy for heads of `d` dimensions: the widest the CPU runs, but AVX-512 only for `d` a
/// multiple of 16.
fn isa_for(d: usize) -> Isa {
    match Isa::best() {
        Isa::Avx512 if !d.is_multiple_of(LANES) => Isa::Avx2,
        isa => isa,
    }
}

/// The outputs (`rows × d`) of `rows` over the keys of `runs`, by the copy for `isa`, which the
/// CPU must run (the AVX-512 copy needs `d` a multiple of 16).
fn attend_rows_on(
    isa: Isa,
    runs: HeadRunsSlice<'_>,
    rows: &Rows<'_>,
    d: usize,
    scale: f32,
) -> Vec<f32> {
    match isa {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: the CPU has the features the copy is compiled for (the caller's promise).
        Isa::Avx512 => unsafe { avx512::attend_rows(runs, rows, d, scale) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as above.
        Isa::Avx2 => unsafe { attend_rows_avx2(runs, rows, d, scale) },
        // SAFETY: the portable copy runs anywhere.
        _ => unsafe { attend_rows_with(Isa::Portable, runs, rows, d, scale) },
    }
}

/// The portable copy compiled with hardware fused multiply-add (without it `mul_add` is a
/// library call) and F16C conversions.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn attend_rows_avx2(
    runs: HeadRunsSlice<'_>,
    rows: &Rows<'_>,
    d: usize,
    scale: f32,
) -> Vec<f32> {
    // SAFETY: this function's features are those of the AVX2 copy.
    unsafe { attend_rows_with(Isa::Avx2, runs, rows, d, scale) }
}

/// Scores run by run, the softmax, then the outputs run by run, each run's keys or values
/// converted to f32 (when stored otherwise) just before they are used. Scores and
/// probabilities are kept key by key with the rows side by side (`keys × TASK_ROWS`), so one
/// register holds one key's scores for every row and the softmax runs down the lanes.
///
/// # Safety
/// The CPU runs `isa`.
// No closures on this path: a closure is compiled on its own, without the caller's `fma`, and
// then each `mul_add` in it is a library call (it was ~19% of a prefill).
#[inline(always)]
unsafe fn attend_rows_with(
    isa: Isa,
    runs: HeadRunsSlice<'_>,
    rows: &Rows<'_>,
    d: usize,
    scale: f32,
) -> Vec<f32> {
    #[cfg(target_arch = "x86_64")]
    if few_rows::takes(isa, rows.queries.len(), d) {
        // SAFETY: the caller's promise.
        return unsafe { few_rows::attend(isa, runs, rows, d, scale) };
    }
    // SAFETY: the caller's promise.
    unsafe { attend_wide_with(isa, runs, rows, d, scale) }
}

/// The wide layout: one row per lane.
///
/// # Safety
/// The CPU runs `isa`.
#[inline(always)]
unsafe fn attend_wide_with(
    isa: Isa,
    runs: HeadRunsSlice<'_>,
    rows: &Rows<'_>,
    d: usize,
    scale: f32,
) -> Vec<f32> {
    let count = rows.queries.len();
    assert!(count <= TASK_ROWS, "attention task of {count} rows");
    let keys: usize = runs.iter().map(|(k, _)| k.values() / d).sum();
    // The queries transposed: `d × TASK_ROWS`, missing rows zero.
    let mut queries = vec![0f32; d * TASK_ROWS];
    for (r, q) in rows.queries.iter().enumerate() {
        for (c, &x) in q[..d].iter().enumerate() {
            queries[c * TASK_ROWS + r] = x;
        }
    }
    let mut probs = vec![0f32; keys * TASK_ROWS];
    let mut scratch = Vec::new();
    let mut first = 0;
    for &(run, _) in runs {
        let run = run.to_f32_on(isa, &mut scratch);
        let probs = &mut probs[first * TASK_ROWS..];
        // A key's 16 rows fill one AVX-512 register: eight keys make the eight independent
        // chains two FMA units need; in AVX2 registers four keys already do (and eight spill).
        match isa {
            Isa::Avx512 => scores::<8>(run, &queries, d, scale, probs),
            _ => scores::<4>(run, &queries, d, scale, probs),
        }
        first += run.len() / d;
    }
    softmax(&mut probs, &rows.ranges);
    let mut out = vec![0f32; count * d];
    let mut first = 0;
    for &(_, values) in runs {
        let values = values.to_f32_on(isa, &mut scratch);
        for (r0, out) in (0..).step_by(MAX_ROWS).zip(out.chunks_mut(MAX_ROWS * d)) {
            let probs = &probs[first * TASK_ROWS + r0..];
            // SAFETY: the caller's promise.
            unsafe { outputs_on(isa, values, probs, (TASK_ROWS, 1), d, out) };
        }
        first += values.len() / d;
    }
    out
}

/// `probs[j · TASK_ROWS + r]` = `scale · Σ_c query r[c] · key j[c]`, one fused chain in
/// dimension order, for the keys `keys` (`n × d`) and the transposed `queries`; `KEYS` keys at
/// once (independent chains of fused multiply-adds).
#[inline(always)]
fn scores<const KEYS: usize>(
    keys: &[f32],
    queries: &[f32],
    d: usize,
    scale: f32,
    probs: &mut [f32],
) {
    let n = keys.len() / d;
    for j0 in (0..n).step_by(KEYS) {
        // A short last group repeats its last key; the repeats are not stored.
        let group: [&[f32]; KEYS] = std::array::from_fn(|t| &keys[(j0 + t).min(n - 1) * d..][..d]);
        let mut sums = [[0f32; TASK_ROWS]; KEYS];
        for (c, q) in queries.chunks_exact(TASK_ROWS).enumerate() {
            for (sums, k) in sums.iter_mut().zip(group) {
                let x = k[c];
                for (s, q) in sums.iter_mut().zip(q) {
                    *s = q.mul_add(x, *s);
                }
            }
        }
        for (t, sums) in sums.iter().enumerate().take(n - j0) {
            for (p, s) in probs[(j0 + t) * TASK_ROWS..][..TASK_ROWS].iter_mut().zip(sums) {
                *p = s * scale;
            }
        }
    }
}

/// Steps between probabilities `(of consecutive keys, of consecutive rows)`.
type ProbSteps = (usize, usize);

/// Adds the values `values` (`n × d`) to the outputs of up to [`MAX_ROWS`] rows by the kernels
/// of `isa`; `probs[j · steps.0 + r · steps.1]` is row `r`'s probability of value `j`.
#[inline(always)]
unsafe fn outputs_on(
    isa: Isa,
    values: &[f32],
    probs: &[f32],
    steps: ProbSteps,
    d: usize,
    out: &mut [f32],
) {
    #[cfg(target_arch = "x86_64")]
    if isa == Isa::Avx512 {
        // SAFETY: the caller's promise.
        return unsafe { avx512::outputs(values, probs, steps, d, out) };
    }
    let _ = isa;
    outputs_portable(values, probs, steps, d, out)
}

/// `out[r] += Σ_j probs[j · steps.0 + r · steps.1] · value j`, in key order.
#[inline(always)]
fn outputs_portable(values: &[f32], probs: &[f32], steps: ProbSteps, d: usize, out: &mut [f32]) {
    for (j, v) in values.chunks_exact(d).enumerate() {
        for (r, o) in out.chunks_exact_mut(d).enumerate() {
            let p = probs[j * steps.0 + r * steps.1];
            for (o, x) in o.iter_mut().zip(v) {
                *o = p.mul_add(*x, *o);
            }
        }
    }
}

/// Per row (lane), the softmax of the scores of the keys `first..=last` it sees, terms added
/// in key order; every other key gets probability zero.
#[inline(always)]
fn softmax(probs: &mut [f32], ranges: &[(usize, usize)]) {
    let (mut first, mut last) = ([usize::MAX; TASK_ROWS], [0usize; TASK_ROWS]);
    for (r, &(f, l)) in ranges.iter().enumerate() {
        (first[r], last[r]) = (f, l);
    }
    let mut max = [f32::NEG_INFINITY; TASK_ROWS];
    for (j, p) in probs.chunks_exact(TASK_ROWS).enumerate() {
        for r in 0..TASK_ROWS {
            if first[r] <= j && j <= last[r] {
                max[r] = max[r].max(p[r]);
            }
        }
    }
    let mut sum = [0f32; TASK_ROWS];
    for (j, p) in probs.chunks_exact_mut(TASK_ROWS).enumerate() {
        for r in 0..TASK_ROWS {
            let e = exp_nonpositive(p[r] - max[r]);
            p[r] = if first[r] <= j && j <= last[r] { e } else { 0.0 };
            sum[r] += p[r];
        }
    }
    // Rows past the last have no keys: their zeros stay zeros.
    let divisor = sum.map(|s| if s > 0.0 { s } else { 1.0 });
    for p in probs.chunks_exact_mut(TASK_ROWS) {
        for r in 0..TASK_ROWS {
            p[r] /= divisor[r];
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use std::arch::x86_64::*;

    use super::{attend_rows_with, HeadRunsSlice, Isa, ProbSteps, Rows, LANES, MAX_ROWS};

    /// [`super::attend_rows_with`] with AVX-512 scores, outputs and conversions.
    #[target_feature(enable = "avx512f,avx2,fma,f16c")]
    pub unsafe fn attend_rows(
        runs: HeadRunsSlice<'_>,
        rows: &Rows<'_>,
        d: usize,
        scale: f32,
    ) -> Vec<f32> {
        // SAFETY: the caller checked the features these copies are compiled for.
        unsafe { attend_rows_with(Isa::Avx512, runs, rows, d, scale) }
    }

    /// [`super::outputs_portable`] for `d` a multiple of 16, up to [`MAX_ROWS`] rows.
    #[target_feature(enable = "avx512f")]
    pub unsafe fn outputs(vs: &[f32], probs: &[f32], steps: ProbSteps, d: usize, out: &mut [f32]) {
        match out.len() / d {
            1 => outputs_of::<1>(vs, probs, steps, d, out),
            2 => outputs_of::<2>(vs, probs, steps, d, out),
            3 => outputs_of::<3>(vs, probs, steps, d, out),
            4 => outputs_of::<4>(vs, probs, steps, d, out),
            5 => outputs_of::<5>(vs, probs, steps, d, out),
            6 => outputs_of::<6>(vs, probs, steps, d, out),
            7 => outputs_of::<7>(vs, probs, steps, d, out),
            rows => {
                assert_eq!(rows, MAX_ROWS);
                outputs_of::<MAX_ROWS>(vs, probs, steps, d, out)
            }
        }
    }

    /// `ROWS` rows' accumulators in registers, 32 output floats at a time (then 16), so each
    /// broadcast probability serves two products. The accumulators start from `out` (what the
    /// earlier runs added), so a row's sums run through all keys in order, run after run.
    #[target_feature(enable = "avx512f")]
    unsafe fn outputs_of<const ROWS: usize>(
        vs: &[f32],
        probs: &[f32],
        (key_step, row_step): ProbSteps,
        d: usize,
        out: &mut [f32],
    ) {
        let keys = vs.len() / d;
        assert!(keys == 0 || probs.len() > (keys - 1) * key_step + (ROWS - 1) * row_step);
        assert!(out.len() == ROWS * d);
        let pairs = d / (2 * LANES) * 2 * LANES;
        for c in (0..pairs).step_by(2 * LANES) {
            let mut acc = [[_mm512_setzero_ps(); 2]; ROWS];
            for (r, a) in acc.iter_mut().enumerate() {
                *a = [
                    _mm512_loadu_ps(out.as_ptr().add(r * d + c)),
                    _mm512_loadu_ps(out.as_ptr().add(r * d + c + LANES)),
                ];
            }
            for (j, v) in vs.chunks_exact(d).enumerate() {
                let v = [
                    _mm512_loadu_ps(v.as_ptr().add(c)),
                    _mm512_loadu_ps(v.as_ptr().add(c + LANES)),
                ];
                for (r, a) in acc.iter_mut().enumerate() {
                    let p = _mm512_set1_ps(*probs.get_unchecked(j * key_step + r * row_step));
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
            for (j, v) in vs.chunks_exact(d).enumerate() {
                let v = _mm512_loadu_ps(v.as_ptr().add(c));
                for (r, a) in acc.iter_mut().enumerate() {
                    *a = _mm512_fmadd_ps(
                        _mm512_set1_ps(*probs.get_unchecked(j * key_step + r * row_step)),
                        v,
                        *a,
                    );
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
    use crate::test_data::sample;

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
            let out = attend(
                &heads,
                &q,
                kv_heads * group,
                new,
                d,
                0.3,
                Visibility { past, window },
                rayon::current_num_threads(),
            );
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
        let (d, past, new) = (64, 30, 6);
        let total = past + new;
        // 8 query heads per key/value head: a task takes 2 positions (a decode step, alone,
        // splits them on 2 cores); 2 heads: all 6 positions, each seeing other keys through
        // the window; 20 heads: more than a task's 16 rows; 3 and 4 heads: a decode step's rows
        // take the few-row layout.
        for (group, window) in [(8, None), (2, Some(20)), (20, None), (3, None), (4, Some(9))] {
            let q = sample(group * new * d, 3);
            for kind in KvType::ALL {
                let (keys, values) = (
                    Stored::new(kind, &sample(total * d, 1)),
                    Stored::new(kind, &sample(total * d, 2)),
                );
                let heads = [runs(keys.rows(), values.rows(), d, 16)];
                let together = attend(
                    &heads,
                    &q,
                    group,
                    new,
                    d,
                    0.125,
                    Visibility { past, window },
                    rayon::current_num_threads(),
                );
                // Each query alone, as a decode step would run it, over other block boundaries.
                for i in 0..new {
                    let qi: Vec<f32> =
                        (0..group).flat_map(|h| q[(h * new + i) * d..][..d].to_vec()).collect();
                    let seen = past + i + 1;
                    let (k, v) = (keys.rows().rows(d, 0, seen), values.rows().rows(d, 0, seen));
                    let visibility = Visibility { past: past + i, window };
                    let alone = attend(
                        &[runs(k, v, d, 7)],
                        &qi,
                        group,
                        1,
                        d,
                        0.125,
                        visibility,
                        rayon::current_num_threads(),
                    );
                    for h in 0..group {
                        assert_eq!(
                            bits(&alone[h * d..][..d]),
                            bits(&together[(h * new + i) * d..][..d]),
                            "{kind}: group {group}, head {h} query {i}"
                        );
                    }
                }
            }
        }
    }

    /// The portable copy of the wide layout over all keys in one run: the order every copy and
    /// layout must keep.
    fn one_piece(
        keys: &[f32],
        values: &[f32],
        queries: &[&[f32]],
        d: usize,
        scale: f32,
    ) -> Vec<f32> {
        let total = keys.len() / d;
        let rows = Rows { queries: queries.to_vec(), ranges: vec![(0, total - 1); queries.len()] };
        let run = [(KvRows::F32(keys), KvRows::F32(values))];
        // SAFETY: the portable copy runs anywhere.
        unsafe { attend_wide_with(Isa::Portable, &run, &rows, d, scale) }
    }

    #[test]
    fn every_copy_gives_the_same_bits_for_every_kv_type() {
        // d = 80: the AVX-512 outputs run a pair of registers, then one; d = 96 for q8_0; 72
        // and 40: AVX2's few-row layout, not AVX-512's.
        let sizes = [(KvType::F32, 80), (KvType::F16, 80), (KvType::Bf16, 80), (KvType::Q8_0, 96)];
        for (kind, d) in sizes.into_iter().chain([(KvType::F16, 72), (KvType::F32, 40)]) {
            let total = 23;
            let (keys, values) = (
                Stored::new(kind, &sample(total * d, 5)),
                Stored::new(kind, &sample(total * d, 6)),
            );
            let head = runs(keys.rows(), values.rows(), d, 8);
            // Up to 4 rows take the few-row layout.
            for rows in [1, 2, 3, 4, 5, 8, 13] {
                let queries: Vec<Vec<f32>> = (0..rows).map(|h| sample(d, 40 + h as u32)).collect();
                let queries: Vec<&[f32]> = queries.iter().map(Vec::as_slice).collect();
                let want =
                    bits(&one_piece(&keys.dequantized(), &values.dequantized(), &queries, d, 0.2));
                let rows = Rows { queries, ranges: vec![(0, total - 1); rows] };
                let isas = Isa::available().into_iter();
                for isa in isas.filter(|&isa| isa != Isa::Avx512 || d.is_multiple_of(LANES)) {
                    assert_eq!(
                        bits(&attend_rows_on(isa, &head.runs, &rows, d, 0.2)),
                        want,
                        "{kind}, {} rows, {isa:?}",
                        rows.queries.len()
                    );
                }
            }
        }
    }

    /// The rows of `queries` (`rows × d`) over `keys` keys, row `r` seeing up to key
    /// `keys − rows + r` (as consecutive positions do), back as far as `window` allows.
    fn decode_rows(queries: &[f32], d: usize, keys: usize, window: Option<usize>) -> Rows<'_> {
        let count = queries.len() / d;
        let ranges = (0..count).map(|r| {
            let last = keys - count + r;
            (window.map_or(0, |w| (last + 1).saturating_sub(w)), last)
        });
        Rows { queries: queries.chunks_exact(d).collect(), ranges: ranges.collect() }
    }

    #[test]
    #[cfg(target_arch = "x86_64")]
    fn a_task_in_phases_gives_the_bits_it_gives_whole() {
        // d = 64: one range of dimensions; 256: four; 80 (f32, f16): a short last range; 72:
        // AVX2 only. Key counts split in ranges (by 1 to 3 threads) not all multiples of the
        // few-row layout's chunks (64 keys on AVX-512, 16 on AVX2).
        let pools: Vec<_> = (1..=3)
            .map(|threads| rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap())
            .collect();
        for (d, kind) in [
            (64, KvType::F16),
            (64, KvType::Q8_0),
            (256, KvType::F16),
            (256, KvType::Q8_0),
            (80, KvType::F32),
            (80, KvType::F16),
            (72, KvType::F16),
        ] {
            for keys in [512, 700, 1029] {
                let (k, v) = (
                    Stored::new(kind, &sample(keys * d, 60)),
                    Stored::new(kind, &sample(keys * d, 61)),
                );
                let head = runs(k.rows(), v.rows(), d, 16);
                for (count, window) in [(1, None), (2, Some(600)), (3, None), (4, Some(333))] {
                    let queries = sample(count * d, 62 + count as u32);
                    let task = Task {
                        runs: head.runs.clone(),
                        rows: decode_rows(&queries, d, keys, window),
                    };
                    let isas = Isa::available().into_iter();
                    for isa in isas.filter(|&isa| split::splittable(isa, count, d, keys)) {
                        let whole = attend_rows_on(isa, &task.runs, &task.rows, d, 0.125);
                        for (threads, pool) in (1..).zip(&pools) {
                            let tasks = std::slice::from_ref(&task);
                            assert_eq!(
                                bits(&pool.install(|| split::attend(isa, tasks, d, 0.125))[0]),
                                bits(&whole),
                                "{kind}, d {d}, {keys} keys, {count} rows, window {window:?}, \
                                 {isa:?}, {threads} threads"
                            );
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn decode_steps_that_leave_threads_idle_run_in_phases_where_they_can() {
        let can = |_: usize| true;
        // SmolLM2 (3 key/value heads of 3 query heads) and Gemma 3 (1 of 4) on 2 threads.
        assert!(Tasks::plan(3, 3, 1, 2, can).phases);
        let gemma = Tasks::plan(1, 4, 1, 2, can);
        assert!(gemma.phases && gemma.list.len() == 1 && gemma.part == 4);
        // As many tasks as threads, or many: whole tasks.
        assert!(!Tasks::plan(2, 3, 1, 2, can).phases && !Tasks::plan(9, 3, 1, 2, can).phases);
        // Where phases are not available, Gemma's query heads split in two.
        let gemma = Tasks::plan(1, 4, 1, 2, |_| false);
        assert!(!gemma.phases && gemma.list.len() == 2 && gemma.part == 2);
        // The rows asked about are a whole task's.
        assert!(!Tasks::plan(3, 3, 1, 2, |rows| rows != 3).phases);
        assert!(!Tasks::plan(3, 3, 3, 2, |rows| rows <= 4).phases);
        // A sequence of a batch with its share of one thread: whole tasks, the heads unsplit.
        let batched = Tasks::plan(1, 4, 1, 1, can);
        assert!(!batched.phases && batched.list.len() == 1 && batched.part == 4);
        assert!(!Tasks::plan(3, 3, 1, 1, can).phases);
    }

    #[test]
    fn a_decode_step_gives_the_same_bits_on_one_thread_as_split_across_two() {
        let pool = |threads| rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
        let (one, two) = (pool(1), pool(2));
        // SmolLM2's heads and Gemma 3's (with its sliding window), over f16 and q8_0.
        for (kv_heads, group, d, window) in [(3, 3, 64, None), (1, 4, 256, Some(700))] {
            let past = 1100;
            let q = sample(kv_heads * group * d, 70);
            for kind in [KvType::F16, KvType::Q8_0] {
                let stored: Vec<(Stored, Stored)> = (0..kv_heads)
                    .map(|h| {
                        let seed = 71 + 2 * h as u32;
                        let (k, v) =
                            (sample((past + 1) * d, seed), sample((past + 1) * d, seed + 1));
                        (Stored::new(kind, &k), Stored::new(kind, &v))
                    })
                    .collect();
                let heads: Vec<HeadRuns> =
                    stored.iter().map(|(k, v)| runs(k.rows(), v.rows(), d, 32)).collect();
                let visibility = Visibility { past, window };
                let step = || {
                    attend(
                        &heads,
                        &q,
                        kv_heads * group,
                        1,
                        d,
                        0.125,
                        visibility,
                        rayon::current_num_threads(),
                    )
                };
                assert_eq!(
                    bits(&one.install(step)),
                    bits(&two.install(step)),
                    "{kind}: {kv_heads} × {group} heads of {d}"
                );
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
                let got = attend(
                    &typed,
                    &q,
                    kv_heads * group,
                    new,
                    d,
                    0.125,
                    visibility,
                    rayon::current_num_threads(),
                );
                assert_eq!(
                    bits(&got),
                    bits(&attend(
                        &floats,
                        &q,
                        kv_heads * group,
                        new,
                        d,
                        0.125,
                        visibility,
                        rayon::current_num_threads()
                    )),
                    "{kind} {window:?}"
                );
            }
        }
    }
}

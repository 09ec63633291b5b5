//! The wide layout, for tasks of many query rows (a prompt's chunk): rows side by side, 16 to
//! a group, one row per lane, so a register holds one key's scores for 16 (AVX-512) or 8
//! (AVX2) rows and the softmax runs down the lanes with no sum folded across them.
//!
//! Tile by tile ([`online`]: [`online::TILE`] keys at fixed positions), the tile's keys are
//! converted to f32 once and serve every row group, then its values:
//! 1. scores: per group, a register-blocked kernel (several keys × the group's lanes held in
//!    registers through all `d` dimensions), scaled after;
//! 2. the online softmax's step, lane by lane: the running maxima, the factors, the
//!    exponentials and their sums in key order;
//! 3. the outputs rescaled where a maximum grew, then the values added ([`super::outputs`]).
//!
//! A score is the fused chain of its `d` products in dimension order, and each step is the
//! one every layout takes: a row's bits depend on neither its neighbours, nor the tiles' cut
//! into the task's runs, nor the copy.

use std::cell::Cell;

use super::online::{self, TILE};
use super::outputs;
use super::{HeadRunsSlice, Isa, Rows};
use crate::activation::exp_nonpositive;
use crate::kv_type::KvRows;

/// Rows per group: one lane each.
pub(super) const GROUP_ROWS: usize = 16;

/// A key's scores (or probabilities) of a group's lanes.
type LaneScores = [f32; GROUP_ROWS];

/// The scores `keys × GROUP_ROWS` key by key (the loops over a key's lanes then vectorize).
#[inline(always)]
fn by_key(scores: &mut [f32]) -> &mut [LaneScores] {
    let (keys, rest) = scores.as_chunks_mut::<GROUP_ROWS>();
    assert!(rest.is_empty(), "scores of a partial key");
    keys
}

/// Per lane, the keys `first..=last` its row sees (counted from the task's first key); lanes
/// without a row see every key (their results are dropped), so they never hold a tile back
/// from the unmasked path. Signed, so the lanes compare in single instructions.
struct Lanes {
    first: [i32; GROUP_ROWS],
    last: [i32; GROUP_ROWS],
    /// Keys every lane sees: `all.0..=all.1` (empty when `all.0 > all.1`).
    all: (usize, usize),
}

/// A group's online softmax state: per lane, the running maximum and sum, and the last tile's
/// factor of the outputs.
struct GroupState {
    max: LaneScores,
    sum: LaneScores,
    factor: LaneScores,
}

impl Lanes {
    fn new(ranges: &[(usize, usize)]) -> Self {
        let (mut first, mut last) = ([0i32; GROUP_ROWS], [i32::MAX; GROUP_ROWS]);
        for (r, &(f, l)) in ranges.iter().enumerate() {
            let key = |k: usize| i32::try_from(k).expect("keys of one attention task");
            (first[r], last[r]) = (key(f), key(l));
        }
        let all = (
            ranges.iter().map(|r| r.0).max().unwrap_or(0),
            ranges.iter().map(|r| r.1).min().unwrap_or(usize::MAX),
        );
        Self { first, last, all }
    }

    /// Whether every lane sees keys `from..to`.
    fn sees_all(&self, from: usize, to: usize) -> bool {
        self.all.0 <= from && to <= self.all.1.saturating_add(1)
    }

    /// Which lanes see key `j`.
    #[inline(always)]
    fn seen(&self, j: i32) -> [bool; GROUP_ROWS] {
        let mut seen = [false; GROUP_ROWS];
        for ((seen, first), last) in seen.iter_mut().zip(self.first).zip(self.last) {
            *seen = first <= j && j <= last;
        }
        seen
    }

    /// The online softmax's step over one tile ([`online`]): `scores` (`keys × GROUP_ROWS`,
    /// the first being key `from`) become probabilities; returns whether a factor is not 1.
    #[inline(always)]
    fn step(&self, scores: &mut [f32], from: usize, state: &mut GroupState) -> bool {
        let old = state.max;
        self.fold_max(scores, from, &mut state.max);
        let GroupState { max, sum, factor } = state;
        let lanes = old.iter().zip(max.iter()).zip(sum.iter_mut()).zip(factor.iter_mut());
        for (((&old, &max), sum), factor) in lanes {
            let e = exp_nonpositive(old - max);
            *factor = if max > old { e } else { 1.0 };
            *sum *= *factor;
        }
        self.exponentials(scores, from, &state.max, &mut state.sum);
        state.factor != [1.0; GROUP_ROWS]
    }

    /// Folds the scores `scores` (`keys × GROUP_ROWS`, the first being key `from`) into each
    /// lane's maximum over the keys it sees.
    #[inline(always)]
    fn fold_max(&self, scores: &mut [f32], from: usize, max: &mut LaneScores) {
        let keys = scores.len() / GROUP_ROWS;
        // In registers: through `max` in memory, each key would wait for the last one's store.
        let mut running = *max;
        if self.sees_all(from, from + keys) {
            for s in by_key(scores).iter() {
                for r in 0..GROUP_ROWS {
                    running[r] = larger(running[r], s[r]);
                }
            }
        } else {
            for (j, s) in (from as i32..).zip(by_key(scores).iter()) {
                let seen = self.seen(j);
                for r in 0..GROUP_ROWS {
                    let s = if seen[r] { s[r] } else { f32::NEG_INFINITY };
                    running[r] = larger(running[r], s);
                }
            }
        }
        *max = running;
    }

    /// Replaces the scores (`keys × GROUP_ROWS`, the first being key `from`) by
    /// `e^(score − max)` where the lane sees the key and 0 elsewhere, and adds them to each
    /// lane's sum in key order.
    #[inline(always)]
    fn exponentials(
        &self,
        scores: &mut [f32],
        from: usize,
        max: &LaneScores,
        sum: &mut LaneScores,
    ) {
        let keys = scores.len() / GROUP_ROWS;
        // The keys every lane sees take the unmasked loop; those before and after, the masked.
        let start = self.all.0.clamp(from, from + keys) - from;
        let end = self.all.1.saturating_add(1).clamp(from + start, from + keys) - from;
        let (head, rest) = scores.split_at_mut(start * GROUP_ROWS);
        let (middle, tail) = rest.split_at_mut((end - start) * GROUP_ROWS);
        self.masked_exponentials(head, from, max, sum);
        for s in by_key(middle) {
            for r in 0..GROUP_ROWS {
                s[r] = exp_nonpositive(s[r] - max[r]);
            }
        }
        add_keys(middle, sum);
        self.masked_exponentials(tail, from + end, max, sum);
    }

    #[inline(always)]
    fn masked_exponentials(
        &self,
        scores: &mut [f32],
        from: usize,
        max: &LaneScores,
        sum: &mut LaneScores,
    ) {
        for (j, s) in (from as i32..).zip(by_key(scores)) {
            let seen = self.seen(j);
            for r in 0..GROUP_ROWS {
                let e = exp_nonpositive(s[r] - max[r]);
                s[r] = if seen[r] { e } else { 0.0 };
            }
        }
        add_keys(scores, sum);
    }
}

/// Adds the probabilities `probs` (`keys × GROUP_ROWS`) to each lane's sum in key order, in a
/// loop of its own: beside the exponentials, the sums went through memory, each key waiting
/// for the last one's store.
#[inline(always)]
fn add_keys(probs: &[f32], sum: &mut LaneScores) {
    let mut running = *sum;
    for p in probs.as_chunks::<GROUP_ROWS>().0 {
        for r in 0..GROUP_ROWS {
            running[r] += p[r];
        }
    }
    *sum = running;
}

/// The larger of `a` and `b`, in one instruction (`f32::max` adds a NaN check per lane; scores
/// are not NaN, and which of ±0 it keeps changes no probability).
#[inline(always)]
fn larger(a: f32, b: f32) -> f32 {
    if b > a {
        b
    } else {
        a
    }
}

/// The outputs (`rows × d`) of `rows` over the keys of `runs`.
///
/// # Safety
/// The CPU runs `isa`, which the caller is compiled for (AVX-512 with `d` a multiple of 16).
#[inline(always)]
pub(super) unsafe fn attend(
    isa: Isa,
    runs: HeadRunsSlice<'_>,
    rows: &Rows<'_>,
    d: usize,
    scale: f32,
) -> Vec<f32> {
    let count = rows.queries.len();
    let groups = count.div_ceil(GROUP_ROWS);
    // Per group, its queries transposed (`d × GROUP_ROWS`, missing rows zero).
    let mut queries = vec![0f32; groups * d * GROUP_ROWS];
    for (r, q) in rows.queries.iter().enumerate() {
        let group = &mut queries[r / GROUP_ROWS * d * GROUP_ROWS..][..d * GROUP_ROWS];
        for (c, &x) in q[..d].iter().enumerate() {
            group[c * GROUP_ROWS + r % GROUP_ROWS] = x;
        }
    }
    let lanes: Vec<Lanes> = rows.ranges.chunks(GROUP_ROWS).map(Lanes::new).collect();
    let mut states: Vec<GroupState> = (0..groups)
        .map(|_| GroupState {
            max: [f32::NEG_INFINITY; GROUP_ROWS],
            sum: [0.0; GROUP_ROWS],
            factor: [1.0; GROUP_ROWS],
        })
        .collect();
    let mut rescaled = vec![false; groups];
    // Per group, one tile's scores then probabilities, key by key (`keys × GROUP_ROWS`), every
    // one written by the scores before it is read.
    let (mut probs_buffer, mut converted_buffer) = BUFFERS.take();
    let probs = at_least(&mut probs_buffer, groups * TILE * GROUP_ROWS);
    let converted = at_least(&mut converted_buffer, TILE * d);
    let (parts, tiles) = online::tiled(runs, d, rows.base);
    let mut out = vec![0f32; count * d];
    let mut from = 0;
    for (i, tile) in tiles.iter().enumerate() {
        for &(_, values) in &parts[tile.clone()] {
            values.prefetch();
        }
        if let Some(next) = tiles.get(i + 1) {
            for &(keys, _) in &parts[next.clone()] {
                keys.prefetch();
            }
        }
        let chunk = convert(isa, parts[tile.clone()].iter().map(|&(k, _)| k), converted);
        let n = chunk.len() / d;
        for (g, lanes) in lanes.iter().enumerate() {
            let scores = &mut probs[g * TILE * GROUP_ROWS..][..n * GROUP_ROWS];
            let queries = &queries[g * d * GROUP_ROWS..][..d * GROUP_ROWS];
            // SAFETY: the caller's promise.
            unsafe { scores_on(isa, chunk, queries, d, scale, scores) };
            rescaled[g] = lanes.step(scores, from, &mut states[g]);
        }
        let chunk = convert(isa, parts[tile.clone()].iter().map(|&(_, v)| v), converted);
        // No closures on this path: a closure is compiled without the caller's features, and
        // each `mul_add` in it would be a library call.
        for (g, out) in out.chunks_mut(GROUP_ROWS * d).enumerate() {
            if rescaled[g] {
                for (o, &factor) in out.chunks_exact_mut(d).zip(&states[g].factor) {
                    online::rescale(o, factor);
                }
            }
            let probs = &probs[g * TILE * GROUP_ROWS..][..n * GROUP_ROWS];
            // SAFETY: the caller's promise.
            unsafe { outputs::add_on(isa, chunk, probs, (GROUP_ROWS, 1), d, out) };
        }
        from += n;
    }
    for (out, state) in out.chunks_mut(GROUP_ROWS * d).zip(&states) {
        for (o, &sum) in out.chunks_exact_mut(d).zip(&state.sum) {
            online::finish(o, sum);
        }
    }
    BUFFERS.set((probs_buffer, converted_buffer));
    out
}

thread_local! {
    /// The probabilities and converted tile a thread's tasks reuse (a task's tile at a time).
    static BUFFERS: Cell<(Vec<f32>, Vec<f32>)> = const { Cell::new((Vec::new(), Vec::new())) };
}

/// The first `len` floats of `buffer`, grown (with zeros) if shorter.
fn at_least(buffer: &mut Vec<f32>, len: usize) -> &mut [f32] {
    if buffer.len() < len {
        buffer.resize(len, 0.0);
    }
    &mut buffer[..len]
}

/// The rows of `parts` back to back as f32 at the start of `converted`.
#[inline(always)]
fn convert<'c, 'a>(
    isa: Isa,
    parts: impl Iterator<Item = KvRows<'a>>,
    converted: &'c mut [f32],
) -> &'c [f32] {
    let mut at = 0;
    for part in parts {
        let n = part.values();
        part.to_f32_into(isa, &mut converted[at..at + n]);
        at += n;
    }
    &converted[..at]
}

/// `scores[j · GROUP_ROWS + r]` = `scale · Σ_c query r[c] · key j[c]` for the keys `keys`
/// (`n × d`) and a group's transposed queries, by the copy for `isa`.
///
/// # Safety
/// The CPU runs `isa`.
#[inline(always)]
unsafe fn scores_on(
    isa: Isa,
    keys: &[f32],
    queries: &[f32],
    d: usize,
    scale: f32,
    scores: &mut [f32],
) {
    assert!(queries.len() == d * GROUP_ROWS && scores.len() == keys.len() / d * GROUP_ROWS);
    match isa {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: the caller's promise; the lengths checked above.
        Isa::Avx512 => unsafe { avx512::scores(keys, queries, d, scale, scores) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as above.
        Isa::Avx2 => unsafe { avx2::scores(keys, queries, d, scale, scores) },
        _ => scores_portable(keys, queries, d, scale, scores),
    }
}

/// The order every copy keeps: per key and lane, `s = q·k + s` over the dimensions in order,
/// from zero, then `s · scale`.
fn scores_portable(keys: &[f32], queries: &[f32], d: usize, scale: f32, scores: &mut [f32]) {
    for (k, scores) in keys.chunks_exact(d).zip(scores.chunks_exact_mut(GROUP_ROWS)) {
        let mut sums = [0f32; GROUP_ROWS];
        for (q, &x) in queries.chunks_exact(GROUP_ROWS).zip(k) {
            for (s, q) in sums.iter_mut().zip(q) {
                *s = q.mul_add(x, *s);
            }
        }
        for (out, s) in scores.iter_mut().zip(sums) {
            *out = s * scale;
        }
    }
}

/// The SIMD copies' kernels, written once for either register width: the scores' register
/// blocking (`KEYS` keys' sums of the group's lanes, `REGS` registers of lanes per key, held
/// through all dimensions).
#[cfg(target_arch = "x86_64")]
macro_rules! score_kernel {
    ($name:ident, $features:literal, $vector:ty, $lanes:expr, $zero:ident, $load:ident,
     $store:ident, $broadcast:ident, $fmadd:ident, $mul:ident) => {
        /// [`super::scores_portable`] in blocks of keys held in registers.
        ///
        /// # Safety
        /// The CPU runs this function's features; `queries` is `d × 16`, `scores` 16 per key.
        #[target_feature(enable = $features)]
        pub unsafe fn scores(
            keys: &[f32],
            queries: &[f32],
            d: usize,
            scale: f32,
            scores: &mut [f32],
        ) {
            let n = keys.len() / d;
            let mut j = 0;
            // SAFETY (all calls): keys `j..j + KEYS` exist; the caller's promise.
            while j + KEYS <= n {
                unsafe { $name::<KEYS>(keys, queries, d, scale, scores, j) };
                j += KEYS;
            }
            // The last keys in blocks too: one key at a time is one chain of `d` dependent
            // multiply-adds, latency-bound (with blocks of 12, the 8 keys a tile of 32 left
            // took as long as the 24 before them).
            if n - j >= 8 {
                unsafe { $name::<8>(keys, queries, d, scale, scores, j) };
                j += 8;
            }
            unsafe {
                match n - j {
                    0 => {}
                    1 => $name::<1>(keys, queries, d, scale, scores, j),
                    2 => $name::<2>(keys, queries, d, scale, scores, j),
                    3 => $name::<3>(keys, queries, d, scale, scores, j),
                    4 => $name::<4>(keys, queries, d, scale, scores, j),
                    5 => $name::<5>(keys, queries, d, scale, scores, j),
                    6 => $name::<6>(keys, queries, d, scale, scores, j),
                    // Fewer than 8 keys are left (no copy takes blocks of more than 16).
                    _ => $name::<7>(keys, queries, d, scale, scores, j),
                }
            }
        }

        /// Keys `first..first + K`.
        ///
        /// # Safety
        /// As [`scores`]; those keys exist.
        #[inline(always)]
        unsafe fn $name<const K: usize>(
            keys: &[f32],
            queries: &[f32],
            d: usize,
            scale: f32,
            scores: &mut [f32],
            first: usize,
        ) {
            const REGS: usize = super::GROUP_ROWS / $lanes;
            // SAFETY: key `first` exists (the caller's promise).
            let (k, q) = (unsafe { keys.as_ptr().add(first * d) }, queries.as_ptr());
            let mut acc = [[$zero(); REGS]; K];
            for c in 0..d {
                let mut lanes = [$zero(); REGS];
                for (i, l) in lanes.iter_mut().enumerate() {
                    // SAFETY: dimension `c` of the group's lanes.
                    *l = unsafe { $load(q.add(c * super::GROUP_ROWS + i * $lanes)) };
                }
                for (t, acc) in acc.iter_mut().enumerate() {
                    // SAFETY: dimension `c` of key `first + t`.
                    let x = $broadcast(unsafe { *k.add(t * d + c) });
                    for (a, l) in acc.iter_mut().zip(lanes) {
                        *a = $fmadd(l, x, *a);
                    }
                }
            }
            let scale = $broadcast(scale);
            // SAFETY: key `first`'s scores exist.
            let out = unsafe { scores.as_mut_ptr().add(first * super::GROUP_ROWS) };
            for (t, acc) in acc.iter().enumerate() {
                for (i, a) in acc.iter().enumerate() {
                    // SAFETY: key `first + t`'s 16 scores.
                    unsafe { $store(out.add(t * super::GROUP_ROWS + i * $lanes), $mul(*a, scale)) };
                }
            }
        }
    };
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    /// Keys per block: 6 keys × 2 registers of sums, 2 of queries and a broadcast fill 15 of
    /// the 16 registers.
    const KEYS: usize = 6;

    score_kernel!(
        scores_of,
        "avx2,fma",
        __m256,
        8,
        _mm256_setzero_ps,
        _mm256_loadu_ps,
        _mm256_storeu_ps,
        _mm256_set1_ps,
        _mm256_fmadd_ps,
        _mm256_mul_ps
    );
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use std::arch::x86_64::*;

    /// Keys per block: 16 chains (more than two FMA units' latency needs) in 16 of the 32
    /// registers, and a tile of 32 keys is two whole blocks.
    const KEYS: usize = 16;

    score_kernel!(
        scores_of,
        "avx512f",
        __m512,
        16,
        _mm512_setzero_ps,
        _mm512_loadu_ps,
        _mm512_storeu_ps,
        _mm512_set1_ps,
        _mm512_fmadd_ps,
        _mm512_mul_ps
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_data::sample;

    #[test]
    fn every_copy_scores_in_the_portable_order() {
        for d in [8, 40, 64, 96, 256] {
            for n in [1, 5, 6, 7, 8, 12, 13, 15, 16, 23, 25, 31, 32, 64] {
                let keys = sample(n * d, n as u32);
                let queries = sample(d * GROUP_ROWS, 3);
                let mut want = vec![0f32; n * GROUP_ROWS];
                scores_portable(&keys, &queries, d, 0.3, &mut want);
                for isa in Isa::available() {
                    let mut got = vec![f32::NAN; n * GROUP_ROWS];
                    // SAFETY: the CPU runs `isa`.
                    unsafe { scores_on(isa, &keys, &queries, d, 0.3, &mut got) };
                    let bits = |x: &[f32]| x.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                    assert_eq!(bits(&got), bits(&want), "{isa:?}: d {d}, {n} keys");
                }
            }
        }
    }
}

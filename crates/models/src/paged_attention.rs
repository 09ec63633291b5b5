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
//! Scores keep one row per lane (queries transposed), so no sum is folded across lanes
//! (`wide`); a task of at most four rows (a decode step) keeps a register of keys per row
//! instead, 16 on AVX-512 and 8 on AVX2 (`few_rows`). Both add the values by the same
//! register-blocked kernels (`outputs`).
//! Keys and values stored as f16, bf16 or q8_0 are converted to f32 as they are read (a chunk
//! of runs at a time, or values by ranges of dimensions in phases), then used exactly as f32.

#[cfg(target_arch = "x86_64")]
mod few_rows;
mod online;
mod outputs;
#[cfg(target_arch = "x86_64")]
mod split;
mod wide;

use rayon::prelude::*;

use crate::isa::Isa;
use crate::kv_type::KvRows;

/// Query rows per task at most (when a key/value head serves fewer query heads, a task takes
/// several positions): four groups of the wide layout, so each key converted serves up to 64
/// rows.
const TASK_ROWS: usize = 4 * wide::GROUP_ROWS;
/// Lanes of an AVX-512 register.
const LANES: usize = 16;
/// How many runs ahead of the one being read a decode task prefetches ([`KvRows::prefetch`]).
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
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
/// counted from the first key of the runs, which sits at position `base` (where the softmax's
/// tiles are cut: [`online`]).
struct Rows<'q> {
    queries: Vec<&'q [f32]>,
    ranges: Vec<(usize, usize)>,
    base: usize,
}

/// One task's keys and values (those its rows see, from the first any sees) and query rows.
struct Task<'a> {
    runs: Vec<(KvRows<'a>, KvRows<'a>)>,
    rows: Rows<'a>,
}

impl Task<'_> {
    /// Keys of the runs.
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    fn keys(&self, d: usize) -> usize {
        self.runs.iter().map(|(k, _)| k.values() / d).sum()
    }
}

/// A sequence's new queries: `values` is `(heads, new, d)`.
#[derive(Clone, Copy)]
pub struct Queries<'q> {
    pub values: &'q [f32],
    pub heads: usize,
    pub new: usize,
    pub d: usize,
}

/// Query heads sharing key/value head `h` are `h·group .. (h+1)·group`. `threads`: the threads
/// this sequence's attention may keep busy (its share of the pool when the sequences of a batch
/// attend at once), which decides how the work is cut, never a bit of it. Returns
/// `(heads, new, d)`.
pub fn attend(
    heads: &[HeadRuns<'_>],
    queries: Queries<'_>,
    scale: f32,
    visibility: Visibility,
    threads: usize,
) -> Vec<f32> {
    let Queries { values: q, heads: query_heads, new, d } = queries;
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
            let mut rows = Rows { queries: Vec::new(), ranges: Vec::new(), base: from };
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
        let positions = positions_per_task(group, new);
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

/// Positions per task for key/value heads that `group` query heads share, `new` positions in
/// all: at most [`TASK_ROWS`] rows, the count whose rows fill the wide layout's groups of lanes
/// best, the most of those (7 heads: 9 positions, 63 rows in 64 lanes, where 4 would leave 4
/// of 32 lanes idle).
fn positions_per_task(group: usize, new: usize) -> usize {
    let most = (TASK_ROWS / group).clamp(1, new.max(1));
    let filled = |p: usize| p * group * 1024 / (p * group).next_multiple_of(wide::GROUP_ROWS);
    (1..=most).max_by_key(|&p| (filled(p), p)).unwrap_or(1)
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
        Isa::Avx512 => unsafe { attend_rows_avx512(runs, rows, d, scale) },
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

/// A task's outputs by the few-row layout where it takes the task, else the wide one.
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
    unsafe { wide::attend(isa, runs, rows, d, scale) }
}

/// [`attend_rows_with`] compiled for AVX-512.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
unsafe fn attend_rows_avx512(
    runs: HeadRunsSlice<'_>,
    rows: &Rows<'_>,
    d: usize,
    scale: f32,
) -> Vec<f32> {
    // SAFETY: this function's features are those of the AVX-512 copy.
    unsafe { attend_rows_with(Isa::Avx512, runs, rows, d, scale) }
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
                Queries { values: &q, heads: kv_heads * group, new, d },
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
        // 8 query heads per key/value head: a task takes all 6 positions (a decode step, alone,
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
                    Queries { values: &q, heads: group, new, d },
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
                        Queries { values: &qi, heads: group, new: 1, d },
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

    #[test]
    fn a_row_does_not_depend_on_where_its_chunk_starts() {
        // 150 positions read in chunks cut at different places (none, and some off the
        // softmax's tiles), each chunk attending to all positions before it: every row gets the
        // bits it gets read in one piece, with and without a window, by the wide layout (20
        // heads per key/value head), the few-row one (3) and a decode step's phases (at 600
        // positions and more).
        let d = 64;
        for (total, group, window, cuts) in [
            (150, 20, None, vec![37, 64, 65, 100]),
            (150, 3, Some(45), vec![1, 31, 33, 96, 149]),
            (150, 2, Some(70), vec![10, 11, 12, 140]),
            (700, 3, None, vec![640, 650, 690, 699]),
            (700, 4, Some(333), vec![600, 651, 699]),
        ] {
            let q = sample(group * total * d, 80);
            for kind in [KvType::F16, KvType::Q8_0] {
                let (keys, values) = (
                    Stored::new(kind, &sample(total * d, 81)),
                    Stored::new(kind, &sample(total * d, 82)),
                );
                // The queries of positions `from..to`, `(group, to − from, d)`.
                let chunk_queries = |from: usize, to: usize| -> Vec<f32> {
                    (0..group)
                        .flat_map(|h| q[(h * total + from) * d..(h * total + to) * d].to_vec())
                        .collect()
                };
                let chunk = |from: usize, to: usize| {
                    let (k, v) = (keys.rows().rows(d, 0, to), values.rows().rows(d, 0, to));
                    attend(
                        &[runs(k, v, d, 16)],
                        Queries {
                            values: &chunk_queries(from, to),
                            heads: group,
                            new: to - from,
                            d,
                        },
                        0.125,
                        Visibility { past: from, window },
                        rayon::current_num_threads(),
                    )
                };
                let whole = chunk(0, total);
                let bounds: Vec<usize> =
                    [0].into_iter().chain(cuts.clone()).chain([total]).collect();
                for pair in bounds.windows(2) {
                    let (from, to) = (pair[0], pair[1]);
                    let got = chunk(from, to);
                    for h in 0..group {
                        for i in from..to {
                            assert_eq!(
                                bits(&got[(h * (to - from) + i - from) * d..][..d]),
                                bits(&whole[(h * total + i) * d..][..d]),
                                "{kind}: group {group}, window {window:?}, chunk {from}..{to}, \
                                 head {h} position {i}"
                            );
                        }
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
        let ranges = vec![(0, total - 1); queries.len()];
        let rows = Rows { queries: queries.to_vec(), ranges, base: 0 };
        let run = [(KvRows::F32(keys), KvRows::F32(values))];
        // SAFETY: the portable copy runs anywhere.
        unsafe { wide::attend(Isa::Portable, &run, &rows, d, scale) }
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
                let rows = Rows { queries, ranges: vec![(0, total - 1); rows], base: 0 };
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

    #[test]
    fn every_copy_gives_the_same_bits_over_tiles_cut_at_positions() {
        // 100 keys from position 20 (the softmax's tiles cut at keys 12, 44 and 76), each row
        // seeing its own range; both layouts (up to 4 rows take the few-row one).
        for (kind, d) in [(KvType::F16, 64), (KvType::F32, 40), (KvType::Q8_0, 96)] {
            let total = 100;
            let (keys, values) = (
                Stored::new(kind, &sample(total * d, 90)),
                Stored::new(kind, &sample(total * d, 91)),
            );
            let head = runs(keys.rows(), values.rows(), d, 16);
            for count in [1, 3, 4, 5, 13, 17] {
                let queries: Vec<Vec<f32>> = (0..count).map(|r| sample(d, 92 + r as u32)).collect();
                let queries: Vec<&[f32]> = queries.iter().map(Vec::as_slice).collect();
                let ranges = (0..count).map(|r| (r * 7 % 30, total - 1 - r * 13 % 50)).collect();
                let rows = Rows { queries, ranges, base: 20 };
                // SAFETY: the portable copy runs anywhere.
                let want = bits(&unsafe { wide::attend(Isa::Portable, &head.runs, &rows, d, 0.2) });
                let isas = Isa::available().into_iter();
                for isa in isas.filter(|&isa| isa != Isa::Avx512 || d.is_multiple_of(LANES)) {
                    assert_eq!(
                        bits(&attend_rows_on(isa, &head.runs, &rows, d, 0.2)),
                        want,
                        "{kind}, {count} rows, {isa:?}"
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
        Rows { queries: queries.chunks_exact(d).collect(), ranges: ranges.collect(), base: 0 }
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
    fn prefill_tasks_take_the_positions_that_fill_their_lanes() {
        // Qwen2.5-0.5B (7 query heads per key/value head), SmolLM2 (3), Qwen2.5-1.5B (6),
        // Gemma 3 (4), Qwen3.5 (8), a multi-head model (1).
        for (group, positions) in [(7, 9), (3, 16), (6, 8), (4, 16), (8, 8), (1, 64)] {
            assert_eq!(positions_per_task(group, 1024), positions, "group {group}");
        }
        // Never more positions than there are, and one for a decode step.
        assert_eq!(positions_per_task(16, 2), 2);
        assert!(positions_per_task(7, 5) <= 5);
        assert_eq!(positions_per_task(3, 1), 1);
        assert_eq!(positions_per_task(100, 64), 1);
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
                        Queries { values: &q, heads: kv_heads * group, new: 1, d },
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
                    Queries { values: &q, heads: kv_heads * group, new, d },
                    0.125,
                    visibility,
                    rayon::current_num_threads(),
                );
                assert_eq!(
                    bits(&got),
                    bits(&attend(
                        &floats,
                        Queries { values: &q, heads: kv_heads * group, new, d },
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

//! A decode step's attention in phases, each split across threads, for when its tasks alone
//! would leave threads idle (one sequence of a model with few key/value heads: SmolLM2's 3
//! heads on 2 threads, Gemma 3's one). Splitting a task's query heads instead would have each
//! part read and convert all the keys and values again.
//!
//! 1. Scores, in parallel over ranges of keys: each score is its own chain.
//! 2. The online softmax ([`super::online`]), in parallel over rows: each row's probabilities,
//!    factors per tile and sum, over its keys in key order.
//! 3. Outputs, in parallel over ranges of output dimensions: each dimension is its own chain
//!    of `p·v` over the keys in key order, rescaled by the row's factor at each tile, and
//!    reads and converts only its own columns; then each divided by its row's sum.
//!
//! Each phase runs the few-row layout's own functions, so a row gets the bits it gets unsplit.

use rayon::prelude::*;

use super::{few_rows, online, outputs, visible_runs, Isa, Task, PREFETCH_RUNS};

/// Keys per scoring task at least: enough work to outweigh handing it to a thread.
const MIN_KEY_RANGE: usize = 256;
/// Output dimensions per output task: two q8_0 blocks, or 128 bytes of f16 (whole cache lines
/// where a row starts on one), so tasks seldom read the same line...
const COLUMNS: usize = 64;
/// ...unless that leaves threads idle: then one q8_0 block (SmolLM2's 64-dimension heads on 2
/// threads would leave the values' phase, half the work, to one thread).
const NARROW_COLUMNS: usize = 32;

/// Whether a task of `rows` query rows of `d` dimensions over `keys` keys can run in phases on
/// `isa` (it takes the few-row layout), with at least two ranges of keys.
pub(super) fn splittable(isa: Isa, rows: usize, d: usize, keys: usize) -> bool {
    few_rows::takes(isa, rows, d) && keys >= 2 * MIN_KEY_RANGE
}

/// Each task's outputs (`rows × d`), which [`splittable`] allows on `isa`.
pub(super) fn attend(isa: Isa, tasks: &[Task<'_>], d: usize, scale: f32) -> Vec<Vec<f32>> {
    tasks.par_iter().map(|task| attend_task(isa, task, d, scale)).collect()
}

/// One task's outputs, phase by phase.
fn attend_task(isa: Isa, task: &Task<'_>, d: usize, scale: f32) -> Vec<f32> {
    let (rows, keys) = (task.rows.queries.len(), task.keys(d));
    assert!(splittable(isa, rows, d, keys), "{rows} rows over {keys} keys on {isa:?}");
    // Per range of keys, the scores `rows × keys of the range`: two ranges per thread (in
    // multiples of the few-row layout's chunk of 64 keys, so only the last range scores a short
    // chunk).
    let range_keys = keys.div_ceil(2 * rayon::current_num_threads()).next_multiple_of(64);
    let range_keys = range_keys.max(MIN_KEY_RANGE);
    let scores: Vec<Vec<f32>> = (0..keys.div_ceil(range_keys))
        .into_par_iter()
        .map(|i| {
            let first = i * range_keys;
            let end = (first + range_keys).min(keys);
            let runs = visible_runs(&task.runs, d, first, end);
            let mut scores = vec![0f32; rows * (end - first)];
            // SAFETY: `splittable` chose the few-row layout's ISA, which the CPU runs.
            unsafe { few_rows::score(isa, &runs, &task.rows.queries, d, scale, &mut scores) };
            scores
        })
        .collect();
    // The probabilities `rows × keys`, each row's factor per tile and its sum.
    let spans = online::tiles(task.rows.base, keys);
    let mut probs = vec![0f32; rows * keys];
    let mut factors = vec![1f32; rows * spans.len()];
    let mut sums = vec![0f32; rows];
    probs
        .par_chunks_mut(keys)
        .zip(factors.par_chunks_mut(spans.len()))
        .zip(&mut sums)
        .zip(&task.rows.ranges)
        .enumerate()
        .for_each(|(r, (((row, factors), sum), &range))| {
            for (part, scores) in row.chunks_mut(range_keys).zip(&scores) {
                part.copy_from_slice(&scores[r * part.len()..][..part.len()]);
            }
            // SAFETY: as above.
            *sum = unsafe { few_rows::softmax(isa, row, &spans, range, factors) };
        });
    // Per range of output dimensions, those columns of the outputs (`rows × columns`), tile by
    // tile.
    let (runs, tiles) = online::tiled(&task.runs, d, task.rows.base);
    let span =
        if d.div_ceil(COLUMNS) >= rayon::current_num_threads() { COLUMNS } else { NARROW_COLUMNS };
    let parts: Vec<Vec<f32>> = (0..d.div_ceil(span))
        .into_par_iter()
        .map(|part| {
            let columns = part * span..((part + 1) * span).min(d);
            let width = columns.len();
            let mut out = vec![0f32; rows * width];
            let mut scratch = Vec::new();
            let mut first = 0;
            for (t, tile) in tiles.iter().enumerate() {
                for (r, o) in out.chunks_exact_mut(width).enumerate() {
                    online::rescale(o, factors[r * spans.len() + t]);
                }
                for i in tile.clone() {
                    if let Some((_, ahead)) = runs.get(i + PREFETCH_RUNS) {
                        ahead.prefetch_columns(d, columns.clone());
                    }
                    let values = runs[i].1.columns_to_f32_on(isa, d, columns.clone(), &mut scratch);
                    let probs = &probs[first..];
                    // SAFETY: as above (`d`, so `width`, a multiple of 16 on AVX-512).
                    unsafe { outputs::add_on(isa, values, probs, (1, keys), width, &mut out) };
                    first += values.len() / width;
                }
            }
            out
        })
        .collect();
    let mut out = vec![0f32; rows * d];
    for (part, o) in parts.iter().enumerate() {
        let width = o.len() / rows;
        for (r, o) in o.chunks_exact(width).enumerate() {
            out[r * d + part * span..][..width].copy_from_slice(o);
        }
    }
    for (o, &sum) in out.chunks_exact_mut(d).zip(&sums) {
        online::finish(o, sum);
    }
    out
}

//! The softmax every layout computes: online, over tiles of [`TILE`] keys at fixed absolute
//! positions (tile `t` holds positions `t·TILE..(t + 1)·TILE`), each tile's scores turned into
//! probabilities and its values added while the tile is at hand.
//!
//! Per row, from `max = −∞`, `sum = 0` and outputs zero, tile by tile in position order:
//! 1. `new = max(max, scores of the keys the row sees in the tile)`, folded in key order;
//! 2. where `new > max`, `factor = e^(max − new)` (0 from −∞), else 1: `sum = sum · factor`
//!    and each output times `factor` (skipped where it is 1: the same bits);
//! 3. each key's probability `p = e^(score − new)` (0 where the row does not see the key),
//!    `sum = sum + p` in key order, and the outputs `o = p·v + o` in key order.
//!
//! At the end each output is divided by `sum` (a row that sees no key keeps its zeros).
//!
//! The tiles sit at positions, not at the task's keys, and keys a row does not see change
//! nothing (a maximum of −∞, a factor of 1, probabilities of zero), so a row's bits depend
//! neither on where a prompt's chunk starts, nor on the rows beside it, nor on the layout.

use std::ops::Range;

use super::HeadRunsSlice;
use crate::activation::exp_nonpositive;
use crate::kv_type::KvRows;

/// Keys per tile: small enough that a tile's keys (or values) and its probabilities stay in
/// the first-level cache while every group of rows uses them.
pub(super) const TILE: usize = 32;

/// The tiles of a task's keys `0..keys`, its key 0 at position `base`: per tile, the range of
/// task keys in it.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
pub(super) fn tiles(base: usize, keys: usize) -> Vec<Range<usize>> {
    let mut tiles = Vec::with_capacity(keys / TILE + 2);
    let mut at = 0;
    while at < keys {
        let end = ((base + at) / TILE + 1) * TILE - base;
        tiles.push(at..end.min(keys));
        at = end;
    }
    tiles
}

/// `runs` cut at the tiles' bounds: `(the runs' parts, per tile the range of parts in it)`.
pub(super) type Tiled<'a> = (Vec<(KvRows<'a>, KvRows<'a>)>, Vec<Range<usize>>);

/// [`Tiled`] parts of `runs` (keys of `d` dimensions), the first key at position `base`.
pub(super) fn tiled<'a>(runs: HeadRunsSlice<'a>, d: usize, base: usize) -> Tiled<'a> {
    let mut parts = Vec::with_capacity(runs.len() + runs.len() / 2 + 2);
    let mut tiles: Vec<Range<usize>> = Vec::new();
    let mut at = 0;
    let mut tile = usize::MAX;
    for &(keys, values) in runs {
        let n = keys.values() / d;
        let mut from = 0;
        while from < n {
            let t = (base + at + from) / TILE;
            let to = ((t + 1) * TILE - base - at).min(n);
            if t != tile {
                tiles.push(parts.len()..parts.len());
                tile = t;
            }
            parts.push((keys.rows(d, from, to), values.rows(d, from, to)));
            if let Some(last) = tiles.last_mut() {
                last.end = parts.len();
            }
            from = to;
        }
        at += n;
    }
    (parts, tiles)
}

/// One row's running maximum and sum.
#[derive(Clone, Copy)]
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
pub(super) struct RowState {
    pub max: f32,
    pub sum: f32,
}

#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
impl RowState {
    pub const START: Self = Self { max: f32::NEG_INFINITY, sum: 0.0 };
}

/// One row's step over one tile: `scores` are the scores of the tile's keys, the first being
/// key `from`, of a row that sees the keys `first..=last`. Replaces them by probabilities,
/// updates `state` and returns the factor of the outputs so far (1 where none).
#[inline(always)]
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
pub(super) fn row_step(
    scores: &mut [f32],
    from: usize,
    (first, last): (usize, usize),
    state: &mut RowState,
) -> f32 {
    let end = from + scores.len();
    // The keys seen: `lo..hi` of the tile's.
    let lo = first.clamp(from, end) - from;
    let hi = (last + 1).clamp(from + lo, end) - from;
    let mut max = state.max;
    for &s in &scores[lo..hi] {
        max = max.max(s);
    }
    let factor = if max > state.max { exp_nonpositive(state.max - max) } else { 1.0 };
    state.max = max;
    let mut sum = state.sum * factor;
    scores[..lo].fill(0.0);
    for s in &mut scores[lo..hi] {
        *s = exp_nonpositive(*s - max);
        sum += *s;
    }
    scores[hi..].fill(0.0);
    state.sum = sum;
    factor
}

/// One row's whole softmax over its scores (`keys` of a task whose key 0 is at `base`): the
/// probabilities in place, each tile's factor in `factors` (one per tile of [`tiles`]);
/// returns the sum.
#[inline(always)]
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
pub(super) fn row_softmax(
    scores: &mut [f32],
    tiles: &[Range<usize>],
    range: (usize, usize),
    factors: &mut [f32],
) -> f32 {
    let mut state = RowState::START;
    for (tile, factor) in tiles.iter().zip(factors) {
        *factor = row_step(&mut scores[tile.clone()], tile.start, range, &mut state);
    }
    state.sum
}

/// Multiplies `out` by `factor` (nothing where it is 1).
#[inline(always)]
pub(super) fn rescale(out: &mut [f32], factor: f32) {
    if factor != 1.0 {
        for o in out {
            *o *= factor;
        }
    }
}

/// Divides `out` by a row's `sum` (nothing for a row that saw no key).
#[inline(always)]
pub(super) fn finish(out: &mut [f32], sum: f32) {
    if sum > 0.0 {
        for o in out {
            *o /= sum;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tiles_sit_at_positions() {
        assert_eq!(tiles(0, 70), vec![0..32, 32..64, 64..70]);
        assert_eq!(tiles(30, 40), vec![0..2, 2..34, 34..40]);
        assert_eq!(tiles(32, 32), vec![0..32]);
        assert!(tiles(5, 0).is_empty());
    }

    #[test]
    fn runs_cut_at_the_tiles() {
        let d = 2;
        let data = vec![0f32; 200 * d];
        let run = |n: usize| (KvRows::F32(&data[..n * d]), KvRows::F32(&data[..n * d]));
        // Positions 20..: runs of 16, 16, 40, 3.
        let runs = [run(16), run(16), run(40), run(3)];
        let (parts, tiles) = tiled(&runs, d, 20);
        let sizes: Vec<usize> = parts.iter().map(|(k, _)| k.values() / d).collect();
        // Tile bounds at 32, 64, 96: 12 | 4 + 16 + 12 | 28 + 3.
        assert_eq!(sizes, vec![12, 4, 16, 12, 28, 3]);
        assert_eq!(tiles, vec![0..1, 1..4, 4..6]);
    }
}

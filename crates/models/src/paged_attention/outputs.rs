//! The values' half of attention: `out[r] += Σ_j p(j, r) · value j`, each output element one
//! fused multiply-add chain over the keys in key order, continued from what `out` holds (the
//! earlier keys' sum), so a row's outputs do not depend on how its keys are cut into calls.
//!
//! The SIMD copies keep a block of rows × output lanes in registers for a whole call: each
//! value register loaded serves every row of the block, and each broadcast probability serves
//! two registers of lanes. Accumulating in memory instead (the plain loop) stores every lane
//! after every key, which holds AVX2 to a quarter of its multiply-add rate.

use super::Isa;

/// Steps between probabilities `(of consecutive keys, of consecutive rows)`.
pub(super) type ProbSteps = (usize, usize);

/// Adds the values `values` (`n × d`) to the outputs `out` (`rows × d`) by the copy for `isa`;
/// `probs[j · steps.0 + r · steps.1]` is row `r`'s probability of value `j`.
///
/// # Safety
/// The CPU runs `isa`; on AVX-512, `d` is a multiple of 16.
pub(super) unsafe fn add_on(
    isa: Isa,
    values: &[f32],
    probs: &[f32],
    steps: ProbSteps,
    d: usize,
    out: &mut [f32],
) {
    match isa {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: the caller's promise.
        Isa::Avx512 => unsafe { avx512::add(values, probs, steps, d, out) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as above.
        Isa::Avx2 => unsafe { avx2::add(values, probs, steps, d, out) },
        _ => add_portable(values, probs, steps, d, out),
    }
}

/// The order every copy keeps: per value, per row, per dimension, `o = p·v + o`.
#[inline(always)]
pub(super) fn add_portable(
    values: &[f32],
    probs: &[f32],
    steps: ProbSteps,
    d: usize,
    out: &mut [f32],
) {
    for (j, v) in values.chunks_exact(d).enumerate() {
        for (r, o) in out.chunks_exact_mut(d).enumerate() {
            let p = probs[j * steps.0 + r * steps.1];
            for (o, x) in o.iter_mut().zip(v) {
                *o = p.mul_add(*x, *o);
            }
        }
    }
}

/// Checks that `probs` holds a probability for every value and row.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
fn check(values: usize, rows: usize, probs: &[f32], (key_step, row_step): ProbSteps) {
    assert!(
        values == 0 || rows == 0 || probs.len() > (values - 1) * key_step + (rows - 1) * row_step,
        "{} probabilities for {values} values of {rows} rows",
        probs.len()
    );
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    use super::{add_portable, check, ProbSteps};

    /// Rows per register block: 6 rows × 2 registers of accumulators, 2 of values and one
    /// broadcast fill 15 of the 16 registers.
    const ROWS: usize = 6;
    const LANES: usize = 8;

    /// [`super::add_portable`] on AVX2: 16 lanes (then 8) at a time, each for every block of
    /// up to six rows in turn (so those lanes of the values stay in the first-level cache),
    /// and any dimensions past the last 8 by the plain loop.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn add(values: &[f32], probs: &[f32], steps: ProbSteps, d: usize, out: &mut [f32]) {
        let (keys, rows) = (values.len() / d, out.len() / d);
        check(keys, rows, probs, steps);
        let pairs = d / (2 * LANES) * 2 * LANES;
        let singles = d / LANES * LANES;
        let columns = (0..pairs)
            .step_by(2 * LANES)
            .map(|c| (c, 2))
            .chain((pairs..singles).step_by(LANES).map(|c| (c, 1)));
        for (c, width) in columns {
            for first in (0..rows).step_by(ROWS) {
                let block = Block { first, rows: (rows - first).min(ROWS), c };
                // SAFETY: `check` covers every probability these rows read; the features are
                // this function's; the lanes lie inside `d`.
                unsafe {
                    match (block.rows, width) {
                        (1, 2) => add_block::<1, 2>(values, probs, steps, d, out, block),
                        (2, 2) => add_block::<2, 2>(values, probs, steps, d, out, block),
                        (3, 2) => add_block::<3, 2>(values, probs, steps, d, out, block),
                        (4, 2) => add_block::<4, 2>(values, probs, steps, d, out, block),
                        (5, 2) => add_block::<5, 2>(values, probs, steps, d, out, block),
                        (_, 2) => add_block::<ROWS, 2>(values, probs, steps, d, out, block),
                        (1, _) => add_block::<1, 1>(values, probs, steps, d, out, block),
                        (2, _) => add_block::<2, 1>(values, probs, steps, d, out, block),
                        (3, _) => add_block::<3, 1>(values, probs, steps, d, out, block),
                        (4, _) => add_block::<4, 1>(values, probs, steps, d, out, block),
                        (5, _) => add_block::<5, 1>(values, probs, steps, d, out, block),
                        _ => add_block::<ROWS, 1>(values, probs, steps, d, out, block),
                    }
                }
            }
        }
        if singles < d {
            // The last dimensions, as columns of their own: each is its own chain.
            let width = d - singles;
            let tail: Vec<f32> =
                values.chunks_exact(d).flat_map(|v| v[singles..].to_vec()).collect();
            let mut sums: Vec<f32> =
                out.chunks_exact(d).flat_map(|o| o[singles..].to_vec()).collect();
            add_portable(&tail, probs, steps, width, &mut sums);
            for (o, s) in out.chunks_exact_mut(d).zip(sums.chunks_exact(width)) {
                o[singles..].copy_from_slice(s);
            }
        }
    }

    /// Rows `first..first + rows` and lanes `c..`.
    #[derive(Clone, Copy)]
    struct Block {
        first: usize,
        rows: usize,
        c: usize,
    }

    /// `R` rows' accumulators of `W` registers of lanes each, in registers through all the
    /// values.
    ///
    /// # Safety
    /// The CPU runs AVX2 and FMA; `block.rows == R`; lanes `c..c + 8W` lie inside `d`; `probs`
    /// holds every probability the rows read.
    #[inline(always)]
    unsafe fn add_block<const R: usize, const W: usize>(
        values: &[f32],
        probs: &[f32],
        (key_step, row_step): ProbSteps,
        d: usize,
        out: &mut [f32],
        block: Block,
    ) {
        let keys = values.len() / d;
        // SAFETY (all pointer arithmetic, loads and stores below): rows `first + r`, `r < R`,
        // of `out` and of the probabilities, values `j < keys`, lanes inside `d`.
        let (v, o, p) = unsafe {
            (
                values.as_ptr().add(block.c),
                out.as_mut_ptr().add(block.first * d + block.c),
                probs.as_ptr().add(block.first * row_step),
            )
        };
        let mut acc = [[_mm256_setzero_ps(); W]; R];
        for (r, a) in acc.iter_mut().enumerate() {
            for (i, a) in a.iter_mut().enumerate() {
                *a = unsafe { _mm256_loadu_ps(o.add(r * d + i * LANES)) };
            }
        }
        for j in 0..keys {
            let mut x = [_mm256_setzero_ps(); W];
            for (i, x) in x.iter_mut().enumerate() {
                *x = unsafe { _mm256_loadu_ps(v.add(j * d + i * LANES)) };
            }
            for (r, a) in acc.iter_mut().enumerate() {
                let pr = unsafe { _mm256_broadcast_ss(&*p.add(j * key_step + r * row_step)) };
                for (a, x) in a.iter_mut().zip(x) {
                    *a = _mm256_fmadd_ps(pr, x, *a);
                }
            }
        }
        for (r, a) in acc.iter().enumerate() {
            for (i, a) in a.iter().enumerate() {
                unsafe { _mm256_storeu_ps(o.add(r * d + i * LANES), *a) };
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use std::arch::x86_64::*;

    use super::{check, ProbSteps};

    /// Rows per register block: 8 rows × 2 registers of accumulators.
    const ROWS: usize = 8;
    const LANES: usize = 16;

    /// [`super::add_portable`] on AVX-512 for `d` a multiple of 16: blocks of up to eight
    /// rows, 32 lanes (then 16) at a time.
    #[target_feature(enable = "avx512f")]
    pub unsafe fn add(values: &[f32], probs: &[f32], steps: ProbSteps, d: usize, out: &mut [f32]) {
        assert!(d.is_multiple_of(LANES), "head size {d}");
        let (keys, rows) = (values.len() / d, out.len() / d);
        check(keys, rows, probs, steps);
        for (block, out) in out.chunks_mut(ROWS * d).enumerate() {
            let probs = &probs[block * ROWS * steps.1..];
            // SAFETY: `check` covers every probability these rows read; the features are this
            // function's.
            unsafe {
                match out.len() / d {
                    1 => add_rows::<1>(values, probs, steps, d, out),
                    2 => add_rows::<2>(values, probs, steps, d, out),
                    3 => add_rows::<3>(values, probs, steps, d, out),
                    4 => add_rows::<4>(values, probs, steps, d, out),
                    5 => add_rows::<5>(values, probs, steps, d, out),
                    6 => add_rows::<6>(values, probs, steps, d, out),
                    7 => add_rows::<7>(values, probs, steps, d, out),
                    _ => add_rows::<ROWS>(values, probs, steps, d, out),
                }
            }
        }
    }

    /// `R` rows' accumulators in registers through all the values, per 32 (then 16) lanes.
    ///
    /// # Safety
    /// The CPU runs AVX-512F; `d` is a multiple of 16; `probs` holds every probability the
    /// rows read.
    #[inline(always)]
    unsafe fn add_rows<const R: usize>(
        values: &[f32],
        probs: &[f32],
        (key_step, row_step): ProbSteps,
        d: usize,
        out: &mut [f32],
    ) {
        let keys = values.len() / d;
        let (v, o, p) = (values.as_ptr(), out.as_mut_ptr(), probs.as_ptr());
        let pairs = d / (2 * LANES) * 2 * LANES;
        // SAFETY (all loads and stores below): `c + 32 ≤ d` (then `c + 16 ≤ d`) lanes of rows
        // `r < R` of `out` and of values `j < keys`; the probabilities are the caller's promise.
        for c in (0..pairs).step_by(2 * LANES) {
            let mut acc = [[_mm512_setzero_ps(); 2]; R];
            for (r, a) in acc.iter_mut().enumerate() {
                *a = unsafe {
                    [_mm512_loadu_ps(o.add(r * d + c)), _mm512_loadu_ps(o.add(r * d + c + LANES))]
                };
            }
            for j in 0..keys {
                let x = unsafe {
                    [_mm512_loadu_ps(v.add(j * d + c)), _mm512_loadu_ps(v.add(j * d + c + LANES))]
                };
                for (r, a) in acc.iter_mut().enumerate() {
                    let pr = _mm512_set1_ps(unsafe { *p.add(j * key_step + r * row_step) });
                    a[0] = _mm512_fmadd_ps(pr, x[0], a[0]);
                    a[1] = _mm512_fmadd_ps(pr, x[1], a[1]);
                }
            }
            for (r, a) in acc.iter().enumerate() {
                unsafe {
                    _mm512_storeu_ps(o.add(r * d + c), a[0]);
                    _mm512_storeu_ps(o.add(r * d + c + LANES), a[1]);
                }
            }
        }
        for c in (pairs..d).step_by(LANES) {
            let mut acc = [_mm512_setzero_ps(); R];
            for (r, a) in acc.iter_mut().enumerate() {
                *a = unsafe { _mm512_loadu_ps(o.add(r * d + c)) };
            }
            for j in 0..keys {
                let x = unsafe { _mm512_loadu_ps(v.add(j * d + c)) };
                for (r, a) in acc.iter_mut().enumerate() {
                    let pr = _mm512_set1_ps(unsafe { *p.add(j * key_step + r * row_step) });
                    *a = _mm512_fmadd_ps(pr, x, *a);
                }
            }
            for (r, a) in acc.iter().enumerate() {
                unsafe { _mm512_storeu_ps(o.add(r * d + c), *a) };
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_data::sample;

    fn bits(x: &[f32]) -> Vec<u32> {
        x.iter().map(|f| f.to_bits()).collect()
    }

    #[test]
    fn every_copy_adds_in_the_portable_order_for_any_rows_and_widths() {
        // Widths with pairs of registers, a single one, and (AVX2) a ragged tail; row counts
        // that fill a block, leave a short one, or span several; both probability layouts.
        for d in [16, 24, 40, 64, 72, 80, 256] {
            for rows in [1, 2, 5, 6, 7, 8, 9, 13, 16] {
                for keys in [1, 3, 17] {
                    let values = sample(keys * d, d as u32);
                    let start = sample(rows * d, 7);
                    for steps in [(rows, 1), (1, keys)] {
                        let probs = sample(keys * rows, 11 + rows as u32);
                        let mut want = start.clone();
                        add_portable(&values, &probs, steps, d, &mut want);
                        for isa in Isa::available() {
                            if isa == Isa::Avx512 && !d.is_multiple_of(16) {
                                continue;
                            }
                            let mut got = start.clone();
                            // SAFETY: the CPU runs `isa`; AVX-512 only for whole registers.
                            unsafe { add_on(isa, &values, &probs, steps, d, &mut got) };
                            assert_eq!(
                                bits(&got),
                                bits(&want),
                                "{isa:?}: d {d}, {rows} rows, {keys} keys, steps {steps:?}"
                            );
                        }
                    }
                }
            }
        }
    }
}

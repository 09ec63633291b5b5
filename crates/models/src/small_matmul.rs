//! Small f32 matrix products for the chunked delta rule, fast and with one fixed rounding.
//!
//! Every output is its initial value plus `a(i, 0)·b[0][col]`, then `a(i, 1)·b[1][col]`, … each
//! step one fused multiply-add, whatever tile the output falls in. So the results do not depend
//! on the matrix sizes or on the CPU: machines with AVX-512 or AVX2 and FMA run vectorised copies
//! of the same code, the others `f32::mul_add` in software, bit for bit the same.

/// Outputs per register tile: rows × columns (8 AVX2 or 4 AVX-512 registers of accumulators).
const TILE_ROWS: usize = 4;
const TILE_COLS: usize = 16;

/// `c[i][col] += Σ_{d < depth} a(i, d) · b[d][col]`, with `c` `rows × cols` and `b`
/// `depth × cols`, both row-major and contiguous.
pub fn product_add(
    c: &mut [f32],
    a: &(impl Fn(usize, usize) -> f32 + ?Sized),
    b: &[f32],
    rows: usize,
    depth: usize,
    cols: usize,
) {
    assert!(c.len() >= rows * cols && b.len() >= depth * cols, "product_add: operands too short");
    #[cfg(target_arch = "x86_64")]
    if std::is_x86_feature_detected!("avx512f") {
        // SAFETY: the CPU has the feature (AVX-512F includes FMA).
        return unsafe { product_add_avx512(c, a, b, rows, depth, cols) };
    }
    #[cfg(target_arch = "x86_64")]
    if std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma") {
        // SAFETY: the CPU has both features.
        return unsafe { product_add_avx2(c, a, b, rows, depth, cols) };
    }
    product_add_portable(c, a, b, rows, depth, cols);
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,fma")]
unsafe fn product_add_avx512(
    c: &mut [f32],
    a: &(impl Fn(usize, usize) -> f32 + ?Sized),
    b: &[f32],
    rows: usize,
    depth: usize,
    cols: usize,
) {
    product_add_portable(c, a, b, rows, depth, cols);
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn product_add_avx2(
    c: &mut [f32],
    a: &(impl Fn(usize, usize) -> f32 + ?Sized),
    b: &[f32],
    rows: usize,
    depth: usize,
    cols: usize,
) {
    product_add_portable(c, a, b, rows, depth, cols);
}

#[inline(always)]
fn product_add_portable(
    c: &mut [f32],
    a: &(impl Fn(usize, usize) -> f32 + ?Sized),
    b: &[f32],
    rows: usize,
    depth: usize,
    cols: usize,
) {
    let full_cols = cols - cols % TILE_COLS;
    let mut i = 0;
    while i < rows {
        if rows - i >= TILE_ROWS {
            tiles::<TILE_ROWS>(c, a, b, i, depth, cols, full_cols);
            i += TILE_ROWS;
        } else {
            tiles::<1>(c, a, b, i, depth, cols, full_cols);
            i += 1;
        }
    }
}

/// Rows `first..first + R`: full column tiles in registers, the leftover columns one by one.
#[inline(always)]
fn tiles<const R: usize>(
    c: &mut [f32],
    a: &(impl Fn(usize, usize) -> f32 + ?Sized),
    b: &[f32],
    first: usize,
    depth: usize,
    cols: usize,
    full_cols: usize,
) {
    for col in (0..full_cols).step_by(TILE_COLS) {
        let mut acc = [[0f32; TILE_COLS]; R];
        for (r, row) in acc.iter_mut().enumerate() {
            row.copy_from_slice(&c[(first + r) * cols + col..][..TILE_COLS]);
        }
        for d in 0..depth {
            let b_row: &[f32; TILE_COLS] =
                b[d * cols + col..][..TILE_COLS].try_into().expect("tile width");
            for (r, row) in acc.iter_mut().enumerate() {
                let scale = a(first + r, d);
                for (o, &bv) in row.iter_mut().zip(b_row) {
                    *o = scale.mul_add(bv, *o);
                }
            }
        }
        for (r, row) in acc.iter().enumerate() {
            c[(first + r) * cols + col..][..TILE_COLS].copy_from_slice(row);
        }
    }
    for r in 0..R {
        for col in full_cols..cols {
            let mut o = c[(first + r) * cols + col];
            for d in 0..depth {
                o = a(first + r, d).mul_add(b[d * cols + col], o);
            }
            c[(first + r) * cols + col] = o;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_the_definition_at_every_tile_edge() {
        for (rows, depth, cols) in [(1, 1, 1), (3, 5, 7), (4, 8, 16), (9, 13, 37), (64, 128, 128)] {
            let a: Vec<f32> =
                (0..rows * depth).map(|i| ((i * 7 % 13) as f32 - 6.0) / 8.0).collect();
            let b: Vec<f32> =
                (0..depth * cols).map(|i| ((i * 5 % 11) as f32 - 5.0) / 4.0).collect();
            let init: Vec<f32> = (0..rows * cols).map(|i| (i % 3) as f32).collect();
            let mut c = init.clone();
            product_add(&mut c, &|i, d| a[i * depth + d], &b, rows, depth, cols);
            for i in 0..rows {
                for col in 0..cols {
                    // Small dyadic values: every order and rounding gives the exact sum.
                    let expected = init[i * cols + col]
                        + (0..depth).map(|d| a[i * depth + d] * b[d * cols + col]).sum::<f32>();
                    assert_eq!(
                        c[i * cols + col],
                        expected,
                        "{rows}x{depth}x{cols} at ({i}, {col})"
                    );
                }
            }
        }
    }

    #[test]
    fn the_vectorised_path_rounds_exactly_like_the_portable_one() {
        let (rows, depth, cols) = (7, 33, 40);
        let a: Vec<f32> = (0..rows * depth).map(|i| (i as f32 * 0.731).sin()).collect();
        let b: Vec<f32> = (0..depth * cols).map(|i| (i as f32 * 0.377).cos()).collect();
        let entry = |i: usize, d: usize| a[i * depth + d];
        let (mut fast, mut portable) = (vec![0.1f32; rows * cols], vec![0.1f32; rows * cols]);
        product_add(&mut fast, &entry, &b, rows, depth, cols);
        product_add_portable(&mut portable, &entry, &b, rows, depth, cols);
        assert!(fast.iter().zip(&portable).all(|(x, y)| x.to_bits() == y.to_bits()));
        #[cfg(target_arch = "x86_64")]
        if std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma") {
            let mut avx2 = vec![0.1f32; rows * cols];
            // SAFETY: the CPU has both features.
            unsafe { product_add_avx2(&mut avx2, &entry, &b, rows, depth, cols) };
            assert!(avx2.iter().zip(&portable).all(|(x, y)| x.to_bits() == y.to_bits()));
        }
        // A row alone (another tile shape) gives the same bits as within the block.
        let mut alone = vec![0.1f32; cols];
        product_add(&mut alone, &|_, d| a[5 * depth + d], &b, 1, depth, cols);
        assert_eq!(alone, fast[5 * cols..6 * cols].to_vec());
    }
}

//! Deterministic inputs shared by the kernels' unit tests.

/// `n` values spread over [−1, 1) by a multiplicative hash of the index, shifted by `seed`.
pub(crate) fn sample(n: usize, seed: u32) -> Vec<f32> {
    (0..n)
        .map(|i| {
            (((i as u32).wrapping_mul(2654435761).wrapping_add(seed) % 1000) as f32 / 500.0) - 1.0
        })
        .collect()
}

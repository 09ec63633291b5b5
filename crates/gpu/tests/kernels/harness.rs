//! The shared device, seeded random inputs, and the error measures the tolerances are in.

use std::sync::{Arc, OnceLock};

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use spindle_gpu::{Gpu, GpuTensor, Step};

/// The device every test shares (one instance: lavapipe starts one set of threads per device),
/// or `None` with the reason printed when there is none and `CI` is unset.
pub fn gpu_or_skip() -> Option<&'static Arc<Gpu>> {
    static GPU: OnceLock<Result<Arc<Gpu>, String>> = OnceLock::new();
    match GPU.get_or_init(|| Gpu::open(None).map(Arc::new).map_err(|e| e.to_string())) {
        Ok(gpu) => Some(gpu),
        Err(e) if std::env::var_os("CI").is_some() => {
            panic!("CI is set, and the GPU kernel tests need an adapter: {e}. .ci/run installs lavapipe (mesa-vulkan-drivers)")
        }
        Err(e) => {
            eprintln!("SKIPPED a GPU kernel test: {e}, and CI is unset");
            None
        }
    }
}

pub fn rng(seed: u64) -> ChaCha8Rng {
    ChaCha8Rng::seed_from_u64(seed)
}

/// `n` values uniform in `[-1, 1)`.
pub fn uniform(rng: &mut ChaCha8Rng, n: usize) -> Vec<f32> {
    (0..n).map(|_| rng.random_range(-1.0f32..1.0)).collect()
}

/// The largest `|got − want| / scale` and where it is.
pub fn worst(got: &[f32], want: &[f64], scale: &[f64]) -> (f64, usize) {
    assert_eq!(got.len(), want.len(), "output length");
    got.iter()
        .zip(want)
        .zip(scale)
        .map(|((&g, &w), &s)| (g as f64 - w).abs() / s.max(f64::MIN_POSITIVE))
        .enumerate()
        .fold((0.0, 0), |(m, at), (i, e)| if e > m || e.is_nan() { (e, i) } else { (m, at) })
}

/// Fails with the measured error when it passes `tolerance`; prints it either way, so a run
/// shows how much room each tolerance leaves.
pub fn check(what: &str, got: &[f32], want: &[f64], scale: &[f64], tolerance: f64) {
    let (error, at) = worst(got, want, scale);
    eprintln!("{what}: max error {error:.3e} (tolerance {tolerance:.0e})");
    assert!(
        error <= tolerance,
        "{what}: error {error:.3e} at {at} over {tolerance:.0e} (got {}, want {})",
        got[at],
        want[at]
    );
}

/// Bitwise equality of two f32 runs, naming the first difference.
pub fn same_bits(what: &str, a: &[f32], b: &[f32]) {
    assert_eq!(a.len(), b.len(), "{what}: lengths");
    if let Some(i) = (0..a.len()).find(|&i| a[i].to_bits() != b[i].to_bits()) {
        panic!("{what}: value {i} differs: {} vs {}", a[i], b[i]);
    }
}

/// The values of the tensor `work` records, run as one step.
pub fn computed(
    gpu: &Gpu,
    work: impl FnOnce(&mut Step<'_>) -> spindle_gpu::Result<GpuTensor>,
) -> Vec<f32> {
    gpu.run(|step| {
        let out = work(step)?;
        Ok(step.read(&out))
    })
    .and_then(|values| values.values())
    .unwrap()
}

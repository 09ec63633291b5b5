//! Spindle's tile kernels for Q5_0 / Q4_1 / Q8_0 / Q4_K / Q6_K against candle's kernels for the
//! same types, both as the server runs them: candle's through `QuantizedMatrix` (row shards on
//! our rayon pool, candle's own pool off), ours through `BlockMatrix`, `Q4KMatrix` and
//! `Q6KMatrix` (the K-quant ones on CPUs with AVX2 or AVX-512 VNNI). Qwen2.5's down
//! projections, one token (decode) and 64 (a prefill chunk); A and B alternate, medians with min
//! and max and the weight bytes read per second at one token.
//! Run: `cargo bench -p spindle-models --bench block_quants [-- q4k q6k …]` (formats to
//! measure; all by default). `SPINDLE_ISA=avx2` measures the AVX2 copies on an AVX-512 CPU, and
//! candle's AVX2 tier beside them (`MISTRALRS_FORCE_AVX2=0` keeps candle's widest).

use std::sync::Arc;
use std::time::{Duration, Instant};

use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{Device, Tensor};
use spindle_models::QuantizedMatrix;

mod common;

use common::ours;

const REPEATS: usize = 9;

fn main() {
    // As the binary does at start-up: candle runs on the calling thread, rayon spreads the work.
    if std::env::var_os("CANDLE_NUM_THREADS").is_none() {
        // SAFETY: no other thread runs yet.
        unsafe { std::env::set_var("CANDLE_NUM_THREADS", "1") };
    }
    // candle picks its repacked kernels' tier by itself: without this it would run its AVX-512
    // VNNI tier against our AVX2 copies.
    let avx2 = std::env::var("SPINDLE_ISA").is_ok_and(|isa| isa == "avx2");
    if avx2 && std::env::var_os("MISTRALRS_FORCE_AVX2").is_none() {
        // SAFETY: no other thread runs yet.
        unsafe { std::env::set_var("MISTRALRS_FORCE_AVX2", "1") };
    }
    println!("{} rayon threads", rayon::current_num_threads());
    let formats =
        [GgmlDType::Q5_0, GgmlDType::Q4_1, GgmlDType::Q8_0, GgmlDType::Q4K, GgmlDType::Q6K];
    // `cargo bench … -- q4k q6k` measures only the formats named (cargo adds `--bench`).
    let only: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .map(|a| a.to_lowercase())
        .collect();
    let named = |dtype: &GgmlDType| {
        only.is_empty() || only.contains(&format!("{dtype:?}").replace('_', "").to_lowercase())
    };
    for dtype in formats.into_iter().filter(named) {
        // The MLP down projections of Qwen2.5-0.5B (896 × 4864) and 1.5B (1536 × 8960).
        for (rows, cols) in [(896, 4864), (1536, 8960)] {
            let weights = Tensor::randn(0f32, 0.05, (rows, cols), &Device::Cpu).unwrap();
            let q = Arc::new(QTensor::quantize(&weights, dtype).unwrap());
            let candle = QuantizedMatrix::new(q.clone(), rayon::current_num_threads()).unwrap();
            let Some(ours) = ours(dtype, rows, cols, &q.data().unwrap()) else {
                println!("{dtype:?}: no kernel of ours on this CPU");
                break;
            };
            for tokens in [1, 64] {
                let x = Tensor::randn(0f32, 1.0, (tokens, cols), &Device::Cpu).unwrap();
                let products = (4096 / tokens).clamp(4, 256);
                let (mut base, mut mine) = (Vec::new(), Vec::new());
                for _ in 0..REPEATS {
                    base.push(time(products, || candle.forward(&x).unwrap()));
                    mine.push(time(products, || ours(&x)));
                }
                let (b, m) = (summary(&mut base), summary(&mut mine));
                let gb_per_s = q.storage_size_in_bytes() as f64 / (m.0 * 1e3);
                println!(
                    "{dtype:?} {rows}x{cols}, {tokens:>2} tokens: candle {:>8.1} µs [{:.1}-{:.1}], ours {:>7.1} µs [{:.1}-{:.1}] ({gb_per_s:.1} GB/s of weights); ours / candle = {:.3}",
                    b.0, b.1, b.2, m.0, m.1, m.2, m.0 / b.0
                );
            }
        }
    }
}

/// Mean time of one product over `n` back to back.
fn time(n: usize, mut product: impl FnMut() -> Tensor) -> Duration {
    let started = Instant::now();
    for _ in 0..n {
        std::hint::black_box(product());
    }
    started.elapsed() / n as u32
}

/// (median, min, max) in µs.
fn summary(times: &mut [Duration]) -> (f64, f64, f64) {
    times.sort();
    let us = |d: Duration| d.as_secs_f64() * 1e6;
    (us(times[times.len() / 2]), us(times[0]), us(times[times.len() - 1]))
}

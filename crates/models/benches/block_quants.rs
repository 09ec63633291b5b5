//! Spindle's tile kernels for Q5_0 / Q4_1 / Q8_0 against candle's kernels for the same types,
//! both as the server runs them: candle's through `QuantizedMatrix` (row shards on our
//! rayon pool, candle's own pool off), ours through `BlockMatrix`. Qwen2.5-0.5B's shapes, one
//! token (decode) and 64 (a prefill chunk); A and B alternate, medians with min and max.
//! Run: `cargo bench -p spindle-models --bench block_quants`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{Device, Tensor};
use spindle_models::{BlockFormat, BlockMatrix, QuantizedMatrix};

const REPEATS: usize = 9;

fn main() {
    // As the binary does at start-up: candle runs on the calling thread, rayon spreads the work.
    if std::env::var_os("CANDLE_NUM_THREADS").is_none() {
        // SAFETY: no other thread runs yet.
        unsafe { std::env::set_var("CANDLE_NUM_THREADS", "1") };
    }
    println!("{} rayon threads", rayon::current_num_threads());
    let formats = [
        (GgmlDType::Q5_0, BlockFormat::Q5_0),
        (GgmlDType::Q4_1, BlockFormat::Q4_1),
        (GgmlDType::Q8_0, BlockFormat::Q8_0),
    ];
    for (dtype, format) in formats {
        // Attention output (896 × 896) and the MLP's down projection (896 × 4864).
        for (rows, cols) in [(896, 896), (896, 4864)] {
            let weights = Tensor::randn(0f32, 0.05, (rows, cols), &Device::Cpu).unwrap();
            let q = Arc::new(QTensor::quantize(&weights, dtype).unwrap());
            let candle = QuantizedMatrix::new(q.clone(), rayon::current_num_threads()).unwrap();
            let ours = BlockMatrix::new(format, rows, cols, &q.data().unwrap()).unwrap();
            for tokens in [1, 64] {
                let x = Tensor::randn(0f32, 1.0, (tokens, cols), &Device::Cpu).unwrap();
                let products = (4096 / tokens).clamp(4, 256);
                let (mut base, mut mine) = (Vec::new(), Vec::new());
                for _ in 0..REPEATS {
                    base.push(time(products, || candle.forward(&x).unwrap()));
                    mine.push(time(products, || ours.forward(&x).unwrap()));
                }
                let (b, m) = (summary(&mut base), summary(&mut mine));
                println!(
                    "{dtype:?} {rows}x{cols}, {tokens:>2} tokens: candle {:>8.1} µs [{:.1}-{:.1}], ours {:>7.1} µs [{:.1}-{:.1}]; ours / candle = {:.3}",
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

//! Products of 1–8 rows, as speculative decoding verifies drafts (k drafts: k + 1 rows), on
//! Qwen2.5-0.5B's shapes: the cost of a row beside others is what makes verification cheap or
//! not. Prints per format, shape and row count the median [min–max] time of one product and its
//! ratio to the one-row product (alternated repetitions; the machine may be shared).
//! Run: `cargo bench -p spindle-models --bench few_rows [-- q8_0 q5_0 q4k q6k] [--rows 1,5]
//! [--shape 896x4864]`.
//! `--once` runs each product once, untimed: for instruction counts under
//! `valgrind --tool=callgrind` (with `RAYON_NUM_THREADS=1`).

use std::time::{Duration, Instant};

use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{Device, Tensor};

mod common;

use common::ours;

const REPEATS: usize = 15;

/// Qwen2.5-0.5B's matrices (rows × cols) in the formats its Q4_K_M file stores them.
const SHAPES: [(GgmlDType, usize, usize); 6] = [
    (GgmlDType::Q5_0, 4864, 896),   // MLP gate and up
    (GgmlDType::Q5_0, 896, 896),    // attention query and output
    (GgmlDType::Q8_0, 151936, 896), // the output head (tied to the embeddings)
    (GgmlDType::Q8_0, 896, 4864),   // an MLP down projection in a Q8_0 file
    (GgmlDType::Q4K, 896, 4864),    // MLP down
    (GgmlDType::Q6K, 896, 4864),    // MLP down
];

fn main() {
    let mut only = Vec::new();
    let mut row_counts: Vec<usize> = (1..=8).collect();
    let mut once = false;
    let mut shape = None;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--rows" => {
                let list = args.next().expect("--rows 1,5");
                row_counts = list.split(',').map(|n| n.parse().expect("a row count")).collect();
            }
            "--once" => once = true,
            "--shape" => shape = args.next(),
            "--bench" => {}
            name => only.push(name.replace('_', "").to_lowercase()),
        }
    }
    for (dtype, rows, cols) in SHAPES {
        let name = format!("{dtype:?}").replace('_', "").to_lowercase();
        let named = only.is_empty() || only.contains(&name);
        if !named || shape.as_ref().is_some_and(|s| *s != format!("{rows}x{cols}")) {
            continue;
        }
        let weights = Tensor::randn(0f32, 0.05, (rows, cols), &Device::Cpu).unwrap();
        let q = QTensor::quantize(&weights, dtype).unwrap();
        let Some(product) = ours(dtype, rows, cols, &q.data().unwrap()) else {
            println!("{dtype:?}: no kernel of ours on this CPU");
            continue;
        };
        let inputs: Vec<Tensor> = row_counts
            .iter()
            .map(|&n| Tensor::randn(0f32, 1.0, (n, cols), &Device::Cpu).unwrap())
            .collect();
        if once {
            for x in &inputs {
                std::hint::black_box(product(x));
            }
            continue;
        }
        let mut times = vec![Vec::new(); inputs.len()];
        for _ in 0..REPEATS {
            for (x, times) in inputs.iter().zip(&mut times) {
                times.push(time(|| product(x)));
            }
        }
        let one = summary(&mut times[0].clone()).0;
        for (n, times) in row_counts.iter().zip(&mut times) {
            let (median, min, max) = summary(times);
            println!(
                "{dtype:?} {rows}x{cols}, {n} rows: {median:>8.1} µs [{min:.1}–{max:.1}], {:.2}× the first",
                median / one
            );
        }
    }
}

/// Mean time of a product over enough back-to-back runs to fill a few milliseconds.
fn time(product: impl Fn() -> Tensor) -> Duration {
    let started = Instant::now();
    let mut n = 0;
    while n < 3 || started.elapsed() < Duration::from_millis(5) {
        std::hint::black_box(product());
        n += 1;
    }
    started.elapsed() / n
}

/// (median, min, max) in µs.
fn summary(times: &mut [Duration]) -> (f64, f64, f64) {
    times.sort();
    let us = |d: Duration| d.as_secs_f64() * 1e6;
    (us(times[times.len() / 2]), us(times[0]), us(times[times.len() - 1]))
}

//! Prefill attention at depth against the machine's arithmetic peak: a chunk of new queries
//! attending to a long cached prefix, as a prompt read deep in a conversation does, through the
//! public cache API (16-position blocks of the shared KV pool, as the server stores them).
//! Prints the achieved GFLOP/s (4·d per query row and key it sees: the scores' and the values'
//! multiply-adds) and its share of the FMA peak measured here on the same threads.
//! Run: `cargo bench -p spindle-models --bench attention [-- --depth 8192 --rows 1024 --kv f16
//! --repeats 5]` (the median of the repeats, with the slowest and fastest)
//! (`SPINDLE_ISA=avx2` measures the AVX2 copy, and its peak, on an AVX-512 CPU).

use std::sync::Arc;
use std::time::Instant;

use candle_core::{Device, Tensor};
use spindle_models::{KvShape, KvType, PagedKv, RecurrentState, SequenceCache};

const BLOCK: usize = 16;

/// A model's attention shape: query heads, key/value heads, head size.
struct Shape {
    name: &'static str,
    heads: usize,
    kv_heads: usize,
    d: usize,
}

const SHAPES: [Shape; 4] = [
    Shape { name: "qwen2.5-0.5b", heads: 14, kv_heads: 2, d: 64 },
    Shape { name: "smollm2-135m", heads: 9, kv_heads: 3, d: 64 },
    Shape { name: "qwen2.5-1.5b", heads: 12, kv_heads: 2, d: 128 },
    Shape { name: "gemma3-270m", heads: 4, kv_heads: 1, d: 256 },
];

fn main() {
    let mut depth = 8192;
    let mut rows = 1024;
    let mut kind = KvType::F16;
    let mut repeats = 5;
    let mut only = Vec::new();
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--depth" => depth = args.next().and_then(|v| v.parse().ok()).expect("--depth N"),
            "--rows" => rows = args.next().and_then(|v| v.parse().ok()).expect("--rows N"),
            "--kv" => kind = args.next().and_then(|v| v.parse().ok()).expect("--kv TYPE"),
            "--repeats" => repeats = args.next().and_then(|v| v.parse().ok()).expect("--repeats N"),
            "--bench" => {}
            name => only.push(name.to_string()),
        }
    }
    let threads = rayon::current_num_threads();
    let peak = fma_peak_gflops(threads);
    println!(
        "{threads} threads, FMA peak {peak:.1} GFLOP/s; depth {depth}, {rows} new rows, {kind}"
    );
    for shape in SHAPES.iter().filter(|s| only.is_empty() || only.iter().any(|o| o == s.name)) {
        let mut cache = prefilled(shape, kind, depth, rows);
        let q = Tensor::randn(0f32, 1.0, (1, shape.heads, rows, shape.d), &Device::Cpu).unwrap();
        let kv =
            || Tensor::randn(0f32, 1.0, (1, shape.kv_heads, rows, shape.d), &Device::Cpu).unwrap();
        let (k, v) = (kv(), kv());
        let mut seconds = Vec::new();
        for _ in 0..repeats.max(1) {
            let start = Instant::now();
            cache.attend(0, [&q, &k, &v], 0.125, None, threads).unwrap();
            seconds.push(start.elapsed().as_secs_f64());
        }
        seconds.sort_by(f64::total_cmp);
        // Row i of each head sees depth + i + 1 keys.
        let pairs = shape.heads as f64 * (rows as f64 * (depth as f64 + (rows as f64 + 1.0) / 2.0));
        let gflop = pairs * 4.0 * shape.d as f64 / 1e9;
        let rate = |s: f64| gflop / s;
        println!(
            "{:14} {:7.1} GFLOP/s [{:.1}-{:.1}] = {:4.1}% of peak; {:.1} ms per chunk",
            shape.name,
            rate(seconds[seconds.len() / 2]),
            rate(seconds[seconds.len() - 1]),
            rate(seconds[0]),
            100.0 * rate(seconds[seconds.len() / 2]) / peak,
            seconds[seconds.len() / 2] * 1e3,
        );
    }
}

/// A one-layer cache in 16-position blocks holding `depth` positions of random keys/values,
/// with blocks for `rows` more.
fn prefilled(shape: &Shape, kind: KvType, depth: usize, rows: usize) -> SequenceCache {
    let kv_shape = KvShape { kv_heads: shape.kv_heads, head_dim: shape.d, window: None };
    let blocks = (depth + rows).div_ceil(BLOCK);
    let kv = Arc::new(PagedKv::new(&[Some(kv_shape)], kind, blocks, BLOCK));
    let table = (0..blocks as u32).collect();
    let mut cache = SequenceCache::resume(kv, table, 0, RecurrentState::none(1), depth + rows);
    let chunk = 512;
    for at in (0..depth).step_by(chunk) {
        let n = chunk.min(depth - at);
        let t = |heads| Tensor::randn(0f32, 1.0, (1, heads, n, shape.d), &Device::Cpu).unwrap();
        cache
            .attend(0, [&t(shape.heads), &t(shape.kv_heads), &t(shape.kv_heads)], 0.125, None, 1)
            .unwrap();
        cache.advance(n);
    }
    cache
}

/// Floating-point operations per second that independent fused multiply-add chains reach on
/// `threads` threads (two per multiply-add), best of five.
fn fma_peak_gflops(threads: usize) -> f64 {
    const ITERATIONS: usize = 20_000_000;
    let lanes = fma_lanes();
    let mut best = 0f64;
    for _ in 0..5 {
        let start = Instant::now();
        let sums: f32 = rayon::broadcast(|_| fma_chains(ITERATIONS)).into_iter().sum();
        let seconds = start.elapsed().as_secs_f64();
        std::hint::black_box(sums);
        best = best.max((threads * ITERATIONS * CHAINS * lanes * 2) as f64 / seconds / 1e9);
    }
    best
}

/// Independent accumulators: enough to cover the FMA latency on two units.
const CHAINS: usize = 12;

fn fma_lanes() -> usize {
    let isa = std::env::var("SPINDLE_ISA").unwrap_or_default();
    if std::is_x86_feature_detected!("avx512f") && isa != "avx2" {
        16
    } else {
        8
    }
}

fn fma_chains(iterations: usize) -> f32 {
    #[cfg(target_arch = "x86_64")]
    {
        if fma_lanes() == 16 {
            // SAFETY: the CPU runs AVX-512F.
            return unsafe { chains_avx512(iterations) };
        }
        // SAFETY: x86-64 machines this server runs on have AVX2 and FMA.
        unsafe { chains_avx2(iterations) }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = iterations;
        unimplemented!("the FMA peak is measured on x86-64 only")
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn chains_avx2(iterations: usize) -> f32 {
    use std::arch::x86_64::*;
    let (a, b) = (_mm256_set1_ps(0.999_999), _mm256_set1_ps(1e-7));
    let mut acc = [_mm256_set1_ps(1.0); CHAINS];
    for _ in 0..iterations {
        for x in &mut acc {
            *x = _mm256_fmadd_ps(*x, a, b);
        }
    }
    let mut out = [0f32; 8];
    let sum = acc.iter().fold(_mm256_setzero_ps(), |s, x| _mm256_add_ps(s, *x));
    _mm256_storeu_ps(out.as_mut_ptr(), sum);
    out.iter().sum()
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn chains_avx512(iterations: usize) -> f32 {
    use std::arch::x86_64::*;
    let (a, b) = (_mm512_set1_ps(0.999_999), _mm512_set1_ps(1e-7));
    let mut acc = [_mm512_set1_ps(1.0); CHAINS];
    for _ in 0..iterations {
        for x in &mut acc {
            *x = _mm512_fmadd_ps(*x, a, b);
        }
    }
    _mm512_reduce_add_ps(acc.iter().fold(_mm512_setzero_ps(), |s, x| _mm512_add_ps(s, *x)))
}

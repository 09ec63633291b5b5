//! Attention over a contiguous KV cache against the CPU's paged attention
//! (`SequenceCache::attend`), for prefill chunks after a cached prefix and decode steps.

use candle_core::{Device, Tensor};
use spindle_gpu::{
    Attention, AttentionShape, Gpu, KvCache, KvFormat, KvPool, PagedRows, QueryPlace,
};
use spindle_models::{KvShape, KvType, RecurrentState, SequenceCache};

use crate::harness::{check, computed, gpu_or_skip, rng, same_bits, uniform};

/// Per output value, absolute (values in [-1, 1), so outputs are too): an online softmax
/// against the CPU's two-pass one, and the device's `exp` against the CPU's (measured on
/// lavapipe: 1.8e-7).
const ATTENTION_TOLERANCE: f64 = 1e-6;

struct Case {
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
    past: usize,
    tokens: usize,
    window: Option<usize>,
}

/// (tokens, heads, d) → (1, heads, tokens, d), the CPU's layout.
fn heads_first(x: &[f32], tokens: usize, heads: usize, d: usize) -> Tensor {
    Tensor::from_vec(x.to_vec(), (tokens, heads, d), &Device::Cpu)
        .unwrap()
        .transpose(0, 1)
        .unwrap()
        .unsqueeze(0)
        .unwrap()
        .contiguous()
        .unwrap()
}

/// The CPU's outputs for the last `tokens` of `positions` queries, `(tokens, heads, d)`.
fn cpu_attention(case: &Case, q: &[f32], k: &[f32], v: &[f32], scale: f32) -> Vec<f32> {
    cpu_attention_over(KvType::F32, case, q, k, v, scale)
}

/// [`cpu_attention`] with keys and values stored as `kind`.
fn cpu_attention_over(
    kind: KvType,
    case: &Case,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    scale: f32,
) -> Vec<f32> {
    let Case { heads, kv_heads, head_dim: d, past, tokens, window } = *case;
    let shape = KvShape { kv_heads, head_dim: d, window };
    let mut cache =
        SequenceCache::standalone(&[Some(shape)], kind, RecurrentState::none(1), past + tokens);
    let (kv_row, q_row) = (kv_heads * d, heads * d);
    // The prefix goes in as one chunk whose outputs are not looked at.
    if past > 0 {
        let qp = heads_first(&vec![0.0; past * q_row], past, heads, d);
        let kp = heads_first(&k[..past * kv_row], past, kv_heads, d);
        let vp = heads_first(&v[..past * kv_row], past, kv_heads, d);
        cache.attend(0, [&qp, &kp, &vp], scale, window, 1).unwrap();
        cache.advance(past);
    }
    let qn = heads_first(q, tokens, heads, d);
    let kn = heads_first(&k[past * kv_row..], tokens, kv_heads, d);
    let vn = heads_first(&v[past * kv_row..], tokens, kv_heads, d);
    let out = cache.attend(0, [&qn, &kn, &vn], scale, window, 1).unwrap();
    out.squeeze(0).unwrap().transpose(0, 1).unwrap().flatten_all().unwrap().to_vec1().unwrap()
}

fn gpu_attention(
    gpu: &Gpu,
    kernel: &Attention,
    case: &Case,
    q: &[f32],
    kv: [&[f32]; 2],
    len: usize,
    scale: f32,
) -> Vec<f32> {
    let cache =
        KvCache { keys: gpu.upload(kv[0]).unwrap(), values: gpu.upload(kv[1]).unwrap(), len };
    let shape = AttentionShape {
        heads: case.heads,
        kv_heads: case.kv_heads,
        head_dim: case.head_dim,
        scale,
        window: case.window,
    };
    let q = gpu.upload(q).unwrap();
    computed(gpu, |step| kernel.forward(step, &q, &cache, shape))
}

#[test]
fn prefill_and_decode_match_the_cpu_and_each_query_is_the_same_alone() {
    let Some(gpu) = gpu_or_skip() else { return };
    let kernel = Attention::new(gpu).unwrap();
    let mut rng = rng(11);
    let cases = [
        // A decode step, grouped-query heads, keys past one chunk of 64.
        Case { heads: 4, kv_heads: 2, head_dim: 64, past: 70, tokens: 1, window: None },
        // A prefill from empty; head width not a multiple of 64 (80).
        Case { heads: 3, kv_heads: 3, head_dim: 80, past: 0, tokens: 19, window: None },
        // A chunk after a prefix, one key/value head, the widest heads.
        Case { heads: 8, kv_heads: 1, head_dim: 256, past: 130, tokens: 6, window: None },
        // A sliding window shorter than the chunk (Gemma's local layers).
        Case { heads: 2, kv_heads: 1, head_dim: 128, past: 90, tokens: 7, window: Some(37) },
    ];
    for case in &cases {
        let d = case.head_dim;
        let len = case.past + case.tokens;
        let scale = 1.0 / (d as f32).sqrt();
        let q = uniform(&mut rng, case.tokens * case.heads * d);
        let k = uniform(&mut rng, len * case.kv_heads * d);
        let v = uniform(&mut rng, len * case.kv_heads * d);
        let got = gpu_attention(gpu, &kernel, case, &q, [&k, &v], len, scale);
        let want: Vec<f64> =
            cpu_attention(case, &q, &k, &v, scale).iter().map(|&x| x as f64).collect();
        let what = format!(
            "attention {}/{} heads of {d}, {} after {}, window {:?}",
            case.heads, case.kv_heads, case.tokens, case.past, case.window
        );
        check(&what, &got, &want, &vec![1.0; want.len()], ATTENTION_TOLERANCE);
        // Each query as its own decode step over the same cache: the same bits.
        let row = case.heads * d;
        for t in 0..case.tokens {
            let alone = gpu_attention(
                gpu,
                &kernel,
                case,
                &q[t * row..(t + 1) * row],
                [&k, &v],
                case.past + t + 1,
                scale,
            );
            same_bits(&format!("{what}: query {t} alone"), &alone, &got[t * row..(t + 1) * row]);
        }
    }
}

#[test]
fn shapes_the_kernel_cannot_hold_are_errors() {
    let Some(gpu) = gpu_or_skip() else { return };
    let kernel = Attention::new(gpu).unwrap();
    let cache =
        KvCache { keys: gpu.zeros(4 * 512).unwrap(), values: gpu.zeros(4 * 512).unwrap(), len: 4 };
    let wide = AttentionShape { heads: 1, kv_heads: 1, head_dim: 512, scale: 1.0, window: None };
    let q = gpu.zeros(512).unwrap();
    assert!(gpu.run(|step| kernel.forward(step, &q, &cache, wide)).is_err());
    let uneven = AttentionShape { heads: 3, kv_heads: 2, head_dim: 64, scale: 1.0, window: None };
    let q = gpu.zeros(192).unwrap();
    assert!(gpu.run(|step| kernel.forward(step, &q, &cache, uneven)).is_err());
    // More queries than the cache holds positions.
    let fine = AttentionShape { heads: 1, kv_heads: 1, head_dim: 64, scale: 1.0, window: None };
    let q = gpu.zeros(5 * 64).unwrap();
    assert!(gpu.run(|step| kernel.forward(step, &q, &cache, fine)).is_err());
}

#[test]
fn places_outside_their_block_tables_or_pool_are_errors() {
    let Some(gpu) = gpu_or_skip() else { return };
    let kernel = Attention::new(gpu).unwrap();
    let shape = AttentionShape { heads: 2, kv_heads: 1, head_dim: 64, scale: 1.0, window: None };
    // Two blocks of 4 slots; queries of two rows.
    let pool = KvPool::new(gpu, (2, 4), 64, KvFormat::F32).unwrap();
    let (q, kv) = (gpu.zeros(2 * 128).unwrap(), gpu.zeros(2 * 64).unwrap());
    let out = gpu.zeros(2 * 128).unwrap();
    let place = |row, position| QueryPlace { row, position, table_start: 0 };
    let run = |places: Vec<QueryPlace>, table: Vec<u32>| {
        let rows = PagedRows::upload(gpu, places, table).unwrap();
        gpu.run(|step| {
            kernel.write(step, &kv, &kv, &pool, &rows)?;
            kernel.paged(step, &q, &pool, &rows, shape, &out)
        })
    };
    assert!(run(vec![place(0, 3), place(1, 4)], vec![1, 0]).is_ok());
    // Position 8 needs a third table entry; block 2 is past the pool; row 2 past the step.
    assert!(run(vec![place(0, 8)], vec![1, 0]).is_err());
    assert!(run(vec![place(0, 1)], vec![2]).is_err());
    assert!(run(vec![place(2, 1)], vec![0]).is_err());
}

/// A sliding-window layer over a paged pool: rows further back than every query's window hold
/// NaN (as stale rows of released blocks might), and the outputs are the CPU's windowed ones,
/// finite. With the window left off, the same kernel reads those rows: the check that the
/// poison is there, so this fails for a kernel that ignores the window or reads values it
/// weights by 0 (0 · NaN is NaN).
#[test]
fn a_sliding_window_reads_no_key_or_value_further_back() {
    let Some(gpu) = gpu_or_skip() else { return };
    let kernel = Attention::new(gpu).unwrap();
    let mut rng = rng(23);
    // Queries at 75..80 see 56.. and later with a window of 20: the first chunk of 64 keys
    // holds both unseen and seen positions.
    let case = Case { heads: 2, kv_heads: 1, head_dim: 64, past: 75, tokens: 5, window: Some(20) };
    let (d, len, block_size) = (case.head_dim, case.past + case.tokens, 8);
    let first_seen = case.past + 1 - 20;
    let scale = 1.0 / (d as f32).sqrt();
    let q = uniform(&mut rng, case.tokens * case.heads * d);
    let (k, v) = (uniform(&mut rng, len * d), uniform(&mut rng, len * d));
    let want: Vec<f64> =
        cpu_attention(&case, &q, &k, &v, scale).iter().map(|&x| x as f64).collect();
    let poisoned = |x: &[f32]| {
        let mut x = x.to_vec();
        x[..first_seen * d].fill(f32::NAN);
        gpu.upload(&x).unwrap()
    };
    let (keys, values) = (poisoned(&k), poisoned(&v));
    // Ten blocks out of twelve, out of order.
    let table = vec![5, 2, 7, 0, 11, 3, 9, 1, 4, 10];
    let pool = KvPool::new(gpu, (12, block_size), d, KvFormat::F32).unwrap();
    let place = |row, position| QueryPlace { row, position, table_start: 0 };
    let every = PagedRows::upload(gpu, (0..len).map(|p| place(p, p)).collect(), table.clone());
    let queries =
        PagedRows::upload(gpu, (0..case.tokens).map(|t| place(t, case.past + t)).collect(), table);
    let (every, queries) = (every.unwrap(), queries.unwrap());
    let q = gpu.upload(&q).unwrap();
    let attend = |window| {
        let shape = AttentionShape { heads: 2, kv_heads: 1, head_dim: d, scale, window };
        computed(gpu, |step| {
            kernel.write(step, &keys, &values, &pool, &every)?;
            let out = gpu.zeros(q.len())?;
            kernel.paged(step, &q, &pool, &queries, shape, &out)?;
            Ok(out)
        })
    };
    let got = attend(case.window);
    check("window 20 over poisoned rows", &got, &want, &vec![1.0; want.len()], ATTENTION_TOLERANCE);
    let unwindowed = attend(None);
    assert!(unwindowed.iter().all(|x| x.is_nan()), "without the window the poison is read");
}

/// A pool of f16 keys and values (two to a word: half the memory) attends as the CPU does over
/// its f16 KV cache, each value rounded once as it is stored, in a paged, scattered pool.
#[test]
fn an_f16_pool_attends_as_the_cpus_f16_cache() {
    let Some(gpu) = gpu_or_skip() else { return };
    let kernel = Attention::new(gpu).unwrap();
    let mut rng = rng(29);
    let case = Case { heads: 4, kv_heads: 2, head_dim: 64, past: 37, tokens: 5, window: None };
    let (d, len, block_size) = (case.head_dim, case.past + case.tokens, 8);
    let kv_width = case.kv_heads * d;
    let scale = 1.0 / (d as f32).sqrt();
    let q = uniform(&mut rng, case.tokens * case.heads * d);
    let (k, v) = (uniform(&mut rng, len * kv_width), uniform(&mut rng, len * kv_width));
    let want = |kind| -> Vec<f64> {
        let out = cpu_attention_over(kind, &case, &q, &k, &v, scale);
        out.iter().map(|&x| x as f64).collect()
    };
    let (want_f16, want_f32) = (want(KvType::F16), want(KvType::F32));
    let pool = KvPool::new(gpu, (8, block_size), kv_width, KvFormat::F16).unwrap();
    assert_eq!(pool.format(), KvFormat::F16);
    let table = vec![6, 1, 4, 7, 0, 3];
    let place = |row, position| QueryPlace { row, position, table_start: 0 };
    let every = PagedRows::upload(gpu, (0..len).map(|p| place(p, p)).collect(), table.clone());
    let queries =
        PagedRows::upload(gpu, (0..case.tokens).map(|t| place(t, case.past + t)).collect(), table);
    let (every, queries) = (every.unwrap(), queries.unwrap());
    let (keys, values, q) =
        (gpu.upload(&k).unwrap(), gpu.upload(&v).unwrap(), gpu.upload(&q).unwrap());
    let shape = AttentionShape { heads: 4, kv_heads: 2, head_dim: d, scale, window: None };
    let got = computed(gpu, |step| {
        kernel.write(step, &keys, &values, &pool, &every)?;
        let out = gpu.zeros(q.len())?;
        kernel.paged(step, &q, &pool, &queries, shape, &out)?;
        Ok(out)
    });
    let ones = vec![1.0; want_f16.len()];
    check("f16 pool against the CPU's f16 cache", &got, &want_f16, &ones, ATTENTION_TOLERANCE);
    // And not the f32 outputs: the values were rounded.
    let (off, _) = crate::harness::worst(&got, &want_f32, &ones);
    assert!(off > 10.0 * ATTENTION_TOLERANCE, "as f32 within {off:e}: nothing was rounded");
}

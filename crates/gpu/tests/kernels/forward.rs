//! A whole dense model (the tiny random Qwen2 of `spindle_models::random_dense`) run from the
//! kernels, against the CPU engine: the same greedy tokens over a prefill and decode steps.
//! The model assembly here is the test's own; the engine's GPU path comes later.

use std::collections::HashMap;

use candle_core::{Device, Tensor};
use spindle_gpu::{
    Attention, AttentionShape, Elementwise, Gpu, GpuMatrix, GpuTensor, KvCache, Matmul, RmsNorm,
    Rope, RopePairs, RopeShape, RopeTable, WeightFormat,
};
use spindle_models::random_dense::{write_random_dense, DenseShape};
use spindle_models::{RopeScaling, RopeStyle, Rotary};

use crate::harness::gpu_or_skip;

/// Greedy steps after the prompt.
const STEPS: usize = 12;
/// Largest logit difference allowed between the paths (measured on lavapipe: 5.1e-6; logits of
/// a few units, f32 sums of 32 to 512 terms through two layers).
const LOGIT_TOLERANCE: f32 = 1e-4;

/// The kernels one forward pass uses, compiled once.
struct Kernels {
    norm: RmsNorm,
    product: Matmul,
    rope: Rope,
    attention: Attention,
    add: Elementwise,
    silu_mul: Elementwise,
}

struct Layer {
    input_norm: GpuTensor,
    post_norm: GpuTensor,
    q: GpuMatrix,
    k: GpuMatrix,
    v: GpuMatrix,
    o: GpuMatrix,
    gate: GpuMatrix,
    up: GpuMatrix,
    down: GpuMatrix,
    cache: KvCache,
}

struct GpuModel {
    shape: DenseShape,
    embed: Vec<f32>,
    layers: Vec<Layer>,
    norm: GpuTensor,
    head: GpuMatrix,
    rotary: Rotary,
    kernels: Kernels,
    len: usize,
}

impl GpuModel {
    fn load(gpu: &Gpu, shape: DenseShape, tensors: &HashMap<String, Tensor>) -> GpuModel {
        let values = |name: &str| -> Vec<f32> {
            tensors[name].flatten_all().unwrap().to_vec1().unwrap_or_else(|e| panic!("{name}: {e}"))
        };
        let vector = |name: &str| gpu.upload(&values(name)).unwrap();
        let matrix = |name: &str| {
            let (rows, cols) = tensors[name].dims2().unwrap();
            let bytes: Vec<u8> = values(name).iter().flat_map(|v| v.to_le_bytes()).collect();
            GpuMatrix::upload(gpu, WeightFormat::F32, rows, cols, &bytes).unwrap()
        };
        let kv = shape.kv_heads * shape.head_dim * 64;
        let layers = (0..shape.layers)
            .map(|i| {
                let p = format!("model.layers.{i}");
                Layer {
                    input_norm: vector(&format!("{p}.input_layernorm.weight")),
                    post_norm: vector(&format!("{p}.post_attention_layernorm.weight")),
                    q: matrix(&format!("{p}.self_attn.q_proj.weight")),
                    k: matrix(&format!("{p}.self_attn.k_proj.weight")),
                    v: matrix(&format!("{p}.self_attn.v_proj.weight")),
                    o: matrix(&format!("{p}.self_attn.o_proj.weight")),
                    gate: matrix(&format!("{p}.mlp.gate_proj.weight")),
                    up: matrix(&format!("{p}.mlp.up_proj.weight")),
                    down: matrix(&format!("{p}.mlp.down_proj.weight")),
                    cache: KvCache {
                        keys: gpu.zeros(kv).unwrap(),
                        values: gpu.zeros(kv).unwrap(),
                        len: 0,
                    },
                }
            })
            .collect();
        let kernels = Kernels {
            norm: RmsNorm::new(gpu).unwrap(),
            product: Matmul::new(gpu, WeightFormat::F32).unwrap(),
            rope: Rope::new(gpu).unwrap(),
            attention: Attention::new(gpu).unwrap(),
            add: Elementwise::add(gpu).unwrap(),
            silu_mul: Elementwise::silu_mul(gpu).unwrap(),
        };
        GpuModel {
            shape,
            embed: values("model.embed_tokens.weight"),
            layers,
            norm: vector("model.norm.weight"),
            head: matrix("lm_head.weight"),
            rotary: Rotary::new(shape.head_dim, 1_000_000.0, &RopeScaling::None, RopeStyle::Halves),
            kernels,
            len: 0,
        }
    }

    /// The logits after the last of `tokens`, run after the positions already cached.
    fn forward(&mut self, gpu: &Gpu, tokens: &[u32]) -> Vec<f32> {
        let (h, d, k) = (self.shape.hidden, self.shape.head_dim, &self.kernels);
        let rows: Vec<f32> =
            tokens.iter().flat_map(|&t| self.embed[t as usize * h..][..h].to_vec()).collect();
        let mut x = gpu.upload(&rows).unwrap();
        let (cos, sin) = self.rotary.cos_sin(self.len, tokens.len());
        let table = RopeTable { cos: gpu.upload(&cos).unwrap(), sin: gpu.upload(&sin).unwrap() };
        let turn =
            |heads| RopeShape { heads, head_dim: d, rotary_dim: d, pairs: RopePairs::Halves };
        let heads = AttentionShape {
            heads: self.shape.heads,
            kv_heads: self.shape.kv_heads,
            head_dim: d,
            scale: 1.0 / (d as f32).sqrt(),
            window: None,
        };
        for layer in &mut self.layers {
            // 1. attention: norm, projections, rotation, keys and values into the cache.
            let normed = k.norm.forward(gpu, &x, &layer.input_norm, 1e-6).unwrap();
            let q = k.product.forward(gpu, &layer.q, &normed).unwrap();
            let key = k.product.forward(gpu, &layer.k, &normed).unwrap();
            let value = k.product.forward(gpu, &layer.v, &normed).unwrap();
            k.rope.apply(gpu, &q, turn(self.shape.heads), &table).unwrap();
            k.rope.apply(gpu, &key, turn(self.shape.kv_heads), &table).unwrap();
            let at = self.len * self.shape.kv_heads * d;
            gpu.copy_into(&key, &layer.cache.keys, at).unwrap();
            gpu.copy_into(&value, &layer.cache.values, at).unwrap();
            layer.cache.len = self.len + tokens.len();
            let attended = k.attention.forward(gpu, &q, &layer.cache, heads).unwrap();
            let out = k.product.forward(gpu, &layer.o, &attended).unwrap();
            x = k.add.forward(gpu, &x, &out).unwrap();
            // 2. the gated MLP.
            let normed = k.norm.forward(gpu, &x, &layer.post_norm, 1e-6).unwrap();
            let gate = k.product.forward(gpu, &layer.gate, &normed).unwrap();
            let up = k.product.forward(gpu, &layer.up, &normed).unwrap();
            let mixed = k.silu_mul.forward(gpu, &gate, &up).unwrap();
            let out = k.product.forward(gpu, &layer.down, &mixed).unwrap();
            x = k.add.forward(gpu, &x, &out).unwrap();
        }
        self.len += tokens.len();
        let last = gpu.download(&x).unwrap().split_off((tokens.len() - 1) * h);
        let normed = k.norm.forward(gpu, &gpu.upload(&last).unwrap(), &self.norm, 1e-6).unwrap();
        gpu.download(&k.product.forward(gpu, &self.head, &normed).unwrap()).unwrap()
    }
}

fn argmax(logits: &[f32]) -> u32 {
    (0..logits.len()).fold(0, |best, i| if logits[i] > logits[best] { i } else { best }) as u32
}

#[test]
fn the_tiny_model_decodes_the_cpu_engines_greedy_tokens() {
    let Some(gpu) = gpu_or_skip() else { return };
    let dir = tempfile::tempdir().unwrap();
    let shape = DenseShape { vocab: 512, context: 64, ..DenseShape::tiny(512) };
    write_random_dense(dir.path(), &shape, 41, &[]).unwrap();
    let cpu = spindle_models::load_safetensors(dir.path()).unwrap();
    let tensors =
        candle_core::safetensors::load(dir.path().join("model.safetensors"), &Device::Cpu).unwrap();
    let mut on_gpu = GpuModel::load(gpu, shape, &tensors);
    let mut cache = cpu.new_cache(64);
    let mut tokens = vec![3, 141, 59, 26, 5];
    let (mut worst, mut agreed) = (0.0f32, 0);
    for step in 0..=STEPS {
        let fresh = if step == 0 { tokens.clone() } else { vec![*tokens.last().unwrap()] };
        let want = cpu.forward(&fresh, &mut cache).unwrap();
        let got = on_gpu.forward(gpu, &fresh);
        let diff = got.iter().zip(&want).map(|(a, b)| (a - b).abs()).fold(0.0, f32::max);
        worst = worst.max(diff);
        assert_eq!(
            argmax(&got),
            argmax(&want),
            "step {step}: greedy tokens differ (logits differ by up to {diff})"
        );
        agreed += 1;
        tokens.push(argmax(&want));
    }
    eprintln!("tiny model: {agreed} greedy tokens agree; max logit difference {worst:.2e}");
    assert!(worst <= LOGIT_TOLERANCE, "logits differ by {worst}");
}

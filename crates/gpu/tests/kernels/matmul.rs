//! Weight × activation products in every format, against the f64 product of the same
//! dequantized weights (the GPU's own rounding) and against the CPU kernels, whose activations
//! are quantized to 8 bits (the two paths' difference).

use std::sync::Arc;

use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{Device, Tensor};
use half::{bf16, f16};
use rand::Rng;
use spindle_gpu::{Embed, GatheredMatmul, Gpu, GpuMatrix, Matmul, WeightFormat};
use spindle_models::{BlockFormat, BlockMatrix, Q4KMatrix, Q6KMatrix, QuantizedMatrix};

use crate::harness::{check, computed, gpu_or_skip, rng, same_bits, uniform};

/// GPU against the f64 product of the weights it decoded, per output, relative to
/// `Σ|w·x|`: f32 sums of up to ~3,000 terms, in 32-value runs and a 64-lane tree (measured on
/// lavapipe: at most 7.3e-8, Q4_K).
const EXACT_TOLERANCE: f64 = 5e-7;
/// GPU against the CPU kernels, relative to `Σ|w·x|`: the CPU rounds activations to 8 bits
/// per 32 (Q8_0) or 256 (Q8_K) values, up to 1/254 of a block's largest (measured on lavapipe:
/// Q6_K 1.4e-3, Q4_0 1.2e-3, Q4_K 1.1e-3, Q8_0 4.4e-4; f16/bf16, whose CPU path is f32,
/// 8e-8).
const CPU_TOLERANCE: f64 = 4e-3;

/// A weight of `rows × cols` in `format`: its file bytes and the values they decode to.
struct Weight {
    bytes: Vec<u8>,
    decoded: Vec<f32>,
    quantized: Option<Arc<QTensor>>,
}

fn ggml(format: WeightFormat) -> Option<GgmlDType> {
    Some(match format {
        WeightFormat::Q4_0 => GgmlDType::Q4_0,
        WeightFormat::Q4_1 => GgmlDType::Q4_1,
        WeightFormat::Q5_0 => GgmlDType::Q5_0,
        WeightFormat::Q5_1 => GgmlDType::Q5_1,
        WeightFormat::Q8_0 => GgmlDType::Q8_0,
        WeightFormat::Q2K => GgmlDType::Q2K,
        WeightFormat::Q3K => GgmlDType::Q3K,
        WeightFormat::Q4K => GgmlDType::Q4K,
        WeightFormat::Q5K => GgmlDType::Q5K,
        WeightFormat::Q6K => GgmlDType::Q6K,
        WeightFormat::F32 | WeightFormat::F16 | WeightFormat::Bf16 => return None,
    })
}

fn weight(format: WeightFormat, values: &[f32], rows: usize, cols: usize) -> Weight {
    match (format, ggml(format)) {
        (_, Some(dtype)) => {
            let t = Tensor::from_vec(values.to_vec(), (rows, cols), &Device::Cpu).unwrap();
            let q = Arc::new(QTensor::quantize(&t, dtype).unwrap());
            let decoded =
                q.dequantize(&Device::Cpu).unwrap().flatten_all().unwrap().to_vec1().unwrap();
            Weight { bytes: q.data().unwrap().to_vec(), decoded, quantized: Some(q) }
        }
        (WeightFormat::F32, None) => Weight {
            bytes: values.iter().flat_map(|v| v.to_le_bytes()).collect(),
            decoded: values.to_vec(),
            quantized: None,
        },
        (WeightFormat::Bf16, None) => {
            let h: Vec<bf16> = values.iter().map(|&v| bf16::from_f32(v)).collect();
            let decoded = h.iter().map(|v| v.to_f32()).collect();
            Weight {
                bytes: h.iter().flat_map(|v| v.to_le_bytes()).collect(),
                decoded,
                quantized: None,
            }
        }
        _ => {
            let h: Vec<f16> = values.iter().map(|&v| f16::from_f32(v)).collect();
            let decoded = h.iter().map(|v| v.to_f32()).collect();
            Weight {
                bytes: h.iter().flat_map(|v| v.to_le_bytes()).collect(),
                decoded,
                quantized: None,
            }
        }
    }
}

/// The CPU's product: the engine's kernel for the format (candle's dense matmul for f32/f16/bf16,
/// which Spindle runs on weights it has widened to f32).
fn cpu_product(format: WeightFormat, w: &Weight, rows: usize, cols: usize, x: &[f32]) -> Vec<f32> {
    let tokens = x.len() / cols;
    let xt = Tensor::from_vec(x.to_vec(), (tokens, cols), &Device::Cpu).unwrap();
    let block = |f| BlockMatrix::new(f, rows, cols, &w.bytes).unwrap().forward(&xt).unwrap();
    let tiled = rows.is_multiple_of(16) && spindle_models::k_quant_kernels_run();
    let y = match format {
        WeightFormat::Q4_0 => block(BlockFormat::Q4_0),
        WeightFormat::Q4_1 => block(BlockFormat::Q4_1),
        WeightFormat::Q5_0 => block(BlockFormat::Q5_0),
        WeightFormat::Q5_1 => block(BlockFormat::Q5_1),
        WeightFormat::Q8_0 => block(BlockFormat::Q8_0),
        WeightFormat::Q4K if tiled => {
            Q4KMatrix::new(rows, cols, &w.bytes).unwrap().forward(&xt).unwrap()
        }
        WeightFormat::Q6K if tiled => {
            Q6KMatrix::new(rows, cols, &w.bytes).unwrap().forward(&xt).unwrap()
        }
        WeightFormat::Q2K
        | WeightFormat::Q3K
        | WeightFormat::Q4K
        | WeightFormat::Q5K
        | WeightFormat::Q6K => {
            let q = w.quantized.clone().unwrap();
            QuantizedMatrix::new(q, 1).unwrap().forward(&xt).unwrap()
        }
        WeightFormat::F32 | WeightFormat::F16 | WeightFormat::Bf16 => {
            let wt = Tensor::from_vec(w.decoded.clone(), (rows, cols), &Device::Cpu).unwrap();
            xt.matmul(&wt.t().unwrap()).unwrap()
        }
    };
    y.flatten_all().unwrap().to_vec1().unwrap()
}

/// Per output `(t, r)`: the f64 product of the decoded weights, and `Σ|w·x|`.
fn exact_product(decoded: &[f32], cols: usize, x: &[f32]) -> (Vec<f64>, Vec<f64>) {
    let mut want = Vec::new();
    let mut scale = Vec::new();
    for xt in x.chunks(cols) {
        for wr in decoded.chunks(cols) {
            want.push(wr.iter().zip(xt).map(|(&w, &x)| w as f64 * x as f64).sum());
            scale.push(wr.iter().zip(xt).map(|(&w, &x)| (w as f64 * x as f64).abs()).sum());
        }
    }
    (want, scale)
}

fn gpu_product(gpu: &Gpu, kernel: &Matmul, w: &GpuMatrix, x: &[f32]) -> Vec<f32> {
    let x = gpu.upload(x).unwrap();
    computed(gpu, |step| kernel.forward(step, w, &x))
}

/// Values per block: columns come in whole blocks (any count for f16/bf16).
fn block_values(format: WeightFormat) -> usize {
    match format {
        WeightFormat::F32 | WeightFormat::F16 | WeightFormat::Bf16 => 1,
        WeightFormat::Q2K
        | WeightFormat::Q3K
        | WeightFormat::Q4K
        | WeightFormat::Q5K
        | WeightFormat::Q6K => 256,
        _ => 32,
    }
}

#[test]
fn every_format_matches_the_cpu_on_random_ragged_shapes() {
    let Some(gpu) = gpu_or_skip() else { return };
    let mut rng = rng(41);
    for format in WeightFormat::ALL {
        let kernel = Matmul::new(gpu, format).unwrap();
        let values = block_values(format);
        // Rows not a multiple of the CPU's 16-row tiles, columns past the 64 lanes' first
        // round, tokens past a group of 8: every tail the kernels have.
        for (rows, tokens) in [(1, 1), (37, 5), (48, 13), (80, 9)] {
            let blocks = match values {
                256 => rng.random_range(1..=4),
                32 => rng.random_range(1..=90),
                _ => rng.random_range(1..=2900),
            };
            let cols = blocks * values;
            let w = weight(format, &uniform(&mut rng, rows * cols), rows, cols);
            let x = uniform(&mut rng, tokens * cols);
            let on_gpu = GpuMatrix::upload(gpu, format, rows, cols, &w.bytes).unwrap();
            let got = gpu_product(gpu, &kernel, &on_gpu, &x);
            let (want, scale) = exact_product(&w.decoded, cols, &x);
            let what = format!("{format:?} {rows}x{cols}, {tokens} tokens");
            check(&format!("{what} vs f64"), &got, &want, &scale, EXACT_TOLERANCE);
            let cpu: Vec<f64> =
                cpu_product(format, &w, rows, cols, &x).iter().map(|&v| v as f64).collect();
            check(&format!("{what} vs CPU"), &got, &cpu, &scale, CPU_TOLERANCE);
        }
    }
}

#[test]
fn a_token_gets_the_same_bits_alone_and_among_up_to_16_others() {
    let Some(gpu) = gpu_or_skip() else { return };
    let mut rng = rng(7);
    for format in WeightFormat::ALL {
        let kernel = Matmul::new(gpu, format).unwrap();
        let (rows, cols) = (24, 3 * 256);
        let w = weight(format, &uniform(&mut rng, rows * cols), rows, cols);
        let w = GpuMatrix::upload(gpu, format, rows, cols, &w.bytes).unwrap();
        let target = uniform(&mut rng, cols);
        let alone = gpu_product(gpu, &kernel, &w, &target);
        for others in 1..=16 {
            let slot = (others * 5) % (others + 1); // the target's row among the others
            let mut x = uniform(&mut rng, (others + 1) * cols);
            x[slot * cols..(slot + 1) * cols].copy_from_slice(&target);
            let batched = gpu_product(gpu, &kernel, &w, &x);
            let what = format!("{format:?}: row {slot} of {}", others + 1);
            same_bits(&what, &alone, &batched[slot * rows..(slot + 1) * rows]);
        }
    }
}

#[test]
fn mismatched_inputs_are_errors_not_panics() {
    let Some(gpu) = gpu_or_skip() else { return };
    // 33 columns are no whole Q8_0 block; 2 rows need 68 bytes, not 67.
    assert!(GpuMatrix::upload(gpu, WeightFormat::Q8_0, 2, 33, &[0; 70]).is_err());
    assert!(GpuMatrix::upload(gpu, WeightFormat::Q8_0, 2, 32, &[0; 67]).is_err());
    let w = GpuMatrix::upload(gpu, WeightFormat::Q8_0, 2, 32, &[0; 68]).unwrap();
    let x = gpu.upload(&[1.0; 48]).unwrap(); // 1.5 rows
    let kernel = Matmul::new(gpu, WeightFormat::Q8_0).unwrap();
    assert!(gpu.run(|step| kernel.forward(step, &w, &x)).is_err());
    let q4 = Matmul::new(gpu, WeightFormat::Q4_0).unwrap();
    let x = gpu.upload(&[1.0; 32]).unwrap();
    assert!(gpu.run(|step| q4.forward(step, &w, &x)).is_err());
    // Token ids past the embedding table's rows.
    let embed = Embed::new(gpu, WeightFormat::Q8_0).unwrap();
    assert!(gpu.run(|step| embed.forward(step, &w, &[1])).is_ok());
    assert!(gpu.run(|step| embed.forward(step, &w, &[2])).is_err());
}

#[test]
fn a_matrix_in_parts_gives_the_same_bits_as_in_one() {
    let Some(gpu) = gpu_or_skip() else { return };
    let mut rng = rng(128);
    for format in WeightFormat::ALL {
        let kernel = Matmul::new(gpu, format).unwrap();
        let (rows, cols, tokens) = (45, 2 * 256, 11);
        let w = weight(format, &uniform(&mut rng, rows * cols), rows, cols);
        let x = uniform(&mut rng, tokens * cols);
        let whole = GpuMatrix::upload(gpu, format, rows, cols, &w.bytes).unwrap();
        assert_eq!(whole.parts(), 1);
        let want = gpu_product(gpu, &kernel, &whole, &x);
        // 7 rows a part: 7 parts, the last of 3 rows.
        let part_bytes = (7 * format.row_bytes(cols).unwrap()).next_multiple_of(4) as u64;
        let split =
            GpuMatrix::upload_in_parts(gpu, format, rows, cols, &w.bytes, part_bytes).unwrap();
        assert_eq!(split.parts(), 7, "{format:?}");
        same_bits(&format!("{format:?} in 7 parts"), &want, &gpu_product(gpu, &kernel, &split, &x));
    }
    // A part smaller than one row is refused, not a panic.
    let w = weight(WeightFormat::Q8_0, &uniform(&mut rng, 64), 2, 32);
    assert!(GpuMatrix::upload_in_parts(gpu, WeightFormat::Q8_0, 2, 32, &w.bytes, 32).is_err());
}

#[test]
fn embedding_rows_of_every_format_are_the_decoded_rows() {
    let Some(gpu) = gpu_or_skip() else { return };
    let mut rng = rng(76);
    for format in WeightFormat::ALL {
        let (rows, cols) = (9, 2 * 256);
        let w = weight(format, &uniform(&mut rng, rows * cols), rows, cols);
        let table = GpuMatrix::upload(gpu, format, rows, cols, &w.bytes).unwrap();
        let embed = Embed::new(gpu, format).unwrap();
        let ids = [4, 0, 8, 4];
        let got = computed(gpu, |step| embed.forward(step, &table, &ids));
        let want: Vec<f32> =
            ids.iter().flat_map(|&id| &w.decoded[id as usize * cols..][..cols]).copied().collect();
        // Decoding is a multiply-add per value of at most 1 (absolute error: a value whose two
        // terms cancel has no relative one).
        let want: Vec<f64> = want.iter().map(|&v| v as f64).collect();
        check(&format!("{format:?} embedding rows"), &got, &want, &vec![1.0; want.len()], 1e-6);
    }
}

/// A routed MoE's product: each token times the matrix of the expert it chose, out of a stack
/// of experts held in parts that cut through experts, has the bits of the plain product with
/// that expert's own matrix.
#[test]
fn a_gathered_product_gives_each_token_its_experts_plain_bits() {
    let Some(gpu) = gpu_or_skip() else { return };
    let mut rng = rng(64);
    let (experts, expert_rows, tokens, top_k) = (3, 5, 6, 2);
    let rows = experts * expert_rows;
    // Each token's experts, u32 values in a tensor's buffer.
    let ids: Vec<u32> = (0..tokens * top_k).map(|i| ((i * 7 + i / 3) % experts) as u32).collect();
    let on_gpu_ids =
        gpu.upload(&ids.iter().map(|&e| f32::from_bits(e)).collect::<Vec<_>>()).unwrap();
    for format in WeightFormat::ALL {
        let plain = Matmul::new(gpu, format).unwrap();
        let gathered = GatheredMatmul::new(gpu, format).unwrap();
        let cols = 2 * block_values(format).max(32);
        let w = weight(format, &uniform(&mut rng, rows * cols), rows, cols);
        let row_bytes = format.row_bytes(cols).unwrap();
        // 4 rows a part: parts end inside experts.
        let part_bytes = (4 * row_bytes).next_multiple_of(4) as u64;
        let stack =
            GpuMatrix::upload_in_parts(gpu, format, rows, cols, &w.bytes, part_bytes).unwrap();
        assert_eq!(stack.parts(), 4, "{format:?}");
        let x = uniform(&mut rng, tokens * cols);
        let on_gpu_x = gpu.upload(&x).unwrap();
        for slot in 0..top_k {
            let got = computed(gpu, |step| {
                gathered.forward(step, &stack, expert_rows, &on_gpu_x, &on_gpu_ids, (top_k, slot))
            });
            for t in 0..tokens {
                let e = ids[t * top_k + slot] as usize;
                let bytes = &w.bytes[e * expert_rows * row_bytes..][..expert_rows * row_bytes];
                let own = GpuMatrix::upload(gpu, format, expert_rows, cols, bytes).unwrap();
                let want = gpu_product(gpu, &plain, &own, &x[t * cols..(t + 1) * cols]);
                let what = format!("{format:?}: token {t}, slot {slot} (expert {e})");
                same_bits(&what, &want, &got[t * expert_rows..(t + 1) * expert_rows]);
            }
        }
        // A slot past the routing's, or experts that do not divide the stack, are refused.
        let refused = |rows, slot| {
            let args = (top_k, slot);
            gpu.run(|step| gathered.forward(step, &stack, rows, &on_gpu_x, &on_gpu_ids, args))
                .is_err()
        };
        assert!(refused(expert_rows, top_k) && refused(4, 0), "{format:?}");
    }
}

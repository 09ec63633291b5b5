//! Matrix products against float weights, one output at a time: each output is a dot product
//! reduced in the same fixed order however many rows `x` has, so a sequence's results do not
//! depend on what else shares its batch. (A GEMM picks its blocking, and so its rounding, from
//! the matrix sizes.) Float weights serve the reference paths, safetensors checkpoints and small
//! matrices such as MoE routers; quantized weights take the quantized kernels.

use candle_core::{CpuStorage, DType, Device, Storage, Tensor};
use rayon::prelude::*;

use crate::error::Result;
use crate::isa::Isa;

/// Independent partial sums per dot product: enough for the compiler to vectorize the loop
/// into independent chains of additions on every instruction set.
const LANES: usize = 64;

/// A float matrix of `rows` outputs × `cols` inputs, kept as f32.
pub struct DenseMatrix {
    rows: usize,
    cols: usize,
    data: Vec<f32>,
}

impl DenseMatrix {
    pub fn new(weight: &Tensor) -> Result<Self> {
        let (rows, cols) = weight.dims2()?;
        let data = weight.to_dtype(DType::F32)?.flatten_all()?.to_vec1()?;
        Ok(Self { rows, cols, data })
    }

    /// x: (tokens, cols) → (tokens, rows)
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        check_cols(x, self.rows, self.cols, "dense matmul")?;
        with_values(x, |x| {
            let x_rows: Vec<&[f32]> = x.chunks_exact(self.cols).collect();
            each_output(self.data.par_chunks(self.cols), &x_rows, self.rows, |w, x| dot(w, x))
        })
    }
}

/// Runs `f` on `x`'s values as f32, row after row: read in place where `x` is a contiguous f32
/// tensor on the CPU (as the activations a product receives are), copied otherwise. A copy per
/// product was a tenth of a prefill step's allocations and memory traffic.
pub(crate) fn with_values<R>(x: &Tensor, f: impl FnOnce(&[f32]) -> Result<R>) -> Result<R> {
    {
        let (storage, layout) = x.storage_and_layout();
        if let (Storage::Cpu(CpuStorage::F32(values)), Some((start, end))) =
            (&*storage, layout.contiguous_offsets())
        {
            return f(&values[start..end]);
        }
    }
    let values: Vec<f32> = x.to_dtype(DType::F32)?.flatten_all()?.to_vec1()?;
    f(&values)
}

/// Fails unless `x` is (tokens, `cols`) for a `rows × cols` matrix.
pub(crate) fn check_cols(x: &Tensor, rows: usize, cols: usize, op: &'static str) -> Result<()> {
    if x.dims2()?.1 != cols {
        return Err(candle_core::Error::ShapeMismatchBinaryOp {
            lhs: x.shape().clone(),
            rhs: (rows, cols).into(),
            op,
        }
        .into());
    }
    Ok(())
}

/// The (tokens, rows) product whose output `(t, r)` is `dot(weight row r, x row t)`: weight rows
/// run in parallel, each over every row of `x` in turn, so no output depends on the row count.
pub(crate) fn each_output<W, X>(
    weight_rows: W,
    x_rows: &[X],
    rows: usize,
    dot: impl Fn(W::Item, &X) -> f32 + Sync,
) -> Result<Tensor>
where
    W: IndexedParallelIterator,
    W::Item: Copy,
    X: Sync,
{
    each_row(weight_rows, x_rows.len(), rows, |w, out| {
        for (o, x) in out.iter_mut().zip(x_rows) {
            *o = dot(w, x);
        }
    })
}

/// The (tokens, rows) product where `outputs(weight row r, out)` fills `out[t]` with output
/// `(t, r)` for every token: weight rows run in parallel, one task each.
pub(crate) fn each_row<W>(
    weight_rows: W,
    tokens: usize,
    rows: usize,
    outputs: impl Fn(W::Item, &mut [f32]) + Sync,
) -> Result<Tensor>
where
    W: IndexedParallelIterator,
{
    // (rows, tokens) while computing, so each task owns one weight row's outputs.
    let mut out_t = vec![0f32; rows * tokens];
    out_t.par_chunks_mut(tokens.max(1)).zip(weight_rows).for_each(|(out, w)| outputs(w, out));
    Ok(Tensor::from_vec(transposed(out_t, rows, tokens), (tokens, rows), &Device::Cpu)?)
}

/// `(rows, tokens)` values as `(tokens, rows)`. A decode step's single token needs no move; a
/// prompt's go in blocks of rows, so that reads and writes both stay in cache (a strided tensor
/// copy walked an index per element: a twentieth of a tiny model's step, at a 151,936-row head).
fn transposed(values: Vec<f32>, rows: usize, tokens: usize) -> Vec<f32> {
    const BLOCK_ROWS: usize = 64;
    if tokens <= 1 {
        return values;
    }
    let mut out = vec![0f32; values.len()];
    for first in (0..rows).step_by(BLOCK_ROWS) {
        let block = first..(first + BLOCK_ROWS).min(rows);
        for t in 0..tokens {
            for r in block.clone() {
                out[t * rows + r] = values[r * tokens + t];
            }
        }
    }
    out
}

/// A `(tokens, rows)` output buffer that parallel tasks fill in disjoint parts.
pub(crate) struct SharedOutput(*mut f32, usize);

// SAFETY: tasks write disjoint elements (the promise of `write`), within the buffer's lifetime.
unsafe impl Sync for SharedOutput {}

impl SharedOutput {
    pub(crate) fn new(out: &mut [f32]) -> Self {
        Self(out.as_mut_ptr(), out.len())
    }

    /// Copies `values` to elements `at..`.
    ///
    /// # Safety
    /// No other task writes these elements, and the buffer outlives every write.
    pub(crate) unsafe fn write(&self, at: usize, values: &[f32]) {
        assert!(at + values.len() <= self.1, "output write out of bounds");
        // SAFETY: in bounds (checked), exclusive by the caller's promise.
        unsafe { std::ptr::copy_nonoverlapping(values.as_ptr(), self.0.add(at), values.len()) };
    }
}

/// `a · b` with `LANES` running sums: lane `i` takes elements `i, i + LANES, ...`, the tail
/// included, and the lanes are added up in halves (lane `i` plus lane `i + LANES / 2`, and so on
/// down to one). Every copy runs this same arithmetic, a multiply and an add each (never
/// fused), so all give the same bits; the wider copies only hold more lanes per register (64
/// lanes are 4 AVX-512 or 8 AVX2 chains of additions, where 16 lanes in the compiler's SSE2
/// baseline were 4 chains, each waiting on its adds). No step is a long serial chain: a
/// tiny model's 32-wide rows are all tail.
fn dot(a: &[f32], b: &[f32]) -> f32 {
    match Isa::best() {
        // SAFETY: `Isa::best` found the features each copy is compiled for.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => unsafe { dot_avx512(a, b) },
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => unsafe { dot_avx2(a, b) },
        _ => dot_lanes(a, b),
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn dot_avx512(a: &[f32], b: &[f32]) -> f32 {
    dot_lanes(a, b)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn dot_avx2(a: &[f32], b: &[f32]) -> f32 {
    dot_lanes(a, b)
}

#[inline(always)]
fn dot_lanes(a: &[f32], b: &[f32]) -> f32 {
    let mut lanes = [0f32; LANES];
    let body = a.len() - a.len() % LANES;
    for (xa, xb) in a[..body].chunks_exact(LANES).zip(b[..body].chunks_exact(LANES)) {
        for i in 0..LANES {
            lanes[i] += xa[i] * xb[i];
        }
    }
    for (lane, (x, y)) in lanes.iter_mut().zip(a[body..].iter().zip(&b[body..])) {
        *lane += x * y;
    }
    let mut half = LANES / 2;
    while half > 0 {
        for i in 0..half {
            lanes[i] += lanes[i + half];
        }
        half /= 2;
    }
    lanes[0]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_a_plain_product_and_ignores_the_row_count() {
        let (rows, cols) = (5, 37);
        let w: Vec<f32> = (0..rows * cols).map(|i| ((i * 7 % 13) as f32 - 6.0) / 8.0).collect();
        let x: Vec<f32> = (0..4 * cols).map(|i| ((i * 5 % 11) as f32 - 5.0) / 4.0).collect();
        let matrix =
            DenseMatrix::new(&Tensor::from_vec(w.clone(), (rows, cols), &Device::Cpu).unwrap())
                .unwrap();
        let all =
            matrix.forward(&Tensor::from_vec(x.clone(), (4, cols), &Device::Cpu).unwrap()).unwrap();
        let all: Vec<Vec<f32>> = all.to_vec2().unwrap();
        for (t, row) in x.chunks(cols).enumerate() {
            // Exact small values: every order of summation gives the same result.
            let expected: Vec<f32> =
                w.chunks(cols).map(|wr| wr.iter().zip(row).map(|(a, b)| a * b).sum()).collect();
            assert_eq!(all[t], expected);
            let alone = matrix
                .forward(&Tensor::from_vec(row.to_vec(), (1, cols), &Device::Cpu).unwrap())
                .unwrap();
            assert_eq!(alone.to_vec2::<f32>().unwrap()[0], all[t], "row {t} alone");
        }
    }

    #[test]
    fn every_instruction_set_gives_the_same_bits() {
        // Inexact values and a ragged tail: the order of the additions shows in the bits.
        let a: Vec<f32> = (0..1000).map(|i| ((i * 37 % 101) as f32 - 50.3) / 7.1).collect();
        let b: Vec<f32> = (0..1000).map(|i| ((i * 53 % 97) as f32 - 48.7) / 3.3).collect();
        for len in [0, 1, 63, 64, 65, 576, 1000] {
            let (a, b) = (&a[..len], &b[..len]);
            let want = dot_lanes(a, b).to_bits();
            for isa in Isa::available() {
                let got = match isa {
                    // SAFETY: `available` lists only copies this CPU runs.
                    #[cfg(target_arch = "x86_64")]
                    Isa::Avx512 => unsafe { dot_avx512(a, b) },
                    #[cfg(target_arch = "x86_64")]
                    Isa::Avx2 => unsafe { dot_avx2(a, b) },
                    _ => dot_lanes(a, b),
                };
                assert_eq!(got.to_bits(), want, "{isa:?}, length {len}");
            }
        }
    }

    #[test]
    fn transposing_moves_every_value_once() {
        let (rows, tokens) = (130, 3);
        let values: Vec<f32> = (0..rows * tokens).map(|i| i as f32).collect();
        let out = transposed(values.clone(), rows, tokens);
        for r in 0..rows {
            for t in 0..tokens {
                assert_eq!(out[t * rows + r], values[r * tokens + t], "row {r}, token {t}");
            }
        }
        assert_eq!(transposed(values.clone(), rows * tokens, 1), values);
    }
}

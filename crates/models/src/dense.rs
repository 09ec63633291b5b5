//! Matrix products against float weights, one output at a time: each output is a dot product
//! reduced in the same fixed order however many rows `x` has, so a sequence's results do not
//! depend on what else shares its batch. (A GEMM picks its blocking, and so its rounding, from
//! the matrix sizes.) Float weights serve the reference paths, safetensors checkpoints and small
//! matrices such as MoE routers; quantized weights take the quantized kernels.

use candle_core::{CpuStorage, DType, Device, Storage, Tensor};
use rayon::prelude::*;

use crate::error::Result;

/// Independent partial sums per dot product: enough for the compiler to vectorize the loop.
const LANES: usize = 16;

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

/// `a · b` with `LANES` running sums (lane `i` takes elements `i, i + LANES, ...`), added up
/// in lane order at the end, then the tail in order.
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut lanes = [0f32; LANES];
    let (a_body, a_tail) = a.split_at(a.len() - a.len() % LANES);
    let (b_body, b_tail) = b.split_at(a_body.len());
    for (xa, xb) in a_body.chunks_exact(LANES).zip(b_body.chunks_exact(LANES)) {
        for i in 0..LANES {
            lanes[i] += xa[i] * xb[i];
        }
    }
    let mut sum = lanes.iter().sum::<f32>();
    for (x, y) in a_tail.iter().zip(b_tail) {
        sum += x * y;
    }
    sum
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

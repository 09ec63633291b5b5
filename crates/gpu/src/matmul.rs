//! Products of a weight matrix kept in its file format (GGUF blocks, f16, bf16) with rows of
//! f32 activations: `y = x · Wᵀ`, one kernel for a decode step's single row and a prefill
//! chunk's many (see `shaders/matmul.wgsl` for the fixed reduction order).

use crate::buffer::{GpuBytes, GpuTensor};
use crate::device::Gpu;
use crate::error::{GpuError, Result};
use crate::kernel::{count, Kernel};

const COMMON: &str = include_str!("shaders/matmul.wgsl");
/// Tokens one workgroup serves (`TOKENS` in the shader).
const TOKENS_PER_GROUP: usize = 8;

/// How a weight matrix's values are stored, as in GGUF.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WeightFormat {
    F32,
    F16,
    Bf16,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
    Q4K,
    Q6K,
}

impl WeightFormat {
    pub const ALL: [WeightFormat; 10] = [
        Self::F32,
        Self::F16,
        Self::Bf16,
        Self::Q4_0,
        Self::Q4_1,
        Self::Q5_0,
        Self::Q5_1,
        Self::Q8_0,
        Self::Q4K,
        Self::Q6K,
    ];

    /// Values per block and bytes per block.
    fn block(self) -> (usize, usize) {
        match self {
            Self::F32 => (1, 4),
            Self::F16 | Self::Bf16 => (1, 2),
            Self::Q4_0 => (32, 18),
            Self::Q4_1 => (32, 20),
            Self::Q5_0 => (32, 22),
            Self::Q5_1 => (32, 24),
            Self::Q8_0 => (32, 34),
            Self::Q4K => (256, 144),
            Self::Q6K => (256, 210),
        }
    }

    /// Bytes of one row of `cols` values, or an error when `cols` is no whole number of blocks.
    pub fn row_bytes(self, cols: usize) -> Result<usize> {
        let (values, bytes) = self.block();
        if cols == 0 || !cols.is_multiple_of(values) {
            return Err(GpuError::BadInput(format!(
                "{self:?} rows hold whole blocks of {values} values; {cols} columns do not"
            )));
        }
        Ok(cols / values * bytes)
    }

    fn shader(self) -> &'static str {
        match self {
            Self::F32 => include_str!("shaders/f32.wgsl"),
            Self::F16 => include_str!("shaders/f16.wgsl"),
            Self::Bf16 => include_str!("shaders/bf16.wgsl"),
            Self::Q4_0 => include_str!("shaders/q4_0.wgsl"),
            Self::Q4_1 => include_str!("shaders/q4_1.wgsl"),
            Self::Q5_0 => include_str!("shaders/q5_0.wgsl"),
            Self::Q5_1 => include_str!("shaders/q5_1.wgsl"),
            Self::Q8_0 => include_str!("shaders/q8_0.wgsl"),
            Self::Q4K => include_str!("shaders/q4_k.wgsl"),
            Self::Q6K => include_str!("shaders/q6_k.wgsl"),
        }
    }
}

/// A `rows × cols` weight matrix on the device, in its file layout.
pub struct GpuMatrix {
    format: WeightFormat,
    rows: usize,
    cols: usize,
    data: GpuBytes,
}

impl GpuMatrix {
    /// Uploads `bytes`, which must be exactly `rows` rows of `cols` values in `format`.
    pub fn upload(
        gpu: &Gpu,
        format: WeightFormat,
        rows: usize,
        cols: usize,
        bytes: &[u8],
    ) -> Result<Self> {
        let expected = rows * format.row_bytes(cols)?;
        if rows == 0 || bytes.len() != expected {
            return Err(GpuError::BadInput(format!(
                "a {rows} × {cols} {format:?} matrix takes {expected} bytes, not {}",
                bytes.len()
            )));
        }
        let data = gpu.upload_bytes(bytes, &format!("{format:?} weight"))?;
        Ok(GpuMatrix { format, rows, cols, data })
    }

    pub fn rows(&self) -> usize {
        self.rows
    }

    pub fn cols(&self) -> usize {
        self.cols
    }

    pub fn format(&self) -> WeightFormat {
        self.format
    }
}

/// The product kernel of one weight format.
pub struct Matmul {
    format: WeightFormat,
    kernel: Kernel,
}

impl Matmul {
    pub fn new(gpu: &Gpu, format: WeightFormat) -> Result<Self> {
        let source = format!("{COMMON}\n{}", format.shader());
        Ok(Matmul { format, kernel: Kernel::new(gpu, "matmul", &source)? })
    }

    /// `x`: (tokens, cols) → (tokens, rows).
    pub fn forward(&self, gpu: &Gpu, w: &GpuMatrix, x: &GpuTensor) -> Result<GpuTensor> {
        if w.format != self.format {
            return Err(GpuError::BadInput(format!(
                "a {:?} kernel was given a {:?} matrix",
                self.format, w.format
            )));
        }
        if x.is_empty() || !x.len().is_multiple_of(w.cols) {
            return Err(GpuError::BadInput(format!(
                "{} activations are no whole number of rows of {}",
                x.len(),
                w.cols
            )));
        }
        let tokens = x.len() / w.cols;
        let y = gpu.zeros(tokens * w.rows)?;
        let params = [
            count(w.rows, "rows")?,
            count(w.cols, "columns")?,
            count(tokens, "tokens")?,
            count(w.format.row_bytes(w.cols)?, "row bytes")?,
        ];
        let groups =
            (count(w.rows, "rows")?, count(tokens.div_ceil(TOKENS_PER_GROUP), "token groups")?);
        self.kernel.run(gpu, &[&w.data.buffer, &x.buffer, &y.buffer], &params, groups)?;
        Ok(y)
    }
}

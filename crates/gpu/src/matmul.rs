//! Products of a weight matrix kept in its file format (GGUF blocks, f16, bf16) with rows of
//! f32 activations: `y = x · Wᵀ`, one kernel for a decode step's single row and a prefill
//! chunk's many (see `shaders/matmul.wgsl` for the fixed reduction order); and the embedding
//! rows of token ids out of such a matrix.

use crate::buffer::{GpuBytes, GpuTensor};
use crate::device::Gpu;
use crate::error::{GpuError, Result};
use crate::kernel::{count, Kernel};
use crate::step::Step;

const BLOCKS: &str = include_str!("shaders/blocks.wgsl");
/// Appended to the product kernels: how a unit multiplies their activations.
const UNIT_DOT: &str = include_str!("shaders/unit_dot.wgsl");
/// Tokens one workgroup serves (`TOKENS` in the shader).
const TOKENS_PER_GROUP: usize = 8;
/// Weight rows one workgroup serves (`ROWS` in the shader).
const ROWS_PER_GROUP: usize = 8;

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
    Q2K,
    Q3K,
    Q4K,
    Q5K,
    Q6K,
}

impl WeightFormat {
    pub const ALL: [WeightFormat; 13] = [
        Self::F32,
        Self::F16,
        Self::Bf16,
        Self::Q4_0,
        Self::Q4_1,
        Self::Q5_0,
        Self::Q5_1,
        Self::Q8_0,
        Self::Q2K,
        Self::Q3K,
        Self::Q4K,
        Self::Q5K,
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
            Self::Q2K => (256, 84),
            Self::Q3K => (256, 110),
            Self::Q4K => (256, 144),
            Self::Q5K => (256, 176),
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

    /// `kernel` (a `main` over `weights` and its own bindings) with this format's decoding.
    fn source(self, kernel: &str) -> String {
        format!("{kernel}\n{BLOCKS}\n{}", self.shader())
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
            Self::Q2K => include_str!("shaders/q2_k.wgsl"),
            Self::Q3K => include_str!("shaders/q3_k.wgsl"),
            Self::Q4K => include_str!("shaders/q4_k.wgsl"),
            Self::Q5K => include_str!("shaders/q5_k.wgsl"),
            Self::Q6K => include_str!("shaders/q6_k.wgsl"),
        }
    }
}

/// A `rows × cols` weight matrix on the device, in its file layout: in row ranges of at most
/// one storage binding each (lavapipe allows 128 MiB; an embedding table can be more).
pub struct GpuMatrix {
    format: WeightFormat,
    rows: usize,
    cols: usize,
    parts: Vec<MatrixPart>,
}

/// Rows `first_row..first_row + rows` of a matrix, in one buffer.
struct MatrixPart {
    first_row: usize,
    rows: usize,
    data: GpuBytes,
}

impl GpuMatrix {
    /// Fails unless this is a matrix the `format` kernel reads.
    fn check_format(&self, format: WeightFormat) -> Result<()> {
        if self.format != format {
            return Err(GpuError::BadInput(format!(
                "a {format:?} kernel was given a {:?} matrix",
                self.format
            )));
        }
        Ok(())
    }
}

impl GpuMatrix {
    /// Uploads `bytes`, which must be exactly `rows` rows of `cols` values in `format`, in as
    /// few parts as the device's binding limit allows.
    pub fn upload(
        gpu: &Gpu,
        format: WeightFormat,
        rows: usize,
        cols: usize,
        bytes: &[u8],
    ) -> Result<Self> {
        Self::upload_in_parts(gpu, format, rows, cols, bytes, gpu.max_binding_bytes())
    }

    /// [`upload`](Self::upload) with parts of at most `part_bytes` (whole rows each): the
    /// device's limit, or less to test the split.
    pub fn upload_in_parts(
        gpu: &Gpu,
        format: WeightFormat,
        rows: usize,
        cols: usize,
        bytes: &[u8],
        part_bytes: u64,
    ) -> Result<Self> {
        let row_bytes = format.row_bytes(cols)?;
        let expected = rows * row_bytes;
        if rows == 0 || bytes.len() != expected {
            return Err(GpuError::BadInput(format!(
                "a {rows} × {cols} {format:?} matrix takes {expected} bytes, not {}",
                bytes.len()
            )));
        }
        let rows_per_part = usize::try_from(part_bytes / row_bytes as u64).unwrap_or(usize::MAX);
        if rows_per_part == 0 {
            return Err(GpuError::TooLarge {
                what: format!("one row of a {format:?} matrix"),
                bytes: row_bytes as u64,
                limit: part_bytes,
            });
        }
        let what = format!("{format:?} weight");
        let parts = bytes
            .chunks(rows_per_part * row_bytes)
            .enumerate()
            .map(|(i, chunk)| {
                Ok(MatrixPart {
                    first_row: i * rows_per_part,
                    rows: chunk.len() / row_bytes,
                    data: gpu.upload_bytes(chunk, &what)?,
                })
            })
            .collect::<Result<_>>()?;
        Ok(GpuMatrix { format, rows, cols, parts })
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

    /// Buffers the matrix is held in.
    pub fn parts(&self) -> usize {
        self.parts.len()
    }
}

/// The product kernel of one weight format.
pub struct Matmul {
    format: WeightFormat,
    kernel: Kernel,
}

impl Matmul {
    pub fn new(gpu: &Gpu, format: WeightFormat) -> Result<Self> {
        let source = format.source(&[include_str!("shaders/matmul.wgsl"), UNIT_DOT].concat());
        Ok(Matmul { format, kernel: Kernel::new(gpu, "matmul", &source)? })
    }

    pub fn format(&self) -> WeightFormat {
        self.format
    }

    /// `x`: (tokens, cols) → (tokens, rows).
    pub fn forward(&self, step: &mut Step<'_>, w: &GpuMatrix, x: &GpuTensor) -> Result<GpuTensor> {
        w.check_format(self.format)?;
        if x.is_empty() || !x.len().is_multiple_of(w.cols) {
            return Err(GpuError::BadInput(format!(
                "{} activations are no whole number of rows of {}",
                x.len(),
                w.cols
            )));
        }
        let tokens = x.len() / w.cols;
        let y = step.gpu.output(tokens * w.rows);
        let token_groups = count(tokens.div_ceil(TOKENS_PER_GROUP), "token groups")?;
        // Each part writes its own rows of every output row; a row's sum is the same either way.
        for part in &w.parts {
            let params = [
                count(part.rows, "rows")?,
                count(w.cols, "columns")?,
                count(tokens, "tokens")?,
                count(w.format.row_bytes(w.cols)?, "row bytes")?,
                count(part.first_row, "first row")?,
                count(w.rows, "rows")?,
            ];
            let buffers = [&part.data.buffer, &x.buffer, &y.buffer];
            let row_groups = count(part.rows.div_ceil(ROWS_PER_GROUP), "row groups")?;
            self.kernel.record(step, &buffers, &params, (row_groups, token_groups));
        }
        Ok(y)
    }
}

/// The rows of an embedding table that token ids name, decoded to f32.
pub struct Embed {
    format: WeightFormat,
    kernel: Kernel,
}

impl Embed {
    pub fn new(gpu: &Gpu, format: WeightFormat) -> Result<Self> {
        let source = format.source(include_str!("shaders/embed.wgsl"));
        Ok(Embed { format, kernel: Kernel::new(gpu, "embed", &source)? })
    }

    /// `ids` → (ids, cols): row `id` of `table` for each.
    pub fn forward(
        &self,
        step: &mut Step<'_>,
        table: &GpuMatrix,
        ids: &[u32],
    ) -> Result<GpuTensor> {
        table.check_format(self.format)?;
        if let Some(&id) = ids.iter().find(|&&id| id as usize >= table.rows) {
            return Err(GpuError::BadInput(format!(
                "token id {id} is past the table's {} rows",
                table.rows
            )));
        }
        let out = step.gpu.output(ids.len() * table.cols);
        let on_device = step.gpu.upload_indices(ids, "token ids")?;
        let tokens = count(ids.len(), "tokens")?;
        for part in &table.parts {
            let params = [
                count(part.rows, "rows")?,
                count(table.cols, "columns")?,
                tokens,
                count(table.format.row_bytes(table.cols)?, "row bytes")?,
                count(part.first_row, "first row")?,
            ];
            let buffers = [&part.data.buffer, &on_device.buffer, &out.buffer];
            self.kernel.record(step, &buffers, &params, (tokens, 1));
        }
        Ok(out)
    }
}

/// The product of each token with the expert it chose in one routing slot, out of a stack of
/// experts' matrices (`experts × expert_rows` rows): a routed MoE runs only the chosen experts
/// (`shaders/matmul_gathered.wgsl`, in the plain product's order).
pub struct GatheredMatmul {
    format: WeightFormat,
    kernel: Kernel,
}

impl GatheredMatmul {
    pub fn new(gpu: &Gpu, format: WeightFormat) -> Result<Self> {
        let source =
            format.source(&[include_str!("shaders/matmul_gathered.wgsl"), UNIT_DOT].concat());
        Ok(GatheredMatmul { format, kernel: Kernel::new(gpu, "matmul_gathered", &source)? })
    }

    pub fn format(&self) -> WeightFormat {
        self.format
    }

    /// `x` (tokens, cols) → (tokens, expert_rows): token `t` times the matrix of expert
    /// `ids[t · top_k + slot]` (`ids`: u32 values, tokens × top_k, in a tensor's buffer).
    pub fn forward(
        &self,
        step: &mut Step<'_>,
        stack: &GpuMatrix,
        expert_rows: usize,
        x: &GpuTensor,
        ids: &GpuTensor,
        (top_k, slot): (usize, usize),
    ) -> Result<GpuTensor> {
        stack.check_format(self.format)?;
        let tokens = x.len() / stack.cols;
        if x.is_empty()
            || x.len() != tokens * stack.cols
            || expert_rows == 0
            || !stack.rows.is_multiple_of(expert_rows)
            || slot >= top_k
            || ids.len() != tokens * top_k
        {
            return Err(GpuError::BadInput(format!(
                "{} activations of rows of {}, experts of {expert_rows} of a stack's {} rows, \
                 slot {slot} of {top_k} in {} ids",
                x.len(),
                stack.cols,
                stack.rows,
                ids.len()
            )));
        }
        let y = step.gpu.output(tokens * expert_rows);
        let row_groups = count(expert_rows.div_ceil(ROWS_PER_GROUP), "row groups")?;
        // A workgroup per token along z, where adapters allow 65,535.
        let tokens_z = u32::try_from(tokens).ok().filter(|&t| t <= 65_535).ok_or_else(|| {
            GpuError::BadInput(format!("{tokens} tokens in one gathered product (at most 65,535)"))
        })?;
        for part in &stack.parts {
            let params = [
                count(part.rows, "rows")?,
                count(stack.cols, "columns")?,
                tokens_z,
                count(stack.format.row_bytes(stack.cols)?, "row bytes")?,
                count(part.first_row, "first row")?,
                count(expert_rows, "expert rows")?,
                count(top_k, "top k")?,
                count(slot, "slot")?,
            ];
            let buffers = [&part.data.buffer, &x.buffer, &ids.buffer, &y.buffer];
            self.kernel.record(step, &buffers, &params, (row_groups, tokens_z));
        }
        Ok(y)
    }
}

//! Linear layers and embedding tables over quantized or dense weights: each matrix runs on the
//! kernel its storage type is fastest with (ours for block and K-quants, candle's otherwise).

use std::sync::Arc;

use candle_core::quantized::GgmlDType;
use candle_core::{Device, Tensor};

use crate::block_quants::{BlockFormat, BlockMatrix};
use crate::dense::DenseMatrix;
use crate::error::Result;
use crate::k_quants;
use crate::q4_k::Q4KMatrix;
use crate::q6_k::Q6KMatrix;
use crate::quantized::QuantizedMatrix;
use crate::weight::Weight;

/// `y = x Wᵀ + b`, with `W` kept in its stored quantization.
pub struct Linear {
    weight: LinearWeight,
    bias: Option<Tensor>,
}

enum LinearWeight {
    Candle(QuantizedMatrix),
    /// Q4_0, Q4_1, Q5_0, Q5_1 and Q8_0 in 16-row tiles (candle's kernels for these are
    /// scalar or slower); shared with a tied embedding table.
    Block(Arc<BlockMatrix>),
    /// Ours on CPUs with AVX-512 VNNI (~1.27× candle's kernel per core) or AVX2.
    Q4K(Q4KMatrix),
    /// Ours on CPUs with AVX-512 VNNI or AVX2 (candle's ran at about half our Q4_K's speed per
    /// byte).
    Q6K(Q6KMatrix),
    /// Float weights, with a reduction order that does not depend on the row count.
    Dense(DenseMatrix),
}

impl Linear {
    pub fn new(weight: Weight, bias: Option<Tensor>) -> Result<Self> {
        let weight = match weight {
            Weight::Quantized(q) => {
                let (rows, cols) = q.shape().dims2()?;
                match q.dtype() {
                    dtype if let Some(format) = BlockFormat::of(dtype) => LinearWeight::Block(
                        Arc::new(BlockMatrix::new(format, rows, cols, &q.data()?)?),
                    ),
                    GgmlDType::Q4K if k_quants::supported() && k_quants::fits(rows, cols) => {
                        LinearWeight::Q4K(Q4KMatrix::new(rows, cols, &q.data()?)?)
                    }
                    GgmlDType::Q6K if k_quants::supported() && k_quants::fits(rows, cols) => {
                        LinearWeight::Q6K(Q6KMatrix::new(rows, cols, &q.data()?)?)
                    }
                    _ => {
                        LinearWeight::Candle(QuantizedMatrix::new(q, rayon::current_num_threads())?)
                    }
                }
            }
            Weight::Dense(t) => LinearWeight::Dense(DenseMatrix::new(&t)?),
        };
        Ok(Self { weight, bias })
    }

    /// A projection without bias over block-quantized tiles (an output head tied to the
    /// embedding table, which reads the same tiles).
    pub fn from_tiles(tiles: Arc<BlockMatrix>) -> Self {
        Self { weight: LinearWeight::Block(tiles), bias: None }
    }

    /// The weight's tiles, for a tied embedding table to read (a projection without bias).
    fn tiles(&self) -> Option<Arc<BlockMatrix>> {
        match (&self.weight, &self.bias) {
            (LinearWeight::Block(tiles), None) => Some(tiles.clone()),
            _ => None,
        }
    }

    /// x: (tokens, in) → (tokens, out)
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let y = match &self.weight {
            LinearWeight::Dense(w) => w.forward(x)?,
            LinearWeight::Candle(w) => w.forward(x)?,
            LinearWeight::Block(w) => w.forward(x)?,
            LinearWeight::Q4K(w) => w.forward(x)?,
            LinearWeight::Q6K(w) => w.forward(x)?,
        };
        Ok(match &self.bias {
            Some(b) => y.broadcast_add(b)?,
            None => y,
        })
    }
}

/// Token embedding lookup that never dequantizes the whole table.
pub struct Embedding {
    table: EmbeddingTable,
}

enum EmbeddingTable {
    Weight(Weight),
    /// The tiles of the output projection the table is tied to: the table is not held twice.
    Tiles(Arc<BlockMatrix>),
}

impl Embedding {
    pub fn new(table: Weight) -> Result<Self> {
        Ok(Self { table: EmbeddingTable::Weight(table) })
    }

    /// The table of an output projection tied to it: read from the projection's own tiles when
    /// it keeps them (so `table` is dropped), else kept as it is.
    pub fn tied(table: Weight, head: &Linear) -> Result<Self> {
        Ok(match head.tiles() {
            Some(tiles) => Self { table: EmbeddingTable::Tiles(tiles) },
            None => Self::new(table)?,
        })
    }

    /// A table read from block-quantized tiles (shared with the tied output head).
    pub fn from_tiles(tiles: Arc<BlockMatrix>) -> Self {
        Self { table: EmbeddingTable::Tiles(tiles) }
    }

    /// Rows of the table.
    pub fn vocab_size(&self) -> Result<usize> {
        Ok(match &self.table {
            EmbeddingTable::Weight(Weight::Quantized(q)) => q.shape().dims()[0],
            EmbeddingTable::Weight(Weight::Dense(t)) => t.dim(0)?,
            EmbeddingTable::Tiles(tiles) => tiles.rows(),
        })
    }

    /// ids → (tokens, hidden)
    pub fn forward(&self, ids: &[u32]) -> Result<Tensor> {
        Ok(match &self.table {
            EmbeddingTable::Weight(Weight::Quantized(q)) => {
                q.embedding(&Tensor::new(ids, &Device::Cpu)?)?
            }
            EmbeddingTable::Weight(Weight::Dense(t)) => {
                t.index_select(&Tensor::new(ids, &Device::Cpu)?, 0)?
            }
            EmbeddingTable::Tiles(tiles) => tiles.dequantize_rows(ids)?,
        })
    }
}

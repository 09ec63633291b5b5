//! Matrix products against ggml's 32-value block formats (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0), with
//! the weights repacked into tiles of 16 rows.
//!
//! candle 0.11 has only scalar kernels for Q4_1 / Q5_x (Q5_0 is what Q4_K_M files use for
//! matrices whose width is no multiple of 256, e.g. Qwen2.5-0.5B's 896), and its Q8_0 kernel
//! converts each block's scale by a function call. Here a tile stores each block of its 16 rows
//! four values at a time, row after row, so one 64-byte load serves all 16 rows against one
//! broadcast group of four activations: 64 products per `vpdpbusd` (AVX-512 VNNI), or 32 per
//! `vpmaddubsw` (AVX2).
//!
//! Activations are quantized per block to 8 bits as ggml's x86 code does. A block's dot product
//! is an exact integer; float arithmetic runs once per block and row, in block order:
//! `acc += Σq·qₓ · (d·dₓ)`, then `acc += m·sₓ` for the formats with a minimum. So an output
//! depends neither on the instruction set nor on the tokens sharing its pass: the kernels in
//! [`simd`] give the portable copy's bits (tested).

mod simd;

use candle_core::quantized::GgmlDType;
use candle_core::{Device, Tensor};
use half::f16;
use rayon::prelude::*;

use crate::dense::{check_cols, with_values, SharedOutput};
use crate::error::{ModelError, Result};
use crate::huge_pages;
use crate::isa::Isa;

/// Values per block.
const BLOCK: usize = 32;
/// Weight rows per tile: one AVX-512 register of 32-bit sums.
const TILE_ROWS: usize = 16;
/// Tokens sharing one pass over a tile (each unpacked weight group serves all of them): a
/// verification pass of up to 7 draft rows reads and unpacks its weights once.
const GROUP: usize = 8;
/// Bytes of one group: four values of each of the tile's rows.
const GROUP_BYTES: usize = 4 * TILE_ROWS;
/// Products smaller than this run on the calling thread: handing them to the pool costs more
/// than it saves (and MoE experts already run in parallel with each other).
const PARALLEL_MIN_PRODUCTS: usize = 1 << 20;
/// Inputs quantized in parallel from this many values (a prefill chunk, not a decode step).
const PARALLEL_MIN_VALUES: usize = 1 << 17;

/// Which block format a [`BlockMatrix`] holds.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum BlockFormat {
    /// f16 scale, 16 bytes of nibbles: `d·(q − 8)`.
    Q4_0,
    /// f16 scale, f16 minimum, 16 bytes of nibbles: `d·q + m`.
    Q4_1,
    /// f16 scale, 32 fifth bits, 16 bytes of nibbles: `d·(q − 16)`.
    Q5_0,
    /// f16 scale, f16 minimum, 32 fifth bits, 16 bytes of nibbles: `d·q + m`.
    Q5_1,
    /// f16 scale, 32 signed bytes: `d·q`.
    Q8_0,
}

impl BlockFormat {
    pub fn of(dtype: GgmlDType) -> Option<Self> {
        match dtype {
            GgmlDType::Q4_0 => Some(Self::Q4_0),
            GgmlDType::Q4_1 => Some(Self::Q4_1),
            GgmlDType::Q5_0 => Some(Self::Q5_0),
            GgmlDType::Q5_1 => Some(Self::Q5_1),
            GgmlDType::Q8_0 => Some(Self::Q8_0),
            _ => None,
        }
    }

    /// Bytes of one block in GGUF.
    fn block_bytes(self) -> usize {
        match self {
            Self::Q4_0 => 18,
            Self::Q4_1 => 20,
            Self::Q5_0 => 22,
            Self::Q5_1 => 24,
            Self::Q8_0 => 34,
        }
    }

    fn has_minimum(self) -> bool {
        matches!(self, Self::Q4_1 | Self::Q5_1)
    }

    fn has_fifth_bits(self) -> bool {
        matches!(self, Self::Q5_0 | Self::Q5_1)
    }

    /// Whether values are packed two per byte (all but Q8_0).
    fn nibbles(self) -> bool {
        self != Self::Q8_0
    }

    /// What the stored unsigned quant exceeds the value by (Q8_0's signed bytes read as
    /// unsigned after flipping the sign bit: +128).
    fn bias(self) -> i32 {
        match self {
            Self::Q4_0 => 8,
            Self::Q5_0 => 16,
            Self::Q8_0 => 128,
            Self::Q4_1 | Self::Q5_1 => 0,
        }
    }

    /// A GGUF block's unsigned quants in value order (Q8_0: its bytes as stored), its scale and
    /// its minimum (zero where the format has none).
    fn decode(self, b: &[u8]) -> ([u8; BLOCK], f16, f16) {
        let d = f16::from_le_bytes([b[0], b[1]]);
        if self == Self::Q8_0 {
            return (std::array::from_fn(|i| b[2 + i]), d, f16::ZERO);
        }
        let m = if self.has_minimum() { f16::from_le_bytes([b[2], b[3]]) } else { f16::ZERO };
        let nibbles = &b[self.block_bytes() - BLOCK / 2..];
        let fifth = if self.has_fifth_bits() {
            let at = if self.has_minimum() { 4 } else { 2 };
            u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
        } else {
            0
        };
        let quants = std::array::from_fn(|i| {
            let nibble = if i < BLOCK / 2 { nibbles[i] & 0x0F } else { nibbles[i - 16] >> 4 };
            nibble | (((fifth >> i) & 1) as u8) << 4
        });
        (quants, d, m)
    }
}

/// Where the parts of one tile block lie, in bytes from its start.
///
/// - quants: groups of [`GROUP_BYTES`], byte `g·64 + r·4 + j` of row `r`. Nibble formats: 4
///   groups, the low nibble holding value `4g + j` and the high one value `16 + 4g + j`.
///   Q8_0: 8 groups, value `4g + j`.
/// - fifth bits (Q5_x): 64 bytes, byte `r·4 + j` holding value `4g + j`'s in bit `g` and value
///   `16 + 4g + j`'s in bit `4 + g`, so a shift and a mask move them beside their nibbles.
/// - scales, then minima (Q4_1, Q5_1): 16 f16 each.
#[derive(Clone, Copy)]
struct TileLayout {
    fifth_at: usize,
    scales_at: usize,
    minima_at: usize,
    bytes: usize,
}

impl TileLayout {
    fn of(format: BlockFormat) -> Self {
        let quants = if format.nibbles() { 4 * GROUP_BYTES } else { 8 * GROUP_BYTES };
        let fifth = if format.has_fifth_bits() { GROUP_BYTES } else { 0 };
        let scales_at = quants + fifth;
        let minima_at = scales_at + 2 * TILE_ROWS;
        let bytes = minima_at + if format.has_minimum() { 2 * TILE_ROWS } else { 0 };
        Self { fifth_at: quants, scales_at, minima_at, bytes }
    }
}

/// GGUF bytes [`BlockMatrix::read`] asks for at once, about: large enough for few reads, small
/// beside any table worth reading in parts.
const GROUP_READ_BYTES: usize = 4 << 20;

/// A block-quantized matrix of `rows` outputs × `cols` inputs, repacked into 16-row tiles
/// (the last one padded with zero rows).
pub struct BlockMatrix {
    format: BlockFormat,
    layout: TileLayout,
    rows: usize,
    cols: usize,
    /// Tile blocks, `[tile · blocks + block]`, `layout.bytes` each.
    tiles: Vec<u8>,
}

impl BlockMatrix {
    /// `data` in GGUF's layout for `format`.
    pub fn new(format: BlockFormat, rows: usize, cols: usize, data: &[u8]) -> Result<Self> {
        if data.len() != rows * cols / BLOCK * format.block_bytes() {
            return Err(ModelError::BadConfig(format!(
                "{format:?} tensor of {rows}x{cols} has {} bytes",
                data.len()
            )));
        }
        let mut rest = data;
        Self::read(format, rows, cols, |group| {
            let (head, tail) = rest.split_at(group.len());
            group.copy_from_slice(head);
            rest = tail;
            Ok(())
        })
    }

    /// The matrix whose GGUF bytes `read_rows` fills in, rows in order, a group of tiles at a
    /// time: a large table (a 262K-row embedding) is never held whole beside its tiles.
    pub fn read(
        format: BlockFormat,
        rows: usize,
        cols: usize,
        mut read_rows: impl FnMut(&mut [u8]) -> Result<()>,
    ) -> Result<Self> {
        if !cols.is_multiple_of(BLOCK) {
            return Err(ModelError::BadConfig(format!(
                "{format:?} tensor of {rows}x{cols}: rows are not whole blocks"
            )));
        }
        let layout = TileLayout::of(format);
        let blocks = cols / BLOCK;
        let tiles = rows.div_ceil(TILE_ROWS);
        let row_bytes = blocks * format.block_bytes();
        let group_tiles = (GROUP_READ_BYTES / (TILE_ROWS * row_bytes)).max(1);
        let mut packed = vec![0u8; tiles * blocks * layout.bytes];
        let mut gguf = Vec::new();
        let mut read = Ok(());
        huge_pages::fill(&mut packed, |packed| {
            for (group, packed) in
                packed.chunks_mut(group_tiles * blocks * layout.bytes).enumerate()
            {
                let first_row = group * group_tiles * TILE_ROWS;
                let group_rows = (group_tiles * TILE_ROWS).min(rows - first_row);
                gguf.resize(group_rows * row_bytes, 0);
                read = read_rows(&mut gguf);
                if read.is_err() {
                    return;
                }
                packed.par_chunks_mut(layout.bytes).enumerate().for_each(|(at, tile_block)| {
                    let (tile, block) = (at / blocks, at % blocks);
                    for r in 0..TILE_ROWS.min(group_rows - tile * TILE_ROWS) {
                        let from = ((tile * TILE_ROWS + r) * blocks + block) * format.block_bytes();
                        let gguf_block = &gguf[from..from + format.block_bytes()];
                        pack_row(format, layout, gguf_block, r, tile_block);
                    }
                })
            }
        });
        read?;
        Ok(Self { format, layout, rows, cols, tiles: packed })
    }

    /// x: (tokens, cols) → (tokens, rows)
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        check_cols(x, self.rows, self.cols, "block-quantized matmul")?;
        let acts = with_values(x, |x| Ok(Activations::quantize(x, self.cols)))?;
        let tokens = acts.tokens();
        let kernel = Isa::best().for_integer_dots();
        let tile_blocks = self.cols / BLOCK * self.layout.bytes;
        let mut out = vec![0f32; tokens * self.rows];
        let target = SharedOutput::new(&mut out);
        let tile_outputs = |(tile, weights): (usize, &[u8])| {
            let columns = TILE_ROWS.min(self.rows - tile * TILE_ROWS);
            for first in (0..tokens).step_by(GROUP) {
                let group = GROUP.min(tokens - first);
                let mut sums = [[0f32; TILE_ROWS]; GROUP];
                let weights = Tile { format: self.format, layout: self.layout, bytes: weights };
                tile_dot(kernel, weights, &acts, first, group, &mut sums);
                for (t, row_sums) in sums[..group].iter().enumerate() {
                    let at = (first + t) * self.rows + tile * TILE_ROWS;
                    // SAFETY: in bounds, and only this tile's task writes these columns.
                    unsafe { target.write(at, &row_sums[..columns]) };
                }
            }
        };
        let tiles = self.tiles.chunks(tile_blocks).enumerate();
        if self.rows * self.cols * tokens >= PARALLEL_MIN_PRODUCTS {
            self.tiles.par_chunks(tile_blocks).enumerate().for_each(tile_outputs);
        } else {
            tiles.for_each(tile_outputs);
        }
        Ok(Tensor::from_vec(out, (tokens, self.rows), &Device::Cpu)?)
    }
}

impl BlockMatrix {
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Rows `ids` as f32 `(ids, cols)`: the values candle's dequantization gives (an embedding
    /// lookup in a table tied to an output projection held here).
    pub fn dequantize_rows(&self, ids: &[u32]) -> Result<Tensor> {
        let blocks = self.cols / BLOCK;
        let mut out = Vec::with_capacity(ids.len() * self.cols);
        for &id in ids {
            let row = id as usize;
            if row >= self.rows {
                return Err(ModelError::BadConfig(format!(
                    "row {id} of a {}-row matrix",
                    self.rows
                )));
            }
            let (tile, r) = (row / TILE_ROWS, row % TILE_ROWS);
            let tile =
                &self.tiles[tile * blocks * self.layout.bytes..][..blocks * self.layout.bytes];
            for block in tile.chunks_exact(self.layout.bytes) {
                let f16_at =
                    |at: usize| f16::from_le_bytes([block[at + 2 * r], block[at + 2 * r + 1]]);
                let d = f16_at(self.layout.scales_at).to_f32();
                let m = if self.format.has_minimum() {
                    f16_at(self.layout.minima_at).to_f32()
                } else {
                    0.0
                };
                for i in 0..BLOCK {
                    out.push(d * tile_value(self.format, self.layout, block, r, i) as f32 + m);
                }
            }
        }
        Ok(Tensor::from_vec(out, (ids.len(), self.cols), &Device::Cpu)?)
    }
}

/// Writes row `r`'s part of a tile block from its GGUF block.
fn pack_row(format: BlockFormat, layout: TileLayout, gguf_block: &[u8], r: usize, out: &mut [u8]) {
    let (quants, d, m) = format.decode(gguf_block);
    for g in 0..4 {
        for j in 0..4 {
            let (low, high) = (quants[4 * g + j], quants[16 + 4 * g + j]);
            if format.nibbles() {
                out[g * GROUP_BYTES + r * 4 + j] = (low & 0x0F) | (high << 4);
                if format.has_fifth_bits() {
                    let bits = ((low >> 4) << g) | ((high >> 4) << (4 + g));
                    out[layout.fifth_at + r * 4 + j] |= bits;
                }
            } else {
                out[g * GROUP_BYTES + r * 4 + j] = low;
                out[(4 + g) * GROUP_BYTES + r * 4 + j] = high;
            }
        }
    }
    out[layout.scales_at + 2 * r..][..2].copy_from_slice(&d.to_le_bytes());
    if format.has_minimum() {
        out[layout.minima_at + 2 * r..][..2].copy_from_slice(&m.to_le_bytes());
    }
}

/// Activations quantized to 8 bits per 32-value block (ggml's Q8_1), one token after another.
struct Activations {
    cols: usize,
    quants: Vec<i8>,
    /// Per block: the step between levels, rounded to f16 as ggml stores it.
    d: Vec<f32>,
    /// Per block: `d · Σq` (before `d` is rounded), rounded to f16.
    s: Vec<f32>,
    /// Per block: `Σq`, exact.
    sums: Vec<i32>,
}

impl Activations {
    /// `x` is `(tokens, cols)` row-major. ggml's x86 `quantize_row_q8_1`: scale by
    /// `127 / amax` and round half to even.
    fn quantize(x: &[f32], cols: usize) -> Self {
        let blocks = x.len() / BLOCK;
        let mut out = Self {
            cols,
            quants: vec![0; x.len()],
            d: vec![0.0; blocks],
            s: vec![0.0; blocks],
            sums: vec![0; blocks],
        };
        let parts = (out.quants.chunks_mut(BLOCK).zip(&mut out.d)).zip(out.s.iter_mut());
        let parts: Vec<_> = x.chunks(BLOCK).zip(parts.zip(out.sums.iter_mut())).collect();
        let quantize = |(xs, (((qs, d), s), sum)): BlockParts<'_>| {
            (*d, *s, *sum) = quantize_block(xs, qs);
        };
        if x.len() >= PARALLEL_MIN_VALUES {
            parts.into_par_iter().with_min_len(64).for_each(quantize);
        } else {
            parts.into_iter().for_each(quantize);
        }
        out
    }

    fn tokens(&self) -> usize {
        self.quants.len() / self.cols.max(1)
    }

    /// Index of token `t`'s block `b`.
    #[inline(always)]
    fn block(&self, t: usize, b: usize) -> usize {
        t * (self.cols / BLOCK) + b
    }
}

/// One block's input and where its quants, `d`, `s` and `Σq` go.
type BlockParts<'a> = (&'a [f32], (((&'a mut [i8], &'a mut f32), &'a mut f32), &'a mut i32));

/// Quantizes one block into `qs`; returns `(d, s, Σq)`.
fn quantize_block(xs: &[f32], qs: &mut [i8]) -> (f32, f32, i32) {
    let amax = xs.iter().fold(0f32, |a, v| a.max(v.abs()));
    let d = amax / 127.0;
    let inverse = if amax != 0.0 { 127.0 / amax } else { 0.0 };
    let mut sum = 0i32;
    for (q, v) in qs.iter_mut().zip(xs) {
        *q = round_small(v * inverse) as i8;
        sum += *q as i32;
    }
    (f16::from_f32(d).to_f32(), f16::from_f32(d * sum as f32).to_f32(), sum)
}

/// `x.round_ties_even()` for `|x| < 2²²`, in two additions that vectorize (the library call
/// does not): adding 1.5·2²³ leaves no fraction bits, so the sum rounds to an integer, ties to
/// even.
fn round_small(x: f32) -> f32 {
    const SHIFT: f32 = 12_582_912.0;
    (x + SHIFT) - SHIFT
}

/// One tile's bytes (its [`TILE_ROWS`] rows' blocks) and how to read them.
#[derive(Clone, Copy)]
struct Tile<'a> {
    format: BlockFormat,
    layout: TileLayout,
    bytes: &'a [u8],
}

/// `sums[t][r]` = row `r` of the tile · token `first + t`, for `group` tokens, on `kernel`: the
/// portable copy, AVX2 (`vpmaddubsw` on 8-row halves) or AVX-512 (`vpdpbusd` on whole tiles).
fn tile_dot(
    kernel: Isa,
    tile: Tile<'_>,
    acts: &Activations,
    first: usize,
    group: usize,
    sums: &mut [[f32; TILE_ROWS]; GROUP],
) {
    debug_assert_eq!(kernel, kernel.for_integer_dots(), "not a copy of the integer kernels");
    match kernel {
        // SAFETY: `Isa::for_integer_dots` found the features these copies are compiled for.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => unsafe { simd::avx2_tile_dot(tile, acts, first, group, sums) },
        // SAFETY: as above.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => unsafe { simd::vnni_tile_dot(tile, acts, first, group, sums) },
        _ => {
            let Tile { format, layout, bytes } = tile;
            for (t, row_sums) in sums[..group].iter_mut().enumerate() {
                for (r, sum) in row_sums.iter_mut().enumerate() {
                    *sum = row_dot(format, layout, bytes, acts, first + t, r);
                }
            }
        }
    }
}

/// Value `i` of row `r` in a tile block, less the format's bias.
fn tile_value(format: BlockFormat, layout: TileLayout, block: &[u8], r: usize, i: usize) -> i32 {
    let (half, g, j) = (i / 16, i % 16 / 4, i % 4);
    if !format.nibbles() {
        return block[(4 * half + g) * GROUP_BYTES + r * 4 + j] as i8 as i32;
    }
    let byte = block[g * GROUP_BYTES + r * 4 + j];
    let nibble = if half == 0 { byte & 0x0F } else { byte >> 4 };
    let fifth = if format.has_fifth_bits() {
        (block[layout.fifth_at + r * 4 + j] >> (4 * half + g)) & 1
    } else {
        0
    };
    (nibble | fifth << 4) as i32 - format.bias()
}

/// Row `r` of a tile · token `t`: the portable copy, and the definition the SIMD copies meet.
fn row_dot(
    format: BlockFormat,
    layout: TileLayout,
    tile: &[u8],
    acts: &Activations,
    t: usize,
    r: usize,
) -> f32 {
    let mut acc = 0f32;
    for (b, block) in tile.chunks_exact(layout.bytes).enumerate() {
        let at = acts.block(t, b);
        let qs = &acts.quants[at * BLOCK..(at + 1) * BLOCK];
        let dot: i32 =
            (0..BLOCK).map(|i| tile_value(format, layout, block, r, i) * qs[i] as i32).sum();
        let f16_at = |at: usize| f16::from_le_bytes([block[at + 2 * r], block[at + 2 * r + 1]]);
        let d = f16_at(layout.scales_at).to_f32();
        acc = (dot as f32).mul_add(d * acts.d[at], acc);
        if format.has_minimum() {
            acc = f16_at(layout.minima_at).to_f32().mul_add(acts.s[at], acc);
        }
    }
    acc
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_data::sample;
    use candle_core::quantized::QTensor;

    const FORMATS: [(GgmlDType, BlockFormat); 5] = [
        (GgmlDType::Q4_0, BlockFormat::Q4_0),
        (GgmlDType::Q4_1, BlockFormat::Q4_1),
        (GgmlDType::Q5_0, BlockFormat::Q5_0),
        (GgmlDType::Q5_1, BlockFormat::Q5_1),
        (GgmlDType::Q8_0, BlockFormat::Q8_0),
    ];

    fn matrix(dtype: GgmlDType, rows: usize, cols: usize, seed: u32) -> QTensor {
        let w = Tensor::from_vec(sample(rows * cols, seed), (rows, cols), &Device::Cpu).unwrap();
        QTensor::quantize(&w, dtype).unwrap()
    }

    fn forward(m: &BlockMatrix, x: &[f32], tokens: usize) -> Vec<Vec<f32>> {
        let x = Tensor::from_vec(x.to_vec(), (tokens, m.cols), &Device::Cpu).unwrap();
        m.forward(&x).unwrap().to_vec2().unwrap()
    }

    #[test]
    fn matches_the_exact_product_within_activation_quantization_error() {
        // 40 rows: two tiles and a padded third.
        let (rows, cols, tokens) = (40, 128, 3);
        for (dtype, format) in FORMATS {
            let q = matrix(dtype, rows, cols, 7);
            let ours = BlockMatrix::new(format, rows, cols, &q.data().unwrap()).unwrap();
            let dense = q.dequantize(&Device::Cpu).unwrap().to_vec2::<f32>().unwrap();
            let x = sample(tokens * cols, 3);
            let got = forward(&ours, &x, tokens);
            for (t, xs) in x.chunks(cols).enumerate() {
                let amax = xs.iter().fold(0f32, |a, v| a.max(v.abs()));
                for (r, w) in dense.iter().enumerate() {
                    let exact: f32 = w.iter().zip(xs).map(|(a, b)| a * b).sum();
                    // Rounding each activation to a multiple of amax/127 moves it by at most
                    // amax/254; f16 scales add a little more.
                    let bound = w.iter().map(|v| v.abs()).sum::<f32>() * amax / 254.0 * 1.01 + 1e-3;
                    assert!(
                        (exact - got[t][r]).abs() <= bound,
                        "{format:?} ({t}, {r}): {exact} vs {} (bound {bound})",
                        got[t][r]
                    );
                }
            }
        }
    }

    #[test]
    fn small_rounding_is_round_ties_even() {
        for x in [0.5f32, 1.5, 2.5, -0.5, -2.5, 126.5, -127.0, 3.49999, 0.0, -0.0, 1e-30] {
            assert_eq!(round_small(x), x.round_ties_even(), "{x}");
        }
        for i in -300_000..300_000 {
            let x = i as f32 * 0.000_431;
            assert_eq!(round_small(x), x.round_ties_even(), "{x}");
        }
    }

    #[test]
    fn tiles_hold_what_candle_dequantizes() {
        let (rows, cols) = (20, 64);
        for (dtype, format) in FORMATS {
            let q = matrix(dtype, rows, cols, 13);
            let dense = q.dequantize(&Device::Cpu).unwrap().to_vec2::<f32>().unwrap();
            let m = BlockMatrix::new(format, rows, cols, &q.data().unwrap()).unwrap();
            let ids: Vec<u32> = (0..rows as u32).rev().collect();
            let ours = m.dequantize_rows(&ids).unwrap().to_vec2::<f32>().unwrap();
            for (row, got) in ids.iter().zip(&ours) {
                assert_eq!(got, &dense[*row as usize], "{format:?} row {row}");
            }
            assert!(m.dequantize_rows(&[rows as u32]).is_err());
        }
    }

    #[test]
    fn every_kernel_gives_the_portable_bits_and_tokens_do_not_depend_on_their_batch() {
        let (rows, cols, tokens) = (40, 256, 7);
        // Seven tokens run as a group of four and one of three; extreme values too.
        let mut batch: Vec<f32> = (0..tokens as u32).flat_map(|t| sample(cols, 99 + t)).collect();
        batch[5] = 1e4;
        batch[cols + 64..cols + 128].fill(0.0);
        for (dtype, format) in FORMATS {
            let q = matrix(dtype, rows, cols, 11);
            let m = BlockMatrix::new(format, rows, cols, &q.data().unwrap()).unwrap();
            let acts = Activations::quantize(&batch, cols);
            let tile_bytes = cols / BLOCK * m.layout.bytes;
            for kernel in Isa::integer_dot_copies() {
                for tile in 0..rows.div_ceil(TILE_ROWS) {
                    let weights = &m.tiles[tile * tile_bytes..][..tile_bytes];
                    for first in [0, 3] {
                        let group = GROUP.min(tokens - first);
                        let (mut got, mut expected) =
                            ([[0f32; TILE_ROWS]; GROUP], [[0f32; TILE_ROWS]; GROUP]);
                        let weights = Tile { format, layout: m.layout, bytes: weights };
                        tile_dot(kernel, weights, &acts, first, group, &mut got);
                        tile_dot(Isa::Portable, weights, &acts, first, group, &mut expected);
                        let bits = |s: &[[f32; TILE_ROWS]; GROUP]| {
                            s[..group].iter().flatten().map(|v| v.to_bits()).collect::<Vec<_>>()
                        };
                        assert_eq!(
                            bits(&got),
                            bits(&expected),
                            "{format:?} {kernel:?} tile {tile}"
                        );
                    }
                }
            }
            let among = forward(&m, &batch, tokens);
            for (t, x) in batch.chunks(cols).enumerate() {
                assert_eq!(forward(&m, x, 1)[0], among[t], "{format:?} token {t}");
            }
        }
    }

    #[test]
    fn a_rows_bits_in_a_pass_of_one_to_eight_rows_are_its_bits_alone() {
        // A verification pass of k drafts is k + 1 rows: each must round as it would alone.
        let (rows, cols) = (24, 128);
        let batch: Vec<f32> = (0..GROUP as u32).flat_map(|t| sample(cols, 31 + t)).collect();
        let acts = Activations::quantize(&batch, cols);
        let bits = |s: &[f32; TILE_ROWS]| s.map(f32::to_bits);
        for (dtype, format) in FORMATS {
            let q = matrix(dtype, rows, cols, 17);
            let m = BlockMatrix::new(format, rows, cols, &q.data().unwrap()).unwrap();
            let tile_bytes = cols / BLOCK * m.layout.bytes;
            for kernel in Isa::integer_dot_copies() {
                for tile in 0..rows.div_ceil(TILE_ROWS) {
                    let bytes = &m.tiles[tile * tile_bytes..][..tile_bytes];
                    let weights = Tile { format, layout: m.layout, bytes };
                    let pass = |first, n| {
                        let mut sums = [[0f32; TILE_ROWS]; GROUP];
                        tile_dot(kernel, weights, &acts, first, n, &mut sums);
                        sums
                    };
                    let alone: Vec<_> = (0..GROUP).map(|t| bits(&pass(t, 1)[0])).collect();
                    for n in 1..=GROUP {
                        for first in 0..=GROUP - n {
                            let sums = pass(first, n);
                            for (t, sums) in sums[..n].iter().enumerate() {
                                assert_eq!(
                                    bits(sums),
                                    alone[first + t],
                                    "{format:?} {kernel:?} tile {tile}: row {t} of {n}"
                                );
                            }
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn a_table_read_in_groups_of_rows_holds_what_candle_dequantizes() {
        // One Q8_0 block per row: two whole groups of rows and a short third with a padded tile.
        let (cols, row_bytes) = (32, 34);
        let group_rows = GROUP_READ_BYTES / (TILE_ROWS * row_bytes) * TILE_ROWS;
        let rows = 2 * group_rows + 20;
        let q = matrix(GgmlDType::Q8_0, rows, cols, 5);
        let data = q.data().unwrap();
        let (mut rest, mut reads) = (&data[..], Vec::new());
        let m = BlockMatrix::read(BlockFormat::Q8_0, rows, cols, |group| {
            let (head, tail) = rest.split_at(group.len());
            group.copy_from_slice(head);
            rest = tail;
            reads.push(group.len() / row_bytes);
            Ok(())
        })
        .unwrap();
        assert_eq!(reads, [group_rows, group_rows, 20]);
        let dense = q.dequantize(&Device::Cpu).unwrap();
        let ids = [0, group_rows - 1, group_rows, 2 * group_rows - 1, 2 * group_rows, rows - 1];
        let ids = ids.map(|i| i as u32);
        let ours = m.dequantize_rows(&ids).unwrap().to_vec2::<f32>().unwrap();
        for (row, got) in ids.iter().zip(&ours) {
            let want = dense.get(*row as usize).unwrap().to_vec1::<f32>().unwrap();
            assert_eq!(got, &want, "row {row}");
        }
        // A failed read is the load's error.
        let failed = BlockMatrix::read(BlockFormat::Q8_0, rows, cols, |_| {
            Err(ModelError::BadConfig("the file ended".into()))
        });
        assert!(failed.is_err());
    }

    #[test]
    fn sizes_that_do_not_match_are_refused() {
        assert!(BlockMatrix::new(BlockFormat::Q5_0, 16, 40, &[0; 22 * 20]).is_err());
        assert!(BlockMatrix::new(BlockFormat::Q8_0, 16, 32, &[0; 33 * 16]).is_err());
        let q = matrix(GgmlDType::Q8_0, 16, 64, 1);
        let m = BlockMatrix::new(BlockFormat::Q8_0, 16, 64, &q.data().unwrap()).unwrap();
        let x = Tensor::zeros((2, 96), candle_core::DType::F32, &Device::Cpu).unwrap();
        assert!(m.forward(&x).is_err());
    }
}

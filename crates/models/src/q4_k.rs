//! Q4_K weights × 8-bit activations with AVX-512 VNNI, for CPUs that have it (others keep
//! candle's kernels).
//!
//! candle applies every 32-value sub-block's scale and minimum in float, per token: two fused
//! multiply-adds in one dependency chain per sub-block, which left its VNNI kernel waiting on
//! them when few tokens share a pass (decode, and every MoE expert). Here a block's eight sub-block
//! sums are scaled in integers (exact), the minima come from one word dot product, and float
//! arithmetic runs once per 256-value block: `acc += d·dₓ·Σ sc·Σqa − dmin·dₓ·Σ m·Σa`.
//!
//! Each output is reduced block by block in the same order whatever tokens share its pass, and
//! the integer parts are exact, so a token's results do not depend on its batch. The portable
//! [`dot_reference`] performs the same operations and gives the same bits (tested).

use candle_core::Tensor;
use half::f16;

use crate::error::{ModelError, Result};
use crate::huge_pages;
use crate::k_quants::{fits, tiled_product, Activations, TileSums, BLOCK, TILE_ROWS};

/// Bytes of a Q4_K block (one scale and one minimum per 32-value sub-block, 8 of them).
const BLOCK_BYTES: usize = 144;

/// One block of 16 weight rows, laid out for `vpdpbusd`: 64 bytes hold 4 consecutive quants of
/// each row (low nibbles: sub-block `2p`, high nibbles: sub-block `2p + 1`).
#[repr(C, align(64))]
#[derive(Clone)]
struct TileBlock {
    /// `[(p · 8 + g) · 64 + row · 4 + j]` = byte `32p + 4g + j` of the row's GGUF quants.
    quants: [u8; BLOCK / 2 * TILE_ROWS],
    /// Sub-block scales (6 bits), one per row; widened to 32 bits where used.
    scales: [[u8; TILE_ROWS]; 8],
    /// Sub-block minima (6 bits) of sub-blocks `2q` (low half) and `2q + 1` (high half).
    min_pairs: [[i32; TILE_ROWS]; 4],
    /// As stored (f16): the tile is read from memory once per token group, so bytes count.
    d: [f16; TILE_ROWS],
    dmin: [f16; TILE_ROWS],
}

/// A Q4_K matrix of `rows` outputs × `cols` inputs, repacked into 16-row tiles.
pub struct Q4KMatrix {
    rows: usize,
    cols: usize,
    /// `[tile · blocks_per_row + block]`
    tiles: Vec<TileBlock>,
}

impl Q4KMatrix {
    /// `data` in GGUF's Q4_K layout.
    pub fn new(rows: usize, cols: usize, data: &[u8]) -> Result<Self> {
        let blocks = cols / BLOCK;
        if !fits(rows, cols) || data.len() != rows * blocks * BLOCK_BYTES {
            return Err(ModelError::BadConfig(format!(
                "Q4_K tensor of {rows}x{cols} with {} bytes does not tile",
                data.len()
            )));
        }
        let row_bytes = blocks * BLOCK_BYTES;
        let tiles = huge_pages::collect(
            rows / TILE_ROWS * blocks,
            (0..rows / TILE_ROWS).flat_map(|t| (0..blocks).map(move |b| (t, b))).map(|(t, b)| {
                let gguf_block = |r: usize| {
                    let at = (t * TILE_ROWS + r) * row_bytes + b * BLOCK_BYTES;
                    &data[at..at + BLOCK_BYTES]
                };
                pack_tile_block(gguf_block)
            }),
        );
        Ok(Self { rows, cols, tiles })
    }

    /// x: (tokens, cols) → (tokens, rows)
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let blocks = self.cols / BLOCK;
        let tile_dot = |tile: usize, acts: &Activations, _: &(), first, group, sums: &mut _| {
            tile_dot(&self.tiles[tile * blocks..][..blocks], acts, first, group, sums)
        };
        tiled_product(x, self.rows, self.cols, "q4_k matmul", |_| (), tile_dot)
    }
}

/// The 6-bit scale and minimum of sub-block `j` from a Q4_K block's 12 packed bytes.
fn scale_min(j: usize, q: &[u8]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        ((q[j + 4] & 0x0F) | ((q[j - 4] >> 6) << 4), (q[j + 4] >> 4) | ((q[j] >> 6) << 4))
    }
}

fn pack_tile_block<'a>(gguf_block: impl Fn(usize) -> &'a [u8]) -> TileBlock {
    let mut tile = TileBlock {
        quants: [0; BLOCK / 2 * TILE_ROWS],
        scales: [[0; TILE_ROWS]; 8],
        min_pairs: [[0; TILE_ROWS]; 4],
        d: [f16::ZERO; TILE_ROWS],
        dmin: [f16::ZERO; TILE_ROWS],
    };
    for r in 0..TILE_ROWS {
        let blk = gguf_block(r);
        tile.d[r] = f16::from_le_bytes([blk[0], blk[1]]);
        tile.dmin[r] = f16::from_le_bytes([blk[2], blk[3]]);
        let (packed_scales, quants) = (&blk[4..16], &blk[16..]);
        let mut mins = [0i32; 8];
        for (s, min) in mins.iter_mut().enumerate() {
            let (sc, m) = scale_min(s, packed_scales);
            tile.scales[s][r] = sc;
            *min = m as i32;
        }
        for q in 0..4 {
            tile.min_pairs[q][r] = mins[2 * q] | (mins[2 * q + 1] << 16);
        }
        for p in 0..4 {
            for g in 0..8 {
                for j in 0..4 {
                    tile.quants[(p * 8 + g) * 64 + r * 4 + j] = quants[32 * p + 4 * g + j];
                }
            }
        }
    }
    tile
}

/// `sums[t][r]` = row `r` of `tile` · token `first + t`, for `group` tokens.
fn tile_dot(
    tile: &[TileBlock],
    acts: &Activations,
    first: usize,
    group: usize,
    sums: &mut TileSums,
) {
    #[cfg(target_arch = "x86_64")]
    if crate::k_quants::supported() {
        // SAFETY: the CPU has the features the kernel is compiled for.
        unsafe {
            match group {
                1 => vnni::tile_dot::<1>(tile, acts, first, sums),
                2 => vnni::tile_dot::<2>(tile, acts, first, sums),
                3 => vnni::tile_dot::<3>(tile, acts, first, sums),
                _ => vnni::tile_dot::<4>(tile, acts, first, sums),
            }
        }
        return;
    }
    for (t, row_sums) in sums[..group].iter_mut().enumerate() {
        for (r, v) in row_sums.iter_mut().enumerate() {
            *v = dot_reference(tile, acts, first + t, r);
        }
    }
}

/// Row `r` of `tile` · token `token`, in the kernel's operations and order.
fn dot_reference(tile: &[TileBlock], acts: &Activations, token: usize, r: usize) -> f32 {
    let blocks = acts.cols / BLOCK;
    let mut acc = 0f32;
    for (b, tb) in tile.iter().enumerate() {
        let block = token * blocks + b;
        let qs = &acts.quants[block * BLOCK..(block + 1) * BLOCK];
        let mut scaled = 0i32;
        for p in 0..4 {
            let (mut lo, mut hi) = (0i32, 0i32);
            for g in 0..8 {
                for j in 0..4 {
                    let w = tb.quants[(p * 8 + g) * 64 + r * 4 + j];
                    lo += (w & 0x0F) as i32 * qs[64 * p + 4 * g + j] as i32;
                    hi += (w >> 4) as i32 * qs[64 * p + 32 + 4 * g + j] as i32;
                }
            }
            scaled = scaled.wrapping_add(lo.wrapping_mul(tb.scales[2 * p][r] as i32));
            scaled = scaled.wrapping_add(hi.wrapping_mul(tb.scales[2 * p + 1][r] as i32));
        }
        let mut min_sum = 0i32;
        for q in 0..4 {
            let (mins, sums) = (tb.min_pairs[q][r], acts.pair_sums[block * 4 + q]);
            min_sum += (mins as i16 as i32) * (sums as i16 as i32)
                + ((mins >> 16) as i16 as i32) * ((sums >> 16) as i16 as i32);
        }
        let dx = acts.d[block];
        acc = (scaled as f32).mul_add(tb.d[r].to_f32() * dx, acc);
        acc = (-(min_sum as f32)).mul_add(tb.dmin[r].to_f32() * dx, acc);
    }
    acc
}

#[cfg(target_arch = "x86_64")]
mod vnni {
    use std::arch::x86_64::*;

    use super::{Activations, TileBlock, TileSums, BLOCK};

    /// [`super::dot_reference`] for 16 rows and `M` tokens from `first`: each 64-byte load
    /// of quants is unpacked once for all `M` tokens.
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    pub unsafe fn tile_dot<const M: usize>(
        tile: &[TileBlock],
        acts: &Activations,
        first: usize,
        sums: &mut TileSums,
    ) {
        let blocks = acts.cols / BLOCK;
        let low_nibbles = _mm512_set1_epi8(0x0F);
        let mut acc = [_mm512_setzero_ps(); M];
        for (b, tb) in tile.iter().enumerate() {
            let mut scaled = [_mm512_setzero_si512(); M];
            for p in 0..4 {
                let mut lo = [_mm512_setzero_si512(); M];
                let mut hi = [_mm512_setzero_si512(); M];
                for g in 0..8 {
                    let w = _mm512_load_si512(tb.quants.as_ptr().add((p * 8 + g) * 64) as *const _);
                    let w_lo = _mm512_and_si512(w, low_nibbles);
                    let w_hi = _mm512_and_si512(_mm512_srli_epi16(w, 4), low_nibbles);
                    for m in 0..M {
                        let qs = acts
                            .quants
                            .as_ptr()
                            .add(((first + m) * blocks + b) * BLOCK + 64 * p + 4 * g);
                        let a_lo = _mm512_set1_epi32((qs as *const i32).read_unaligned());
                        let a_hi = _mm512_set1_epi32((qs.add(32) as *const i32).read_unaligned());
                        lo[m] = _mm512_dpbusd_epi32(lo[m], w_lo, a_lo);
                        hi[m] = _mm512_dpbusd_epi32(hi[m], w_hi, a_hi);
                    }
                }
                let sc_lo =
                    _mm512_cvtepu8_epi32(_mm_loadu_si128(tb.scales[2 * p].as_ptr() as *const _));
                let sc_hi = _mm512_cvtepu8_epi32(_mm_loadu_si128(
                    tb.scales[2 * p + 1].as_ptr() as *const _
                ));
                for m in 0..M {
                    scaled[m] = _mm512_add_epi32(scaled[m], _mm512_mullo_epi32(lo[m], sc_lo));
                    scaled[m] = _mm512_add_epi32(scaled[m], _mm512_mullo_epi32(hi[m], sc_hi));
                }
            }
            let d = _mm512_cvtph_ps(_mm256_loadu_si256(tb.d.as_ptr() as *const _));
            let dmin = _mm512_cvtph_ps(_mm256_loadu_si256(tb.dmin.as_ptr() as *const _));
            for m in 0..M {
                let block = (first + m) * blocks + b;
                let mut min_sum = _mm512_setzero_si512();
                for q in 0..4 {
                    let mins = _mm512_load_si512(tb.min_pairs[q].as_ptr() as *const _);
                    min_sum = _mm512_dpwssd_epi32(
                        min_sum,
                        mins,
                        _mm512_set1_epi32(acts.pair_sums[block * 4 + q]),
                    );
                }
                let dx = _mm512_set1_ps(acts.d[block]);
                acc[m] =
                    _mm512_fmadd_ps(_mm512_cvtepi32_ps(scaled[m]), _mm512_mul_ps(d, dx), acc[m]);
                acc[m] =
                    _mm512_fnmadd_ps(_mm512_cvtepi32_ps(min_sum), _mm512_mul_ps(dmin, dx), acc[m]);
            }
        }
        for m in 0..M {
            _mm512_storeu_ps(sums[m].as_mut_ptr(), acc[m]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_data::sample;
    use candle_core::quantized::{GgmlDType, QTensor};
    use candle_core::Device;

    fn quantized(rows: usize, cols: usize, seed: u32) -> QTensor {
        let w = Tensor::from_vec(sample(rows * cols, seed), (rows, cols), &Device::Cpu).unwrap();
        QTensor::quantize(&w, GgmlDType::Q4K).unwrap()
    }

    #[test]
    fn matches_the_dequantized_product_within_activation_rounding() {
        let q = quantized(32, 512, 7);
        let ours = Q4KMatrix::new(32, 512, &q.data().unwrap()).unwrap();
        crate::k_quants::assert_within_activation_rounding(&q, |x| ours.forward(x));
    }

    #[test]
    fn kernel_equals_the_reference_bit_for_bit_and_tokens_do_not_depend_on_their_batch() {
        let (rows, cols) = (48, 768);
        let q = quantized(rows, cols, 11);
        let m = Q4KMatrix::new(rows, cols, &q.data().unwrap()).unwrap();
        // Seven tokens run as a group of four and one of three; extreme values too.
        let mut batch: Vec<f32> = (0..7).flat_map(|t| sample(cols, 99 + t)).collect();
        batch[5] = 1e4;
        batch[cols + 300..cols + 556].fill(0.0);
        let acts = Activations::quantize(&batch, cols);
        let among = m
            .forward(&Tensor::from_vec(batch.clone(), (7, cols), &Device::Cpu).unwrap())
            .unwrap()
            .to_vec2::<f32>()
            .unwrap();
        let blocks = cols / BLOCK;
        for (t, x) in batch.chunks(cols).enumerate() {
            let alone =
                m.forward(&Tensor::from_vec(x.to_vec(), (1, cols), &Device::Cpu).unwrap()).unwrap();
            assert_eq!(alone.get(0).unwrap().to_vec1::<f32>().unwrap(), among[t], "token {t}");
            for (r, got) in among[t].iter().enumerate() {
                let reference = dot_reference(
                    &m.tiles[(r / TILE_ROWS) * blocks..][..blocks],
                    &acts,
                    t,
                    r % TILE_ROWS,
                );
                assert_eq!(reference.to_bits(), got.to_bits(), "token {t}, row {r}");
            }
        }
    }

    #[test]
    fn shapes_that_do_not_tile_are_refused() {
        assert!(!fits(24, 256));
        assert!(!fits(16, 320));
        assert!(Q4KMatrix::new(16, 256, &[0; 10]).is_err());
        let q = quantized(16, 256, 1);
        let m = Q4KMatrix::new(16, 256, &q.data().unwrap()).unwrap();
        assert!(m
            .forward(&Tensor::zeros((2, 512), candle_core::DType::F32, &Device::Cpu).unwrap())
            .is_err());
    }
}

//! Q4_K weights × 8-bit activations with AVX-512 VNNI or AVX2 (other CPUs keep candle's
//! kernels).
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
//!
//! The AVX2 copy has no `vpdpbusd`: `vpmaddubsw` products of a sub-block's 8 value groups are
//! summed in 16 bits (at most 8·2·15·127 = 30480, so exact), and one `vpmaddwd` by the
//! sub-block's scale widens and scales them: 2 instructions per 32 products where candle's AVX2
//! tiles take 3 and a float multiply-add per sub-block and token.

use candle_core::Tensor;
use half::f16;

use crate::error::{ModelError, Result};
use crate::huge_pages;
use crate::isa::Isa;
use crate::k_quants::{best_copy, fits, tiled_product, Activations, TileSums, BLOCK, TILE_ROWS};

/// Bytes of a Q4_K block (one scale and one minimum per 32-value sub-block, 8 of them).
const BLOCK_BYTES: usize = 144;

/// One block of 16 weight rows, laid out for `vpdpbusd`: 64 bytes hold 4 consecutive quants of
/// each row (low nibbles: sub-block `2p`, high nibbles: sub-block `2p + 1`). 2,368 bytes where
/// GGUF's 16 blocks take 2,304: decode streams every tile once per token, so bytes are time.
#[repr(C, align(64))]
#[derive(Clone)]
struct TileBlock {
    /// `[(p · 8 + g) · 64 + row · 4 + j]` = byte `32p + 4g + j` of the row's GGUF quants.
    quants: [u8; BLOCK / 2 * TILE_ROWS],
    /// Sub-block scales (6 bits), one per row; widened to 32 bits where used.
    scales: [[u8; TILE_ROWS]; 8],
    /// `[q][2 · row + h]` = minimum (6 bits) of sub-block `2q + h`: one `vpmovzxbw` widens a
    /// `q` to the rows' i16 pairs that `vpmaddwd` takes against the activations' pair sums.
    min_pairs: [[u8; 2 * TILE_ROWS]; 4],
    /// As stored (f16): the tile is read from memory once per token group, so bytes count.
    d: [f16; TILE_ROWS],
    dmin: [f16; TILE_ROWS],
}

// Quants 2,048 + scales 128 + minima 128 + d and dmin 64, no padding.
const _: () = assert!(size_of::<TileBlock>() == 2368);

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
        self.product(x, best_copy())
    }

    /// [`Self::forward`] on a given kernel copy (the tests run each).
    fn product(&self, x: &Tensor, kernel: Isa) -> Result<Tensor> {
        let blocks = self.cols / BLOCK;
        let tile_dot = |tile: usize, acts: &Activations, _: &(), first, group, sums: &mut _| {
            tile_dot(kernel, &self.tiles[tile * blocks..][..blocks], acts, first, group, sums)
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
        min_pairs: [[0; 2 * TILE_ROWS]; 4],
        d: [f16::ZERO; TILE_ROWS],
        dmin: [f16::ZERO; TILE_ROWS],
    };
    for r in 0..TILE_ROWS {
        let blk = gguf_block(r);
        tile.d[r] = f16::from_le_bytes([blk[0], blk[1]]);
        tile.dmin[r] = f16::from_le_bytes([blk[2], blk[3]]);
        let (packed_scales, quants) = (&blk[4..16], &blk[16..]);
        for s in 0..8 {
            let (sc, m) = scale_min(s, packed_scales);
            tile.scales[s][r] = sc;
            tile.min_pairs[s / 2][2 * r + s % 2] = m;
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

/// `sums[t][r]` = row `r` of `tile` · token `first + t`, for `group` tokens, on `kernel`.
fn tile_dot(
    kernel: Isa,
    tile: &[TileBlock],
    acts: &Activations,
    first: usize,
    group: usize,
    sums: &mut TileSums,
) {
    debug_assert_eq!(kernel, kernel.for_integer_dots(), "not a copy of the integer kernels");
    match kernel {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `Isa::for_integer_dots` chose this copy for a CPU with its features.
        Isa::Avx512 => unsafe {
            match group {
                1 => vnni::tile_dot::<1>(tile, acts, first, sums),
                2 => vnni::tile_dot::<2>(tile, acts, first, sums),
                3 => vnni::tile_dot::<3>(tile, acts, first, sums),
                4 => vnni::tile_dot::<4>(tile, acts, first, sums),
                5 => vnni::tile_dot::<5>(tile, acts, first, sums),
                6 => vnni::tile_dot::<6>(tile, acts, first, sums),
                7 => vnni::tile_dot::<7>(tile, acts, first, sums),
                _ => vnni::tile_dot::<8>(tile, acts, first, sums),
            }
        },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as above.
        Isa::Avx2 => unsafe {
            // Passes of at most 4 tokens: more sums than that do not fit in the 16 registers
            // beside the accumulators, and 8 tokens at once measured no faster.
            for start in (0..group).step_by(4) {
                let (first, sums) = (first + start, &mut sums[start..]);
                match group - start {
                    1 => avx2::tile_dot::<1>(tile, acts, first, sums),
                    2 => avx2::tile_dot::<2>(tile, acts, first, sums),
                    3 => avx2::tile_dot::<3>(tile, acts, first, sums),
                    _ => avx2::tile_dot::<4>(tile, acts, first, sums),
                }
            }
        },
        _ => {
            for (t, row_sums) in sums[..group].iter_mut().enumerate() {
                for (r, v) in row_sums.iter_mut().enumerate() {
                    *v = dot_reference(tile, acts, first + t, r);
                }
            }
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
            let (mins, sums) = (&tb.min_pairs[q][2 * r..], acts.pair_sums[block * 4 + q]);
            min_sum += (mins[0] as i32) * (sums as i16 as i32)
                + (mins[1] as i32) * ((sums >> 16) as i16 as i32);
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
            let min_pair = |q: usize| {
                _mm512_cvtepu8_epi16(_mm256_load_si256(tb.min_pairs[q].as_ptr() as *const _))
            };
            let mins = [min_pair(0), min_pair(1), min_pair(2), min_pair(3)];
            for m in 0..M {
                let block = (first + m) * blocks + b;
                let mut min_sum = _mm512_setzero_si512();
                for (q, &mins) in mins.iter().enumerate() {
                    let sums = _mm512_set1_epi32(acts.pair_sums[block * 4 + q]);
                    min_sum = _mm512_dpwssd_epi32(min_sum, mins, sums);
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

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    use super::{Activations, TileBlock, BLOCK, TILE_ROWS};

    /// [`super::dot_reference`] for 16 rows, as two halves of 8, and `M` tokens from `first`.
    /// Per sub-block and row, `vpmaddubsw` pair sums of the 8 value groups add up in 16 bits
    /// (exact, see the module), and `vpmaddwd` by the scale in both halves of the row's word
    /// pair gives the reference's `Σ sc·Σ qa` term; the rest is the reference's arithmetic.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn tile_dot<const M: usize>(
        tile: &[TileBlock],
        acts: &Activations,
        first: usize,
        sums: &mut [[f32; TILE_ROWS]],
    ) {
        let blocks = acts.cols / BLOCK;
        let low_nibbles = _mm256_set1_epi8(0x0F);
        let mut acc = [[_mm256_setzero_ps(); M]; 2];
        for (b, tb) in tile.iter().enumerate() {
            let quants = |m: usize| {
                acts.quants.as_ptr().add(((first + m) * blocks + b) * BLOCK) as *const i32
            };
            for (half, acc) in acc.iter_mut().enumerate() {
                let rows = 8 * half;
                // Row r's scale in both 16-bit halves of its 32-bit lane.
                let scales = |s: usize| {
                    let sc = _mm_cvtepu8_epi16(_mm_loadl_epi64(
                        tb.scales[s].as_ptr().add(rows) as *const __m128i
                    ));
                    _mm256_set_m128i(_mm_unpackhi_epi16(sc, sc), _mm_unpacklo_epi16(sc, sc))
                };
                let mut scaled = [_mm256_setzero_si256(); M];
                for p in 0..4 {
                    let mut lo = [_mm256_setzero_si256(); M];
                    let mut hi = [_mm256_setzero_si256(); M];
                    for g in 0..8 {
                        let at = tb.quants.as_ptr().add((p * 8 + g) * 64 + 4 * rows);
                        let w = _mm256_load_si256(at as *const __m256i);
                        let w_lo = _mm256_and_si256(w, low_nibbles);
                        let w_hi = _mm256_and_si256(_mm256_srli_epi16(w, 4), low_nibbles);
                        for m in 0..M {
                            let qs = quants(m).add(16 * p + g);
                            let a_lo = _mm256_set1_epi32(qs.read_unaligned());
                            let a_hi = _mm256_set1_epi32(qs.add(8).read_unaligned());
                            lo[m] = _mm256_add_epi16(lo[m], _mm256_maddubs_epi16(w_lo, a_lo));
                            hi[m] = _mm256_add_epi16(hi[m], _mm256_maddubs_epi16(w_hi, a_hi));
                        }
                    }
                    let (sc_lo, sc_hi) = (scales(2 * p), scales(2 * p + 1));
                    for m in 0..M {
                        let both = _mm256_add_epi32(
                            _mm256_madd_epi16(lo[m], sc_lo),
                            _mm256_madd_epi16(hi[m], sc_hi),
                        );
                        scaled[m] = _mm256_add_epi32(scaled[m], both);
                    }
                }
                let f16s = |v: &[half::f16; TILE_ROWS]| {
                    _mm256_cvtph_ps(_mm_loadu_si128(v.as_ptr().add(rows) as *const __m128i))
                };
                let (d, dmin) = (f16s(&tb.d), f16s(&tb.dmin));
                let min_pair = |q: usize| {
                    let at = tb.min_pairs[q].as_ptr().add(2 * rows);
                    _mm256_cvtepu8_epi16(_mm_load_si128(at as *const __m128i))
                };
                let mins = [min_pair(0), min_pair(1), min_pair(2), min_pair(3)];
                for m in 0..M {
                    let block = (first + m) * blocks + b;
                    let mut min_sum = _mm256_setzero_si256();
                    for (q, &mins) in mins.iter().enumerate() {
                        let sums = _mm256_set1_epi32(acts.pair_sums[block * 4 + q]);
                        min_sum = _mm256_add_epi32(min_sum, _mm256_madd_epi16(mins, sums));
                    }
                    let dx = _mm256_set1_ps(acts.d[block]);
                    let scaled = _mm256_cvtepi32_ps(scaled[m]);
                    acc[m] = _mm256_fmadd_ps(scaled, _mm256_mul_ps(d, dx), acc[m]);
                    let min_sum = _mm256_cvtepi32_ps(min_sum);
                    acc[m] = _mm256_fnmadd_ps(min_sum, _mm256_mul_ps(dmin, dx), acc[m]);
                }
            }
        }
        for (half, acc) in acc.iter().enumerate() {
            for m in 0..M {
                _mm256_storeu_ps(sums[m].as_mut_ptr().add(8 * half), acc[m]);
            }
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
    fn every_kernel_copy_gives_the_reference_bits_alone_or_in_a_batch() {
        for (rows, cols, seed) in [(48, 768, 11), (16, 256, 3)] {
            let q = quantized(rows, cols, seed);
            let m = Q4KMatrix::new(rows, cols, &q.data().unwrap()).unwrap();
            let blocks = cols / BLOCK;
            let reference = |acts: &Activations| {
                let tokens = acts.tokens();
                let row = |t, r: usize| {
                    dot_reference(
                        &m.tiles[(r / TILE_ROWS) * blocks..][..blocks],
                        acts,
                        t,
                        r % TILE_ROWS,
                    )
                };
                (0..tokens).map(|t| (0..rows).map(|r| row(t, r)).collect()).collect()
            };
            crate::k_quants::assert_copies_give_the_reference_in_any_batch(
                rows,
                cols,
                |x, kernel| m.product(x, kernel),
                reference,
            );
        }
    }

    #[test]
    fn a_tokens_bits_in_a_pass_of_one_to_eight_tokens_are_its_bits_alone() {
        let (rows, cols) = (32, 512);
        let q = quantized(rows, cols, 13);
        let m = Q4KMatrix::new(rows, cols, &q.data().unwrap()).unwrap();
        let blocks = cols / BLOCK;
        for tile in 0..rows / TILE_ROWS {
            let tile = &m.tiles[tile * blocks..][..blocks];
            crate::k_quants::assert_a_tokens_bits_in_a_pass_are_its_bits_alone(
                cols,
                |kernel, acts, first, group, sums| tile_dot(kernel, tile, acts, first, group, sums),
            );
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

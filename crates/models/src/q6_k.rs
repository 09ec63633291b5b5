//! Q6_K weights × 8-bit activations with AVX-512 VNNI or AVX2 (other CPUs keep candle's
//! kernels, which decoded Qwen2.5-1.5B's Q6_K LM head and down projections at about
//! half the speed of our Q4_K tiles: 37% of its decode time for a third of its bytes).
//!
//! A Q6_K value is `d · sc · (q − 32)`: `q` has 6 bits, `sc` is a signed 8-bit scale per 16
//! values and `d` one f16 per 256. Per 16-value sub-block the kernel starts from `−32·Σa` and
//! adds `Σ q·a` with `vpdpbusd`, scales that by `sc` in integers (all exact), and runs float
//! arithmetic once per block: `acc += d·dₓ·Σ sc·(Σ q·a − 32·Σ a)`. The portable
//! [`dot_reference`] performs the same operations and gives the same bits (tested), and a
//! token's results do not depend on the tokens beside it.
//!
//! The AVX2 copy adds two `vpmaddubsw` products in 16 bits (at most 2·2·63·127 = 32004, exact)
//! and scales them with one `vpmaddwd`; the `−32·Σa` terms, scaled, come once per block from
//! word pairs of sub-block sums. Integer sums are exact and wrap as the reference's, so the
//! order does not change a bit.

use candle_core::Tensor;
use half::f16;

use crate::error::{ModelError, Result};
use crate::huge_pages;
use crate::isa::Isa;
use crate::k_quants::{best_copy, fits, tiled_product, Activations, TileSums, BLOCK, TILE_ROWS};

/// Bytes of a Q6_K block: 128 of low nibbles, 64 of high bit pairs, 16 scales, `d`.
const BLOCK_BYTES: usize = 210;
/// Values per scale.
const SUB_BLOCK: usize = 16;
const SUB_BLOCKS: usize = BLOCK / SUB_BLOCK;

/// One block of 16 weight rows, laid out for `vpdpbusd`: 64 bytes hold 4 consecutive values of
/// each row. Value group `g` is values `4g..4g + 4`. The three 64-byte vectors one step of the
/// kernel reads lie side by side, so the block is read front to back (spread apart, they made
/// three streams the prefetcher followed badly: 2.9× Q4_K's time per byte in decode).
#[repr(C, align(64))]
#[derive(Clone)]
struct TileBlock {
    /// Per step `g < 16`: the low nibbles of groups `g` and `g + 16` (see [`Self::low_at`]),
    /// then the high bit pairs of step `g` (see [`Self::high_at`]).
    quants: [u8; 3 * 16 * 64],
    /// `[sub-block][row]`.
    scales: [[i8; TILE_ROWS]; SUB_BLOCKS],
    d: [f16; TILE_ROWS],
}

impl TileBlock {
    /// Where `[row · 4 + j]` holds the low 4 bits of value `4g + j` (low nibble) and of value
    /// `128 + 4g + j` (high nibble), `g < 32`.
    fn low_at(g: usize) -> usize {
        (g % 16) * 192 + (g / 16) * 64
    }

    /// Where `[row · 4 + j]` holds the top 2 bits of values `4g + j`, `64 + 4g + j`,
    /// `128 + 4g + j` and `192 + 4g + j` at bits 0, 2, 4 and 6, `g < 16`.
    fn high_at(g: usize) -> usize {
        g * 192 + 128
    }
}

/// A Q6_K matrix of `rows` outputs × `cols` inputs, repacked into 16-row tiles.
pub struct Q6KMatrix {
    rows: usize,
    cols: usize,
    /// `[tile · blocks_per_row + block]`
    tiles: Vec<TileBlock>,
}

impl Q6KMatrix {
    /// `data` in GGUF's Q6_K layout.
    pub fn new(rows: usize, cols: usize, data: &[u8]) -> Result<Self> {
        let blocks = cols / BLOCK;
        if !fits(rows, cols) || data.len() != rows * blocks * BLOCK_BYTES {
            return Err(ModelError::BadConfig(format!(
                "Q6_K tensor of {rows}x{cols} with {} bytes does not tile",
                data.len()
            )));
        }
        let row_bytes = blocks * BLOCK_BYTES;
        let tiles = huge_pages::collect(
            rows / TILE_ROWS * blocks,
            (0..rows / TILE_ROWS).flat_map(|t| (0..blocks).map(move |b| (t, b))).map(|(t, b)| {
                pack_tile_block(|r| {
                    let at = (t * TILE_ROWS + r) * row_bytes + b * BLOCK_BYTES;
                    &data[at..at + BLOCK_BYTES]
                })
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
        let tile_dot = |tile: usize,
                        acts: &Activations,
                        sub_sums: &SubBlockSums,
                        first,
                        group,
                        sums: &mut TileSums| {
            let tile = &self.tiles[tile * blocks..][..blocks];
            tile_dot(kernel, tile, acts, sub_sums, first, group, sums)
        };
        tiled_product(x, self.rows, self.cols, "q6_k matmul", SubBlockSums::of, tile_dot)
    }
}

/// A GGUF Q6_K block's value `v` as `(6-bit quant, sub-block)`.
fn gguf_value(block: &[u8], v: usize) -> u8 {
    let (ql, qh) = (&block[..128], &block[128..192]);
    let (half, k, l) = (v / 128, v % 128 / 32, v % 32);
    let low = (ql[half * 64 + l + 32 * (k & 1)] >> (4 * (k >> 1))) & 0x0F;
    let high = (qh[half * 32 + l] >> (2 * k)) & 3;
    low | (high << 4)
}

fn pack_tile_block<'a>(gguf_block: impl Fn(usize) -> &'a [u8]) -> TileBlock {
    let mut tile = TileBlock {
        quants: [0; 3 * 16 * 64],
        scales: [[0; TILE_ROWS]; SUB_BLOCKS],
        d: [f16::ZERO; TILE_ROWS],
    };
    for r in 0..TILE_ROWS {
        let block = gguf_block(r);
        tile.d[r] = f16::from_le_bytes([block[208], block[209]]);
        for (s, scales) in tile.scales.iter_mut().enumerate() {
            scales[r] = block[192 + s] as i8;
        }
        let q = |v: usize| gguf_value(block, v);
        for g in 0..32 {
            for j in 0..4 {
                let v = 4 * g + j;
                tile.quants[TileBlock::low_at(g) + r * 4 + j] =
                    (q(v) & 0x0F) | ((q(128 + v) & 0x0F) << 4);
            }
        }
        for g in 0..16 {
            for j in 0..4 {
                let v = 4 * g + j;
                let bits = (0..4).map(|k| (q(64 * k + v) >> 4) << (2 * k));
                tile.quants[TileBlock::high_at(g) + r * 4 + j] = bits.fold(0, |a, b| a | b);
            }
        }
    }
    tile
}

/// `−32 · Σ a` per token, block and sub-block of the activations: where each sub-block's
/// integer sum starts.
struct SubBlockSums {
    /// `[token · blocks · 16 + block · 16 + sub-block]`
    offsets: Vec<i32>,
    /// `Σ a` of sub-blocks `2q` (low half) and `2q + 1` (high half) as an i16 pair (at most
    /// 16·127 each), `[token · blocks · 8 + block · 8 + q]`: the AVX2 copy's word products.
    #[cfg(target_arch = "x86_64")]
    pairs: Vec<i32>,
}

impl SubBlockSums {
    fn of(acts: &Activations) -> Self {
        let sums: Vec<i32> = acts
            .quants
            .chunks_exact(SUB_BLOCK)
            .map(|s| s.iter().map(|&q| q as i32).sum())
            .collect();
        Self {
            offsets: sums.iter().map(|s| -32 * s).collect(),
            #[cfg(target_arch = "x86_64")]
            pairs: sums.chunks_exact(2).map(|p| (p[0] & 0xFFFF) | (p[1] << 16)).collect(),
        }
    }
}

/// `sums[t][r]` = row `r` of `tile` · token `first + t`, for `group` tokens, on `kernel`.
fn tile_dot(
    kernel: Isa,
    tile: &[TileBlock],
    acts: &Activations,
    sub_sums: &SubBlockSums,
    first: usize,
    group: usize,
    sums: &mut TileSums,
) {
    debug_assert_eq!(kernel, kernel.for_integer_dots(), "not a copy of the integer kernels");
    // Passes of at most 4 tokens on every copy: at 8 the AVX-512 kernel spills its 4 sums per
    // token and the AVX2 one has no registers left for them; a sub-block-order AVX-512 kernel
    // for 5–8 measured within the noise (~7 % at best).
    for start in (0..group).step_by(4) {
        let (first, sums, tokens) = (first + start, &mut sums[start..], (group - start).min(4));
        match kernel {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: `Isa::for_integer_dots` chose this copy for a CPU with its features.
            Isa::Avx512 => unsafe {
                match tokens {
                    1 => vnni::tile_dot::<1>(tile, acts, sub_sums, first, sums),
                    2 => vnni::tile_dot::<2>(tile, acts, sub_sums, first, sums),
                    3 => vnni::tile_dot::<3>(tile, acts, sub_sums, first, sums),
                    _ => vnni::tile_dot::<4>(tile, acts, sub_sums, first, sums),
                }
            },
            #[cfg(target_arch = "x86_64")]
            // SAFETY: as above.
            Isa::Avx2 => unsafe {
                match tokens {
                    1 => avx2::tile_dot::<1>(tile, acts, sub_sums, first, sums),
                    2 => avx2::tile_dot::<2>(tile, acts, sub_sums, first, sums),
                    3 => avx2::tile_dot::<3>(tile, acts, sub_sums, first, sums),
                    _ => avx2::tile_dot::<4>(tile, acts, sub_sums, first, sums),
                }
            },
            _ => {
                for (t, row_sums) in sums[..tokens].iter_mut().enumerate() {
                    for (r, v) in row_sums.iter_mut().enumerate() {
                        *v = dot_reference(tile, acts, sub_sums, first + t, r);
                    }
                }
            }
        }
    }
}

/// Row `r` of `tile` · token `token`, in the kernel's operations and order.
fn dot_reference(
    tile: &[TileBlock],
    acts: &Activations,
    sub_sums: &SubBlockSums,
    token: usize,
    r: usize,
) -> f32 {
    let blocks = acts.cols / BLOCK;
    let mut acc = 0f32;
    for (b, tb) in tile.iter().enumerate() {
        let block = token * blocks + b;
        let a = &acts.quants[block * BLOCK..(block + 1) * BLOCK];
        let mut scaled = 0i32;
        for s in 0..SUB_BLOCKS {
            let mut dot = sub_sums.offsets[block * SUB_BLOCKS + s];
            for (v, &a) in a.iter().enumerate().skip(s * SUB_BLOCK).take(SUB_BLOCK) {
                let (g, j) = (v % 128 / 4, v % 4);
                let low = tb.quants[TileBlock::low_at(g) + r * 4 + j] >> (4 * (v / 128)) & 0x0F;
                let high = tb.quants[TileBlock::high_at(g % 16) + r * 4 + j] >> (2 * (v / 64)) & 3;
                dot += (low | high << 4) as i32 * a as i32;
            }
            scaled = scaled.wrapping_add(dot.wrapping_mul(tb.scales[s][r] as i32));
        }
        acc = (scaled as f32).mul_add(tb.d[r].to_f32() * acts.d[block], acc);
    }
    acc
}

#[cfg(target_arch = "x86_64")]
mod vnni {
    use std::arch::x86_64::*;

    use super::{Activations, SubBlockSums, TileBlock, BLOCK, SUB_BLOCKS, TILE_ROWS};

    /// [`super::dot_reference`] for 16 rows and `M` tokens from `first`. A pass over value
    /// groups `g`, `g + 16`, `g + 32` and `g + 48` (sub-blocks `s`, `s + 4`, `s + 8`, `s + 12`
    /// for `s = g / 4`) loads two bytes of low nibbles and one of high bit pairs per row and
    /// value, and unpacks them once for all `M` tokens.
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    pub unsafe fn tile_dot<const M: usize>(
        tile: &[TileBlock],
        acts: &Activations,
        sub_sums: &SubBlockSums,
        first: usize,
        sums: &mut [[f32; TILE_ROWS]],
    ) {
        let blocks = acts.cols / BLOCK;
        let nibble = _mm512_set1_epi8(0x0F);
        let pair = _mm512_set1_epi8(0x30);
        let mut acc = [_mm512_setzero_ps(); M];
        for (b, tb) in tile.iter().enumerate() {
            let mut scaled = [_mm512_setzero_si512(); M];
            for s in 0..4 {
                // Sub-blocks s, s + 4, s + 8, s + 12 per token.
                let mut dots = [[_mm512_setzero_si512(); 4]; M];
                for (m, dots) in dots.iter_mut().enumerate() {
                    let offsets = &sub_sums.offsets[((first + m) * blocks + b) * SUB_BLOCKS..];
                    for (k, dot) in dots.iter_mut().enumerate() {
                        *dot = _mm512_set1_epi32(offsets[4 * k + s]);
                    }
                }
                for g in 4 * s..4 * s + 4 {
                    let at = |offset| tb.quants.as_ptr().add(offset) as *const __m512i;
                    let low_a = _mm512_load_si512(at(TileBlock::low_at(g)));
                    let low_b = _mm512_load_si512(at(TileBlock::low_at(g + 16)));
                    let high = _mm512_load_si512(at(TileBlock::high_at(g)));
                    // `a | (b & c)`: a nibble and a high pair moved to bits 4–5.
                    let join = |low, high| _mm512_ternarylogic_epi32::<0xF8>(low, high, pair);
                    let q = [
                        join(_mm512_and_si512(low_a, nibble), _mm512_slli_epi16(high, 4)),
                        join(_mm512_and_si512(low_b, nibble), _mm512_slli_epi16(high, 2)),
                        join(_mm512_and_si512(_mm512_srli_epi16(low_a, 4), nibble), high),
                        join(
                            _mm512_and_si512(_mm512_srli_epi16(low_b, 4), nibble),
                            _mm512_srli_epi16(high, 2),
                        ),
                    ];
                    for (m, dots) in dots.iter_mut().enumerate() {
                        let token = ((first + m) * blocks + b) * BLOCK;
                        for (k, dot) in dots.iter_mut().enumerate() {
                            let a = acts.quants.as_ptr().add(token + 64 * k + 4 * g);
                            let a = _mm512_set1_epi32((a as *const i32).read_unaligned());
                            *dot = _mm512_dpbusd_epi32(*dot, q[k], a);
                        }
                    }
                }
                for k in 0..4 {
                    let sc = tb.scales[4 * k + s].as_ptr() as *const __m128i;
                    let sc = _mm512_cvtepi8_epi32(_mm_loadu_si128(sc));
                    for (scaled, dots) in scaled.iter_mut().zip(&dots) {
                        *scaled = _mm512_add_epi32(*scaled, _mm512_mullo_epi32(dots[k], sc));
                    }
                }
            }
            let d = _mm512_cvtph_ps(_mm256_loadu_si256(tb.d.as_ptr() as *const _));
            for m in 0..M {
                let dx = _mm512_set1_ps(acts.d[(first + m) * blocks + b]);
                acc[m] =
                    _mm512_fmadd_ps(_mm512_cvtepi32_ps(scaled[m]), _mm512_mul_ps(d, dx), acc[m]);
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

    use super::{Activations, SubBlockSums, TileBlock, BLOCK, SUB_BLOCKS, TILE_ROWS};

    /// [`super::dot_reference`] for 16 rows, as two halves of 8, and `M` tokens from `first`.
    /// Sub-block `4k + s` holds value groups `g = 4s..4s + 4` of quant set `k` (values
    /// `64k + 4g..64k + 4g + 4`): each is unpacked once for all `M` tokens, its `vpmaddubsw`
    /// products added in 16 bits by pairs and scaled by `vpmaddwd` (see the module).
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn tile_dot<const M: usize>(
        tile: &[TileBlock],
        acts: &Activations,
        sub_sums: &SubBlockSums,
        first: usize,
        sums: &mut [[f32; TILE_ROWS]],
    ) {
        let blocks = acts.cols / BLOCK;
        let nibble = _mm256_set1_epi8(0x0F);
        let pair = _mm256_set1_epi8(0x30);
        let mut acc = [[_mm256_setzero_ps(); M]; 2];
        for (b, tb) in tile.iter().enumerate() {
            let block = |m: usize| (first + m) * blocks + b;
            for (half, acc) in acc.iter_mut().enumerate() {
                let rows = 8 * half;
                let load = |at: usize| {
                    _mm256_load_si256(tb.quants.as_ptr().add(at + 4 * rows) as *const __m256i)
                };
                let scales = |s: usize| {
                    let sc = tb.scales[s].as_ptr().add(rows) as *const __m128i;
                    _mm_cvtepi8_epi16(_mm_loadl_epi64(sc))
                };
                // Value group g of quant set k: a nibble joined with its high pair (bits 4–5).
                let quants = |k: usize, g: usize| {
                    let low = load(TileBlock::low_at(g + 16 * (k & 1)));
                    let low = if k < 2 { low } else { _mm256_srli_epi16(low, 4) };
                    let high = load(TileBlock::high_at(g));
                    let high = match k {
                        0 => _mm256_slli_epi16(high, 4),
                        1 => _mm256_slli_epi16(high, 2),
                        2 => high,
                        _ => _mm256_srli_epi16(high, 2),
                    };
                    _mm256_or_si256(_mm256_and_si256(low, nibble), _mm256_and_si256(high, pair))
                };
                let mut scaled = [_mm256_setzero_si256(); M];
                for sub in 0..SUB_BLOCKS {
                    let (k, s) = (sub / 4, sub % 4);
                    // Row r's scale in both 16-bit halves of its 32-bit lane.
                    let sc = scales(sub);
                    let sc =
                        _mm256_set_m128i(_mm_unpackhi_epi16(sc, sc), _mm_unpacklo_epi16(sc, sc));
                    for g in (4 * s..4 * s + 4).step_by(2) {
                        let (q0, q1) = (quants(k, g), quants(k, g + 1));
                        for (m, scaled) in scaled.iter_mut().enumerate() {
                            let a = acts.quants.as_ptr().add(block(m) * BLOCK + 64 * k + 4 * g);
                            let a = a as *const i32;
                            let a0 = _mm256_set1_epi32(a.read_unaligned());
                            let a1 = _mm256_set1_epi32(a.add(1).read_unaligned());
                            let two = _mm256_add_epi16(
                                _mm256_maddubs_epi16(q0, a0),
                                _mm256_maddubs_epi16(q1, a1),
                            );
                            *scaled = _mm256_add_epi32(*scaled, _mm256_madd_epi16(two, sc));
                        }
                    }
                }
                // Σ sc·Σa per row: scales of sub-blocks 2q and 2q + 1 as the row's word pair.
                let sc_pairs: [__m256i; SUB_BLOCKS / 2] = std::array::from_fn(|q| {
                    let (even, odd) = (scales(2 * q), scales(2 * q + 1));
                    _mm256_set_m128i(_mm_unpackhi_epi16(even, odd), _mm_unpacklo_epi16(even, odd))
                });
                let d = _mm256_cvtph_ps(_mm_loadu_si128(tb.d.as_ptr().add(rows) as *const _));
                for m in 0..M {
                    let pairs = &sub_sums.pairs[block(m) * SUB_BLOCKS / 2..];
                    let mut offset = _mm256_setzero_si256();
                    for (q, sc_pair) in sc_pairs.iter().enumerate() {
                        let sums = _mm256_set1_epi32(pairs[q]);
                        offset = _mm256_add_epi32(offset, _mm256_madd_epi16(*sc_pair, sums));
                    }
                    let scaled = _mm256_sub_epi32(scaled[m], _mm256_slli_epi32(offset, 5));
                    let dx = _mm256_set1_ps(acts.d[block(m)]);
                    acc[m] =
                        _mm256_fmadd_ps(_mm256_cvtepi32_ps(scaled), _mm256_mul_ps(d, dx), acc[m]);
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
        QTensor::quantize(&w, GgmlDType::Q6K).unwrap()
    }

    #[test]
    fn tiles_hold_the_values_candle_dequantizes() {
        let (rows, cols) = (32, 512);
        let q = quantized(rows, cols, 5);
        let m = Q6KMatrix::new(rows, cols, &q.data().unwrap()).unwrap();
        let dense = q.dequantize(&Device::Cpu).unwrap().to_vec2::<f32>().unwrap();
        let blocks = cols / BLOCK;
        for (row, want) in dense.iter().enumerate() {
            for (c, want) in want.iter().enumerate() {
                let tb = &m.tiles[(row / TILE_ROWS) * blocks + c / BLOCK];
                let (r, v) = (row % TILE_ROWS, c % BLOCK);
                let (g, j) = (v % 128 / 4, v % 4);
                let low = tb.quants[TileBlock::low_at(g) + r * 4 + j] >> (4 * (v / 128)) & 0x0F;
                let high = tb.quants[TileBlock::high_at(g % 16) + r * 4 + j] >> (2 * (v / 64)) & 3;
                let q = (low | high << 4) as i32 - 32;
                let got = tb.d[r].to_f32() * (tb.scales[v / SUB_BLOCK][r] as i32 * q) as f32;
                assert_eq!(got, *want, "row {row}, column {c}");
            }
        }
    }

    #[test]
    fn matches_the_dequantized_product_within_activation_rounding() {
        let q = quantized(32, 512, 7);
        let ours = Q6KMatrix::new(32, 512, &q.data().unwrap()).unwrap();
        crate::k_quants::assert_within_activation_rounding(&q, |x| ours.forward(x));
    }

    #[test]
    fn every_kernel_copy_gives_the_reference_bits_alone_or_in_a_batch() {
        for (rows, cols, seed) in [(48, 768, 11), (16, 256, 3)] {
            let q = quantized(rows, cols, seed);
            let m = Q6KMatrix::new(rows, cols, &q.data().unwrap()).unwrap();
            let blocks = cols / BLOCK;
            let reference = |acts: &Activations| {
                let sub_sums = SubBlockSums::of(acts);
                let row = |t, r: usize| {
                    let tiles = &m.tiles[(r / TILE_ROWS) * blocks..][..blocks];
                    dot_reference(tiles, acts, &sub_sums, t, r % TILE_ROWS)
                };
                (0..acts.tokens()).map(|t| (0..rows).map(|r| row(t, r)).collect()).collect()
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
        let m = Q6KMatrix::new(rows, cols, &q.data().unwrap()).unwrap();
        let blocks = cols / BLOCK;
        for tile in 0..rows / TILE_ROWS {
            let tile = &m.tiles[tile * blocks..][..blocks];
            crate::k_quants::assert_a_tokens_bits_in_a_pass_are_its_bits_alone(
                cols,
                |kernel, acts, first, group, sums| {
                    let sub_sums = SubBlockSums::of(acts);
                    tile_dot(kernel, tile, acts, &sub_sums, first, group, sums)
                },
            );
        }
    }

    #[test]
    fn shapes_that_do_not_tile_are_refused() {
        assert!(Q6KMatrix::new(16, 256, &[0; 10]).is_err());
        assert!(Q6KMatrix::new(24, 256, &[0; 24 * BLOCK_BYTES]).is_err());
        let q = quantized(16, 256, 1);
        let m = Q6KMatrix::new(16, 256, &q.data().unwrap()).unwrap();
        let wrong = Tensor::zeros((2, 512), candle_core::DType::F32, &Device::Cpu).unwrap();
        assert!(m.forward(&wrong).is_err());
    }
}

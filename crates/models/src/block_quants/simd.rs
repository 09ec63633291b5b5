//! The tile kernels with AVX-512 VNNI and with AVX2: the same exact integer block sums as
//! [`super::row_dot`] and the same float steps per block, so the same bits.

#![cfg(target_arch = "x86_64")]

use std::arch::x86_64::*;

use super::{Activations, BlockFormat, Tile, TileLayout, BLOCK, GROUP, GROUP_BYTES, TILE_ROWS};

/// [`super::tile_dot`] with `vpdpbusd` on whole tiles.
///
/// # Safety
/// The CPU has AVX-512F, AVX-512BW and AVX-512 VNNI (and F16C).
pub(super) unsafe fn vnni_tile_dot(
    tile: Tile<'_>,
    acts: &Activations,
    first: usize,
    group: usize,
    sums: &mut [[f32; TILE_ROWS]; GROUP],
) {
    let Tile { format, layout, bytes: tile } = tile;
    // SAFETY: the caller's promise.
    unsafe {
        match group {
            1 => vnni::<1>(format, layout, tile, acts, first, sums),
            2 => vnni::<2>(format, layout, tile, acts, first, sums),
            3 => vnni::<3>(format, layout, tile, acts, first, sums),
            4 => vnni::<4>(format, layout, tile, acts, first, sums),
            5 => vnni::<5>(format, layout, tile, acts, first, sums),
            6 => vnni::<6>(format, layout, tile, acts, first, sums),
            7 => vnni::<7>(format, layout, tile, acts, first, sums),
            _ => vnni::<GROUP>(format, layout, tile, acts, first, sums),
        }
    }
}

/// [`super::tile_dot`] with `vpmaddubsw` on 8-row halves.
///
/// # Safety
/// The CPU has AVX2, FMA and F16C.
pub(super) unsafe fn avx2_tile_dot(
    tile: Tile<'_>,
    acts: &Activations,
    first: usize,
    group: usize,
    sums: &mut [[f32; TILE_ROWS]; GROUP],
) {
    let Tile { format, layout, bytes: tile } = tile;
    check(layout, tile, acts, first, group);
    let tokens = Tokens { acts, first, count: group };
    let bias = format.bias();
    // SAFETY: the caller's promise.
    unsafe {
        match format {
            BlockFormat::Q8_0 => {
                for start in (0..group).step_by(4) {
                    let (first, sums) = (first + start, &mut sums[start..]);
                    match group - start {
                        1 => avx2_q8_0::<1>(layout, tile, acts, first, sums),
                        2 => avx2_q8_0::<2>(layout, tile, acts, first, sums),
                        3 => avx2_q8_0::<3>(layout, tile, acts, first, sums),
                        _ => avx2_q8_0::<4>(layout, tile, acts, first, sums),
                    }
                }
            }
            BlockFormat::Q4_0 => avx2_nibbles::<false, false>(layout, tile, bias, tokens, sums),
            BlockFormat::Q4_1 => avx2_nibbles::<false, true>(layout, tile, bias, tokens, sums),
            BlockFormat::Q5_0 => avx2_nibbles::<true, false>(layout, tile, bias, tokens, sums),
            BlockFormat::Q5_1 => avx2_nibbles::<true, true>(layout, tile, bias, tokens, sums),
        }
    }
}

/// Checks what the kernels read without bounds checks.
fn check(layout: TileLayout, tile: &[u8], acts: &Activations, first: usize, tokens: usize) {
    assert!(
        tile.len() == acts.cols / BLOCK * layout.bytes && first + tokens <= acts.tokens(),
        "tile kernel: operands do not match"
    );
}

/// `M` tokens from `first`. Each unpacked group of weights serves all `M`; a block's products
/// go to two integer sums per token (low and high half of the block) to keep two chains busy.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,f16c")]
unsafe fn vnni<const M: usize>(
    format: BlockFormat,
    layout: TileLayout,
    tile: &[u8],
    acts: &Activations,
    first: usize,
    sums: &mut [[f32; TILE_ROWS]; GROUP],
) {
    check(layout, tile, acts, first, M);
    let (fifth, minimum, bias) = (format.has_fifth_bits(), format.has_minimum(), format.bias());
    let low_nibbles = _mm512_set1_epi8(0x0F);
    let bit4 = _mm512_set1_epi8(0x10);
    let sign_bits = _mm512_set1_epi8(i8::MIN);
    let mut acc = [_mm512_setzero_ps(); M];
    for b in 0..acts.cols / BLOCK {
        let tb = tile.as_ptr().add(b * layout.bytes);
        let load = |at: usize| _mm512_loadu_si512(tb.add(at) as *const _);
        let quants = |m: usize| acts.quants.as_ptr().add(acts.block(first + m, b) * BLOCK);
        let broadcast = |at: *const i8| _mm512_set1_epi32((at as *const i32).read_unaligned());
        let (mut low_sums, mut high_sums) =
            ([_mm512_setzero_si512(); M], [_mm512_setzero_si512(); M]);
        let bits = if fifth { load(layout.fifth_at) } else { _mm512_setzero_si512() };
        for g in 0..4 {
            // Values 4g..4g+4 and 16+4g..16+4g+4 of every row, as unsigned bytes.
            let (low, high) = if format.nibbles() {
                let w = load(g * GROUP_BYTES);
                let mut low = _mm512_and_si512(w, low_nibbles);
                let mut high = _mm512_and_si512(_mm512_srli_epi16::<4>(w), low_nibbles);
                if fifth {
                    // x | (bits & 0x10) after moving bit g (low) or 4 + g (high) to bit 4.
                    let up = _mm512_sll_epi16(bits, _mm_cvtsi32_si128(4 - g as i32));
                    let down = _mm512_srl_epi16(bits, _mm_cvtsi32_si128(g as i32));
                    low = _mm512_ternarylogic_epi32::<0xF8>(low, up, bit4);
                    high = _mm512_ternarylogic_epi32::<0xF8>(high, down, bit4);
                }
                (low, high)
            } else {
                // Signed bytes with the sign bit flipped: the value + 128.
                let low = _mm512_xor_si512(load(g * GROUP_BYTES), sign_bits);
                (low, _mm512_xor_si512(load((4 + g) * GROUP_BYTES), sign_bits))
            };
            for m in 0..M {
                let q = quants(m).add(4 * g);
                low_sums[m] = _mm512_dpbusd_epi32(low_sums[m], low, broadcast(q));
                high_sums[m] = _mm512_dpbusd_epi32(high_sums[m], high, broadcast(q.add(16)));
            }
        }
        let d = _mm512_cvtph_ps(_mm256_loadu_si256(tb.add(layout.scales_at) as *const _));
        let minima = if minimum {
            _mm512_cvtph_ps(_mm256_loadu_si256(tb.add(layout.minima_at) as *const _))
        } else {
            _mm512_setzero_ps()
        };
        for m in 0..M {
            let at = acts.block(first + m, b);
            let dot = _mm512_sub_epi32(
                _mm512_add_epi32(low_sums[m], high_sums[m]),
                _mm512_set1_epi32(bias * acts.sums[at]),
            );
            let scale = _mm512_mul_ps(d, _mm512_set1_ps(acts.d[at]));
            acc[m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), scale, acc[m]);
            if minimum {
                acc[m] = _mm512_fmadd_ps(minima, _mm512_set1_ps(acts.s[at]), acc[m]);
            }
        }
    }
    for m in 0..M {
        _mm512_storeu_ps(sums[m].as_mut_ptr(), acc[m]);
    }
}

/// The tokens one pass over a tile serves: `first..first + count`.
#[derive(Clone, Copy)]
struct Tokens<'a> {
    acts: &'a Activations,
    first: usize,
    count: usize,
}

/// Nibble formats on AVX2, rows 0..8 then 8..16 of each block: the half's 8 value groups are
/// unpacked once into registers and serve every token of the pass in turn (a verification pass
/// of a few draft rows pays the unpacking, fifth bits included, once). Per token, the four
/// `vpmaddubsw` pair sums of the low values add up in 16 bits, as do the high ones: at most
/// 4·2·31·127 = 31496, exact. One `vpmaddwd` per half widens them.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn avx2_nibbles<const FIFTH: bool, const MINIMUM: bool>(
    layout: TileLayout,
    tile: &[u8],
    bias: i32,
    tokens: Tokens<'_>,
    sums: &mut [[f32; TILE_ROWS]; GROUP],
) {
    let Tokens { acts, first, count } = tokens;
    let low_nibbles = _mm256_set1_epi8(0x0F);
    let bit4 = _mm256_set1_epi8(0x10);
    let ones = _mm256_set1_epi16(1);
    let mut acc = [[_mm256_setzero_ps(); 2]; GROUP];
    for b in 0..acts.cols / BLOCK {
        let tb = tile.as_ptr().add(b * layout.bytes);
        for half in 0..2 {
            let load =
                |at: usize| _mm256_loadu_si256(tb.add(at + half * GROUP_BYTES / 2) as *const _);
            let bits = if FIFTH { load(layout.fifth_at) } else { _mm256_setzero_si256() };
            // Values 4g..4g+4 (low) and 16+4g..16+4g+4 (high) of the 8 rows, unsigned.
            let (mut low, mut high) = ([_mm256_setzero_si256(); 4], [_mm256_setzero_si256(); 4]);
            for g in 0..4 {
                let w = load(g * GROUP_BYTES);
                low[g] = _mm256_and_si256(w, low_nibbles);
                high[g] = _mm256_and_si256(_mm256_srli_epi16::<4>(w), low_nibbles);
                if FIFTH {
                    // Bit g (low) or 4 + g (high) moved to bit 4.
                    let up = _mm256_sll_epi16(bits, _mm_cvtsi32_si128(4 - g as i32));
                    let down = _mm256_srl_epi16(bits, _mm_cvtsi32_si128(g as i32));
                    low[g] = _mm256_or_si256(low[g], _mm256_and_si256(up, bit4));
                    high[g] = _mm256_or_si256(high[g], _mm256_and_si256(down, bit4));
                }
            }
            let scales_of = |at: usize| {
                _mm256_cvtph_ps(_mm_loadu_si128(tb.add(at + half * TILE_ROWS) as *const _))
            };
            let d = scales_of(layout.scales_at);
            let minima = if MINIMUM { scales_of(layout.minima_at) } else { _mm256_setzero_ps() };
            for (m, acc) in acc[..count].iter_mut().enumerate() {
                let at = acts.block(first + m, b);
                let q = acts.quants.as_ptr().add(at * BLOCK);
                let broadcast =
                    |i: usize| _mm256_set1_epi32((q.add(i) as *const i32).read_unaligned());
                let mut lo = _mm256_maddubs_epi16(low[0], broadcast(0));
                let mut hi = _mm256_maddubs_epi16(high[0], broadcast(16));
                for g in 1..4 {
                    lo = _mm256_add_epi16(lo, _mm256_maddubs_epi16(low[g], broadcast(4 * g)));
                    hi = _mm256_add_epi16(hi, _mm256_maddubs_epi16(high[g], broadcast(16 + 4 * g)));
                }
                let dot =
                    _mm256_add_epi32(_mm256_madd_epi16(lo, ones), _mm256_madd_epi16(hi, ones));
                let dot = _mm256_sub_epi32(dot, _mm256_set1_epi32(bias * acts.sums[at]));
                let scale = _mm256_mul_ps(d, _mm256_set1_ps(acts.d[at]));
                acc[half] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), scale, acc[half]);
                if MINIMUM {
                    acc[half] = _mm256_fmadd_ps(minima, _mm256_set1_ps(acts.s[at]), acc[half]);
                }
            }
        }
    }
    store(&acc[..count], sums);
}

/// Q8_0 on AVX2 for `M` tokens (at most 4: more sums than that would not fit in registers
/// beside the float accumulators), rows 0..8 then 8..16: each group of weights is loaded once
/// for all `M` tokens. `vpmaddubsw` takes the weights' magnitudes (at most 128) against
/// activations that borrow the weights' signs (`vpsignb`, which zeroes where a weight is 0: its
/// product is 0 either way), pair sums of at most 2·128·127, exact; each is widened by
/// `vpmaddwd` before the next could overflow.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn avx2_q8_0<const M: usize>(
    layout: TileLayout,
    tile: &[u8],
    acts: &Activations,
    first: usize,
    sums: &mut [[f32; TILE_ROWS]],
) {
    let ones = _mm256_set1_epi16(1);
    for half in 0..2 {
        let mut acc = [_mm256_setzero_ps(); M];
        for b in 0..acts.cols / BLOCK {
            let tb = tile.as_ptr().add(b * layout.bytes);
            let at: [usize; M] = std::array::from_fn(|m| acts.block(first + m, b));
            let mut dots = [_mm256_setzero_si256(); M];
            for g in 0..8 {
                let w = tb.add(g * GROUP_BYTES + half * GROUP_BYTES / 2);
                let w = _mm256_loadu_si256(w as *const _);
                let magnitudes = _mm256_sign_epi8(w, w);
                for (dot, &at) in dots.iter_mut().zip(&at) {
                    let q = acts.quants.as_ptr().add(at * BLOCK + 4 * g) as *const i32;
                    let a = _mm256_sign_epi8(_mm256_set1_epi32(q.read_unaligned()), w);
                    let pairs = _mm256_maddubs_epi16(magnitudes, a);
                    *dot = _mm256_add_epi32(*dot, _mm256_madd_epi16(pairs, ones));
                }
            }
            let d = tb.add(layout.scales_at + half * TILE_ROWS);
            let d = _mm256_cvtph_ps(_mm_loadu_si128(d as *const _));
            for ((acc, dot), &at) in acc.iter_mut().zip(dots).zip(&at) {
                let scale = _mm256_mul_ps(d, _mm256_set1_ps(acts.d[at]));
                *acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), scale, *acc);
            }
        }
        for (sums, acc) in sums.iter_mut().zip(acc) {
            _mm256_storeu_ps(sums.as_mut_ptr().add(half * TILE_ROWS / 2), acc);
        }
    }
}

/// Writes each token's two halves of row sums.
#[target_feature(enable = "avx2")]
unsafe fn store(acc: &[[__m256; 2]], sums: &mut [[f32; TILE_ROWS]; GROUP]) {
    for (halves, sums) in acc.iter().zip(sums.iter_mut()) {
        _mm256_storeu_ps(sums.as_mut_ptr(), halves[0]);
        _mm256_storeu_ps(sums.as_mut_ptr().add(TILE_ROWS / 2), halves[1]);
    }
}

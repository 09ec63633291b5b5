//! The number type attention keys and values are stored in: f32, f16 or bf16 (2 bytes a value;
//! llama.cpp's default is f16), or q8_0 (llama.cpp's layout: blocks of 32 int8 values with one
//! f16 scale, 34 bytes per 32 values).
//!
//! A position's row of `head_dim` values is converted when it is written, by itself, so what is
//! stored never depends on the batch it was computed in. Attention converts rows back to f32 as
//! it reads them: f16 and bf16 exactly, q8_0 as `scale × q` (one rounding). The AVX-512, F16C and
//! portable copies of that conversion give the same bits, so attention's results do not depend on
//! the CPU either.

use std::fmt;
use std::ops::Range;
use std::str::FromStr;

use half::{bf16, f16};

use crate::isa::Isa;

/// Values per q8_0 block.
pub const Q8_0_BLOCK: usize = 32;
/// Bytes per q8_0 block: the f16 scale (little-endian), then 32 int8 values.
const Q8_0_BYTES: usize = 2 + Q8_0_BLOCK;

/// How the KV cache stores keys and values.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum KvType {
    F32,
    #[default]
    F16,
    Bf16,
    Q8_0,
}

impl KvType {
    pub const ALL: [KvType; 4] = [KvType::F16, KvType::Bf16, KvType::Q8_0, KvType::F32];

    /// The name `--kv-cache-type` takes (llama.cpp's names).
    pub fn name(self) -> &'static str {
        match self {
            KvType::F32 => "f32",
            KvType::F16 => "f16",
            KvType::Bf16 => "bf16",
            KvType::Q8_0 => "q8_0",
        }
    }

    /// Bytes a row of `d` values takes.
    pub fn row_bytes(self, d: usize) -> usize {
        self.row_units(d) * self.unit_bytes()
    }

    /// Whether rows of `d` values can be stored: q8_0 needs whole blocks of 32.
    pub fn fits(self, d: usize) -> bool {
        self != KvType::Q8_0 || d.is_multiple_of(Q8_0_BLOCK)
    }

    /// Storage elements (f32, u16 or bytes) a row of `d` values takes.
    pub(crate) fn row_units(self, d: usize) -> usize {
        match self {
            KvType::F32 | KvType::F16 | KvType::Bf16 => d,
            KvType::Q8_0 => d / Q8_0_BLOCK * Q8_0_BYTES,
        }
    }

    fn unit_bytes(self) -> usize {
        match self {
            KvType::F32 => 4,
            KvType::F16 | KvType::Bf16 => 2,
            KvType::Q8_0 => 1,
        }
    }
}

impl fmt::Display for KvType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for KvType {
    type Err = String;

    fn from_str(name: &str) -> Result<Self, String> {
        Self::ALL.into_iter().find(|t| t.name() == name).ok_or_else(|| {
            let names: Vec<&str> = Self::ALL.iter().map(|t| t.name()).collect();
            format!("unknown KV cache type `{name}`; expected one of {}", names.join(", "))
        })
    }
}

/// Consecutive rows of one head as stored (a block's keys or values, or part of them).
#[derive(Clone, Copy, Debug)]
pub enum KvRows<'a> {
    F32(&'a [f32]),
    F16(&'a [u16]),
    Bf16(&'a [u16]),
    Q8_0(&'a [u8]),
}

impl<'a> KvRows<'a> {
    /// Values held (rows × d).
    pub fn values(self) -> usize {
        match self {
            KvRows::F32(x) => x.len(),
            KvRows::F16(x) | KvRows::Bf16(x) => x.len(),
            KvRows::Q8_0(x) => x.len() / Q8_0_BYTES * Q8_0_BLOCK,
        }
    }

    /// Starts loading these rows into the cache, so that a run read next is on its way while
    /// this one is worked on. A head's run is one block's rows (2 KiB for 16 f16 rows of 64),
    /// consecutive runs lie in different blocks, and the hardware prefetcher starts over at
    /// each: reading runs one by one left a decode step at depth waiting on memory.
    pub(crate) fn prefetch(self) {
        let (start, len) = match self {
            KvRows::F32(x) => (x.as_ptr().cast::<u8>(), std::mem::size_of_val(x)),
            KvRows::F16(x) | KvRows::Bf16(x) => (x.as_ptr().cast(), std::mem::size_of_val(x)),
            KvRows::Q8_0(x) => (x.as_ptr(), x.len()),
        };
        // A plain loop: the iterator adapters this was written with cost as much as the
        // prefetches in a prefill's profile.
        #[cfg(target_arch = "x86_64")]
        if len > 0 {
            let prefetch = |at: usize| {
                // SAFETY: a prefetch of an address inside the slice; it reads nothing the
                // program sees and cannot fault.
                unsafe {
                    std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(
                        start.add(at).cast(),
                    )
                }
            };
            let mut at = 0;
            while at < len {
                prefetch(at);
                at += 64;
            }
            prefetch(len - 1);
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = (start, len);
    }

    /// [`Self::prefetch`] of columns `columns` of each row (rows of `d` values).
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    pub(crate) fn prefetch_columns(self, d: usize, columns: Range<usize>) {
        for row in 0..self.values() / d {
            self.part(d, row, columns.clone()).prefetch();
        }
    }

    /// Rows `from..to` of rows of `d` values.
    pub fn rows(self, d: usize, from: usize, to: usize) -> Self {
        match self {
            KvRows::F32(x) => KvRows::F32(&x[from * d..to * d]),
            KvRows::F16(x) => KvRows::F16(&x[from * d..to * d]),
            KvRows::Bf16(x) => KvRows::Bf16(&x[from * d..to * d]),
            KvRows::Q8_0(x) => {
                let row = KvType::Q8_0.row_units(d);
                KvRows::Q8_0(&x[from * row..to * row])
            }
        }
    }

    /// The values as f32: f32 rows themselves, others converted into `scratch` by the copy of
    /// the conversion for `isa`, which the CPU must run.
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    pub(crate) fn to_f32_on<'s>(self, isa: Isa, scratch: &'s mut Vec<f32>) -> &'s [f32]
    where
        'a: 's,
    {
        if let KvRows::F32(x) = self {
            return x;
        }
        let n = self.values();
        if scratch.len() < n {
            scratch.resize(n, 0.0);
        }
        let out = &mut scratch[..n];
        self.to_f32_into(isa, out);
        out
    }

    /// The values as f32 in `out` ([`Self::values`] long), by the copy of the conversion for
    /// `isa`, which the CPU must run.
    pub(crate) fn to_f32_into(self, isa: Isa, out: &mut [f32]) {
        match isa {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: `isa` is one the CPU runs (the caller's promise).
            Isa::Avx512 => unsafe { simd::decode_avx512(self, out) },
            #[cfg(target_arch = "x86_64")]
            // SAFETY: as above.
            Isa::Avx2 => unsafe { simd::decode_avx2(self, out) },
            _ => decode_portable(self, out),
        }
    }

    /// Columns `columns` of each row (rows of `d` values) as f32, `rows × columns.len()`,
    /// converted into `scratch` by the copy for `isa`, which the CPU must run: the same values
    /// as those columns of [`Self::to_f32_on`]. q8_0 columns start and end on its blocks.
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    pub(crate) fn columns_to_f32_on<'s>(
        self,
        isa: Isa,
        d: usize,
        columns: Range<usize>,
        scratch: &'s mut Vec<f32>,
    ) -> &'s [f32]
    where
        'a: 's,
    {
        if columns == (0..d) {
            return self.to_f32_on(isa, scratch);
        }
        let n = self.values() / d * columns.len();
        if scratch.len() < n {
            scratch.resize(n, 0.0);
        }
        let out = &mut scratch[..n];
        match isa {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: `isa` is one the CPU runs (the caller's promise).
            Isa::Avx512 => unsafe { simd::columns_avx512(self, d, columns, out) },
            #[cfg(target_arch = "x86_64")]
            // SAFETY: as above.
            Isa::Avx2 => unsafe { simd::columns_avx2(self, d, columns, out) },
            _ => {
                for (j, out) in out.chunks_exact_mut(columns.len()).enumerate() {
                    decode_portable(self.part(d, j, columns.clone()), out);
                }
            }
        }
        out
    }

    /// Columns `columns` of row `row` (rows of `d` values).
    #[inline(always)]
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    fn part(self, d: usize, row: usize, columns: Range<usize>) -> Self {
        let at = row * d;
        match self {
            KvRows::F32(x) => KvRows::F32(&x[at + columns.start..at + columns.end]),
            KvRows::F16(x) => KvRows::F16(&x[at + columns.start..at + columns.end]),
            KvRows::Bf16(x) => KvRows::Bf16(&x[at + columns.start..at + columns.end]),
            KvRows::Q8_0(x) => {
                assert!(columns.start.is_multiple_of(Q8_0_BLOCK));
                assert!(columns.end.is_multiple_of(Q8_0_BLOCK));
                let at = row * KvType::Q8_0.row_units(d);
                let block = |c: usize| at + c / Q8_0_BLOCK * Q8_0_BYTES;
                KvRows::Q8_0(&x[block(columns.start)..block(columns.end)])
            }
        }
    }
}

/// Converts `src` (a whole number of rows) into `dst`'s storage type: rounded to nearest even
/// for f16 and bf16, and for q8_0 as llama.cpp's `quantize_row_q8_0_ref` does (scale =
/// max |x| / 127, values rounded half away from zero).
pub(crate) fn encode_f16(src: &[f32], dst: &mut [u16]) {
    for (d, &x) in dst.iter_mut().zip(src) {
        *d = f16::from_f32(x).to_bits();
    }
}

/// See [`encode_f16`].
pub(crate) fn encode_bf16(src: &[f32], dst: &mut [u16]) {
    for (d, &x) in dst.iter_mut().zip(src) {
        *d = bf16::from_f32(x).to_bits();
    }
}

/// See [`encode_f16`].
pub(crate) fn encode_q8_0(src: &[f32], dst: &mut [u8]) {
    for (x, block) in src.chunks_exact(Q8_0_BLOCK).zip(dst.chunks_exact_mut(Q8_0_BYTES)) {
        let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
        let scale = amax / 127.0;
        let inverse = if scale != 0.0 { 1.0 / scale } else { 0.0 };
        block[..2].copy_from_slice(&f16::from_f32(scale).to_bits().to_le_bytes());
        for (q, v) in block[2..].iter_mut().zip(x) {
            *q = (v * inverse).round() as i8 as u8;
        }
    }
}

/// Plain code: the reference the SIMD copies match.
#[inline(always)]
fn decode_portable(rows: KvRows<'_>, out: &mut [f32]) {
    match rows {
        KvRows::F32(x) => out.copy_from_slice(x),
        KvRows::F16(x) => decode_f16_tail(x, out),
        KvRows::Bf16(x) => decode_bf16(x, out),
        KvRows::Q8_0(x) => decode_q8_0(x, out),
    }
}

#[inline(always)]
fn decode_f16_tail(x: &[u16], out: &mut [f32]) {
    for (o, &h) in out.iter_mut().zip(x) {
        *o = f16::from_bits(h).to_f32();
    }
}

/// A bf16 is the top half of an f32.
#[inline(always)]
fn decode_bf16(x: &[u16], out: &mut [f32]) {
    for (o, &h) in out.iter_mut().zip(x) {
        *o = f32::from_bits((h as u32) << 16);
    }
}

/// A q8_0 block's scale.
#[inline(always)]
fn q8_0_scale(block: &[u8]) -> f32 {
    f16::from_bits(u16::from_le_bytes([block[0], block[1]])).to_f32()
}

#[inline(always)]
fn decode_q8_0(x: &[u8], out: &mut [f32]) {
    for (block, o) in x.chunks_exact(Q8_0_BYTES).zip(out.chunks_exact_mut(Q8_0_BLOCK)) {
        let scale = q8_0_scale(block);
        for (o, &q) in o.iter_mut().zip(&block[2..]) {
            *o = scale * (q as i8 as f32);
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod simd {
    use std::arch::x86_64::*;

    use std::ops::Range;

    use super::{decode_bf16, decode_f16_tail, q8_0_scale, KvRows, Q8_0_BLOCK, Q8_0_BYTES};

    /// [`KvRows::columns_to_f32_on`] row by row with [`decode_avx512`] (inlined here).
    #[target_feature(enable = "avx512f,avx2,f16c")]
    pub unsafe fn columns_avx512(
        rows: KvRows<'_>,
        d: usize,
        columns: Range<usize>,
        out: &mut [f32],
    ) {
        let width = columns.len();
        if let KvRows::F16(x) = rows {
            // The KV cache's default type: its rows' parts straight from the slices.
            for (row, out) in x.chunks_exact(d).zip(out.chunks_exact_mut(width)) {
                // SAFETY: this function's features.
                unsafe { f16_avx512(&row[columns.clone()], out) };
            }
            return;
        }
        for (j, out) in out.chunks_exact_mut(width).enumerate() {
            // SAFETY: this function's features.
            unsafe { decode_avx512(rows.part(d, j, columns.clone()), out) };
        }
    }

    /// f16 by `vcvtph2ps`, 16 at a time.
    ///
    /// # Safety
    /// The CPU runs AVX-512F and F16C (inlined into a function compiled for them).
    #[inline(always)]
    unsafe fn f16_avx512(x: &[u16], out: &mut [f32]) {
        let body = x.len() / 16 * 16;
        for (h, o) in x[..body].chunks_exact(16).zip(out.chunks_exact_mut(16)) {
            // SAFETY: 16 halves in, 16 floats out, unaligned loads and stores; the features are
            // the caller's promise.
            unsafe {
                _mm512_storeu_ps(
                    o.as_mut_ptr(),
                    _mm512_cvtph_ps(_mm256_loadu_si256(h.as_ptr().cast())),
                )
            };
        }
        decode_f16_tail(&x[body..], &mut out[body..]);
    }

    /// [`KvRows::columns_to_f32_on`] row by row with [`decode_avx2`] (inlined here).
    #[target_feature(enable = "avx2,f16c")]
    pub unsafe fn columns_avx2(rows: KvRows<'_>, d: usize, columns: Range<usize>, out: &mut [f32]) {
        for (j, out) in out.chunks_exact_mut(columns.len()).enumerate() {
            // SAFETY: this function's features.
            unsafe { decode_avx2(rows.part(d, j, columns.clone()), out) };
        }
    }

    /// f16 by `vcvtph2ps`, 16 at a time; q8_0 16 int8 at a time; bf16 as plain code the
    /// compiler vectorizes.
    #[target_feature(enable = "avx512f,avx2,f16c")]
    #[inline]
    pub unsafe fn decode_avx512(rows: KvRows<'_>, out: &mut [f32]) {
        match rows {
            // SAFETY: this function's features.
            KvRows::F16(x) => unsafe { f16_avx512(x, out) },
            KvRows::F32(x) => out.copy_from_slice(x),
            KvRows::Bf16(x) => decode_bf16(x, out),
            KvRows::Q8_0(x) => {
                for (block, o) in x.chunks_exact(Q8_0_BYTES).zip(out.chunks_exact_mut(Q8_0_BLOCK)) {
                    let scale = _mm512_set1_ps(q8_0_scale(block));
                    for at in [0, 16] {
                        // SAFETY: 16 int8 in from the block's 32, 16 floats out.
                        unsafe {
                            let q = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(
                                block[2 + at..].as_ptr().cast(),
                            )));
                            _mm512_storeu_ps(o[at..].as_mut_ptr(), _mm512_mul_ps(scale, q));
                        }
                    }
                }
            }
        }
    }

    /// f16 by `vcvtph2ps`, 8 at a time; q8_0 8 int8 at a time; bf16 as in [`decode_avx512`].
    #[target_feature(enable = "avx2,f16c")]
    #[inline]
    pub unsafe fn decode_avx2(rows: KvRows<'_>, out: &mut [f32]) {
        match rows {
            KvRows::F16(x) => {
                let body = x.len() / 8 * 8;
                for (h, o) in x[..body].chunks_exact(8).zip(out.chunks_exact_mut(8)) {
                    // SAFETY: 8 halves in, 8 floats out, unaligned loads and stores.
                    unsafe {
                        _mm256_storeu_ps(
                            o.as_mut_ptr(),
                            _mm256_cvtph_ps(_mm_loadu_si128(h.as_ptr().cast())),
                        )
                    };
                }
                decode_f16_tail(&x[body..], &mut out[body..]);
            }
            KvRows::F32(x) => out.copy_from_slice(x),
            KvRows::Bf16(x) => decode_bf16(x, out),
            KvRows::Q8_0(x) => {
                for (block, o) in x.chunks_exact(Q8_0_BYTES).zip(out.chunks_exact_mut(Q8_0_BLOCK)) {
                    let scale = _mm256_set1_ps(q8_0_scale(block));
                    for at in [0, 8, 16, 24] {
                        // SAFETY: 8 int8 in from the block's 32, 8 floats out.
                        unsafe {
                            let q = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(
                                block[2 + at..].as_ptr().cast(),
                            )));
                            _mm256_storeu_ps(o[at..].as_mut_ptr(), _mm256_mul_ps(scale, q));
                        }
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Values from −4 to 4, with some exact zeros, tiny and rounding-boundary values.
    fn sample(n: usize, seed: u32) -> Vec<f32> {
        let mut v: Vec<f32> = (0..n)
            .map(|i| {
                (((i as u32).wrapping_mul(2654435761).wrapping_add(seed) % 8001) as f32 / 1000.0)
                    - 4.0
            })
            .collect();
        v[0] = 0.0;
        v[1] = 1e-6;
        v[2] = 1.0 + f32::EPSILON;
        v
    }

    fn encoded(kind: KvType, x: &[f32]) -> (Vec<u16>, Vec<u8>) {
        let (mut halves, mut bytes) = (vec![0u16; x.len()], vec![0u8; kind.row_units(x.len())]);
        match kind {
            KvType::F16 => encode_f16(x, &mut halves),
            KvType::Bf16 => encode_bf16(x, &mut halves),
            KvType::Q8_0 => encode_q8_0(x, &mut bytes),
            KvType::F32 => {}
        }
        (halves, bytes)
    }

    fn rows<'a>(kind: KvType, x: &'a [f32], halves: &'a [u16], bytes: &'a [u8]) -> KvRows<'a> {
        match kind {
            KvType::F32 => KvRows::F32(x),
            KvType::F16 => KvRows::F16(halves),
            KvType::Bf16 => KvRows::Bf16(halves),
            KvType::Q8_0 => KvRows::Q8_0(bytes),
        }
    }

    #[test]
    fn a_round_trip_is_within_each_types_precision() {
        let x = sample(8 * 64, 3);
        for kind in KvType::ALL {
            let (halves, bytes) = encoded(kind, &x);
            let mut scratch = Vec::new();
            let back = rows(kind, &x, &halves, &bytes).to_f32_on(Isa::best(), &mut scratch);
            assert_eq!(back.len(), x.len());
            for (block, (got, want)) in
                back.chunks(Q8_0_BLOCK).zip(x.chunks(Q8_0_BLOCK)).enumerate()
            {
                let amax = want.iter().fold(0f32, |m, v| m.max(v.abs()));
                for (g, w) in got.iter().zip(want) {
                    // Half an ulp of the type (relative), or half a q8_0 step plus the scale's
                    // own f16 rounding.
                    let bound = match kind {
                        KvType::F32 => 0.0,
                        KvType::F16 => w.abs() * 2f32.powi(-11) + 3e-8,
                        KvType::Bf16 => w.abs() * 2f32.powi(-8),
                        KvType::Q8_0 => amax / 127.0 * 0.5 + w.abs() * 2f32.powi(-11),
                    };
                    assert!((g - w).abs() <= bound, "{kind} block {block}: {w} came back as {g}");
                }
            }
        }
    }

    #[test]
    fn q8_0_is_llama_cpps_layout() {
        let mut x = vec![0f32; 32];
        x[0] = -2.54;
        x[5] = 1.0;
        let (_, bytes) = encoded(KvType::Q8_0, &x);
        assert_eq!(bytes.len(), 34);
        assert_eq!(u16::from_le_bytes([bytes[0], bytes[1]]), f16::from_f32(0.02).to_bits());
        assert_eq!(bytes[2] as i8, -127);
        assert_eq!(bytes[2 + 5] as i8, 50);
        assert_eq!(KvType::Q8_0.row_bytes(64), 68);
        assert_eq!(KvType::F16.row_bytes(64), 128);
        assert!(!KvType::Q8_0.fits(48) && KvType::F16.fits(48));
    }

    #[test]
    fn every_copy_of_the_conversion_gives_the_same_bits() {
        // 37 rows of 32 (an odd count, so the f16 copies run their tails too).
        let x = sample(37 * 32 + 8, 9);
        let x = &x[..37 * 32];
        for kind in KvType::ALL {
            let (halves, bytes) = encoded(kind, x);
            let rows = rows(kind, x, &halves, &bytes);
            let mut want = vec![0f32; x.len()];
            decode_portable(rows, &mut want);
            for isa in Isa::available() {
                let mut scratch = Vec::new();
                let got: Vec<u32> =
                    rows.to_f32_on(isa, &mut scratch).iter().map(|f| f.to_bits()).collect();
                assert_eq!(
                    got,
                    want.iter().map(|f| f.to_bits()).collect::<Vec<_>>(),
                    "{kind} on {isa:?}"
                );
            }
            // Columns 32..64 of each row (one q8_0 block): the same values as the whole's.
            let d = 96;
            let n = x.len() / d;
            let want_columns: Vec<u32> =
                (0..n).flat_map(|j| &want[j * d + 32..j * d + 64]).map(|f| f.to_bits()).collect();
            for isa in Isa::available() {
                let mut scratch = Vec::new();
                let got = rows.rows(d, 0, n).columns_to_f32_on(isa, d, 32..64, &mut scratch);
                let got: Vec<u32> = got.iter().map(|f| f.to_bits()).collect();
                assert_eq!(got, want_columns, "{kind} columns on {isa:?}");
            }
            // Part of the rows: the same values as the whole's part.
            let mut scratch = Vec::new();
            assert_eq!(
                rows.rows(32, 3, 7).to_f32_on(Isa::best(), &mut scratch),
                &want[3 * 32..7 * 32],
                "{kind} rows 3..7"
            );
        }
    }

    #[test]
    fn names_parse_back() {
        for kind in KvType::ALL {
            assert_eq!(kind.name().parse::<KvType>(), Ok(kind));
        }
        assert_eq!(KvType::default(), KvType::F16);
        assert!("q4_0".parse::<KvType>().unwrap_err().contains("f16, bf16, q8_0, f32"));
    }
}

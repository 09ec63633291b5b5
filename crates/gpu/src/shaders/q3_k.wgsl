// Q3_K: 110-byte blocks of 256 values: 32 bytes of high bits (hmask), 64 bytes of 2-bit pairs
// (qs), 12 bytes packing sixteen 6-bit scales, f16 d. Unit u = 4n + k (n < 2, k < 4) takes bits
// 2k of qs[32n + j] and bit u of hmask[j]; value = d · (sc − 32) · (q − 4 if that bit is clear),
// a scale per 16 values: sc_i's low nibble from byte i (i < 8) or the high one of byte i − 8,
// its top two bits from byte 8 + i % 4 at bit 2·(i / 4).
fn q3_k_scale(scales: u32, i: u32) -> f32 {
    var low = byte_at(scales + i) & 15u;
    if (i >= 8u) {
        low = byte_at(scales + i - 8u) >> 4u;
    }
    let top = (byte_at(scales + 8u + i % 4u) >> (2u * (i / 4u))) & 3u;
    return f32(i32(low | (top << 4u)) - 32);
}

fn load_unit(row_start: u32, u: u32) -> Unit {
    let block = row_start + (u / 8u) * 110u;
    let s = u % 8u;
    let n = s / 4u;
    let k = s % 4u;
    let quants = block + 32u + 32u * n;
    let d = f16_at(block + 108u);
    var unit: Unit;
    unit.scale_lo = d * q3_k_scale(block + 96u, 8u * n + 2u * k);
    unit.scale_hi = d * q3_k_scale(block + 96u, 8u * n + 2u * k + 1u);
    unit.offset_lo = 0.0;
    unit.offset_hi = unit.offset_lo;
    for (var j = 0u; j < 32u; j++) {
        let pair = (byte_at(quants + j) >> (2u * k)) & 3u;
        let high = (byte_at(block + j) >> s) & 1u;
        unit.q[j] = f32(i32(pair) - 4 * i32(1u - high));
    }
    return unit;
}

// Q5_K: 176-byte blocks of 256 values: f16 d, f16 dmin, 12 bytes of eight 6-bit scales and
// minima packed as Q4_K's, 32 bytes of fifth bits (qh), 128 bytes of nibbles. Sub-block s (32
// values, one unit) is the low (s even) or high (s odd) nibbles of bytes 48 + 32·(s/2).., with
// bit s of qh[j] on top; value = d·sc·q − dmin·m.
fn load_unit(row_start: u32, u: u32) -> Unit {
    let block = row_start + (u / 8u) * 176u;
    let s = u % 8u;
    let sc_m = k_scale_min(block + 4u, s);
    var unit: Unit;
    let scale = f16_at(block) * f32(sc_m.x);
    unit.scale_lo = scale;
    unit.scale_hi = scale;
    unit.offset_lo = -f16_at(block + 2u) * f32(sc_m.y);
    unit.offset_hi = unit.offset_lo;
    let high = block + 16u;
    let quants = block + 48u + (s / 2u) * 32u;
    let shift = (s % 2u) * 4u;
    for (var j = 0u; j < 32u; j++) {
        let fifth = (byte_at(high + j) >> s) & 1u;
        unit.q[j] = f32(((byte_at(quants + j) >> shift) & 15u) | (fifth << 4u));
    }
    return unit;
}

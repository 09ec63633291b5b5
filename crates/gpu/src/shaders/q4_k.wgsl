// Q4_K: 144-byte blocks of 256 values: f16 d, f16 dmin, 12 bytes packing eight 6-bit scales and
// eight 6-bit minima, 128 bytes of nibbles. Sub-block s (32 values, one unit) is the low
// nibbles (s even) or high nibbles (s odd) of bytes 32·(s/2)..; value = d·sc·q − dmin·m.
fn load_unit(row_start: u32, u: u32) -> Unit {
    let block = row_start + (u / 8u) * 144u;
    let s = u % 8u;
    let sc_m = k_scale_min(block + 4u, s);
    var unit: Unit;
    let scale = f16_at(block) * f32(sc_m.x);
    unit.scale_lo = scale;
    unit.scale_hi = scale;
    unit.offset_lo = -f16_at(block + 2u) * f32(sc_m.y);
    unit.offset_hi = unit.offset_lo;
    let quants = block + 16u + (s / 2u) * 32u;
    let shift = (s % 2u) * 4u;
    for (var j = 0u; j < 32u; j++) {
        unit.q[j] = f32((byte_at(quants + j) >> shift) & 15u);
    }
    return unit;
}

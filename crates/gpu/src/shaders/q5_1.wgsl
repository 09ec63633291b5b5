// Q5_1: 24-byte blocks of 32 values: f16 scale d, f16 minimum m, 32 fifth bits, 16 bytes of
// nibbles laid out as Q4_0's; value = d · q + m.
fn load_unit(row_start: u32, u: u32) -> Unit {
    let block = row_start + u * 24u;
    var unit: Unit;
    let d = f16_at(block);
    let high = u32_at(block + 4u);
    unit.scale_lo = d;
    unit.scale_hi = d;
    unit.offset_lo = f16_at(block + 2u);
    unit.offset_hi = unit.offset_lo;
    for (var j = 0u; j < 16u; j++) {
        let b = byte_at(block + 8u + j);
        unit.q[j] = f32((b & 15u) | (((high >> j) & 1u) << 4u));
        unit.q[j + 16u] = f32((b >> 4u) | (((high >> (j + 16u)) & 1u) << 4u));
    }
    return unit;
}

// Q5_0: 22-byte blocks of 32 values: f16 scale d, 32 fifth bits (bit j for value j), 16 bytes
// of nibbles laid out as Q4_0's; value = d · (q − 16).
fn load_unit(row_start: u32, u: u32) -> Unit {
    let block = row_start + u * 22u;
    var unit: Unit;
    let d = f16_at(block);
    let high = u32_at(block + 2u);
    unit.scale_lo = d;
    unit.scale_hi = d;
    unit.offset_lo = 0.0;
    unit.offset_hi = unit.offset_lo;
    for (var j = 0u; j < 16u; j++) {
        let b = byte_at(block + 6u + j);
        unit.q[j] = f32(i32((b & 15u) | (((high >> j) & 1u) << 4u)) - 16);
        unit.q[j + 16u] = f32(i32((b >> 4u) | (((high >> (j + 16u)) & 1u) << 4u)) - 16);
    }
    return unit;
}

// Q4_0: 18-byte blocks of 32 values: f16 scale d, 16 bytes whose low nibbles are values 0..15
// and high nibbles values 16..31; value = d · (q − 8).
fn load_unit(row_start: u32, u: u32) -> Unit {
    let block = row_start + u * 18u;
    var unit: Unit;
    let d = f16_at(block);
    unit.scale_lo = d;
    unit.scale_hi = d;
    unit.offset_lo = 0.0;
    unit.offset_hi = unit.offset_lo;
    for (var j = 0u; j < 16u; j++) {
        let b = byte_at(block + 2u + j);
        unit.q[j] = f32(i32(b & 15u) - 8);
        unit.q[j + 16u] = f32(i32(b >> 4u) - 8);
    }
    return unit;
}

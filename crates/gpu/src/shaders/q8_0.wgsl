// Q8_0: 34-byte blocks of 32 values: f16 scale d, 32 signed bytes q; value = d · q.
fn load_unit(row_start: u32, u: u32) -> Unit {
    let block = row_start + u * 34u;
    var unit: Unit;
    let d = f16_at(block);
    unit.scale_lo = d;
    unit.scale_hi = d;
    unit.offset_lo = 0.0;
    unit.offset_hi = unit.offset_lo;
    for (var j = 0u; j < 32u; j++) {
        unit.q[j] = i8_at(block + 2u + j);
    }
    return unit;
}

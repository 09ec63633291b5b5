// f32: one 32-bit word a value; a row's last unit may be partial (its missing values are zero).
fn load_unit(row_start: u32, u: u32) -> Unit {
    var unit: Unit;
    unit.scale_lo = 1.0;
    unit.scale_hi = 1.0;
    unit.offset_lo = 0.0;
    unit.offset_hi = unit.offset_lo;
    let width = min(32u, params.cols - u * 32u);
    for (var j = 0u; j < width; j++) {
        unit.q[j] = bitcast<f32>(weights[row_start / 4u + u * 32u + j]);
    }
    return unit;
}

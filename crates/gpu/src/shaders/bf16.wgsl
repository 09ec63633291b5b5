// bf16: 2 bytes a value, the high half of an f32; a row's last unit may be partial.
fn load_unit(row_start: u32, u: u32) -> Unit {
    var unit: Unit;
    unit.scale_lo = 1.0;
    unit.scale_hi = 1.0;
    unit.offset_lo = 0.0;
    unit.offset_hi = unit.offset_lo;
    let width = min(32u, params.cols - u * 32u);
    for (var j = 0u; j < width; j++) {
        let at = row_start + (u * 32u + j) * 2u;
        unit.q[j] = bitcast<f32>((byte_at(at) | (byte_at(at + 1u) << 8u)) << 16u);
    }
    return unit;
}

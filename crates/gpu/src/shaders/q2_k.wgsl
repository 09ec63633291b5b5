// Q2_K: 84-byte blocks of 256 values: 16 bytes of 4-bit scale and minimum pairs, 64 bytes of
// 2-bit values (qs), f16 d, f16 dmin. Unit u = 4n + k (n < 2, k < 4) takes bits 2k of
// qs[32n + j]; its halves use pair 8n + 2k and 8n + 2k + 1; value = d·(sc & 15)·q − dmin·(sc >> 4).
fn load_unit(row_start: u32, u: u32) -> Unit {
    let block = row_start + (u / 8u) * 84u;
    let s = u % 8u;
    let n = s / 4u;
    let k = s % 4u;
    let d = f16_at(block + 80u);
    let dmin = f16_at(block + 82u);
    let first = byte_at(block + 8u * n + 2u * k);
    let second = byte_at(block + 8u * n + 2u * k + 1u);
    var unit: Unit;
    unit.scale_lo = d * f32(first & 15u);
    unit.scale_hi = d * f32(second & 15u);
    unit.offset_lo = -dmin * f32(first >> 4u);
    unit.offset_hi = -dmin * f32(second >> 4u);
    let quants = block + 16u + 32u * n;
    for (var j = 0u; j < 32u; j++) {
        unit.q[j] = f32((byte_at(quants + j) >> (2u * k)) & 3u);
    }
    return unit;
}

// Q6_K: 210-byte blocks of 256 values: 128 bytes of low nibbles (ql), 64 of high bit pairs (qh),
// 16 signed 8-bit scales (one per 16 values), f16 d; value = d · sc · (q − 32). Value
// 128·n + 32·k + l (l < 32) takes its nibble from ql[64n + 32·(k%2) + l] (high nibble when
// k ≥ 2), its high bits from qh[32n + l] >> 2k, its scale from 8n + 2k + l/16.
fn load_unit(row_start: u32, u: u32) -> Unit {
    let block = row_start + (u / 8u) * 210u;
    let n = (u % 8u) / 4u;
    let k = u % 4u;
    let low = block + 64u * n + 32u * (k % 2u);
    let high = block + 128u + 32u * n;
    let scales = block + 192u + 8u * n + 2u * k;
    let d = f16_at(block + 208u);
    var unit: Unit;
    unit.scale_lo = d * i8_at(scales);
    unit.scale_hi = d * i8_at(scales + 1u);
    unit.offset_lo = 0.0;
    unit.offset_hi = unit.offset_lo;
    for (var l = 0u; l < 32u; l++) {
        let nibble = (byte_at(low + l) >> (4u * (k / 2u))) & 15u;
        let bits = (byte_at(high + l) >> (2u * k)) & 3u;
        unit.q[l] = f32(i32(nibble | (bits << 4u)) - 32);
    }
    return unit;
}

// A unit's share of a product with the kernel's activations `x` from `base`: the one order
// every product kernel adds in, so a token's output has the same bits in each of them.
fn unit_dot(unit: Unit, base: u32, width: u32) -> f32 {
    var lo = 0.0;
    var hi = 0.0;
    var sum_lo = 0.0;
    var sum_hi = 0.0;
    // Whole units in loops of fixed length, which compilers unroll, keeping `unit.q` in
    // registers: indexed by a variable it went to memory, 7× slower on lavapipe. A row's
    // partial last unit (f32 / f16 / bf16 rows only) adds the same terms in the same order.
    if (width == 32u) {
        for (var j = 0u; j < 16u; j++) {
            let v = x[base + j];
            lo += unit.q[j] * v;
            sum_lo += v;
        }
        for (var j = 16u; j < 32u; j++) {
            let v = x[base + j];
            hi += unit.q[j] * v;
            sum_hi += v;
        }
    } else {
        for (var j = 0u; j < width; j++) {
            let v = x[base + j];
            if (j < 16u) {
                lo += unit.q[j] * v;
                sum_lo += v;
            } else {
                hi += unit.q[j] * v;
                sum_hi += v;
            }
        }
    }
    return unit.scale_lo * lo + unit.scale_hi * hi + unit.offset_lo * sum_lo
        + unit.offset_hi * sum_hi;
}

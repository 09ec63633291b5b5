// Decoding weights kept in their file format (GGUF blocks, f16, bf16), shared by the kernels
// that read them (matmul, embedding rows). The format's file, appended after the kernel's,
// supplies `load_unit(row_start, u)`, the u-th 32 values of the row starting at byte
// `row_start`; the kernel's `params` has `cols`.

// The 32 values of one unit are `scale_lo · q[j] + offset_lo` for j < 16 and `scale_hi · q[j] +
// offset_hi` after (Q2_K, Q3_K and Q6_K scale each 16 values, Q2_K offsets them too; the other
// formats give both halves one).
struct Unit {
    q: array<f32, 32>,
    scale_lo: f32,
    scale_hi: f32,
    offset_lo: f32,
    offset_hi: f32,
}

@group(0) @binding(0) var<storage, read> weights: array<u32>;

fn byte_at(offset: u32) -> u32 {
    return (weights[offset >> 2u] >> ((offset & 3u) * 8u)) & 0xffu;
}

fn i8_at(offset: u32) -> f32 {
    return f32(i32(byte_at(offset) << 24u) >> 24u);
}

fn f16_at(offset: u32) -> f32 {
    return unpack2x16float(byte_at(offset) | (byte_at(offset + 1u) << 8u)).x;
}

fn u32_at(offset: u32) -> u32 {
    return byte_at(offset) | (byte_at(offset + 1u) << 8u) | (byte_at(offset + 2u) << 16u)
        | (byte_at(offset + 3u) << 24u);
}

// Q4_K's and Q5_K's sub-block s (< 8): its 6-bit scale (x) and minimum (y), out of the 12 bytes
// at `at`: bytes s and s + 4 for s < 4, else the nibbles of byte s + 4 under the top bits of
// bytes s − 4 and s.
fn k_scale_min(at: u32, s: u32) -> vec2<u32> {
    if (s < 4u) {
        return vec2<u32>(byte_at(at + s) & 63u, byte_at(at + s + 4u) & 63u);
    }
    let sc = (byte_at(at + s + 4u) & 15u) | ((byte_at(at + s - 4u) >> 6u) << 4u);
    let m = (byte_at(at + s + 4u) >> 4u) | ((byte_at(at + s) >> 6u) << 4u);
    return vec2<u32>(sc, m);
}

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

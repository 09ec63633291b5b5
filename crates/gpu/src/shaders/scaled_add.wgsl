// y[i] = a[i] + b[i] · scale(s[(i / width) · stride + offset]), one value a lane: a row of b
// scaled by its own weight out of s and added to a (an expert's output times its routing weight,
// or the shared expert's times its sigmoid gate, onto the sum so far). `scale`
// (`fn scale(v: f32) -> f32`) follows this file. Each output depends on its own inputs only.

struct Params {
    len: u32,
    width: u32,
    stride: u32,
    offset: u32,
}

@group(0) @binding(0) var<storage, read> a: array<f32>;
@group(0) @binding(1) var<storage, read> b: array<f32>;
@group(0) @binding(2) var<storage, read> s: array<f32>;
@group(0) @binding(3) var<storage, read_write> y: array<f32>;
@group(0) @binding(4) var<uniform> params: Params;

const GRID_X: u32 = 32768u;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) group: vec3<u32>, @builtin(local_invocation_index) lane: u32) {
    let i = (group.y * GRID_X + group.x) * 64u + lane;
    if (i < params.len) {
        y[i] = a[i] + b[i] * scale(s[(i / params.width) * params.stride + params.offset]);
    }
}

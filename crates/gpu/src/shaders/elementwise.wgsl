// y[i] = op(a[i], b[i % width]), one value a lane: the residual add, a bias or scale on every
// row, the gated MLP's act(gate) · up. `op` (`fn op(a: f32, b: f32) -> f32`) follows this file;
// each output depends on its own inputs only, so batching changes nothing.

struct Params {
    len: u32,
    // b's length: len when both inputs are alike, a row's width when b goes on every row.
    width: u32,
}

@group(0) @binding(0) var<storage, read> a: array<f32>;
@group(0) @binding(1) var<storage, read> b: array<f32>;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;
@group(0) @binding(3) var<uniform> params: Params;

const GRID_X: u32 = 32768u;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) group: vec3<u32>, @builtin(local_invocation_index) lane: u32) {
    let i = (group.y * GRID_X + group.x) * 64u + lane;
    if (i < params.len) {
        y[i] = op(a[i], b[i % params.width]);
    }
}

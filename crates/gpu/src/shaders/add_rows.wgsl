// y[i] = x[i] + b[i % width]: one vector added to every row (a projection's bias).

struct Params {
    len: u32,
    width: u32,
}

@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read> b: array<f32>;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;
@group(0) @binding(3) var<uniform> params: Params;

const GRID_X: u32 = 32768u;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) group: vec3<u32>, @builtin(local_invocation_index) lane: u32) {
    let i = (group.y * GRID_X + group.x) * 64u + lane;
    if (i < params.len) {
        y[i] = x[i] + b[i % params.width];
    }
}

// y[i] = silu(gate[i]) · up[i], silu(g) = g / (1 + exp(−g)): the gated MLP's middle.

struct Params {
    len: u32,
}

@group(0) @binding(0) var<storage, read> gate: array<f32>;
@group(0) @binding(1) var<storage, read> up: array<f32>;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;
@group(0) @binding(3) var<uniform> params: Params;

const GRID_X: u32 = 32768u;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) group: vec3<u32>, @builtin(local_invocation_index) lane: u32) {
    let i = (group.y * GRID_X + group.x) * 64u + lane;
    if (i < params.len) {
        let g = gate[i];
        y[i] = g / (1.0 + exp(-g)) * up[i];
    }
}

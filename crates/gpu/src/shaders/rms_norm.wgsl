// y[r] = x[r] / sqrt(mean(x[r]²) + eps) · w, one workgroup per row: lane i sums the squares of
// values i, i+THREADS, ... in order, and the lanes' sums meet in a fixed tree, whatever the
// number of rows.

struct Params {
    rows: u32,
    dim: u32,
    eps: f32,
}

@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read> weight: array<f32>;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;
@group(0) @binding(3) var<uniform> params: Params;

const THREADS: u32 = 64u;
const GRID_X: u32 = 32768u;

var<workgroup> partial: array<f32, 64>;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) group: vec3<u32>, @builtin(local_invocation_index) lane: u32) {
    let row = group.y * GRID_X + group.x;
    if (row >= params.rows) {
        return;
    }
    let base = row * params.dim;
    var sum = 0.0;
    for (var i = lane; i < params.dim; i += THREADS) {
        sum += x[base + i] * x[base + i];
    }
    partial[lane] = sum;
    workgroupBarrier();
    for (var stride = THREADS / 2u; stride > 0u; stride /= 2u) {
        if (lane < stride) {
            partial[lane] += partial[lane + stride];
        }
        workgroupBarrier();
    }
    let rms = sqrt(partial[0] / f32(params.dim) + params.eps);
    for (var i = lane; i < params.dim; i += THREADS) {
        y[base + i] = x[base + i] / rms * weight[i];
    }
}

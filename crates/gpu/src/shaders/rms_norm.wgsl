// y[r] = x[r] / sqrt(sum(x[r]²) / divisor + eps) · w, one workgroup per row: lane i sums the
// squares of values i, i+THREADS, ... in order, and the lanes' sums meet in a fixed tree,
// whatever the number of rows. With divisor = dim it is RMSNorm; with divisor 1, L2
// normalisation. `w` is a row repeated along x (weight_len a multiple of dim): RMSNorm's weight
// (weight_len = dim), or per-head scales (Gated DeltaNet's q heads scaled, its k heads not).

struct Params {
    rows: u32,
    dim: u32,
    eps: f32,
    divisor: f32,
    weight_len: u32,
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
    let rms = sqrt(partial[0] / params.divisor + params.eps);
    for (var i = lane; i < params.dim; i += THREADS) {
        y[base + i] = x[base + i] / rms * weight[(base + i) % params.weight_len];
    }
}

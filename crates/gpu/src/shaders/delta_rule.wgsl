// The gated delta rule of Gated DeltaNet, token by token over each sequence's rows, as decode
// runs it. Per value head the state is a k_dim × v_dim matrix S; per token, with q and k
// L2-normalised (q scaled), g = −exp(A_log)·softplus(a + dt_bias) and β = sigmoid(b):
//   S ← e^g S;  S ← S + k ⊗ β (v − Sᵀk);  o = Sᵀq.
// Column j of S only ever meets column j (and v_j, o_j), so one lane per (sequence, value head,
// column) runs the whole recurrence on its column, kept in private memory, with no barriers and
// no lane depending on another: batching changes nothing. Each column's sums run over d in
// order, as the CPU's `delta_rule::recurrent`. A run that keeps its positions' states (it
// verifies drafts) also writes its column after each of its positions but the last to its rows
// of `state_history`.

struct Params {
    sequences: u32,
    k_heads: u32,
    v_heads: u32,
    k_dim: u32,
    v_dim: u32,
    // 1: value head h reads key head h mod k_heads; 0: h / (v_heads / k_heads).
    tiled: u32,
}

// (tokens, 2, k_heads, k_dim): q's heads then k's, per row.
@group(0) @binding(0) var<storage, read> qk: array<f32>;
// (tokens, v_heads, v_dim).
@group(0) @binding(1) var<storage, read> v: array<f32>;
// (tokens, v_heads) each: the decay's and the write strength's projections.
@group(0) @binding(2) var<storage, read> a: array<f32>;
@group(0) @binding(3) var<storage, read> b: array<f32>;
// (2, v_heads): −exp(A_log), then dt_bias.
@group(0) @binding(4) var<storage, read> decay: array<f32>;
// (slots, v_heads, k_dim, v_dim).
@group(0) @binding(5) var<storage, read_write> state: array<f32>;
// (first row, rows, slot, first history row or NO_HISTORY) per sequence.
@group(0) @binding(6) var<storage, read> runs: array<u32>;
// (tokens, v_heads, v_dim).
@group(0) @binding(7) var<storage, read_write> out: array<f32>;
// (history rows, v_heads, k_dim, v_dim).
@group(0) @binding(8) var<storage, read_write> state_history: array<f32>;
@group(0) @binding(9) var<uniform> params: Params;

const GRID_X: u32 = 32768u;
const NO_HISTORY: u32 = 0xffffffffu;
const MAX_K_DIM: u32 = 256u;

// ln(1 + x) to f32 precision for small x too (Goldberg's trick), as the CPU's `ln_1p`.
fn log1p(x: f32) -> f32 {
    let u = 1.0 + x;
    if (u == 1.0) {
        return x;
    }
    return log(u) * (x / (u - 1.0));
}

// ln(1 + e^x), linear above 20 as torch's softplus.
fn softplus(x: f32) -> f32 {
    if (x > 20.0) {
        return x;
    }
    return log1p(exp(x));
}

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) group: vec3<u32>, @builtin(local_invocation_index) lane: u32) {
    let id = (group.y * GRID_X + group.x) * 64u + lane;
    if (id >= params.sequences * params.v_heads * params.v_dim) {
        return;
    }
    let j = id % params.v_dim;
    let h = (id / params.v_dim) % params.v_heads;
    let s = id / (params.v_dim * params.v_heads);
    var kh = h / (params.v_heads / params.k_heads);
    if (params.tiled == 1u) {
        kh = h % params.k_heads;
    }
    let first = runs[4u * s];
    let rows = runs[4u * s + 1u];
    let kept = runs[4u * s + 3u];
    let k_dim = params.k_dim;
    // Column j of this head's matrix: element d at base + d·v_dim.
    let base = ((runs[4u * s + 2u] * params.v_heads + h) * k_dim) * params.v_dim + j;
    var column: array<f32, MAX_K_DIM>;
    for (var d = 0u; d < k_dim; d++) {
        column[d] = state[base + d * params.v_dim];
    }
    let key_dim = params.k_heads * k_dim;
    for (var t = 0u; t < rows; t++) {
        let row = first + t;
        let q_at = row * 2u * key_dim + kh * k_dim;
        let k_at = q_at + key_dim;
        let g = decay[h] * softplus(a[row * params.v_heads + h] + decay[params.v_heads + h]);
        let beta = 1.0 / (1.0 + exp(-b[row * params.v_heads + h]));
        let e = exp(g);
        // δ = β (v − Sᵀk), over the decayed column.
        var delta = v[(row * params.v_heads + h) * params.v_dim + j];
        for (var d = 0u; d < k_dim; d++) {
            column[d] *= e;
            delta -= column[d] * qk[k_at + d];
        }
        delta *= beta;
        var o = 0.0;
        for (var d = 0u; d < k_dim; d++) {
            column[d] += qk[k_at + d] * delta;
            o += column[d] * qk[q_at + d];
        }
        out[(row * params.v_heads + h) * params.v_dim + j] = o;
        if (kept != NO_HISTORY && t + 1u < rows) {
            let at = ((kept + t) * params.v_heads + h) * k_dim * params.v_dim + j;
            for (var d = 0u; d < k_dim; d++) {
                state_history[at + d * params.v_dim] = column[d];
            }
        }
    }
    for (var d = 0u; d < k_dim; d++) {
        state[base + d * params.v_dim] = column[d];
    }
}

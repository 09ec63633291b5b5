// Rotary position embedding, in place on (tokens, heads, head_dim): each thread turns one pair
// of one head by its token's angle, from a cos/sin table the host computed in f64 (angles of
// far positions lose their precision in f32). Only the first `rotary_dim` values of a head turn.

struct Params {
    tokens: u32,
    heads: u32,
    head_dim: u32,
    rotary_dim: u32,
    // 0: pairs (i, i + rotary_dim/2) (NEOX, HF rotate_half); 1: pairs (2i, 2i + 1).
    interleaved: u32,
}

@group(0) @binding(0) var<storage, read_write> x: array<f32>;
// (tokens, rotary_dim/2) each.
@group(0) @binding(1) var<storage, read> cos_table: array<f32>;
@group(0) @binding(2) var<storage, read> sin_table: array<f32>;
@group(0) @binding(3) var<uniform> params: Params;

const GRID_X: u32 = 32768u;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) group: vec3<u32>, @builtin(local_invocation_index) lane: u32) {
    let half = params.rotary_dim / 2u;
    let id = (group.y * GRID_X + group.x) * 64u + lane;
    if (id >= params.tokens * params.heads * half) {
        return;
    }
    let pair = id % half;
    let head = (id / half) % params.heads;
    let token = id / (half * params.heads);
    let base = (token * params.heads + head) * params.head_dim;
    var a = base + pair;
    var b = base + pair + half;
    if (params.interleaved == 1u) {
        a = base + 2u * pair;
        b = a + 1u;
    }
    let c = cos_table[token * half + pair];
    let s = sin_table[token * half + pair];
    let xa = x[a];
    let xb = x[b];
    x[a] = xa * c - xb * s;
    x[b] = xa * s + xb * c;
}

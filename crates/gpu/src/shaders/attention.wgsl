// Causal softmax attention of new queries over a contiguous KV cache, one workgroup per (query
// token, head). Keys go by in chunks of THREADS from the first the query sees (window) to its
// own position; each lane scores one key of a chunk (a dot product in dimension order, scaled
// after), the chunk's maximum and sum meet in fixed trees, and the running output is rescaled
// as the maximum grows (online softmax). Everything a query computes depends only on its
// position and the cache, not on the other queries of the step: same bits alone or batched.

struct Params {
    tokens: u32,
    heads: u32,
    kv_heads: u32,
    head_dim: u32,
    // Positions cached before the first new query; query t sits at past + t.
    past: u32,
    // Keys further back than this are not seen; 0: no window.
    window: u32,
    scale: f32,
}

// (tokens, heads, head_dim)
@group(0) @binding(0) var<storage, read> q: array<f32>;
// (capacity, kv_heads, head_dim), positions 0..past+tokens filled.
@group(0) @binding(1) var<storage, read> k: array<f32>;
@group(0) @binding(2) var<storage, read> v: array<f32>;
// (tokens, heads, head_dim)
@group(0) @binding(3) var<storage, read_write> out: array<f32>;
@group(0) @binding(4) var<uniform> params: Params;

const THREADS: u32 = 64u;
const MAX_HEAD_DIM: u32 = 256u;
const GRID_X: u32 = 32768u;
// Stands in for −∞: exp of anything this far below the maximum is exactly 0.
const NEG_HUGE: f32 = -3.0e38;

var<workgroup> query: array<f32, 256>;
var<workgroup> probs: array<f32, 64>;
var<workgroup> tree: array<f32, 64>;

fn tree_max(lane: u32, value: f32) -> f32 {
    tree[lane] = value;
    workgroupBarrier();
    for (var stride = THREADS / 2u; stride > 0u; stride /= 2u) {
        if (lane < stride) {
            tree[lane] = max(tree[lane], tree[lane + stride]);
        }
        workgroupBarrier();
    }
    let result = tree[0];
    workgroupBarrier();
    return result;
}

fn tree_sum(lane: u32, value: f32) -> f32 {
    tree[lane] = value;
    workgroupBarrier();
    for (var stride = THREADS / 2u; stride > 0u; stride /= 2u) {
        if (lane < stride) {
            tree[lane] += tree[lane + stride];
        }
        workgroupBarrier();
    }
    let result = tree[0];
    workgroupBarrier();
    return result;
}

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) group: vec3<u32>, @builtin(local_invocation_index) lane: u32) {
    let id = group.y * GRID_X + group.x;
    if (id >= params.tokens * params.heads) {
        return;
    }
    let d = params.head_dim;
    let token = id / params.heads;
    let head = id % params.heads;
    let kv_head = head / (params.heads / params.kv_heads);
    let position = params.past + token;
    var first = 0u;
    if (params.window > 0u && position + 1u > params.window) {
        first = position + 1u - params.window;
    }
    let q_base = id * d;
    for (var j = lane; j < d; j += THREADS) {
        query[j] = q[q_base + j];
    }
    workgroupBarrier();

    var running_max = NEG_HUGE;
    var running_sum = 0.0;
    var acc: array<f32, 4>; // dimensions lane + THREADS·i
    for (var chunk = first - first % THREADS; chunk <= position; chunk += THREADS) {
        let key = chunk + lane;
        var score = NEG_HUGE;
        if (key >= first && key <= position) {
            let k_base = (key * params.kv_heads + kv_head) * d;
            var dot = 0.0;
            for (var j = 0u; j < d; j++) {
                dot += query[j] * k[k_base + j];
            }
            score = dot * params.scale;
        }
        let new_max = max(running_max, tree_max(lane, score));
        let rescale = exp(running_max - new_max);
        let p = exp(score - new_max);
        probs[lane] = p;
        running_sum = running_sum * rescale + tree_sum(lane, p);
        running_max = new_max;
        let keys = min(THREADS, position + 1u - chunk);
        for (var i = 0u; i < 4u; i++) {
            let j = lane + THREADS * i;
            if (j < d) {
                var sum = acc[i] * rescale;
                for (var c = 0u; c < keys; c++) {
                    sum += probs[c] * v[((chunk + c) * params.kv_heads + kv_head) * d + j];
                }
                acc[i] = sum;
            }
        }
        workgroupBarrier();
    }
    for (var i = 0u; i < 4u; i++) {
        let j = lane + THREADS * i;
        if (j < d) {
            out[q_base + j] = acc[i] / running_sum;
        }
    }
}

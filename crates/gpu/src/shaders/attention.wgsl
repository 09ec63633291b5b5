// Causal softmax attention of new queries over a paged KV pool, one workgroup per (query, head).
// A query names its row of `q`, its position, and where its sequence's block table starts;
// position p of that sequence lives at slot table[p / block_size] · block_size + p % block_size.
// Keys go by in chunks of THREADS from the first the query sees (window) to its own position;
// each lane scores one key of a chunk (a dot product in dimension order, scaled after), the
// chunk's maximum and sum meet in fixed trees, and the running output is rescaled
// as the maximum grows (online softmax). Everything a query computes depends only on its
// position and its sequence's keys and values, not on the other queries of the step or where
// the blocks lie: same bits alone or batched.

struct Params {
    queries: u32,
    heads: u32,
    kv_heads: u32,
    head_dim: u32,
    block_size: u32,
    // Keys further back than this are not seen; 0: no window.
    window: u32,
    scale: f32,
}

// (rows, heads, head_dim)
@group(0) @binding(0) var<storage, read> q: array<f32>;
// Keys and values `k` and `v` (bindings 1 and 2), (slots, kv_heads, head_dim), each sequence's
// positions 0..=its query's position filled, read through `key_at` and `value_at`: the pool's
// format (kv_f32.wgsl, kv_f16.wgsl) follows this file.
// (rows, heads, head_dim); rows no query names are left as they are.
@group(0) @binding(3) var<storage, read_write> out: array<f32>;
// Block tables, one after another.
@group(0) @binding(4) var<storage, read> tables: array<u32>;
// Per query: its row, its position, where its block table starts.
@group(0) @binding(5) var<storage, read> places: array<u32>;
@group(0) @binding(6) var<uniform> params: Params;

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

// The first value of position `p`'s key (or value) of `kv_head` for a table starting at `table`.
fn kv_base(table: u32, p: u32, kv_head: u32) -> u32 {
    let slot = tables[table + p / params.block_size] * params.block_size + p % params.block_size;
    return (slot * params.kv_heads + kv_head) * params.head_dim;
}

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) group: vec3<u32>, @builtin(local_invocation_index) lane: u32) {
    let id = group.y * GRID_X + group.x;
    if (id >= params.queries * params.heads) {
        return;
    }
    let d = params.head_dim;
    let query_index = id / params.heads;
    let head = id % params.heads;
    let kv_head = head / (params.heads / params.kv_heads);
    let row = places[3u * query_index];
    let position = places[3u * query_index + 1u];
    let table = places[3u * query_index + 2u];
    var first = 0u;
    if (params.window > 0u && position + 1u > params.window) {
        first = position + 1u - params.window;
    }
    let q_base = (row * params.heads + head) * d;
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
            let k_base = kv_base(table, key, kv_head);
            var dot = 0.0;
            for (var j = 0u; j < d; j++) {
                dot += query[j] * key_at(k_base + j);
            }
            score = dot * params.scale;
        }
        let new_max = max(running_max, tree_max(lane, score));
        let rescale = exp(running_max - new_max);
        let p = exp(score - new_max);
        probs[lane] = p;
        running_sum = running_sum * rescale + tree_sum(lane, p);
        running_max = new_max;
        // Keys before the window are not read at all: a sliding-window layer's rows that far
        // back may be stale (a released block's), and 0 · NaN is NaN.
        let keys = min(THREADS, position + 1u - chunk);
        let skipped = select(0u, first - chunk, first > chunk);
        for (var i = 0u; i < 4u; i++) {
            let j = lane + THREADS * i;
            if (j < d) {
                var sum = acc[i] * rescale;
                for (var c = skipped; c < keys; c++) {
                    sum += probs[c] * value_at(kv_base(table, chunk + c, kv_head) + j);
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

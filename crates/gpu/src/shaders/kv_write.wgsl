// A step's new keys and values into a paged KV pool: row `row` of `new_keys`/`new_values` goes to
// the slot of its position in its sequence's block table (laid out as for attention.wgsl), in
// the pool's format (kv_f32.wgsl, kv_f16.wgsl, which follows this file and declares the pool's
// `k` and `v`). One thread per stored word; a plain copy, so nothing depends on what else the
// step writes.

struct Params {
    places: u32,
    // kv_heads · head_dim
    width: u32,
    block_size: u32,
}

@group(0) @binding(0) var<storage, read> new_keys: array<f32>;
@group(0) @binding(3) var<storage, read> new_values: array<f32>;
@group(0) @binding(4) var<storage, read> tables: array<u32>;
// Per row to write: the row, its position, where its block table starts.
@group(0) @binding(5) var<storage, read> places: array<u32>;
@group(0) @binding(6) var<uniform> params: Params;

const GRID_X: u32 = 32768u;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) group: vec3<u32>, @builtin(local_invocation_index) lane: u32) {
    let words = params.width / PER_WORD;
    let id = (group.y * GRID_X + group.x) * 64u + lane;
    if (id >= params.places * words) {
        return;
    }
    let place = id / words;
    let w = id % words;
    let row = places[3u * place];
    let position = places[3u * place + 1u];
    let table = places[3u * place + 2u];
    let bs = params.block_size;
    let slot = tables[table + position / bs] * bs + position % bs;
    let src = row * params.width + w * PER_WORD;
    let last = src + PER_WORD - 1u;
    k[slot * words + w] = word(new_keys[src], new_keys[last]);
    v[slot * words + w] = word(new_values[src], new_values[last]);
}

// A step's new keys and values into a paged KV pool: row `row` of `new_keys`/`new_values` goes to
// the slot of its position in its sequence's block table (laid out as for attention.wgsl). One
// thread per value; a plain copy, so nothing depends on what else the step writes.

struct Params {
    places: u32,
    // kv_heads · head_dim
    width: u32,
    block_size: u32,
}

@group(0) @binding(0) var<storage, read> new_keys: array<f32>;
@group(0) @binding(1) var<storage, read> new_values: array<f32>;
@group(0) @binding(2) var<storage, read_write> keys: array<f32>;
@group(0) @binding(3) var<storage, read_write> values: array<f32>;
@group(0) @binding(4) var<storage, read> tables: array<u32>;
// Per row to write: the row, its position, where its block table starts.
@group(0) @binding(5) var<storage, read> places: array<u32>;
@group(0) @binding(6) var<uniform> params: Params;

const GRID_X: u32 = 32768u;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) group: vec3<u32>, @builtin(local_invocation_index) lane: u32) {
    let id = (group.y * GRID_X + group.x) * 64u + lane;
    if (id >= params.places * params.width) {
        return;
    }
    let place = id / params.width;
    let j = id % params.width;
    let row = places[3u * place];
    let position = places[3u * place + 1u];
    let table = places[3u * place + 2u];
    let bs = params.block_size;
    let slot = tables[table + position / bs] * bs + position % bs;
    keys[slot * params.width + j] = new_keys[row * params.width + j];
    values[slot * params.width + j] = new_values[row * params.width + j];
}

// The rows of an embedding table (kept in its file format) that token ids name: one workgroup
// per token, lanes over 32-value units. Each value is decoded alone, so a token's row is the
// same whatever else the step embeds. `blocks.wgsl` and the format's file follow this one.

struct Params {
    // Rows of this part of the table, and the first of them (a table over one binding's limit
    // comes in parts; each part writes the tokens whose ids it holds).
    rows: u32,
    cols: u32,
    tokens: u32,
    row_bytes: u32,
    first_row: u32,
}

@group(0) @binding(1) var<storage, read> ids: array<u32>;
@group(0) @binding(2) var<storage, read_write> out: array<f32>;
@group(0) @binding(3) var<uniform> params: Params;

const THREADS: u32 = 64u;
const GRID_X: u32 = 32768u;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) group: vec3<u32>, @builtin(local_invocation_index) lane: u32) {
    let token = group.y * GRID_X + group.x;
    if (token >= params.tokens) {
        return;
    }
    let id = ids[token];
    if (id < params.first_row || id >= params.first_row + params.rows) {
        return;
    }
    let row_start = (id - params.first_row) * params.row_bytes;
    let units = (params.cols + 31u) / 32u;
    for (var u = lane; u < units; u += THREADS) {
        let unit = load_unit(row_start, u);
        let col = u * 32u;
        let width = min(32u, params.cols - col);
        for (var j = 0u; j < width; j++) {
            var scale = unit.scale_hi;
            var offset = unit.offset_hi;
            if (j < 16u) {
                scale = unit.scale_lo;
                offset = unit.offset_lo;
            }
            out[token * params.cols + col + j] = scale * unit.q[j] + offset;
        }
    }
}

// y[t][r] = Σ_c w[r][c] · x[t][c] for a weight kept in its file format.
//
// One workgroup computes ROWS weight rows for up to TOKENS tokens, LANES lanes a row, so each
// weight value is decoded once per group of tokens. Lane i of a row takes 32-value units i,
// i+LANES, ... in order, and the row's lanes' sums meet in a fixed tree. (One row of 64 lanes
// a workgroup left most lanes idle on narrow matrices, and a 151,936-row LM head was as many
// workgroups: their start-up cost ran the step on lavapipe.) Nothing in a token's arithmetic depends on which other
// tokens share the pass or on its slot among them: same token, same bits (batch invariance).
// `blocks.wgsl` and the format's file follow this one (see there).

struct Params {
    // Rows of this part of the weight (a matrix over one binding's limit comes in parts).
    rows: u32,
    cols: u32,
    tokens: u32,
    // Bytes of one weight row in the file layout.
    row_bytes: u32,
    // Where this part's rows start in the output row, and the output row's width.
    first_row: u32,
    out_rows: u32,
}

@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;
@group(0) @binding(3) var<uniform> params: Params;

const THREADS: u32 = 64u;
const LANES: u32 = 8u;
const ROWS: u32 = 8u; // THREADS / LANES
const TOKENS: u32 = 8u;
const GRID_X: u32 = 32768u;

var<workgroup> partial: array<f32, 512>; // TOKENS · THREADS

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) group: vec3<u32>, @builtin(local_invocation_index) lane: u32) {
    let row = (group.y * GRID_X + group.x) * ROWS + lane / LANES;
    let sub = lane % LANES;
    // Lanes past the last row keep to the barriers, adding nothing.
    let live = row < params.rows;
    let first = group.z * TOKENS;
    let count = min(TOKENS, params.tokens - first);
    var acc: array<f32, 8>;
    let units = (params.cols + 31u) / 32u;
    for (var u = sub; live && u < units; u += LANES) {
        let unit = load_unit(row * params.row_bytes, u);
        let col = u * 32u;
        let width = min(32u, params.cols - col);
        for (var t = 0u; t < count; t++) {
            let base = (first + t) * params.cols + col;
            acc[t] += unit_dot(unit, base, width);
        }
    }
    for (var t = 0u; t < TOKENS; t++) {
        partial[t * THREADS + lane] = acc[t];
    }
    workgroupBarrier();
    for (var stride = LANES / 2u; stride > 0u; stride /= 2u) {
        if (sub < stride) {
            for (var t = 0u; t < TOKENS; t++) {
                partial[t * THREADS + lane] += partial[t * THREADS + lane + stride];
            }
        }
        workgroupBarrier();
    }
    // The row's lane `sub` writes token `sub` (LANES = TOKENS).
    if (live && sub < count) {
        y[(first + sub) * params.out_rows + params.first_row + row] = partial[sub * THREADS + lane - sub];
    }
}

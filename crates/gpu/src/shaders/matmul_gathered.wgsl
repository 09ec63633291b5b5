// y[t][r] = Σ_c w[e·expert_rows + r][c] · x[t][c] for e = ids[t·top_k + slot]: the product of
// the expert token t chose in its routing slot `slot`, out of a stack of experts' matrices kept
// in its file format, so a routed MoE runs only the experts each token chose. One workgroup
// computes ROWS rows of one token, LANES lanes a row, summing in matmul.wgsl's order (a token's
// values are those of the plain product with its expert's matrix), whatever the other tokens
// chose. `blocks.wgsl` and the format's file follow this one.

struct Params {
    // Rows of this part of the stack (a stack over one binding's limit comes in parts).
    rows: u32,
    cols: u32,
    tokens: u32,
    row_bytes: u32,
    // This part's first row in the stack.
    first_row: u32,
    // Rows of one expert's matrix: the output row's width.
    expert_rows: u32,
    top_k: u32,
    slot: u32,
}

@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read> ids: array<u32>;
@group(0) @binding(3) var<storage, read_write> y: array<f32>;
@group(0) @binding(4) var<uniform> params: Params;

const THREADS: u32 = 64u;
const LANES: u32 = 8u;
const ROWS: u32 = 8u; // THREADS / LANES
const GRID_X: u32 = 32768u;

var<workgroup> partial: array<f32, 64>;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) group: vec3<u32>, @builtin(local_invocation_index) lane: u32) {
    let row = (group.y * GRID_X + group.x) * ROWS + lane / LANES;
    let sub = lane % LANES;
    let t = group.z;
    let stack_row = ids[t * params.top_k + params.slot] * params.expert_rows + row;
    // Rows in another part of the stack are that part's dispatch's to write.
    let live = row < params.expert_rows && stack_row >= params.first_row
        && stack_row - params.first_row < params.rows;
    var acc = 0.0;
    let units = (params.cols + 31u) / 32u;
    for (var u = sub; live && u < units; u += LANES) {
        let unit = load_unit((stack_row - params.first_row) * params.row_bytes, u);
        let col = u * 32u;
        let width = min(32u, params.cols - col);
        let base = t * params.cols + col;
        acc += unit_dot(unit, base, width);
    }
    partial[lane] = acc;
    workgroupBarrier();
    for (var stride = LANES / 2u; stride > 0u; stride /= 2u) {
        if (sub < stride) {
            partial[lane] += partial[lane + stride];
        }
        workgroupBarrier();
    }
    if (live && sub == 0u) {
        y[t * params.expert_rows + row] = partial[lane];
    }
}

// y[t][r] = Σ_c w[r][c] · x[t][c] for a weight kept in its file format.
//
// One workgroup computes one weight row for up to TOKENS tokens, so each weight value is
// decoded once per group of tokens. Lane i takes 32-value units i, i+THREADS, ... in order, and
// the lanes' sums meet in a fixed tree. Nothing in a token's arithmetic depends on which other
// tokens share the pass or on its slot among them: same token, same bits (batch invariance).
// The format's file (appended after this one) supplies `load_unit`.

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

// The 32 values of one unit are `scale_lo · q[j] + offset` for j < 16 and `scale_hi · q[j] +
// offset` after (Q6_K has a scale per 16 values; the other formats give both halves one).
struct Unit {
    q: array<f32, 32>,
    scale_lo: f32,
    scale_hi: f32,
    offset: f32,
}

@group(0) @binding(0) var<storage, read> weights: array<u32>;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;
@group(0) @binding(3) var<uniform> params: Params;

const THREADS: u32 = 64u;
const TOKENS: u32 = 8u;
const GRID_X: u32 = 32768u;

var<workgroup> partial: array<f32, 512>; // TOKENS · THREADS

fn byte_at(offset: u32) -> u32 {
    return (weights[offset >> 2u] >> ((offset & 3u) * 8u)) & 0xffu;
}

fn i8_at(offset: u32) -> f32 {
    return f32(i32(byte_at(offset) << 24u) >> 24u);
}

fn f16_at(offset: u32) -> f32 {
    return unpack2x16float(byte_at(offset) | (byte_at(offset + 1u) << 8u)).x;
}

fn u32_at(offset: u32) -> u32 {
    return byte_at(offset) | (byte_at(offset + 1u) << 8u) | (byte_at(offset + 2u) << 16u)
        | (byte_at(offset + 3u) << 24u);
}

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) group: vec3<u32>, @builtin(local_invocation_index) lane: u32) {
    let row = group.y * GRID_X + group.x;
    if (row >= params.rows) {
        return;
    }
    let first = group.z * TOKENS;
    let count = min(TOKENS, params.tokens - first);
    var acc: array<f32, 8>;
    let units = (params.cols + 31u) / 32u;
    for (var u = lane; u < units; u += THREADS) {
        let unit = load_unit(row * params.row_bytes, u);
        let col = u * 32u;
        let width = min(32u, params.cols - col);
        for (var t = 0u; t < count; t++) {
            let base = (first + t) * params.cols + col;
            var lo = 0.0;
            var hi = 0.0;
            var sum = 0.0;
            for (var j = 0u; j < width; j++) {
                let v = x[base + j];
                if (j < 16u) {
                    lo += unit.q[j] * v;
                } else {
                    hi += unit.q[j] * v;
                }
                sum += v;
            }
            acc[t] += unit.scale_lo * lo + unit.scale_hi * hi + unit.offset * sum;
        }
    }
    for (var t = 0u; t < TOKENS; t++) {
        partial[t * THREADS + lane] = acc[t];
    }
    workgroupBarrier();
    for (var stride = THREADS / 2u; stride > 0u; stride /= 2u) {
        if (lane < stride) {
            for (var t = 0u; t < TOKENS; t++) {
                partial[t * THREADS + lane] += partial[t * THREADS + lane + stride];
            }
        }
        workgroupBarrier();
    }
    if (lane < count) {
        y[(first + lane) * params.out_rows + params.first_row + row] = partial[lane * THREADS];
    }
}

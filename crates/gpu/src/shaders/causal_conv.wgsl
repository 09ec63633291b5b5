// Gated DeltaNet's depthwise causal convolution then SiLU, for a step's sequences in one
// dispatch: one lane per (sequence, channel) walks the sequence's rows in order, each output
// reading the `kernel` inputs up to its own (the positions before the step from the sequence's
// window slot), then leaves the last `kernel - 1` inputs in the window. A lane touches only its
// own sequence's rows and slot, so batching changes nothing. The taps are summed in order, as
// the CPU's `causal_conv_silu`. Channels below `qk_width` (q and k) go to `qk`, the rest (v) to
// `v`, so the norms and the delta rule read them as whole rows. A run that keeps its
// positions' states (it verifies drafts) also writes the window after each of its positions but
// the last to its rows of `window_history`.

struct Params {
    sequences: u32,
    channels: u32,
    kernel: u32,
    qk_width: u32,
}

@group(0) @binding(0) var<storage, read> x: array<f32>;
// (channels, kernel): channel c's taps, oldest position first.
@group(0) @binding(1) var<storage, read> weight: array<f32>;
// (slots, kernel - 1, channels).
@group(0) @binding(2) var<storage, read_write> window: array<f32>;
// (first row, rows, slot, first history row or NO_HISTORY) per sequence.
@group(0) @binding(3) var<storage, read> runs: array<u32>;
@group(0) @binding(4) var<storage, read_write> qk: array<f32>;
@group(0) @binding(5) var<storage, read_write> v: array<f32>;
// (history rows, kernel - 1, channels).
@group(0) @binding(6) var<storage, read_write> window_history: array<f32>;
@group(0) @binding(7) var<uniform> params: Params;

const GRID_X: u32 = 32768u;
const NO_HISTORY: u32 = 0xffffffffu;

// Input `j` of a sequence's run: its window's first, then its rows'.
fn input(slot_base: u32, first: u32, j: u32, c: u32) -> f32 {
    let window_len = params.kernel - 1u;
    if (j < window_len) {
        return window[slot_base + j * params.channels + c];
    }
    return x[(first + j - window_len) * params.channels + c];
}

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) group: vec3<u32>, @builtin(local_invocation_index) lane: u32) {
    let id = (group.y * GRID_X + group.x) * 64u + lane;
    if (id >= params.sequences * params.channels) {
        return;
    }
    let c = id % params.channels;
    let s = id / params.channels;
    let first = runs[4u * s];
    let rows = runs[4u * s + 1u];
    let kept = runs[4u * s + 3u];
    let window_len = params.kernel - 1u;
    let slot_base = runs[4u * s + 2u] * window_len * params.channels;
    let v_width = params.channels - params.qk_width;
    for (var t = 0u; t < rows; t++) {
        var sum = 0.0;
        for (var i = 0u; i < params.kernel; i++) {
            sum += weight[c * params.kernel + i] * input(slot_base, first, t + i, c);
        }
        let y = sum * (1.0 / (1.0 + exp(-sum)));
        let row = first + t;
        if (c < params.qk_width) {
            qk[row * params.qk_width + c] = y;
        } else {
            v[row * v_width + c - params.qk_width] = y;
        }
        if (kept != NO_HISTORY && t + 1u < rows) {
            let at = (kept + t) * window_len * params.channels;
            for (var j = 0u; j < window_len; j++) {
                window_history[at + j * params.channels + c] = input(slot_base, first, t + 1u + j, c);
            }
        }
    }
    // The window moves on by `rows`: entry j takes input rows + j, which is later in the
    // window (not yet overwritten) or a row.
    if (rows > 0u) {
        for (var j = 0u; j < window_len; j++) {
            window[slot_base + j * params.channels + c] = input(slot_base, first, rows + j, c);
        }
    }
}

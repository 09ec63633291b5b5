// Per token, the router's choice as the CPU's `Routing::from_logits`: softmax over the experts'
// logits (exp(l − max), summed in expert order), the top_k largest (ties to the lower expert),
// renormalised to sum 1 when asked (summed in the order chosen, as the CPU). Written as the
// chosen experts in expert order with their weights, so the experts' outputs are added in the
// CPU's order. One lane a token.

struct Params {
    tokens: u32,
    experts: u32,
    top_k: u32,
    normalize: u32,
}

@group(0) @binding(0) var<storage, read> logits: array<f32>;
@group(0) @binding(1) var<storage, read_write> ids: array<u32>;
@group(0) @binding(2) var<storage, read_write> weights: array<f32>;
@group(0) @binding(3) var<uniform> params: Params;

const MAX_TOP_K: u32 = 32u;
const GRID_X: u32 = 32768u;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) group: vec3<u32>, @builtin(local_invocation_index) lane: u32) {
    let t = (group.y * GRID_X + group.x) * 64u + lane;
    if (t >= params.tokens) {
        return;
    }
    let row = t * params.experts;
    var top = logits[row];
    for (var e = 1u; e < params.experts; e++) {
        top = max(top, logits[row + e]);
    }
    var sum = 0.0;
    for (var e = 0u; e < params.experts; e++) {
        sum += exp(logits[row + e] - top);
    }
    var chosen: array<u32, MAX_TOP_K>;
    var share: array<f32, MAX_TOP_K>;
    for (var j = 0u; j < params.top_k; j++) {
        // Exponentials are never negative: −1 is below every one.
        var best = 0u;
        var best_value = -1.0;
        for (var e = 0u; e < params.experts; e++) {
            var taken = false;
            for (var i = 0u; i < j; i++) {
                taken = taken || chosen[i] == e;
            }
            let value = exp(logits[row + e] - top);
            if (!taken && value > best_value) {
                best = e;
                best_value = value;
            }
        }
        chosen[j] = best;
        share[j] = best_value / sum;
    }
    if (params.normalize != 0u) {
        var total = 0.0;
        for (var j = 0u; j < params.top_k; j++) {
            total += share[j];
        }
        for (var j = 0u; j < params.top_k; j++) {
            share[j] /= total;
        }
    }
    // Into expert order (insertion sort: top_k is small).
    for (var j = 1u; j < params.top_k; j++) {
        let e = chosen[j];
        let w = share[j];
        var i = j;
        while (i > 0u && chosen[i - 1u] > e) {
            chosen[i] = chosen[i - 1u];
            share[i] = share[i - 1u];
            i--;
        }
        chosen[i] = e;
        share[i] = w;
    }
    for (var j = 0u; j < params.top_k; j++) {
        ids[t * params.top_k + j] = chosen[j];
        weights[t * params.top_k + j] = share[j];
    }
}

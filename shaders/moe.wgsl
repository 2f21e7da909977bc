// A mixture of experts' routing and combination around the matmuls by expert (matmul_io.wgsl,
// IDS). Three kernels, chosen by define:
//
// ROUTE: one workgroup per token. The token's n_expert router logits go to workgroup memory;
//   each invocation takes their max and the softmax's sum, then ranks its experts
//   (rank = experts with a larger logit, or an equal one and a lower id) and an expert of
//   rank s < n_used takes slot s: ids[t · n_used + s] = expert, and its softmax probability.
//   The chosen probabilities are then renormalized to sum to 1 (summed in slot order), as
//   flint_core::reference::ops::moe_route does. Entry t · n_used + s names the slot.
// GROUP: one workgroup for the step. Lists each expert's entries in token order:
//   rows[e · n_entries ..] and count[e], so that each expert's matmul reads its weights once
//   for all the tokens routed to it. The step's ids pass through workgroup memory a tile at a
//   time; invocation i lists experts i, i + GWG, ...
// COMBINE: out[t, c] (+)= Σ_s w[t · n_used + s] · y[(t · n_used + s), c], slots in order.
//
// Defines: ROUTE | GROUP | COMBINE, WG, MAX_EXPERTS, MAX_USED, ACCUMULATE (COMBINE).
#include "common.wgsl"

struct Params {
    n: u32,         // ROUTE, GROUP: experts; COMBINE: elements per row (n_embd)
    n_used: u32,    // experts per token
    n_entries: u32, // GROUP: the stride of rows (the step's most tokens)
    _pad: u32,
}

@group(0) @binding(0) var<uniform> batch: BatchInfo;
@group(0) @binding(1) var<uniform> p: Params;

#ifdef ROUTE
// logits: [n_tok, n_expert] f32, the router's output
@group(0) @binding(2) var<storage, read> logits: array<f32>;
// ids: [n_tok, n_used] u32, each slot's expert
@group(0) @binding(3) var<storage, read_write> ids: array<u32>;
// weights: [n_tok, n_used] f32, each slot's weight
@group(0) @binding(4) var<storage, read_write> weights: array<f32>;

var<workgroup> lg: array<f32, MAX_EXPERTS>;
var<workgroup> chosen: array<f32, MAX_USED>;

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let t = linear_group(wg, nwg.x);
    if (t >= batch.n_tok) {
        return;
    }
    let n = p.n;
    let k = p.n_used;
    for (var e = lid; e < n; e += WG) {
        lg[e] = logits[t * n + e];
    }
    workgroupBarrier();
    // Every invocation takes the max and the softmax's sum itself, n reads of workgroup
    // memory (as each ranking below): the same values everywhere, no reduction stages.
    var m = lg[0];
    for (var e = 1u; e < n; e++) {
        m = max(m, lg[e]);
    }
    var s = 0.0;
    for (var e = 0u; e < n; e++) {
        s += exp(lg[e] - m);
    }
    for (var e = lid; e < n; e += WG) {
        let v = lg[e];
        var rank = 0u;
        for (var o = 0u; o < n; o++) {
            let u = lg[o];
            rank += select(0u, 1u, u > v || (u == v && o < e));
        }
        if (rank < k) {
            ids[t * k + rank] = e;
            chosen[rank] = exp(v - m) / s;
        }
    }
    workgroupBarrier();
    var sum = 0.0;
    for (var i = 0u; i < k; i++) {
        sum += chosen[i];
    }
    for (var i = lid; i < k; i += WG) {
        weights[t * k + i] = chosen[i] / sum;
    }
}
#endif

#ifdef GROUP
// ids: [n_tok, n_used] u32
@group(0) @binding(2) var<storage, read_write> ids: array<u32>;
// count: [n_expert] u32
@group(0) @binding(3) var<storage, read_write> count: array<u32>;
// rows: [n_expert, n_entries] u32
@group(0) @binding(4) var<storage, read_write> rows: array<u32>;

const PER: u32 = MAX_EXPERTS / WG;
var<workgroup> tile: array<u32, WG>;

@compute @workgroup_size(WG)
fn main(@builtin(local_invocation_index) lid: u32) {
    let n = p.n;
    let total = batch.n_tok * p.n_used;
    var cnt: array<u32, PER>;
    for (var base = 0u; base < total; base += WG) {
        if (base + lid < total) {
            tile[lid] = ids[base + lid];
        }
        workgroupBarrier();
        let m = min(WG, total - base);
        for (var j = 0u; j < PER; j++) {
            let e = lid + j * WG;
            if (e < n) {
                for (var i = 0u; i < m; i++) {
                    // A list never outgrows its row, whatever the ids hold.
                    if (tile[i] == e && cnt[j] < p.n_entries) {
                        rows[e * p.n_entries + cnt[j]] = base + i;
                        cnt[j] += 1u;
                    }
                }
            }
        }
        workgroupBarrier();
    }
    for (var j = 0u; j < PER; j++) {
        let e = lid + j * WG;
        if (e < n) {
            count[e] = cnt[j];
        }
    }
}
#endif

#ifdef COMBINE
// weights: [n_tok, n_used] f32
@group(0) @binding(2) var<storage, read> weights: array<f32>;
// y: [n_tok · n_used, n] f32, each entry's expert output
@group(0) @binding(3) var<storage, read> y: array<f32>;
// out: [n_tok, n] f32
@group(0) @binding(4) var<storage, read_write> out: array<f32>;

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let n = p.n;
    let i = linear_group(wg, nwg.x) * WG + lid;
    if (i >= batch.n_tok * n) {
        return;
    }
    let t = i / n;
    let c = i % n;
    let k = p.n_used;
    var acc = 0.0;
    for (var s = 0u; s < k; s++) {
        let en = t * k + s;
        acc += weights[en] * y[en * n + c];
    }
#ifdef ACCUMULATE
    out[i] = out[i] + acc;
#else
    out[i] = acc;
#endif
}
#endif

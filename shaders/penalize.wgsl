// Logit edits in place before the sampler, per row of logits: repetition/presence/frequency
// penalties and logit bias for a short list of (row, token) entries, then each row's
// allowed-token mask. Mirrors flint_core::sampling::LogitEdit::apply and Sampler::penalize
// operation for operation.
//   edit: one invocation per list entry ((row, id) pairs unique, so no two touch one logit)
//   edit_pending: one invocation per row whose pending token the list does not count
//   mask: one invocation per (token, row); a clear bit sets the logit to −inf
// A row's pending token is its last draw when the host has not read it yet (an overlapped
// step: the device fed it into this step's batch). The host's list then leaves it out (and
// the oldest token it pushes out of a full window, Sampler::edits_before_pending); `edit`
// counts it in where the list has its entry, `edit_pending` adds the entry (count 1, no bias)
// where it has none, so the row gets the edits of the sampler that accepted it.
// Defines: WG (threads per workgroup).
#include "common.wgsl"

struct Params {
    n_vocab: u32,
    n_edits: u32,
    n_rows: u32,
    mask_words: u32,
    // −inf, from the host (WGSL constant expressions cannot hold infinities)
    neg_inf: f32,
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
}

struct Edit {
    id: u32,
    // occurrences in the penalty window; 0 = not penalized
    count: u32,
    bias: f32,
    row: u32,
}

@group(0) @binding(0) var<uniform> params: Params;
// logits: [n_rows, n_vocab] f32, edited in place
@group(0) @binding(1) var<storage, read_write> logits: array<f32>;
// edits: [max_edits] Edit, the first n_edits used
@group(0) @binding(2) var<storage, read> edits: array<Edit>;
// row_pen: [max_rows] (repeat, presence, frequency, 1 if the row has a mask)
@group(0) @binding(3) var<storage, read> row_pen: array<vec4<f32>>;
// mask: [max_rows, mask_words] u32, bit i % 32 of word i / 32 set = token i allowed
@group(0) @binding(4) var<storage, read> mask: array<u32>;
// pending: [max_rows] (index into `tokens` of the row's pending token or NONE, the row's first
// list entry, one past its last, 0)
@group(0) @binding(5) var<storage, read> pending: array<vec4<u32>>;
// tokens: the step's token ids (the batch), fed tokens among them
@group(0) @binding(6) var<storage, read> tokens: array<u32>;

const NONE: u32 = 0xffffffffu;

// Row `row`'s pending token, NONE when it has none.
fn pending_token(row: u32) -> u32 {
    let at = pending[row].x;
    if (at == NONE) {
        return NONE;
    }
    return tokens[at];
}

// The logit `l` with `count` occurrences penalized (row settings `p`) and `bias` added.
fn edited(l: f32, count: u32, bias: f32, p: vec4<f32>) -> f32 {
    var v = l;
    if (count > 0u) {
        v = select(v * p.x, v / p.x, v > 0.0);
        v -= f32(count) * p.z + p.y;
    }
    return v + bias;
}

@compute @workgroup_size(WG)
fn edit(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let j = linear_group(wg, nwg.x) * WG + lid;
    if (j >= params.n_edits) {
        return;
    }
    let e = edits[j];
    if (e.id >= params.n_vocab || e.row >= params.n_rows) {
        return;
    }
    let at = e.row * params.n_vocab + e.id;
    let count = e.count + select(0u, 1u, pending_token(e.row) == e.id);
    logits[at] = edited(logits[at], count, e.bias, row_pen[e.row]);
}

@compute @workgroup_size(WG)
fn edit_pending(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let row = linear_group(wg, nwg.x) * WG + lid;
    if (row >= params.n_rows) {
        return;
    }
    let id = pending_token(row);
    if (id >= params.n_vocab) {
        return;
    }
    let r = pending[row];
    for (var j = r.y; j < min(r.z, params.n_edits); j++) {
        if (edits[j].id == id) {
            return;
        }
    }
    let at = row * params.n_vocab + id;
    logits[at] = edited(logits[at], 1u, 0.0, row_pen[row]);
}

// Grid: (ceil(n_vocab / WG), n_rows).
@compute @workgroup_size(WG)
fn apply_mask(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let i = wg.x * WG + lid;
    let row = wg.y;
    if (i >= params.n_vocab || row_pen[row].w == 0.0) {
        return;
    }
    if (((mask[row * params.mask_words + (i >> 5u)] >> (i & 31u)) & 1u) == 0u) {
        logits[row * params.n_vocab + i] = params.neg_inf;
    }
}

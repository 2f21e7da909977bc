// Logit edits in place before the sampler, per row of logits: repetition/presence/frequency
// penalties and logit bias for a short list of (row, token) entries, then each row's
// allowed-token mask. Mirrors flint_core::sampling::LogitEdit::apply and Sampler::penalize
// operation for operation.
//   edit: one invocation per list entry ((row, id) pairs unique, so no two touch one logit)
//   mask: one invocation per (token, row); a clear bit sets the logit to −inf
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
    let p = row_pen[e.row];
    let at = e.row * params.n_vocab + e.id;
    var l = logits[at];
    if (e.count > 0u) {
        l = select(l * p.x, l / p.x, l > 0.0);
        l -= f32(e.count) * p.z + p.y;
    }
    logits[at] = l + e.bias;
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

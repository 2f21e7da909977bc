// Logit edits in place before the sampler: repetition/presence/frequency penalties and
// logit bias for a short list of token ids, then the allowed-token mask. Mirrors
// flint_core::sampling::LogitEdit::apply and Sampler::penalize operation for operation.
//   edit: one invocation per list entry (ids unique, so no two touch the same logit)
//   mask: one invocation per token; a clear bit sets the logit to −inf
// Defines: WG (threads per workgroup).
#include "common.wgsl"

struct Params {
    n_vocab: u32,
    n_edits: u32,
    repeat: f32,
    presence: f32,
    frequency: f32,
    // −inf, from the host (WGSL constant expressions cannot hold infinities)
    neg_inf: f32,
    _pad1: u32,
    _pad2: u32,
}

struct Edit {
    id: u32,
    // occurrences in the penalty window; 0 = not penalized
    count: u32,
    bias: f32,
}

@group(0) @binding(0) var<uniform> params: Params;
// logits: [n_vocab] f32, edited in place
@group(0) @binding(1) var<storage, read_write> logits: array<f32>;
// edits: [max_edits] Edit, the first n_edits used
@group(0) @binding(2) var<storage, read> edits: array<Edit>;
// mask: [ceil(n_vocab / 32)] u32, bit i % 32 of word i / 32 set = token i allowed
@group(0) @binding(3) var<storage, read> mask: array<u32>;

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
    if (e.id >= params.n_vocab) {
        return;
    }
    var l = logits[e.id];
    if (e.count > 0u) {
        l = select(l * params.repeat, l / params.repeat, l > 0.0);
        l -= f32(e.count) * params.frequency + params.presence;
    }
    logits[e.id] = l + e.bias;
}

@compute @workgroup_size(WG)
fn apply_mask(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let i = linear_group(wg, nwg.x) * WG + lid;
    if (i >= params.n_vocab) {
        return;
    }
    if (((mask[i >> 5u] >> (i & 31u)) & 1u) == 0u) {
        logits[i] = params.neg_inf;
    }
}

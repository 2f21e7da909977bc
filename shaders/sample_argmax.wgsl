// Greedy argmax and Gumbel-max draws per row of logits (see sample_common.wgsl), so only ids
// are read back.
//
// Greedy: argmax_partial (n_groups × n_rows workgroups, each a chunk of one row) →
// argmax_final (one workgroup per row); the lowest index wins ties. It also records each
// row's largest logit, which sampling and log-probabilities start from. Sampled rows then
// (after sample_threshold.wgsl's search) draw: gumbel_partial (n_groups × n_rows × n_draws)
// → gumbel_final (n_draws × n_rows). Gumbel-max over the survivors of
// (logit − max)/T + G, G = −ln(−ln U) from a counter-based hash of (seed, step + draw, index),
// draws exactly from softmax(logit/T) restricted to them. Greedy rows skip the draw passes.
// A row with a broken logit (NaN, +inf: `broken`) gets id NONE in every draw: the host fails
// its request instead of emitting a token.
#include "sample_common.wgsl"

fn partial_pass(g: u32, row: u32, draw: u32, lid: u32, sample: bool) {
    let r = rows[row];
    let live = !sample || r.greedy == 0u;
    let start = g * params.chunk;
    let end = min(start + params.chunk, params.n_vocab);
    var bv = NEG_MAX;
    var bi = NONE;
    if (live) {
        let lmax = bitcast<f32>(state[st(row, MAX_BITS)]);
        let tv = state[st(row, THR_V)];
        let ti = state[st(row, THR_I)];
        let step = r.step + draw;
        for (var i = start + lid; i < end; i += WG) {
            var v = logit(row, i);
            if (!sample && broken(v)) {
                v = POS_MAX;
            }
            if (sample) {
                let d = v - lmax;
                if (!(d >= r.log_min_p) || !key_at_least(order_key(v), index_key(i), tv, ti)) {
                    continue;
                }
                v = d * r.inv_temp + gumbel(i, step, r.seed_lo, r.seed_hi);
            }
            if (better(v, i, bv, bi)) {
                bv = v;
                bi = i;
            }
        }
    }
    let best = wg_argmax(lid, bv, bi);
    if (lid == 0u && live) {
        partials[(row * params.n_draws + draw) * params.n_groups + g] = best;
    }
}

fn final_pass(row: u32, draw: u32, lid: u32, greedy: bool) {
    let live = greedy || rows[row].greedy == 0u;
    let best = partials_best(row, draw, lid, live);
    if (lid == 0u && live) {
        var id = select(best.y, 0u, best.y >= params.n_vocab);
        if (greedy && bitcast<f32>(best.x) == POS_MAX) {
            id = NONE;
        }
        if (!greedy && state[st(row, MAX_ID)] == NONE) {
            id = NONE;
        }
        if (greedy) {
            state[st(row, MAX_BITS)] = best.x;
            state[st(row, MAX_ID)] = id;
            // A greedy row's every draw is its argmax; sampled rows overwrite theirs.
            for (var d = 0u; d < params.n_draws; d++) {
                out[row * params.n_draws + d] = id;
            }
        } else {
            out[row * params.n_draws + draw] = id;
        }
    }
}

@compute @workgroup_size(WG)
fn argmax_partial(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    partial_pass(wg.x, wg.y, 0u, lid, false);
}

@compute @workgroup_size(WG)
fn argmax_final(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    final_pass(wg.y, 0u, lid, true);
}

@compute @workgroup_size(WG)
fn gumbel_partial(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    partial_pass(wg.x, wg.y, wg.z, lid, true);
}

@compute @workgroup_size(WG)
fn gumbel_final(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    final_pass(wg.y, wg.x, lid, false);
}

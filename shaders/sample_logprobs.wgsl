// Log-probabilities per row of logits (see sample_common.wgsl), after the argmax or the draw
// of sample_argmax.wgsl, for rows whose n_top > 0: logprob_partial (n_groups × n_rows) sums
// exp(logit − max) over its chunk and selects its n_top largest keys K by repeated workgroup
// max below the previous pick; logprob_final (one workgroup per row) adds the sums, merges
// the n_groups·n_top candidates the same way and writes the row's record in `lp`: the
// log-softmax at temperature 1 of the chosen token out[row · n_draws] and of the top n_top,
// in K order. Banned (−inf) and NaN logits add nothing to the sum.
#include "sample_common.wgsl"

var<workgroup> n_top_sh: u32;

// The row's n_top, as a value every invocation agrees on (it bounds loops with barriers).
fn row_n_top(row: u32, lid: u32) -> u32 {
    if (lid == 0u) {
        n_top_sh = rows[row].n_top;
    }
    return workgroupUniformLoad(&n_top_sh);
}

@compute @workgroup_size(WG)
fn logprob_partial(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let g = wg.x;
    let row = wg.y;
    let n_top = row_n_top(row, lid);
    if (n_top == 0u) {
        return;
    }
    let start = g * params.chunk;
    let end = min(start + params.chunk, params.n_vocab);
    let lmax = bitcast<f32>(state[st(row, MAX_BITS)]);
    var s = 0.0;
    for (var i = start + lid; i < end; i += WG) {
        let l = logit(row, i);
        if (l >= NEG_MAX) {
            s += exp(l - lmax);
        }
    }
    let total = wg_sum(lid, s);
    let base = (row * params.n_groups + g) * LP_STRIDE;
    // Candidates of each round are the keys below the previous pick.
    var last = vec2<u32>(NONE, NONE);
    var found = 0u;
    for (var r = 0u; r < n_top; r++) {
        var best = vec2<u32>(0u, 0u);
        for (var i = start + lid; i < end; i += WG) {
            let l = logit(row, i);
            let k = vec2<u32>(order_key(l), index_key(i));
            if (l >= NEG_MAX && key_greater(last, k) && key_greater(k, best)) {
                best = k;
            }
        }
        best = wg_keymax(lid, best);
        if (best.x != 0u) {
            last = best;
            if (lid == 0u) {
                lp_part[base + 1u + found] = best;
            }
            found += 1u;
        }
    }
    if (lid == 0u) {
        lp_part[base] = vec2<u32>(bitcast<u32>(total), found);
    }
}

@compute @workgroup_size(WG)
fn logprob_final(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let row = wg.y;
    let n_top = row_n_top(row, lid);
    if (n_top == 0u) {
        return;
    }
    let part0 = row * params.n_groups * LP_STRIDE;
    var s = 0.0;
    for (var g = lid; g < params.n_groups; g += WG) {
        s += bitcast<f32>(lp_part[part0 + g * LP_STRIDE].x);
    }
    let log_z = log(wg_sum(lid, s));
    let lmax = bitcast<f32>(state[st(row, MAX_BITS)]);
    let rec = row * LP_WORDS;
    var last = vec2<u32>(NONE, NONE);
    var n = 0u;
    let n_cand = params.n_groups * n_top;
    for (var r = 0u; r < n_top; r++) {
        var best = vec2<u32>(0u, 0u);
        for (var j = lid; j < n_cand; j += WG) {
            let g = j / n_top;
            let k = j - g * n_top;
            let head = part0 + g * LP_STRIDE;
            if (k < lp_part[head].y) {
                let c = lp_part[head + 1u + k];
                if (key_greater(last, c) && key_greater(c, best)) {
                    best = c;
                }
            }
        }
        best = wg_keymax(lid, best);
        if (best.x != 0u) {
            last = best;
            if (lid == 0u) {
                lp[rec + LP_TOP + 2u * n] = params.n_vocab - 1u - best.y;
                lp[rec + LP_TOP + 2u * n + 1u] = bitcast<u32>((key_logit(best.x) - lmax) - log_z);
            }
            n += 1u;
        }
    }
    if (lid == 0u) {
        let id = out[row * params.n_draws];
        lp[rec + LP_ID] = id;
        lp[rec + LP_LOGPROB] = bitcast<u32>((logit(row, id) - lmax) - log_z);
        lp[rec + LP_N] = n;
    }
}

// Speculative decoding with a sampled draft: the rule of Leviathan et al. and Chen et al.
// (2023), after the passes of sample_argmax.wgsl (and sample_threshold.wgsl's search) have
// run for the step. p is the row's distribution under its settings — softmax((logit − max)/T)
// over the survivors (top-k, top-p, min-p), as the Gumbel draw samples it — and q the draft
// model's, recorded by the draft model's own sampler with the request's settings.
//
// Draft side, rows with q_row set and no drafted token: mass_partial → mass_final →
// q_write store the row's p in q[q_row] (q_stride words: the target's vocabulary; ids the
// draft does not have are 0).
// Target side, rows with a drafted token x and its q_row: mass_partial → mass_final (p(x),
// q(x)) → residual_partial (n_groups × n_rows × n_draws: Gumbel-max over
// ln max(0, p − q), a draw from the residual norm(max(0, p − q))) → verify_final (n_draws ×
// n_rows): with U uniform, keep x when U · q(x) < p(x) (probability min(1, p(x)/q(x))),
// else the residual draw. The output token then follows p exactly. On rejection
// p(x) < q(x), so the residual never gives x back: the host accepts a draft exactly where
// the row's id equals it. A residual with no mass (p = q up to rounding, and U rejected
// anyway) keeps the row's plain draw from p. U and the residual's Gumbel variates are keyed
// apart from the plain draw's (seed_hi mixed with their own constants).
#include "sample_common.wgsl"

// q: [q_rows, q_stride] f32, the draft's distribution per drafted position
@group(0) @binding(9) var<storage, read_write> q: array<f32>;

const ACCEPT_KEY: u32 = 0x5bd1e995u;
const RESIDUAL_KEY: u32 = 0x27d4eb2fu;

fn is_verify(r: Row) -> bool {
    return r.greedy == 0u && r.draft != NONE && r.q_row != NONE;
}

fn is_record(r: Row) -> bool {
    return r.greedy == 0u && r.draft == NONE && r.q_row != NONE;
}

// exp((logit − max)/T) for a survivor of the row's settings, 0 otherwise.
fn weight(row: u32, r: Row, i: u32) -> f32 {
    let v = logit(row, i);
    let d = v - bitcast<f32>(state[st(row, MAX_BITS)]);
    if (!(d >= r.log_min_p) || !key_at_least(order_key(v), index_key(i), state[st(row, THR_V)], state[st(row, THR_I)])) {
        return 0.0;
    }
    return exp(d * r.inv_temp);
}

fn q_at(r: Row, i: u32) -> f32 {
    if (i >= params.q_stride) {
        return 0.0;
    }
    return q[r.q_row * params.q_stride + i];
}

@compute @workgroup_size(WG)
fn mass_partial(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let g = wg.x;
    let row = wg.y;
    let r = rows[row];
    var sum = 0.0;
    if (is_verify(r) || is_record(r)) {
        let start = g * params.chunk;
        let end = min(start + params.chunk, params.n_vocab);
        for (var i = start + lid; i < end; i += WG) {
            sum += weight(row, r, i);
        }
    }
    let total = wg_sum(lid, sum);
    if (lid == 0u && (is_verify(r) || is_record(r))) {
        partials[row * params.n_draws * params.n_groups + g] = vec2<u32>(bitcast<u32>(total), 0u);
    }
}

@compute @workgroup_size(WG)
fn mass_final(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let row = wg.y;
    let r = rows[row];
    let live = is_verify(r) || is_record(r);
    var sum = 0.0;
    if (live) {
        for (var j = lid; j < params.n_groups; j += WG) {
            sum += bitcast<f32>(partials[row * params.n_draws * params.n_groups + j].x);
        }
    }
    let mass = wg_sum(lid, sum);
    if (lid == 0u && live) {
        state[st(row, MASS_BITS)] = bitcast<u32>(mass);
        if (is_verify(r)) {
            var px = 0.0;
            if (r.draft < params.n_vocab && mass > 0.0) {
                px = weight(row, r, r.draft) / mass;
            }
            state[st(row, PX_BITS)] = bitcast<u32>(px);
            state[st(row, QX_BITS)] = bitcast<u32>(q_at(r, r.draft));
        }
    }
}

// Draft side: q[q_row] = p over the target's ids (q_stride of them).
@compute @workgroup_size(WG)
fn q_write(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let g = wg.x;
    let row = wg.y;
    let r = rows[row];
    if (!is_record(r)) {
        return;
    }
    let mass = bitcast<f32>(state[st(row, MASS_BITS)]);
    let start = g * params.chunk;
    // The last workgroup also zeroes the ids past the draft's vocabulary.
    var end = min(start + params.chunk, params.n_vocab);
    if (g + 1u == params.n_groups) {
        end = params.q_stride;
    }
    end = min(end, params.q_stride);
    for (var i = start + lid; i < end; i += WG) {
        var p = 0.0;
        if (i < params.n_vocab && mass > 0.0) {
            p = weight(row, r, i) / mass;
        }
        q[r.q_row * params.q_stride + i] = p;
    }
}

@compute @workgroup_size(WG)
fn residual_partial(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let g = wg.x;
    let row = wg.y;
    let draw = wg.z;
    let r = rows[row];
    let live = is_verify(r);
    var bv = NEG_MAX;
    var bi = NONE;
    if (live) {
        let mass = bitcast<f32>(state[st(row, MASS_BITS)]);
        let start = g * params.chunk;
        let end = min(start + params.chunk, params.n_vocab);
        let key_hi = r.seed_hi ^ RESIDUAL_KEY;
        for (var i = start + lid; i < end; i += WG) {
            let w = weight(row, r, i);
            let rest = select(0.0, w / mass, mass > 0.0) - q_at(r, i);
            if (rest > 0.0) {
                let v = log(rest) + gumbel(i, r.step + draw, r.seed_lo, key_hi);
                if (better(v, i, bv, bi)) {
                    bv = v;
                    bi = i;
                }
            }
        }
    }
    let best = wg_argmax(lid, bv, bi);
    if (lid == 0u && live) {
        partials[(row * params.n_draws + draw) * params.n_groups + g] = best;
    }
}

@compute @workgroup_size(WG)
fn verify_final(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let draw = wg.x;
    let row = wg.y;
    let r = rows[row];
    let live = is_verify(r);
    let best = partials_best(row, draw, lid, live);
    // A row with a broken logit keeps its NONE.
    if (lid == 0u && live && state[st(row, MAX_ID)] != NONE) {
        let px = bitcast<f32>(state[st(row, PX_BITS)]);
        let qx = bitcast<f32>(state[st(row, QX_BITS)]);
        let u = uniform01(NONE, r.step + draw, r.seed_lo, r.seed_hi ^ ACCEPT_KEY);
        let at = row * params.n_draws + draw;
        if (u * qx < px) {
            out[at] = r.draft;
        } else if (best.y < params.n_vocab) {
            out[at] = best.y;
        }
    }
}

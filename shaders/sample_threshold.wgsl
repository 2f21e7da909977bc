// The exact truncation threshold per row of logits (see sample_common.wgsl), found before the
// Gumbel-max draws of sample_argmax.wgsl:
//   init (one workgroup per row)
//   → [topk_hist (n_groups × n_rows) → topk_select (n_rows)] × n_levels   (if a row has top-k)
//   → [topp_hist → topp_select] × n_levels                                (if a row has top-p)
// A radix select over K (8 bits of the logit key per level, then the index bits) finds the
// k-th largest K (top-k, counts) and the first K where the cumulative untempered softmax mass
// over the top-k set reaches top_p·Z (top-p, 64-bit fixed-point masses in u32 atomics). A row
// whose settings leave a search off (or that is greedy) is done from the start. min-p is the
// test logit − max ≥ ln(min_p), applied by the draw.
#include "sample_common.wgsl"

var<workgroup> h_cnt: array<atomic<u32>, RADIX>;
var<workgroup> h_lo: array<atomic<u32>, RADIX>;
var<workgroup> h_hi: array<atomic<u32>, RADIX>;

// The histogram kernels give each thread one bucket.
const_assert WG == RADIX;

fn hist_at(row: u32, bucket: u32, w: u32) -> u32 {
    return (row * RADIX + bucket) * 3u + w;
}

// Level → (word: 0 logit key / 1 index key, shift, width).
fn level_geom(level: u32) -> vec3<u32> {
    if (level < 4u) {
        return vec3<u32>(0u, 24u - 8u * level, 8u);
    }
    let hi = params.index_bits - 8u * (level - 4u);
    let shift = select(0u, hi - 8u, hi > 8u);
    return vec3<u32>(1u, shift, hi - shift);
}

// ---- 64-bit fixed point (low, high) ----

fn add64(a: vec2<u32>, b: vec2<u32>) -> vec2<u32> {
    let lo = a.x + b.x;
    return vec2<u32>(lo, a.y + b.y + select(0u, 1u, lo < a.x));
}

fn ge64(a: vec2<u32>, b: vec2<u32>) -> bool {
    return a.y > b.y || (a.y == b.y && a.x >= b.x);
}

// w in [0, 1] as w·2^40 (high word ≤ 256).
fn fixed_mass(w: f32) -> vec2<u32> {
    let sw = w * 256.0;
    let hi = floor(sw);
    return vec2<u32>(u32((sw - hi) * 4294967296.0), u32(hi));
}

// Clears the row's histogram and search state; a search its settings leave off is done.
@compute @workgroup_size(WG)
fn init(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let row = wg.y;
    for (var w = 0u; w < 3u; w++) {
        atomicStore(&hist[hist_at(row, lid, w)], 0u);
    }
    if (lid == 0u) {
        let r = rows[row];
        for (var j = THR_V; j < P_BLOCK + BLOCK_WORDS; j++) {
            state[st(row, j)] = 0u;
        }
        state[st(row, K_BLOCK + REMAIN)] = r.top_k;
        let k_off = r.greedy != 0u || r.top_k == 0u || r.top_k >= params.n_vocab;
        state[st(row, K_BLOCK + DONE)] = select(0u, 1u, k_off);
        state[st(row, P_BLOCK + DONE)] = select(0u, 1u, r.greedy != 0u || r.top_p >= 1.0);
    }
}

// Histogram of the next digit of K over the row's candidates still in the search; with
// `weighted`, only the top-k set and with 64-bit masses exp(logit − max)·2^40.
fn hist_pass(g: u32, row: u32, lid: u32, block: u32, weighted: bool) {
    atomicStore(&h_cnt[lid], 0u);
    atomicStore(&h_lo[lid], 0u);
    atomicStore(&h_hi[lid], 0u);
    workgroupBarrier();
    if (state[st(row, block + DONE)] == 0u) {
        let geom = level_geom(state[st(row, block + LEVEL)]);
        let pv = state[st(row, block + PREFIX_V)];
        let pi = state[st(row, block + PREFIX_I)];
        let mv = state[st(row, block + MASK_V)];
        let mi = state[st(row, block + MASK_I)];
        let kv_thr = state[st(row, KTHR_V)];
        let ki_thr = state[st(row, KTHR_I)];
        let lmax = bitcast<f32>(state[st(row, MAX_BITS)]);
        let digit_mask = (1u << geom.z) - 1u;
        let start = g * params.chunk;
        let end = min(start + params.chunk, params.n_vocab);
        for (var i = start + lid; i < end; i += WG) {
            let l = logit(row, i);
            let kv = order_key(l);
            let ki = index_key(i);
            if ((kv & mv) != pv || (ki & mi) != pi) {
                continue;
            }
            if (weighted && !key_at_least(kv, ki, kv_thr, ki_thr)) {
                continue;
            }
            let d = (select(kv, ki, geom.x == 1u) >> geom.y) & digit_mask;
            atomicAdd(&h_cnt[d], 1u);
            if (weighted) {
                let m = fixed_mass(exp(l - lmax));
                let old = atomicAdd(&h_lo[d], m.x);
                atomicAdd(&h_hi[d], m.y + select(0u, 1u, old + m.x < old));
            }
        }
    }
    workgroupBarrier();
    let c = atomicLoad(&h_cnt[lid]);
    if (c != 0u) {
        atomicAdd(&hist[hist_at(row, lid, 0u)], c);
        if (weighted) {
            let lo = atomicLoad(&h_lo[lid]);
            let old = atomicAdd(&hist[hist_at(row, lid, 1u)], lo);
            atomicAdd(&hist[hist_at(row, lid, 2u)], atomicLoad(&h_hi[lid]) + select(0u, 1u, old + lo < old));
        }
    }
}

// Fixes the chosen digit into the block's prefix and clears the row's histogram.
fn advance(row: u32, block: u32, level: u32, digit: u32) {
    let geom = level_geom(level);
    let m = ((1u << geom.z) - 1u) << geom.y;
    let w = select(PREFIX_V, PREFIX_I, geom.x == 1u);
    state[st(row, block + w)] |= digit << geom.y;
    state[st(row, block + w + 2u)] |= m;
    state[st(row, block + LEVEL)] = level + 1u;
    for (var j = 0u; j < RADIX * 3u; j++) {
        atomicStore(&hist[row * RADIX * 3u + j], 0u);
    }
}

@compute @workgroup_size(WG)
fn topk_hist(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    hist_pass(wg.x, wg.y, lid, K_BLOCK, false);
}

// The bucket holding the REMAIN-th largest K; done once that bucket is wholly kept.
@compute @workgroup_size(1)
fn topk_select(@builtin(workgroup_id) wg: vec3<u32>) {
    let row = wg.y;
    let b = K_BLOCK;
    if (state[st(row, b + DONE)] != 0u) {
        return;
    }
    let level = state[st(row, b + LEVEL)];
    let r = state[st(row, b + REMAIN)];
    var above = 0u;
    var digit = 0u;
    var count = 0u;
    var found = false;
    for (var j = 0u; j < RADIX; j++) {
        let d = RADIX - 1u - j;
        let c = atomicLoad(&hist[hist_at(row, d, 0u)]);
        if (!found) {
            if (above + c >= r) {
                found = true;
                digit = d;
                count = c;
            } else {
                above += c;
            }
        }
    }
    advance(row, b, level, digit);
    state[st(row, b + REMAIN)] = r - above;
    if (!found || r - above == count || level + 1u >= params.n_levels) {
        state[st(row, b + DONE)] = 1u;
        state[st(row, KTHR_V)] = state[st(row, b + PREFIX_V)];
        state[st(row, KTHR_I)] = state[st(row, b + PREFIX_I)];
        state[st(row, THR_V)] = state[st(row, b + PREFIX_V)];
        state[st(row, THR_I)] = state[st(row, b + PREFIX_I)];
    }
}

@compute @workgroup_size(WG)
fn topp_hist(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    hist_pass(wg.x, wg.y, lid, P_BLOCK, true);
}

// The bucket where the cumulative mass (in K order) first reaches the target
// ceil(top_p · Z); done once that bucket holds one token.
@compute @workgroup_size(1)
fn topp_select(@builtin(workgroup_id) wg: vec3<u32>) {
    let row = wg.y;
    let b = P_BLOCK;
    if (state[st(row, b + DONE)] != 0u) {
        return;
    }
    let level = state[st(row, b + LEVEL)];
    if (level == 0u) {
        var z = vec2<u32>(0u, 0u);
        for (var d = 0u; d < RADIX; d++) {
            z = add64(z, vec2<u32>(atomicLoad(&hist[hist_at(row, d, 1u)]), atomicLoad(&hist[hist_at(row, d, 2u)])));
        }
        let zf = f32(z.y) * 4294967296.0 + f32(z.x);
        let tf = rows[row].top_p * zf;
        let t_hi = floor(tf / 4294967296.0);
        var t = vec2<u32>(u32(ceil(tf - t_hi * 4294967296.0)), u32(t_hi));
        if (ge64(t, z)) {
            t = z;
        }
        if (t.x == 0u && t.y == 0u) {
            t.x = 1u;
        }
        state[st(row, b + TARGET_LO)] = t.x;
        state[st(row, b + TARGET_HI)] = t.y;
    }
    let goal = vec2<u32>(state[st(row, b + TARGET_LO)], state[st(row, b + TARGET_HI)]);
    var above = vec2<u32>(state[st(row, b + ABOVE_LO)], state[st(row, b + ABOVE_HI)]);
    var digit = 0u;
    var count = 0u;
    var found = false;
    for (var j = 0u; j < RADIX; j++) {
        let d = RADIX - 1u - j;
        let next = add64(above, vec2<u32>(atomicLoad(&hist[hist_at(row, d, 1u)]), atomicLoad(&hist[hist_at(row, d, 2u)])));
        if (!found) {
            if (ge64(next, goal)) {
                found = true;
                digit = d;
                count = atomicLoad(&hist[hist_at(row, d, 0u)]);
            } else {
                above = next;
            }
        }
    }
    advance(row, b, level, digit);
    state[st(row, b + ABOVE_LO)] = above.x;
    state[st(row, b + ABOVE_HI)] = above.y;
    if (!found || count == 1u || level + 1u >= params.n_levels) {
        state[st(row, b + DONE)] = 1u;
        state[st(row, THR_V)] = state[st(row, b + PREFIX_V)];
        state[st(row, THR_I)] = state[st(row, b + PREFIX_I)];
    }
}

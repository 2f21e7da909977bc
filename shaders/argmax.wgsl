// Greedy argmax and exact sampling over one row of logits, so only ids are read back.
//
// Greedy: argmax_partial (n_groups workgroups, each a chunk) → argmax_final (one workgroup);
// the lowest index wins ties. Sampling (Sampler::encode_sample) then finds the exact
// truncation threshold and draws by Gumbel-max:
//   init → argmax_partial → argmax_final (max logit)
//   → [topk_hist → topk_select] × n_levels      (if top-k is on)
//   → [topp_hist → topp_select] × n_levels      (if top-p is on)
//   → gumbel_partial (n_groups × n_draws) → gumbel_final (one workgroup per draw).
// Candidates are ordered by the composite key K = (order_key(logit), n_vocab−1−index):
// descending K is the CPU sampler's order (logit descending by total order, then lowest
// index), and K is unique per token, so "the first m candidates" is exactly K ≥ threshold.
// A radix select over K (8 bits of the logit key per level, then the index bits) finds the
// k-th largest K (top-k, counts) and the first K where the cumulative untempered softmax
// mass over the top-k set reaches top_p·Z (top-p, 64-bit fixed-point masses in u32
// atomics). min-p is the test logit − max ≥ ln(min_p). Gumbel-max over the survivors of
// (logit − max)/T + G, G = −ln(−ln U) from a counter-based hash of (seed, step + draw,
// index), draws exactly from softmax(logit/T) restricted to them.
// Log-probabilities (when n_top > 0), after either: logprob_partial (n_groups) sums
// exp(logit − max) over its chunk and selects its n_top largest keys K by repeated
// workgroup max below the previous pick; logprob_final (one workgroup) adds the sums,
// merges the n_groups·n_top candidates the same way and writes the record `lp`:
// log-softmax at temperature 1 of the chosen token out[0] and of the top n_top, in K order.
// Tokens at −inf (banned) or NaN are never candidates and add nothing to the sum.
// Defines: WG (threads per workgroup; must equal RADIX for the histogram kernels).

struct Params {
    n_vocab: u32,
    // workgroups per row in the partial and histogram passes, and logits per workgroup
    n_groups: u32,
    chunk: u32,
    // bits of n_vocab − 1; radix levels = 4 + ceil(index_bits / 8)
    index_bits: u32,
    n_levels: u32,
    // 0 = off
    top_k: u32,
    top_p: f32,
    // −f32::MAX = off
    log_min_p: f32,
    inv_temp: f32,
    seed_lo: u32,
    seed_hi: u32,
    step: u32,
    // log-probability alternatives; 0 = no log-probabilities
    n_top: u32,
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
}

@group(0) @binding(0) var<uniform> params: Params;
// logits: [n_vocab] f32
@group(0) @binding(1) var<storage, read> logits: array<f32>;
// partials: [max_draws, n_groups] (f32 bits of the best score, its index)
@group(0) @binding(2) var<storage, read_write> partials: array<vec2<u32>>;
// state: [STATE_WORDS] u32, layout below
@group(0) @binding(3) var<storage, read_write> state: array<u32>;
// hist: [RADIX, 3] (count, mass low word, mass high word)
@group(0) @binding(4) var<storage, read_write> hist: array<atomic<u32>>;
// out: [max_draws] u32 token ids
@group(0) @binding(5) var<storage, read_write> out: array<u32>;
// lp_part: [n_groups, 1 + n_top] per workgroup: (Σ exp(logit − max) f32 bits, keys found),
// then its largest keys K = (order_key(logit), index_key), descending
@group(0) @binding(6) var<storage, read_write> lp_part: array<vec2<u32>>;
// lp: [LP_TOP + 2 · n_top] u32: the chosen id, its log-probability (f32 bits), how many
// alternatives follow, then (id, log-probability f32 bits) each, most likely first
@group(0) @binding(7) var<storage, read_write> lp: array<u32>;

const RADIX: u32 = 256u;
// The histogram kernels give each thread one bucket.
const_assert WG == RADIX;
const NONE: u32 = 0xffffffffu;
// The most negative finite f32, spelled exactly (a rounded decimal is out of range for Tint).
const NEG_MAX: f32 = -0x1.fffffep+127f;

// state words
const MAX_BITS: u32 = 0u;
const MAX_ID: u32 = 1u;
// survivors are K ≥ (THR_V, THR_I)
const THR_V: u32 = 2u;
const THR_I: u32 = 3u;
// the top-k threshold, which bounds the top-p search
const KTHR_V: u32 = 4u;
const KTHR_I: u32 = 5u;
// radix-select blocks for top-k and top-p, BLOCK_WORDS each
const K_BLOCK: u32 = 8u;
const P_BLOCK: u32 = 18u;
const BLOCK_WORDS: u32 = 10u;
const PREFIX_V: u32 = 0u;
const PREFIX_I: u32 = 1u;
const MASK_V: u32 = 2u;
const MASK_I: u32 = 3u;
const LEVEL: u32 = 4u;
const DONE: u32 = 5u;
// top-k: rank still wanted inside the current bucket
const REMAIN: u32 = 6u;
// top-p: mass above the current bucket, and the target mass (64-bit, low word first)
const ABOVE_LO: u32 = 6u;
const ABOVE_HI: u32 = 7u;
const TARGET_LO: u32 = 8u;
const TARGET_HI: u32 = 9u;

// lp words
const LP_ID: u32 = 0u;
const LP_LOGPROB: u32 = 1u;
const LP_N: u32 = 2u;
const LP_TOP: u32 = 3u;

var<workgroup> red_v: array<f32, WG>;
var<workgroup> red_i: array<u32, WG>;
var<workgroup> red_k: array<vec2<u32>, WG>;
var<workgroup> h_cnt: array<atomic<u32>, RADIX>;
var<workgroup> h_lo: array<atomic<u32>, RADIX>;
var<workgroup> h_hi: array<atomic<u32>, RADIX>;

// ---- ordering ----

fn better(v: f32, i: u32, bv: f32, bi: u32) -> bool {
    return v > bv || (v == bv && i < bi);
}

// Monotone map of f32 (total order, as f32::total_cmp) to u32.
fn order_key(v: f32) -> u32 {
    let b = bitcast<u32>(v);
    return select(b | 0x80000000u, ~b, (b & 0x80000000u) != 0u);
}

// The logit whose order_key is k.
fn key_logit(k: u32) -> f32 {
    return bitcast<f32>(select(~k, k & 0x7fffffffu, (k & 0x80000000u) != 0u));
}

fn index_key(i: u32) -> u32 {
    return params.n_vocab - 1u - i;
}

fn key_at_least(kv: u32, ki: u32, tv: u32, ti: u32) -> bool {
    return kv > tv || (kv == tv && ki >= ti);
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

// ---- workgroup argmax ----

fn wg_argmax(lid: u32, v: f32, i: u32) -> vec2<u32> {
    red_v[lid] = v;
    red_i[lid] = i;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s >>= 1u) {
        if (lid < s && better(red_v[lid + s], red_i[lid + s], red_v[lid], red_i[lid])) {
            red_v[lid] = red_v[lid + s];
            red_i[lid] = red_i[lid + s];
        }
        workgroupBarrier();
    }
    return vec2<u32>(bitcast<u32>(red_v[0]), red_i[0]);
}

fn wg_sum(lid: u32, v: f32) -> f32 {
    red_v[lid] = v;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s >>= 1u) {
        if (lid < s) {
            red_v[lid] += red_v[lid + s];
        }
        workgroupBarrier();
    }
    let r = red_v[0];
    // Everyone has read the result before red_v is reused.
    workgroupBarrier();
    return r;
}

fn key_greater(a: vec2<u32>, b: vec2<u32>) -> bool {
    return a.x > b.x || (a.x == b.x && a.y > b.y);
}

// The largest key K across the workgroup; (0, 0) (below every live logit) = none.
fn wg_keymax(lid: u32, k: vec2<u32>) -> vec2<u32> {
    red_k[lid] = k;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s >>= 1u) {
        if (lid < s && key_greater(red_k[lid + s], red_k[lid])) {
            red_k[lid] = red_k[lid + s];
        }
        workgroupBarrier();
    }
    let r = red_k[0];
    workgroupBarrier();
    return r;
}

// ---- Gumbel noise ----

// pcg4d (Jarzynski & Olano, "Hash Functions for GPU Rendering", 2020).
fn pcg4d(a: vec4<u32>) -> vec4<u32> {
    var v = a * 1664525u + 1013904223u;
    v.x += v.y * v.w;
    v.y += v.z * v.x;
    v.z += v.x * v.y;
    v.w += v.y * v.z;
    v ^= v >> vec4<u32>(16u);
    v.x += v.y * v.w;
    v.y += v.z * v.x;
    v.z += v.x * v.y;
    v.w += v.y * v.z;
    return v;
}

// lowbias32 (Wellons) as a final mix.
fn mix32(a: u32) -> u32 {
    var x = a;
    x ^= x >> 16u;
    x *= 0x7feb352du;
    x ^= x >> 15u;
    x *= 0x846ca68bu;
    x ^= x >> 16u;
    return x;
}

const TWO_POW_M32: f32 = 2.3283064365386963e-10;
const V_MIN: f32 = 1.1641532182693481e-10;
const V_MAX: f32 = 0.99999994;

// A standard Gumbel variate for (seed, step, index). U = 1 − v; E = −ln(1 − v) keeps full
// relative precision for small E (the large-G tail that decides the winner).
fn gumbel(i: u32, step: u32) -> f32 {
    let h = pcg4d(vec4<u32>(i, step, params.seed_lo, params.seed_hi));
    let v = clamp(f32(mix32(h.x ^ h.z)) * TWO_POW_M32, V_MIN, V_MAX);
    var e: f32;
    if (v < 0.25) {
        // −ln(1 − v) = 2·atanh(s), s = v / (2 − v) ≤ 1/7.
        let s = v / (2.0 - v);
        let s2 = s * s;
        e = 2.0 * s * (1.0 + s2 * (1.0 / 3.0 + s2 * (0.2 + s2 * (1.0 / 7.0 + s2 * (1.0 / 9.0 + s2 * (1.0 / 11.0))))));
    } else {
        e = -log(1.0 - v);
    }
    return -log(e);
}

// ---- argmax (greedy) and Gumbel-max passes ----

fn partial_pass(g: u32, draw: u32, lid: u32, sample: bool) {
    let start = g * params.chunk;
    let end = min(start + params.chunk, params.n_vocab);
    var bv = NEG_MAX;
    var bi = NONE;
    let lmax = bitcast<f32>(state[MAX_BITS]);
    let tv = state[THR_V];
    let ti = state[THR_I];
    let step = params.step + draw;
    for (var i = start + lid; i < end; i += WG) {
        var v = logits[i];
        if (sample) {
            let d = v - lmax;
            if (!(d >= params.log_min_p) || !key_at_least(order_key(v), index_key(i), tv, ti)) {
                continue;
            }
            v = d * params.inv_temp + gumbel(i, step);
        }
        if (better(v, i, bv, bi)) {
            bv = v;
            bi = i;
        }
    }
    let best = wg_argmax(lid, bv, bi);
    if (lid == 0u) {
        partials[draw * params.n_groups + g] = best;
    }
}

fn final_pass(draw: u32, lid: u32, greedy: bool) {
    var bv = NEG_MAX;
    var bi = NONE;
    let base = draw * params.n_groups;
    for (var j = lid; j < params.n_groups; j += WG) {
        let p = partials[base + j];
        if (better(bitcast<f32>(p.x), p.y, bv, bi)) {
            bv = bitcast<f32>(p.x);
            bi = p.y;
        }
    }
    let best = wg_argmax(lid, bv, bi);
    if (lid == 0u) {
        let id = select(best.y, 0u, best.y >= params.n_vocab);
        out[draw] = id;
        if (greedy) {
            state[MAX_BITS] = best.x;
            state[MAX_ID] = id;
        }
    }
}

@compute @workgroup_size(WG)
fn argmax_partial(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    partial_pass(wg.x, 0u, lid, false);
}

@compute @workgroup_size(WG)
fn argmax_final(@builtin(local_invocation_index) lid: u32) {
    final_pass(0u, lid, true);
}

@compute @workgroup_size(WG)
fn gumbel_partial(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    partial_pass(wg.x, wg.y, lid, true);
}

@compute @workgroup_size(WG)
fn gumbel_final(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    final_pass(wg.y * nwg.x + wg.x, lid, false);
}

// ---- threshold search ----

@compute @workgroup_size(1)
fn init() {
    for (var j = 0u; j < RADIX * 3u; j++) {
        atomicStore(&hist[j], 0u);
    }
    for (var j = THR_V; j < P_BLOCK + BLOCK_WORDS; j++) {
        state[j] = 0u;
    }
    state[K_BLOCK + REMAIN] = params.top_k;
    state[K_BLOCK + DONE] = select(0u, 1u, params.top_k == 0u || params.top_k >= params.n_vocab);
}

// Histogram of the next digit of K over the candidates still in the search; with
// `weighted`, only the top-k set and with 64-bit masses exp(logit − max)·2^40.
fn hist_pass(g: u32, lid: u32, block: u32, weighted: bool) {
    atomicStore(&h_cnt[lid], 0u);
    atomicStore(&h_lo[lid], 0u);
    atomicStore(&h_hi[lid], 0u);
    workgroupBarrier();
    if (state[block + DONE] == 0u) {
        let geom = level_geom(state[block + LEVEL]);
        let pv = state[block + PREFIX_V];
        let pi = state[block + PREFIX_I];
        let mv = state[block + MASK_V];
        let mi = state[block + MASK_I];
        let kv_thr = state[KTHR_V];
        let ki_thr = state[KTHR_I];
        let lmax = bitcast<f32>(state[MAX_BITS]);
        let digit_mask = (1u << geom.z) - 1u;
        let start = g * params.chunk;
        let end = min(start + params.chunk, params.n_vocab);
        for (var i = start + lid; i < end; i += WG) {
            let l = logits[i];
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
        atomicAdd(&hist[lid * 3u], c);
        if (weighted) {
            let lo = atomicLoad(&h_lo[lid]);
            let old = atomicAdd(&hist[lid * 3u + 1u], lo);
            atomicAdd(&hist[lid * 3u + 2u], atomicLoad(&h_hi[lid]) + select(0u, 1u, old + lo < old));
        }
    }
}

// Fixes the chosen digit into the block's prefix and clears the histogram.
fn advance(block: u32, level: u32, digit: u32) {
    let geom = level_geom(level);
    let m = ((1u << geom.z) - 1u) << geom.y;
    let w = select(PREFIX_V, PREFIX_I, geom.x == 1u);
    state[block + w] |= digit << geom.y;
    state[block + w + 2u] |= m;
    state[block + LEVEL] = level + 1u;
    for (var j = 0u; j < RADIX * 3u; j++) {
        atomicStore(&hist[j], 0u);
    }
}

@compute @workgroup_size(WG)
fn topk_hist(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    hist_pass(wg.x, lid, K_BLOCK, false);
}

// The bucket holding the REMAIN-th largest K; done once that bucket is wholly kept.
@compute @workgroup_size(1)
fn topk_select() {
    let b = K_BLOCK;
    if (state[b + DONE] != 0u) {
        return;
    }
    let level = state[b + LEVEL];
    let r = state[b + REMAIN];
    var above = 0u;
    var digit = 0u;
    var count = 0u;
    var found = false;
    for (var j = 0u; j < RADIX; j++) {
        let d = RADIX - 1u - j;
        let c = atomicLoad(&hist[d * 3u]);
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
    advance(b, level, digit);
    state[b + REMAIN] = r - above;
    if (!found || r - above == count || level + 1u >= params.n_levels) {
        state[b + DONE] = 1u;
        state[KTHR_V] = state[b + PREFIX_V];
        state[KTHR_I] = state[b + PREFIX_I];
        state[THR_V] = state[b + PREFIX_V];
        state[THR_I] = state[b + PREFIX_I];
    }
}

@compute @workgroup_size(WG)
fn topp_hist(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    hist_pass(wg.x, lid, P_BLOCK, true);
}

// The bucket where the cumulative mass (in K order) first reaches the target
// ceil(top_p · Z); done once that bucket holds one token.
@compute @workgroup_size(1)
fn topp_select() {
    let b = P_BLOCK;
    if (state[b + DONE] != 0u) {
        return;
    }
    let level = state[b + LEVEL];
    if (level == 0u) {
        var z = vec2<u32>(0u, 0u);
        for (var d = 0u; d < RADIX; d++) {
            z = add64(z, vec2<u32>(atomicLoad(&hist[d * 3u + 1u]), atomicLoad(&hist[d * 3u + 2u])));
        }
        let zf = f32(z.y) * 4294967296.0 + f32(z.x);
        let tf = params.top_p * zf;
        let t_hi = floor(tf / 4294967296.0);
        var t = vec2<u32>(u32(ceil(tf - t_hi * 4294967296.0)), u32(t_hi));
        if (ge64(t, z)) {
            t = z;
        }
        if (t.x == 0u && t.y == 0u) {
            t.x = 1u;
        }
        state[b + TARGET_LO] = t.x;
        state[b + TARGET_HI] = t.y;
    }
    let goal = vec2<u32>(state[b + TARGET_LO], state[b + TARGET_HI]);
    var above = vec2<u32>(state[b + ABOVE_LO], state[b + ABOVE_HI]);
    var digit = 0u;
    var count = 0u;
    var found = false;
    for (var j = 0u; j < RADIX; j++) {
        let d = RADIX - 1u - j;
        let next = add64(above, vec2<u32>(atomicLoad(&hist[d * 3u + 1u]), atomicLoad(&hist[d * 3u + 2u])));
        if (!found) {
            if (ge64(next, goal)) {
                found = true;
                digit = d;
                count = atomicLoad(&hist[d * 3u]);
            } else {
                above = next;
            }
        }
    }
    advance(b, level, digit);
    state[b + ABOVE_LO] = above.x;
    state[b + ABOVE_HI] = above.y;
    if (!found || count == 1u || level + 1u >= params.n_levels) {
        state[b + DONE] = 1u;
        state[THR_V] = state[b + PREFIX_V];
        state[THR_I] = state[b + PREFIX_I];
    }
}

// ---- log-probabilities ----

@compute @workgroup_size(WG)
fn logprob_partial(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let g = wg.x;
    let start = g * params.chunk;
    let end = min(start + params.chunk, params.n_vocab);
    let lmax = bitcast<f32>(state[MAX_BITS]);
    var s = 0.0;
    for (var i = start + lid; i < end; i += WG) {
        let l = logits[i];
        if (l >= NEG_MAX) {
            s += exp(l - lmax);
        }
    }
    let total = wg_sum(lid, s);
    let stride = params.n_top + 1u;
    // Candidates of each round are the keys below the previous pick.
    var last = vec2<u32>(NONE, NONE);
    var found = 0u;
    for (var r = 0u; r < params.n_top; r++) {
        var best = vec2<u32>(0u, 0u);
        for (var i = start + lid; i < end; i += WG) {
            let l = logits[i];
            let k = vec2<u32>(order_key(l), index_key(i));
            if (l >= NEG_MAX && key_greater(last, k) && key_greater(k, best)) {
                best = k;
            }
        }
        best = wg_keymax(lid, best);
        if (best.x != 0u) {
            last = best;
            if (lid == 0u) {
                lp_part[g * stride + 1u + found] = best;
            }
            found += 1u;
        }
    }
    if (lid == 0u) {
        lp_part[g * stride] = vec2<u32>(bitcast<u32>(total), found);
    }
}

@compute @workgroup_size(WG)
fn logprob_final(@builtin(local_invocation_index) lid: u32) {
    let stride = params.n_top + 1u;
    var s = 0.0;
    for (var g = lid; g < params.n_groups; g += WG) {
        s += bitcast<f32>(lp_part[g * stride].x);
    }
    let log_z = log(wg_sum(lid, s));
    let lmax = bitcast<f32>(state[MAX_BITS]);
    var last = vec2<u32>(NONE, NONE);
    var n = 0u;
    let n_cand = params.n_groups * params.n_top;
    for (var r = 0u; r < params.n_top; r++) {
        var best = vec2<u32>(0u, 0u);
        for (var j = lid; j < n_cand; j += WG) {
            let g = j / params.n_top;
            let k = j - g * params.n_top;
            if (k < lp_part[g * stride].y) {
                let c = lp_part[g * stride + 1u + k];
                if (key_greater(last, c) && key_greater(c, best)) {
                    best = c;
                }
            }
        }
        best = wg_keymax(lid, best);
        if (best.x != 0u) {
            last = best;
            if (lid == 0u) {
                lp[LP_TOP + 2u * n] = params.n_vocab - 1u - best.y;
                lp[LP_TOP + 2u * n + 1u] = bitcast<u32>((key_logit(best.x) - lmax) - log_z);
            }
            n += 1u;
        }
    }
    if (lid == 0u) {
        let id = out[0];
        lp[LP_ID] = id;
        lp[LP_LOGPROB] = bitcast<u32>((logits[id] - lmax) - log_z);
        lp[LP_N] = n;
    }
}

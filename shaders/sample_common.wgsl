// The row sampler's shared declarations: sample_argmax.wgsl (greedy argmax, Gumbel-max
// draws), sample_threshold.wgsl (the exact top-k / top-p threshold search),
// sample_logprobs.wgsl and sample_spec.wgsl (speculative decoding's verification) include this. Each row of logits is sampled with its own settings
// (rows[row]); workgroup id y is the row in every pass, so rows never share a reduction and a
// row's result does not depend on the others.
//
// Candidates are ordered by the composite key K = (order_key(logit), n_vocab−1−index):
// descending K is the CPU sampler's order (logit descending by total order, then lowest
// index), and K is unique per token, so "the first m candidates" is exactly K ≥ threshold.
// Tokens at −inf (banned) or NaN are never candidates.
// Defines: WG (threads per workgroup; must equal RADIX for the histogram kernels), MAX_TOP.

struct Params {
    n_vocab: u32,
    // workgroups per row in the partial and histogram passes, and logits per workgroup
    n_groups: u32,
    chunk: u32,
    // bits of n_vocab − 1; radix levels = 4 + ceil(index_bits / 8)
    index_bits: u32,
    n_levels: u32,
    n_rows: u32,
    // draws per row (counters step .. step + n_draws)
    n_draws: u32,
    // words per row of the draft-distribution store q (sample_spec.wgsl); 0 = no store
    q_stride: u32,
}

// One row's settings (ops::sample::RowParams).
struct Row {
    // 0 = off
    top_k: u32,
    top_p: f32,
    // −f32::MAX = off
    log_min_p: f32,
    inv_temp: f32,
    // the seed, its stream mixed into the high word
    seed_lo: u32,
    seed_hi: u32,
    step: u32,
    // log-probability alternatives; 0 = no log-probabilities
    n_top: u32,
    // 1 = greedy (argmax only)
    greedy: u32,
    // Speculative decoding with a sampled draft (sample_spec.wgsl): the drafted token this row
    // verifies (NONE = none), and its row of q, the draft's distribution (NONE = none; with
    // no drafted token, the row records its own distribution there)
    draft: u32,
    q_row: u32,
    _pad0: u32,
}

@group(0) @binding(0) var<uniform> params: Params;
// logits: [max_rows, n_vocab] f32
@group(0) @binding(1) var<storage, read> logits: array<f32>;
// partials: [max_rows, max_draws, n_groups] (f32 bits of the best score, its index)
@group(0) @binding(2) var<storage, read_write> partials: array<vec2<u32>>;
// state: [max_rows, STATE_WORDS] u32, layout below
@group(0) @binding(3) var<storage, read_write> state: array<u32>;
// hist: [max_rows, RADIX, 3] (count, mass low word, mass high word)
@group(0) @binding(4) var<storage, read_write> hist: array<atomic<u32>>;
// out: [max_rows, max_draws] u32 token ids
@group(0) @binding(5) var<storage, read_write> out: array<u32>;
// lp_part: [max_rows, n_groups, 1 + MAX_TOP] per workgroup: (Σ exp(logit − max) f32 bits,
// keys found), then its largest keys K, descending
@group(0) @binding(6) var<storage, read_write> lp_part: array<vec2<u32>>;
// lp: [max_rows, LP_WORDS] u32: the chosen id, its log-probability (f32 bits), how many
// alternatives follow, then (id, log-probability f32 bits) each, most likely first
@group(0) @binding(7) var<storage, read_write> lp: array<u32>;
// rows: [max_rows] Row
@group(0) @binding(8) var<storage, read> rows: array<Row>;

const RADIX: u32 = 256u;
const NONE: u32 = 0xffffffffu;
// The most negative finite f32, spelled exactly (a rounded decimal is out of range for Tint).
const NEG_MAX: f32 = -0x1.fffffep+127f;
// The largest finite f32: the argmax pass sees a broken logit as this, and a row whose
// largest logit is this has its id set to NONE (flint_core::sampling::NON_FINITE).
const POS_MAX: f32 = 0x1.fffffep+127f;

// NaN, +inf or f32::MAX (−inf is a banned token), tested on the bits: a broken driver or
// model file, never a distribution to sample from (flint_core::sampling::is_broken).
fn broken(v: f32) -> bool {
    let b = bitcast<u32>(v);
    return (b & 0x7fffffffu) > 0x7f800000u || (b >= 0x7f7fffffu && b <= 0x7f800000u);
}

// state words, per row
const STATE_WORDS: u32 = 32u;
// f32 bits of the largest logit, and its index
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
// sample_spec.wgsl: Σ exp((logit − max)/T) over the survivors, p(draft) and q(draft) (f32 bits)
const MASS_BITS: u32 = 28u;
const PX_BITS: u32 = 29u;
const QX_BITS: u32 = 30u;

// lp words, per row
const LP_WORDS: u32 = 3u + 2u * MAX_TOP;
const LP_ID: u32 = 0u;
const LP_LOGPROB: u32 = 1u;
const LP_N: u32 = 2u;
const LP_TOP: u32 = 3u;
// lp_part words per workgroup
const LP_STRIDE: u32 = 1u + MAX_TOP;

var<workgroup> red_v: array<f32, WG>;
var<workgroup> red_i: array<u32, WG>;
var<workgroup> red_k: array<vec2<u32>, WG>;

// Word w of row `row`'s state.
fn st(row: u32, w: u32) -> u32 {
    return row * STATE_WORDS + w;
}

fn logit(row: u32, i: u32) -> f32 {
    return logits[row * params.n_vocab + i];
}

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

fn key_greater(a: vec2<u32>, b: vec2<u32>) -> bool {
    return a.x > b.x || (a.x == b.x && a.y > b.y);
}

// ---- workgroup reductions ----

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

// The best (score, index) of the n_groups partials of (row, draw) across the workgroup, by
// better(); (NEG_MAX, NONE) where the row is not live. Every invocation calls it (barriers).
fn partials_best(row: u32, draw: u32, lid: u32, live: bool) -> vec2<u32> {
    var bv = NEG_MAX;
    var bi = NONE;
    let base = (row * params.n_draws + draw) * params.n_groups;
    if (live) {
        for (var j = lid; j < params.n_groups; j += WG) {
            let p = partials[base + j];
            if (better(bitcast<f32>(p.x), p.y, bv, bi)) {
                bv = bitcast<f32>(p.x);
                bi = p.y;
            }
        }
    }
    return wg_argmax(lid, bv, bi);
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

// ---- random numbers ----

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
fn gumbel(i: u32, step: u32, seed_lo: u32, seed_hi: u32) -> f32 {
    let h = pcg4d(vec4<u32>(i, step, seed_lo, seed_hi));
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

// A uniform variate in [0, 1 − 2⁻²⁴] for (seed, step, index), independent of gumbel()'s for
// the same key (another output word of the hash).
fn uniform01(i: u32, step: u32, seed_lo: u32, seed_hi: u32) -> f32 {
    let h = pcg4d(vec4<u32>(i, step, seed_lo, seed_hi));
    return f32(mix32(h.y ^ h.w) >> 8u) * (1.0 / 16777216.0);
}

// Paged causal attention with GQA and an optional sliding window, split over the KV length
// (flash-decoding): `split` runs one workgroup per (split s, head h, token t) with an online
// softmax over tiles of WG positions; `combine` merges the partial results of each (t, h).
//
// Token t (sequence tok_seq[t], position p = tok_pos[t]) attends to positions j of its
// sequence with j <= p and, when window > 0, p - j < window; kv head = h / group.
// Its split count S_t = token_splits(p) depends on its own visible length only, so its result
// does not depend on the other tokens of the step. With S_t = 1, `split` writes the normalized
// output itself and `combine` leaves the token alone.
// With ROPE, q is rotated at the token's position as it is loaded (rope_common.wgsl).
// Grid for both entries: (S, n_head, n_tok), S the largest S_t of the step; workgroups with
// s >= S_t return at once.
#include "common.wgsl"
#include "paged.wgsl"
#include "rope_common.wgsl"

struct Params {
    n_head: u32,
    group: u32,         // n_head / n_head_kv
    head_dim: u32,      // multiple of 4, <= MAX_HEAD_DIM
    head_dim_v: u32,    // <= WG
    kv_dim: u32,        // K row: n_head_kv * head_dim
    v_dim: u32,         // V row: n_head_kv * head_dim_v
    window: u32,        // 0: no sliding window
    scale: f32,
    split_len: u32,     // the split policy (ops::attention::SplitPolicy)
    max_split: u32,
    max_positions: u32, // 0: no bound on the positions of one split
    fixed_split: u32,   // 0: the policy; else every token's split count (tests)
    split_stride: u32,  // split records per (token, head)
    part_cap: u32,      // partial records the scratch holds
    softcap: f32,       // > 0: scores become softcap * tanh(score / softcap) (gemma2)
    _pad1: u32,
}

// A finite "minus infinity": exp(NEG_BIG - m) is 0 and NEG_BIG - NEG_BIG is not NaN.
const NEG_BIG: f32 = -3.0e38;

@group(0) @binding(0) var<uniform> info: BatchInfo;
@group(0) @binding(1) var<uniform> params: Params;
@group(0) @binding(2) var<storage, read> tok_pos: array<u32>;           // [n_tok]
@group(0) @binding(3) var<storage, read> tok_seq: array<u32>;           // [n_tok]
@group(0) @binding(4) var<storage, read> block_table: array<u32>;       // [n_seq, max_blocks]
@group(0) @binding(5) var<storage, read> q: array<vec4<f32>>;           // [n_tok, n_head * head_dim] f32
#ifdef K_F16
@group(0) @binding(6) var<storage, read> k_cache: array<vec2<u32>>;     // [n_slots, kv_dim / 4] 4 f16
#else
#ifdef K_Q8
@group(0) @binding(6) var<storage, read> k_cache: array<u32>;           // [n_slots, kv_dim / 32 * 9] q8_0
#else
@group(0) @binding(6) var<storage, read> k_cache: array<vec4<f32>>;     // [n_slots, kv_dim / 4] f32
#endif
#endif
#ifdef V_F16
#ifdef HEAD_DIM
@group(0) @binding(7) var<storage, read> v_cache: array<vec2<u32>>;     // [n_slots, v_dim / 4] 4 f16
#else
@group(0) @binding(7) var<storage, read> v_cache: array<u32>;           // [n_slots, v_dim / 2] 2 f16
#endif
#else
#ifdef V_Q8
@group(0) @binding(7) var<storage, read> v_cache: array<u32>;           // [n_slots, v_dim / 32 * 9] q8_0
#else
#ifdef HEAD_DIM
// The serial kernel reads V rows as vec4 (its HEAD_DIM_V and so v_dim are multiples of 4).
@group(0) @binding(7) var<storage, read> v_cache: array<vec4<f32>>;     // [n_slots, v_dim / 4] vec4
#else
@group(0) @binding(7) var<storage, read> v_cache: array<f32>;           // [n_slots, v_dim] f32
#endif
#endif
#endif
@group(0) @binding(8) var<storage, read_write> out: array<f32>;         // [n_tok, n_head * head_dim_v] f32
// Split partials: [part_cap, head_dim_v] unnormalized outputs, then [part_cap] (max, sum)
// pairs; record (t * n_head + h) * split_stride + s.
@group(0) @binding(9) var<storage, read_write> part: array<f32>;
#ifdef ROPE
@group(0) @binding(10) var<uniform> rope: RopeParams;
@group(0) @binding(11) var<storage, read> inv_freq: array<f32>;
#endif

// vec4 i of the q head row starting at vec4 q4 (token position pos), RoPE'd with ROPE.
fn load_q(q4: u32, i: u32, pos: u32) -> vec4<f32> {
    let v = q[q4 + i];
#ifdef ROPE
    var r: vec4<f32>;
    for (var c = 0u; c < 4u; c++) {
        let d = 4u * i + c;
        let pd = rope_partner(d);
        r[c] = rope_rotate(d, v[c], q[q4 + pd / 4u][pd % 4u], pos);
    }
    return r;
#else
    return v;
#endif
}

// The caches' element types (kv_write.wgsl stores them; flint_core::kv::KvType): f32; f16
// (K_F16 / V_F16), two per word; q8_0 (K_Q8 / V_Q8), per 32 elements a word with the
// scale's f32 bits and 8 words of signed bytes. k_head / v_head give where kv head kvh of
// a slot starts, in the units k4 / v4 / v1 index from there.

// Whether H[i][j] of a Walsh-Hadamard matrix is negative.
fn hadamard_neg(i: u32, j: u32) -> bool {
    return (countOneBits(i & j) & 1u) == 1u;
}

// Four f16 values of two words as floats.
fn f16x4(w: vec2<u32>) -> vec4<f32> {
    return vec4<f32>(unpack2x16float(w.x), unpack2x16float(w.y));
}

// Four signed bytes of a word as floats.
fn q8_4(w: u32) -> vec4<f32> {
    return vec4<f32>(vec4<i32>(i32(w << 24u), i32(w << 16u), i32(w << 8u), i32(w)) >> vec4<u32>(24u));
}

fn k_head(slot: u32, kvh: u32) -> u32 {
#ifdef K_Q8
    return slot * (params.kv_dim / 32u * 9u) + kvh * (params.head_dim / 32u * 9u);
#else
    return slot * (params.kv_dim / 4u) + kvh * (params.head_dim / 4u);
#endif
}

// Elements 4i..4i+3 of the K head at `base`.
fn k4(base: u32, i: u32) -> vec4<f32> {
#ifdef K_F16
    return f16x4(k_cache[base + i]);
#else
#ifdef K_Q8
    let b = base + (i / 8u) * 9u;
    return q8_4(k_cache[b + 1u + i % 8u]) * bitcast<f32>(k_cache[b]);
#else
    return k_cache[base + i];
#endif
#endif
}

fn v_head(slot: u32, kvh: u32) -> u32 {
#ifdef V_Q8
    return slot * (params.v_dim / 32u * 9u) + kvh * (params.head_dim_v / 32u * 9u);
#else
#ifdef HEAD_DIM
    return (slot * params.v_dim + kvh * params.head_dim_v) / 4u;
#else
#ifdef V_F16
    return (slot * params.v_dim + kvh * params.head_dim_v) / 2u;
#else
    return slot * params.v_dim + kvh * params.head_dim_v;
#endif
#endif
#endif
}

#ifdef HEAD_DIM
// Elements 4i..4i+3 of the V head at `base` (the serial kernel).
fn v4(base: u32, i: u32) -> vec4<f32> {
#ifdef V_F16
    return f16x4(v_cache[base + i]);
#else
#ifdef V_Q8
    let b = base + (i / 8u) * 9u;
    return q8_4(v_cache[b + 1u + i % 8u]) * bitcast<f32>(v_cache[b]);
#else
    return v_cache[base + i];
#endif
#endif
}
#else
// Element d of the V head at `base`.
fn v1(base: u32, d: u32) -> f32 {
#ifdef V_F16
    let h = unpack2x16float(v_cache[base + d / 2u]);
    return select(h.x, h.y, (d & 1u) == 1u);
#else
#ifdef V_Q8
    let b = base + (d / 32u) * 9u;
    let w = v_cache[b + 1u + (d % 32u) / 4u];
    return f32(i32(w << (24u - 8u * (d % 4u))) >> 24u) * bitcast<f32>(v_cache[b]);
#else
    return v_cache[base + d];
#endif
#endif
}
#endif

var<workgroup> q_sh: array<vec4<f32>, MAX_HEAD_DIM / 4u>;
var<workgroup> red: array<f32, WG>;
var<workgroup> p_sh: array<f32, WG>;
var<workgroup> slot_sh: array<u32, WG>;

// The first position a token at position p sees.
// A score after the optional soft cap (a uniform branch).
fn cap_score(sc: f32) -> f32 {
    if (params.softcap > 0.0) {
        return params.softcap * tanh_f32(sc / params.softcap);
    }
    return sc;
}

fn first_visible(p: u32) -> u32 {
    if (params.window > 0u && p + 1u > params.window) {
        return p + 1u - params.window;
    }
    return 0u;
}

// The split count of a token at position p, from its visible length alone (mirrors
// SplitPolicy::splits).
fn token_splits(p: u32) -> u32 {
    if (params.fixed_split > 0u) {
        return params.fixed_split;
    }
    let len = p + 1u - first_visible(p);
    var n = clamp((len + params.split_len - 1u) / params.split_len, 1u, params.max_split);
    if (params.max_positions > 0u) {
        n = max(n, (len + params.max_positions - 1u) / params.max_positions);
    }
    return min(n, params.split_stride);
}

// Split s of n_split's positions [lo, hi) for a token at position p: the visible positions
// (the window's, or all up to p) in near-equal ranges.
fn split_range(p: u32, s: u32, n_split: u32) -> vec2<u32> {
    let first = first_visible(p);
    let per = (p + 1u - first + n_split - 1u) / n_split;
    let lo = min(first + s * per, p + 1u);
    return vec2<u32>(lo, min(lo + per, p + 1u));
}

fn reduce_max(tid: u32, x: f32) -> f32 {
    red[tid] = x;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s = s >> 1u) {
        if (tid < s) {
            red[tid] = max(red[tid], red[tid + s]);
        }
        workgroupBarrier();
    }
    let r = red[0];
    workgroupBarrier();
    return r;
}

fn reduce_sum(tid: u32, x: f32) -> f32 {
    red[tid] = x;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s = s >> 1u) {
        if (tid < s) {
            red[tid] = red[tid] + red[tid + s];
        }
        workgroupBarrier();
    }
    let r = red[0];
    workgroupBarrier();
    return r;
}

#ifndef HEAD_DIM
@compute @workgroup_size(WG)
fn split(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(local_invocation_index) tid: u32,
) {
    let s = wg.x;
    let h = wg.y;
    let t = wg.z;
    if (t >= info.n_tok) {
        return;
    }
    let p = tok_pos[t];
    let n_split = token_splits(p);
    if (s >= n_split) {
        return;
    }
    let seq = tok_seq[t];
    let kvh = h / params.group;
    let range = split_range(p, s, n_split);
    let lo = range.x;
    let hi = range.y;

    let hd4 = params.head_dim / 4u;
    for (var i = tid; i < hd4; i += WG) {
        q_sh[i] = load_q((t * params.n_head + h) * hd4, i, p) * params.scale;
    }
    workgroupBarrier();
#ifdef K_ROT
    // The keys were stored rotated by H (kv_write.wgsl): q <- H q, in groups of K_ROT.
    var qr = 0.0;
    if (tid < params.head_dim) {
        let g0 = tid - tid % K_ROT;
        for (var j = 0u; j < K_ROT; j++) {
            let x = q_sh[(g0 + j) / 4u][(g0 + j) % 4u];
            qr += select(x, -x, hadamard_neg(tid - g0, j));
        }
        qr *= 1.0 / sqrt(f32(K_ROT));
    }
    workgroupBarrier();
    if (tid < params.head_dim) {
        q_sh[tid / 4u][tid % 4u] = qr;
    }
    workgroupBarrier();
#endif

    // V accumulation: invocation tid owns element d of the output for every n_grp-th position.
    let dv = params.head_dim_v;
    let n_grp = WG / dv;
    let d = tid % dv;
    let g = tid / dv;

    var m = NEG_BIG;
    var l = 0.0;
    var acc = 0.0;
    for (var base = lo; base < hi; base += WG) {
        let j = base + tid;
        var sc = NEG_BIG;
        var slot = 0u;
        if (j < hi) {
            slot = kv_slot(seq, j);
            let row = k_head(slot, kvh);
            var dot4 = vec4<f32>(0.0);
            for (var i = 0u; i < hd4; i++) {
                dot4 = fma(q_sh[i], k4(row, i), dot4);
            }
            sc = cap_score(dot4.x + dot4.y + dot4.z + dot4.w);
        }
        slot_sh[tid] = slot;
        let m_new = max(m, reduce_max(tid, sc));
        var pj = 0.0;
        if (j < hi) {
            pj = exp(sc - m_new);
        }
        p_sh[tid] = pj;
        // reduce_sum's barriers also publish p_sh and slot_sh.
        let alpha = exp(m - m_new);
        l = l * alpha + reduce_sum(tid, pj);
        acc = acc * alpha;
        m = m_new;
        let n_valid = min(WG, hi - base);
        if (g < n_grp) {
            for (var jj = g; jj < n_valid; jj += n_grp) {
                acc = fma(p_sh[jj], v1(v_head(slot_sh[jj], kvh), d), acc);
            }
        }
        workgroupBarrier();
    }

    red[tid] = acc;
    workgroupBarrier();
    var o = 0.0;
    if (tid < dv) {
        for (var gg = 0u; gg < n_grp; gg++) {
            o += red[gg * dv + tid];
        }
    }
#ifdef V_ROT
    // The values were stored rotated by H: the sums are rotated back (H = H^-1), in groups
    // of V_ROT; partials are too (the combine pass is linear in them).
    p_sh[tid] = o;
    workgroupBarrier();
    if (tid < dv) {
        let g0 = tid - tid % V_ROT;
        var r = 0.0;
        for (var j = 0u; j < V_ROT; j++) {
            let x = p_sh[g0 + j];
            r += select(x, -x, hadamard_neg(tid - g0, j));
        }
        o = r * (1.0 / sqrt(f32(V_ROT)));
    }
#endif
    if (tid < dv) {
        if (n_split == 1u) {
            out[(t * params.n_head + h) * dv + tid] = o / l;
        } else {
            let rec = (t * params.n_head + h) * params.split_stride + s;
            part[rec * dv + tid] = o;
            if (tid == 0u) {
                let ml = params.part_cap * dv + 2u * rec;
                part[ml] = m;
                part[ml + 1u] = l;
            }
        }
    }
}

#endif

#ifdef TILES
// Prompt steps on GPUs, outside the exact mode (ops::attention::Tiles): one workgroup of
// TQ * TK = 256 lanes per (tile of TQ consecutive tokens of the step, head h). The tile's
// tokens share every K and V tile they load, where `split` loads them once per token: a
// prompt step of n tokens reads the K/V rows n / TQ times instead of n times.
// The tile's tokens are taken in runs of one sequence (a step lists a sequence's tokens
// together; a tile may hold the end of one prompt and the start of the next). For each run,
// the positions [first visible of its lowest position, its highest position] go by in
// tiles of TK: lane (qi, kj) scores query qi against key kj over the head in chunks of 32
// (q and K chunks staged in workgroup memory), one lane per query row folds the scores into
// its online softmax, then lane (qi, og) adds the weighted V rows into vec4 og of each
// 64-wide chunk of the output, a V chunk staged at a time. A token's sums depend on where
// its run starts, so the exact mode keeps `split`. Shapes: head_dim a multiple of 32,
// head_dim_v a multiple of 64, no rotated caches (K_ROT, V_ROT).
const TQ: u32 = 16u;
const TK: u32 = 16u;
var<workgroup> tq_sh: array<vec4<f32>, 128>;   // a 32-wide chunk of q: TQ rows x 8 vec4
var<workgroup> tkv_sh: array<vec4<f32>, 256>;  // a K chunk (TK x 8 vec4) or a V chunk (TK x 16 vec4)
var<workgroup> ts_sh: array<f32, 256>;         // [TQ][TK] scores, then softmax weights
var<workgroup> row_m: array<f32, TQ>;
var<workgroup> row_l: array<f32, TQ>;
var<workgroup> row_a: array<f32, TQ>;
var<workgroup> tslot: array<u32, TK>;
// A lane's output: vec4 kj of each 64-wide chunk of the head. Its loops run to this constant
// and break at the head's chunks, so that a GPU's compiler unrolls them and acc keeps
// constant indices (a runtime index would put it in local memory).
const ACC_CHUNKS: u32 = MAX_HEAD_DIM / 64u;

@compute @workgroup_size(256)
fn tiles(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(local_invocation_index) tid: u32,
) {
    let h = wg.y;
    let kvh = h / params.group;
    let t0 = wg.x * TQ;
    let t_end = min(t0 + TQ, info.n_tok);
    if (t0 >= t_end) {
        return;
    }
    let qi = tid / TK;
    let kj = tid % TK;
    let t = t0 + qi;
    var my_pos = 0u;
    if (t < t_end) {
        my_pos = tok_pos[t];
    }
    let hd4 = params.head_dim / 4u;
    let n_vc = params.head_dim_v / 64u;
    if (tid < TQ) {
        row_m[tid] = NEG_BIG;
        row_l[tid] = 0.0;
    }
    var acc: array<vec4<f32>, ACC_CHUNKS>;
    for (var c = 0u; c < ACC_CHUNKS; c++) {
        acc[c] = vec4<f32>(0.0);
    }
    var run = t0;
    while (run < t_end) {
        let seq = tok_seq[run];
        var run_end = run + 1u;
        var p_lo = tok_pos[run];
        var p_hi = p_lo;
        while (run_end < t_end && tok_seq[run_end] == seq) {
            p_lo = min(p_lo, tok_pos[run_end]);
            p_hi = max(p_hi, tok_pos[run_end]);
            run_end++;
        }
        let mine = t >= run && t < run_end;
        let first = first_visible(my_pos);
        let hi = p_hi + 1u;
        for (var base = first_visible(p_lo); base < hi; base += TK) {
            if (tid < TK) {
                var slot = 0u;
                if (base + tid < hi) {
                    slot = kv_slot(seq, base + tid);
                }
                tslot[tid] = slot;
            }
            workgroupBarrier();
            var dot4 = vec4<f32>(0.0);
            for (var c = 0u; c < hd4; c += 8u) {
                let r = (tid % 128u) / 8u;
                let i = tid % 8u;
                var v = vec4<f32>(0.0);
                if (tid < 128u) {
                    let tr = t0 + r;
                    if (tr >= run && tr < run_end) {
                        v = load_q((tr * params.n_head + h) * hd4, c + i, tok_pos[tr]) * params.scale;
                    }
                    tq_sh[tid] = v;
                } else {
                    if (base + r < hi) {
                        v = k4(k_head(tslot[r], kvh), c + i);
                    }
                    tkv_sh[tid - 128u] = v;
                }
                workgroupBarrier();
                for (var k = 0u; k < 8u; k++) {
                    dot4 = fma(tq_sh[qi * 8u + k], tkv_sh[kj * 8u + k], dot4);
                }
                workgroupBarrier();
            }
            let j = base + kj;
            var sc = NEG_BIG;
            if (mine && j <= my_pos && j >= first) {
                sc = cap_score(dot4.x + dot4.y + dot4.z + dot4.w);
            }
            ts_sh[tid] = sc;
            workgroupBarrier();
            if (tid < TQ) {
                let m_old = row_m[tid];
                var mx = m_old;
                for (var k = 0u; k < TK; k++) {
                    mx = max(mx, ts_sh[tid * TK + k]);
                }
                var sum = 0.0;
                for (var k = 0u; k < TK; k++) {
                    let s = ts_sh[tid * TK + k];
                    var w = 0.0;
                    if (s > NEG_BIG) {
                        w = exp(s - mx);
                    }
                    ts_sh[tid * TK + k] = w;
                    sum += w;
                }
                let a = exp(m_old - mx);
                row_a[tid] = a;
                row_m[tid] = mx;
                row_l[tid] = row_l[tid] * a + sum;
            }
            workgroupBarrier();
            let a = row_a[qi];
            // Constant bounds (see ACC_CHUNKS) and a uniform test inside: every lane reaches
            // the barriers.
            for (var c = 0u; c < ACC_CHUNKS; c++) {
                if (c >= n_vc) {
                    break;
                }
                let r = tid / 16u;
                let d = c * 64u + (tid % 16u) * 4u;
                var v = vec4<f32>(0.0);
                if (base + r < hi) {
                    let vb = v_head(tslot[r], kvh);
                    v = vec4<f32>(v1(vb, d), v1(vb, d + 1u), v1(vb, d + 2u), v1(vb, d + 3u));
                }
                tkv_sh[tid] = v;
                workgroupBarrier();
                var o = acc[c] * a;
                for (var k = 0u; k < TK; k++) {
                    o = fma(vec4<f32>(ts_sh[qi * TK + k]), tkv_sh[k * 16u + kj], o);
                }
                acc[c] = o;
                workgroupBarrier();
            }
        }
        run = run_end;
    }
    if (t < t_end) {
        let l = row_l[qi];
        for (var c = 0u; c < ACC_CHUNKS; c++) {
            if (c >= n_vc) {
                break;
            }
            let o = acc[c] / l;
            let at = (t * params.n_head + h) * params.head_dim_v + c * 64u + kj * 4u;
            out[at] = o.x;
            out[at + 1u] = o.y;
            out[at + 2u] = o.z;
            out[at + 3u] = o.w;
        }
    }
}
#endif

@compute @workgroup_size(WG_COMBINE)
fn combine(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    // Workgroup (s, h, t) finishes elements [s * per, (s + 1) * per) of head h of token t.
    let h = wg.y;
    let t = wg.z;
    if (t >= info.n_tok) {
        return;
    }
    let n_split = token_splits(tok_pos[t]);
    if (n_split == 1u || wg.x >= n_split) {
        return;
    }
    let dv = params.head_dim_v;
    let rec0 = (t * params.n_head + h) * params.split_stride;
    let ml = params.part_cap * dv + 2u * rec0;
    var mx = NEG_BIG;
    for (var i = 0u; i < n_split; i++) {
        mx = max(mx, part[ml + 2u * i]);
    }
    var l = 0.0;
    for (var i = 0u; i < n_split; i++) {
        l += exp(part[ml + 2u * i] - mx) * part[ml + 2u * i + 1u];
    }
    let per = (dv + n_split - 1u) / n_split;
    let d1 = min((wg.x + 1u) * per, dv);
    for (var d = wg.x * per + lid; d < d1; d += WG_COMBINE) {
        var o = 0.0;
        for (var i = 0u; i < n_split; i++) {
            o += exp(part[ml + 2u * i] - mx) * part[(rec0 + i) * dv + d];
        }
        out[(t * params.n_head + h) * dv + d] = o / l;
    }
}

#ifdef HEAD_DIM
// CPU-type adapters (lavapipe, SwiftShader): each invocation runs one (token, head, split)
// serially, q and the output row in private registers and an online softmax over its
// positions. There a workgroup's invocations are SIMD lanes of one CPU thread, so `split`'s
// cross-lane reductions cost a barrier (a coroutine switch) per step, while serial loads are
// cheap. Grid: (ceil(n_tok * n_head / WG_ROWS), S); the (t, h) pair is the linear invocation id,
// and S > 1 writes partial records for `combine` as `split` does.
// llvmpipe ends any shader loop after 65535 iterations of it and the loops nested in it, so
// the per-position work is written out (ROWS_DOT, ROWS_ACC: one statement per vec4 of the
// head, generated by ops::attention::rows_code) and the position loop is the only one; the
// host keeps a split's positions under that bound.
// Defines: HEAD_DIM, HEAD_DIM_V (multiples of 4, equal to the params), WG_ROWS, ROWS_DOT,
// ROWS_ACC.
const HD4: u32 = HEAD_DIM / 4u;
const HDV4: u32 = HEAD_DIM_V / 4u;

// a <- H a in each group of n (a power of two dividing HEAD_DIM), H orthonormal: butterflies
// (Sylvester's order, the H of hadamard_neg), then 1 / sqrt(n).
fn fwht(a: ptr<function, array<f32, HEAD_DIM>>, n: u32) {
    for (var g = 0u; g < HEAD_DIM; g += n) {
        for (var len = 1u; len < n; len *= 2u) {
            for (var i = 0u; i < n / 2u; i++) {
                let lo = g + (i / len) * 2u * len + i % len;
                let x = (*a)[lo];
                let y = (*a)[lo + len];
                (*a)[lo] = x + y;
                (*a)[lo + len] = x - y;
            }
        }
    }
    let s = 1.0 / sqrt(f32(n));
    for (var d = 0u; d < HEAD_DIM; d++) {
        (*a)[d] *= s;
    }
}

@compute @workgroup_size(WG_ROWS)
fn rows(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let i = wg.x * WG_ROWS + lid;
    let h = i % params.n_head;
    let t = i / params.n_head;
    let s = wg.y;
    if (t >= info.n_tok) {
        return;
    }
    let p = tok_pos[t];
    let n_split = token_splits(p);
    if (s >= n_split) {
        return;
    }
    let seq = tok_seq[t];
    let kvh = h / params.group;
    let range = split_range(p, s, n_split);
    let lo = range.x;
    let hi = range.y;

    var qv: array<vec4<f32>, HD4>;
    let q0 = (t * params.n_head + h) * HD4;
    for (var k = 0u; k < HD4; k++) {
        qv[k] = load_q(q0, k, p) * params.scale;
    }
#ifdef K_ROT
    // The keys were stored rotated by H: q <- H q (a fast Walsh-Hadamard transform per
    // group of K_ROT; a direct product would pass llvmpipe's loop bound at HEAD_DIM 256).
    var qf: array<f32, HEAD_DIM>;
    for (var d = 0u; d < HEAD_DIM; d++) {
        qf[d] = qv[d / 4u][d % 4u];
    }
    fwht(&qf, K_ROT);
    for (var d = 0u; d < HEAD_DIM; d++) {
        qv[d / 4u][d % 4u] = qf[d];
    }
#endif
    var acc: array<vec4<f32>, HDV4>;
    var m = NEG_BIG;
    var l = 0.0;
    for (var j = lo; j < hi; j++) {
        let slot = kv_slot(seq, j);
        let krow = k_head(slot, kvh);
        var d4 = vec4<f32>(0.0);
        // d4 = fma(qv[k], k4(krow, k), d4) for each k < HD4.
        ROWS_DOT
        let sc = cap_score(d4.x + d4.y + d4.z + d4.w);
        let m_new = max(m, sc);
        let alpha = exp(m - m_new);
        let pj = exp(sc - m_new);
        l = l * alpha + pj;
        m = m_new;
        let vrow = v_head(slot, kvh);
        // acc[k] = fma(vec4(pj), v4(vrow, k), acc[k] * alpha) for each k < HDV4: one
        // 16-byte load per 4 values (where loads are issued lane by lane, they bound the loop).
        ROWS_ACC
    }

#ifdef V_ROT
    // The values were stored rotated by H: the sums are rotated back.
    var af: array<f32, HEAD_DIM>;
    for (var d = 0u; d < HEAD_DIM; d++) {
        af[d] = acc[d / 4u][d % 4u];
    }
    fwht(&af, V_ROT);
    for (var d = 0u; d < HEAD_DIM; d++) {
        acc[d / 4u][d % 4u] = af[d];
    }
#endif
    let row = t * params.n_head + h;
    if (n_split == 1u) {
        let o = row * HEAD_DIM_V;
        for (var k = 0u; k < HDV4; k++) {
            let r = acc[k] / l;
            out[o + 4u * k] = r.x;
            out[o + 4u * k + 1u] = r.y;
            out[o + 4u * k + 2u] = r.z;
            out[o + 4u * k + 3u] = r.w;
        }
    } else {
        let rec = row * params.split_stride + s;
        let o = rec * HEAD_DIM_V;
        for (var k = 0u; k < HDV4; k++) {
            part[o + 4u * k] = acc[k].x;
            part[o + 4u * k + 1u] = acc[k].y;
            part[o + 4u * k + 2u] = acc[k].z;
            part[o + 4u * k + 3u] = acc[k].w;
        }
        let ml = params.part_cap * HEAD_DIM_V + 2u * rec;
        part[ml] = m;
        part[ml + 1u] = l;
    }
}
#endif

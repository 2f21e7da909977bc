// Writes this step's K and V rows into one layer's paged caches: token t's row goes to slot
// block_table[seq[t] * max_blocks + pos[t] / block_size] * block_size + pos[t] % block_size.
// With ROPE, K rows are rotated at their positions on the way (rope_common.wgsl).
// Each cache stores its elements as f32, as f16 (K_F16 / V_F16: two per word,
// pack2x16float, so no shader-f16 is needed) or as q8_0 blocks (K_Q8 / V_Q8: per 32 elements
// a word with the f16-rounded scale d as f32 bits, then 8 words of 4 signed bytes,
// q = round(x / d) half away from zero; flint_core::kv::KvType).
// With K_ROT / V_ROT (q8_0 only; flint_core::kv::KvType::rotation), each group of K_ROT (V_ROT)
// elements of a head is multiplied by the orthonormal Walsh-Hadamard matrix
// H[i][j] = (-1)^popcount(i & j) / sqrt(n) before it is quantized, so that one large channel
// does not round the others of its block away; attention.wgsl rotates q by the same H and
// rotates its V sums back.
// Grid: (ceil((kv_dim / K_UNIT + v_dim / V_UNIT) / WG), n_tok); one unit per invocation: an
// element (f32), a pair (f16) or a block (q8_0).
#include "common.wgsl"
#include "paged.wgsl"
#include "rope_common.wgsl"

struct Params {
    kv_dim: u32, // n_head_kv * head_dim
    v_dim: u32,  // n_head_kv * head_dim_v
    head_dim: u32,
    _pad1: u32,
}

#ifdef K_F16
const K_UNIT: u32 = 2u;
#else
#ifdef K_Q8
const K_UNIT: u32 = 32u;
#else
const K_UNIT: u32 = 1u;
#endif
#endif
#ifdef V_F16
const V_UNIT: u32 = 2u;
#else
#ifdef V_Q8
const V_UNIT: u32 = 32u;
#else
const V_UNIT: u32 = 1u;
#endif
#endif
// The Hadamard group sizes; 0: not rotated.
#ifdef K_ROT
const K_ROT_N: u32 = K_ROT;
#else
const K_ROT_N: u32 = 0u;
#endif
#ifdef V_ROT
const V_ROT_N: u32 = V_ROT;
#else
const V_ROT_N: u32 = 0u;
#endif

@group(0) @binding(0) var<uniform> info: BatchInfo;
@group(0) @binding(1) var<uniform> params: Params;
@group(0) @binding(2) var<storage, read> tok_pos: array<u32>;      // [n_tok]
@group(0) @binding(3) var<storage, read> tok_seq: array<u32>;      // [n_tok]
@group(0) @binding(4) var<storage, read> block_table: array<u32>;  // [n_seq, max_blocks]
@group(0) @binding(5) var<storage, read> k: array<f32>;            // [n_tok, kv_dim] f32
@group(0) @binding(6) var<storage, read> v: array<f32>;            // [n_tok, v_dim] f32
#ifdef K_F16
@group(0) @binding(7) var<storage, read_write> k_cache: array<u32>; // [n_slots, kv_dim / 2]
#else
#ifdef K_Q8
@group(0) @binding(7) var<storage, read_write> k_cache: array<u32>; // [n_slots, kv_dim / 32 * 9]
#else
@group(0) @binding(7) var<storage, read_write> k_cache: array<f32>; // [n_slots, kv_dim]
#endif
#endif
#ifdef V_F16
@group(0) @binding(8) var<storage, read_write> v_cache: array<u32>;
#else
#ifdef V_Q8
@group(0) @binding(8) var<storage, read_write> v_cache: array<u32>;
#else
@group(0) @binding(8) var<storage, read_write> v_cache: array<f32>;
#endif
#endif
#ifdef ROPE
@group(0) @binding(9) var<uniform> rope: RopeParams;
@group(0) @binding(10) var<storage, read> inv_freq: array<f32>;
#endif

// Element e of token t's K row, rotated at position p with ROPE.
fn k_elem(t: u32, e: u32, p: u32) -> f32 {
    let row = t * params.kv_dim;
    var val = k[row + e];
#ifdef ROPE
    let d = e % params.head_dim;
    val = rope_rotate(d, val, k[row + e - d + rope_partner(d)], p);
#endif
    return val;
}

fn v_elem(t: u32, e: u32, p: u32) -> f32 {
    return v[t * params.v_dim + e];
}

// Element e of token t's K row (`is_k`) or V row.
fn row_elem(is_k: bool, t: u32, e: u32, p: u32) -> f32 {
    if (is_k) {
        return k_elem(t, e, p);
    }
    return v_elem(t, e, p);
}

// Whether H[i][j] of a Walsh-Hadamard matrix is negative.
fn hadamard_neg(i: u32, j: u32) -> bool {
    return (countOneBits(i & j) & 1u) == 1u;
}

// One q8_0 block of 32 values as its 9 words: the scale d (f16-rounded, as f32 bits), then
// the bytes. d = amax / 127, q = round(x / d) half away from zero (C's roundf).
fn q8_block(vals: ptr<function, array<f32, 32>>) -> array<u32, 9> {
    var amax = 0.0;
    for (var i = 0u; i < 32u; i++) {
        amax = max(amax, abs((*vals)[i]));
    }
    let d = amax / 127.0;
    let id = select(0.0, 1.0 / d, d != 0.0);
    var out: array<u32, 9>;
    out[0] = bitcast<u32>(unpack2x16float(pack2x16float(vec2<f32>(d, 0.0))).x);
    for (var w = 0u; w < 8u; w++) {
        var word = 0u;
        for (var b = 0u; b < 4u; b++) {
            let x = (*vals)[4u * w + b] * id;
            let tr = trunc(x);
            let q = clamp(i32(tr + select(0.0, sign(x), abs(x - tr) >= 0.5)), -127, 127);
            word = word | ((u32(q) & 0xffu) << (8u * b));
        }
        out[w + 1u] = word;
    }
    return out;
}

// The 9 words of the q8_0 block of elements e..e+32 of token t's K (`is_k`) or V row; with
// rot > 0 of H times the block's group of rot elements (rot a power of two >= 32).
fn q8_unit(is_k: bool, t: u32, e: u32, p: u32, rot: u32) -> array<u32, 9> {
    var vals: array<f32, 32>;
    if (rot > 0u) {
        let g0 = e - e % rot;
        for (var j = 0u; j < rot; j++) {
            let x = row_elem(is_k, t, g0 + j, p);
            for (var i = 0u; i < 32u; i++) {
                vals[i] += select(x, -x, hadamard_neg(e - g0 + i, j));
            }
        }
        for (var i = 0u; i < 32u; i++) {
            vals[i] *= 1.0 / sqrt(f32(rot));
        }
    } else {
        for (var i = 0u; i < 32u; i++) {
            vals[i] = row_elem(is_k, t, e + i, p);
        }
    }
    return q8_block(&vals);
}

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let t = wg.y;
    let u = wg.x * WG + lid;
    let n_ku = params.kv_dim / K_UNIT;
    if (t >= info.n_tok || u >= n_ku + params.v_dim / V_UNIT) {
        return;
    }
    let p = tok_pos[t];
    let slot = kv_slot(tok_seq[t], p);
    // A bad block id is dropped rather than written past the cache.
    if (u < n_ku) {
        let e = u * K_UNIT;
#ifdef K_F16
        if (slot < arrayLength(&k_cache) / (params.kv_dim / 2u)) {
            k_cache[(slot * params.kv_dim + e) / 2u] = pack2x16float(vec2<f32>(k_elem(t, e, p), k_elem(t, e + 1u, p)));
        }
#else
#ifdef K_Q8
        let row = params.kv_dim / 32u * 9u;
        if (slot < arrayLength(&k_cache) / row) {
            let blk = q8_unit(true, t, e, p, K_ROT_N);
            let w0 = slot * row + u * 9u;
            for (var i = 0u; i < 9u; i++) {
                k_cache[w0 + i] = blk[i];
            }
        }
#else
        if (slot < arrayLength(&k_cache) / params.kv_dim) {
            k_cache[slot * params.kv_dim + e] = k_elem(t, e, p);
        }
#endif
#endif
    } else {
        let uv = u - n_ku;
        let e = uv * V_UNIT;
#ifdef V_F16
        if (slot < arrayLength(&v_cache) / (params.v_dim / 2u)) {
            v_cache[(slot * params.v_dim + e) / 2u] = pack2x16float(vec2<f32>(v_elem(t, e, p), v_elem(t, e + 1u, p)));
        }
#else
#ifdef V_Q8
        let row = params.v_dim / 32u * 9u;
        if (slot < arrayLength(&v_cache) / row) {
            let blk = q8_unit(false, t, e, p, V_ROT_N);
            let w0 = slot * row + uv * 9u;
            for (var i = 0u; i < 9u; i++) {
                v_cache[w0 + i] = blk[i];
            }
        }
#else
        if (slot < arrayLength(&v_cache) / params.v_dim) {
            v_cache[slot * params.v_dim + e] = v_elem(t, e, p);
        }
#endif
#endif
    }
}

// Quantized matrix times activations, weights dequantized in registers:
//   y[t, row_offset + r] = Σ_i W[r, i] · x[t, i] (+ bias[r]) (+ y[t, row_offset + r])
// for r < n_rows and t < n_tok.
//
// A workgroup of WG invocations is ROWS = WG / TPR teams of TPR lanes; team k owns row
// group * ROWS + k and its lanes split the row into 32-element chunks (lane l takes chunks
// l, l + TPR, ...), so each weight byte is read by one invocation. Each lane dequantizes a
// chunk once and multiplies it with TOK tokens' activations (the token tile wg.z * TOK ..),
// then the team sums its lanes' partials in workgroup memory.
//   TOK = 1, no TILE: a one-token step (n_tok fixed at 1).
//   TOK > 1, TILE:    n_tok comes from the batch uniform, the grid's z walks tiles of TOK.
// Every variant computes a (row, token) product the same way, whatever TOK and WG, so a
// token's result does not depend on the step it shares. CPU-type adapters use
// matmul_blocked.wgsl.
// With SUBGROUP_REDUCE (adapters with subgroups whose smallest subgroup holds a team), a
// team sums its lanes with a butterfly of subgroup shuffles instead of workgroup memory and
// barriers. Row groups beyond 65535 fold into y (linear_group).
// With IDS (matmul_io.wgsl) the tokens are the entries routed to the workgroup's expert.
// With GLU (matmul_io.wgsl) a team owns a gate row and its up row: each lane dequantizes a
// chunk of both and multiplies them with the same activations, and the team stores
// act(gate) · up.
// With NORM (matmul_io.wgsl) the workgroup first sums its tokens' squares: lane l < 64 takes
// the row's vec4 l, l + 64, ... and a fixed tree adds the 64 sums (the same order for every WG
// and TOK). Lanes multiply each dequantized chunk by the norm weight, and a row's sums are
// scaled by the token's 1 / rms before the store.
//
// With Q8_SLICE (outside the exact mode, FLINT_TUNE q8_act=on) the workgroup quantizes its
// tokens' activations to 8-bit integers in workgroup memory, Q8_SLICE chunks at a time, per
// 32-element chunk (scale max |x| / 127, with the chunk's sum; with NORM x ⊙ norm_w), and the
// lanes multiply integer weight chunks (dequant_q8.wgsl) with them four at a time
// (dot4I8Packed), scaling each chunk's integer sums once: no float conversion per weight, and x
// read once per workgroup rather than once per team. Q8_SLICE is a multiple of 32, so a lane
// still takes chunks lane, lane + TPR, ... in order, whatever the slice: a token's sums do not
// depend on TOK.
//
// Defines: the format (ShaderDefs::quant), WG, TPR, TOK, TILE, SUBGROUP_REDUCE, IDS, GLU,
// GELU_TANH, NORM, Q8_SLICE.

#ifdef TILE
#define HAS_BATCH
#endif
#include "matmul_io.wgsl"

#include "dequant.wgsl"

const ROWS: u32 = WG / TPR;

#ifdef GLU
// Sums per row: the gate's TOK, then the up row's.
const SUMS: u32 = 2u * TOK;
#else
const SUMS: u32 = TOK;
#endif

#ifndef SUBGROUP_REDUCE
// Lane partial sums, [TOK][WG]: a team's lanes are contiguous.
var<workgroup> partial: array<f32, TOK * WG>;
#endif

#ifdef NORM
// Lanes that sum a row's squares (WG is at least this).
const NORM_LANES: u32 = 64u;
// Their sums, [TOK][NORM_LANES] (without SUBGROUP_REDUCE, `partial` holds them).
#ifdef SUBGROUP_REDUCE
var<workgroup> norm_part: array<f32, TOK * NORM_LANES>;
#endif

fn norm_set(i: u32, v: f32) {
#ifdef SUBGROUP_REDUCE
    norm_part[i] = v;
#else
    partial[i] = v;
#endif
}

fn norm_get(i: u32) -> f32 {
#ifdef SUBGROUP_REDUCE
    return norm_part[i];
#else
    return partial[i];
#endif
}
#endif

#ifdef Q8_SLICE
#include "dequant_q8.wgsl"

// One slice of the workgroup's tokens' activations as signed bytes, four to a word: word k of
// token j's chunk s at (j · 8 + k) · Q8_SLICE + s, so a team's lanes (consecutive chunks) read
// consecutive words. Per chunk its scale and the sum of its elements.
var<workgroup> xq: array<u32, TOK * 8u * Q8_SLICE>;
var<workgroup> xd: array<vec2<f32>, TOK * Q8_SLICE>;

// Quantizes the slice of chunks from `base` of the workgroup's tokens (every lane takes
// entries lid, lid + WG, ...); chunks past the row and tokens past the step are zeros. The
// caller then waits at a barrier.
fn q8_stage(lid: u32, t0: u32, n_tok: u32, base: u32) {
    let row_vec4s = p.n_in / 4u;
    for (var i = lid; i < TOK * Q8_SLICE; i += WG) {
        let j = i / Q8_SLICE;
        let s = i % Q8_SLICE;
        let c = base + s;
        var v: array<vec4<f32>, 8>;
        if (t0 + j < n_tok && c < p.n_in / CHUNK) {
            v = x_chunk(x_index(t0 + j) * row_vec4s, c);
        }
        let a = q8_quantize(v);
        for (var k = 0u; k < 8u; k++) {
            xq[(j * 8u + k) * Q8_SLICE + s] = a.q[k];
        }
        xd[i] = vec2<f32>(a.d, a.sum);
    }
}

// The chunk's product with token j's staged chunk s.
fn q8_dot(wc: Q8Chunk, j: u32, s: u32) -> f32 {
    var s0 = 0i;
    var s1 = 0i;
    for (var k = 0u; k < 4u; k++) {
        s0 += dot4I8Packed(wc.q[k], xq[(j * 8u + k) * Q8_SLICE + s]);
        s1 += dot4I8Packed(wc.q[k + 4u], xq[(j * 8u + k + 4u) * Q8_SLICE + s]);
    }
    let a = xd[j * Q8_SLICE + s];
    return a.x * (wc.d.x * f32(s0) + wc.d.y * f32(s1)) + wc.m * a.y;
}
#endif

// Σ_k wq[k] · x[xb + k] over a chunk, in one fixed order.
fn chunk_dot(wq: array<vec4<f32>, 8>, xb: u32) -> f32 {
    var s = wq[0] * x[xb];
    for (var k = 1u; k < 8u; k++) {
        s += wq[k] * x[xb + k];
    }
    return (s.x + s.y) + (s.z + s.w);
}

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let team = lid / TPR;
    let lane = lid % TPR;
    let r = linear_group(wg, p.groups_x) * ROWS + team;
#ifdef IDS
    let t0 = ids_tile(wg.z, TOK) * TOK;
    let n_tok = ids_count;
#else
    let t0 = wg.z * TOK;
#ifdef TILE
    let n_tok = batch.n_tok;
#else
    let n_tok = 1u;
#endif
#endif
    let live = r < p.n_rows && t0 < n_tok;

#ifdef NORM
    // Each token's 1 / rms (workgroup-uniform control flow: every lane reaches the barriers).
    var scale: array<f32, TOK>;
    let row_vec4s = p.n_in / 4u;
    for (var j = 0u; j < TOK; j++) {
        if (lid < NORM_LANES) {
            var ss = 0.0;
            if (t0 + j < n_tok) {
                let xb = x_index(t0 + j) * row_vec4s;
                for (var i = lid; i < row_vec4s; i += NORM_LANES) {
                    let v = x[xb + i];
                    ss += dot(v, v);
                }
            }
            norm_set(j * NORM_LANES + lid, ss);
        }
    }
    for (var s = NORM_LANES / 2u; s > 0u; s >>= 1u) {
        workgroupBarrier();
        if (lid < s) {
            for (var j = 0u; j < TOK; j++) {
                norm_set(j * NORM_LANES + lid, norm_get(j * NORM_LANES + lid) + norm_get(j * NORM_LANES + lid + s));
            }
        }
    }
    workgroupBarrier();
    for (var j = 0u; j < TOK; j++) {
        scale[j] = norm_scale(norm_get(j * NORM_LANES));
    }
    // `partial` is written again below.
    workgroupBarrier();
#endif

    // acc[j]: token j's sum (with GLU acc[TOK + j]: its up row's).
    var acc: array<f32, SUMS>;
#ifdef Q8_SLICE
    // Slice by slice (a uniform loop: every lane reaches the barriers).
    let n_chunks = p.n_in / CHUNK;
    for (var base = 0u; base < n_chunks; base += Q8_SLICE) {
        q8_stage(lid, t0, n_tok, base);
        workgroupBarrier();
        if (live) {
            let row_base = w_row(r);
            for (var c = base + lane; c < min(base + Q8_SLICE, n_chunks); c += TPR) {
                let wq = q8w_chunk(row_base, c);
#ifdef GLU
                let wu = q8w_chunk(row_base + p.up_bytes, c);
#endif
                for (var j = 0u; j < TOK; j++) {
                    if (t0 + j < n_tok) {
                        acc[j] += q8_dot(wq, j, c - base);
#ifdef GLU
                        acc[TOK + j] += q8_dot(wu, j, c - base);
#endif
                    }
                }
            }
        }
        // The next slice overwrites the staged one.
        workgroupBarrier();
    }
#else
    if (live) {
        let row_base = w_row(r);
        let n_chunks = p.n_in / CHUNK;
        let x_row = p.n_in / 4u;
        // Each token's first vec4 in x.
        var xs: array<u32, TOK>;
        for (var j = 0u; j < TOK; j++) {
            xs[j] = x_index(min(t0 + j, n_tok - 1u)) * x_row;
        }
        for (var c = lane; c < n_chunks; c += TPR) {
#ifdef NORM
            let wq = norm_weighted(dequant_chunk(row_base, c), c);
#else
            let wq = dequant_chunk(row_base, c);
#endif
#ifdef GLU
#ifdef NORM
            let wu = norm_weighted(dequant_chunk(row_base + p.up_bytes, c), c);
#else
            let wu = dequant_chunk(row_base + p.up_bytes, c);
#endif
#endif
            for (var j = 0u; j < TOK; j++) {
                if (t0 + j < n_tok) {
                    let xb = xs[j] + c * 8u;
                    acc[j] += chunk_dot(wq, xb);
#ifdef GLU
                    acc[TOK + j] += chunk_dot(wu, xb);
#endif
                }
            }
        }
    }
#endif

#ifdef SUBGROUP_REDUCE
    // The team's lanes are consecutive invocations of one subgroup: after the butterfly every
    // lane holds the row's sums.
    for (var j = 0u; j < SUMS; j++) {
        var v = acc[j];
        for (var s = TPR / 2u; s > 0u; s >>= 1u) {
            v += subgroupShuffleXor(v, s);
        }
        acc[j] = v;
    }
#else
    // TOK sums a round (GLU's gate, then its up row), so the workgroup memory stays TOK · WG.
    for (var h = 0u; h < SUMS; h += TOK) {
        for (var j = 0u; j < TOK; j++) {
            partial[j * WG + lid] = acc[h + j];
        }
        for (var s = TPR / 2u; s > 0u; s >>= 1u) {
            workgroupBarrier();
            if (lane < s) {
                for (var j = 0u; j < TOK; j++) {
                    partial[j * WG + lid] += partial[j * WG + lid + s];
                }
            }
        }
        workgroupBarrier();
        for (var j = 0u; j < TOK; j++) {
            acc[h + j] = partial[j * WG + team * TPR];
        }
        workgroupBarrier();
    }
#endif

#ifdef NORM
    for (var j = 0u; j < SUMS; j++) {
        acc[j] *= scale[j % TOK];
    }
#endif

    // Lane l of the team writes tokens t0 + l, t0 + l + TPR, ... The loop runs over every
    // token with constant bounds, so that a GPU's compiler unrolls it and acc keeps constant
    // indices: an index that depends on the lane would put acc in local memory, and every sum
    // above with it.
    for (var j = 0u; j < TOK; j++) {
        if (j % TPR == lane && live && t0 + j < n_tok) {
#ifdef GLU
            put(t0 + j, r, glu_act(acc[j]) * acc[TOK + j]);
#else
            put(t0 + j, r, acc[j]);
#endif
        }
    }
}

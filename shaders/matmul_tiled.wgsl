// Quantized matrix times a step's tokens as a register-tiled GEMM (GPUs, steps of more than
// 16 tokens: prefill and large batches; ops::matmul picks it):
//   y[t, row_offset + r] = Σ_i W[r, i] · x[t, i] (+ bias[r]) (+ y[t, row_offset + r])
//
// A workgroup of SIDE × SIDE invocations owns a tile of BM = TM SIDE weight rows × BN = 4 SIDE
// tokens (64 × 64 or 32 × 32, and with FLINT_TUNE gemm_rows=8 also 128 × 64: ops::matmul
// picks the largest that still spreads over the device) and walks the row in 32-element
// chunks. Per chunk, BM lanes each dequantize one row's chunk once into
// workgroup memory (ws, [k4][row]) and every lane loads a share of the tokens' activations
// (xs, [k4][token]); then each lane multiplies TM rows × TN tokens from workgroup memory
// into registers: 8 vec4 loads for 64 multiply-adds per vec4 step (TM = 4; 12 for 128 at
// TM = 8), where the lane-team kernel (matmul.wgsl) re-reads each token's activations from
// memory for every row team.
// Lane (tx, ty) takes rows ty, ty + SIDE, ... and tokens tx, tx + SIDE, ...: a subgroup's
// lanes read SIDE consecutive tokens (no bank conflicts) and a few rows (broadcasts). Token
// t's k4-th vec4 is kept at xs[k4 BN + (t ^ k4)]: eight consecutive lanes stage one token's
// eight vec4 (consecutive in x), and unswizzled they would all land in the same banks, BN
// vec4 apart (an 8-way conflict on every store); the swizzle spreads them over all 32. The two
// tiles of a 64 × 64 workgroup take 8 KB each: WebGPU's default 16 KB of workgroup memory.
//
// The sums run in another order than the lane-team kernels' and the step's size decides
// which kernel a token takes, so a token's bits depend on its step: the exact mode
// (ops::matmul::MatmulDesc::exact) never builds this kernel.
//
// With GLU the tile's rows are BM / 2 gate rows over their BM / 2 up rows, so each lane
// holds a gate row's sums and its up row's (rows ty + 16 i and ty + 16 i + BM / 2) and stores
// act(gate) · up. With NORM (x is the residual stream) the workgroup first sums its tokens'
// squares, the activations are multiplied by the norm weight as they are staged, and a
// token's sums are scaled by its 1 / rms before the store. Bias, accumulation and split
// outputs are matmul_io.wgsl's run-time flags. Not by expert (IDS).
//
// With F16 (adapters with shader-f16, FLINT_TUNE gemm_in=f16) the staged tiles are half
// precision and each lane sums a chunk's 32 products per (row, token) in f16 (vec4 fmas:
// two packed half multiply-adds per four products, and half the workgroup-memory bytes),
// adding the chunk's sum to its f32 sum: within the quantized bound (NMSE 5e-4), as
// llama.cpp's f16 tiles are. The activations are staged already normalized (NORM: times the
// token's 1 / rms), so the residual stream's magnitude does not meet f16's range.
//
// With Q8_CHUNKS (FLINT_TUNE gemm_in=q8, the formats of ops::matmul::Q8_FORMATS) the tiles
// are 8-bit integers, as llama.cpp's integer-dot GEMM: a stage holds Q8_CHUNKS chunks, every
// lane unpacking one (row, chunk) of weights (dequant_q8.wgsl) and quantizing one (token,
// chunk) of activations (scale max |x| / 127, with the chunk's sum; with NORM of x ⊙ norm_w,
// the 1 / rms applied at the store as in f32). Each lane sums its TM × TN products of a chunk
// four at a time in integers (dot4I8Packed) and scales them once a chunk: a quarter of the
// f32 tiles' multiply-adds and of their workgroup-memory bytes per product, and no float
// conversion per weight. Every row tile quantizes its tokens' chunks itself (at 64 × 64 about
// a tenth of its operations), where llama.cpp quantizes them once in a pass of their own.
//
// The tall tile (TM = 8, 128 × 64) halves the activations' bytes per product (each staged
// token chunk serves 128 rows), makes a quarter fewer workgroup-memory loads per multiply-add,
// and has half the lanes rather than a quarter dequantize; it holds twice the accumulators,
// and its f32 tiles take 24 KB (more than WebGPU's default 16 KB: where the adapter grants
// it).
//
// Defines: the format (ShaderDefs::quant), SIDE (16 or 8), TM (weight rows per lane: 4, or 8
// at SIDE 16), GLU, GELU_TANH, NORM, F16, Q8_CHUNKS (WG / BM: one weight chunk per lane, and
// one token chunk per lane for the first BN · Q8_CHUNKS lanes).

#ifdef F16
enable f16;
#endif
#define HAS_BATCH
#include "matmul_io.wgsl"

#include "dequant.wgsl"

const WG: u32 = SIDE * SIDE;
// Weight rows (TM, a define) and tokens per lane, and per tile.
const TN: u32 = 4u;
const BM: u32 = TM * SIDE;
const BN: u32 = TN * SIDE;

#ifdef GLU
// Output rows per tile (a gate row and its up row each).
const OUT_ROWS: u32 = BM / 2u;
#else
const OUT_ROWS: u32 = BM;
#endif

#ifdef NORM
// Lanes that sum one token's squares.
const PER_TOKEN: u32 = WG / BN;
#endif

#ifdef Q8_CHUNKS
#include "dequant_q8.wgsl"

// A stage's chunks: the weight quants, [chunk][word][row], with each (chunk, row)'s scales
// (d of either half, m), and the activations' quants, [chunk][word][token], with each
// (chunk, token)'s scale and sum.
var<workgroup> wq: array<u32, Q8_CHUNKS * 8u * BM>;
var<workgroup> wd: array<vec2<f32>, Q8_CHUNKS * BM>;
var<workgroup> wm: array<f32, Q8_CHUNKS * BM>;
var<workgroup> xq: array<u32, Q8_CHUNKS * 8u * BN>;
var<workgroup> xd: array<vec2<f32>, Q8_CHUNKS * BN>;

// The lane's integer products of staged chunk c over words k0 .. k1, per (row, token):
// rows ty + SIDE i, tokens tx + SIDE j.
fn tile_isums(c: u32, tx: u32, ty: u32, k0: u32, k1: u32) -> array<i32, TM * TN> {
    var s: array<i32, TM * TN>;
    for (var k = k0; k < k1; k++) {
        var a: array<u32, TM>;
        var b: array<u32, TN>;
        for (var i = 0u; i < TM; i++) {
            a[i] = wq[(c * 8u + k) * BM + ty + SIDE * i];
        }
        for (var j = 0u; j < TN; j++) {
            b[j] = xq[(c * 8u + k) * BN + tx + SIDE * j];
        }
        for (var i = 0u; i < TM; i++) {
            for (var j = 0u; j < TN; j++) {
                s[i * TN + j] += dot4I8Packed(a[i], b[j]);
            }
        }
    }
    return s;
}
#else
#ifdef F16
alias Stage = vec4<f16>;
#else
alias Stage = vec4<f32>;
#endif

// The tile's dequantized chunk, [k4][row], and its tokens' activations, [k4][token].
var<workgroup> ws: array<Stage, 8u * BM>;
var<workgroup> xs: array<Stage, 8u * BN>;
#endif

#ifdef NORM
#ifdef F16
#define NORM_SQ
// Each token's 1 / rms (xs is too narrow for it).
var<workgroup> tok_scale: array<f32, BN>;
#endif
#ifdef Q8_CHUNKS
#define NORM_SQ
#endif
#endif
#ifdef NORM_SQ
// The lanes' sums of squares (where xs cannot hold them).
var<workgroup> sq: array<f32, WG>;
#endif

@compute @workgroup_size(SIDE * SIDE)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let r0 = linear_group(wg, p.groups_x) * OUT_ROWS;
    let t0 = wg.z * BN;
    let n_tok = batch.n_tok;
    let tx = lid % SIDE;
    let ty = lid / SIDE;
    let n_chunks = p.n_in / CHUNK;
    let x_row = p.n_in / 4u;

#ifdef NORM
    // Each token's 1 / rms: PER_TOKEN lanes a token, each over every PER_TOKEN-th chunk.
    {
        let tok = lid / PER_TOKEN;
        var ss = 0.0;
        if (t0 + tok < n_tok) {
            let xb = (t0 + tok) * x_row;
            for (var c = lid % PER_TOKEN; c < n_chunks; c += PER_TOKEN) {
                for (var k = 0u; k < 8u; k++) {
                    let v = x[xb + c * 8u + k];
                    ss += dot(v, v);
                }
            }
        }
#ifdef NORM_SQ
        sq[lid] = ss;
#else
        xs[lid] = vec4<f32>(ss, 0.0, 0.0, 0.0);
#endif
    }
    workgroupBarrier();
#ifdef F16
    // Each token's scale, applied as its activations are staged (0 past the step: its
    // padded tokens are staged as zeros, not as the last token's times 1 / sqrt(eps)).
    if (lid < BN) {
        var ss = 0.0;
        for (var q = 0u; q < PER_TOKEN; q++) {
            ss += sq[lid * PER_TOKEN + q];
        }
        tok_scale[lid] = select(0.0, norm_scale(ss), t0 + lid < n_tok);
    }
    workgroupBarrier();
#else
    var scale: array<f32, TN>;
    for (var j = 0u; j < TN; j++) {
        let b = (tx + SIDE * j) * PER_TOKEN;
        var ss = 0.0;
        for (var q = 0u; q < PER_TOKEN; q++) {
#ifdef NORM_SQ
            ss += sq[b + q];
#else
            ss += xs[b + q].x;
#endif
        }
        scale[j] = norm_scale(ss);
    }
    // xs is staged again below.
    workgroupBarrier();
#endif
#endif

    // The row this lane dequantizes (lanes below BM; with Q8_CHUNKS every lane, chunk lid / BM
    // of the stage): tile row lid % BM, with GLU an up row from BM / 2 on.
    let w_t = lid % BM;
    let w_r = r0 + w_t % OUT_ROWS;
#ifdef Q8_CHUNKS
    let w_live = w_r < p.n_rows;
#else
    let w_live = lid < BM && w_r < p.n_rows;
#endif
#ifdef GLU
    let w_base = w_row(min(w_r, p.n_rows - 1u)) + select(0u, p.up_bytes, w_t >= OUT_ROWS);
#else
    let w_base = w_row(min(w_r, p.n_rows - 1u));
#endif

    // acc[i * TN + j]: row ty + SIDE i, token tx + SIDE j.
    var acc: array<f32, TM * TN>;
#ifdef Q8_CHUNKS
    // The weight chunk and the activations' chunk (token lid % BN) this lane stages (with
    // TM = 8 only the first BN · Q8_CHUNKS lanes stage activations).
    let w_c = lid / BM;
    let x_tok = lid % BN;
    let x_c = lid / BN;
    let x_live = x_c < Q8_CHUNKS;
    let xb = min(t0 + x_tok, n_tok - 1u) * x_row;
    for (var c0 = 0u; c0 < n_chunks; c0 += Q8_CHUNKS) {
        // Chunks past the row stage zeros (scales 0), which add nothing.
        var wc: Q8Chunk;
        if (w_live && c0 + w_c < n_chunks) {
            wc = q8w_chunk(w_base, c0 + w_c);
        }
        for (var k = 0u; k < 8u; k++) {
            wq[(w_c * 8u + k) * BM + w_t] = wc.q[k];
        }
        wd[w_c * BM + w_t] = wc.d;
        wm[w_c * BM + w_t] = wc.m;
        if (x_live) {
            // Tokens past the step repeat its last (never stored).
            var v: array<vec4<f32>, 8>;
            let xc = c0 + x_c;
            if (xc < n_chunks) {
                v = x_chunk(xb, xc);
            }
            let a = q8_quantize(v);
            for (var k = 0u; k < 8u; k++) {
                xq[(x_c * 8u + k) * BN + x_tok] = a.q[k];
            }
            xd[x_c * BN + x_tok] = vec2<f32>(a.d, a.sum);
        }
        workgroupBarrier();
        for (var c = 0u; c < Q8_CHUNKS; c++) {
#ifdef Q_Q6_K
            // Q6_K scales the chunk's halves apart.
            let lo = tile_isums(c, tx, ty, 0u, 4u);
            let hi = tile_isums(c, tx, ty, 4u, 8u);
#else
            let lo = tile_isums(c, tx, ty, 0u, 8u);
#endif
            for (var i = 0u; i < TM; i++) {
                let d = wd[c * BM + ty + SIDE * i];
                let m = wm[c * BM + ty + SIDE * i];
                for (var j = 0u; j < TN; j++) {
                    let xa = xd[c * BN + tx + SIDE * j];
#ifdef Q_Q6_K
                    let f = d.x * f32(lo[i * TN + j]) + d.y * f32(hi[i * TN + j]);
#else
                    let f = d.x * f32(lo[i * TN + j]);
#endif
                    acc[i * TN + j] += xa.x * f + m * xa.y;
                }
            }
        }
        // The next stage overwrites this one.
        workgroupBarrier();
    }
#else
    for (var c = 0u; c < n_chunks; c++) {
        if (w_live) {
            let q = dequant_chunk(w_base, c);
            for (var k = 0u; k < 8u; k++) {
                ws[k * BM + lid] = Stage(q[k]);
            }
        }
        // Tokens past the step repeat its last (never stored).
        for (var s = 0u; s < 8u * BN / WG; s++) {
            let i = lid + s * WG;
            let tok = i / 8u;
            let k4 = i % 8u;
            var v = x[min(t0 + tok, n_tok - 1u) * x_row + c * 8u + k4];
#ifdef NORM
            v *= norm_w[c * 8u + k4];
#ifdef F16
            v *= tok_scale[tok];
#endif
#endif
            xs[k4 * BN + (tok ^ k4)] = Stage(v);
        }
        workgroupBarrier();
#ifdef F16
        // The chunk's products per (row, token), four f16 partial sums each.
        var part: array<vec4<f16>, TM * TN>;
#endif
        for (var k = 0u; k < 8u; k++) {
            var a: array<Stage, TM>;
            var b: array<Stage, TN>;
            for (var i = 0u; i < TM; i++) {
                a[i] = ws[k * BM + ty + SIDE * i];
            }
            for (var j = 0u; j < TN; j++) {
                // Token tx + SIDE j, swizzled as staged: k < 8 <= SIDE flips only tx's bits.
                b[j] = xs[k * BN + (tx ^ k) + SIDE * j];
            }
            for (var i = 0u; i < TM; i++) {
                for (var j = 0u; j < TN; j++) {
#ifdef F16
                    part[i * TN + j] = fma(a[i], b[j], part[i * TN + j]);
#else
                    acc[i * TN + j] += dot(a[i], b[j]);
#endif
                }
            }
        }
#ifdef F16
        for (var i = 0u; i < TM * TN; i++) {
            let h = part[i].xy + part[i].zw;
            acc[i] += f32(h.x + h.y);
        }
#endif
        workgroupBarrier();
    }
#endif

    for (var i = 0u; i < TM * OUT_ROWS / BM; i++) {
        let r = r0 + ty + SIDE * i;
        for (var j = 0u; j < TN; j++) {
            let t = t0 + tx + SIDE * j;
            if (r < p.n_rows && t < n_tok) {
                var v = acc[i * TN + j];
#ifdef NORM
#ifndef F16
                v *= scale[j];
#endif
#endif
#ifdef GLU
                var u = acc[(i + TM / 2u) * TN + j];
#ifdef NORM
#ifndef F16
                u *= scale[j];
#endif
#endif
                v = glu_act(v) * u;
#endif
                put(t, r, v);
            }
        }
    }
}

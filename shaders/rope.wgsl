// RoPE in place on x: [n_tok, n_heads, head_dim] f32, rotating the first rope_dim values of
// each head by theta_i = pos[t] · freq_scale · inv_freq[i]. Pairs are (2i, 2i+1) (Normal,
// llama's GGUF layout) or (i, i + rope_dim/2) (NEOX). One invocation per pair.
// inv_freq comes from the CPU (computed exactly as the reference does) and sin/cos use an
// explicit range reduction, so large positions stay accurate on every GPU.
// Defines: WG (threads per workgroup), NEOX (half-split pairs).
#include "common.wgsl"

struct Params {
    n_heads: u32,
    head_dim: u32,
    // rope_dim / 2
    n_pairs: u32,
    freq_scale: f32,
}

@group(0) @binding(0) var<uniform> batch: BatchInfo;
@group(0) @binding(1) var<uniform> p: Params;
// pos: [n_tok] u32
@group(0) @binding(2) var<storage, read> tok_pos: array<u32>;
// inv_freq: [rope_dim / 2] f32
@group(0) @binding(3) var<storage, read> inv_freq: array<f32>;
// x: [n_tok, n_heads, head_dim] f32, rotated in place
@group(0) @binding(4) var<storage, read_write> x: array<f32>;

// pi/2 split for Cody-Waite reduction: P1..P3 have at most 7 significant bits, so k·Pi is
// exact for |k| < 2^17 (|theta| < ~205000).
const PIO2_1: f32 = 1.5625;
const PIO2_2: f32 = 0.0081787109375;
const PIO2_3: f32 = 0.00011730194091796875;
const PIO2_4: f32 = 3.1391647326017846e-07;
const TWO_OVER_PI: f32 = 0.6366197723675814;

// (sin, cos) of theta; minimax polynomials on [-pi/4, pi/4] (Cephes sinf/cosf).
fn sin_cos(theta: f32) -> vec2<f32> {
    let k = floor(theta * TWO_OVER_PI + 0.5);
    let r = ((theta - k * PIO2_1) - k * PIO2_2) - k * PIO2_3 - k * PIO2_4;
    let z = r * r;
    let s = ((-1.9515295891e-4 * z + 8.3321608736e-3) * z - 1.6666654611e-1) * z * r + r;
    let c = ((2.443315711809948e-5 * z - 1.388731625493765e-3) * z + 4.166664568298827e-2) * z * z - 0.5 * z + 1.0;
    let q = u32(i32(k)) & 3u;
    switch q {
        case 0u: { return vec2<f32>(s, c); }
        case 1u: { return vec2<f32>(c, -s); }
        case 2u: { return vec2<f32>(-s, -c); }
        default: { return vec2<f32>(-c, s); }
    }
}

@compute @workgroup_size(WG)
fn main(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let idx = linear_group(wg, nwg.x) * WG + lid;
    let heads = batch.n_tok * p.n_heads;
    if (idx >= heads * p.n_pairs) {
        return;
    }
    let i = idx % p.n_pairs;
    let head = idx / p.n_pairs;
    let t = head / p.n_heads;
    let base = head * p.head_dim;
#ifdef NEOX
    let a = base + i;
    let b = a + p.n_pairs;
#else
    let a = base + 2u * i;
    let b = a + 1u;
#endif
    // Same operation order as the reference: (pos · freq_scale) · inv_freq.
    let theta = f32(tok_pos[t]) * p.freq_scale * inv_freq[i];
    let sc = sin_cos(theta);
    let x0 = x[a];
    let x1 = x[b];
    x[a] = x0 * sc.y - x1 * sc.x;
    x[b] = x0 * sc.x + x1 * sc.y;
}

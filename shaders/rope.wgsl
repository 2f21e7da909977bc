// RoPE in place on x: [n_tok, n_heads, head_dim] f32, rotating the first rope_dim values of
// each head by theta_i = pos[t] · freq_scale · inv_freq[i]. Pairs are (2i, 2i+1) (Normal,
// llama's GGUF layout) or (i, i + rope_dim/2) (NEOX). One invocation per pair.
// inv_freq comes from the CPU (computed exactly as the reference does) and sin/cos use an
// explicit range reduction, so large positions stay accurate on every GPU.
// Defines: WG (threads per workgroup), NEOX (half-split pairs).
#include "common.wgsl"
#include "rope_common.wgsl"

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

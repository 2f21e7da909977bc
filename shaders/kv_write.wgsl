// Writes this step's K and V rows into one layer's paged caches: token t's row goes to slot
// block_table[seq[t] * max_blocks + pos[t] / block_size] * block_size + pos[t] % block_size.
// With ROPE, K rows are rotated at their positions on the way (rope_common.wgsl).
// Grid: (ceil((kv_dim + v_dim) / WG), n_tok); one element per invocation.
#include "common.wgsl"
#include "paged.wgsl"
#include "rope_common.wgsl"

struct Params {
    kv_dim: u32, // n_head_kv * head_dim
    v_dim: u32,  // n_head_kv * head_dim_v
    head_dim: u32,
    _pad1: u32,
}

@group(0) @binding(0) var<uniform> info: BatchInfo;
@group(0) @binding(1) var<uniform> params: Params;
@group(0) @binding(2) var<storage, read> tok_pos: array<u32>;      // [n_tok]
@group(0) @binding(3) var<storage, read> tok_seq: array<u32>;      // [n_tok]
@group(0) @binding(4) var<storage, read> block_table: array<u32>;  // [n_seq, max_blocks]
@group(0) @binding(5) var<storage, read> k: array<f32>;            // [n_tok, kv_dim] f32
@group(0) @binding(6) var<storage, read> v: array<f32>;            // [n_tok, v_dim] f32
@group(0) @binding(7) var<storage, read_write> k_cache: array<f32>; // [n_blocks * block_size, kv_dim]
@group(0) @binding(8) var<storage, read_write> v_cache: array<f32>; // [n_blocks * block_size, v_dim]
#ifdef ROPE
@group(0) @binding(9) var<uniform> rope: RopeParams;
@group(0) @binding(10) var<storage, read> inv_freq: array<f32>;
#endif

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let t = wg.y;
    let e = wg.x * WG + lid;
    if (t >= info.n_tok || e >= params.kv_dim + params.v_dim) {
        return;
    }
    let p = tok_pos[t];
    let slot = kv_slot(tok_seq[t], p);
    if (e < params.kv_dim) {
        // A bad block id is dropped rather than written past the cache.
        if (slot < arrayLength(&k_cache) / params.kv_dim) {
            let row = t * params.kv_dim;
            var val = k[row + e];
#ifdef ROPE
            let d = e % params.head_dim;
            val = rope_rotate(d, val, k[row + e - d + rope_partner(d)], p);
#endif
            k_cache[slot * params.kv_dim + e] = val;
        }
    } else {
        let ev = e - params.kv_dim;
        if (slot < arrayLength(&v_cache) / params.v_dim) {
            v_cache[slot * params.v_dim + ev] = v[t * params.v_dim + ev];
        }
    }
}

// Token embedding lookup from one row-part of the table:
//   x[t, :] = dequant(table[tokens[t] - row_offset, :]) * scale
// for t < n_tok whose id lies in [row_offset, row_offset + part_rows); other rows of x are
// left alone (another part writes them). Invocation = one 32-element chunk of one token;
// grid x walks chunks, y walks tokens.
//
// Defines: the format (ShaderDefs::quant), WG.

#include "common.wgsl"

struct Params {
    n_embd: u32,     // elements per row (a multiple of 32)
    part_rows: u32,  // rows in this part of the table
    row_offset: u32, // token id of the part's first row
    row_bytes: u32,  // bytes per row of the table
    scale: f32,
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<uniform> batch: BatchInfo;
// tokens: [max_tokens] u32 token ids
@group(0) @binding(2) var<storage, read> tokens: array<u32>;
// w: [part_rows, n_embd] blocks of the table format in GPU layout (weights::layout), as
// 16-byte vectors where the format defines W_VEC4
#ifdef W_VEC4
@group(0) @binding(3) var<storage, read> w: array<vec4<u32>>;
#else
@group(0) @binding(3) var<storage, read> w: array<u32>;
#endif
// x: [n_tok, n_embd] f32
@group(0) @binding(4) var<storage, read_write> x: array<vec4<f32>>;

#include "dequant.wgsl"

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let t = wg.y;
    let c = wg.x * WG + lid;
    if (t >= batch.n_tok || c >= p.n_embd / CHUNK) {
        return;
    }
    let row = tokens[t] - p.row_offset; // wraps past part_rows for ids below the part
    if (row >= p.part_rows) {
        return;
    }
    let v = dequant_chunk(row * p.row_bytes, c);
    let xb = t * (p.n_embd / 4u) + c * 8u;
    for (var k = 0u; k < 8u; k++) {
        x[xb + k] = v[k] * p.scale;
    }
}

// Soft cap in place: x[i] = cap * tanh(x[i] / cap) over n_tok × n (gemma2's final logits).
// One value per invocation. Defines: WG (threads per workgroup).
#include "common.wgsl"

struct Params {
    n: u32,
    cap: f32,
}

@group(0) @binding(0) var<uniform> batch: BatchInfo;
@group(0) @binding(1) var<uniform> p: Params;
// x: [n_tok, n] f32, updated in place
@group(0) @binding(2) var<storage, read_write> x: array<f32>;

@compute @workgroup_size(WG)
fn main(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let i = linear_group(wg, nwg.x) * WG + lid;
    if (i >= batch.n_tok * p.n) {
        return;
    }
    x[i] = p.cap * tanh_f32(x[i] / p.cap);
}

// Residual and bias adds in place: x[t, i] += y[t, i] over n_tok × n, or with BIAS
// x[t, i] += y[i] (one [n] vector added to every row). One value per invocation.
// Defines: WG (threads per workgroup), BIAS.
#include "common.wgsl"

struct Params {
    n: u32,
}

@group(0) @binding(0) var<uniform> batch: BatchInfo;
@group(0) @binding(1) var<uniform> p: Params;
// y: [n_tok, n] f32, or [n] f32 with BIAS
@group(0) @binding(2) var<storage, read> y: array<f32>;
// x: [n_tok, n] f32, updated in place
@group(0) @binding(3) var<storage, read_write> x: array<f32>;

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
#ifdef BIAS
    x[i] += y[i % p.n];
#else
    x[i] += y[i];
#endif
}

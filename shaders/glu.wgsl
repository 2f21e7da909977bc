// Gated activation: out[t, i] = act(gate[t, i]) · up[t, i] over n_tok × n_ff, one value per
// invocation (act: common.wgsl's glu_act). Dense feed-forward blocks fuse it into their
// gate-and-up matmul; a mixture of experts runs it over the routed entries.
// Defines: WG (threads per workgroup), GELU_TANH (else SiLU), IN_PLACE (out aliases gate),
// WRONG (tests only: every 16th value is lost, as a broken driver might lose a lane; the
// self-test must catch it).
#include "common.wgsl"

struct Params {
    n_ff: u32,
}

@group(0) @binding(0) var<uniform> batch: BatchInfo;
@group(0) @binding(1) var<uniform> p: Params;
// up: [n_tok, n_ff] f32
@group(0) @binding(2) var<storage, read> up: array<f32>;
#ifdef IN_PLACE
// gate: [n_tok, n_ff] f32, overwritten with the result
@group(0) @binding(3) var<storage, read_write> gate: array<f32>;
#else
// gate: [n_tok, n_ff] f32
@group(0) @binding(3) var<storage, read> gate: array<f32>;
// out: [n_tok, n_ff] f32
@group(0) @binding(4) var<storage, read_write> out: array<f32>;
#endif

@compute @workgroup_size(WG)
fn main(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let i = linear_group(wg, nwg.x) * WG + lid;
    if (i >= batch.n_tok * p.n_ff) {
        return;
    }
    var y = glu_act(gate[i]) * up[i];
#ifdef WRONG
    if (i % 16u == 15u) {
        y = 0.0;
    }
#endif
#ifdef IN_PLACE
    gate[i] = y;
#else
    out[i] = y;
#endif
}

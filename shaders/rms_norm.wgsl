// RMSNorm over rows: out[r, j] = x[r, j] / sqrt(mean_j(x[r, j]²) + eps) · w[j].
// One workgroup per row. Rows are n_tok·rows_per_token rows of row_len (n_embd rows, or
// head_dim rows for QK-norm); with GATHER, out row r is x row gather[r] for r < n_tok (the
// head's output rows: n_tok of its batch counts them). With RESIDUAL the normalized row is
// added to out (gemma's post-norms: the norm and the residual add in one pass).
// Defines: WG (threads per workgroup, a power of two), IN_PLACE (out aliases x), GATHER,
// RESIDUAL.
#include "common.wgsl"

struct Params {
    row_len: u32,
    rows_per_token: u32,
    eps: f32,
    _pad: u32,
}

@group(0) @binding(0) var<uniform> batch: BatchInfo;
@group(0) @binding(1) var<uniform> p: Params;
// w: [row_len] f32
@group(0) @binding(2) var<storage, read> w: array<f32>;
#ifdef IN_PLACE
// x: [n_rows, row_len] f32, normalized in place
@group(0) @binding(3) var<storage, read_write> x: array<f32>;
#else
// x: [n_rows, row_len] f32
@group(0) @binding(3) var<storage, read> x: array<f32>;
// out: [n_rows, row_len] f32
@group(0) @binding(4) var<storage, read_write> out: array<f32>;
#endif
#ifdef GATHER
// gather: [n_tok] u32, the x row of each output row
@group(0) @binding(5) var<storage, read> gather: array<u32>;
#endif

var<workgroup> partial: array<f32, WG>;

@compute @workgroup_size(WG)
fn main(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let r = linear_group(wg, nwg.x);
    let n_rows = batch.n_tok * p.rows_per_token;
    if (r >= n_rows) {
        return;
    }
#ifdef GATHER
    let src = gather[r];
#else
    let src = r;
#endif
    let dst = r;
    let xs = src * p.row_len;
    let xd = dst * p.row_len;

    var ss = 0.0;
    for (var j = lid; j < p.row_len; j += WG) {
        let v = x[xs + j];
        ss += v * v;
    }
    partial[lid] = ss;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s >>= 1u) {
        if (lid < s) {
            partial[lid] += partial[lid + s];
        }
        workgroupBarrier();
    }
    let scale = 1.0 / sqrt(partial[0] / f32(p.row_len) + p.eps);
    for (var j = lid; j < p.row_len; j += WG) {
#ifdef IN_PLACE
        x[xd + j] = x[xs + j] * scale * w[j];
#else
#ifdef RESIDUAL
        out[xd + j] = out[xd + j] + x[xs + j] * scale * w[j];
#else
        out[xd + j] = x[xs + j] * scale * w[j];
#endif
#endif
    }
}

// RMSNorm over rows: out[r, j] = x[r, j] / sqrt(mean_j(x[r, j]²) + eps) · w[j].
// One workgroup per row. Rows are n_tok·rows_per_token rows of row_len (n_embd rows, or
// head_dim rows for QK-norm), or, with last_token set, only row n_tok−1 written to row 0.
// Defines: WG (threads per workgroup, a power of two), IN_PLACE (out aliases x).
#include "common.wgsl"

struct Params {
    row_len: u32,
    rows_per_token: u32,
    last_token: u32,
    eps: f32,
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
// out: [n_rows, row_len] f32 ([1, row_len] with last_token)
@group(0) @binding(4) var<storage, read_write> out: array<f32>;
#endif

var<workgroup> partial: array<f32, WG>;

@compute @workgroup_size(WG)
fn main(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let r = linear_group(wg, nwg.x);
    var n_rows = batch.n_tok * p.rows_per_token;
    var src = r;
    var dst = r;
    if (p.last_token != 0u) {
        n_rows = min(batch.n_tok, 1u);
        src = batch.n_tok - 1u;
        dst = 0u;
    }
    if (r >= n_rows) {
        return;
    }
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
        out[xd + j] = x[xs + j] * scale * w[j];
#endif
    }
}

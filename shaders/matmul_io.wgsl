// The matmul kernels' interface (matmul.wgsl, matmul_blocked.wgsl; ops::matmul's Params):
// parameters, weights, activations, output, bias, then the batch uniform. The bias and the
// accumulation are switched by `flags` at run time, not by defines, so one compiled kernel
// serves every weight part of a format and token block (on lavapipe each variant costs
// seconds to compile); a part without a bias binds a small unused buffer. The including
// shader defines HAS_BATCH when it reads the token count from the batch.

#include "common.wgsl"

struct Params {
    n_in: u32,       // elements per row of W and x (a multiple of 32)
    n_rows: u32,     // rows of this weight part
    row_offset: u32, // first output column written
    y_stride: u32,   // elements per row of y
    groups_x: u32,   // workgroups in x of the folded grid
    row_bytes: u32,  // bytes per row of W
    flags: u32,      // FLAG_BIAS | FLAG_ACCUMULATE
    _pad1: u32,
}

// y += bias[r]
const FLAG_BIAS: u32 = 1u;
// y = old y + the product (a fused residual add)
const FLAG_ACCUMULATE: u32 = 2u;

@group(0) @binding(0) var<uniform> p: Params;
// w: [n_rows, n_in] raw blocks of the weight format
@group(0) @binding(1) var<storage, read> w: array<u32>;
// x: [n_tok, n_in] f32
@group(0) @binding(2) var<storage, read> x: array<vec4<f32>>;
// y: [n_tok, y_stride] f32
@group(0) @binding(3) var<storage, read_write> y: array<f32>;
// bias: [n_rows] f32 (read only with FLAG_BIAS)
@group(0) @binding(4) var<storage, read> bias: array<f32>;
#ifdef HAS_BATCH
@group(0) @binding(5) var<uniform> batch: BatchInfo;
#endif

// The output value for row r (of this part) at y[yi]: the product v, plus the bias and the
// old y as `flags` say (uniform branches).
fn epilogue(v: f32, r: u32, yi: u32) -> f32 {
    var o = v;
    if ((p.flags & FLAG_BIAS) != 0u) {
        o += bias[r];
    }
    if ((p.flags & FLAG_ACCUMULATE) != 0u) {
        o = y[yi] + o;
    }
    return o;
}

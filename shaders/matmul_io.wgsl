// The matmul kernels' interface (matmul.wgsl, matmul_blocked.wgsl; ops::matmul's Params):
// parameters, weights, activations, output, then the optional bias and the batch uniform.
// The including shader defines HAS_BATCH when it reads the token count from the batch.

#include "common.wgsl"

struct Params {
    n_in: u32,       // elements per row of W and x (a multiple of 32)
    n_rows: u32,     // rows of this weight part
    row_offset: u32, // first output column written
    y_stride: u32,   // elements per row of y
    groups_x: u32,   // workgroups in x of the folded grid
    row_bytes: u32,  // bytes per row of W
    _pad0: u32,
    _pad1: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
// w: [n_rows, n_in] raw blocks of the weight format
@group(0) @binding(1) var<storage, read> w: array<u32>;
// x: [n_tok, n_in] f32
@group(0) @binding(2) var<storage, read> x: array<vec4<f32>>;
// y: [n_tok, y_stride] f32
@group(0) @binding(3) var<storage, read_write> y: array<f32>;
#ifdef HAS_BIAS
// bias: [n_rows] f32
@group(0) @binding(4) var<storage, read> bias: array<f32>;
#ifdef HAS_BATCH
@group(0) @binding(5) var<uniform> batch: BatchInfo;
#endif
#else
#ifdef HAS_BATCH
@group(0) @binding(4) var<uniform> batch: BatchInfo;
#endif
#endif

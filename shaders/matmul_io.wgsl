// The matmul kernels' interface (matmul.wgsl, matmul_blocked.wgsl; ops::matmul's Params):
// parameters, weights, activations, output, bias, the batch uniform, then (IDS) the expert
// lists, or (otherwise) the split outputs. The bias, the split and the
// accumulation are switched by `flags` at run time, not by defines, so one compiled kernel
// serves every weight part of a format and token block (on lavapipe each variant costs
// seconds to compile); a part without a bias binds a small unused buffer. The including
// shader defines HAS_BATCH when it reads the token count from the batch.
//
// With IDS the op multiplies by expert (a mixture of experts' `mul_mat_id`): w holds the
// part's experts one after another (n_rows rows each), and each expert multiplies only the
// entries routed to it, listed by ops::moe's grouping kernel. An entry is token · n_used +
// slot; its activation row is entry / x_div (x_div = n_used when x holds the tokens,
// 1 when it holds the entries) and its output row is the entry. The grid's z walks the
// part's experts, each in tiles of the step's tokens (an expert gets at most one entry per
// token); tiles past an expert's count compute nothing.
//
// Fusions that save dispatches (ops::matmul::Output and MatmulNorm), plain matrices only:
//   GLU (a define): W stacks the gate rows over as many up rows (up row r starts up_bytes
//     after gate row r), and row r's output is act(gate_r · x) · (up_r · x): the feed-forward
//     block's gate, up and activation in one pass over x.
//   FLAG_SPLIT (at run time): W stacks matrices that read the same x (Q, K and V) and each
//     one's rows go to its own output: rows below seg1 to y, rows seg1.. to y1 (stride1),
//     rows seg2.. to y2 (stride2), each from its column 0.
//   NORM (a define; lane-team kernels, ops::matmul::folds_norms): the RMSNorm before the
//     matmul, folded into it. x is the residual stream
//     and y = (W · (x ⊙ norm_w)) / sqrt(mean(x²) + eps); each workgroup sums its tokens'
//     squares itself, in an order that depends on neither the workgroup size nor the token
//     block, so the fold keeps batch invariance.
#ifdef IDS
#define HAS_BATCH
#endif

#include "common.wgsl"

struct Params {
    n_in: u32,       // elements per row of W and x (a multiple of 32)
    n_rows: u32,     // rows of this weight part
    row_offset: u32, // first output column written
    y_stride: u32,   // elements per row of y
    groups_x: u32,   // workgroups in x of the folded grid
    row_bytes: u32,  // bytes per row of W
    flags: u32,      // FLAG_BIAS | FLAG_ACCUMULATE
    expert_offset: u32, // IDS: the part's first expert
    n_entries: u32,  // IDS: entries per expert list (the stride of id_rows)
    x_div: u32,      // IDS: an entry's x row is entry / x_div
    up_bytes: u32,   // GLU: bytes from a gate row to its up row
    seg1: u32,       // FLAG_SPLIT: the first row written to y1
    seg2: u32,       // FLAG_SPLIT: the first row written to y2
    stride1: u32,    // FLAG_SPLIT: elements per row of y1
    stride2: u32,    // FLAG_SPLIT: elements per row of y2
    eps: f32,        // NORM: the norm's epsilon
}

// y += bias[r]
const FLAG_BIAS: u32 = 1u;
// y = old y + the product (a fused residual add)
const FLAG_ACCUMULATE: u32 = 2u;
// rows from seg1 go to y1, from seg2 to y2
const FLAG_SPLIT: u32 = 4u;

@group(0) @binding(0) var<uniform> p: Params;
// w: [n_rows, n_in] blocks of the weight format in GPU layout (weights::layout), as 16-byte
// vectors where the format defines W_VEC4
#ifdef W_VEC4
@group(0) @binding(1) var<storage, read> w: array<vec4<u32>>;
#else
@group(0) @binding(1) var<storage, read> w: array<u32>;
#endif
// x: [n_tok, n_in] f32
@group(0) @binding(2) var<storage, read> x: array<vec4<f32>>;
// y: [n_tok, y_stride] f32
@group(0) @binding(3) var<storage, read_write> y: array<f32>;
// bias: [n_rows] f32 (read only with FLAG_BIAS)
@group(0) @binding(4) var<storage, read> bias: array<f32>;
#ifdef HAS_BATCH
@group(0) @binding(5) var<uniform> batch: BatchInfo;
#endif
#ifndef IDS
// y1, y2: [n_tok, stride1], [n_tok, stride2] f32, FLAG_SPLIT's outputs (else small unused
// buffers)
@group(0) @binding(6) var<storage, read_write> y1: array<f32>;
@group(0) @binding(7) var<storage, read_write> y2: array<f32>;
#endif
#ifdef NORM
// norm_w: [n_in] f32, the folded norm's weight
@group(0) @binding(8) var<storage, read> norm_w: array<vec4<f32>>;

// Chunk c of a row (weights or activations) times the norm weight.
fn norm_weighted(q: array<vec4<f32>, 8>, c: u32) -> array<vec4<f32>, 8> {
    var o = q;
    for (var k = 0u; k < 8u; k++) {
        o[k] *= norm_w[c * 8u + k];
    }
    return o;
}
#endif

// Chunk c of the activations' row that starts at vec4 `row` (times the norm weight with NORM),
// as the 8-bit kernels quantize it.
fn x_chunk(row: u32, c: u32) -> array<vec4<f32>, 8> {
    var v: array<vec4<f32>, 8>;
    for (var k = 0u; k < 8u; k++) {
        v[k] = x[row + c * 8u + k];
    }
#ifdef NORM
    v = norm_weighted(v, c);
#endif
    return v;
}
#ifdef IDS
// id_count: [n_expert] entries routed to each expert (all experts, not only the part's)
@group(0) @binding(6) var<storage, read> id_count: array<u32>;
// id_rows: [n_expert, n_entries] each expert's entries, in token order
@group(0) @binding(7) var<storage, read> id_rows: array<u32>;

// The workgroup's expert (global id), its entry count and its weights' first byte.
var<private> ids_expert: u32;
var<private> ids_count: u32;
var<private> ids_w_base: u32;

// Decodes grid z into this workgroup's expert and returns its token tile (of `tok` entries).
fn ids_tile(z: u32, tok: u32) -> u32 {
    let tiles = max((batch.n_tok + tok - 1u) / tok, 1u);
    let e = z / tiles;
    ids_expert = p.expert_offset + e;
    ids_count = id_count[ids_expert];
    ids_w_base = e * p.n_rows * p.row_bytes;
    return z % tiles;
}
#endif

// The NORM scale of a row whose squares sum to ss: 1 / sqrt(mean(x²) + eps), as rms_norm.wgsl.
fn norm_scale(ss: f32) -> f32 {
    return 1.0 / sqrt(ss / f32(p.n_in) + p.eps);
}

// Byte offset in w of row r (of the workgroup's expert with IDS).
fn w_row(r: u32) -> u32 {
#ifdef IDS
    return ids_w_base + r * p.row_bytes;
#else
    return r * p.row_bytes;
#endif
}

// The x row of the workgroup's i-th token (with IDS: of its expert's i-th entry).
fn x_index(i: u32) -> u32 {
#ifdef IDS
    return id_rows[ids_expert * p.n_entries + i] / p.x_div;
#else
    return i;
#endif
}

// The y row of the workgroup's i-th token (with IDS: the entry itself).
fn y_index(i: u32) -> u32 {
#ifdef IDS
    return id_rows[ids_expert * p.n_entries + i];
#else
    return i;
#endif
}

// Stores the product v of row r (of this part) for the workgroup's i-th token: plus the bias
// and the old output as `flags` say (uniform branches), into y or (FLAG_SPLIT) the output
// that holds the row.
fn put(i: u32, r: u32, v: f32) {
    var o = v;
#ifdef WRONG
    // Tests only (FLINT_TEST_WRONG_KERNEL=glu): every 16th row is lost, as a broken driver
    // might lose a lane; the self-test must catch it.
    if (r % 16u == 15u) {
        o = 0.0;
    }
#endif
    if ((p.flags & FLAG_BIAS) != 0u) {
        o += bias[r];
    }
    let acc = (p.flags & FLAG_ACCUMULATE) != 0u;
#ifndef IDS
    if ((p.flags & FLAG_SPLIT) != 0u && r >= p.seg1) {
        if (r >= p.seg2) {
            let yi = i * p.stride2 + r - p.seg2;
            if (acc) {
                o = y2[yi] + o;
            }
            y2[yi] = o;
        } else {
            let yi = i * p.stride1 + r - p.seg1;
            if (acc) {
                o = y1[yi] + o;
            }
            y1[yi] = o;
        }
        return;
    }
#endif
    let yi = y_index(i) * p.y_stride + p.row_offset + r;
    if (acc) {
        o = y[yi] + o;
    }
    y[yi] = o;
}

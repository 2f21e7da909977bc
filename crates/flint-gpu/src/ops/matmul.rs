//! Quantized matmul over one weight part: `y[t, row_offset + r] = Σ_i W[r, i]·x[t, i]`
//! (+ bias[r]) (+ the old y), weights dequantized in the shader.
//!
//! Two fusions ([`Output`]) save dispatches and passes over x: a feed-forward block's gate
//! and up matrices stacked into one, ending in the gated activation (`Output::Glu`), and
//! matrices that read the same x (Q, K and V) stacked into one whose rows go to separate
//! outputs (`Output::Split`).
//!
//! Each weight part builds one kernel per token block in [`TOKEN_BLOCKS`] at load, and a step
//! of n tokens takes the smallest block that holds n (tiles of the largest beyond it), so a
//! small step never pays for a padded 16-token tile. Every variant computes a (row, token)
//! product with the same arithmetic in the same order, so a token's result does not depend on
//! how many tokens share its step (batch invariance).
//! On GPUs the kernels are `shaders/matmul.wgsl`, a team of lanes per row; on CPU-type
//! adapters, where loads cost more than arithmetic, `shaders/matmul_blocked.wgsl`, a block of
//! rows × tokens per invocation. Both pick their workgroup size from the rows and the step so
//! that a small step still spreads over the device.

use std::sync::Arc;

use flint_core::arch::Activation;
use flint_core::quant::QuantType;

use crate::context::GpuContext;
use crate::error::{GpuError, Result};
use crate::ops::{fold_groups, params};
use crate::pipeline::{PipelineCache, PipelineKey};
use crate::shader::ShaderDefs;
use crate::tune::GemmIn;

const SHADER: &str = "matmul.wgsl";
const OP: &str = "matmul";
/// Elements per dequantization chunk; rows must hold a whole number of them.
pub const CHUNK: u32 = 32;
/// Lanes that may share one weight row; `lanes_per_row` picks one from the row length.
pub const LANES_PER_ROW: [u32; 3] = [8, 16, 32];
/// Tokens per kernel variant, smallest first: a step of n tokens takes the first block that
/// holds n, or tiles of the last.
pub const TOKEN_BLOCKS: [u32; 4] = [1, 4, 8, 16];
/// Workgroup sizes of the lane-team kernels (GPUs): the largest that still gives
/// [`GPU_MIN_GROUPS`] workgroups, so a small matrix or step spreads over the SMs.
pub const GPU_WGS: [u32; 3] = [256, 128, 64];
pub const GPU_MIN_GROUPS: u64 = 256;
/// Rows per invocation of the CPU-adapter kernels (see [`blocked_rows`]): 16 for 16-token
/// blocks, [`SMALL_STEP_ROWS`] for 4- and 8-token blocks, 8 for one token, where each
/// invocation loads all of x. 16 × 16 measured fastest on
/// lavapipe for prefill (Q5_0 4864 → 896 × 128 tokens: 47 ms, against 60 ms for 8 × 16 and
/// 205 ms for one row per invocation). Every row's dequantization is inlined, so a cold
/// compile of one pipeline takes lavapipe seconds (Mesa's shader cache shortens, but does not
/// remove, the compile in a later process).
/// Token quads past a step's end are skipped, so a 9-token step in a 16-token block costs
/// what 8 tokens do (Q8_0 640 → 100000: 125 against 126 ms), while a 4-token step still
/// wants its own block (59 ms, against 151 ms in the 16-token one).
/// Halving the rows of the multi-token blocks for the 32-element formats would cut lavapipe's
/// compile about threefold (Q5_0 896 → 4864, empty Mesa cache: 12.7 → 5.0 s for the 16-token
/// block, 13.9 → 5.1 s for the 8-token one), but `flint bench -p 128 -n 32` prefill fell to
/// 0.77× (qwen2.5-coder-0.5b) and 0.87× (gemma-3-270m) of 579b303's (medians of four
/// alternating rounds), past issue 35's 10% bound, so the rows stay.
pub const BLOCK_ROWS: u32 = 16;
pub const DECODE_ROWS: u32 = 8;
/// Rows per invocation for 4- and 8-token blocks: 32 × 8 holds as many accumulators as the
/// 16 × 16 block and loads fewer weights per product than 16 × 8. On lavapipe an 8-sequence
/// decode step took 575 → 432 ms (gemma-3-270m) and 1019 → 563 ms (qwen2.5-coder-0.5b);
/// Q8_0 640 → 100000 × 4 tokens 74 → 57 ms (64 rows: 81 ms).
pub const SMALL_STEP_ROWS: u32 = 32;
/// Workgroup sizes of the CPU-adapter kernels: 64 invocations (8 SIMD groups) where that still
/// leaves [`CPU_MIN_GROUPS`] workgroups to spread over the CPU's threads, else one 8-lane SIMD
/// group, so a small matrix or step still spreads. On lavapipe the larger workgroup runs
/// gemma's Q8_0 head (640 → 131072 rows per part) in 26.5 ms against 31.6 (one token) and
/// 56.6 against 72.2 (8 tokens), and a Q5_0 896 → 4864 prompt step of 128 tokens in 57.0 against
/// 64.3 ms; a 2048-row matrix, 1 or 2 workgroups of 64, was slower (0.77 → 1.10 ms), hence the
/// threshold (`matmul_speed`, same run).
const CPU_WGS: [u32; 2] = [64, 8];
const CPU_MIN_GROUPS: u64 = 16;
/// The tiled GEMM (`shaders/matmul_tiled.wgsl`, GPUs, steps past the largest token block
/// outside the exact mode): its tile sides in lanes, largest first. A side of s lanes is a
/// workgroup of s² lanes and a tile of 4s weight rows × 4s tokens; the 64 × 64 tile's two
/// 64 × 32 f32 staging tiles fill WebGPU's default 16 KB of workgroup memory.
pub const GEMM_SIDES: [u32; 2] = [16, 8];
/// Weight rows per lane of the largest GEMM tile (`FLINT_TUNE` `gemm_rows`): 4 (64 × 64), or 8,
/// a tall 128 × 64 tile tried before it where its grid spreads (half the activation bytes per
/// product and three quarters of the workgroup-memory loads per multiply-add, for twice the
/// accumulators and 24 KB of f32 tiles). The smaller tiles keep 4. 4 until a GPU's figures say
/// the tall tile pays.
pub const GEMM_ROWS: [u32; 2] = [4, 8];
/// A step takes the largest GEMM tile whose grid still has [`GPU_MIN_GROUPS`] workgroups, the
/// smallest while its grid has `GEMM_MIN_GROUPS`, and below that (few rows and few tokens:
/// a 32-token step of a 896-row matrix is 28 workgroups of 32 × 32) the token-block kernel's
/// 16-token tiles, which spread wider. The thresholds wait for the H200's figures; until then
/// `FLINT_TUNE` (`crate::tune`) sets them, and the workgroup sizes and lanes per row, per run.
pub const GEMM_MIN_GROUPS: u64 = 64;

/// The static shape of one weight part's matmul.
#[derive(Clone, Copy, Debug)]
pub struct MatmulDesc<'a> {
    /// Labels the wgpu objects (e.g. the GGUF tensor name and part).
    pub label: &'a str,
    pub ty: QuantType,
    /// Elements per row of W and x; a multiple of 32 and of the format's block.
    pub n_in: u32,
    /// Rows in this part of W.
    pub n_rows: u32,
    /// Output column of the part's first row.
    pub row_offset: u32,
    /// Elements per row of y; at least row_offset + n_rows.
    pub y_stride: u32,
    /// The most tokens a step runs (x and y rows).
    pub max_tokens: u32,
    /// Add the result to y instead of overwriting it (fused residual).
    pub accumulate: bool,
    /// Multiply by expert: W is a stack of experts and each multiplies only the entries
    /// routed to it (a mixture of experts); None for a plain matrix.
    pub ids: Option<MatmulIds<'a>>,
    /// What the rows' products become.
    pub output: Output<'a>,
    /// The RMSNorm before the matmul, folded into it (x is then the un-normalized rows).
    pub norm: Option<MatmulNorm<'a>>,
    /// The exact mode: every step size takes kernels that sum a token's products in one
    /// order, so its bits do not depend on its step (no tiled GEMM, see [`takes_gemm`]).
    pub exact: bool,
}

/// An RMSNorm folded into a matmul: y = (W · (x ⊙ w)) / sqrt(mean(x²) + eps).
#[derive(Clone, Copy, Debug)]
pub struct MatmulNorm<'a> {
    /// [n_in] f32.
    pub w: &'a wgpu::Buffer,
    pub eps: f32,
}

/// What a matmul's rows become (`shaders/matmul_io.wgsl`).
#[derive(Clone, Copy, Debug)]
pub enum Output<'a> {
    /// Row r is column `row_offset + r` of y.
    Rows,
    /// W stacks `n_rows` gate rows over as many up rows, and row r of y is
    /// act(gate_r · x) · (up_r · x): gate, up and the activation in one pass over x.
    Glu(Activation),
    /// W stacks matrices that read the same x, and each one's rows go to its own output: the
    /// first `n_rows − Σ rest` rows to y (from `row_offset`), then each of `rest` in turn (at
    /// most two, from column 0).
    Split(&'a [SplitOut<'a>]),
}

/// One further output of [`Output::Split`].
#[derive(Clone, Copy, Debug)]
pub struct SplitOut<'a> {
    pub rows: u32,
    pub y: &'a wgpu::Buffer,
    /// Elements per row of `y`.
    pub y_stride: u32,
}

/// Most further outputs of a split (y1, y2 in the shader).
pub const MAX_SPLIT_OUTS: usize = 2;
/// Lanes of a lane-team workgroup that sum a folded norm's squares (`shaders/matmul.wgsl`).
const NORM_LANES: u32 = 64;

/// The expert lists a matmul by expert reads (written by `ops::moe::MoeRoute`). An entry is
/// `token · n_used + slot`; it reads x row `entry / x_div` and writes y row `entry`.
#[derive(Clone, Copy, Debug)]
pub struct MatmulIds<'a> {
    /// Experts in this weight part (W holds `n_expert · n_rows` rows).
    pub n_expert: u32,
    /// The part's first expert.
    pub expert_offset: u32,
    /// Experts each token is routed to.
    pub n_used: u32,
    /// `n_used` when x holds one row per token, 1 when it holds one per entry.
    pub x_div: u32,
    /// [all experts] u32: entries routed to each.
    pub count: &'a wgpu::Buffer,
    /// [all experts, max_tokens] u32: each expert's entries.
    pub rows: &'a wgpu::Buffer,
}

/// Uniform parameters, laid out as `Params` in `shaders/matmul_io.wgsl`.
#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct Params {
    n_in: u32,
    n_rows: u32,
    row_offset: u32,
    y_stride: u32,
    groups_x: u32,
    row_bytes: u32,
    /// [`FLAG_BIAS`] | [`FLAG_ACCUMULATE`].
    flags: u32,
    expert_offset: u32,
    n_entries: u32,
    x_div: u32,
    up_bytes: u32,
    seg1: u32,
    seg2: u32,
    stride1: u32,
    stride2: u32,
    eps: f32,
}

/// `Params::flags`: add the bias.
const FLAG_BIAS: u32 = 1;
/// `Params::flags`: add to the old y.
const FLAG_ACCUMULATE: u32 = 2;
/// `Params::flags`: rows from `seg1` go to y1, from `seg2` to y2.
const FLAG_SPLIT: u32 = 4;

/// One kernel variant: the family, its tokens per workgroup, and workgroup size.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shape {
    /// The CPU-adapter kernel (matmul_blocked.wgsl) rather than lane teams (matmul.wgsl).
    pub blocked: bool,
    pub tokens: u32,
    pub wg: u32,
    /// Lanes per row (lane teams) or rows per invocation (blocked).
    pub per: u32,
    /// Multiplies by expert (`MatmulIds`).
    pub ids: bool,
    /// Ends in the gated activation (`Output::Glu`).
    pub glu: Option<Activation>,
    /// Folds the norm before it (`MatmulNorm`).
    pub norm: bool,
    /// The tiled GEMM (tiles of `per` rows × `tokens` tokens) rather than either family's
    /// kernel.
    pub gemm: bool,
    /// On 8-bit activations staged this many chunks at a time: lane teams a slice of the row
    /// (see [`q8_slice`]), the GEMM its chunks between barriers (see [`gemm_q8`]); 0: float
    /// activations.
    pub q8: u32,
}

impl Shape {
    /// Rows one workgroup covers.
    pub fn rows_per_group(&self) -> u32 {
        let halved = if self.glu.is_some() { 2 } else { 1 };
        if self.gemm {
            return self.per / halved;
        }
        if self.blocked {
            // With GLU half the block's rows are the up rows.
            self.wg * self.per / halved
        } else {
            self.wg / self.per
        }
    }

    /// The variant for `tokens`-token blocks of a `n_rows` × `n_in` part when steps of up to
    /// `step_tokens` tokens run it.
    pub fn choose(caps: &crate::Caps, limits: &wgpu::Limits, n_in: u32, n_rows: u32, tokens: u32, step_tokens: u32) -> Shape {
        let tiles = step_tokens.div_ceil(tokens).max(1) as u64;
        let most = limits.max_compute_invocations_per_workgroup.min(limits.max_compute_workgroup_size_x);
        let groups = |s: &Shape| (n_rows as u64).div_ceil(s.rows_per_group() as u64) * tiles;
        let (wgs, per, blocked, min): (&[u32], u32, bool, u64) =
            if caps.cpu_like { (&CPU_WGS, blocked_rows(tokens), true, CPU_MIN_GROUPS) } else { (&GPU_WGS, 0, false, caps.tune.min_groups) };
        let mut pick = None;
        for &wg in wgs.iter().filter(|&&wg| wg <= most && (blocked || wg <= caps.tune.max_wg)) {
            let per = match (blocked, caps.tune.lanes) {
                (true, _) => per,
                (false, Some(lanes)) => lanes.min(wg),
                (false, None) => lanes_per_row(n_in / CHUNK, wg),
            };
            let s = Shape { blocked, tokens, wg, per, ids: false, glu: None, norm: false, gemm: false, q8: 0 };
            pick = Some(s);
            if groups(&s) >= min {
                break;
            }
        }
        pick.unwrap_or(Shape { blocked, tokens, wg: 1, per: if blocked { per } else { 1 }, ids: false, glu: None, norm: false, gemm: false, q8: 0 })
    }

    /// The tiled GEMM's shape for tiles `side` lanes wide and `rows` weight rows a lane (see
    /// [`GEMM_SIDES`], [`GEMM_ROWS`]): `rows · side` rows × `4 · side` tokens.
    pub fn gemm(side: u32, rows: u32, glu: Option<Activation>, norm: bool) -> Shape {
        Shape { blocked: false, tokens: 4 * side, wg: side * side, per: rows * side, ids: false, glu, norm, gemm: true, q8: 0 }
    }
}

/// Whether a matmul described by `d` takes the tiled GEMM for steps past the largest token
/// block on an adapter with `caps` and `limits`: on GPUs, outside the exact mode (its sums'
/// order differs from the other kernels', so a token's bits would depend on its step), for
/// plain matrices (not by expert), where the adapter grants its workgroup.
pub fn takes_gemm(caps: &crate::Caps, limits: &wgpu::Limits, d: &MatmulDesc) -> bool {
    !d.exact
        && !caps.cpu_like
        && caps.tune.gemm_min_groups.is_some()
        && d.ids.is_none()
        && d.max_tokens > TOKEN_BLOCKS[TOKEN_BLOCKS.len() - 1]
        && limits.max_compute_workgroup_storage_size >= gemm_shared_bytes(caps.tune.gemm_side, GEMM_ROWS[0], GemmIn::F32, false)
        && limits.max_compute_invocations_per_workgroup.min(limits.max_compute_workgroup_size_x) >= caps.tune.gemm_side * caps.tune.gemm_side
}

/// The GEMM tiles built, largest first, as (side, rows a lane): the tall tile (`rows` > 4) at
/// the largest side when `largest` is [`GEMM_SIDES`]' largest, then every side up to `largest`
/// with 4 rows a lane.
pub fn gemm_tiles(largest: u32, rows: u32) -> Vec<(u32, u32)> {
    let tall = (rows > GEMM_ROWS[0] && largest == GEMM_SIDES[0]).then_some((largest, rows));
    tall.into_iter().chain(GEMM_SIDES.into_iter().filter(|&side| side <= largest).map(|side| (side, GEMM_ROWS[0]))).collect()
}

/// Whether the tiled GEMM stages its tiles and sums each chunk in f16 on an adapter with
/// `caps` (`shaders/matmul_tiled.wgsl`'s F16): where the adapter has shader-f16 and
/// `FLINT_TUNE` asks for it (`gemm_in=f16`). Off by default until a GPU's figures say it pays.
pub fn gemm_f16(caps: &crate::Caps) -> bool {
    caps.shader_f16 && caps.tune.gemm_in == GemmIn::F16
}

/// What a GEMM variant of `shape` stages and multiplies on an adapter with `caps`: 8-bit
/// integers where its shape says so ([`gemm_q8`]), else f16 where [`gemm_f16`], else f32.
fn gemm_input(caps: &crate::Caps, shape: &Shape) -> GemmIn {
    if shape.q8 > 0 {
        GemmIn::Q8
    } else if gemm_f16(caps) {
        GemmIn::F16
    } else {
        GemmIn::F32
    }
}

/// Workgroup memory of the tiled GEMM with tiles `side` lanes wide and `rows` weight rows a
/// lane, staged as `input`: a 32-element chunk of the tile's rows and of its tokens (f32 or
/// f16), or [`gemm_q8_chunks`] chunks of 8-bit weight rows and tokens with their scales (rows:
/// d of either half and m; tokens: scale and sum); with the folded norm, where the tiles cannot
/// hold them, the lanes' sums of squares (and in f16 the tokens' scales).
pub fn gemm_shared_bytes(side: u32, rows: u32, input: GemmIn, norm: bool) -> u32 {
    let (wg, bm, bn) = (side * side, rows * side, 4 * side);
    match input {
        GemmIn::F32 => 8 * (bm + bn) * 16,
        GemmIn::F16 => 8 * (bm + bn) * 8 + if norm { (wg + bn) * 4 } else { 0 },
        GemmIn::Q8 => gemm_q8_chunks(side, rows) * (bm * (CHUNK + 12) + bn * (CHUNK + 8)) + if norm { wg * 4 } else { 0 },
    }
}

/// Chunks the 8-bit GEMM stages between barriers: one (row, chunk) per lane, and one (token,
/// chunk) per lane of the first `4 · side` times as many (4 for 64 × 64 tiles, 2 for 32 × 32
/// and 128 × 64).
pub fn gemm_q8_chunks(side: u32, rows: u32) -> u32 {
    side / rows
}

/// The chunks a stage of the tiled GEMM with tiles `side` lanes wide holds when it multiplies
/// 8-bit integers (`shaders/matmul_tiled.wgsl`'s Q8_CHUNKS, `FLINT_TUNE` `gemm_in=q8`), or 0 to
/// keep float tiles: on GPUs, for plain matrices of [`Q8_FORMATS`], where the adapter grants
/// the workgroup memory. (The exact mode builds no GEMM.)
pub fn gemm_q8(caps: &crate::Caps, limits: &wgpu::Limits, d: &MatmulDesc, side: u32, rows: u32) -> u32 {
    let fits = limits.max_compute_workgroup_storage_size >= gemm_shared_bytes(side, rows, GemmIn::Q8, d.norm.is_some());
    if caps.tune.gemm_in == GemmIn::Q8 && !caps.cpu_like && d.ids.is_none() && Q8_FORMATS.contains(&d.ty) && fits {
        gemm_q8_chunks(side, rows)
    } else {
        0
    }
}

/// Formats with integer weight chunks (`shaders/dequant_q8.wgsl`) for the 8-bit-activation
/// kernels: the legacy and K-quant formats whose quants fit a signed byte with one scale per
/// 16 or 32 elements and one offset per chunk.
pub const Q8_FORMATS: [QuantType; 8] =
    [QuantType::Q4_0, QuantType::Q4_1, QuantType::Q5_0, QuantType::Q5_1, QuantType::Q8_0, QuantType::Q4K, QuantType::Q5K, QuantType::Q6K];

/// Workgroup memory the 8-bit activations' kernels aim to stage a slice in: a slice of 32
/// chunks of 16 tokens (20 KB), or 608 chunks of one (Qwen2.5-7B's longest row, 18944
/// elements, in one slice). With the teams' sums it stays under NVIDIA's 48 KB, and leaves
/// room for several workgroups an SM.
const Q8_STAGE_BYTES: u64 = 24 << 10;
/// Bytes a staged chunk takes per token: 32 bytes of quants, its scale and its sum.
const Q8_CHUNK_BYTES: u64 = 32 + 8;

/// Workgroup memory of a lane-team variant besides the staged activations: the teams' partial
/// sums (without subgroup reduction) or the folded norm's sums (with it).
fn lane_team_sums_bytes(caps: &crate::Caps, shape: &Shape) -> u64 {
    let sums = match (subgroup_reduce(caps, shape.per), shape.norm) {
        (false, _) => shape.wg,
        (true, true) => NORM_LANES,
        (true, false) => 0,
    };
    shape.tokens as u64 * sums as u64 * 4
}

/// The chunks a slice of lane-team variant `shape` of the matmul `d` stages when it runs on
/// 8-bit activations (`shaders/matmul.wgsl`'s Q8_SLICE, `FLINT_TUNE` `q8_act=on`), or None to
/// keep f32: on GPUs, outside the exact mode (the activations' rounding is about 1e-5 of
/// NMSE), for plain matrices of [`Q8_FORMATS`]. As many whole 32-chunk groups as
/// [`Q8_STAGE_BYTES`] (and the adapter's workgroup memory) hold, at most the row's: so a lane
/// takes its chunks in the same order whatever the slice, and every token block of a matrix
/// sums a token's products alike (batch invariance up to the largest block).
pub fn q8_slice(caps: &crate::Caps, limits: &wgpu::Limits, d: &MatmulDesc, shape: &Shape) -> Option<u32> {
    if !caps.tune.q8_act || caps.cpu_like || d.exact || shape.blocked || shape.gemm || d.ids.is_some() || !Q8_FORMATS.contains(&d.ty) {
        return None;
    }
    let room = (limits.max_compute_workgroup_storage_size as u64).saturating_sub(lane_team_sums_bytes(caps, shape)).min(Q8_STAGE_BYTES);
    let groups = room / (shape.tokens as u64 * Q8_CHUNK_BYTES * 32);
    let row_groups = (d.n_in / CHUNK).div_ceil(32) as u64;
    (groups > 0).then(|| (groups.min(row_groups) * 32) as u32)
}

/// Whether matmuls outside the exact mode on an adapter with `caps` may take 8-bit
/// activations: on GPUs, where `FLINT_TUNE` asks for them, in the mat-vec kernels
/// (`q8_act=on`, [`q8_slice`]) or the GEMM (`gemm_in=q8`, [`gemm_q8`]).
pub fn q8_activations(caps: &crate::Caps) -> bool {
    (caps.tune.q8_act || caps.tune.gemm_in == GemmIn::Q8) && !caps.cpu_like
}

/// Lanes per row for rows of `chunks` chunks: the fewest idle lane-slots (lanes × rounds),
/// the widest team on a tie. 20 chunks (n_in 640) take 8 lanes, 64 take 32.
pub fn lanes_per_row(chunks: u32, wg: u32) -> u32 {
    let cost = |l: u32| l * chunks.div_ceil(l);
    let mut best = LANES_PER_ROW[0].min(wg);
    for l in LANES_PER_ROW.into_iter().filter(|&l| l <= wg) {
        if cost(l) <= cost(best) {
            best = l;
        }
    }
    best
}

/// The body of `shaders/matmul_blocked.wgsl` for `rows` × `tokens` blocks (multiples of 4):
/// every per-row, per-token and per-quad statement written out, so that the accumulators and
/// dequantized chunks are indexed by constants only. With `glu` the first half of the rows
/// are gate rows and the second half their up rows (rows a multiple of 8).
pub fn blocked_code(rows: u32, tokens: u32, glu: bool) -> String {
    use std::fmt::Write;
    let (rq, tq) = (rows / 4, tokens.div_ceil(4));
    // One token: vec4 accumulators (4 rows) and activation quads; else 4 × 4 matrices.
    let acc_ty = if tokens == 1 { "vec4<f32>" } else { "mat4x4<f32>" };
    let mut s = String::from("struct Block {\n");
    for i in 0..rq {
        for j in 0..tq {
            let _ = writeln!(s, "    a{i}_{j}: {acc_ty},");
        }
    }
    s.push_str("}\n\nfn block(r0: u32, t0: u32) {\n");
    let half = rows / 2;
    for i in 0..rows {
        let _ = match glu && i >= half {
            true => writeln!(s, "    let b{i} = up_base(r0, {}u);", i - half),
            false => writeln!(s, "    let b{i} = row_base(r0, {i}u);"),
        };
    }
    for i in 0..tokens {
        let _ = writeln!(s, "    let x{i} = x_base(t0, {i}u);");
    }
    // Token quads past the step's end are skipped (a uniform branch): a short step computes
    // only the quads it fills, and the live ones exactly as in a full block.
    s.push_str("    let live = n_tok() - t0;\n");
    for j in 1..tq {
        let _ = writeln!(s, "    let on{j} = live > {}u;", 4 * j);
    }
    s.push_str("    var acc: Block;\n    for (var c = 0u; c < p.n_in / CHUNK; c++) {\n");
    for i in 0..rows {
        let _ = writeln!(s, "        let q{i} = dequant_chunk(b{i}, c);");
    }
    for k in 0..8 {
        let _ = writeln!(s, "        {{\n            let xo = c * 8u + {k}u;");
        for i in 0..rq {
            let q = |r: u32| format!("q{}[{k}]", 4 * i + r);
            let _ = writeln!(s, "            let w{i} = quad_rows({}, {}, {}, {});", q(0), q(1), q(2), q(3));
        }
        for j in 0..tq {
            let (open, close) = if j > 0 { (format!("            if (on{j}) {{\n"), "            }\n") } else { (String::new(), "") };
            s.push_str(&open);
            if tokens == 1 {
                let _ = writeln!(s, "            let u{j} = x[x0 + xo];");
            } else {
                let t = |r: u32| format!("x{}", 4 * j + r);
                let _ = writeln!(s, "            let u{j} = quad_tokens({}, {}, {}, {}, xo);", t(0), t(1), t(2), t(3));
            }
            for i in 0..rq {
                let _ = writeln!(s, "            acc.a{i}_{j} += w{i} * u{j};");
            }
            s.push_str(close);
        }
        s.push_str("        }\n");
    }
    s.push_str("    }\n");
    // With GLU gate quad i pairs with up quad i + rq / 2.
    let out_quads = if glu { rq / 2 } else { rq };
    for i in 0..out_quads {
        for j in 0..tq {
            let v = match (glu, tokens == 1) {
                (false, _) => format!("acc.a{i}_{j}"),
                (true, true) => format!("glu4(acc.a{i}_{j}, acc.a{}_{j})", i + out_quads),
                (true, false) => format!("glu44(acc.a{i}_{j}, acc.a{}_{j})", i + out_quads),
            };
            if tokens == 1 {
                let _ = writeln!(s, "    store_rows({v}, r0 + {}u, t0);", 4 * i);
            } else {
                let _ = writeln!(s, "    store({v}, r0 + {}u, t0 + {}u);", 4 * i, 4 * j);
            }
        }
    }
    s.push_str("}\n");
    s
}

/// Whether matmuls on an adapter with `caps` fold the RMSNorm before them (`MatmulNorm`). On
/// GPUs the fold saves a dispatch and a pass over the activations for a few cached loads per
/// workgroup. On CPU-type adapters, where every load is issued lane by lane, the extra loads
/// (the norm weight and the squares' pass over x) cost more than the dispatch: on lavapipe a
/// folded Q5_0 896 → 1152 one-token matmul took 0.67 ms against 0.43 plain, and 16.0 against
/// 9.8 ms for 128 tokens (`matmul_speed`), where the norm kernel it replaces takes about 0.1.
pub fn folds_norms(caps: &crate::Caps) -> bool {
    !caps.cpu_like
}

/// Whether a team of `tpr` lanes sums with subgroup shuffles on an adapter with `caps`.
fn subgroup_reduce(caps: &crate::Caps, tpr: u32) -> bool {
    caps.subgroups && !caps.cpu_like && tpr > 1 && tpr <= caps.subgroup_min_size
}

/// Rows per invocation of the CPU-adapter kernel for `tokens`-token blocks.
fn blocked_rows(tokens: u32) -> u32 {
    match tokens {
        1 => DECODE_ROWS,
        t if t < 16 => SMALL_STEP_ROWS,
        _ => BLOCK_ROWS,
    }
}

/// The shader variant of `shape` for `ty`; `wrong`: the test-only wrong variant of the gated
/// activation (see `GpuContext::wrong_kernel`, which names it `glu`).
/// Bias, accumulation and split outputs are run-time flags (`Params::flags`), so they need no
/// variant.
fn key(caps: &crate::Caps, ty: QuantType, shape: Shape, wrong: bool) -> PipelineKey {
    let glu = |d: ShaderDefs| {
        let on = shape.glu.is_some();
        d.flag("GLU", on).flag("GELU_TANH", shape.glu == Some(Activation::GeluTanh)).flag("WRONG", on && wrong)
    };
    if shape.gemm {
        let side = shape.tokens / 4;
        let defs = ShaderDefs::new().quant(ty).u32("SIDE", side).u32("TM", shape.per / side).flag("NORM", shape.norm);
        let defs = match gemm_input(caps, &shape) {
            GemmIn::Q8 => defs.u32("Q8_CHUNKS", shape.q8),
            input => defs.flag("F16", input == GemmIn::F16),
        };
        return PipelineKey::new("matmul_tiled.wgsl", "main", glu(defs));
    }
    if shape.blocked {
        let defs = ShaderDefs::new()
            .quant(ty)
            .u32("WG", shape.wg)
            .u32("RB", shape.per)
            .u32("TB", shape.tokens)
            .code("BLOCK_CODE", blocked_code(shape.per, shape.tokens, shape.glu.is_some()))
            .flag("ONE_TOKEN", shape.tokens == 1)
            .flag("IDS", shape.ids);
        return PipelineKey::new("matmul_blocked.wgsl", "main", glu(defs));
    }
    let defs = ShaderDefs::new()
        .quant(ty)
        .u32("WG", shape.wg)
        .u32("TPR", shape.per)
        .u32("TOK", shape.tokens)
        .flag("TILE", shape.tokens > 1)
        .flag("SUBGROUP_REDUCE", subgroup_reduce(caps, shape.per))
        .flag("IDS", shape.ids)
        .flag("NORM", shape.norm);
    let defs = if shape.q8 > 0 { defs.u32("Q8_SLICE", shape.q8) } else { defs };
    PipelineKey::new(SHADER, "main", glu(defs))
}

/// Every variant the engine may build on an adapter with `caps` (both families, plain and by
/// expert, so the naga test covers the GPU kernels on any machine).
pub fn variants(caps: &crate::Caps) -> Vec<PipelineKey> {
    let mut v = Vec::new();
    // Plain, by expert, and (plain matrices only) ending in either activation, with the norm
    // folded or not.
    let mut kinds = vec![(true, None, false)];
    for glu in [None, Some(Activation::Silu), Some(Activation::GeluTanh)] {
        kinds.extend([(false, glu, false), (false, glu, true)]);
    }
    for ty in QuantType::ALL {
        for tokens in TOKEN_BLOCKS {
            for &(ids, glu, norm) in &kinds {
                for wg in GPU_WGS {
                    for tpr in LANES_PER_ROW.into_iter().filter(|&t| t <= wg) {
                        let s = Shape { blocked: false, tokens, wg, per: tpr, ids, glu, norm, gemm: false, q8: 0 };
                        v.push(key(&crate::Caps { cpu_like: false, ..*caps }, ty, s, false));
                    }
                }
                // CPU adapters do not fold norms (see `folds_norms`).
                for wg in CPU_WGS.into_iter().filter(|_| !norm) {
                    v.push(key(caps, ty, Shape { blocked: true, tokens, wg, per: blocked_rows(tokens), ids, glu, norm, gemm: false, q8: 0 }, false));
                }
            }
        }
        // The GEMM in f32, where the adapter has shader-f16 in f16, and on 8-bit integers.
        let half = crate::Caps { tune: crate::tune::Tuning { gemm_in: GemmIn::F16, ..caps.tune }, ..*caps };
        for &(_, glu, norm) in kinds.iter().filter(|k| !k.0) {
            for (side, rows) in gemm_tiles(GEMM_SIDES[0], GEMM_ROWS[1]) {
                v.push(key(caps, ty, Shape::gemm(side, rows, glu, norm), false));
                v.push(key(&half, ty, Shape::gemm(side, rows, glu, norm), false));
                if Q8_FORMATS.contains(&ty) {
                    v.push(key(caps, ty, Shape { q8: gemm_q8_chunks(side, rows), ..Shape::gemm(side, rows, glu, norm) }, false));
                }
            }
        }
        // On 8-bit activations (slices of 32 chunks), with and without subgroup reduction
        // where the adapter has it: the shortest and longest token blocks, plain and gated,
        // with the norm folded or not (the 4- and 8-token blocks differ only in constants).
        if Q8_FORMATS.contains(&ty) {
            let q8_kinds = [(None, false), (Some(Activation::Silu), false), (None, true), (Some(Activation::GeluTanh), true)];
            for tokens in [TOKEN_BLOCKS[0], TOKEN_BLOCKS[TOKEN_BLOCKS.len() - 1]] {
                for (glu, norm) in q8_kinds {
                    for (wg, tpr) in [(256, 32), (64, 8)] {
                        let s = Shape { blocked: false, tokens, wg, per: tpr, ids: false, glu, norm, gemm: false, q8: 32 };
                        v.push(key(&crate::Caps { cpu_like: false, ..*caps }, ty, s, false));
                    }
                }
            }
        }
    }
    v.sort_by_key(|k| k.label());
    v.dedup();
    v
}

struct Kernel {
    pipeline: Arc<wgpu::ComputePipeline>,
    bind: wgpu::BindGroup,
}

/// One token block's kernel: its shape and parameters, built on the first step that runs it.
struct Variant {
    shape: Shape,
    key: PipelineKey,
    params: wgpu::Buffer,
    /// The folded grid of row groups.
    groups: (u32, u32),
    /// Row groups (workgroups per token tile).
    row_groups: u32,
    kernel: std::cell::OnceCell<Kernel>,
    /// A step has recorded it (before that, a driver may still compile it on first use).
    dispatched: std::cell::Cell<bool>,
}

/// One weight part's matmul; `encode` only records dispatches (building a variant's
/// pipeline and bind group the first time a step needs it, once).
pub struct Matmul {
    /// One variant per token block, in [`TOKEN_BLOCKS`] order (up to the largest step).
    variants: Vec<Variant>,
    /// w, x, y, the bias (a small unused buffer when there is none), the info uniform, then
    /// the expert counts and lists (by expert) or the split outputs (unused buffers when not
    /// split) and the folded norm's weight (when folded).
    buffers: Vec<wgpu::Buffer>,
    /// Experts of the part (grid z walks them); 0 for a plain matrix.
    n_expert: u32,
    /// The adapter's shape knobs, which [`Matmul::pick`] reads at each step.
    tune: crate::tune::Tuning,
    device: wgpu::Device,
    cache: PipelineCache,
    label: String,
}

fn unsupported(message: String) -> GpuError {
    GpuError::Unsupported { op: OP, message }
}

/// Checks that `buf` holds `need` bytes and can be bound whole.
fn check_buffer(ctx: &GpuContext, what: &'static str, buf: &wgpu::Buffer, need: u64) -> Result<()> {
    if buf.size() < need {
        return Err(GpuError::Limit { what, need, limit: buf.size() });
    }
    let limit = ctx.limits.max_storage_buffer_binding_size;
    if buf.size() > limit {
        return Err(GpuError::Limit { what: "storage binding size", need: buf.size(), limit });
    }
    Ok(())
}

impl Matmul {
    /// `info`: the `BatchInfo` uniform whose `n_tok` the step's kernels read (the batch's, or
    /// the head's output rows).
    #[allow(clippy::too_many_arguments)]
    pub async fn new(
        ctx: &GpuContext,
        cache: &PipelineCache,
        info: &wgpu::Buffer,
        desc: &MatmulDesc<'_>,
        w: &wgpu::Buffer,
        x: &wgpu::Buffer,
        y: &wgpu::Buffer,
        bias: Option<&wgpu::Buffer>,
    ) -> Result<Matmul> {
        let d = desc;
        let block = d.ty.block_elems() as u32;
        if d.n_in == 0 || !d.n_in.is_multiple_of(CHUNK) || !d.n_in.is_multiple_of(block) {
            return Err(unsupported(format!("{}: n_in {} of {} is not a multiple of {}", d.label, d.n_in, d.ty, CHUNK.max(block))));
        }
        // Rows of the split's further outputs; the rest are y's.
        let rest = match d.output {
            Output::Split(rest) => rest,
            _ => &[],
        };
        let rest_rows = rest.iter().map(|o| o.rows as u64).sum::<u64>();
        if rest.len() > MAX_SPLIT_OUTS || rest_rows >= d.n_rows as u64 || rest.iter().any(|o| o.rows == 0 || o.rows > o.y_stride) {
            return Err(unsupported(format!("{}: a split of {} rows into y and {:?}", d.label, d.n_rows, rest)));
        }
        let y_cols = d.n_rows as u64 - rest_rows;
        if d.n_rows == 0 || d.row_offset as u64 + y_cols > d.y_stride as u64 {
            return Err(unsupported(format!("{}: rows {}..{} do not fit y_stride {}", d.label, d.row_offset, d.row_offset as u64 + y_cols, d.y_stride)));
        }
        if d.max_tokens == 0 {
            return Err(unsupported(format!("{}: max_tokens is 0", d.label)));
        }
        let row_bytes = crate::weights::layout::row_bytes(d.ty, d.n_in as u64).unwrap_or(u64::MAX);
        let tokens = d.max_tokens as u64;
        let n_expert = d.ids.map_or(1, |i| i.n_expert as u64);
        // GLU's weights hold the up rows after the gate rows.
        let stacked = if matches!(d.output, Output::Glu(_)) { 2 } else { 1 };
        let fused = !matches!(d.output, Output::Rows);
        if (fused || d.norm.is_some()) && d.ids.is_some() {
            return Err(unsupported(format!("{}: a fused output takes a plain matrix, not experts", d.label)));
        }
        if matches!(d.output, Output::Glu(_)) && (bias.is_some() || d.accumulate) {
            return Err(unsupported(format!("{}: the gated activation takes no bias or accumulation", d.label)));
        }
        let w_bytes = row_bytes.saturating_mul(d.n_rows as u64).saturating_mul(n_expert).saturating_mul(stacked);
        if w_bytes > u32::MAX as u64 {
            // The shader addresses weight bytes with u32.
            return Err(GpuError::Limit { what: "matmul weight part bytes", need: w_bytes, limit: u32::MAX as u64 });
        }
        check_buffer(ctx, "matmul weight bytes", w, w_bytes)?;
        // Rows of x and y: the tokens, or (by expert) the entries and their x rows.
        let (x_rows, y_rows) = match d.ids {
            None => (tokens, tokens),
            Some(i) => {
                if i.n_expert == 0 || i.n_used == 0 || (i.x_div != 1 && i.x_div != i.n_used) {
                    return Err(unsupported(format!("{}: {} experts, {} used, x_div {}", d.label, i.n_expert, i.n_used, i.x_div)));
                }
                let entries = tokens * i.n_used as u64;
                let experts = (i.expert_offset + i.n_expert) as u64;
                check_buffer(ctx, "matmul expert counts", i.count, experts * 4)?;
                check_buffer(ctx, "matmul expert lists", i.rows, experts * tokens * 4)?;
                (entries / i.x_div as u64, entries)
            }
        };
        check_buffer(ctx, "matmul x bytes", x, x_rows * d.n_in as u64 * 4)?;
        let y_need = ((y_rows - 1) * d.y_stride as u64 + d.row_offset as u64 + y_cols) * 4;
        check_buffer(ctx, "matmul y bytes", y, y_need)?;
        for o in rest {
            check_buffer(ctx, "matmul split output bytes", o.y, ((tokens - 1) * o.y_stride as u64 + o.rows as u64) * 4)?;
        }
        if let Some(b) = bias {
            check_buffer(ctx, "matmul bias bytes", b, d.n_rows as u64 * 4)?;
        }
        if let Some(n) = d.norm {
            check_buffer(ctx, "matmul norm weight bytes", n.w, d.n_in as u64 * 4)?;
        }
        // The token blocks built: on GPUs up to the tuning's `max_block` (larger steps take its
        // tiles, or the GEMM past the largest block of all).
        let blocks: Vec<u32> = TOKEN_BLOCKS.into_iter().filter(|&b| ctx.caps.cpu_like || b <= ctx.caps.tune.max_block).collect();
        let largest = *blocks.last().expect("the one-token block");
        // Grid z: token tiles (of every expert), at most one-token tiles of each.
        let z_most = if d.ids.is_some() { n_expert * tokens } else { tokens.div_ceil(largest as u64) };
        if z_most > crate::ops::MAX_GROUPS_X as u64 {
            return Err(GpuError::Limit { what: "matmul token tiles", need: tokens, limit: crate::ops::MAX_GROUPS_X as u64 * largest as u64 });
        }
        let mut variants = Vec::new();
        let gemm = takes_gemm(&ctx.caps, &ctx.limits, d);
        let glu = match d.output {
            Output::Glu(act) => Some(act),
            _ => None,
        };
        let mut shapes = Vec::new();
        for (i, &tb) in blocks.iter().enumerate() {
            // Steps up to this block's size (or any size for the largest) take this kernel.
            let prev = if i == 0 { 0 } else { blocks[i - 1] };
            if prev >= d.max_tokens {
                break;
            }
            let step_tokens = if i + 1 == blocks.len() { d.max_tokens } else { tb.min(d.max_tokens) };
            shapes.push(Shape {
                ids: d.ids.is_some(),
                glu,
                norm: d.norm.is_some(),
                ..Shape::choose(&ctx.caps, &ctx.limits, d.n_in, d.n_rows, tb, step_tokens)
            });
        }
        // Every token block on 8-bit activations or none, so that a token's result does not
        // depend on its step.
        let slices: Vec<Option<u32>> = shapes.iter().map(|s| q8_slice(&ctx.caps, &ctx.limits, d, s)).collect();
        if slices.iter().all(Option::is_some) {
            for (s, slice) in shapes.iter_mut().zip(slices) {
                s.q8 = slice.unwrap_or(0);
            }
        }
        if gemm {
            let norm = d.norm.is_some();
            for (side, rows) in gemm_tiles(ctx.caps.tune.gemm_side, ctx.caps.tune.gemm_rows) {
                let shape = Shape { q8: gemm_q8(&ctx.caps, &ctx.limits, d, side, rows), ..Shape::gemm(side, rows, glu, norm) };
                // The base tiles fit (`takes_gemm`); the tall one only where the adapter grants it.
                if ctx.limits.max_compute_workgroup_storage_size >= gemm_shared_bytes(side, rows, gemm_input(&ctx.caps, &shape), norm) {
                    shapes.push(shape);
                }
            }
        }
        for shape in shapes {
            if shape.norm && !shape.gemm && (shape.blocked || shape.wg < NORM_LANES) {
                return Err(unsupported(format!("{}: a folded norm needs lane-team workgroups of {NORM_LANES} invocations", d.label)));
            }
            let row_groups = d.n_rows.div_ceil(shape.rows_per_group());
            let groups = fold_groups(row_groups);
            let p = Params {
                n_in: d.n_in,
                n_rows: d.n_rows,
                row_offset: d.row_offset,
                y_stride: d.y_stride,
                groups_x: groups.0,
                row_bytes: row_bytes as u32,
                flags: if bias.is_some() { FLAG_BIAS } else { 0 }
                    | if d.accumulate { FLAG_ACCUMULATE } else { 0 }
                    | if rest.is_empty() { 0 } else { FLAG_SPLIT },
                expert_offset: d.ids.map_or(0, |i| i.expert_offset),
                n_entries: d.max_tokens,
                x_div: d.ids.map_or(1, |i| i.x_div),
                up_bytes: if stacked == 2 { (row_bytes * d.n_rows as u64) as u32 } else { 0 },
                // Rows past the last output's end never occur, so an absent y2 starts at n_rows.
                seg1: y_cols as u32,
                seg2: (y_cols + rest.first().map_or(0, |o| o.rows as u64)).min(d.n_rows as u64) as u32,
                stride1: rest.first().map_or(0, |o| o.y_stride),
                stride2: rest.get(1).map_or(0, |o| o.y_stride),
                eps: d.norm.map_or(0.0, |n| n.eps),
            };
            let params = params(ctx, &format!("{}.params", d.label), &p);
            let key = key(&ctx.caps, d.ty, shape, ctx.wrong("glu"));
            variants.push(Variant { shape, key, params, groups, row_groups, kernel: std::cell::OnceCell::new(), dispatched: std::cell::Cell::new(false) });
        }
        let mut buffers = vec![w.clone(), x.clone(), y.clone()];
        buffers.push(match bias {
            Some(b) => b.clone(),
            None => crate::buffer::storage(ctx, &format!("{}.no_bias", d.label), 16)?,
        });
        buffers.push(info.clone());
        match d.ids {
            Some(i) => buffers.extend([i.count.clone(), i.rows.clone()]),
            // The split outputs, or small unused buffers.
            None => {
                for k in 0..MAX_SPLIT_OUTS {
                    buffers.push(match rest.get(k) {
                        Some(o) => o.y.clone(),
                        None => crate::buffer::storage(ctx, &format!("{}.no_y{}", d.label, k + 1), 16)?,
                    });
                }
                if let Some(n) = d.norm {
                    buffers.push(n.w.clone());
                }
            }
        }
        let n_expert = d.ids.map_or(0, |i| i.n_expert);
        let tune = ctx.caps.tune;
        let mm = Matmul { variants, buffers, n_expert, tune, device: ctx.device.clone(), cache: cache.clone(), label: d.label.to_string() };
        // The one-token kernel is built now, so a malformed op fails here rather than mid-step.
        let first = &mm.variants[0];
        let scope = ctx.device.push_error_scope(wgpu::ErrorFilter::Validation);
        let pipeline = cache.get(ctx, &first.key).await?;
        let bind = mm.bind(first, &pipeline);
        if let Some(e) = scope.pop().await {
            return Err(GpuError::Shader { shader: format!("{}:{}", d.label, first.key.label()), message: e.to_string() });
        }
        let _ = first.kernel.set(Kernel { pipeline, bind });
        Ok(mm)
    }

    /// Bindings as `shaders/matmul_io.wgsl` numbers them: 0 params, 1 w, 2 x, 3 y, 4 bias,
    /// 5 the batch (where the variant reads it), 6 and 7 the expert lists or the split outputs,
    /// 8 the folded norm's weight.
    fn bind(&self, v: &Variant, pipeline: &wgpu::ComputePipeline) -> wgpu::BindGroup {
        let mut bufs: Vec<(u32, &wgpu::Buffer)> =
            vec![(0, &v.params), (1, &self.buffers[0]), (2, &self.buffers[1]), (3, &self.buffers[2]), (4, &self.buffers[3])];
        if v.shape.tokens > 1 || v.shape.ids {
            bufs.push((5, &self.buffers[4]));
        }
        bufs.extend(self.buffers[5..].iter().enumerate().map(|(i, b)| (6 + i as u32, b)));
        let label = format!("{}:{}", self.label, v.key.label());
        let layout = pipeline.get_bind_group_layout(0);
        let entries: Vec<wgpu::BindGroupEntry> = bufs.iter().map(|&(i, b)| wgpu::BindGroupEntry { binding: i, resource: b.as_entire_binding() }).collect();
        self.device.create_bind_group(&wgpu::BindGroupDescriptor { label: Some(&label), layout: &layout, entries: &entries })
    }

    /// The variant a step of `n_tok` tokens takes: past the largest token block, a GEMM tile
    /// where one spreads wide enough (see [`GEMM_MIN_GROUPS`], tuned by `min_groups` and
    /// `gemm_min_groups`); else the smallest token block that holds the step, or tiles of the
    /// largest.
    fn pick(&self, n_tok: u32) -> &Variant {
        if n_tok > TOKEN_BLOCKS[TOKEN_BLOCKS.len() - 1] {
            let grid = |v: &Variant| v.row_groups as u64 * n_tok.div_ceil(v.shape.tokens) as u64;
            let mut smallest = None;
            for v in self.variants.iter().filter(|v| v.shape.gemm) {
                if grid(v) >= self.tune.min_groups {
                    return v;
                }
                smallest = Some(v);
            }
            if let Some(v) = smallest.filter(|v| self.tune.gemm_min_groups.is_some_and(|min| grid(v) >= min)) {
                return v;
            }
        }
        let mut blocks = self.variants.iter().filter(|v| !v.shape.gemm);
        let last = blocks.clone().last().expect("a token block");
        blocks.find(|v| v.shape.tokens >= n_tok).unwrap_or(last)
    }

    /// The variant's kernel, built now if this is its first step. A compile error shows as
    /// the step's validation error.
    fn kernel<'a>(&self, v: &'a Variant) -> Option<&'a Kernel> {
        if v.kernel.get().is_none() {
            let pipeline = self.cache.get_now(&self.device, &v.key).ok()?;
            let bind = self.bind(v, &pipeline);
            let _ = v.kernel.set(Kernel { pipeline, bind });
        }
        v.kernel.get()
    }

    /// The kernel key a step of `n_tok` tokens would build on first use, if it is not built.
    pub fn unbuilt(&self, n_tok: u32) -> Option<PipelineKey> {
        let v = self.pick(n_tok.max(1));
        v.kernel.get().is_none().then(|| v.key.clone())
    }

    /// The variant a step of `n_tok` tokens runs (tests and profiles).
    pub fn shape(&self, n_tok: u32) -> Shape {
        self.pick(n_tok).shape
    }

    /// Records the dispatch for `n_tok` tokens (the info uniform must say the same).
    pub fn encode(&self, pass: &mut wgpu::ComputePass<'_>, n_tok: u32) {
        if n_tok == 0 {
            return;
        }
        let v = self.pick(n_tok);
        let Some(kernel) = self.kernel(v) else { return };
        if !v.dispatched.replace(true) {
            self.cache.mark_first_use();
        }
        pass.set_pipeline(&kernel.pipeline);
        pass.set_bind_group(0, &kernel.bind, &[]);
        crate::ops::dispatch(pass, v.groups.0, v.groups.1, n_tok.div_ceil(v.shape.tokens) * self.n_expert.max(1));
    }
}

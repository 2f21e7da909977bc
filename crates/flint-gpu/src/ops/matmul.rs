//! Quantized matmul over one weight part: `y[t, row_offset + r] = Σ_i W[r, i]·x[t, i]`
//! (+ bias[r]) (+ the old y), weights dequantized in the shader (`shaders/matmul.wgsl`).
//!
//! Two kernels: the vector kernel (one token; reads each weight byte once) for decode and the
//! logits row, and for prefill the token-tile kernel (TILE_TOKENS tokens per workgroup, each
//! dequantized weight reused across the tile). On GPUs both are `shaders/matmul.wgsl`, a team
//! of lanes per row; on CPU-type adapters, where loads cost more than arithmetic, both are
//! `shaders/matmul_blocked.wgsl`, a block of rows (× tokens) per invocation. `encode` picks
//! by the step's token count.

use std::sync::Arc;

use flint_core::quant::QuantType;

use crate::context::GpuContext;
use crate::error::{GpuError, Result};
use crate::ops::{bind, fold_groups, params, Batch};
use crate::pipeline::{PipelineCache, PipelineKey};
use crate::shader::ShaderDefs;

const SHADER: &str = "matmul.wgsl";
const OP: &str = "matmul";
/// Elements per dequantization chunk; rows must hold a whole number of them.
pub const CHUNK: u32 = 32;
/// Invocations per workgroup where the adapter allows (WebGPU guarantees 256).
pub const WG: u32 = 256;
/// Lanes that may share one weight row; `lanes_per_row` picks one from the row length.
pub const LANES_PER_ROW: [u32; 3] = [8, 16, 32];
/// Tokens per workgroup in the prefill kernel.
pub const TILE_TOKENS: u32 = 16;
/// Rows and tokens per invocation of the CPU-adapter prefill kernel (`RB`, `TB` in
/// `shaders/matmul_blocked.wgsl`). 16 × 16 measured fastest on lavapipe (Q5_0 4864 → 896 ×
/// 128 tokens: 47 ms, against 60 ms for 8 × 16 and 205 ms for the one-row tile kernel;
/// Q6_K 54 against 79 ms). Every row's dequantization is inlined, so a cold compile of one
/// pipeline takes lavapipe 6–10 s (Mesa's shader cache keeps it afterwards).
pub const BLOCK_ROWS: u32 = 16;
pub const BLOCK_TOKENS: u32 = 16;
/// Invocations per workgroup of the CPU-adapter prefill kernel: small, so that even a
/// 128-row matrix's blocks spread over the CPU's threads through the token axis.
const BLOCK_WG: u32 = 64;
/// Rows per invocation of the CPU-adapter decode kernel (the blocked kernel with one token):
/// each invocation loads all of x, so x's loads are shared by this many rows.
pub const DECODE_ROWS: u32 = 8;
/// Invocations per workgroup of the CPU-adapter decode kernel: one 8-lane SIMD group, so a
/// 256-row matrix still spans several workgroups (CPU threads).
const DECODE_WG: u32 = 8;

/// Where the token count comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TokenCount {
    /// `n_tok` of the shared [`Batch`] (x: [n_tok, n_in], y: [n_tok, y_stride]).
    Batch,
    /// Exactly one token: x row 0 to y row 0 (the logits of the last token).
    One,
}

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
    pub tokens: TokenCount,
    /// Add the result to y instead of overwriting it (fused residual).
    pub accumulate: bool,
}

/// Uniform parameters, laid out as `Params` in `shaders/matmul.wgsl`.
#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct Params {
    n_in: u32,
    n_rows: u32,
    row_offset: u32,
    y_stride: u32,
    groups_x: u32,
    row_bytes: u32,
    _pad: [u32; 2],
}

/// Which kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Vector,
    Tile,
    /// The prefill kernel for CPU-type adapters.
    Blocked,
    /// The decode kernel for CPU-type adapters: the blocked kernel with one token.
    BlockedVector,
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
/// dequantized chunks are indexed by constants only.
pub fn blocked_code(rows: u32, tokens: u32) -> String {
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
    for i in 0..rows {
        let _ = writeln!(s, "    let b{i} = row_base(r0, {i}u);");
    }
    for i in 0..tokens {
        let _ = writeln!(s, "    let x{i} = x_base(t0, {i}u);");
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
            if tokens == 1 {
                let _ = writeln!(s, "            let u{j} = x[x0 + xo];");
            } else {
                let t = |r: u32| format!("x{}", 4 * j + r);
                let _ = writeln!(s, "            let u{j} = quad_tokens({}, {}, {}, {}, xo);", t(0), t(1), t(2), t(3));
            }
        }
        for i in 0..rq {
            for j in 0..tq {
                let _ = writeln!(s, "            acc.a{i}_{j} += w{i} * u{j};");
            }
        }
        s.push_str("        }\n");
    }
    s.push_str("    }\n");
    for i in 0..rq {
        for j in 0..tq {
            if tokens == 1 {
                let _ = writeln!(s, "    store_rows(acc.a{i}_{j}, r0 + {}u, t0);", 4 * i);
            } else {
                let _ = writeln!(s, "    store(acc.a{i}_{j}, r0 + {}u, t0 + {}u);", 4 * i, 4 * j);
            }
        }
    }
    s.push_str("}\n");
    s
}

/// Whether a team of `tpr` lanes sums with subgroup shuffles on an adapter with `caps`.
fn subgroup_reduce(caps: &crate::Caps, tpr: u32) -> bool {
    caps.subgroups && !caps.cpu_like && tpr > 1 && tpr <= caps.subgroup_min_size
}

/// The shader variant for `ty` with workgroup size `wg` and `tpr` lanes per row (`subgroups`:
/// the team sums with subgroup shuffles).
fn key(ty: QuantType, kind: Kind, wg: u32, tpr: u32, bias: bool, accumulate: bool, subgroups: bool) -> PipelineKey {
    if matches!(kind, Kind::Blocked | Kind::BlockedVector) {
        let (rows, tokens) = if kind == Kind::Blocked { (BLOCK_ROWS, BLOCK_TOKENS) } else { (DECODE_ROWS, 1) };
        let defs = ShaderDefs::new()
            .quant(ty)
            .u32("WG", wg)
            .u32("RB", rows)
            .u32("TB", tokens)
            .code("BLOCK_CODE", blocked_code(rows, tokens))
            .flag("ONE_TOKEN", kind == Kind::BlockedVector)
            .flag("HAS_BIAS", bias)
            .flag("ACCUMULATE", accumulate);
        return PipelineKey::new("matmul_blocked.wgsl", "main", defs);
    }
    let tok = match kind {
        Kind::Tile => TILE_TOKENS,
        _ => 1,
    };
    let defs = ShaderDefs::new()
        .quant(ty)
        .u32("WG", wg)
        .u32("TPR", tpr)
        .u32("TOK", tok)
        .flag("TILE", kind == Kind::Tile)
        .flag("SUBGROUP_REDUCE", subgroups)
        .flag("HAS_BIAS", bias)
        .flag("ACCUMULATE", accumulate);
    PipelineKey::new(SHADER, "main", defs)
}

/// The largest power-of-two workgroup size up to [`WG`] the adapter allows.
fn workgroup_size(limits: &wgpu::Limits) -> u32 {
    let most = WG.min(limits.max_compute_invocations_per_workgroup).min(limits.max_compute_workgroup_size_x);
    1 << (31 - most.max(1).leading_zeros())
}

/// Every variant the engine may build on an adapter with WebGPU's default limits and `caps`.
pub fn variants(caps: &crate::Caps) -> Vec<PipelineKey> {
    let mut v = Vec::new();
    for ty in QuantType::ALL {
        for kind in [Kind::Vector, Kind::Tile] {
            for tpr in LANES_PER_ROW {
                for bias in [false, true] {
                    for accumulate in [false, true] {
                        v.push(key(ty, kind, WG, tpr, bias, accumulate, false));
                        if subgroup_reduce(caps, tpr) {
                            v.push(key(ty, kind, WG, tpr, bias, accumulate, true));
                        }
                    }
                }
            }
        }
        for bias in [false, true] {
            for accumulate in [false, true] {
                v.push(key(ty, Kind::Blocked, BLOCK_WG, 1, bias, accumulate, false));
                v.push(key(ty, Kind::BlockedVector, DECODE_WG, 1, bias, accumulate, false));
            }
        }
    }
    v
}

struct Kernel {
    pipeline: Arc<wgpu::ComputePipeline>,
    bind: wgpu::BindGroup,
    /// The folded grid of row groups.
    groups: (u32, u32),
    /// Tokens per workgroup in z.
    tokens: u32,
}

impl Kernel {
    async fn new(
        ctx: &GpuContext,
        cache: &PipelineCache,
        label: &str,
        key: PipelineKey,
        bufs: Vec<&wgpu::Buffer>,
        groups: (u32, u32),
        tokens: u32,
    ) -> Result<Kernel> {
        let pipeline = cache.get(ctx, &key).await?;
        let label = format!("{label}:{}", key.label());
        let scope = ctx.device.push_error_scope(wgpu::ErrorFilter::Validation);
        let bind = bind(ctx, &label, &pipeline, &bufs);
        if let Some(e) = scope.pop().await {
            return Err(GpuError::Shader { shader: label, message: e.to_string() });
        }
        Ok(Kernel { pipeline, bind, groups, tokens })
    }
}

/// One weight part's matmul, built once; `encode` only records dispatches.
pub struct Matmul {
    vector: Kernel,
    /// The prefill kernel; present exactly for TokenCount::Batch.
    tile: Option<Kernel>,
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
    #[allow(clippy::too_many_arguments)]
    pub async fn new(
        ctx: &GpuContext,
        cache: &PipelineCache,
        batch: &Batch,
        desc: &MatmulDesc<'_>,
        w: &wgpu::Buffer,
        x: &wgpu::Buffer,
        y: &wgpu::Buffer,
        bias: Option<&wgpu::Buffer>,
    ) -> Result<Matmul> {
        let d = desc;
        let block = d.ty.block_elems() as u32;
        if d.n_in == 0 || d.n_in % CHUNK != 0 || d.n_in % block != 0 {
            return Err(unsupported(format!(
                "{}: n_in {} of {} is not a multiple of {}",
                d.label,
                d.n_in,
                d.ty,
                CHUNK.max(block)
            )));
        }
        if d.n_rows == 0 || d.row_offset as u64 + d.n_rows as u64 > d.y_stride as u64 {
            return Err(unsupported(format!(
                "{}: rows {}..{} do not fit y_stride {}",
                d.label,
                d.row_offset,
                d.row_offset as u64 + d.n_rows as u64,
                d.y_stride
            )));
        }
        let row_bytes = d.ty.bytes_for(d.n_in as u64).unwrap_or(u64::MAX);
        let tokens = match d.tokens {
            TokenCount::Batch => batch.max_tokens.max(1) as u64,
            TokenCount::One => 1,
        };
        let w_bytes = row_bytes.saturating_mul(d.n_rows as u64);
        if w_bytes > u32::MAX as u64 {
            // The shader addresses weight bytes with u32.
            return Err(GpuError::Limit { what: "matmul weight part bytes", need: w_bytes, limit: u32::MAX as u64 });
        }
        check_buffer(ctx, "matmul weight bytes", w, w_bytes)?;
        check_buffer(ctx, "matmul x bytes", x, tokens * d.n_in as u64 * 4)?;
        let y_need = ((tokens - 1) * d.y_stride as u64 + d.row_offset as u64 + d.n_rows as u64) * 4;
        check_buffer(ctx, "matmul y bytes", y, y_need)?;
        if let Some(b) = bias {
            check_buffer(ctx, "matmul bias bytes", b, d.n_rows as u64 * 4)?;
        }
        let tile_tokens = TILE_TOKENS.min(BLOCK_TOKENS) as u64;
        if tokens.div_ceil(tile_tokens) > crate::ops::MAX_GROUPS_X as u64 {
            return Err(GpuError::Limit { what: "matmul token tiles", need: tokens, limit: crate::ops::MAX_GROUPS_X as u64 * tile_tokens });
        }

        let wg = workgroup_size(&ctx.limits);
        let build = |kind: Kind| {
            // A team of lanes shares a row and reads it coalesced (the matmul.wgsl kernels).
            let tpr = lanes_per_row(d.n_in / CHUNK, wg);
            let (wg, rows_per_group, tokens) = match kind {
                Kind::Vector => (wg, wg / tpr, 1),
                Kind::Tile => (wg, wg / tpr, TILE_TOKENS),
                Kind::Blocked => (BLOCK_WG.min(wg), BLOCK_WG.min(wg) * BLOCK_ROWS, BLOCK_TOKENS),
                Kind::BlockedVector => (DECODE_WG.min(wg), DECODE_WG.min(wg) * DECODE_ROWS, 1),
            };
            let groups = fold_groups(d.n_rows.div_ceil(rows_per_group));
            let p = Params {
                n_in: d.n_in,
                n_rows: d.n_rows,
                row_offset: d.row_offset,
                y_stride: d.y_stride,
                groups_x: groups.0,
                row_bytes: row_bytes as u32,
                _pad: [0; 2],
            };
            let pbuf = params(ctx, &format!("{}.params", d.label), &p);
            let key = key(d.ty, kind, wg, tpr, bias.is_some(), d.accumulate, subgroup_reduce(&ctx.caps, tpr));
            async move {
                let mut bufs: Vec<&wgpu::Buffer> = vec![&pbuf, w, x, y];
                bufs.extend(bias);
                if matches!(kind, Kind::Tile | Kind::Blocked) {
                    bufs.push(&batch.info);
                }
                Kernel::new(ctx, cache, d.label, key, bufs, groups, tokens).await
            }
        };
        let vector = build(if ctx.caps.cpu_like { Kind::BlockedVector } else { Kind::Vector }).await?;
        let tile = match d.tokens {
            TokenCount::Batch if ctx.caps.cpu_like => Some(build(Kind::Blocked).await?),
            TokenCount::Batch => Some(build(Kind::Tile).await?),
            TokenCount::One => None,
        };
        Ok(Matmul { vector, tile })
    }

    /// Records the dispatch for `n_tok` tokens (ignored for TokenCount::One).
    pub fn encode(&self, pass: &mut wgpu::ComputePass<'_>, n_tok: u32) {
        let (kernel, tiles) = match &self.tile {
            Some(_) if n_tok == 0 => return,
            Some(tile) if n_tok > 1 => (tile, n_tok.div_ceil(tile.tokens)),
            _ => (&self.vector, 1),
        };
        pass.set_pipeline(&kernel.pipeline);
        pass.set_bind_group(0, &kernel.bind, &[]);
        pass.dispatch_workgroups(kernel.groups.0, kernel.groups.1, tiles);
    }
}

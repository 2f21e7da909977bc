//! The op graph of one model, built once at load over preallocated buffers: the embedding,
//! one [`Layer`] per transformer block, and the [`Head`] (output rows' norm and logits).
//! Each op records dispatches for a step; its label names it in profiles.

use std::sync::Arc;

use flint_core::arch::ModelConfig;
use flint_core::kv::KvType;
use flint_core::quant::QuantType;

use crate::context::GpuContext;
use crate::error::Result;
use crate::ops::{self, Batch};
use crate::pipeline::PipelineCache;
use crate::weights::{GpuExperts, GpuMatrix, Uploader};

/// What a recorded step needs to size its dispatches.
#[derive(Clone, Copy, Debug)]
pub struct Step {
    /// Tokens of the step (for the head: its output rows).
    pub n_tok: u32,
    /// Longest sequence (in positions) after this step; sizes attention's split grid.
    pub max_kv_len: u32,
}

/// Anything that records dispatches for a step.
pub trait Encode {
    fn encode(&self, pass: &mut wgpu::ComputePass<'_>, step: &Step);
    /// What the op is, for profiles: `rms_norm`, `matmul Q4_K`, ...
    fn label(&self) -> String;
    /// Kernels `step` would build on first use (a matmul's variant for a new token count),
    /// so that a step can compile them together before recording.
    fn unbuilt(&self, _step: &Step, _keys: &mut Vec<crate::pipeline::PipelineKey>) {}
}

macro_rules! encode_with_n_tok {
    ($($t:ty => $name:literal),*) => {$(
        impl Encode for $t {
            fn encode(&self, pass: &mut wgpu::ComputePass<'_>, step: &Step) {
                <$t>::encode(self, pass, step.n_tok)
            }
            fn label(&self) -> String {
                $name.to_string()
            }
        }
    )*};
}
encode_with_n_tok!(
    ops::embed::Embed => "embed",
    ops::kv_write::KvWrite => "kv_write",
    ops::rms_norm::RmsNorm => "rms_norm",
    ops::glu::Glu => "glu",
    ops::add::Add => "add",
    ops::softcap::SoftCap => "softcap",
    ops::moe::MoeRoute => "moe_route",
    ops::moe::MoeCombine => "moe_combine"
);

impl Encode for ops::attention::Attention {
    fn encode(&self, pass: &mut wgpu::ComputePass<'_>, step: &Step) {
        self.encode_kv(pass, step.n_tok, step.max_kv_len)
    }
    fn label(&self) -> String {
        "attention".to_string()
    }
}

/// A matmul with the weight format it reads, for profiles.
pub struct TypedMatmul {
    pub ty: QuantType,
    /// Multiplies by expert (`matmul_id` in profiles).
    pub by_expert: bool,
    /// What its output fuses: "" (nothing), "+glu" or "+split" (`ops::matmul::Output`).
    pub fused: &'static str,
    pub op: ops::matmul::Matmul,
}

impl Encode for TypedMatmul {
    fn encode(&self, pass: &mut wgpu::ComputePass<'_>, step: &Step) {
        self.op.encode(pass, step.n_tok)
    }
    fn label(&self) -> String {
        format!("{}{} {}", if self.by_expert { "matmul_id" } else { "matmul" }, self.fused, self.ty.name())
    }
    fn unbuilt(&self, step: &Step, keys: &mut Vec<crate::pipeline::PipelineKey>) {
        keys.extend(self.op.unbuilt(step.n_tok));
    }
}

/// Activation buffers, sized for a step's most tokens (`last` and `logits` for its most
/// output rows).
pub struct Activations {
    pub x: wgpu::Buffer,
    pub h: wgpu::Buffer,
    pub q: wgpu::Buffer,
    pub k: wgpu::Buffer,
    pub v: wgpu::Buffer,
    pub attn: wgpu::Buffer,
    pub o: wgpu::Buffer,
    pub gate: wgpu::Buffer,
    pub up: wgpu::Buffer,
    /// [max_outputs, n_embd]: the output rows after the final norm.
    pub last: wgpu::Buffer,
    /// [max_outputs, n_vocab].
    pub logits: wgpu::Buffer,
    /// Attention's split partials, shared by every layer.
    pub attn_scratch: wgpu::Buffer,
    /// A mixture of experts' buffers, shared by every layer.
    pub moe: Option<MoeActivations>,
}

/// The buffers of a mixture of experts' step (entry = token · n_used + slot).
pub struct MoeActivations {
    /// [max_tokens, n_expert]: the router's logits.
    pub logits: wgpu::Buffer,
    pub routes: ops::moe::MoeRoutes,
    /// [max_tokens · n_used, expert n_ff] each: the experts' gate (then the activation) and up.
    pub gate: wgpu::Buffer,
    pub up: wgpu::Buffer,
    /// [max_tokens · n_used, n_embd]: each entry's expert output.
    pub out: wgpu::Buffer,
}

impl Activations {
    /// Bytes of every buffer.
    pub fn bytes(&self) -> u64 {
        let mut b = [&self.x, &self.h, &self.q, &self.k, &self.v, &self.attn, &self.o, &self.gate, &self.up, &self.last, &self.logits, &self.attn_scratch]
            .iter()
            .map(|b| b.size())
            .sum::<u64>();
        if let Some(m) = &self.moe {
            b += [&m.logits, &m.gate, &m.up, &m.out].iter().map(|b| b.size()).sum::<u64>();
        }
        b
    }

    pub fn new(ctx: &GpuContext, c: &ModelConfig, max_tokens: u32, max_outputs: u32, scratch_bytes: u64) -> Result<Activations> {
        let t = max_tokens as u64;
        let f = 4u64;
        let s = |label: &str, elems: u64| crate::buffer::storage(ctx, label, elems * f);
        let moe = match c.moe {
            Some(m) => {
                let desc = ops::moe::MoeDesc { n_expert: m.n_expert as u32, n_used: m.n_used as u32 };
                let entries = t * m.n_used as u64;
                Some(MoeActivations {
                    logits: s("moe_logits", t * m.n_expert as u64)?,
                    routes: ops::moe::MoeRoutes::new(ctx, desc, max_tokens)?,
                    gate: s("moe_gate", entries * m.n_ff as u64)?,
                    up: s("moe_up", entries * m.n_ff as u64)?,
                    out: s("moe_out", entries * c.n_embd as u64)?,
                })
            }
            None => None,
        };
        Ok(Activations {
            x: s("x", t * c.n_embd as u64)?,
            h: s("h", t * c.n_embd as u64)?,
            q: s("q", t * c.q_dim() as u64)?,
            k: s("k", t * c.kv_dim() as u64)?,
            v: s("v", t * c.v_dim() as u64)?,
            attn: s("attn", t * (c.n_head * c.head_dim_v) as u64)?,
            o: s("o", t * c.n_embd as u64)?,
            gate: s("gate", t * c.n_ff as u64)?,
            up: s("up", t * c.n_ff as u64)?,
            // A part without the head (max_outputs 0) keeps a one-element stand-in.
            last: s("last", (max_outputs as u64 * c.n_embd as u64).max(1))?,
            logits: s("logits", (max_outputs as u64 * c.n_vocab as u64).max(1))?,
            attn_scratch: crate::buffer::storage(ctx, "attention_partials", scratch_bytes)?,
            moe,
        })
    }
}

/// One transformer block's ops, in execution order.
pub struct Layer {
    /// None where the norm is folded into the Q, K and V matmuls.
    attn_norm: Option<ops::rms_norm::RmsNorm>,
    qkv: Vec<TypedMatmul>,
    qk_norm: Option<(ops::rms_norm::RmsNorm, ops::rms_norm::RmsNorm)>,
    kv_write: ops::kv_write::KvWrite,
    attention: ops::attention::Attention,
    attn_out: Vec<TypedMatmul>,
    /// gemma3's norm of the attention output added to the residual stream in one pass (else
    /// the add is fused into attn_out).
    post_attn: Option<ops::rms_norm::RmsNorm>,
    /// None where the norm is folded into the gate and up matmuls.
    ffn_norm: Option<ops::rms_norm::RmsNorm>,
    ffn: Ffn,
    post_ffn: Option<ops::rms_norm::RmsNorm>,
}

/// The feed-forward block: down(act(gate · h) ⊙ (up · h)), for one matrix set or for each
/// token's routed experts.
enum Ffn {
    Dense {
        gate_up: Vec<TypedMatmul>,
        /// None where the gate-and-up matmul ends in the activation (`Output::Glu`).
        glu: Option<ops::glu::Glu>,
        down: Vec<TypedMatmul>,
    },
    Moe {
        router: Vec<TypedMatmul>,
        route: ops::moe::MoeRoute,
        gate_up: Vec<TypedMatmul>,
        glu: ops::glu::Glu,
        down: Vec<TypedMatmul>,
        combine: ops::moe::MoeCombine,
    },
}

fn mms(m: &[TypedMatmul]) -> Vec<&dyn Encode> {
    m.iter().map(|m| m as &dyn Encode).collect()
}

impl Ffn {
    fn ops(&self) -> Vec<&dyn Encode> {
        match self {
            Ffn::Dense { gate_up, glu, down } => [mms(gate_up), glu.iter().map(|g| g as &dyn Encode).collect(), mms(down)].concat(),
            Ffn::Moe { router, route, gate_up, glu, down, combine } => {
                [mms(router), vec![route as &dyn Encode], mms(gate_up), vec![glu as &dyn Encode], mms(down), vec![combine as &dyn Encode]].concat()
            }
        }
    }
}

impl Layer {
    /// The ops in execution order.
    pub fn ops(&self) -> Vec<&dyn Encode> {
        [self.attention_ops(), self.ffn_ops()].concat()
    }

    /// The attention block's ops: after them `x` holds the residual stream with attention's
    /// output added.
    pub fn attention_ops(&self) -> Vec<&dyn Encode> {
        let mut v: Vec<&dyn Encode> = self.attn_norm.iter().map(|n| n as &dyn Encode).collect();
        v.extend(self.qkv.iter().map(|m| m as &dyn Encode));
        if let Some((q, k)) = &self.qk_norm {
            v.extend([q as &dyn Encode, k]);
        }
        v.extend([&self.kv_write as &dyn Encode, &self.attention]);
        v.extend(self.attn_out.iter().map(|m| m as &dyn Encode));
        v.extend(self.post_attn.iter().map(|n| n as &dyn Encode));
        v
    }

    /// The feed-forward block's ops: after them `x` holds the layer's output.
    pub fn ffn_ops(&self) -> Vec<&dyn Encode> {
        let mut v: Vec<&dyn Encode> = self.ffn_norm.iter().map(|n| n as &dyn Encode).collect();
        v.extend(self.ffn.ops());
        v.extend(self.post_ffn.iter().map(|n| n as &dyn Encode));
        v
    }
}

/// The final norm of the output rows (gathered from the step's tokens) and the logits.
pub struct Head {
    norm: ops::rms_norm::RmsNorm,
    output: Vec<TypedMatmul>,
    /// The final logits' soft cap (gemma2).
    softcap: Option<ops::softcap::SoftCap>,
}

impl Head {
    pub fn ops(&self) -> Vec<&dyn Encode> {
        let mut v: Vec<&dyn Encode> = vec![&self.norm];
        v.extend(self.output.iter().map(|m| m as &dyn Encode));
        v.extend(self.softcap.iter().map(|s| s as &dyn Encode));
        v
    }
}

/// The graph of a model or of one part of it (see [`super::Part`]).
pub struct Graph {
    /// Empty past the first part.
    pub embed: Vec<ops::embed::Embed>,
    /// The part's layers.
    pub layers: Vec<Layer>,
    /// The last part's.
    pub head: Option<Head>,
}

impl Graph {
    /// The body's ops (embedding and layers) in execution order.
    pub fn body(&self) -> Vec<&dyn Encode> {
        let mut v: Vec<&dyn Encode> = self.embed.iter().map(|e| e as &dyn Encode).collect();
        for l in &self.layers {
            v.extend(l.ops());
        }
        v
    }
}

/// What the graph is built over.
pub struct GraphInputs<'a> {
    pub ctx: &'a GpuContext,
    pub cache: &'a PipelineCache,
    pub cfg: &'a ModelConfig,
    /// The step's batch as each KV group's layers see it (its own block tables).
    pub batches: &'a [Batch],
    /// Which batch (group) each layer reads.
    pub layer_group: &'a [usize],
    /// The head's batch: `n_tok` output rows, `tokens` the step token of each.
    pub head: &'a Batch,
    pub acts: &'a Activations,
    /// Per layer of the part, K and V caches.
    pub kv: &'a [(wgpu::Buffer, wgpu::Buffer)],
    /// The layers (and embedding or head) to build.
    pub part: &'a super::Part,
    /// `rope_freqs.weight`, when the model has it.
    pub rope_factors: Option<Arc<[f32]>>,
    /// How the caches store K and V.
    pub kv_types: (KvType, KvType),
    /// The exact mode (`BackendOptions::exact`).
    pub exact: bool,
}

/// Every part's matmul of `m`: x → y (+ bias) (+ y with `accumulate`), `info` counting tokens;
/// with `norm`, of x normalized.
#[allow(clippy::too_many_arguments)]
async fn matmuls(
    g: &GraphInputs<'_>,
    info: &Batch,
    m: &GpuMatrix,
    x: &wgpu::Buffer,
    y: &wgpu::Buffer,
    bias: Option<&wgpu::Buffer>,
    accumulate: bool,
    norm: Option<ops::matmul::MatmulNorm<'_>>,
) -> Result<Vec<TypedMatmul>> {
    let mut out = Vec::new();
    for p in &m.parts {
        let label = format!("{}@{}", m.name, p.row_offset);
        let desc = ops::matmul::MatmulDesc {
            label: &label,
            ty: m.ty,
            n_in: m.n_in,
            n_rows: p.rows,
            row_offset: p.row_offset,
            y_stride: m.n_rows,
            max_tokens: info.max_tokens,
            accumulate,
            ids: None,
            output: ops::matmul::Output::Rows,
            norm,
            exact: g.exact,
        };
        // A bias covers all rows; it is only supported unsplit.
        let b = if p.row_offset == 0 { bias } else { None };
        let op = ops::matmul::Matmul::new(g.ctx, g.cache, &info.info, &desc, &p.buffer, x, y, b).await?;
        out.push(TypedMatmul { ty: m.ty, by_expert: false, fused: "", op });
    }
    Ok(out)
}

/// The matmul of a stack `m` of one part (`Uploader::stack`) with a fused `output`: `n_rows`
/// rows of products (for `Output::Glu` the gate rows, half the stack).
#[allow(clippy::too_many_arguments)]
async fn fused_matmul(
    g: &GraphInputs<'_>,
    info: &Batch,
    m: &GpuMatrix,
    x: &wgpu::Buffer,
    (y, y_stride): (&wgpu::Buffer, u32),
    bias: Option<&wgpu::Buffer>,
    n_rows: u32,
    output: ops::matmul::Output<'_>,
    norm: Option<ops::matmul::MatmulNorm<'_>>,
) -> Result<TypedMatmul> {
    let desc = ops::matmul::MatmulDesc {
        label: &m.name,
        ty: m.ty,
        n_in: m.n_in,
        n_rows,
        row_offset: 0,
        y_stride,
        max_tokens: info.max_tokens,
        accumulate: false,
        ids: None,
        output,
        norm,
        exact: g.exact,
    };
    let fused = if matches!(output, ops::matmul::Output::Glu(_)) { "+glu" } else { "+split" };
    let op = ops::matmul::Matmul::new(g.ctx, g.cache, &info.info, &desc, &m.parts[0].buffer, x, y, bias).await?;
    Ok(TypedMatmul { ty: m.ty, by_expert: false, fused, op })
}

/// Q, K and V of layer `il` (with their biases where the model has them) from `x`, normalized
/// by `norm` where it is folded: one matmul for all three where their formats stack
/// (`weights::stack_format`), else one for each set that shares a format, its rows split into
/// their outputs.
async fn qkv(g: &GraphInputs<'_>, up: &mut Uploader<'_>, il: usize, x: &wgpu::Buffer, norm: Option<ops::matmul::MatmulNorm<'_>>) -> Result<Vec<TypedMatmul>> {
    let (c, a) = (g.cfg, g.acts);
    let batch = &g.batches[0];
    let n = |s: &str| format!("blk.{il}.attn_{s}");
    let names = [n("q.weight"), n("k.weight"), n("v.weight")];
    let biases = [n("q.bias"), n("k.bias"), n("v.bias")];
    let outs = [(&a.q, c.q_dim() as u32), (&a.k, c.kv_dim() as u32), (&a.v, c.v_dim() as u32)];
    let mut formats = Vec::new();
    for name in &names {
        formats.push(up.format(name)?);
    }
    // All three in one set where their formats stack (`weights::stack_format`) and their rows
    // are as long, else a set for each format.
    let all = crate::weights::stack_format(&formats.iter().map(|f| f.0).collect::<Vec<_>>()).is_some() && formats.iter().all(|f| f.1 == formats[0].1);
    let mut sets: Vec<Vec<usize>> = Vec::new();
    for j in 0..3 {
        match sets.iter_mut().find(|set| all || formats[set[0]] == formats[j]) {
            Some(set) => set.push(j),
            None => sets.push(vec![j]),
        }
    }
    let mut out = Vec::new();
    for set in sets {
        let stacked = match set.len() {
            1 => None,
            _ => up.stack(&n(&format!("qkv{}", set.len())), &set.iter().map(|&j| names[j].as_str()).collect::<Vec<_>>()).await?,
        };
        let Some(m) = stacked else {
            for j in set {
                let bias = if c.qkv_bias { Some(up.vector(&biases[j]).await?) } else { None };
                let m = up.matrix(&names[j]).await?;
                out.extend(matmuls(g, batch, &m, x, outs[j].0, bias.as_ref(), false, norm).await?);
            }
            continue;
        };
        let bias = if c.qkv_bias { Some(up.vectors(&m.name, &set.iter().map(|&j| biases[j].as_str()).collect::<Vec<_>>()).await?) } else { None };
        let rest: Vec<ops::matmul::SplitOut> = set[1..].iter().map(|&j| ops::matmul::SplitOut { rows: outs[j].1, y: outs[j].0, y_stride: outs[j].1 }).collect();
        let first = outs[set[0]];
        out.push(fused_matmul(g, batch, &m, x, first, bias.as_ref(), m.n_rows, ops::matmul::Output::Split(&rest), norm).await?);
    }
    Ok(out)
}

/// Every part's matmul by expert of the stack `m`: each expert multiplies the entries routed
/// to it; x holds a row per token (`x_per_token`) or per entry, y a row per entry.
#[allow(clippy::too_many_arguments)]
async fn expert_matmuls(
    g: &GraphInputs<'_>,
    info: &Batch,
    m: &GpuExperts,
    routes: &ops::moe::MoeRoutes,
    n_used: u32,
    x_per_token: bool,
    x: &wgpu::Buffer,
    y: &wgpu::Buffer,
) -> Result<Vec<TypedMatmul>> {
    let mut out = Vec::new();
    for p in &m.parts {
        let label = format!("{}@{}", m.name, p.expert_offset);
        let ids = ops::matmul::MatmulIds {
            n_expert: p.experts,
            expert_offset: p.expert_offset,
            n_used,
            x_div: if x_per_token { n_used } else { 1 },
            count: &routes.count,
            rows: &routes.rows,
        };
        let desc = ops::matmul::MatmulDesc {
            label: &label,
            ty: m.ty,
            n_in: m.n_in,
            n_rows: m.n_rows,
            row_offset: 0,
            y_stride: m.n_rows,
            max_tokens: info.max_tokens,
            accumulate: false,
            ids: Some(ids),
            output: ops::matmul::Output::Rows,
            norm: None,
            exact: g.exact,
        };
        let op = ops::matmul::Matmul::new(g.ctx, g.cache, &info.info, &desc, &p.buffer, x, y, None).await?;
        out.push(TypedMatmul { ty: m.ty, by_expert: true, fused: "", op });
    }
    Ok(out)
}

async fn norm(
    g: &GraphInputs<'_>,
    batch: &Batch,
    x: &wgpu::Buffer,
    w: &wgpu::Buffer,
    out: &wgpu::Buffer,
    row_len: usize,
    rows: ops::rms_norm::Rows,
) -> Result<ops::rms_norm::RmsNorm> {
    let desc = ops::rms_norm::RmsNormDesc { row_len: row_len as u32, eps: g.cfg.rms_eps, rows, residual: false };
    ops::rms_norm::RmsNorm::new(g.ctx, g.cache, batch, desc, w, x, out).await
}

/// x += norm(o) · w over every token's row: a post-norm and its residual add in one pass.
async fn residual_norm(g: &GraphInputs<'_>, batch: &Batch, o: &wgpu::Buffer, w: &wgpu::Buffer, x: &wgpu::Buffer) -> Result<ops::rms_norm::RmsNorm> {
    let desc = ops::rms_norm::RmsNormDesc { row_len: g.cfg.n_embd as u32, eps: g.cfg.rms_eps, rows: ops::rms_norm::Rows::PerToken(1), residual: true };
    ops::rms_norm::RmsNorm::new(g.ctx, g.cache, batch, desc, w, o, x).await
}

/// Layer `il`'s attention shape; `rope_factors` are the model's `rope_freqs.weight`.
pub fn attention_desc(c: &ModelConfig, il: usize, rope_factors: Option<&Arc<[f32]>>) -> ops::attention::AttentionDesc {
    let lc = &c.layers[il];
    ops::attention::AttentionDesc {
        n_head: c.n_head as u32,
        n_head_kv: c.n_head_kv as u32,
        head_dim: c.head_dim as u32,
        head_dim_v: c.head_dim_v as u32,
        scale: c.attn_scale,
        window: lc.sliding_window,
        // RoPE is fused: kv_write rotates K, attention rotates q as it loads it.
        rope: Some(ops::rope::RopeSpec {
            rope_dim: c.rope_dim as u32,
            style: c.rope_style,
            base: lc.rope_base,
            freq_scale: lc.rope_freq_scale,
            mscale: c.rope_scaling.mscale,
            freq_factors: c.rope_divisors(il, rope_factors.map(|f| &f[..])).map(Arc::from),
        }),
        softcap: c.attn_softcap,
        k_type: KvType::F32,
        v_type: KvType::F32,
    }
}

/// Uploads the weights of block `il` and builds its ops.
async fn layer(g: &GraphInputs<'_>, up: &mut Uploader<'_>, il: usize) -> Result<Layer> {
    use ops::rms_norm::Rows::PerToken;
    let (c, a) = (g.cfg, g.acts);
    let batch = &g.batches[0];
    let n = |s: &str| format!("blk.{il}.{s}");
    // The norms before attention and the feed-forward block are folded into the matmuls that
    // read them where the adapter folds norms (`ops::matmul::folds_norms`), except in a mixture
    // of experts, whose router and experts read the norm apart.
    let fold = c.moe.is_none() && ops::matmul::folds_norms(&g.ctx.caps);
    let attn_norm_w = up.vector(&n("attn_norm.weight")).await?;
    let (attn_norm, qkv) = if fold {
        let folded = ops::matmul::MatmulNorm { w: &attn_norm_w, eps: c.rms_eps };
        (None, qkv(g, up, il, &a.x, Some(folded)).await?)
    } else {
        (Some(norm(g, batch, &a.x, &attn_norm_w, &a.h, c.n_embd, PerToken(1)).await?), qkv(g, up, il, &a.h, None).await?)
    };
    let qk_norm = if c.qk_norm {
        let qn = up.vector(&n("attn_q_norm.weight")).await?;
        let kn = up.vector(&n("attn_k_norm.weight")).await?;
        let q = norm(g, batch, &a.q, &qn, &a.q, c.head_dim, PerToken(c.n_head as u32)).await?;
        let k = norm(g, batch, &a.k, &kn, &a.k, c.head_dim, PerToken(c.n_head_kv as u32)).await?;
        Some((q, k))
    } else {
        None
    };
    let desc = ops::attention::AttentionDesc { k_type: g.kv_types.0, v_type: g.kv_types.1, ..attention_desc(c, il, g.rope_factors.as_ref()) };
    let local = il - g.part.layers.start;
    let (kc, vc) = &g.kv[local];
    let kv_batch = &g.batches[g.layer_group[local]];
    let kv_write = ops::kv_write::KvWrite::new(g.ctx, g.cache, kv_batch, &desc, &a.k, &a.v, kc, vc).await?;
    let tiles = if g.exact { ops::attention::Tiles::Off } else { ops::attention::Tiles::OnGpus };
    let attention = ops::attention::Attention::new(g.ctx, g.cache, kv_batch, &desc, &a.q, kc, vc, &a.attn, &a.attn_scratch, tiles).await?;
    let wo = up.matrix(&n("attn_output.weight")).await?;
    // Without a post-norm the residual add is fused into the projections.
    let (attn_out, post_attn) = if c.post_norms {
        let mm = matmuls(g, batch, &wo, &a.attn, &a.o, None, false, None).await?;
        let pn = up.vector(&n("post_attention_norm.weight")).await?;
        (mm, Some(residual_norm(g, batch, &a.o, &pn, &a.x).await?))
    } else {
        (matmuls(g, batch, &wo, &a.attn, &a.x, None, true, None).await?, None)
    };
    let ffn_norm_w = up.vector(&n("ffn_norm.weight")).await?;
    let ffn_norm = if fold { None } else { Some(norm(g, batch, &a.x, &ffn_norm_w, &a.h, c.n_embd, PerToken(1)).await?) };
    // What the gate and up matmuls read: x with the norm folded, else the norm's output.
    let (ffn_x, folded) = if fold { (&a.x, Some(ops::matmul::MatmulNorm { w: &ffn_norm_w, eps: c.rms_eps })) } else { (&a.h, None) };
    // Without a post-norm the residual add is fused into the last op.
    let (ffn_out, accumulate) = if c.post_norms { (&a.o, false) } else { (&a.x, true) };
    let ffn = match (c.moe, &a.moe) {
        (Some(moe), Some(ma)) => {
            let k = moe.n_used as u32;
            let router = matmuls(g, batch, &up.matrix(&n("ffn_gate_inp.weight")).await?, &a.h, &ma.logits, None, false, None).await?;
            let desc = ops::moe::MoeDesc { n_expert: moe.n_expert as u32, n_used: k };
            let route = ops::moe::MoeRoute::new(g.ctx, g.cache, batch, desc, &ma.logits, &ma.routes).await?;
            let mut gate_up = expert_matmuls(g, batch, &up.experts(&n("ffn_gate_exps.weight")).await?, &ma.routes, k, true, &a.h, &ma.gate).await?;
            gate_up.extend(expert_matmuls(g, batch, &up.experts(&n("ffn_up_exps.weight")).await?, &ma.routes, k, true, &a.h, &ma.up).await?);
            // The activation over every entry: [n_tok, n_used · n_ff] is [n_tok · n_used, n_ff].
            let glu_desc = ops::glu::GluDesc { act: c.activation, n_ff: k * moe.n_ff as u32 };
            let glu = ops::glu::Glu::new(g.ctx, g.cache, batch, glu_desc, &ma.gate, &ma.up, &ma.gate).await?;
            let down = expert_matmuls(g, batch, &up.experts(&n("ffn_down_exps.weight")).await?, &ma.routes, k, false, &ma.gate, &ma.out).await?;
            let combine = ops::moe::MoeCombine::new(g.ctx, g.cache, batch, c.n_embd as u32, k, accumulate, &ma.routes, &ma.out, ffn_out).await?;
            Ffn::Moe { router, route, gate_up, glu, down, combine }
        }
        _ => {
            // Gate and up in one matmul that ends in the activation where they share a format,
            // else two and the activation apart.
            let (gate, upn) = (n("ffn_gate.weight"), n("ffn_up.weight"));
            let (gate_up, glu) = match up.stack(&n("ffn_gate_up"), &[&gate, &upn]).await? {
                Some(m) => {
                    let n_ff = c.n_ff as u32;
                    let glu = ops::matmul::Output::Glu(c.activation);
                    (vec![fused_matmul(g, batch, &m, ffn_x, (&a.gate, n_ff), None, n_ff, glu, folded).await?], None)
                }
                None => {
                    let mut gate_up = matmuls(g, batch, &up.matrix(&gate).await?, ffn_x, &a.gate, None, false, folded).await?;
                    gate_up.extend(matmuls(g, batch, &up.matrix(&upn).await?, ffn_x, &a.up, None, false, folded).await?);
                    let glu_desc = ops::glu::GluDesc { act: c.activation, n_ff: c.n_ff as u32 };
                    (gate_up, Some(ops::glu::Glu::new(g.ctx, g.cache, batch, glu_desc, &a.gate, &a.up, &a.gate).await?))
                }
            };
            let down = matmuls(g, batch, &up.matrix(&n("ffn_down.weight")).await?, &a.gate, ffn_out, None, accumulate, None).await?;
            Ffn::Dense { gate_up, glu, down }
        }
    };
    let post_ffn = if c.post_norms {
        let pn = up.vector(&n("post_ffw_norm.weight")).await?;
        Some(residual_norm(g, batch, &a.o, &pn, &a.x).await?)
    } else {
        None
    };
    Ok(Layer { attn_norm, qkv, qk_norm, kv_write, attention, attn_out, post_attn, ffn_norm, ffn, post_ffn })
}

/// Uploads the part's weights and builds its graph. A tied embedding table is uploaded by
/// both the first part (embedding) and the last (output), when they differ.
pub async fn build(g: &GraphInputs<'_>, up: &mut Uploader<'_>) -> Result<Graph> {
    let (c, a) = (g.cfg, g.acts);
    let batch = &g.batches[0];
    let mut embd = None;
    let mut embed = Vec::new();
    if g.part.embed {
        let m = up.matrix("token_embd.weight").await?;
        for p in &m.parts {
            let scale = c.embed_scale.unwrap_or(1.0);
            embed.push(ops::embed::Embed::new(g.ctx, g.cache, batch, m.ty, c.n_embd as u32, p.rows, p.row_offset, &p.buffer, &a.x, scale).await?);
        }
        embd = Some(m);
    }
    let mut layers = Vec::with_capacity(g.part.layers.len());
    for il in g.part.layers.clone() {
        layers.push(layer(g, up, il).await?);
    }
    if !g.part.head {
        return Ok(Graph { embed, layers, head: None });
    }
    let out_norm = up.vector("output_norm.weight").await?;
    let max_tokens = batch.max_tokens;
    let norm = norm(g, g.head, &a.x, &out_norm, &a.last, c.n_embd, ops::rms_norm::Rows::Gather { src_rows: max_tokens }).await?;
    let output = match (c.tied_output, embd) {
        (true, Some(m)) => m,
        (true, None) => up.matrix("token_embd.weight").await?,
        (false, _) => up.matrix("output.weight").await?,
    };
    let output = matmuls(g, g.head, &output, &a.last, &a.logits, None, false, None).await?;
    let softcap = match c.final_softcap {
        Some(cap) => Some(ops::softcap::SoftCap::new(g.ctx, g.cache, g.head, c.n_vocab as u32, cap, &a.logits).await?),
        None => None,
    };
    Ok(Graph { embed, layers, head: Some(Head { norm, output, softcap }) })
}

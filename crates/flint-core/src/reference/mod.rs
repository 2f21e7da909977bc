//! The CPU reference forward pass: plain f32, weights dequantized row by row as they are
//! used, a paged KV pool (the same block tables the GPU uses, blocks allocated on first
//! write) and a causal (optionally sliding-window) mask. It implements the batched step like
//! the GPU backend, so it is the oracle of every batched test, and the `--backend cpu` path.
//! Every token's arithmetic is independent of the others in its step.

pub mod ops;

use std::collections::HashMap;
use std::sync::Arc;

use futures::future::LocalBoxFuture;

use crate::arch::{Activation, ModelConfig};
use crate::backend::{check_step, Backend, BackendError, BackendOptions, StepBatch, StepLimits, StepResult};
use crate::gguf::{GgufFile, TensorInfo};
use crate::kv::{KvLayout, NO_BLOCK};
use crate::quant;
use crate::selftest::{Probe, Tap, TapPoint};

/// A weight matrix: where its bytes are and how to read them.
#[derive(Clone, Debug)]
struct Matrix {
    info: TensorInfo,
    n_in: usize,
    n_out: usize,
}

/// A layer's feed-forward weights: one gated block, or a router over experts whose gated
/// blocks are stacked in 3-D tensors ([n_in, n_out, n_expert]: expert e's rows are contiguous).
enum Ffn {
    Dense { gate: Matrix, up: Matrix, down: Matrix },
    Moe { router: Matrix, gate: Matrix, up: Matrix, down: Matrix, n_used: usize },
}

struct Layer {
    attn_norm: Vec<f32>,
    q: Matrix,
    k: Matrix,
    v: Matrix,
    o: Matrix,
    q_bias: Option<Vec<f32>>,
    k_bias: Option<Vec<f32>>,
    v_bias: Option<Vec<f32>>,
    q_norm: Option<Vec<f32>>,
    k_norm: Option<Vec<f32>>,
    post_attn_norm: Option<Vec<f32>>,
    ffn_norm: Vec<f32>,
    ffn: Ffn,
    post_ffn_norm: Option<Vec<f32>>,
    /// RoPE's inverse frequencies at this layer's base (with `rope_freqs.weight` applied).
    rope_inv_freq: Vec<f32>,
}

/// One layer's K or V blocks, `block_size × row` floats each, allocated on first write.
struct BlockStore {
    row: usize,
    blocks: Vec<Option<Box<[f32]>>>,
}

impl BlockStore {
    fn new(n_blocks: u32, row: usize) -> Self {
        BlockStore { row, blocks: (0..n_blocks).map(|_| None).collect() }
    }

    fn row_mut(&mut self, block: u32, offset: usize, block_size: usize) -> &mut [f32] {
        let row = self.row;
        let b = self.blocks[block as usize].get_or_insert_with(|| vec![0.0; block_size * row].into_boxed_slice());
        &mut b[offset * row..(offset + 1) * row]
    }

    /// The row at `offset` of `block`; a block never written reads as zeros.
    fn row(&self, block: u32, offset: usize) -> Option<&[f32]> {
        self.blocks[block as usize].as_deref().map(|b| &b[offset * self.row..(offset + 1) * self.row])
    }

    fn copy(&mut self, src: u32, dst: u32) {
        self.blocks[dst as usize] = self.blocks[src as usize].clone();
    }
}

/// Where each token of a step sits: its entry, position and, per KV group, its table.
struct TokenPlace<'a> {
    pos: usize,
    tables: &'a [&'a [u32]],
}

/// The CPU reference backend.
pub struct CpuBackend {
    file: Arc<GgufFile>,
    cfg: ModelConfig,
    /// Tensor bytes read from a source that cannot hand out slices (the browser).
    owned: HashMap<String, Vec<u8>>,
    embd: Matrix,
    output: Matrix,
    output_norm: Vec<f32>,
    layers: Vec<Layer>,
    layout: KvLayout,
    limits: StepLimits,
    /// Per layer: its group, K blocks ([block_size, kv_dim], after RoPE) and V blocks.
    kv: Vec<(usize, BlockStore, BlockStore)>,
}

impl CpuBackend {
    /// Builds the backend over a validated file; the context is clamped to the training
    /// context, and the KV pool laid out as `opts` asks.
    pub async fn new(file: Arc<GgufFile>, cfg: ModelConfig, opts: &BackendOptions) -> Result<CpuBackend, BackendError> {
        let (n_layer, n_ctx) = (cfg.n_layer, opts.n_ctx.clamp(1, cfg.n_ctx_train));
        Self::with_layers(file, cfg, opts, n_layer, n_ctx).await
    }

    /// A reference that holds only the embedding, layer 0 and the head: enough for the
    /// self-test's [`Backend::probe`] (and a fraction of the memory where tensors are copied),
    /// not for steps. `checked`: the options of the backend it checks (its KV types, and its
    /// context, which picks LongRoPE's factors).
    pub async fn first_layer(file: Arc<GgufFile>, cfg: ModelConfig, probe: &Probe, checked: &BackendOptions) -> Result<CpuBackend, BackendError> {
        let (tokens, outputs) = probe.max_step();
        let opts = BackendOptions { n_ctx: probe.len(), max_seqs: 1, max_batch_tokens: tokens, max_outputs: outputs, kv_budget_bytes: None, ..checked.clone() };
        let rope_ctx = checked.n_ctx.clamp(1, cfg.n_ctx_train);
        Self::with_layers(file, cfg, &opts, 1, rope_ctx).await
    }

    /// The reference over the first `n_layers` layers, rotating as a context of `rope_ctx`
    /// positions does (LongRoPE's choice of factors).
    async fn with_layers(file: Arc<GgufFile>, cfg: ModelConfig, opts: &BackendOptions, n_layers: usize, rope_ctx: usize) -> Result<CpuBackend, BackendError> {
        let n_layers = n_layers.min(cfg.n_layer);
        let n_ctx = opts.n_ctx.clamp(1, cfg.n_ctx_train);
        let layout = KvLayout::plan(&cfg, &opts.pool_request(n_ctx, u64::MAX))?;
        let mut owned = HashMap::new();
        if file.source().as_slice().is_none() {
            let held = |name: &str| match name.strip_prefix("blk.").and_then(|r| r.split('.').next()).map(str::parse::<usize>) {
                Some(Ok(il)) => il < n_layers,
                _ => true,
            };
            for (name, _) in cfg.expected_tensors().into_iter().filter(|(n, _)| held(n)) {
                let t = file.require_tensor(&name)?;
                let mut buf = vec![0u8; t.n_bytes as usize];
                file.read_tensor_range(t, 0, &mut buf).await?;
                owned.insert(name, buf);
            }
        }
        let kv = (0..n_layers)
            .map(|il| {
                let g = layout.group_of(il);
                let n = layout.groups[g].n_blocks;
                (g, BlockStore::new(n, cfg.kv_dim()), BlockStore::new(n, cfg.v_dim()))
            })
            .collect();
        let limits = StepLimits { max_tokens: opts.max_batch_tokens, max_seqs: opts.max_seqs, max_outputs: opts.max_outputs };
        let mut this = CpuBackend {
            embd: matrix(&file, "token_embd.weight")?,
            output: matrix(&file, if cfg.tied_output { "token_embd.weight" } else { "output.weight" })?,
            output_norm: Vec::new(),
            layers: Vec::with_capacity(n_layers),
            layout,
            limits,
            kv,
            owned,
            cfg,
            file,
        };
        this.output_norm = this.vector("output_norm.weight")?;
        let factors = match this.cfg.rope_factor_tensor(rope_ctx) {
            Some(name) => Some(this.vector(name)?),
            None => None,
        };
        for i in 0..n_layers {
            let divisors = this.cfg.rope_divisors(i, factors.as_deref());
            let layer = this.layer(i, divisors.as_deref())?;
            this.layers.push(layer);
        }
        Ok(this)
    }

    fn bytes(&self, t: &TensorInfo) -> &[u8] {
        match self.file.tensor_bytes(t) {
            Some(b) => b,
            None => &self.owned[&t.name],
        }
    }

    fn vector(&self, name: &str) -> Result<Vec<f32>, BackendError> {
        let t = self.file.require_tensor(name)?;
        let mut v = vec![0f32; t.n_elems as usize];
        quant::dequantize(t.ty, self.bytes(t), &mut v).map_err(|e| BackendError::Device { cause: e.to_string() })?;
        Ok(v)
    }

    fn opt_vector(&self, name: &str, present: bool) -> Result<Option<Vec<f32>>, BackendError> {
        if present {
            self.vector(name).map(Some)
        } else {
            Ok(None)
        }
    }

    /// Layer `i`'s weights; `rope_factors`: its per-pair divisors of the RoPE frequencies
    /// (`ModelConfig::rope_divisors`).
    fn layer(&self, i: usize, rope_factors: Option<&[f32]>) -> Result<Layer, BackendError> {
        let c = &self.cfg;
        let n = |s: &str| format!("blk.{i}.{s}");
        let m = |s: &str| matrix(&self.file, &n(s));
        Ok(Layer {
            rope_inv_freq: crate::arch::rope_inv_freq(c.rope_dim, c.layers[i].rope_base, rope_factors),
            attn_norm: self.vector(&n("attn_norm.weight"))?,
            q: m("attn_q.weight")?,
            k: m("attn_k.weight")?,
            v: m("attn_v.weight")?,
            o: m("attn_output.weight")?,
            q_bias: self.opt_vector(&n("attn_q.bias"), c.qkv_bias)?,
            k_bias: self.opt_vector(&n("attn_k.bias"), c.qkv_bias)?,
            v_bias: self.opt_vector(&n("attn_v.bias"), c.qkv_bias)?,
            q_norm: self.opt_vector(&n("attn_q_norm.weight"), c.qk_norm)?,
            k_norm: self.opt_vector(&n("attn_k_norm.weight"), c.qk_norm)?,
            post_attn_norm: self.opt_vector(&n("post_attention_norm.weight"), c.post_norms)?,
            ffn_norm: self.vector(&n("ffn_norm.weight"))?,
            ffn: match c.moe {
                None => Ffn::Dense { gate: m("ffn_gate.weight")?, up: m("ffn_up.weight")?, down: m("ffn_down.weight")? },
                Some(moe) => Ffn::Moe {
                    router: m("ffn_gate_inp.weight")?,
                    gate: experts(&self.file, &n("ffn_gate_exps.weight"))?,
                    up: experts(&self.file, &n("ffn_up_exps.weight"))?,
                    down: experts(&self.file, &n("ffn_down_exps.weight"))?,
                    n_used: moe.n_used,
                },
            },
            post_ffn_norm: self.opt_vector(&n("post_ffw_norm.weight"), c.post_norms)?,
        })
    }

    fn matmul(&self, w: &Matrix, x: &[f32], n_tok: usize) -> Vec<f32> {
        ops::matmul(w.info.ty, self.bytes(&w.info), w.n_in, w.n_out, x, n_tok)
    }

    /// Matrix `e` of a stack (`w.n_out` rows each; a plain matrix is stack of one, e = 0).
    fn expert_matmul(&self, w: &Matrix, e: usize, x: &[f32], n_tok: usize) -> Vec<f32> {
        let bytes = self.bytes(&w.info);
        let stride = bytes.len() / (w.info.n_elems as usize / (w.n_in * w.n_out));
        ops::matmul(w.info.ty, &bytes[e * stride..(e + 1) * stride], w.n_in, w.n_out, x, n_tok)
    }

    /// down(act(gate · x) ⊙ (up · x)) with matrices `e` of the stacks.
    #[allow(clippy::too_many_arguments)]
    fn gated(&self, gate: &Matrix, up: &Matrix, down: &Matrix, e: usize, act: fn(f32) -> f32, x: &[f32], n_tok: usize) -> Vec<f32> {
        let mut g = self.expert_matmul(gate, e, x, n_tok);
        let u = self.expert_matmul(up, e, x, n_tok);
        g.iter_mut().zip(&u).for_each(|(a, b)| *a = act(*a) * b);
        self.expert_matmul(down, e, &g, n_tok)
    }

    fn embed(&self, tokens: &[u32]) -> Vec<f32> {
        let e = self.cfg.n_embd;
        let row_bytes = self.embd.info.n_bytes as usize / self.embd.n_out;
        let bytes = self.bytes(&self.embd.info);
        let mut x = vec![0f32; tokens.len() * e];
        for (t, &id) in tokens.iter().enumerate() {
            let src = &bytes[id as usize * row_bytes..(id as usize + 1) * row_bytes];
            let dst = &mut x[t * e..(t + 1) * e];
            quant::dequantize(self.embd.info.ty, src, dst).expect("row size checked at load");
            if let Some(s) = self.cfg.embed_scale {
                dst.iter_mut().for_each(|v| *v *= s);
            }
        }
        x
    }

    fn run(&mut self, batch: StepBatch<'_>) -> Result<StepResult, BackendError> {
        if self.layers.len() != self.cfg.n_layer {
            return Err(BackendError::BadStep { cause: "this CPU reference holds only the self-test's first layer".into() });
        }
        check_step(&batch, &self.limits, &self.layout, self.cfg.n_vocab)?;
        let bs = self.layout.block_size as usize;
        for c in batch.copies {
            for (g, k, v) in &mut self.kv {
                if *g == c.group {
                    k.copy(c.src, c.dst);
                    v.copy(c.src, c.dst);
                }
            }
        }
        let tokens: Vec<u32> = batch.entries.iter().flat_map(|e| e.tokens.iter().copied()).collect();
        let places: Vec<TokenPlace> =
            batch.entries.iter().flat_map(|e| (0..e.tokens.len()).map(move |i| TokenPlace { pos: e.start + i, tables: &e.tables })).collect();
        let n_tok = tokens.len();
        let mut x = self.embed(&tokens);
        for il in 0..self.cfg.n_layer {
            x = self.layer_forward(il, x, &places, bs);
        }
        // The head: only the output rows.
        let mut rows = Vec::new();
        let mut base = 0;
        for entry in &batch.entries {
            rows.extend(entry.outputs.iter().map(|o| base + o.index));
            base += entry.tokens.len();
        }
        debug_assert_eq!(base, n_tok);
        if rows.is_empty() {
            return Ok(StepResult::default());
        }
        let logits = self.head(&x, &rows);
        let n_vocab = self.cfg.n_vocab;
        let want_logits = batch.logits;
        let mut result = StepResult::default();
        let rows = batch.entries.into_iter().flat_map(|e| e.outputs);
        for (o, row) in rows.zip(logits.chunks_exact(n_vocab)) {
            result.sampled.push(o.sampler.sample_full(row));
            if want_logits {
                result.logits.push(row.to_vec());
            }
        }
        Ok(result)
    }

    /// The final norm and the logits of rows `rows` of `x` ([n_tok, n_embd]).
    fn head(&self, x: &[f32], rows: &[usize]) -> Vec<f32> {
        let e = self.cfg.n_embd;
        let mut last: Vec<f32> = rows.iter().flat_map(|&r| x[r * e..(r + 1) * e].iter().copied()).collect();
        ops::rms_norm(&mut last, &self.output_norm, self.cfg.rms_eps);
        let mut logits = self.matmul(&self.output, &last, rows.len());
        if let Some(cap) = self.cfg.final_softcap {
            logits.iter_mut().for_each(|l| *l = ops::softcap(*l, cap));
        }
        logits
    }

    fn layer_forward(&mut self, il: usize, x: Vec<f32>, places: &[TokenPlace], bs: usize) -> Vec<f32> {
        let x = self.attention_block(il, x, places, bs);
        self.ffn_block(il, x)
    }

    /// Layer `il`'s attention block over the residual stream `x` (its K and V stored).
    fn attention_block(&mut self, il: usize, mut x: Vec<f32>, places: &[TokenPlace], bs: usize) -> Vec<f32> {
        let c = &self.cfg;
        let l = &self.layers[il];
        let n_tok = places.len();
        let (hd, kv_dim) = (c.head_dim, c.kv_dim());

        let mut h = x.clone();
        ops::rms_norm(&mut h, &l.attn_norm, c.rms_eps);
        let mut q = self.matmul(&l.q, &h, n_tok);
        let mut k = self.matmul(&l.k, &h, n_tok);
        let v = {
            let mut v = self.matmul(&l.v, &h, n_tok);
            add_bias(&mut v, l.v_bias.as_deref());
            v
        };
        add_bias(&mut q, l.q_bias.as_deref());
        add_bias(&mut k, l.k_bias.as_deref());
        if let (Some(qn), Some(kn)) = (&l.q_norm, &l.k_norm) {
            ops::rms_norm(&mut q, qn, c.rms_eps);
            ops::rms_norm(&mut k, kn, c.rms_eps);
        }
        let lc = &c.layers[il];
        for (t, place) in places.iter().enumerate() {
            for head in q[t * c.q_dim()..(t + 1) * c.q_dim()].chunks_mut(hd) {
                ops::rope_scaled(head, place.pos, &l.rope_inv_freq, lc.rope_freq_scale, c.rope_style, c.rope_scaling.mscale);
            }
            for head in k[t * kv_dim..(t + 1) * kv_dim].chunks_mut(hd) {
                ops::rope_scaled(head, place.pos, &l.rope_inv_freq, lc.rope_freq_scale, c.rope_style, c.rope_scaling.mscale);
            }
        }
        // Every K and V row is stored before any query reads (a step's tokens see each other).
        let (group, kc, vc) = &mut self.kv[il];
        for (t, place) in places.iter().enumerate() {
            let block = place.tables[*group][place.pos / bs];
            // Each row as the cache reads it back (rounded to its type).
            let row = kc.row_mut(block, place.pos % bs, bs);
            row.copy_from_slice(&k[t * kv_dim..(t + 1) * kv_dim]);
            self.layout.k_type.read_back(row, hd, true);
            let row = vc.row_mut(block, place.pos % bs, bs);
            row.copy_from_slice(&v[t * c.v_dim()..(t + 1) * c.v_dim()]);
            self.layout.v_type.read_back(row, c.head_dim_v, false);
        }
        let (group, kc, vc) = &self.kv[il];
        let attn = attention(c, il, &q, places, *group, kc, vc, bs);
        let l = &self.layers[il];
        let mut o = self.matmul(&l.o, &attn, n_tok);
        if let Some(w) = &l.post_attn_norm {
            ops::rms_norm(&mut o, w, c.rms_eps);
        }
        x.iter_mut().zip(&o).for_each(|(a, b)| *a += b);
        x
    }

    /// Layer `il`'s feed-forward block over the residual stream `x`.
    fn ffn_block(&self, il: usize, mut x: Vec<f32>) -> Vec<f32> {
        let (c, l) = (&self.cfg, &self.layers[il]);
        let n_tok = x.len() / c.n_embd;
        let mut h = x.clone();
        ops::rms_norm(&mut h, &l.ffn_norm, c.rms_eps);
        let act = match c.activation {
            Activation::Silu => ops::silu,
            Activation::GeluTanh => ops::gelu_tanh,
        };
        let mut d = match &l.ffn {
            Ffn::Dense { gate, up, down } => self.gated(gate, up, down, 0, act, &h, n_tok),
            Ffn::Moe { router, gate, up, down, n_used } => {
                // Each token's experts, best first (slot s of token t is entry t·n_used + s);
                // each expert multiplies the entries routed to it, in token order; then each
                // token sums its slots' outputs in slot order, as the GPU does.
                let (k, e) = (*n_used, c.n_embd);
                let logits = self.matmul(router, &h, n_tok);
                let routes: Vec<Vec<(usize, f32)>> = logits.chunks(router.n_out).map(|row| ops::moe_route(row, k)).collect();
                let mut entries: Vec<Vec<usize>> = vec![Vec::new(); router.n_out];
                for (t, route) in routes.iter().enumerate() {
                    for (s, &(ex, _)) in route.iter().enumerate() {
                        entries[ex].push(t * k + s);
                    }
                }
                let mut y = vec![0f32; n_tok * k * e];
                for (ex, list) in entries.iter().enumerate().filter(|(_, l)| !l.is_empty()) {
                    let x: Vec<f32> = list.iter().flat_map(|&en| h[en / k * e..][..e].iter().copied()).collect();
                    let out = self.gated(gate, up, down, ex, act, &x, list.len());
                    for (i, &en) in list.iter().enumerate() {
                        y[en * e..][..e].copy_from_slice(&out[i * e..][..e]);
                    }
                }
                let mut d = vec![0f32; n_tok * e];
                for (t, route) in routes.iter().enumerate() {
                    for (s, &(_, w)) in route.iter().enumerate() {
                        d[t * e..][..e].iter_mut().zip(&y[(t * k + s) * e..][..e]).for_each(|(a, b)| *a += w * b);
                    }
                }
                d
            }
        };
        if let Some(w) = &l.post_ffn_norm {
            ops::rms_norm(&mut d, w, c.rms_eps);
        }
        x.iter_mut().zip(&d).for_each(|(a, b)| *a += b);
        x
    }
}

impl CpuBackend {
    fn run_probe(&mut self, probe: &Probe) -> Result<Vec<Tap>, BackendError> {
        let bs = self.layout.block_size as usize;
        let table = probe.table(bs);
        if table.iter().any(|&b| self.layout.groups.iter().any(|g| b >= g.n_blocks)) {
            return Err(BackendError::BadStep { cause: format!("the probe needs {} blocks a group", table.len()) });
        }
        let tables: Vec<&[u32]> = self.layout.groups.iter().map(|_| table.as_slice()).collect();
        let mut taps = Vec::new();
        for (step, s) in probe.steps.iter().enumerate() {
            if let Some(&id) = s.tokens.iter().find(|&&t| t as usize >= self.cfg.n_vocab) {
                return Err(BackendError::BadToken { id, n_vocab: self.cfg.n_vocab });
            }
            let places: Vec<TokenPlace> = (0..s.tokens.len()).map(|i| TokenPlace { pos: s.start + i, tables: &tables }).collect();
            let x = self.embed(&s.tokens);
            let x = self.attention_block(0, x, &places, bs);
            taps.push(Tap { step, point: TapPoint::Attention, values: x.clone() });
            let x = self.ffn_block(0, x);
            let logits = self.head(&x, &s.outputs);
            taps.push(Tap { step, point: TapPoint::FeedForward, values: x });
            taps.push(Tap { step, point: TapPoint::Logits, values: logits });
        }
        Ok(taps)
    }
}

fn add_bias(x: &mut [f32], bias: Option<&[f32]>) {
    if let Some(b) = bias {
        for row in x.chunks_mut(b.len()) {
            row.iter_mut().zip(b).for_each(|(a, b)| *a += b);
        }
    }
}

/// Causal attention of each token over its own sequence's positions, read through its block
/// table in `group`. q: [n_tok, n_head·head_dim]; returns [n_tok, n_head·head_dim_v].
#[allow(clippy::too_many_arguments)]
fn attention(c: &ModelConfig, il: usize, q: &[f32], places: &[TokenPlace], group: usize, kc: &BlockStore, vc: &BlockStore, bs: usize) -> Vec<f32> {
    let (hd, hdv) = (c.head_dim, c.head_dim_v);
    let n_group = c.n_head / c.n_head_kv;
    let window = c.layers[il].sliding_window.map(|w| w as usize);
    let out_dim = c.n_head * hdv;
    let mut out = vec![0f32; places.len() * out_dim];
    let zeros = vec![0f32; c.kv_dim().max(c.v_dim())];
    let task = |(idx, o): (usize, &mut [f32])| {
        let (t, h) = (idx / c.n_head, idx % c.n_head);
        let place = &places[t];
        let pos = place.pos;
        let table = place.tables[group];
        let slot = |j: usize| (table[j / bs], j % bs);
        let first = window.map_or(0, |w| (pos + 1).saturating_sub(w));
        let kvh = h / n_group;
        let qh = &q[t * c.q_dim() + h * hd..][..hd];
        let k_row = |j: usize| {
            let (b, off) = slot(j);
            debug_assert_ne!(b, NO_BLOCK);
            kc.row(b, off).unwrap_or(&zeros[..kc.row])
        };
        let v_row = |j: usize| {
            let (b, off) = slot(j);
            vc.row(b, off).unwrap_or(&zeros[..vc.row])
        };
        let score = |j: usize| ops::dot(qh, &k_row(j)[kvh * hd..][..hd]) * c.attn_scale;
        let mut scores: Vec<f32> = match c.attn_softcap {
            Some(cap) => (first..=pos).map(|j| ops::softcap(score(j), cap)).collect(),
            None => (first..=pos).map(score).collect(),
        };
        ops::softmax(&mut scores);
        for (j, p) in (first..=pos).zip(&scores) {
            let vj = &v_row(j)[kvh * hdv..][..hdv];
            o.iter_mut().zip(vj).for_each(|(a, b)| *a += p * b);
        }
    };
    #[cfg(not(target_arch = "wasm32"))]
    {
        use rayon::prelude::*;
        out.par_chunks_mut(hdv).enumerate().for_each(task);
    }
    #[cfg(target_arch = "wasm32")]
    out.chunks_mut(hdv).enumerate().for_each(task);
    out
}

/// A stack of expert matrices [n_in, n_out, n_expert] as one `Matrix` of n_out rows each.
fn experts(file: &GgufFile, name: &str) -> Result<Matrix, BackendError> {
    let info = file.require_tensor(name)?.clone();
    if info.dims.len() != 3 {
        return Err(BackendError::Device { cause: format!("{name} is not a stack of matrices: {:?}", info.dims) });
    }
    let (n_in, n_out) = (info.dims[0] as usize, info.dims[1] as usize);
    Ok(Matrix { info, n_in, n_out })
}

fn matrix(file: &GgufFile, name: &str) -> Result<Matrix, BackendError> {
    let info = file.require_tensor(name)?.clone();
    if info.dims.len() != 2 {
        return Err(BackendError::Device { cause: format!("{name} is not a matrix: {:?}", info.dims) });
    }
    let (n_in, n_out) = (info.dims[0] as usize, info.dims[1] as usize);
    Ok(Matrix { info, n_in, n_out })
}

impl Backend for CpuBackend {
    fn config(&self) -> &ModelConfig {
        &self.cfg
    }
    fn kv_layout(&self) -> &KvLayout {
        &self.layout
    }
    fn limits(&self) -> StepLimits {
        self.limits
    }
    fn step<'a>(&'a mut self, batch: StepBatch<'a>) -> LocalBoxFuture<'a, Result<StepResult, BackendError>> {
        Box::pin(async move { self.run(batch) })
    }
    fn probe<'a>(&'a mut self, probe: &'a Probe) -> LocalBoxFuture<'a, Result<Vec<Tap>, BackendError>> {
        Box::pin(async move { self.run_probe(probe) })
    }
    fn name(&self) -> String {
        "cpu".into()
    }
}

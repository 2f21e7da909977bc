//! The CPU reference forward pass: plain f32, weights dequantized row by row as they are
//! used, a simple contiguous KV cache and a causal (optionally sliding-window) mask.
//! It is the oracle the GPU kernels are tested against, and the `--backend cpu` path.

pub mod ops;

use std::collections::HashMap;
use std::sync::Arc;

use futures::future::LocalBoxFuture;

use crate::arch::{Activation, ModelConfig};
use crate::backend::{check_batch, Backend, BackendError};
use crate::gguf::{GgufFile, TensorInfo};
use crate::quant;

/// A weight matrix: where its bytes are and how to read them.
#[derive(Clone, Debug)]
struct Matrix {
    info: TensorInfo,
    n_in: usize,
    n_out: usize,
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
    gate: Matrix,
    up: Matrix,
    down: Matrix,
    post_ffn_norm: Option<Vec<f32>>,
}

/// The CPU reference backend for one sequence.
pub struct CpuBackend {
    file: Arc<GgufFile>,
    cfg: ModelConfig,
    /// Tensor bytes read from a source that cannot hand out slices (the browser).
    owned: HashMap<String, Vec<u8>>,
    embd: Matrix,
    output: Matrix,
    output_norm: Vec<f32>,
    layers: Vec<Layer>,
    /// Per layer: [position][kv_dim] keys (after RoPE) and [position][v_dim] values.
    k_cache: Vec<Vec<f32>>,
    v_cache: Vec<Vec<f32>>,
    n_past: usize,
    n_ctx: usize,
}

impl CpuBackend {
    /// Builds the backend over a validated file; `n_ctx` is clamped to the training context.
    pub async fn new(file: Arc<GgufFile>, cfg: ModelConfig, n_ctx: usize) -> Result<CpuBackend, BackendError> {
        let mut owned = HashMap::new();
        if file.source().as_slice().is_none() {
            for (name, _) in cfg.expected_tensors() {
                let t = file.require_tensor(&name)?;
                let mut buf = vec![0u8; t.n_bytes as usize];
                file.read_tensor_range(t, 0, &mut buf).await?;
                owned.insert(name, buf);
            }
        }
        let mut this = CpuBackend {
            embd: matrix(&file, "token_embd.weight")?,
            output: matrix(&file, if cfg.tied_output { "token_embd.weight" } else { "output.weight" })?,
            output_norm: Vec::new(),
            layers: Vec::with_capacity(cfg.n_layer),
            k_cache: vec![Vec::new(); cfg.n_layer],
            v_cache: vec![Vec::new(); cfg.n_layer],
            n_past: 0,
            n_ctx: n_ctx.clamp(1, cfg.n_ctx_train),
            owned,
            cfg,
            file,
        };
        this.output_norm = this.vector("output_norm.weight")?;
        for i in 0..this.cfg.n_layer {
            let layer = this.layer(i)?;
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
        quant::dequantize(t.ty, self.bytes(t), &mut v).map_err(|e| BackendError::Device(e.to_string()))?;
        Ok(v)
    }

    fn opt_vector(&self, name: &str, present: bool) -> Result<Option<Vec<f32>>, BackendError> {
        if present {
            self.vector(name).map(Some)
        } else {
            Ok(None)
        }
    }

    fn layer(&self, i: usize) -> Result<Layer, BackendError> {
        let c = &self.cfg;
        let n = |s: &str| format!("blk.{i}.{s}");
        let m = |s: &str| matrix(&self.file, &n(s));
        Ok(Layer {
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
            gate: m("ffn_gate.weight")?,
            up: m("ffn_up.weight")?,
            down: m("ffn_down.weight")?,
            post_ffn_norm: self.opt_vector(&n("post_ffw_norm.weight"), c.post_norms)?,
        })
    }

    fn matmul(&self, w: &Matrix, x: &[f32], n_tok: usize) -> Vec<f32> {
        ops::matmul(w.info.ty, self.bytes(&w.info), w.n_in, w.n_out, x, n_tok)
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

    fn run(&mut self, tokens: &[u32]) -> Result<Vec<f32>, BackendError> {
        check_batch(tokens, self.n_past, self.n_ctx, self.cfg.n_vocab)?;
        let n_tok = tokens.len();
        let mut x = self.embed(tokens);
        for il in 0..self.cfg.n_layer {
            x = self.layer_forward(il, x, n_tok);
        }
        self.n_past += n_tok;
        // Only the last position's logits are needed.
        let e = self.cfg.n_embd;
        let mut last = x[(n_tok - 1) * e..].to_vec();
        ops::rms_norm(&mut last, &self.output_norm, self.cfg.rms_eps);
        Ok(self.matmul(&self.output, &last, 1))
    }

    fn layer_forward(&mut self, il: usize, mut x: Vec<f32>, n_tok: usize) -> Vec<f32> {
        let c = &self.cfg;
        let l = &self.layers[il];
        let (hd, kv_dim) = (c.head_dim, c.kv_dim());

        let mut h = x.clone();
        ops::rms_norm(&mut h, &l.attn_norm, c.rms_eps);
        let mut q = self.matmul(&l.q, &h, n_tok);
        let mut k = self.matmul(&l.k, &h, n_tok);
        let mut v = self.matmul(&l.v, &h, n_tok);
        add_bias(&mut q, l.q_bias.as_deref());
        add_bias(&mut k, l.k_bias.as_deref());
        add_bias(&mut v, l.v_bias.as_deref());
        if let (Some(qn), Some(kn)) = (&l.q_norm, &l.k_norm) {
            ops::rms_norm(&mut q, qn, c.rms_eps);
            ops::rms_norm(&mut k, kn, c.rms_eps);
        }
        let lc = &c.layers[il];
        for t in 0..n_tok {
            let pos = self.n_past + t;
            for head in q[t * c.q_dim()..(t + 1) * c.q_dim()].chunks_mut(hd) {
                ops::rope(head, pos, c.rope_dim, lc.rope_base, lc.rope_freq_scale, c.rope_style);
            }
            for head in k[t * kv_dim..(t + 1) * kv_dim].chunks_mut(hd) {
                ops::rope(head, pos, c.rope_dim, lc.rope_base, lc.rope_freq_scale, c.rope_style);
            }
        }
        self.k_cache[il].extend_from_slice(&k);
        self.v_cache[il].extend_from_slice(&v);

        let attn = attention(c, il, &q, &self.k_cache[il], &self.v_cache[il], self.n_past, n_tok);
        let l = &self.layers[il];
        let mut o = self.matmul(&l.o, &attn, n_tok);
        if let Some(w) = &l.post_attn_norm {
            ops::rms_norm(&mut o, w, c.rms_eps);
        }
        x.iter_mut().zip(&o).for_each(|(a, b)| *a += b);

        let mut h = x.clone();
        ops::rms_norm(&mut h, &l.ffn_norm, c.rms_eps);
        let mut g = self.matmul(&l.gate, &h, n_tok);
        let u = self.matmul(&l.up, &h, n_tok);
        let act = match c.activation {
            Activation::Silu => ops::silu,
            Activation::GeluTanh => ops::gelu_tanh,
        };
        g.iter_mut().zip(&u).for_each(|(a, b)| *a = act(*a) * b);
        let mut d = self.matmul(&l.down, &g, n_tok);
        if let Some(w) = &l.post_ffn_norm {
            ops::rms_norm(&mut d, w, c.rms_eps);
        }
        x.iter_mut().zip(&d).for_each(|(a, b)| *a += b);
        x
    }
}

fn add_bias(x: &mut [f32], bias: Option<&[f32]>) {
    if let Some(b) = bias {
        for row in x.chunks_mut(b.len()) {
            row.iter_mut().zip(b).for_each(|(a, b)| *a += b);
        }
    }
}

/// Causal attention of `n_tok` new queries (at positions n_past..) over the whole cache.
/// q: [n_tok, n_head·head_dim]; caches: [pos, kv_dim] / [pos, v_dim]; returns [n_tok, n_head·head_dim_v].
fn attention(c: &ModelConfig, il: usize, q: &[f32], kc: &[f32], vc: &[f32], n_past: usize, n_tok: usize) -> Vec<f32> {
    let (hd, hdv) = (c.head_dim, c.head_dim_v);
    let group = c.n_head / c.n_head_kv;
    let window = c.layers[il].sliding_window.map(|w| w as usize);
    let out_dim = c.n_head * hdv;
    let mut out = vec![0f32; n_tok * out_dim];
    let task = |(idx, o): (usize, &mut [f32])| {
        let (t, h) = (idx / c.n_head, idx % c.n_head);
        let pos = n_past + t;
        let first = window.map_or(0, |w| (pos + 1).saturating_sub(w));
        let kvh = h / group;
        let qh = &q[t * c.q_dim() + h * hd..][..hd];
        let mut scores: Vec<f32> = (first..=pos)
            .map(|j| ops::dot(qh, &kc[j * c.kv_dim() + kvh * hd..][..hd]) * c.attn_scale)
            .collect();
        ops::softmax(&mut scores);
        for (j, p) in (first..=pos).zip(&scores) {
            let vj = &vc[j * c.v_dim() + kvh * hdv..][..hdv];
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

fn matrix(file: &GgufFile, name: &str) -> Result<Matrix, BackendError> {
    let info = file.require_tensor(name)?.clone();
    if info.dims.len() != 2 {
        return Err(BackendError::Device(format!("{name} is not a matrix: {:?}", info.dims)));
    }
    let (n_in, n_out) = (info.dims[0] as usize, info.dims[1] as usize);
    Ok(Matrix { info, n_in, n_out })
}

impl Backend for CpuBackend {
    fn config(&self) -> &ModelConfig {
        &self.cfg
    }
    fn n_ctx(&self) -> usize {
        self.n_ctx
    }
    fn n_past(&self) -> usize {
        self.n_past
    }
    fn forward<'a>(&'a mut self, tokens: &'a [u32]) -> LocalBoxFuture<'a, Result<Vec<f32>, BackendError>> {
        Box::pin(async move { self.run(tokens) })
    }
    fn truncate(&mut self, n: usize) {
        let n = n.min(self.n_past);
        for (k, v) in self.k_cache.iter_mut().zip(&mut self.v_cache) {
            k.truncate(n * self.cfg.kv_dim());
            v.truncate(n * self.cfg.v_dim());
        }
        self.n_past = n;
    }
    fn name(&self) -> String {
        "cpu".into()
    }
}

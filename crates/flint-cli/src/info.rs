//! `flint info`: what a model file holds, validated as the engine would load it.

use std::collections::BTreeMap;

use clap::Args;
use flint::ScalingKind;
use flint::{GgufFile, ModelConfig, Tokenizer};

use crate::Failure;

#[derive(Args)]
pub struct InfoArgs {
    /// Model: a path, a catalog name or a URL.
    #[arg(short = 'm', long = "model")]
    model: String,
    /// Also print every metadata key.
    #[arg(long)]
    metadata: bool,
    /// The memory plan's context: tokens per sequence (0 = the model's training context).
    #[arg(short = 'c', long = "ctx-size", default_value_t = flint::DEFAULT_CTX)]
    ctx_size: usize,
    /// The memory plan's sequences at once (as `flint serve --parallel`).
    #[arg(long, default_value_t = 1)]
    parallel: usize,
    /// The memory plan's KV pool in MB (as `--kv-budget-mb`).
    #[arg(long = "kv-budget-mb", value_name = "MB")]
    kv_budget_mb: Option<u64>,
    /// The device's memory in MB: the plan is checked against it.
    #[arg(long = "device-mem-mb", value_name = "MB")]
    device_mem_mb: Option<u64>,
    #[command(flatten)]
    cache: crate::args::CacheArgs,
}

pub fn info(args: InfoArgs) -> Result<(), Failure> {
    let mut opts = flint::LoadOptions { n_ctx: args.ctx_size, max_seqs: args.parallel, kv_budget_mb: args.kv_budget_mb, ..flint::LoadOptions::default() };
    args.cache.apply(&mut opts)?;
    let path = crate::resolve(&args.model)?;
    let file = GgufFile::open(&path).map_err(|e| Failure::usage(format!("{}: {e}", path.display())))?;
    let cfg = ModelConfig::from_gguf(&file).map_err(|e| Failure::usage(format!("{}: {e}", path.display())))?;
    let tok = Tokenizer::from_metadata(&file.metadata).map_err(|e| Failure::usage(format!("{}: {e}", path.display())))?;
    let md = &file.metadata;
    println!("file          {}", path.display());
    println!("gguf version  {}", file.version);
    if let Ok(Some(name)) = md.opt_str("general.name") {
        println!("name          {name}");
    }
    println!("architecture  {}", cfg.arch);
    println!("vocab         {}", cfg.n_vocab);
    println!("embedding     {}", cfg.n_embd);
    println!("layers        {}", cfg.n_layer);
    println!("heads         {} (kv {}), head size {}", cfg.n_head, cfg.n_head_kv, cfg.head_dim);
    match &cfg.moe {
        Some(m) => println!("feed-forward  {} experts of {} ({:?}), {} used per token", m.n_expert, m.n_ff, cfg.activation, m.n_used),
        None => println!("feed-forward  {} ({:?})", cfg.n_ff, cfg.activation),
    }
    let mut attn = vec![format!("query scale {}", cfg.attn_scale)];
    attn.extend(cfg.qk_norm.then(|| "QK-norm".to_string()));
    attn.extend(cfg.attn_softcap.map(|c| format!("score soft cap {c}")));
    attn.extend(cfg.fused_qkv.then(|| "fused QKV".to_string()));
    println!("attention     {}", attn.join(", "));
    println!("context       {} (trained)", cfg.n_ctx_train);
    println!("rms eps       {}", cfg.rms_eps);
    let mscale = cfg.rope_scaling.mscale;
    let factors = match cfg.rope_scaling.kind {
        _ if cfg.rope_freqs => ", per-dimension frequency factors (rope_freqs.weight)".to_string(),
        ScalingKind::Yarn { factor, orig_ctx } => format!(", YaRN: factor {factor} from {orig_ctx} positions, cos/sin × {mscale}"),
        ScalingKind::LongRope { orig_ctx } => format!(", LongRoPE: long factors past {orig_ctx} positions, cos/sin × {mscale}"),
        ScalingKind::None => String::new(),
    };
    println!("rope          {:?}, {} dims{factors}", cfg.rope_style, cfg.rope_dim);
    // Each kind of layer once, with how many layers are of it and the first few of them.
    let mut kinds: Vec<(String, Vec<usize>)> = Vec::new();
    for (il, l) in cfg.layers.iter().enumerate() {
        let kind = match l.sliding_window {
            Some(w) => format!("local(window {w}, base {})", l.rope_base),
            None => format!("global(base {})", l.rope_base),
        };
        match kinds.iter_mut().find(|(k, _)| *k == kind) {
            Some((_, layers)) => layers.push(il),
            None => kinds.push((kind, vec![il])),
        }
    }
    let kinds: Vec<String> = match kinds.len() {
        1 => vec![kinds[0].0.clone()],
        _ => kinds
            .iter()
            .map(|(k, layers)| {
                let first: Vec<String> = layers.iter().take(3).map(|l| l.to_string()).collect();
                let more = if layers.len() > 3 { ", …" } else { "" };
                format!("{k} ×{} (layers {}{more})", layers.len(), first.join(", "))
            })
            .collect(),
    };
    println!("layer kinds   {}", kinds.join(", "));
    let cap = cfg.final_softcap.map(|c| format!(", soft cap {c}")).unwrap_or_default();
    println!("output        {}{cap}", if cfg.tied_output { "tied to token embedding" } else { "separate matrix" });
    let mut types: BTreeMap<&str, (usize, u64)> = BTreeMap::new();
    for t in &file.tensors {
        let e = types.entry(t.ty.name()).or_default();
        e.0 += 1;
        e.1 += t.n_bytes;
    }
    let types: Vec<String> = types.iter().map(|(k, (n, b))| format!("{k}×{n} ({:.1} MB)", *b as f64 / 1e6)).collect();
    println!("tensors       {} : {}", file.tensors.len(), types.join(", "));
    let kind = md.opt_str("tokenizer.ggml.model").ok().flatten().unwrap_or("?");
    let pre = md.opt_str("tokenizer.ggml.pre").ok().flatten().unwrap_or("-");
    println!(
        "tokenizer     {kind} (pre {pre}), {} tokens, bos {:?}, eos {:?}, add_bos {}",
        tok.vocab_size(),
        tok.bos_id(),
        tok.eos_id(),
        tok.add_bos_default()
    );
    println!("chat template {}", if md.get("tokenizer.chat_template").is_some() { "yes" } else { "no" });
    let plan = flint::memory_plan(&file, &opts).map_err(|e| Failure::usage(format!("{}: {e}", path.display())))?;
    let budget = args.device_mem_mb.map(|mb| mb.saturating_mul(1 << 20));
    println!(
        "memory plan   context {}, {} sequence(s)",
        if args.ctx_size == 0 { cfg.n_ctx_train } else { args.ctx_size.min(cfg.n_ctx_train) },
        args.parallel.max(1)
    );
    for line in plan.describe(budget).lines() {
        println!("  {line}");
    }
    if budget.is_some_and(|b| plan.total() > b) {
        return Err(Failure::usage(format!("the plan needs {:.1} MiB, more than --device-mem-mb gives", plan.total() as f64 / (1u64 << 20) as f64)));
    }
    if args.metadata {
        for k in md.keys() {
            if let Some(v) = md.get(k) {
                println!("  {k} = {}", v.summary());
            }
        }
    }
    Ok(())
}

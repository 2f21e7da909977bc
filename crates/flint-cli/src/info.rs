//! `flint info`: what a model file holds, validated as the engine would load it.

use std::collections::BTreeMap;

use clap::Args;
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
}

pub fn info(args: InfoArgs) -> Result<(), Failure> {
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
    println!("feed-forward  {} ({:?})", cfg.n_ff, cfg.activation);
    println!("context       {} (trained)", cfg.n_ctx_train);
    println!("rms eps       {}", cfg.rms_eps);
    println!("rope          {:?}, {} dims", cfg.rope_style, cfg.rope_dim);
    let mut bases: Vec<String> = cfg
        .layers
        .iter()
        .map(|l| match l.sliding_window {
            Some(w) => format!("local(window {w}, base {})", l.rope_base),
            None => format!("global(base {})", l.rope_base),
        })
        .collect();
    bases.dedup();
    println!("layer kinds   {}", bases.join(", "));
    println!("output        {}", if cfg.tied_output { "tied to token embedding" } else { "separate matrix" });
    let mut types: BTreeMap<&str, (usize, u64)> = BTreeMap::new();
    for t in &file.tensors {
        let e = types.entry(t.ty.name()).or_default();
        e.0 += 1;
        e.1 += t.n_bytes;
    }
    let types: Vec<String> =
        types.iter().map(|(k, (n, b))| format!("{k}×{n} ({:.1} MB)", *b as f64 / 1e6)).collect();
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
    if args.metadata {
        for k in md.keys() {
            if let Some(v) = md.get(k) {
                println!("  {k} = {}", v.summary());
            }
        }
    }
    Ok(())
}

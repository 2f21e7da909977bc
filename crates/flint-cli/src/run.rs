//! `flint run`: complete one prompt and stream the tokens (text or jsonl).

use std::io::{Read, Write};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use clap::{Args, ValueEnum};
use flint::{Engine, Event, GenerateParams, LoadOptions, SamplingParams};
use futures::StreamExt;
use serde_json::json;

use crate::Failure;

#[derive(Clone, Copy, ValueEnum)]
pub enum Format {
    Text,
    Jsonl,
}

#[derive(Clone, Copy, ValueEnum)]
pub enum BackendArg {
    /// WGSL kernels on the best GPU adapter (FLINT_ADAPTER=<name substring> picks one).
    Gpu,
    /// The CPU reference forward pass.
    Cpu,
}

impl BackendArg {
    pub fn kind(self) -> flint::BackendKind {
        match self {
            BackendArg::Gpu => flint::BackendKind::Gpu,
            BackendArg::Cpu => flint::BackendKind::Cpu,
        }
    }
}

#[derive(Args)]
pub struct RunArgs {
    /// Model: a path, a catalog name (gemma-3-270m, qwen2.5-coder-0.5b) or a URL.
    #[arg(short = 'm', long = "model")]
    model: String,
    /// The prompt (or use -f).
    prompt: Option<String>,
    /// Read the prompt from a file, byte for byte (`-` for stdin).
    #[arg(short = 'f', long = "file", conflicts_with = "prompt")]
    file: Option<String>,
    /// Tokens to generate; -1 = until an end-of-generation token or the end of the context.
    #[arg(short = 'n', long = "max-tokens", visible_alias = "n-predict", default_value_t = -1, allow_negative_numbers = true)]
    max_tokens: i64,
    /// Temperature; 0 = greedy.
    #[arg(long = "temp", default_value_t = 0.8, allow_negative_numbers = true)]
    temp: f32,
    /// Top-k; 0 = off.
    #[arg(long = "top-k", default_value_t = 40, allow_negative_numbers = true)]
    top_k: i32,
    /// Top-p (nucleus); 1 = off.
    #[arg(long = "top-p", default_value_t = 0.95, allow_negative_numbers = true)]
    top_p: f32,
    /// Min-p; 0 = off.
    #[arg(long = "min-p", default_value_t = 0.05, allow_negative_numbers = true)]
    min_p: f32,
    /// RNG seed; -1 = random.
    #[arg(long = "seed", default_value_t = -1, allow_negative_numbers = true)]
    seed: i64,
    /// Tokenize the prompt as is (BOS per the model's metadata), no chat template.
    #[arg(long)]
    raw: bool,
    /// Context size in tokens; 0 = the model's training context.
    #[arg(short = 'c', long = "ctx-size", default_value_t = flint::DEFAULT_CTX)]
    ctx_size: usize,
    #[arg(long, value_enum, default_value_t = BackendArg::Gpu)]
    backend: BackendArg,
    #[arg(long, value_enum, default_value_t = Format::Text)]
    format: Format,
}

fn params(args: &RunArgs) -> Result<GenerateParams, Failure> {
    let max_tokens = match args.max_tokens {
        -1 => None,
        n if n >= 1 => Some(n as usize),
        n => return Err(Failure::usage(format!("-n must be -1 (no limit) or at least 1, got {n}"))),
    };
    let seed = match args.seed {
        -1 => None,
        s if s >= 0 => Some(s as u64),
        s => return Err(Failure::usage(format!("--seed must be -1 (random) or non-negative, got {s}"))),
    };
    let sampling = SamplingParams { temperature: args.temp, top_k: args.top_k, top_p: args.top_p, min_p: args.min_p, seed };
    sampling.validate().map_err(Failure::usage)?;
    Ok(GenerateParams { max_tokens, sampling })
}

fn read_prompt(args: &RunArgs) -> Result<String, Failure> {
    match (&args.prompt, &args.file) {
        (Some(p), None) => Ok(p.clone()),
        (None, Some(f)) if f == "-" => {
            let mut s = String::new();
            std::io::stdin().read_to_string(&mut s).map_err(|e| Failure::usage(format!("stdin: {e}")))?;
            Ok(s)
        }
        (None, Some(f)) => std::fs::read_to_string(f).map_err(|e| Failure::usage(format!("{f}: {e}"))),
        _ => Err(Failure::usage("give a prompt or -f FILE")),
    }
}

pub fn run(args: RunArgs) -> Result<(), Failure> {
    let params = params(&args)?;
    let prompt = read_prompt(&args)?;
    let path = crate::resolve(&args.model)?;
    let opts = LoadOptions { backend: args.backend.kind(), n_ctx: args.ctx_size, max_binding_mb: None };
    let mut engine = Engine::load_path(&path, &opts).map_err(|e| Failure::usage(format!("{}: {e}", path.display())))?;
    if !args.raw && engine.file().metadata.get("tokenizer.chat_template").is_some() {
        return Err(Failure::usage(
            "this model has a chat template; chat formatting is not implemented yet, pass --raw to complete the text as is",
        ));
    }
    let ids = engine.tokenize_raw(&prompt).map_err(Failure::usage)?;
    let abort = Arc::new(AtomicBool::new(false));
    let format = args.format;
    futures::executor::block_on(async move {
        let mut stream = engine.generate(ids, params, abort).map_err(Failure::usage)?;
        let mut out = std::io::stdout().lock();
        while let Some(event) = stream.next().await {
            let event = event.map_err(Failure::runtime)?;
            match (format, event) {
                (Format::Text, Event::Token { text, .. }) => write!(out, "{text}"),
                (Format::Jsonl, Event::Token { id, text }) => {
                    writeln!(out, "{}", json!({"token": id, "text": text}))
                }
                (Format::Text, Event::Done { summary: s, text }) => {
                    let r = writeln!(out, "{text}");
                    eprintln!(
                        "\n[{}] prompt {} tok, {:.1} tok/s | generated {} tok, {:.1} tok/s | ttft {:.0} ms",
                        s.finish_reason.as_str(),
                        s.prompt_tokens,
                        s.prefill_tok_s,
                        s.completion_tokens,
                        s.decode_tok_s,
                        s.ttft_ms
                    );
                    r
                }
                (Format::Jsonl, Event::Done { summary: s, text }) => {
                    if !text.is_empty() {
                        let _ = writeln!(out, "{}", json!({"text": text}));
                    }
                    writeln!(
                        out,
                        "{}",
                        json!({
                            "done": true,
                            "finish_reason": s.finish_reason.as_str(),
                            "prompt_tokens": s.prompt_tokens,
                            "completion_tokens": s.completion_tokens,
                            "ttft_ms": round1(s.ttft_ms),
                            "prefill_tok_s": round1(s.prefill_tok_s),
                            "decode_tok_s": round1(s.decode_tok_s),
                        })
                    )
                }
            }
            .and_then(|_| out.flush())
            .map_err(|e| Failure::runtime(format!("stdout: {e}")))?;
        }
        Ok(())
    })
}

fn round1(v: f64) -> f64 {
    (v * 10.0).round() / 10.0
}

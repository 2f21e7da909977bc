//! `flint bench`: load time, prefill and decode speed (median and range over repetitions),
//! time to first token, peak host memory, and decode's effective bandwidth as a share of the
//! device's copy bandwidth measured in the same run.

use clap::{Args, ValueEnum};
use flint::{Engine, LoadOptions};
use serde_json::json;

use crate::run::BackendArg;
use crate::Failure;

#[derive(Clone, Copy, ValueEnum)]
pub enum BenchFormat {
    Text,
    Json,
}

#[derive(Args)]
pub struct BenchArgs {
    /// Model: a path, a catalog name or a URL.
    #[arg(short = 'm', long = "model")]
    model: String,
    /// Prompt tokens to prefill.
    #[arg(short = 'p', long = "prompt-tokens", default_value_t = 128)]
    prompt_tokens: usize,
    /// Tokens to generate after the prompt.
    #[arg(short = 'n', long = "gen-tokens", default_value_t = 64)]
    gen_tokens: usize,
    /// Repetitions (the first is also timed; medians hide its warm-up).
    #[arg(long, default_value_t = 5)]
    reps: usize,
    #[arg(long, value_enum, default_value_t = BackendArg::Gpu)]
    backend: BackendArg,
    #[arg(long, value_enum, default_value_t = BenchFormat::Text)]
    format: BenchFormat,
    /// Also time every kernel of the prompt's prefill (up to 256 tokens) and of one decode step
    /// (GPU timestamp queries) and print where the time goes.
    #[arg(long)]
    profile: bool,
}

struct Stats {
    median: f64,
    min: f64,
    max: f64,
}

fn stats(mut v: Vec<f64>) -> Stats {
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    let median = if n % 2 == 1 { v[n / 2] } else { (v[n / 2 - 1] + v[n / 2]) / 2.0 };
    Stats { median, min: v[0], max: v[n - 1] }
}

fn round2(v: f64) -> f64 {
    (v * 100.0).round() / 100.0
}

fn stats_json(s: &Stats) -> serde_json::Value {
    json!({"median": round2(s.median), "min": round2(s.min), "max": round2(s.max)})
}

/// Peak resident set size of this process in MB (Linux; 0 elsewhere).
fn peak_rss_mb() -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| s.lines().find(|l| l.starts_with("VmHWM:")).map(|l| l.to_string()))
        .and_then(|l| l.split_whitespace().nth(1).and_then(|kb| kb.parse::<f64>().ok()))
        .map_or(0.0, |kb| kb / 1024.0)
}

/// The most prompt tokens a profiled prefill step takes (the GPU backend's prefill chunk).
const PROFILE_MAX_TOKENS: usize = 256;

/// Per-op-kind totals (label, microseconds, dispatches), largest first.
type Profile = Vec<(String, f64, usize)>;

/// Times each op of the prompt's prefill as one step, then (after prefilling the prompt) each
/// op of one decode step.
fn profile_steps(engine: &mut Engine, prompt: &[u32]) -> Result<(Profile, Profile), Failure> {
    let backend = engine.backend_mut();
    let (prefill, decode) = futures::executor::block_on(async {
        backend.truncate(0);
        let prefill = backend.profile(&prompt[..prompt.len().min(PROFILE_MAX_TOKENS)]).await?;
        backend.truncate(0);
        backend.forward(prompt).await?;
        let decode = backend.profile(&prompt[..1]).await?;
        Ok::<_, flint_core::backend::BackendError>((prefill, decode))
    })
    .map_err(Failure::runtime)?;
    Ok((by_kind(prefill), by_kind(decode)))
}

fn by_kind(ops: Vec<(String, f64)>) -> Profile {
    let mut by_kind: Profile = Vec::new();
    for (label, ns) in ops {
        match by_kind.iter_mut().find(|k| k.0 == label) {
            Some(k) => {
                k.1 += ns / 1e3;
                k.2 += 1;
            }
            None => by_kind.push((label, ns / 1e3, 1)),
        }
    }
    by_kind.sort_by(|a, b| b.1.total_cmp(&a.1));
    by_kind
}

fn profile_json(p: &Profile) -> serde_json::Value {
    json!(p.iter().map(|(k, us, n)| json!({"op": k, "us": round2(*us), "dispatches": n})).collect::<Vec<_>>())
}

fn print_profile(what: &str, p: &Profile) {
    let total: f64 = p.iter().map(|r| r.1).sum();
    println!("{what} profile (GPU time, one op per timed pass): {:.1} ms", total / 1e3);
    for (k, us, n) in p {
        println!("  {k:<14} {:>9.1} ms {:>5.1}%  ({n} dispatches)", us / 1e3, 100.0 * us / total);
    }
}

pub fn bench(args: BenchArgs) -> Result<(), Failure> {
    if args.reps == 0 || args.prompt_tokens == 0 || args.gen_tokens == 0 {
        return Err(Failure::usage("-p, -n and --reps must be at least 1"));
    }
    let path = crate::resolve(&args.model)?;
    let opts = LoadOptions { backend: args.backend.kind(), n_ctx: args.prompt_tokens + args.gen_tokens + 1, max_binding_mb: None, kv_budget_mb: None };
    let t0 = std::time::Instant::now();
    let mut engine = Engine::load_path(&path, &opts).map_err(|e| Failure::usage(format!("{}: {e}", path.display())))?;
    let load_s = t0.elapsed().as_secs_f64();
    let prompt = engine.bench_prompt(args.prompt_tokens).map_err(Failure::usage)?;

    let (mut prefill, mut decode, mut ttft) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..args.reps {
        let r = futures::executor::block_on(engine.bench_once(&prompt, args.gen_tokens)).map_err(Failure::runtime)?;
        ttft.push(r.ttft_s * 1e3);
        prefill.push(r.prefill_tok_s);
        decode.push(r.decode_tok_s);
    }
    let copy_gbs = futures::executor::block_on(engine.copy_bandwidth_gbs()).map_err(Failure::runtime)?;
    let profile = if args.profile { Some(profile_steps(&mut engine, &prompt)?) } else { None };
    let (prefill, decode, ttft) = (stats(prefill), stats(decode), stats(ttft));
    let bytes_per_token = engine.bytes_per_decode_token(args.prompt_tokens + args.gen_tokens / 2) as f64;
    let decode_gbs = bytes_per_token * decode.median / 1e9;
    let pct = if copy_gbs > 0.0 { 100.0 * decode_gbs / copy_gbs } else { 0.0 };
    let report = json!({
        "model": args.model,
        "backend": engine.backend_name(),
        "adapter": engine.adapter_name(),
        "prompt_tokens": args.prompt_tokens,
        "gen_tokens": args.gen_tokens,
        "reps": args.reps,
        "load_s": round2(load_s),
        "prefill_tok_s": stats_json(&prefill),
        "decode_tok_s": stats_json(&decode),
        "ttft_ms": stats_json(&ttft),
        "peak_rss_mb": round2(peak_rss_mb()),
        "copy_bandwidth_gbs": round2(copy_gbs),
        "decode_bandwidth_gbs": round2(decode_gbs),
        "decode_bandwidth_pct": round2(pct),
    });
    let mut report = report;
    if let Some((prefill, decode)) = &profile {
        report["prefill_profile_us"] = profile_json(prefill);
        report["decode_profile_us"] = profile_json(decode);
    }
    match args.format {
        BenchFormat::Json => println!("{report}"),
        BenchFormat::Text => {
            println!("model      {} on {} ({})", args.model, engine.backend_name(), engine.adapter_name());
            println!("load       {load_s:.2} s");
            println!(
                "prefill    {:.2} tok/s (min {:.2}, max {:.2}) over {} tokens",
                prefill.median, prefill.min, prefill.max, args.prompt_tokens
            );
            println!("decode     {:.2} tok/s (min {:.2}, max {:.2}) over {} tokens", decode.median, decode.min, decode.max, args.gen_tokens);
            println!("ttft       {:.1} ms (min {:.1}, max {:.1})", ttft.median, ttft.min, ttft.max);
            println!("peak rss   {:.0} MB", peak_rss_mb());
            println!("bandwidth  decode {decode_gbs:.2} GB/s = {pct:.1}% of measured copy bandwidth {copy_gbs:.2} GB/s");
            if let Some((prefill, decode)) = &profile {
                print_profile(&format!("prefill ({} tokens)", args.prompt_tokens.min(PROFILE_MAX_TOKENS)), prefill);
                print_profile("decode step", decode);
            }
        }
    }
    Ok(())
}

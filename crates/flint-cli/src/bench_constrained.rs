//! `flint bench -j/-jf/--grammar/--grammar-file`: one greedy stream with the constraint and
//! one without, alternating, `--reps` times each after an untimed warm-up of each: both
//! decode speeds and their ratio, and the mask time per token (median and p99), measured by
//! replaying the constrained reply's tokens through a new constraint on the CPU (the work
//! the engine does for each of its steps).

use flint::{Constrained, Engine, Event, GenerateParams, Input, LoadOptions, Request, SamplingParams, Summary};
use serde_json::json;

use crate::bench::{round2, stats, stats_json, BenchArgs, BenchFormat};
use crate::Failure;

/// The prompt when no -f is given: a request for the kind of text the constraint holds.
const DEFAULT_PROMPT: &str = "Reply with a JSON object describing a city: its name, country, population and three sights.";

/// The greedy reply's ids and summary for `prompt` under `constraint`.
fn once(engine: &Engine, prompt: &[u32], gen_tokens: usize, constraint: Option<&Constrained>) -> Result<(Vec<u32>, Summary), Failure> {
    let params = GenerateParams { max_tokens: Some(gen_tokens), sampling: SamplingParams::greedy(), ..Default::default() };
    let mut req = Request::new(Input::Tokens(prompt.to_vec()), params);
    req.constraint = constraint.cloned();
    let mut handle = engine.submit(req).map_err(|e| Failure::usage(e.to_string()))?;
    futures::executor::block_on(async {
        let mut ids = Vec::new();
        while let Some(ev) = futures::StreamExt::next(&mut handle).await {
            match ev.map_err(Failure::runtime)? {
                Event::Token { id, .. } => ids.push(id),
                Event::Done { summary, .. } => return Ok((ids, summary)),
            }
        }
        Err(Failure::runtime("the reply ended without a summary"))
    })
}

/// Microseconds of each mask computed along `ids` (the engine computes one per step).
fn mask_times_us(engine: &Engine, constraint: &Constrained, ids: &[u32]) -> Result<Vec<f64>, Failure> {
    let constrainer = engine.info().constrainer().map_err(|e| Failure::usage(e.to_string()))?;
    let mut c = constrainer.constraint(&constraint.grammar, engine.config().n_vocab).map_err(|e| Failure::usage(e.to_string()))?;
    let mut times = Vec::with_capacity(ids.len());
    for &id in ids {
        let t0 = std::time::Instant::now();
        c.mask().map_err(Failure::runtime)?;
        times.push(t0.elapsed().as_secs_f64() * 1e6);
        c.consume(id).map_err(Failure::runtime)?;
    }
    Ok(times)
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

pub fn bench_constrained(args: &BenchArgs, constraint: Constrained) -> Result<(), Failure> {
    if !args.concurrency.is_empty() || args.profile || args.spec.is_on() {
        return Err(Failure::usage("a constrained bench is one stream: no --concurrency, --profile or --spec-type"));
    }
    let text = match &args.file {
        Some(f) => std::fs::read_to_string(f).map_err(|e| Failure::usage(format!("{}: {e}", f.display())))?,
        None => DEFAULT_PROMPT.to_string(),
    };
    let path = crate::resolve(&args.model)?;
    let n_ctx = 4096;
    let opts = LoadOptions {
        n_ctx,
        max_seqs: 1,
        max_batch_tokens: args.max_batch_tokens,
        kv_budget_positions: Some(n_ctx + 16),
        ..crate::args::load_options(args.backend, &args.device, None)?
    };
    let engine = Engine::load_path(&path, &opts).map_err(|e| Failure::usage(format!("{}: {e}", path.display())))?;
    engine.check_constraint(&constraint).map_err(|e| Failure::usage(e.to_string()))?;
    let prompt =
        if args.raw || !engine.has_chat_template() { engine.tokenize_raw(&text) } else { engine.tokenize_chat(&[json!({"role": "user", "content": text})]) }
            .map_err(|e| Failure::usage(e.to_string()))?;
    if prompt.len() + args.gen_tokens + 1 > n_ctx {
        return Err(Failure::usage(format!("the prompt ({} tokens) and -n {} do not fit the bench's {n_ctx}-token context", prompt.len(), args.gen_tokens)));
    }
    once(&engine, &prompt, args.gen_tokens.min(8), None)?;
    once(&engine, &prompt, args.gen_tokens.min(8), Some(&constraint))?;
    let (mut free, mut held, mut reply) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..args.reps {
        held.push(once(&engine, &prompt, args.gen_tokens, Some(&constraint))?);
        reply = held.last().map(|r| r.0.clone()).unwrap_or_default();
        // The free stream generates as many tokens as the constrained one did.
        free.push(once(&engine, &prompt, reply.len().max(2), None)?);
    }
    let decode = |runs: &[(Vec<u32>, Summary)]| stats(runs.iter().map(|r| r.1.decode_tok_s).collect());
    let (f, h) = (decode(&free), decode(&held));
    let ratio = if f.median > 0.0 { h.median / f.median } else { 0.0 };
    let mut masks = mask_times_us(&engine, &constraint, &reply)?;
    masks.sort_by(|a, b| a.total_cmp(b));
    let (median_us, p99_us) = (percentile(&masks, 0.5), percentile(&masks, 0.99));
    let finish = held.last().map_or("none", |r| r.1.finish_reason.as_str());
    let report = json!({
        "model": args.model,
        "backend": engine.backend_name(),
        "adapter": engine.adapter_name(),
        "constraint": constraint.field,
        "prompt_tokens": prompt.len(),
        "reply_tokens": reply.len(),
        "finish_reason": finish,
        "reps": args.reps,
        "free_decode_tok_s": stats_json(&f),
        "constrained_decode_tok_s": stats_json(&h),
        "ratio": round2(ratio),
        "mask_us": {"median": round2(median_us), "p99": round2(p99_us), "tokens": masks.len()},
        "vocab": engine.config().n_vocab,
    });
    match args.format {
        BenchFormat::Json => println!("{report}"),
        BenchFormat::Text => {
            println!("model        {} on {} ({})", args.model, engine.backend_name(), engine.adapter_name());
            println!("prompt       {} tokens; reply {} tokens ({finish}) held to {}", prompt.len(), reply.len(), constraint.field);
            println!("free         decode {:.2} tok/s (min {:.2}, max {:.2})", f.median, f.min, f.max);
            println!("constrained  decode {:.2} tok/s (min {:.2}, max {:.2}) | {ratio:.2}x free", h.median, h.min, h.max);
            println!("mask         {median_us:.0} µs median, {p99_us:.0} µs p99 per token ({} tokens, vocabulary {})", masks.len(), engine.config().n_vocab);
        }
    }
    Ok(())
}

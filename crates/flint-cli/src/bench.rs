//! `flint bench`: load time, prefill and decode speed (median and range over repetitions),
//! time to first token, peak host memory, and decode's effective bandwidth as a share of the
//! device's copy bandwidth measured in the same run. With `--concurrency`, the aggregate
//! decode speed of that many streams at once, as a ratio to one stream in the same run.

use clap::{Args, ValueEnum};
use flint::{Engine, LoadOptions, OpTimes, StreamRun};
use serde_json::json;

use crate::args::BackendArg;
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
    pub(crate) model: String,
    /// Prompt tokens to prefill.
    #[arg(short = 'p', long = "prompt-tokens", default_value_t = 128)]
    pub(crate) prompt_tokens: usize,
    /// Tokens to generate after the prompt.
    #[arg(short = 'n', long = "gen-tokens", default_value_t = 64)]
    pub(crate) gen_tokens: usize,
    /// Tokens already in the context (llama-bench's -d): each repetition first runs a prompt
    /// of this many tokens, untimed, and keeps it in the prefix cache; the timed prompt
    /// continues it, so prefill and decode are measured at this depth (one stream).
    #[arg(short = 'd', long = "depth", default_value_t = 0)]
    pub(crate) depth: usize,
    /// Tokens one forward step runs (llama-bench's -ub, `flint serve --max-batch-tokens`): a
    /// longer prompt is prefilled in steps of this many.
    #[arg(long = "max-batch-tokens", default_value_t = flint::DEFAULT_MAX_BATCH_TOKENS, value_parser = step_tokens)]
    pub(crate) max_batch_tokens: usize,
    /// Repetitions (the first is also timed; medians hide its warm-up).
    #[arg(long, default_value_t = 5)]
    pub(crate) reps: usize,
    #[arg(long, value_enum, default_value_t = BackendArg::Gpu)]
    pub(crate) backend: BackendArg,
    #[command(flatten)]
    pub(crate) device: crate::args::DeviceArgs,
    #[arg(long, value_enum, default_value_t = BenchFormat::Text)]
    pub(crate) format: BenchFormat,
    /// Also time every kernel of the prompt's prefill (one step, up to --max-batch-tokens) and
    /// of decode steps of 1, 8 and 9 sequences (at most --max-batch-tokens) with GPU timestamp
    /// queries, and print where the time goes.
    #[arg(long)]
    pub(crate) profile: bool,
    /// Streams submitted at once, e.g. 1,4,8 (1 always runs): aggregate decode speed per level.
    #[arg(long, value_delimiter = ',', value_name = "N,...")]
    pub(crate) concurrency: Vec<usize>,
    /// With --spec-type: the prompt, read from FILE (a user message through the chat template
    /// unless --raw). Required there: the synthetic prompt repeats one sentence, which would
    /// inflate acceptance.
    #[arg(short = 'f', long = "file", value_name = "FILE")]
    pub(crate) file: Option<std::path::PathBuf>,
    /// With -f: tokenize the file as is, no chat template.
    #[arg(long, requires = "file")]
    pub(crate) raw: bool,
    /// `--spec-type ngram` runs the -f prompt with and without speculation in one run
    /// (interleaved) and reports both decode speeds, their ratio, the acceptance rate and the
    /// mean tokens per decode step.
    #[command(flatten)]
    pub(crate) spec: crate::args::SpecArgs,
    /// `-j/-jf/--grammar/--grammar-file`: one stream with the constraint and one without, in
    /// one run, both decode speeds and the mask time per token (the prompt: -f, or a request
    /// for a JSON object).
    #[command(flatten)]
    pub(crate) grammar: crate::args::GrammarArgs,
}

/// Decode step sizes `--profile` times.
const PROFILE_DECODE_SIZES: [usize; 3] = [1, 8, 9];

pub(crate) struct Stats {
    pub median: f64,
    pub min: f64,
    pub max: f64,
}

pub(crate) fn stats(mut v: Vec<f64>) -> Stats {
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    let median = if n % 2 == 1 { v[n / 2] } else { (v[n / 2 - 1] + v[n / 2]) / 2.0 };
    Stats { median, min: v[0], max: v[n - 1] }
}

pub(crate) fn round2(v: f64) -> f64 {
    (v * 100.0).round() / 100.0
}

pub(crate) fn stats_json(s: &Stats) -> serde_json::Value {
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

/// Restarts the peak RSS count (Linux: writing 5 to clear_refs resets VmHWM to the current
/// RSS), so that a later `peak_rss_mb` is the peak since now; false where it cannot.
fn reset_peak_rss() -> bool {
    std::fs::write("/proc/self/clear_refs", "5").is_ok()
}

/// The most tokens `--max-batch-tokens` takes: a step's activations grow with it (a 7B's
/// feed-forward rows at 8192 tokens are 620 MB), and no GPU gains past llama.cpp's largest
/// usual micro-batch by far.
const MOST_STEP_TOKENS: usize = 8192;

fn step_tokens(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(n) if (1..=MOST_STEP_TOKENS).contains(&n) => Ok(n),
        _ => Err(format!("expected a count from 1 to {MOST_STEP_TOKENS}")),
    }
}

/// Per-op-kind totals (label, microseconds, dispatches), largest first.
type Profile = Vec<(String, f64, usize)>;

/// Times each op of the prompt's prefill as one step (at most `step` tokens, the engine's step
/// budget), then of decode steps of each size in [`PROFILE_DECODE_SIZES`] up to `step` (a step
/// of n sequences is n tokens); each decode profile with its sequences.
fn profile_steps(engine: &Engine, prompt: &[u32], step: usize) -> Result<(Profile, Vec<(usize, Profile)>), Failure> {
    let prompt = &prompt[..prompt.len().min(step)];
    let mut sizes: Vec<usize> = PROFILE_DECODE_SIZES.iter().map(|&n| n.min(step)).collect();
    sizes.dedup();
    let (prefill, decodes) = futures::executor::block_on(engine.profile(prompt, &sizes)).map_err(Failure::runtime)?;
    Ok((by_kind(prefill), sizes.into_iter().zip(decodes.into_iter().map(by_kind)).collect()))
}

fn by_kind(ops: OpTimes) -> Profile {
    let mut by_kind: Profile = Vec::new();
    for op in ops {
        let n = op.dispatches as usize;
        match by_kind.iter_mut().find(|k| k.0 == op.op) {
            Some(k) => {
                k.1 += op.ns / 1e3;
                k.2 += n;
            }
            None => by_kind.push((op.op, op.ns / 1e3, n)),
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
    let ops: usize = p.iter().map(|r| r.2).sum();
    println!("{what} profile (GPU time, one op per timed pass): {:.1} ms in {ops} dispatches", total / 1e3);
    for (k, us, n) in p {
        println!("  {k:<18} {:>9.1} ms {:>5.1}%  ({n} dispatches)", us / 1e3, 100.0 * us / total);
    }
}

/// One concurrency level's figures over the repetitions.
struct Level {
    concurrency: usize,
    aggregate: Stats,
    /// Aggregate decode once every stream has its first token (see [`steady_tok_s`]).
    steady: Stats,
    per_stream: Stats,
    ttft: Stats,
    /// Peak RSS while this level ran (MB): the largest over repetitions after the first (the
    /// first compiles kernels), or the first when there is one; 0 where it cannot be told.
    peak_rss_mb: f64,
    /// The most Rust heap a run of this level added over what was live when it started (MB),
    /// over the same repetitions: what that many sequences cost on the host, exactly.
    heap_growth_mb: f64,
    /// Its overlapped steps over every repetition.
    overlap: Option<OverlapReport>,
}

/// `n` streams at once, `reps` times: aggregate decode tok/s (tokens after each stream's
/// first, summed, over the time from the first first token to the last token), every
/// stream's own decode tok/s and time to first token.
/// Every level's repetitions, interleaved (1, 4, 8, 1, 4, 8, ...), so that whatever the
/// machine does over the run reaches every level alike and the ratios compare like with like.
/// Also returns the process's peak RSS over the levels, which the per-level restarts would
/// otherwise hide from the run's overall figure.
fn run_levels(engine: &Engine, levels: &[usize], args: &BenchArgs) -> Result<(Vec<Level>, f64), Failure> {
    let prompts = levels
        .iter()
        .map(|&n| (0..n).map(|i| engine.bench_prompt(args.prompt_tokens, i)).collect::<Result<Vec<_>, _>>())
        .collect::<Result<Vec<_>, _>>()
        .map_err(Failure::usage)?;
    let mut samples = vec![(Vec::new(), Vec::new(), Vec::new(), Vec::new(), 0.0, 0.0); levels.len()];
    let mut overlaps = vec![flint::Overlap::default(); levels.len()];
    let mut process_peak = peak_rss_mb();
    for rep in 0..args.reps {
        for ((p, (agg, steady, per, ttft, rss, heap)), overlap) in prompts.iter().zip(samples.iter_mut()).zip(overlaps.iter_mut()) {
            let reset = reset_peak_rss();
            let heap_before = crate::heap::live_mb();
            crate::heap::reset_peak();
            let before = overlap_now(engine)?;
            let runs: Vec<StreamRun> = futures::executor::block_on(engine.bench_streams(p, args.gen_tokens)).map_err(Failure::runtime)?;
            *overlap = *overlap + (overlap_now(engine)? - before);
            let peak = peak_rss_mb();
            process_peak = process_peak.max(peak);
            if rep > 0 || args.reps == 1 {
                if reset {
                    *rss = f64::max(*rss, peak);
                }
                *heap = f64::max(*heap, crate::heap::peak_mb() - heap_before);
            }
            let start = runs.iter().map(|r| r.first_ms).fold(f64::INFINITY, f64::min);
            let end = runs.iter().map(|r| r.last_ms).fold(0.0, f64::max);
            let tokens: usize = runs.iter().map(|r| r.tokens.saturating_sub(1)).sum();
            agg.push(if end > start { tokens as f64 * 1e3 / (end - start) } else { 0.0 });
            steady.push(steady_tok_s(&runs));
            per.extend(runs.iter().map(|r| r.decode_tok_s()));
            ttft.extend(runs.iter().map(|r| r.first_ms));
        }
    }
    let levels = levels
        .iter()
        .zip(samples)
        .zip(overlaps)
        .map(|((&n, (agg, steady, per, ttft, rss, heap)), overlap)| Level {
            concurrency: n,
            aggregate: stats(agg),
            steady: stats(steady),
            per_stream: stats(per),
            ttft: stats(ttft),
            peak_rss_mb: rss,
            heap_growth_mb: heap,
            overlap: OverlapReport::of(overlap),
        })
        .collect();
    Ok((levels, process_peak))
}

/// Tokens that arrived after every stream had its first, over the time from then to the last
/// token: the decode phase alone, once every prompt is in (llama-batched-bench's S_TG). The
/// `aggregate` window starts at the first first token, so with more streams than one prompt
/// step takes it also holds the later prompts' prefill, which one stream's window never does.
/// For one stream the two are the same figure.
fn steady_tok_s(runs: &[StreamRun]) -> f64 {
    let start = runs.iter().map(|r| r.first_ms).fold(0.0, f64::max);
    let end = runs.iter().map(|r| r.last_ms).fold(0.0, f64::max);
    let tokens = runs.iter().flat_map(|r| &r.token_ms).filter(|&&t| t > start).count();
    if end > start {
        tokens as f64 * 1e3 / (end - start)
    } else {
        0.0
    }
}

pub fn bench(args: BenchArgs) -> Result<(), Failure> {
    if args.reps == 0 || args.prompt_tokens == 0 || args.gen_tokens == 0 {
        return Err(Failure::usage("-p, -n and --reps must be at least 1"));
    }
    if args.concurrency.contains(&0) {
        return Err(Failure::usage("--concurrency levels must be at least 1"));
    }
    if let Some(constraint) = args.grammar.constraint()? {
        return crate::bench_constrained::bench_constrained(&args, constraint);
    }
    let spec = args.spec.config()?;
    if args.spec.is_on() {
        return bench_spec(&args, spec);
    }
    if args.file.is_some() {
        return Err(Failure::usage("-f is for --spec-type and constrained runs; plain runs use the synthetic -p prompt"));
    }
    let mut levels: Vec<usize> = std::iter::once(1).chain(args.concurrency.iter().copied()).collect();
    levels.sort_unstable();
    levels.dedup();
    let most = *levels.last().unwrap_or(&1);
    let path = crate::resolve(&args.model)?;
    if args.depth > 0 && (!args.concurrency.is_empty() || args.profile) {
        return Err(Failure::usage("-d/--depth measures one stream: drop --concurrency and --profile"));
    }
    let n_ctx = args.depth + args.prompt_tokens + args.gen_tokens + 1;
    let max_seqs = most.max(if args.profile { PROFILE_DECODE_SIZES[2] } else { 1 }).max(flint::DEFAULT_MAX_SEQS);
    // Room for every stream's whole context at once (and the profile's forks), plus a quarter.
    let ctx_positions = n_ctx.next_multiple_of(16);
    let mut positions = most * ctx_positions + 16;
    if args.profile {
        positions = positions.max(ctx_positions + 16 * (PROFILE_DECODE_SIZES[2] + 1));
    }
    let opts = LoadOptions {
        n_ctx,
        max_seqs,
        max_batch_tokens: args.max_batch_tokens,
        kv_budget_positions: Some(positions + positions / 4),
        ..crate::args::load_options(args.backend, &args.device, None)?
    };
    let t0 = std::time::Instant::now();
    let engine = Engine::load_path(&path, &opts).map_err(|e| Failure::usage(format!("{}: {e}", path.display())))?;
    let load_s = t0.elapsed().as_secs_f64();
    // At a depth, the timed prompt is the depth's tokens and then -p more.
    let prompt = engine.bench_prompt(args.depth + args.prompt_tokens, 0).map_err(Failure::usage)?;
    // A model split over several devices is measured against the first device alone, in the
    // same run, repetitions interleaved.
    let one = match engine.info().parts.len() {
        0 | 1 => None,
        _ => {
            let first = opts.device.as_deref().and_then(|d| d.split(',').next()).map(str::to_string);
            let one_opts = LoadOptions { device: first, split: flint::SplitOptions::default(), ..opts.clone() };
            Some(Engine::load_path(&path, &one_opts).map_err(|e| Failure::usage(format!("{} on one device: {e}", path.display())))?)
        }
    };

    let (mut prefill, mut decode, mut ttft, mut prefilled) = (Vec::new(), Vec::new(), Vec::new(), 0);
    let (mut one_prefill, mut one_decode) = (Vec::new(), Vec::new());
    let overlap_before = overlap_now(&engine)?;
    for _ in 0..args.reps {
        let r = futures::executor::block_on(engine.bench_at_depth(&prompt, args.depth, args.gen_tokens)).map_err(Failure::runtime)?;
        ttft.push(r.ttft_s * 1e3);
        prefilled = r.prefilled;
        prefill.push(r.prefill_tok_s);
        decode.push(r.decode_tok_s);
        if let Some(one) = &one {
            let r = futures::executor::block_on(one.bench_at_depth(&prompt, args.depth, args.gen_tokens)).map_err(Failure::runtime)?;
            one_prefill.push(r.prefill_tok_s);
            one_decode.push(r.decode_tok_s);
        }
    }
    let overlap = OverlapReport::of(overlap_now(&engine)? - overlap_before);
    let (concurrency, levels_peak) = if args.concurrency.is_empty() { (Vec::new(), 0.0) } else { run_levels(&engine, &levels, &args)? };
    let split = match &one {
        Some(one) => Some(split_report(&engine, one, stats(one_prefill), stats(one_decode), &concurrency, &levels, &args)?),
        None => None,
    };
    let copy_gbs = futures::executor::block_on(engine.copy_bandwidth_gbs()).map_err(Failure::runtime)?;
    let profile = if args.profile { Some(profile_steps(&engine, &prompt, args.max_batch_tokens)?) } else { None };
    let (prefill, decode, ttft) = (stats(prefill), stats(decode), stats(ttft));
    let peak_rss = peak_rss_mb().max(levels_peak);
    let bytes_per_token = engine.bytes_per_decode_token(args.depth + args.prompt_tokens + args.gen_tokens / 2) as f64;
    let decode_gbs = bytes_per_token * decode.median / 1e9;
    let pct = if copy_gbs > 0.0 { 100.0 * decode_gbs / copy_gbs } else { 0.0 };
    let base = concurrency.first().map_or(0.0, |l| l.aggregate.median);
    let ratio = |l: &Level| if base > 0.0 { l.aggregate.median / base } else { 0.0 };
    let steady_base = concurrency.first().map_or(0.0, |l| l.steady.median);
    let steady_ratio = |l: &Level| if steady_base > 0.0 { l.steady.median / steady_base } else { 0.0 };
    let mut report = json!({
        "model": args.model,
        "backend": engine.backend_name(),
        "adapter": engine.adapter_name(),
        "prompt_tokens": args.prompt_tokens,
        "gen_tokens": args.gen_tokens,
        "max_batch_tokens": args.max_batch_tokens,
        "depth": args.depth,
        "prefilled_tokens": prefilled,
        "reps": args.reps,
        "load_s": round2(load_s),
        "prefill_tok_s": stats_json(&prefill),
        "decode_tok_s": stats_json(&decode),
        "ttft_ms": stats_json(&ttft),
        "peak_rss_mb": round2(peak_rss),
        "copy_bandwidth_gbs": round2(copy_gbs),
        "decode_bandwidth_gbs": round2(decode_gbs),
        "decode_bandwidth_pct": round2(pct),
    });
    if let Some(o) = &overlap {
        report["overlap"] = o.json();
    }
    if !concurrency.is_empty() {
        report["concurrency"] = json!(concurrency
            .iter()
            .map(|l| json!({
                "concurrency": l.concurrency,
                "aggregate_decode_tok_s": stats_json(&l.aggregate),
                "per_stream_decode_tok_s": stats_json(&l.per_stream),
                "ttft_ms": stats_json(&l.ttft),
                "ratio_to_1": round2(ratio(l)),
                "steady_decode_tok_s": stats_json(&l.steady),
                "steady_ratio_to_1": round2(steady_ratio(l)),
                "peak_rss_mb": round2(l.peak_rss_mb),
                "heap_growth_mb": round2(l.heap_growth_mb),
                "overlap": l.overlap.as_ref().map(OverlapReport::json),
            }))
            .collect::<Vec<_>>());
    }
    if let Some(split) = &split {
        report["split"] = split.json(&prefill, &decode);
    }
    // The GPU kernels' shape knobs this run took (the device checked them at load).
    let tune = std::env::var("FLINT_TUNE").ok().filter(|t| !t.trim().is_empty());
    if let Some(t) = &tune {
        report["tune"] = json!(t);
    }
    if let Some((prefill, decodes)) = &profile {
        report["prefill_profile_us"] = profile_json(prefill);
        report["decode_profile_us"] = json!(decodes.iter().map(|(n, p)| json!({"sequences": n, "ops": profile_json(p)})).collect::<Vec<_>>());
    }
    match args.format {
        BenchFormat::Json => println!("{report}"),
        BenchFormat::Text => {
            println!("model      {} on {} ({})", args.model, engine.backend_name(), engine.adapter_name());
            if let Some(t) = &tune {
                println!("tune       {t}");
            }
            println!("load       {load_s:.2} s");
            let at = if args.depth > 0 { format!(" at depth {}", args.depth) } else { String::new() };
            println!(
                "prefill    {:.2} tok/s (min {:.2}, max {:.2}) over {} tokens{at}, steps of up to {}",
                prefill.median, prefill.min, prefill.max, args.prompt_tokens, args.max_batch_tokens
            );
            println!("decode     {:.2} tok/s (min {:.2}, max {:.2}) over {} tokens{at}", decode.median, decode.min, decode.max, args.gen_tokens);
            println!("ttft       {:.1} ms (min {:.1}, max {:.1})", ttft.median, ttft.min, ttft.max);
            println!("peak rss   {peak_rss:.0} MB");
            println!("bandwidth  decode {decode_gbs:.2} GB/s = {pct:.1}% of measured copy bandwidth {copy_gbs:.2} GB/s");
            if let Some(o) = &overlap {
                o.print("overlap    ");
            }
            if !concurrency.is_empty() {
                println!("concurrency  aggregate decode tok/s (min, max) | ratio to 1 | all streams decoding tok/s (min, max) | ratio to 1 | per stream tok/s | ttft ms | peak rss MB | heap growth MB");
                for l in &concurrency {
                    println!(
                        "  {:>3}      {:>8.2} ({:.2}, {:.2}) | {:.2}x | {:>8.2} ({:.2}, {:.2}) | {:.2}x | {:>7.2} ({:.2}, {:.2}) | {:>8.1} ({:.1}, {:.1}) | {:.0} | {:.2}",
                        l.concurrency,
                        l.aggregate.median,
                        l.aggregate.min,
                        l.aggregate.max,
                        ratio(l),
                        l.steady.median,
                        l.steady.min,
                        l.steady.max,
                        steady_ratio(l),
                        l.per_stream.median,
                        l.per_stream.min,
                        l.per_stream.max,
                        l.ttft.median,
                        l.ttft.min,
                        l.ttft.max,
                        l.peak_rss_mb,
                        l.heap_growth_mb
                    );
                }
                for l in &concurrency {
                    if let Some(o) = &l.overlap {
                        o.print(&format!("  {:>3}      overlap ", l.concurrency));
                    }
                }
            }
            if let Some(split) = &split {
                split.print(&prefill, &decode);
            }
            if let Some((prefill, decodes)) = &profile {
                print_profile(&format!("prefill ({} tokens)", args.prompt_tokens.min(args.max_batch_tokens)), prefill);
                for (n, p) in decodes {
                    print_profile(&format!("decode step of {n} sequence{}", if *n == 1 { "" } else { "s" }), p);
                }
            }
        }
    }
    Ok(())
}

/// The host's time on the one-stream runs' overlapped steps (the engine's
/// [`flint::Overlap`]), per step. The device runs each step while the host works on the
/// next, so waiting near zero means the host bounds decode, and more means the device does.
struct OverlapReport {
    steps: u64,
    submit_ms: f64,
    wait_ms: f64,
    other_ms: f64,
}

/// The engine's overlapped-step counts now.
fn overlap_now(engine: &Engine) -> Result<flint::Overlap, Failure> {
    Ok(futures::executor::block_on(engine.stats()).map_err(Failure::runtime)?.overlapped)
}

impl OverlapReport {
    /// Per step of the counts `o` of some runs; None if no step overlapped (a backend or a
    /// request that does not overlap).
    fn of(o: flint::Overlap) -> Option<OverlapReport> {
        let per_step = |us: u64| us as f64 / 1e3 / o.steps as f64;
        (o.steps > 0).then(|| OverlapReport { steps: o.steps, submit_ms: per_step(o.submit_us), wait_ms: per_step(o.wait_us), other_ms: per_step(o.other_us) })
    }

    fn json(&self) -> serde_json::Value {
        json!({
            "steps": self.steps,
            "submit_ms_per_step": round3(self.submit_ms),
            "wait_ms_per_step": round3(self.wait_ms),
            "other_host_ms_per_step": round3(self.other_ms),
        })
    }

    /// One line, after `what` ("overlap    " for the one-stream runs).
    fn print(&self, what: &str) {
        println!(
            "{what}{} steps, each: submit {:.3} ms, wait for the device {:.3} ms, other host work {:.3} ms",
            self.steps, self.submit_ms, self.wait_ms, self.other_ms
        );
    }
}

/// A split model against its first device alone, measured in the same run.
struct SplitReport {
    parts: Vec<flint::ModelPart>,
    one_adapter: String,
    one_prefill: Stats,
    one_decode: Stats,
    /// Per concurrency level: the split's aggregate decode tok/s and the one device's.
    levels: Vec<(usize, f64, f64)>,
    /// Per boundary, the host's cost of carrying one decode row across, and the prompt's rows.
    decode_copy_ms: Vec<f64>,
    prefill_copy_ms: Vec<f64>,
    n_embd: usize,
}

/// Boundary crossings timed for each figure.
const COPY_REPS: usize = 20;

/// `split_levels`: the split's concurrency levels, measured; the one device's are now.
fn split_report(
    engine: &Engine,
    one: &Engine,
    one_prefill: Stats,
    one_decode: Stats,
    split_levels: &[Level],
    levels: &[usize],
    args: &BenchArgs,
) -> Result<SplitReport, Failure> {
    let mut level_pairs = Vec::new();
    if !split_levels.is_empty() {
        let (one_levels, _) = run_levels(one, levels, args)?;
        level_pairs = split_levels.iter().zip(&one_levels).map(|(s, o)| (s.concurrency, s.aggregate.median, o.aggregate.median)).collect();
    }
    let copy = |rows: usize| futures::executor::block_on(engine.boundary_copy_ms(rows, COPY_REPS)).map_err(Failure::runtime);
    Ok(SplitReport {
        parts: engine.info().parts.clone(),
        one_adapter: one.adapter_name(),
        one_prefill,
        one_decode,
        levels: level_pairs,
        decode_copy_ms: copy(1)?,
        prefill_copy_ms: copy(args.prompt_tokens.min(args.max_batch_tokens))?,
        n_embd: engine.config().n_embd,
    })
}

fn ratio_of(a: f64, b: f64) -> f64 {
    if b > 0.0 {
        a / b
    } else {
        0.0
    }
}

impl SplitReport {
    fn json(&self, prefill: &Stats, decode: &Stats) -> serde_json::Value {
        json!({
            "parts": self.parts.iter().map(|p| json!({"adapter": p.adapter, "layers": [p.layers.start, p.layers.end]})).collect::<Vec<_>>(),
            "one_device": self.one_adapter,
            "one_device_prefill_tok_s": stats_json(&self.one_prefill),
            "one_device_decode_tok_s": stats_json(&self.one_decode),
            "prefill_ratio": round2(ratio_of(prefill.median, self.one_prefill.median)),
            "decode_ratio": round2(ratio_of(decode.median, self.one_decode.median)),
            "concurrency": self.levels.iter().map(|(n, s, o)| json!({"concurrency": n, "aggregate_decode_tok_s": round2(*s), "one_device_aggregate_decode_tok_s": round2(*o), "ratio": round2(ratio_of(*s, *o))})).collect::<Vec<_>>(),
            "boundary_bytes_per_token": self.n_embd * 4,
            "boundary_copy_ms_decode_row": self.decode_copy_ms.iter().map(|&m| round3(m)).collect::<Vec<_>>(),
            "boundary_copy_ms_prompt": self.prefill_copy_ms.iter().map(|&m| round3(m)).collect::<Vec<_>>(),
        })
    }

    fn print(&self, prefill: &Stats, decode: &Stats) {
        let parts: Vec<String> = self.parts.iter().map(|p| format!("layers {}..{} on {}", p.layers.start, p.layers.end, p.adapter)).collect();
        println!("split      {}", parts.join("; "));
        println!(
            "vs one     {}: prefill {:.2} tok/s, decode {:.2} tok/s; split/one: prefill {:.2}x, decode {:.2}x",
            self.one_adapter,
            self.one_prefill.median,
            self.one_decode.median,
            ratio_of(prefill.median, self.one_prefill.median),
            ratio_of(decode.median, self.one_decode.median)
        );
        for (n, s, o) in &self.levels {
            println!("  {n:>3} streams  split {s:.2} tok/s, one device {o:.2} tok/s: {:.2}x", ratio_of(*s, *o));
        }
        let ms = |v: &[f64]| v.iter().map(|m| format!("{m:.3}")).collect::<Vec<_>>().join(", ");
        println!(
            "boundary   {} bytes a token; host copy per boundary: {} ms for one decode row, {} ms for the prompt's rows",
            self.n_embd * 4,
            ms(&self.decode_copy_ms),
            ms(&self.prefill_copy_ms)
        );
    }
}

fn round3(v: f64) -> f64 {
    (v * 1000.0).round() / 1000.0
}

/// Positions a `--spec-type` bench engine holds per sequence: room for a prompt of a few
/// thousand tokens, the generated ones and a draft.
const SPEC_CTX: usize = 4096;

/// `flint bench --spec-type`: the file's prompt, `-n` greedy tokens, with and without drafts,
/// alternating, `--reps` times each after one untimed warm-up of each (kernels compile at
/// first use).
fn bench_spec(args: &BenchArgs, spec: flint::SpecConfig) -> Result<(), Failure> {
    if !args.concurrency.is_empty() || args.profile {
        return Err(Failure::usage("--spec-type and --model-draft runs are one stream: no --concurrency or --profile"));
    }
    let Some(file) = &args.file else {
        return Err(Failure::usage(
            "--spec-type and --model-draft need -f FILE: the synthetic bench prompt repeats one sentence, which would inflate acceptance",
        ));
    };
    let text = std::fs::read_to_string(file).map_err(|e| Failure::usage(format!("{}: {e}", file.display())))?;
    let path = crate::resolve(&args.model)?;
    let opts = LoadOptions {
        n_ctx: SPEC_CTX,
        max_seqs: 1,
        max_batch_tokens: args.max_batch_tokens,
        kv_budget_positions: Some(SPEC_CTX + 16),
        spec,
        ..crate::args::load_options(args.backend, &args.device, Some(&args.spec))?
    };
    let engine = Engine::load_path(&path, &opts).map_err(|e| Failure::usage(format!("{}: {e}", path.display())))?;
    let prompt = if args.raw { engine.tokenize_raw(&text) } else { engine.tokenize_chat(&[json!({"role": "user", "content": text})]) }
        .map_err(|e| Failure::usage(format!("{}: {e}", file.display())))?;
    if prompt.len() + args.gen_tokens + spec.draft_max + 2 > engine.n_ctx() {
        return Err(Failure::usage(format!(
            "the prompt ({} tokens) and -n {} do not fit the bench's {}-token context",
            prompt.len(),
            args.gen_tokens,
            engine.n_ctx()
        )));
    }
    let prefill_steps = prompt.len().div_ceil(args.max_batch_tokens) as u64;
    let once =
        |speculative: bool, n: usize| futures::executor::block_on(engine.bench_spec_once(&prompt, n, speculative, prefill_steps)).map_err(Failure::runtime);
    once(false, args.gen_tokens.min(16))?;
    once(true, args.gen_tokens.min(16))?;
    let (mut plain, mut drafted) = (Vec::new(), Vec::new());
    for _ in 0..args.reps {
        plain.push(once(false, args.gen_tokens)?);
        drafted.push(once(true, args.gen_tokens)?);
    }
    let same = drafted.iter().chain(&plain).all(|r| r.ids == plain[0].ids);
    let decode = |runs: &[flint::SpecRun]| stats(runs.iter().map(|r| r.run.decode_tok_s).collect());
    let (p, d) = (decode(&plain), decode(&drafted));
    let ratio = if p.median > 0.0 { d.median / p.median } else { 0.0 };
    let (n_drafted, n_accepted, steps): (usize, usize, u64) =
        drafted.iter().fold((0, 0, 0), |(a, b, c), r| (a + r.drafted, b + r.accepted, c + r.decode_steps));
    let rate = if n_drafted > 0 { n_accepted as f64 / n_drafted as f64 } else { 0.0 };
    let per_step = if steps > 0 { (args.gen_tokens * args.reps) as f64 / steps as f64 } else { 0.0 };
    let report = json!({
        "model": args.model,
        "backend": engine.backend_name(),
        "adapter": engine.adapter_name(),
        "file": file.display().to_string(),
        "chat_template": !args.raw,
        "prompt_tokens": prompt.len(),
        "gen_tokens": args.gen_tokens,
        "reps": args.reps,
        "spec_type": args.spec.label(),
        "draft_max": spec.draft_max,
        "plain_decode_tok_s": stats_json(&p),
        "spec_decode_tok_s": stats_json(&d),
        "ratio": round2(ratio),
        "drafted": n_drafted,
        "accepted": n_accepted,
        "acceptance": round2(rate),
        "tokens_per_step": round2(per_step),
        "outputs_identical": same,
    });
    match args.format {
        BenchFormat::Json => println!("{report}"),
        BenchFormat::Text => {
            println!("model      {} on {} ({})", args.model, engine.backend_name(), engine.adapter_name());
            println!("prompt     {} tokens from {}{}", prompt.len(), file.display(), if args.raw { " (raw)" } else { " (chat template)" });
            println!("plain      decode {:.2} tok/s (min {:.2}, max {:.2}) over {} tokens", p.median, p.min, p.max, args.gen_tokens);
            println!(
                "{:<10} decode {:.2} tok/s (min {:.2}, max {:.2}) | {ratio:.2}x plain | accepted {n_accepted} of {n_drafted} drafted ({:.0}%) | {per_step:.2} tokens per step",
                args.spec.label(),
                d.median,
                d.min,
                d.max,
                100.0 * rate
            );
            println!("outputs    {}", if same { "identical" } else { "DIFFER (a bug: speculation must not change greedy output)" });
        }
    }
    if !same {
        return Err(Failure::runtime("speculative and plain runs generated different tokens"));
    }
    Ok(())
}

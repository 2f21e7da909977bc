//! `flint bench-serve --url URL`: a load generator for any OpenAI-compatible server (Flint's,
//! llama.cpp's `llama-server`, vLLM's). Streamed requests with `ignore_eos` and temperature 0,
//! distinct prompts, a closed loop at each concurrency level (or Poisson arrivals at a rate);
//! per level: request throughput, output tok/s, TTFT, time per output token (TPOT) and
//! inter-token latency (median, p90, p99), errors; and "people served", the most concurrent
//! streams at which every stream still decodes at `--slo-tok-s` or more with TTFT p99 within
//! `--slo-ttft`. HTTP is hyper's client, one connection per request.

use std::time::{Duration, Instant};

use axum::body::Bytes;
use clap::{Args, ValueEnum};
use http_body_util::{BodyExt, Full};
use serde_json::{json, Value};

use crate::bench::BenchFormat;
use crate::Failure;

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum EndpointArg {
    Chat,
    Completions,
}

#[derive(Args)]
pub struct BenchServeArgs {
    /// The server, e.g. http://127.0.0.1:8080 (its /v1/... routes are used).
    #[arg(long)]
    url: String,
    /// The model name to send (default: the first of /v1/models).
    #[arg(long)]
    model: Option<String>,
    /// Closed-loop levels: that many requests in flight at once.
    #[arg(long, value_delimiter = ',', value_name = "N,...", default_value = "1,4,8,16")]
    concurrency: Vec<usize>,
    /// Poisson arrivals at R requests/s instead of closed loops (one level).
    #[arg(long = "request-rate", value_name = "R")]
    request_rate: Option<f64>,
    /// Requests per level (default: 4× the level; 16 with --request-rate).
    #[arg(long)]
    requests: Option<usize>,
    /// Words per prompt (about one token each): distinct prompts of about this many tokens.
    #[arg(long = "prompt-tokens", default_value_t = 64)]
    prompt_tokens: usize,
    /// Tokens each request generates (max_tokens with ignore_eos).
    #[arg(long = "gen-tokens", default_value_t = 32)]
    gen_tokens: usize,
    #[arg(long, value_enum, default_value_t = EndpointArg::Completions)]
    endpoint: EndpointArg,
    #[arg(long = "api-key")]
    api_key: Option<String>,
    /// The decode speed (tok/s) every stream must keep to count as served.
    #[arg(long = "slo-tok-s", default_value_t = 5.0)]
    slo_tok_s: f64,
    /// The TTFT p99 (seconds) a level must keep to count as served.
    #[arg(long = "slo-ttft", default_value_t = 2.0)]
    slo_ttft: f64,
    #[arg(long, value_enum, default_value_t = BenchFormat::Text)]
    format: BenchFormat,
}

/// Where requests go: host:port and the path prefix before `/v1`.
struct Target {
    authority: String,
    prefix: String,
    api_key: Option<String>,
}

impl Target {
    fn parse(url: &str, api_key: Option<String>) -> Result<Target, Failure> {
        let rest = url.strip_prefix("http://").ok_or_else(|| Failure::usage(format!("--url {url}: only http:// URLs are supported")))?;
        let (authority, path) = rest.split_once('/').map_or((rest, ""), |(a, p)| (a, p));
        if authority.is_empty() {
            return Err(Failure::usage(format!("--url {url}: no host")));
        }
        let authority = if authority.contains(':') { authority.to_string() } else { format!("{authority}:80") };
        let prefix = format!("/{}", path.trim_end_matches('/').trim_end_matches("v1").trim_end_matches('/'));
        Ok(Target { authority, prefix: prefix.trim_end_matches('/').to_string(), api_key })
    }

    fn request(&self, method: &str, path: &str, body: Option<&Value>) -> Result<hyper::Request<Full<Bytes>>, String> {
        let mut b = hyper::Request::builder().method(method).uri(format!("{}{path}", self.prefix)).header("host", &self.authority);
        if let Some(k) = &self.api_key {
            b = b.header("authorization", format!("Bearer {k}"));
        }
        let body = match body {
            Some(v) => {
                b = b.header("content-type", "application/json");
                Bytes::from(v.to_string())
            }
            None => Bytes::new(),
        };
        b.body(Full::new(body)).map_err(|e| e.to_string())
    }

    /// Sends `req` on a new connection; the response (its body still to read).
    async fn send(&self, req: hyper::Request<Full<Bytes>>) -> Result<hyper::Response<hyper::body::Incoming>, String> {
        let stream = tokio::net::TcpStream::connect(&self.authority).await.map_err(|e| format!("connect {}: {e}", self.authority))?;
        let (mut sender, conn) = hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream)).await.map_err(|e| e.to_string())?;
        tokio::spawn(async move {
            let _ = conn.await;
        });
        sender.send_request(req).await.map_err(|e| e.to_string())
    }

    /// Waits while the server does not accept connections yet (it may still be starting) or
    /// `/health` answers 503 (it still loads its model, as Flint's and llama.cpp's servers
    /// say); any other answer goes on.
    async fn wait_ready(&self, limit: Duration) -> Result<(), String> {
        let t0 = Instant::now();
        loop {
            let last = match self.send(self.request("GET", "/health", None)?).await {
                Ok(res) if res.status() != hyper::StatusCode::SERVICE_UNAVAILABLE => return Ok(()),
                Ok(res) => format!("/health answers {}", res.status()),
                Err(e) => e,
            };
            if t0.elapsed() > limit {
                return Err(format!("the server was not ready after {} s: {last}", limit.as_secs()));
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    async fn get_json(&self, path: &str) -> Result<Value, String> {
        let res = self.send(self.request("GET", path, None)?).await?;
        let status = res.status();
        let body = res.into_body().collect().await.map_err(|e| e.to_string())?.to_bytes();
        if !status.is_success() {
            return Err(format!("GET {path}: {status}"));
        }
        serde_json::from_slice(&body).map_err(|e| format!("GET {path}: {e}"))
    }
}

/// One request's timings.
#[derive(Clone, Debug, Default)]
struct Sample {
    ok: bool,
    ttft_s: f64,
    e2e_s: f64,
    tokens: usize,
    itl_s: Vec<f64>,
}

impl Sample {
    /// Time per output token after the first.
    fn tpot_s(&self) -> Option<f64> {
        (self.ok && self.tokens > 1).then(|| (self.e2e_s - self.ttft_s) / (self.tokens - 1) as f64)
    }
}

/// A distinct prompt of about `words` tokens (common words, about a token each).
fn prompt(i: usize, words: usize) -> String {
    const WORDS: [&str; 24] = [
        "the", "river", "runs", "past", "a", "small", "town", "where", "people", "walk", "every", "morning", "and", "talk", "about", "their", "work", "while",
        "birds", "sing", "in", "old", "green", "trees",
    ];
    let mut out = format!("Story {i}:");
    for k in 0..words.saturating_sub(3) {
        out.push(' ');
        out.push_str(WORDS[(k * 7 + i * 5 + k / 24) % WORDS.len()]);
    }
    out
}

fn request_body(args: &BenchServeArgs, model: &str, i: usize) -> Value {
    let text = prompt(i, args.prompt_tokens);
    let mut v = json!({
        "model": model,
        "max_tokens": args.gen_tokens,
        "ignore_eos": true,
        "temperature": 0,
        "stream": true,
        "stream_options": {"include_usage": true},
    });
    match args.endpoint {
        EndpointArg::Chat => v["messages"] = json!([{"role": "user", "content": text}]),
        EndpointArg::Completions => v["prompt"] = json!(text),
    }
    v
}

/// Whether an SSE chunk carries generated text.
fn has_text(chunk: &Value) -> bool {
    chunk["choices"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|c| c["text"].as_str().is_some_and(|t| !t.is_empty()) || c["delta"]["content"].as_str().is_some_and(|t| !t.is_empty()))
}

/// Sends one streamed request and times its chunks.
async fn one(target: &Target, body: Value) -> Sample {
    let t0 = Instant::now();
    let mut s = Sample::default();
    let path = if body.get("messages").is_some() { "/v1/chat/completions" } else { "/v1/completions" };
    let Ok(req) = target.request("POST", path, Some(&body)) else {
        return s;
    };
    let Ok(res) = target.send(req).await else { return s };
    if !res.status().is_success() {
        return s;
    }
    let mut body = res.into_body();
    let mut buf = Vec::new();
    let (mut chunks, mut usage_tokens, mut last, mut done, mut failed) = (0usize, None, None::<Instant>, false, false);
    while let Some(frame) = body.frame().await {
        let Ok(frame) = frame else {
            failed = true;
            break;
        };
        let Some(data) = frame.data_ref() else { continue };
        buf.extend_from_slice(data);
        while let Some(at) = buf.windows(2).position(|w| w == b"\n\n") {
            let event: Vec<u8> = buf.drain(..at + 2).collect();
            let text = String::from_utf8_lossy(&event);
            for line in text.lines() {
                let Some(payload) = line.strip_prefix("data:").map(str::trim) else { continue };
                if payload == "[DONE]" {
                    done = true;
                    continue;
                }
                let Ok(chunk) = serde_json::from_str::<Value>(payload) else { continue };
                if chunk.get("error").is_some() {
                    failed = true;
                }
                if let Some(n) = chunk["usage"]["completion_tokens"].as_u64() {
                    usage_tokens = Some(n as usize);
                }
                if has_text(&chunk) {
                    let now = Instant::now();
                    match last {
                        None => s.ttft_s = now.duration_since(t0).as_secs_f64(),
                        Some(l) => s.itl_s.push(now.duration_since(l).as_secs_f64()),
                    }
                    last = Some(now);
                    chunks += 1;
                }
            }
        }
    }
    s.e2e_s = t0.elapsed().as_secs_f64();
    s.tokens = usage_tokens.unwrap_or(chunks);
    s.ok = done && !failed && chunks > 0;
    s
}

/// A level's figures.
struct Level {
    label: usize,
    requests: usize,
    errors: usize,
    wall_s: f64,
    samples: Vec<Sample>,
}

fn percentiles(mut v: Vec<f64>) -> Value {
    if v.is_empty() {
        return json!({"median": null, "p90": null, "p99": null});
    }
    v.sort_by(|a, b| a.total_cmp(b));
    // Nearest rank.
    let at = |q: f64| v[((q * v.len() as f64).ceil() as usize).clamp(1, v.len()) - 1];
    let r = |x: f64| (x * 10_000.0).round() / 10_000.0;
    json!({"median": r(at(0.5)), "p90": r(at(0.9)), "p99": r(at(0.99))})
}

impl Level {
    fn ok(&self) -> impl Iterator<Item = &Sample> {
        self.samples.iter().filter(|s| s.ok)
    }

    fn json(&self) -> Value {
        let tokens: usize = self.ok().map(|s| s.tokens).sum();
        let n_ok = self.ok().count();
        let r2 = |x: f64| (x * 100.0).round() / 100.0;
        json!({
            "concurrency": self.label,
            "requests": self.requests,
            "errors": self.errors,
            "request_throughput": r2(if self.wall_s > 0.0 { n_ok as f64 / self.wall_s } else { 0.0 }),
            "output_tok_s": r2(if self.wall_s > 0.0 { tokens as f64 / self.wall_s } else { 0.0 }),
            "ttft_s": percentiles(self.ok().map(|s| s.ttft_s).collect()),
            "tpot_s": percentiles(self.ok().filter_map(Sample::tpot_s).collect()),
            "itl_s": percentiles(self.ok().flat_map(|s| s.itl_s.iter().copied()).collect()),
        })
    }

    /// Every stream decoded at `tok_s` or more and TTFT p99 stayed within `ttft_s`.
    fn served(&self, tok_s: f64, ttft_s: f64) -> bool {
        let v = self.json();
        self.errors == 0
            && self.ok().all(|s| s.tpot_s().is_some_and(|t| t > 0.0 && 1.0 / t >= tok_s))
            && v["ttft_s"]["p99"].as_f64().is_some_and(|p| p <= ttft_s)
    }
}

/// `n` requests, at most `concurrency` in flight (closed loop).
async fn closed_loop(target: &std::sync::Arc<Target>, args: &BenchServeArgs, model: &str, concurrency: usize, n: usize, first: usize) -> Level {
    let next = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let t0 = Instant::now();
    let workers: Vec<_> = (0..concurrency)
        .map(|_| {
            let (target, next) = (target.clone(), next.clone());
            let bodies: Vec<Value> = (0..n).map(|i| request_body(args, model, first + i)).collect();
            tokio::spawn(async move {
                let mut out = Vec::new();
                loop {
                    let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    if i >= bodies.len() {
                        return out;
                    }
                    out.push(one(&target, bodies[i].clone()).await);
                }
            })
        })
        .collect();
    let mut samples = Vec::new();
    for w in workers {
        samples.extend(w.await.unwrap_or_default());
    }
    let errors = samples.iter().filter(|s| !s.ok).count();
    Level { label: concurrency, requests: n, errors, wall_s: t0.elapsed().as_secs_f64(), samples }
}

/// `n` requests arriving as a Poisson process of `rate` per second.
async fn poisson(target: &std::sync::Arc<Target>, args: &BenchServeArgs, model: &str, rate: f64, n: usize) -> Level {
    let mut rng = flint_rng(0x5eed);
    let t0 = Instant::now();
    let mut tasks = Vec::new();
    for i in 0..n {
        let (target, body) = (target.clone(), request_body(args, model, i));
        tasks.push(tokio::spawn(async move { one(&target, body).await }));
        let u: f64 = rng();
        tokio::time::sleep(Duration::from_secs_f64(-(1.0 - u).ln() / rate)).await;
    }
    let mut samples = Vec::new();
    for t in tasks {
        samples.push(t.await.unwrap_or_default());
    }
    let errors = samples.iter().filter(|s| !s.ok).count();
    // Open loop: no fixed concurrency (the report's `request_rate` says what ran).
    Level { label: 0, requests: n, errors, wall_s: t0.elapsed().as_secs_f64(), samples }
}

/// Uniform [0, 1) numbers from a fixed seed (splitmix64), so arrivals repeat run to run.
fn flint_rng(seed: u64) -> impl FnMut() -> f64 {
    let mut s = seed;
    move || {
        s = s.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = s;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        ((z ^ (z >> 31)) >> 11) as f64 / (1u64 << 53) as f64
    }
}

pub fn bench_serve(args: BenchServeArgs) -> Result<(), Failure> {
    if args.concurrency.contains(&0) || args.gen_tokens == 0 || args.prompt_tokens == 0 || args.requests == Some(0) {
        return Err(Failure::usage("--concurrency levels, --requests, --prompt-tokens and --gen-tokens must be at least 1"));
    }
    if args.request_rate.is_some_and(|r| !(r > 0.0 && r.is_finite())) {
        return Err(Failure::usage("--request-rate must be a positive number"));
    }
    let target = std::sync::Arc::new(Target::parse(&args.url, args.api_key.clone().or_else(|| std::env::var("FLINT_API_KEY").ok()))?);
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().map_err(Failure::runtime)?;
    runtime.block_on(async {
        target.wait_ready(Duration::from_secs(600)).await.map_err(Failure::runtime)?;
        let model = match &args.model {
            Some(m) => m.clone(),
            None => {
                let list = target.get_json("/v1/models").await.map_err(Failure::runtime)?;
                list["data"][0]["id"].as_str().ok_or_else(|| Failure::runtime("the server lists no model"))?.to_string()
            }
        };
        let mut levels = Vec::new();
        match args.request_rate {
            Some(rate) => levels.push(poisson(&target, &args, &model, rate, args.requests.unwrap_or(16)).await),
            None => {
                let mut first = 0;
                for &c in &args.concurrency {
                    let n = args.requests.unwrap_or(4 * c);
                    levels.push(closed_loop(&target, &args, &model, c, n, first).await);
                    first += n;
                }
            }
        }
        let served = levels.iter().filter(|l| args.request_rate.is_none() && l.served(args.slo_tok_s, args.slo_ttft)).map(|l| l.label).max().unwrap_or(0);
        let report = json!({
            "url": args.url,
            "model": model,
            "endpoint": match args.endpoint { EndpointArg::Chat => "chat", EndpointArg::Completions => "completions" },
            "prompt_tokens": args.prompt_tokens,
            "gen_tokens": args.gen_tokens,
            "request_rate": args.request_rate,
            "slo_tok_s": args.slo_tok_s,
            "slo_ttft_s": args.slo_ttft,
            "levels": levels.iter().map(Level::json).collect::<Vec<_>>(),
            "people_served": served,
        });
        match args.format {
            BenchFormat::Json => println!("{report}"),
            BenchFormat::Text => print_text(&report),
        }
        Ok(())
    })
}

fn print_text(r: &Value) {
    println!("server {} model {} ({} endpoint, ~{} prompt tokens, {} generated)", r["url"], r["model"], r["endpoint"], r["prompt_tokens"], r["gen_tokens"]);
    println!("level  reqs err   req/s   out tok/s | ttft s med/p90/p99    | tpot s med/p90/p99    | itl s med/p90/p99");
    let p = |v: &Value| {
        let f = |k: &str| v[k].as_f64().map_or("-".to_string(), |x| format!("{x:.3}"));
        format!("{}/{}/{}", f("median"), f("p90"), f("p99"))
    };
    for l in r["levels"].as_array().into_iter().flatten() {
        println!(
            "{:>5} {:>5} {:>3} {:>7.3} {:>10.2} | {:<21} | {:<21} | {}",
            l["concurrency"],
            l["requests"],
            l["errors"],
            l["request_throughput"].as_f64().unwrap_or(0.0),
            l["output_tok_s"].as_f64().unwrap_or(0.0),
            p(&l["ttft_s"]),
            p(&l["tpot_s"]),
            p(&l["itl_s"])
        );
    }
    println!("people served (every stream ≥ {} tok/s, ttft p99 ≤ {} s): {}", r["slo_tok_s"], r["slo_ttft_s"], r["people_served"]);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls() {
        let t = Target::parse("http://127.0.0.1:8080", None).ok().unwrap();
        assert_eq!((t.authority.as_str(), t.prefix.as_str()), ("127.0.0.1:8080", ""));
        let t = Target::parse("http://localhost:9/api/v1/", None).ok().unwrap();
        assert_eq!((t.authority.as_str(), t.prefix.as_str()), ("localhost:9", "/api"));
        assert!(Target::parse("https://x", None).is_err());
    }

    #[test]
    fn prompts_are_distinct_and_sized() {
        let (a, b) = (prompt(0, 64), prompt(1, 64));
        assert_ne!(a, b);
        assert_eq!(a.split_whitespace().count(), 2 + 61);
    }

    #[test]
    fn nearest_rank_percentiles() {
        let v = percentiles((1..=100).map(f64::from).collect());
        assert_eq!((v["median"].as_f64(), v["p90"].as_f64(), v["p99"].as_f64()), (Some(50.0), Some(90.0), Some(99.0)));
    }
}

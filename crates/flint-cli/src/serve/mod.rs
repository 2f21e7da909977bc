//! `flint serve`: an OpenAI-compatible HTTP server over one engine, so that every request in
//! flight shares the engine's forward steps (continuous batching).
//!
//! axum routes on tokio; the connection loop is hyper's own (with a timer, so its header read
//! timeout holds a client that trickles bytes to a deadline) and drains on SIGINT/SIGTERM. The
//! server binds first and prints `listening on http://ADDR:PORT` on stdout; `/health` answers
//! 503 until the model is loaded. Logs go to stderr, one line per request.

mod metrics;
mod respond;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::AtomicUsize;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::{header, HeaderValue, Method, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get, post};
use axum::{Json, Router};
use clap::Args;
use hyper_util::rt::{TokioIo, TokioTimer};
use serde_json::{json, Value};
use tower_http::cors::{AllowOrigin, CorsLayer};
use tower_http::limit::RequestBodyLimitLayer;

use flint::{Engine, LoadOptions, SamplingParams};

use crate::args::BackendArg;
use crate::Failure;
use flint::openai;
use metrics::Metrics;
use openai::{ApiError, Defaults, Endpoint};

/// Request bodies larger than this get 413.
const BODY_LIMIT: usize = 4 << 20;

#[derive(Args)]
pub struct ServeArgs {
    /// Model: a path, a catalog name or a URL.
    #[arg(short = 'm', long = "model")]
    model: String,
    /// Address to bind.
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    /// Port (0 picks a free one; the address is printed).
    #[arg(long, default_value_t = 8080)]
    port: u16,
    /// Every route but /health, /v1/models and static files needs `Authorization: Bearer KEY`
    /// (or set FLINT_API_KEY).
    #[arg(long = "api-key", value_name = "KEY")]
    api_key: Option<String>,
    /// Most sequences decoding at once (a request's `n` choices count each).
    #[arg(long, default_value_t = flint::DEFAULT_MAX_SEQS)]
    parallel: usize,
    /// The most tokens one sequence holds; 0 = the model's training context.
    #[arg(short = 'c', long = "ctx-size", default_value_t = flint::DEFAULT_CTX)]
    ctx_size: usize,
    /// KV memory shared by every sequence (MB); default: room for --parallel whole contexts.
    #[arg(long = "kv-budget-mb", value_name = "MB")]
    kv_budget_mb: Option<u64>,
    /// Tokens one forward step runs, decodes and prompt chunks together.
    #[arg(long = "max-batch-tokens", default_value_t = flint::DEFAULT_MAX_BATCH_TOKENS)]
    max_batch_tokens: usize,
    /// Requests waiting for their first token beyond which new ones get 429.
    #[arg(long = "max-queue", default_value_t = 64)]
    max_queue: usize,
    /// The model's id in the API (default: its catalog name or file stem).
    #[arg(long)]
    alias: Option<String>,
    /// A Jinja chat template to use instead of the model's own.
    #[arg(long = "chat-template-file", value_name = "FILE")]
    chat_template_file: Option<PathBuf>,
    /// Allow browser requests from ORIGIN (repeatable; `*` for any).
    #[arg(long = "cors", value_name = "ORIGIN")]
    cors: Vec<String>,
    /// Serve the files under DIR (with Range) at every path the API does not use; default: the
    /// chat page's site when it is built (target/web/site).
    #[arg(long = "static", value_name = "DIR")]
    static_dir: Option<PathBuf>,
    /// On SIGINT/SIGTERM, let running requests finish for this long, then end them (abort).
    #[arg(long = "shutdown-timeout", value_name = "SECS", default_value_t = 10)]
    shutdown_timeout: u64,
    /// A client must send a request's headers within this many seconds.
    #[arg(long = "header-timeout", value_name = "SECS", default_value_t = 10)]
    header_timeout: u64,
    #[arg(long, value_enum, default_value_t = BackendArg::Gpu)]
    backend: BackendArg,
    #[command(flatten)]
    device: crate::args::DeviceArgs,
    /// Skip the warm-up: one step of each kind (a prompt, decodes of 1 to --parallel
    /// sequences) run before /health says ok, so that kernels the adapter compiles at first use
    /// (lavapipe, browsers) do not stall the first requests.
    #[arg(long = "no-warmup")]
    no_warmup: bool,
    /// Skip the load-time self-test (a short fixed input through the first layer and the head
    /// on the GPU and on the CPU reference; a driver that computes wrongly fails the start).
    #[arg(long = "no-self-test")]
    no_self_test: bool,
    #[command(flatten)]
    sampling: SamplingDefaults,
    /// Speculative decoding for every greedy request (temperature 0).
    #[command(flatten)]
    spec: crate::args::SpecArgs,
}

/// `flint run`'s sampling flags, here as the server's defaults for requests that do not set
/// a field; a flag not given leaves OpenAI's default (temperature 1, top_p 1, no top-k or
/// min-p, no length limit but the context).
#[derive(Args)]
struct SamplingDefaults {
    /// Default max_tokens.
    #[arg(short = 'n', long = "max-tokens", visible_alias = "n-predict", value_name = "N")]
    max_tokens: Option<usize>,
    #[arg(long = "temp", allow_negative_numbers = true)]
    temp: Option<f32>,
    #[arg(long = "top-k", allow_negative_numbers = true)]
    top_k: Option<i32>,
    #[arg(long = "top-p")]
    top_p: Option<f32>,
    #[arg(long = "min-p")]
    min_p: Option<f32>,
    #[arg(long = "repeat-penalty")]
    repeat_penalty: Option<f32>,
    #[arg(long = "repeat-last-n", allow_negative_numbers = true)]
    repeat_last_n: Option<i32>,
    #[arg(long = "presence-penalty", allow_negative_numbers = true)]
    presence_penalty: Option<f32>,
    #[arg(long = "frequency-penalty", allow_negative_numbers = true)]
    frequency_penalty: Option<f32>,
    /// Default seed for requests that give none (without it, each draws a fresh one).
    #[arg(long = "seed")]
    seed: Option<u64>,
    /// Default stop string (repeatable).
    #[arg(long = "stop", value_name = "STR")]
    stop: Vec<String>,
}

impl SamplingDefaults {
    fn defaults(&self) -> Result<Defaults, Failure> {
        let mut d = Defaults::default();
        let s: &mut SamplingParams = &mut d.sampling;
        s.temperature = self.temp.unwrap_or(s.temperature);
        s.top_k = self.top_k.unwrap_or(s.top_k);
        s.top_p = self.top_p.unwrap_or(s.top_p);
        s.min_p = self.min_p.unwrap_or(s.min_p);
        s.repeat_penalty = self.repeat_penalty.unwrap_or(s.repeat_penalty);
        s.repeat_last_n = self.repeat_last_n.unwrap_or(s.repeat_last_n);
        s.presence_penalty = self.presence_penalty.unwrap_or(s.presence_penalty);
        s.frequency_penalty = self.frequency_penalty.unwrap_or(s.frequency_penalty);
        s.seed = self.seed;
        s.validate().map_err(Failure::usage)?;
        if self.max_tokens == Some(0) || self.stop.iter().any(String::is_empty) {
            return Err(Failure::usage("--max-tokens must be at least 1 and --stop strings non-empty"));
        }
        d.max_tokens = self.max_tokens;
        d.stop = self.stop.clone();
        Ok(d)
    }
}

/// What every handler shares.
struct App {
    engine: OnceLock<Arc<Engine>>,
    model_id: String,
    api_key: Option<String>,
    defaults: Defaults,
    max_queue: usize,
    waiting: Arc<AtomicUsize>,
    metrics: Arc<Metrics>,
}

type Shared = Arc<App>;

impl App {
    fn engine(&self) -> Result<Arc<Engine>, ApiError> {
        self.engine.get().cloned().ok_or_else(|| ApiError::new(StatusCode::SERVICE_UNAVAILABLE.as_u16(), "unavailable_error", "the model is still loading"))
    }
}

/// The model's id: the catalog name it was asked by, else the file's stem.
fn model_id(arg: &str, path: &std::path::Path) -> String {
    if crate::catalog::find(arg).is_some() {
        return arg.to_string();
    }
    path.file_stem().map_or_else(|| arg.to_string(), |s| s.to_string_lossy().into_owned())
}

pub fn serve(args: ServeArgs) -> Result<(), Failure> {
    if args.parallel == 0 || args.max_batch_tokens == 0 {
        return Err(Failure::usage("--parallel and --max-batch-tokens must be at least 1"));
    }
    let defaults = args.sampling.defaults()?;
    let api_key = args.api_key.clone().or_else(|| std::env::var("FLINT_API_KEY").ok()).filter(|k| !k.is_empty());
    let chat_template = match &args.chat_template_file {
        Some(f) => Some(std::fs::read_to_string(f).map_err(|e| Failure::usage(format!("{}: {e}", f.display())))?),
        None => None,
    };
    if let Some(dir) = &args.static_dir {
        if !dir.is_dir() {
            return Err(Failure::usage(format!("--static {}: not a directory", dir.display())));
        }
    }
    let path = crate::resolve(&args.model)?;
    let model_id = args.alias.clone().unwrap_or_else(|| model_id(&args.model, &path));
    // Every sequence's whole context, and the spare block a copy-on-write takes.
    let kv_budget_positions = (args.ctx_size > 0).then(|| args.parallel.saturating_mul(args.ctx_size).saturating_add(flint::KV_BLOCK_SIZE as usize));
    let base = crate::args::load_options(args.backend, &args.device, Some(&args.spec))?;
    let opts = LoadOptions {
        n_ctx: args.ctx_size,
        kv_budget_mb: args.kv_budget_mb,
        kv_budget_positions,
        max_seqs: args.parallel,
        max_batch_tokens: args.max_batch_tokens,
        chat_template,
        self_test: !args.no_self_test,
        // Requests' `prediction` drafts whatever --spec-type says.
        spec: flint::SpecConfig { predictions: true, ..base.spec },
        ..base
    };
    let app = Arc::new(App {
        engine: OnceLock::new(),
        model_id,
        api_key,
        defaults,
        max_queue: args.max_queue,
        waiting: Arc::new(AtomicUsize::new(0)),
        metrics: Arc::new(Metrics::default()),
    });
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().map_err(Failure::runtime)?;
    runtime.block_on(run(args, path, opts, app))
}

/// Binds and prints `listening on http://ADDR:PORT` on stdout, before anything slow.
pub(crate) async fn bind(host: &str, port: u16) -> Result<tokio::net::TcpListener, Failure> {
    let listener = tokio::net::TcpListener::bind((host, port)).await.map_err(|e| Failure::usage(format!("cannot listen on {host}:{port}: {e}")))?;
    let addr: SocketAddr = listener.local_addr().map_err(Failure::runtime)?;
    println!("listening on http://{addr}");
    use std::io::Write;
    let _ = std::io::stdout().flush();
    Ok(listener)
}

/// Serves `router` on `listener` until SIGINT/SIGTERM (then it returns the connections still
/// open, to drain) or until `failed` resolves (then its error). Each connection is hyper's own
/// with a timer, so its header read timeout holds a client that trickles bytes to a deadline.
pub(crate) async fn accept_until_signal(
    listener: tokio::net::TcpListener,
    router: Router,
    header_timeout: Duration,
    failed: impl std::future::Future<Output = Failure>,
) -> Result<hyper_util::server::graceful::GracefulShutdown, Failure> {
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    let mut shutdown = std::pin::pin!(shutdown_signal());
    let mut failed = std::pin::pin!(failed);
    loop {
        tokio::select! {
            conn = listener.accept() => {
                let Ok((stream, _)) = conn else { continue };
                let svc = hyper_util::service::TowerToHyperService::new(router.clone());
                let conn = hyper::server::conn::http1::Builder::new()
                    .timer(TokioTimer::new())
                    .header_read_timeout(header_timeout)
                    .serve_connection(TokioIo::new(stream), svc);
                let conn = graceful.watch(conn);
                tokio::spawn(async move {
                    let _ = conn.await;
                });
            }
            failure = &mut failed => return Err(failure),
            _ = &mut shutdown => return Ok(graceful),
        }
    }
}

async fn run(args: ServeArgs, path: PathBuf, opts: LoadOptions, app: Shared) -> Result<(), Failure> {
    let listener = bind(&args.host, args.port).await?;
    // Load on a blocking thread; the server answers (503) meanwhile.
    let (failed_tx, mut failed_rx) = tokio::sync::mpsc::channel::<String>(1);
    {
        let app = app.clone();
        let warmup = !args.no_warmup;
        tokio::task::spawn_blocking(move || match Engine::load_path(&path, &opts) {
            Ok(engine) => {
                eprintln!("loaded {} on {} ({})", app.model_id, engine.backend_name(), engine.adapter_name());
                let budget = opts.split.device_mem_mb.as_ref().map(|mb| mb.iter().map(|m| m.saturating_mul(1 << 20)).sum());
                eprintln!("memory plan:\n{}", engine.info().memory.describe(budget));
                if let Some(report) = &engine.info().self_test {
                    eprintln!("{}", report.summary());
                }
                if warmup {
                    let t0 = Instant::now();
                    match futures::executor::block_on(engine.warm_up()) {
                        Ok(()) => eprintln!("warmed up in {:.1} s", t0.elapsed().as_secs_f64()),
                        Err(e) => {
                            let _ = failed_tx.blocking_send(format!("warm-up: {e}"));
                            return;
                        }
                    }
                }
                let _ = app.engine.set(Arc::new(engine));
            }
            Err(e) => {
                let _ = failed_tx.blocking_send(format!("{}: {e}", path.display()));
            }
        });
    }
    let router = router(&args, app.clone());
    let failed = async move {
        match failed_rx.recv().await {
            Some(message) => Failure::usage(message),
            None => std::future::pending().await,
        }
    };
    let graceful = accept_until_signal(listener, router, Duration::from_secs(args.header_timeout.max(1)), failed).await?;
    eprintln!("shutting down: waiting up to {} s for running requests", args.shutdown_timeout);
    let drained = graceful.shutdown();
    let mut drained = std::pin::pin!(drained);
    tokio::select! {
        _ = &mut drained => {}
        _ = tokio::time::sleep(Duration::from_secs(args.shutdown_timeout)) => {
            if let Some(engine) = app.engine.get() {
                engine.cancel_all();
            }
            // Aborted requests end within a step; connections that still hang are dropped.
            let _ = tokio::time::timeout(Duration::from_secs(5), drained).await;
        }
    }
    Ok(())
}

async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {}
        _ = term => {}
    }
}

fn router(args: &ServeArgs, app: Shared) -> Router {
    let mut r = Router::new()
        .route("/health", get(health))
        .route("/v1/models", get(models))
        .route("/v1/chat/completions", post(chat_completions))
        .route("/v1/completions", post(completions))
        .route("/metrics", get(metrics_text))
        .route("/tokenize", post(tokenize))
        .route("/detokenize", post(detokenize));
    // Fault injection for tests and drills, only when asked for at start-up.
    if std::env::var("FLINT_TEST_FAULTS").is_ok_and(|v| v == "1") {
        r = r.route("/test/lose-device", post(lose_device));
    }
    let mut r = r.method_not_allowed_fallback(|| async {
        HttpError(ApiError::new(StatusCode::METHOD_NOT_ALLOWED.as_u16(), "invalid_request_error", "method not allowed"))
    });
    // Unknown API paths get OpenAI's error shape, with or without a site.
    let no_route = || async { HttpError(ApiError::new(StatusCode::NOT_FOUND.as_u16(), "invalid_request_error", "no such route")) };
    r = r.route("/v1/{*rest}", any(no_route));
    let site = args.static_dir.clone().or_else(crate::web::default_site);
    if site.is_none() {
        r = r.fallback(no_route);
    }
    r = r.merge(crate::web::site(site));
    let mut r = r
        .layer(DefaultBodyLimit::max(BODY_LIMIT))
        .layer(RequestBodyLimitLayer::new(BODY_LIMIT))
        .layer(middleware::from_fn_with_state(app.clone(), auth))
        .layer(middleware::from_fn(shape_413))
        .layer(middleware::from_fn(linger_413))
        .layer(middleware::from_fn(crate::web::log_requests))
        .with_state(app);
    if !args.cors.is_empty() {
        let origin = if args.cors.iter().any(|o| o == "*") {
            AllowOrigin::any()
        } else {
            AllowOrigin::list(args.cors.iter().filter_map(|o| HeaderValue::from_str(o).ok()))
        };
        let cors = CorsLayer::new()
            .allow_origin(origin)
            .allow_methods([Method::GET, Method::POST, Method::OPTIONS])
            .allow_headers([header::AUTHORIZATION, header::CONTENT_TYPE]);
        r = r.layer(cors);
    }
    r
}

/// An [`ApiError`] (the engine's, shared with the npm package) as an HTTP response.
pub struct HttpError(pub ApiError);

impl From<ApiError> for HttpError {
    fn from(e: ApiError) -> HttpError {
        HttpError(e)
    }
}

impl IntoResponse for HttpError {
    fn into_response(self) -> Response {
        let e = self.0;
        let status = StatusCode::from_u16(e.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let mut r = (status, Json(e.body())).into_response();
        if let Some(s) = e.retry_after_s {
            r.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(s));
        }
        r
    }
}

/// Whether `path` is open without the API key (as llama.cpp's server: health, the model list
/// and the static site).
fn is_public(path: &str) -> bool {
    matches!(path, "/health" | "/v1/models")
        || !(path.starts_with("/v1/") || path.starts_with("/models/") || matches!(path, "/metrics" | "/tokenize" | "/detokenize"))
}

async fn auth(State(app): State<Shared>, req: Request, next: Next) -> Response {
    if let Some(key) = &app.api_key {
        if !is_public(req.uri().path()) {
            let given = req.headers().get(header::AUTHORIZATION).and_then(|v| v.to_str().ok()).and_then(|v| v.strip_prefix("Bearer "));
            if given != Some(key.as_str()) {
                return HttpError(ApiError::new(StatusCode::UNAUTHORIZED.as_u16(), "authentication_error", "invalid or missing API key")).into_response();
            }
        }
    }
    next.run(req).await
}

/// A body past [`BODY_LIMIT`] whose length is declared is read and discarded up to this many
/// bytes before the 413 (nginx's lingering close): a client that sends its whole body before
/// reading then reads the answer, where closing at once would reset its connection.
const LINGER_BYTES: u64 = 64 << 20;
/// The most time spent discarding such a body.
const LINGER_TIME: Duration = Duration::from_secs(10);

/// 413 for a declared body length past the limit, answered once the body is read (up to
/// [`LINGER_BYTES`] and [`LINGER_TIME`]) and with the connection closed after it.
async fn linger_413(req: Request, next: Next) -> Response {
    let declared = req.headers().get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()).and_then(|v| v.parse::<u64>().ok());
    let Some(len) = declared.filter(|&n| n > BODY_LIMIT as u64) else { return next.run(req).await };
    if len <= LINGER_BYTES {
        let mut body = req.into_body().into_data_stream();
        let _ = tokio::time::timeout(LINGER_TIME, async { while let Some(Ok(_)) = futures::StreamExt::next(&mut body).await {} }).await;
    }
    let e = ApiError::new(StatusCode::PAYLOAD_TOO_LARGE.as_u16(), "invalid_request_error", format!("the body is over {BODY_LIMIT} bytes"));
    let mut res = HttpError(e).into_response();
    res.headers_mut().insert(header::CONNECTION, HeaderValue::from_static("close"));
    res
}

/// A 413 from the body limit shaped as OpenAI's error.
async fn shape_413(req: Request, next: Next) -> Response {
    let mut res = next.run(req).await;
    let json = res.headers().get(header::CONTENT_TYPE).is_some_and(|v| v.as_bytes().starts_with(b"application/json"));
    if res.status() == StatusCode::PAYLOAD_TOO_LARGE && !json {
        res = HttpError(ApiError::new(StatusCode::PAYLOAD_TOO_LARGE.as_u16(), "invalid_request_error", format!("the body is over {BODY_LIMIT} bytes")))
            .into_response();
    }
    res
}

async fn health(State(app): State<Shared>) -> Response {
    match app.engine.get() {
        Some(_) => Json(json!({"status": "ok"})).into_response(),
        None => (StatusCode::SERVICE_UNAVAILABLE, Json(json!({"status": "loading model"}))).into_response(),
    }
}

async fn models(State(app): State<Shared>) -> Response {
    let mut m = json!({"id": app.model_id, "object": "model", "created": 0, "owned_by": "flint"});
    if let Some(e) = app.engine.get() {
        m["meta"] = json!({"n_ctx": e.n_ctx(), "n_vocab": e.config().n_vocab, "parallel": e.info().max_seqs, "has_chat_template": e.has_chat_template()});
    }
    Json(json!({"object": "list", "data": [m]})).into_response()
}

/// The body as bytes; a body over the limit is 413.
fn body_bytes(body: Result<Bytes, axum::extract::rejection::BytesRejection>) -> Result<Bytes, ApiError> {
    body.map_err(|e| ApiError::new(e.status().as_u16(), "invalid_request_error", e.body_text()))
}

async fn chat_completions(State(app): State<Shared>, body: Result<Bytes, axum::extract::rejection::BytesRejection>) -> Response {
    complete(app, body, Endpoint::Chat).await.unwrap_or_else(IntoResponse::into_response)
}

async fn completions(State(app): State<Shared>, body: Result<Bytes, axum::extract::rejection::BytesRejection>) -> Response {
    complete(app, body, Endpoint::Completions).await.unwrap_or_else(IntoResponse::into_response)
}

async fn complete(app: Shared, body: Result<Bytes, axum::extract::rejection::BytesRejection>, endpoint: Endpoint) -> Result<Response, HttpError> {
    let arrived = Instant::now();
    let body = body_bytes(body)?;
    let engine = app.engine()?;
    let parsed = openai::parse(&body, endpoint, &app.defaults)?;
    openai::log_unknown(&parsed.unknown);
    if let Some(m) = &parsed.model {
        if *m != app.model_id {
            let e = ApiError {
                status: StatusCode::NOT_FOUND.as_u16(),
                ..ApiError::invalid("model", format!("the model `{m}` does not exist (this server has `{}`)", app.model_id))
            };
            return Err(e.with_code("model_not_found").into());
        }
    }
    let slot = respond::QueueSlot::take(&app.waiting, app.max_queue)?;
    let stream = parsed.stream;
    let run = respond::start(&engine, &app.model_id, parsed, app.metrics.clone(), slot, arrived)?;
    Ok(if stream { run.into_sse() } else { run.into_body().await })
}

async fn metrics_text(State(app): State<Shared>) -> Response {
    let stats = match app.engine.get() {
        Some(e) => e.stats().await.ok(),
        None => None,
    };
    let text = app.metrics.render(stats.as_ref());
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], text).into_response()
}

fn json_body(body: Result<Bytes, axum::extract::rejection::BytesRejection>) -> Result<serde_json::Map<String, Value>, ApiError> {
    let body = body_bytes(body)?;
    match serde_json::from_slice::<Value>(&body) {
        Ok(Value::Object(o)) => Ok(o),
        Ok(_) => Err(ApiError::new(StatusCode::BAD_REQUEST.as_u16(), "invalid_request_error", "the body must be a JSON object")),
        Err(e) => Err(ApiError::new(StatusCode::BAD_REQUEST.as_u16(), "invalid_request_error", format!("malformed JSON: {e}"))),
    }
}

/// llama.cpp's `/tokenize`: `{"content", "add_special"?, "with_pieces"?}` → `{"tokens"}`.
/// `POST /test/lose-device` (with `FLINT_TEST_FAULTS=1`): destroys the GPU device between two
/// steps; running requests fail with `device_lost` and the next one reloads the model.
async fn lose_device(State(app): State<Shared>) -> Result<Response, HttpError> {
    app.engine()?.lose_device();
    Ok(Json(json!({"lost": true})).into_response())
}

async fn tokenize(State(app): State<Shared>, body: Result<Bytes, axum::extract::rejection::BytesRejection>) -> Result<Response, HttpError> {
    let engine = app.engine()?;
    let o = json_body(body)?;
    let content = o.get("content").and_then(Value::as_str).ok_or_else(|| ApiError::invalid("content", "`content` must be a string"))?;
    let flag = |name: &str| -> Result<bool, ApiError> {
        match o.get(name) {
            None | Some(Value::Null) => Ok(false),
            Some(Value::Bool(b)) => Ok(*b),
            Some(_) => Err(ApiError::invalid(name, format!("`{name}` must be true or false"))),
        }
    };
    let (add_special, with_pieces) = (flag("add_special")?, flag("with_pieces")?);
    let t = engine.tokenizer();
    let ids = t.encode(content, add_special && t.add_bos_default(), true).map_err(|e| ApiError::invalid("content", e.to_string()))?;
    let tokens: Vec<Value> = if with_pieces {
        ids.iter()
            .map(|&id| {
                let bytes = t.token_bytes(id);
                let piece = match String::from_utf8(bytes) {
                    Ok(s) => json!(s),
                    Err(e) => json!(e.into_bytes()),
                };
                json!({"id": id, "piece": piece})
            })
            .collect()
    } else {
        ids.iter().map(|&id| json!(id)).collect()
    };
    Ok(Json(json!({"tokens": tokens})).into_response())
}

/// llama.cpp's `/detokenize`: `{"tokens": [ids]}` → `{"content"}`.
async fn detokenize(State(app): State<Shared>, body: Result<Bytes, axum::extract::rejection::BytesRejection>) -> Result<Response, HttpError> {
    let engine = app.engine()?;
    let o = json_body(body)?;
    let bad = || ApiError::invalid("tokens", "`tokens` must be an array of token ids");
    let list = o.get("tokens").and_then(Value::as_array).ok_or_else(bad)?;
    let n_vocab = engine.config().n_vocab;
    let ids = list.iter().map(|v| v.as_u64().filter(|&id| (id as usize) < n_vocab).map(|id| id as u32).ok_or_else(bad)).collect::<Result<Vec<u32>, _>>()?;
    let content = engine.tokenizer().decode(&ids, false).map_err(|e| ApiError::invalid("tokens", e.to_string()))?;
    Ok(Json(json!({"content": content})).into_response())
}

#[cfg(test)]
mod tests {
    #[test]
    fn public_routes() {
        for p in ["/health", "/v1/models", "/", "/index.html", "/pkg/flint.js"] {
            assert!(super::is_public(p), "{p}");
        }
        for p in ["/v1/chat/completions", "/v1/completions", "/metrics", "/tokenize", "/detokenize", "/models/gemma.gguf", "/v1/other"] {
            assert!(!super::is_public(p), "{p}");
        }
    }
}

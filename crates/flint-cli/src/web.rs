//! The site routes `flint serve` and `flint web` share: the chat page (the site
//! `scripts/build-web.sh` builds) as static files, and the cached catalog models under
//! `/models/`, both with the Range support the browser engine reads models by.
//!
//! `flint web` is the static-only mode: the same axum routes and connection loop as
//! `flint serve`, with no model loaded.
//!
//! Routes: `/models/index.json` lists the cached catalog models; `/models/<name>.gguf` serves
//! one; everything else is a file under the site root (tower-http's `ServeDir`: GET and HEAD,
//! Range, no path that climbs out of the root).

use std::path::PathBuf;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use axum::extract::Request;
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use clap::Args;
use http_body::{Frame, SizeHint};
use serde_json::json;
use tower::ServiceExt;
use tower_http::services::{ServeDir, ServeFile};

use crate::catalog;
use crate::Failure;

/// The site `scripts/build-web.sh` builds, relative to the working directory.
pub const DEFAULT_SITE: &str = "target/web/site";

#[derive(Args)]
pub struct WebArgs {
    /// Port to listen on (0 picks a free one; the address is printed).
    #[arg(long, default_value_t = 8080)]
    port: u16,
    /// Address to bind (loopback by default: the server is for local use).
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    /// The site to serve (built by `bash scripts/build-web.sh`).
    #[arg(long, default_value = DEFAULT_SITE)]
    root: PathBuf,
    /// Print one line per request on stderr: METHOD PATH STATUS BYTES [range R] MSms.
    #[arg(long)]
    log: bool,
}

pub fn web(args: WebArgs) -> Result<(), Failure> {
    if !args.root.join("index.html").is_file() {
        return Err(Failure::usage(format!("{} has no index.html: build the site with `bash scripts/build-web.sh` or pass --root", args.root.display())));
    }
    let mut router: Router = site(Some(args.root));
    if args.log {
        router = router.layer(middleware::from_fn(log_requests));
    }
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().map_err(Failure::runtime)?;
    runtime.block_on(async {
        let listener = crate::serve::bind(&args.host, args.port).await?;
        // Static files need no drain: a signal ends the server at once, as before.
        crate::serve::accept_until_signal(listener, router, Duration::from_secs(10), std::future::pending()).await.map(drop)
    })
}

/// The site when one is built where `flint serve` looks by default: `target/web/site` under the
/// working directory, else `web/site` beside the binary's directory (`target/release/flint` →
/// `target/web/site`).
pub fn default_site() -> Option<PathBuf> {
    let beside_binary = std::env::current_exe().ok().and_then(|exe| Some(exe.parent()?.parent()?.join("web/site")));
    [Some(PathBuf::from(DEFAULT_SITE)), beside_binary].into_iter().flatten().find(|d| d.join("index.html").is_file())
}

/// The model routes and, when there is a site, its files at every path no other route takes;
/// to merge into a router. Every response says `Cache-Control: no-cache`, so a browser checks
/// again after the site is rebuilt (npm pack dates the package's files to 1985, which would
/// make any heuristic freshness last for years).
pub fn site<S: Clone + Send + Sync + 'static>(root: Option<PathBuf>) -> Router<S> {
    let r = Router::new().route("/models/index.json", get(models_index)).route("/models/{file}", get(model_file));
    let r = match root {
        Some(dir) => r.fallback_service(ServeDir::new(dir)),
        None => r,
    };
    r.layer(middleware::map_response(no_cache))
}

async fn no_cache(mut res: Response) -> Response {
    res.headers_mut().entry(header::CACHE_CONTROL).or_insert(HeaderValue::from_static("no-cache"));
    res
}

async fn models_index() -> Response {
    let dir = catalog::models_dir();
    let models: Vec<_> = catalog::catalog()
        .iter()
        .filter(|e| e.cached_in(&dir).is_some())
        .map(|e| json!({"name": e.name, "url": format!("/models/{}.gguf", e.name), "size": e.size}))
        .collect();
    Json(json!(models)).into_response()
}

/// `/models/<name>.gguf`: a cached catalog model, with Range.
async fn model_file(req: Request) -> Response {
    let path = req.uri().path().strip_prefix("/models/").and_then(|f| f.strip_suffix(".gguf"));
    let file = path.and_then(catalog::find).and_then(|e| e.cached_in(&catalog::models_dir()));
    match file {
        Some(file) => match ServeFile::new(file).oneshot(req).await {
            // The package keeps models in its own cache; the browser's HTTP cache holding
            // hundreds of MB of ranges (and revalidating them) would only cost.
            Ok(mut res) => {
                res.headers_mut().insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
                res.map(Body::new)
            }
            Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, format!("{e}\n")).into_response(),
        },
        None => (StatusCode::NOT_FOUND, "not found\n").into_response(),
    }
}

/// One line per request on stderr, `METHOD PATH STATUS BYTES [range R] MSms`, written when the
/// response body ends or is dropped (a disconnect), so BYTES is what was sent and MS the whole
/// response, streams included.
pub async fn log_requests(req: Request, next: Next) -> Response {
    let range = req.headers().get(header::RANGE).and_then(|v| v.to_str().ok()).map(|r| format!(" range {r}")).unwrap_or_default();
    let head = format!("{} {}", req.method(), req.uri().path());
    let t0 = Instant::now();
    let res = next.run(req).await;
    let status = res.status().as_u16();
    res.map(|inner| Body::new(Logged { inner, bytes: 0, line: Some((head, status, range, t0)) }))
}

/// A response body that counts the bytes it yields and logs its request line when dropped.
struct Logged {
    inner: Body,
    bytes: u64,
    line: Option<(String, u16, String, Instant)>,
}

impl http_body::Body for Logged {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        if let Poll::Ready(Some(Ok(frame))) = &polled {
            self.bytes += frame.data_ref().map_or(0, |d| d.len() as u64);
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl Drop for Logged {
    fn drop(&mut self) {
        if let Some((head, status, range, t0)) = self.line.take() {
            eprintln!("{head} {status} {}{range} {:.0}ms", self.bytes, t0.elapsed().as_secs_f64() * 1e3);
        }
    }
}

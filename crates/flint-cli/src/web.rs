//! `flint web`: a small static HTTP server for the chat page (the site `scripts/build-web.sh`
//! builds) and the cached catalog models, with the Range support the browser engine uses.
//!
//! Routes: `/models/index.json` lists the cached catalog models; `/models/<name>.gguf` serves
//! one; everything else is a file under `--root`. GET and HEAD only; one thread per
//! connection; each response closes its connection.

use std::fs::File;
use std::io::{BufRead, BufReader, Read, Seek, SeekFrom, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Component, Path, PathBuf};

use clap::Args;
use serde_json::json;

use crate::catalog;
use crate::Failure;

#[derive(Args)]
pub struct WebArgs {
    /// Port to listen on (0 picks a free one; the address is printed).
    #[arg(long, default_value_t = 8080)]
    port: u16,
    /// Address to bind (loopback by default: the server is for local use).
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    /// The site to serve (built by `bash scripts/build-web.sh`).
    #[arg(long, default_value = "target/web/site")]
    root: PathBuf,
    /// Print one line per request on stderr: METHOD PATH STATUS BYTES [range].
    #[arg(long)]
    log: bool,
}

pub fn web(args: WebArgs) -> Result<(), Failure> {
    if !args.root.join("index.html").is_file() {
        return Err(Failure::usage(format!(
            "{} has no index.html: build the site with `bash scripts/build-web.sh` or pass --root",
            args.root.display()
        )));
    }
    let listener = TcpListener::bind((args.host.as_str(), args.port))
        .map_err(|e| Failure::usage(format!("cannot listen on {}:{}: {e}", args.host, args.port)))?;
    let addr = listener.local_addr().map_err(Failure::runtime)?;
    println!("listening on http://{addr}");
    let _ = std::io::stdout().flush();
    let root = std::sync::Arc::new(args.root);
    for stream in listener.incoming() {
        let Ok(stream) = stream else { continue };
        let root = root.clone();
        let log = args.log;
        std::thread::spawn(move || {
            if let Err(e) = serve(stream, &root, log) {
                if log {
                    eprintln!("connection error: {e}");
                }
            }
        });
    }
    Ok(())
}

struct Request {
    method: String,
    path: String,
    range: Option<String>,
}

/// Request line and the one header we use; at most 64 header lines of at most 8 KiB.
fn read_request(stream: &TcpStream) -> std::io::Result<Option<Request>> {
    let mut reader = BufReader::new(stream.take(64 * 1024));
    let mut line = String::new();
    if reader.read_line(&mut line)? == 0 {
        return Ok(None);
    }
    let mut parts = line.split_whitespace();
    let (Some(method), Some(target)) = (parts.next(), parts.next()) else { return Ok(None) };
    let (method, path) = (method.to_string(), target.split(['?', '#']).next().unwrap_or("/").to_string());
    let mut range = None;
    for _ in 0..64 {
        let mut h = String::new();
        if reader.read_line(&mut h)? == 0 || h.trim().is_empty() {
            break;
        }
        if let Some((name, value)) = h.split_once(':') {
            if name.trim().eq_ignore_ascii_case("range") {
                range = Some(value.trim().to_string());
            }
        }
    }
    Ok(Some(Request { method, path, range }))
}

/// `%XX` decoding; `None` for malformed escapes or non-UTF-8 results.
fn percent_decode(s: &str) -> Option<String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = std::str::from_utf8(b.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// The file under `root` that `path` names, refusing anything that climbs out of it.
fn site_file(root: &Path, path: &str) -> Option<PathBuf> {
    let decoded = percent_decode(path)?;
    let rel = Path::new(decoded.trim_start_matches('/'));
    if rel.components().any(|c| !matches!(c, Component::Normal(_))) {
        return None;
    }
    let full = root.join(rel);
    let full = if full.is_dir() { full.join("index.html") } else { full };
    full.is_file().then_some(full)
}

fn content_type(path: &Path) -> &'static str {
    match path.extension().and_then(|e| e.to_str()).unwrap_or("") {
        "html" => "text/html; charset=utf-8",
        "js" | "mjs" => "text/javascript; charset=utf-8",
        "css" => "text/css; charset=utf-8",
        "json" => "application/json",
        "wasm" => "application/wasm",
        "png" => "image/png",
        "svg" => "image/svg+xml",
        "ts" => "text/plain; charset=utf-8",
        _ => "application/octet-stream",
    }
}

/// `bytes=a-b`, `bytes=a-` or `bytes=-n` against a file of `len` bytes: the inclusive range,
/// `Err(())` when it cannot be satisfied. Multi-range requests are served whole (`Ok(None)`).
fn parse_range(spec: &str, len: u64) -> Result<Option<(u64, u64)>, ()> {
    let Some(r) = spec.strip_prefix("bytes=") else { return Ok(None) };
    if r.contains(',') {
        return Ok(None);
    }
    let (a, b) = r.split_once('-').ok_or(())?;
    let (start, end) = match (a.trim(), b.trim()) {
        ("", n) => {
            let n: u64 = n.parse().map_err(|_| ())?;
            if n == 0 {
                return Err(());
            }
            (len.saturating_sub(n), len.checked_sub(1).ok_or(())?)
        }
        (a, "") => (a.parse().map_err(|_| ())?, len.checked_sub(1).ok_or(())?),
        (a, b) => (a.parse().map_err(|_| ())?, b.parse::<u64>().map_err(|_| ())?.min(len.saturating_sub(1))),
    };
    if start > end || start >= len {
        return Err(());
    }
    Ok(Some((start, end)))
}

fn models_index() -> serde_json::Value {
    let dir = catalog::models_dir();
    let models: Vec<_> = catalog::catalog()
        .iter()
        .filter(|e| e.cached_in(&dir).is_some())
        .map(|e| json!({"name": e.name, "url": format!("/models/{}.gguf", e.name), "size": e.size}))
        .collect();
    json!(models)
}

fn serve(mut stream: TcpStream, root: &Path, log: bool) -> std::io::Result<()> {
    let Some(req) = read_request(&stream)? else { return Ok(()) };
    let head_only = req.method == "HEAD";
    let (status, bytes) = if req.method != "GET" && !head_only {
        respond_text(&mut stream, 405, "method not allowed\n")?
    } else if req.path == "/models/index.json" {
        let body = models_index().to_string();
        let hdr = header(200, "application/json", body.len() as u64, None);
        stream.write_all(hdr.as_bytes())?;
        if !head_only {
            stream.write_all(body.as_bytes())?;
        }
        (200, body.len() as u64)
    } else {
        let file = match req.path.strip_prefix("/models/").and_then(|f| f.strip_suffix(".gguf")) {
            Some(name) => catalog::find(name).and_then(|e| e.cached_in(&catalog::models_dir())),
            None => site_file(root, &req.path),
        };
        match file {
            Some(path) => send_file(&mut stream, &path, req.range.as_deref(), head_only)?,
            None => respond_text(&mut stream, 404, "not found\n")?,
        }
    };
    if log {
        let range = req.range.map(|r| format!(" range {r}")).unwrap_or_default();
        eprintln!("{} {} {status} {bytes}{range}", req.method, req.path);
    }
    Ok(())
}

fn header(status: u16, ctype: &str, len: u64, range: Option<(u64, u64, u64)>) -> String {
    let reason = match status {
        200 => "OK",
        206 => "Partial Content",
        404 => "Not Found",
        405 => "Method Not Allowed",
        416 => "Range Not Satisfiable",
        _ => "Error",
    };
    let mut h = format!(
        "HTTP/1.1 {status} {reason}\r\nContent-Type: {ctype}\r\nContent-Length: {len}\r\nAccept-Ranges: bytes\r\n\
         Cache-Control: no-cache\r\nConnection: close\r\n"
    );
    if let Some((a, b, total)) = range {
        h += &format!("Content-Range: bytes {a}-{b}/{total}\r\n");
    }
    h + "\r\n"
}

fn respond_text(stream: &mut TcpStream, status: u16, body: &str) -> std::io::Result<(u16, u64)> {
    stream.write_all(header(status, "text/plain; charset=utf-8", body.len() as u64, None).as_bytes())?;
    stream.write_all(body.as_bytes())?;
    Ok((status, body.len() as u64))
}

fn send_file(stream: &mut TcpStream, path: &Path, range: Option<&str>, head_only: bool) -> std::io::Result<(u16, u64)> {
    let mut file = File::open(path)?;
    let len = file.metadata()?.len();
    let ctype = content_type(path);
    let (status, start, n, content_range) = match range.map(|r| parse_range(r, len)) {
        None | Some(Ok(None)) => (200, 0, len, None),
        Some(Ok(Some((a, b)))) => (206, a, b - a + 1, Some((a, b, len))),
        Some(Err(())) => {
            let hdr = format!(
                "HTTP/1.1 416 Range Not Satisfiable\r\nContent-Range: bytes */{len}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
            );
            stream.write_all(hdr.as_bytes())?;
            return Ok((416, 0));
        }
    };
    stream.write_all(header(status, ctype, n, content_range).as_bytes())?;
    if head_only {
        return Ok((status, 0));
    }
    file.seek(SeekFrom::Start(start))?;
    let sent = std::io::copy(&mut file.take(n), stream)?;
    Ok((status, sent))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges() {
        assert_eq!(parse_range("bytes=0-9", 100), Ok(Some((0, 9))));
        assert_eq!(parse_range("bytes=90-", 100), Ok(Some((90, 99))));
        assert_eq!(parse_range("bytes=-10", 100), Ok(Some((90, 99))));
        assert_eq!(parse_range("bytes=50-500", 100), Ok(Some((50, 99))));
        assert_eq!(parse_range("bytes=100-", 100), Err(()));
        assert_eq!(parse_range("bytes=9-3", 100), Err(()));
        assert_eq!(parse_range("bytes=x-3", 100), Err(()));
        assert_eq!(parse_range("bytes=0-1,5-6", 100), Ok(None));
        assert_eq!(parse_range("items=0-1", 100), Ok(None));
        assert_eq!(parse_range("bytes=0-0", 0), Err(()));
    }

    #[test]
    fn paths_stay_inside_the_root() {
        let dir = std::env::temp_dir().join(format!("flint-web-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("pkg")).unwrap();
        std::fs::write(dir.join("index.html"), "x").unwrap();
        std::fs::write(dir.join("pkg/a b.js"), "x").unwrap();
        assert_eq!(site_file(&dir, "/"), Some(dir.join("index.html")));
        assert_eq!(site_file(&dir, "/pkg/a%20b.js"), Some(dir.join("pkg/a b.js")));
        assert_eq!(site_file(&dir, "/../etc/passwd"), None);
        assert_eq!(site_file(&dir, "/pkg/%2e%2e/%2e%2e/etc/passwd"), None);
        assert_eq!(site_file(&dir, "/%zz"), None);
        assert_eq!(site_file(&dir, "/missing.js"), None);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

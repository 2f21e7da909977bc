//! `flint serve` over real HTTP on a loopback port: the binary started as a user starts it,
//! spoken to with raw HTTP/1.1 so that the bytes themselves are checked (SSE framing, status
//! lines, headers). One server (gemma on the GPU, an API key, small limits) serves every check
//! in order: 503 while loading, keys per route, CORS, the golden prompts at once (the f32
//! reference's greedy text, steps shared), the site and the cached models (Range), SSE, every
//! error status, /tokenize, a disconnect
//! that frees its KV blocks, slow headers, a full queue, and graceful shutdown on SIGTERM.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{model_path, shared};

use serde_json::{json, Value};

const KEY: &str = "test-key-123";

fn json_file(rel: &str) -> Value {
    serde_json::from_str(&std::fs::read_to_string(shared().join(rel)).unwrap()).unwrap()
}

struct Server {
    child: Child,
    addr: String,
}

impl Server {
    fn start(args: &[&str]) -> Server {
        Self::start_env(args, &[])
    }

    fn start_env(args: &[&str], env: &[(&str, &str)]) -> Server {
        let mut child = Command::new(env!("CARGO_BIN_EXE_flint"))
            .arg("serve")
            .args(args)
            .envs(env.iter().copied())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start flint serve");
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
        let addr = line.trim().strip_prefix("listening on http://").unwrap_or_else(|| panic!("first line: {line:?}")).to_string();
        Server { child, addr }
    }

    fn connect(&self) -> TcpStream {
        let s = TcpStream::connect(&self.addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(300))).unwrap();
        s
    }

    /// One request on its own connection; the whole response.
    fn request(&self, method: &str, path: &str, headers: &[(&str, &str)], body: &[u8]) -> Response {
        let mut s = self.connect();
        write_request(&mut s, method, path, headers, body);
        read_response(&mut s)
    }

    fn post(&self, path: &str, body: &Value) -> Response {
        self.request("POST", path, &[("authorization", &format!("Bearer {KEY}"))], body.to_string().as_bytes())
    }

    fn get(&self, path: &str) -> Response {
        self.request("GET", path, &[("authorization", &format!("Bearer {KEY}"))], b"")
    }

    /// Starts a streamed completion and reads until its first event; the rest is left to read.
    fn stream_started(&self, body: &Value) -> BufReader<TcpStream> {
        let mut s = self.connect();
        write_request(&mut s, "POST", "/v1/completions", &[("authorization", &format!("Bearer {KEY}"))], body.to_string().as_bytes());
        let mut r = BufReader::new(s);
        let mut line = String::new();
        while !line.starts_with("data: ") {
            line.clear();
            r.read_line(&mut line).unwrap();
        }
        r
    }

    /// One sample of `/metrics` (no labels or exactly the given labels).
    fn metric(&self, name: &str) -> f64 {
        let text = self.get("/metrics").text();
        text.lines()
            .find_map(|l| l.strip_prefix(name).and_then(|rest| rest.strip_prefix(' ')).map(|v| v.parse::<f64>().unwrap()))
            .unwrap_or_else(|| panic!("no {name} in\n{text}"))
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn write_request(s: &mut TcpStream, method: &str, path: &str, headers: &[(&str, &str)], body: &[u8]) {
    let mut head = format!("{method} {path} HTTP/1.1\r\nhost: localhost\r\nconnection: close\r\ncontent-length: {}\r\n", body.len());
    if !body.is_empty() {
        head.push_str("content-type: application/json\r\n");
    }
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    s.write_all(head.as_bytes()).unwrap();
    // A server that refuses the body (413) may close before it is all sent.
    let _ = s.write_all(body);
}

struct Response {
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Response {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(k, _)| k.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
    }
    fn text(&self) -> String {
        String::from_utf8(self.body.clone()).unwrap()
    }
    fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| panic!("{e}: {:?}", self.text()))
    }
    /// An OpenAI error body's (type, param, code), checking its shape.
    fn error(&self) -> (String, Value, Value) {
        let e = &self.json()["error"];
        assert!(e["message"].as_str().is_some_and(|m| !m.is_empty()), "error without a message: {e}");
        (e["type"].as_str().unwrap().to_string(), e["param"].clone(), e["code"].clone())
    }
}

/// Reads a response to its end (the request asked to close), de-chunking the body.
fn read_response(s: &mut TcpStream) -> Response {
    try_read_response(s).unwrap()
}

/// As [`read_response`], with I/O errors and malformed responses as errors.
fn try_read_response(s: &mut TcpStream) -> std::io::Result<Response> {
    use std::io::{Error, ErrorKind};
    let bad = |what: String| Error::new(ErrorKind::InvalidData, what);
    let mut r = BufReader::new(s);
    let mut line = String::new();
    r.read_line(&mut line)?;
    let status: u16 = line.split_whitespace().nth(1).and_then(|c| c.parse().ok()).ok_or_else(|| bad(format!("status line {line:?}")))?;
    let mut headers = Vec::new();
    loop {
        line.clear();
        r.read_line(&mut line)?;
        let l = line.trim_end();
        if l.is_empty() {
            break;
        }
        let (k, v) = l.split_once(':').ok_or_else(|| bad(format!("header {l:?}")))?;
        headers.push((k.trim().to_lowercase(), v.trim().to_string()));
    }
    let chunked = headers.iter().any(|(k, v)| k == "transfer-encoding" && v.contains("chunked"));
    let mut body = Vec::new();
    if chunked {
        loop {
            line.clear();
            r.read_line(&mut line)?;
            let size = usize::from_str_radix(line.trim(), 16).map_err(|_| bad(format!("chunk size {line:?}")))?;
            if size == 0 {
                break;
            }
            let mut chunk = vec![0; size + 2];
            r.read_exact(&mut chunk)?;
            body.extend_from_slice(&chunk[..size]);
        }
    } else {
        r.read_to_end(&mut body)?;
    }
    Ok(Response { status, headers, body })
}

/// The `data:` payloads of an SSE body, checking the framing: every event is one `data: `
/// line followed by a blank line.
fn sse_data(body: &str) -> Vec<String> {
    let mut out = Vec::new();
    for event in body.split_terminator("\n\n") {
        let data = event.strip_prefix("data: ").unwrap_or_else(|| panic!("an SSE event that is not `data: `: {event:?}"));
        assert!(!data.contains('\n'), "one line per event: {event:?}");
        out.push(data.to_string());
    }
    assert!(body.ends_with("\n\n"), "the stream ends with a whole event");
    out
}

fn golden_prompt(i: usize) -> String {
    let name = if i == 6 { "p6g.txt".to_string() } else { format!("p{i}.txt") };
    std::fs::read_to_string(shared().join("golden/prompts").join(name)).unwrap()
}

#[test]
fn flint_serve_over_http() {
    // No adapter: a skip, or a failure under FLINT_REQUIRE_GPU=1.
    if flint_gpu::testing::context().is_none() {
        return;
    }
    let model = model_path("gemma-3-270m");
    let site = std::env::temp_dir().join(format!("flint-serve-site-{}", std::process::id()));
    std::fs::create_dir_all(site.join("pkg")).unwrap();
    std::fs::write(site.join("index.html"), "<!doctype html>page").unwrap();
    let data: Vec<u8> = (0..=255u8).collect();
    std::fs::write(site.join("pkg/a b.bin"), &data).unwrap();
    let server = Server::start(&[
        "-m",
        &model,
        "--port",
        "0",
        "-c",
        "256",
        "--parallel",
        "8",
        "--api-key",
        KEY,
        "--max-queue",
        "8",
        "--header-timeout",
        "1",
        "--shutdown-timeout",
        "1",
        "--cors",
        "http://app.example",
        "--static",
        site.to_str().unwrap(),
        // The warm-up (on by default) runs in tests/web/serve.test.mjs; here it would only
        // compile the 2-4-token kernels that nothing below uses.
        "--no-warmup",
    ]);

    // Bound before the model is loaded: 503 until it is.
    let first = server.request("GET", "/health", &[], b"");
    assert_eq!(first.status, 503, "health before the model is loaded: {}", first.text());
    let early = server.post("/v1/completions", &json!({"prompt": "a", "max_tokens": 1}));
    assert_eq!(early.status, 503);
    let t0 = Instant::now();
    while server.request("GET", "/health", &[], b"").status != 200 {
        assert!(t0.elapsed() < Duration::from_secs(120), "the model never loaded");
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(server.request("GET", "/health", &[], b"").json(), json!({"status": "ok"}));

    // Keys per route: health and the model list are open; the rest need the bearer key.
    let models = server.request("GET", "/v1/models", &[], b"");
    assert_eq!(models.status, 200);
    assert_eq!(models.json()["data"][0]["id"], "gemma-3-270m");
    let body = json!({"prompt": "a", "max_tokens": 1}).to_string();
    for headers in [vec![], vec![("authorization", "Bearer wrong")], vec![("authorization", KEY)]] {
        let r = server.request("POST", "/v1/completions", &headers, body.as_bytes());
        assert_eq!(r.status, 401, "{headers:?}");
        assert_eq!(r.error().0, "authentication_error");
    }
    for path in ["/metrics", "/tokenize"] {
        let method = if path == "/metrics" { "GET" } else { "POST" };
        assert_eq!(server.request(method, path, &[], b"{}").status, 401, "{path}");
    }

    // The site: open without the key, with Range, nothing outside its root. The cached models
    // need the key.
    let page = server.request("GET", "/", &[], b"");
    assert_eq!((page.status, page.text().as_str()), (200, "<!doctype html>page"));
    assert_eq!(page.header("cache-control"), Some("no-cache"));
    let part = server.request("GET", "/pkg/a%20b.bin", &[("range", "bytes=16-31")], b"");
    assert_eq!((part.status, part.body.as_slice()), (206, &data[16..32]));
    assert_eq!(part.header("content-range"), Some("bytes 16-31/256"));
    assert_eq!(server.request("GET", "/pkg/a%20b.bin", &[("range", "bytes=300-")], b"").status, 416);
    for path in ["/../index.html", "/pkg/%2e%2e/%2e%2e/etc/passwd", "/missing.js"] {
        assert_eq!(server.request("GET", path, &[], b"").status, 404, "{path}");
    }
    assert_eq!(server.request("GET", "/models/index.json", &[], b"").status, 401);
    let index = server.get("/models/index.json").json();
    assert!(index.as_array().unwrap().iter().any(|m| m["url"] == "/models/gemma-3-270m.gguf"), "{index}");
    let magic = server.request("GET", "/models/gemma-3-270m.gguf", &[("authorization", &format!("Bearer {KEY}")), ("range", "bytes=0-3")], b"");
    assert_eq!((magic.status, magic.body.as_slice()), (206, b"GGUF".as_slice()));
    assert_eq!(server.request("GET", "/models/gemma-3-270m.gguf", &[("range", "bytes=0-3")], b"").status, 401);
    std::fs::remove_dir_all(&site).unwrap();

    // CORS: a preflight from an allowed origin is answered without the key; others get no grant.
    let preflight = |origin: &str| {
        let h = [("origin", origin), ("access-control-request-method", "POST"), ("access-control-request-headers", "authorization,content-type")];
        server.request("OPTIONS", "/v1/chat/completions", &h, b"")
    };
    let ok = preflight("http://app.example");
    assert_eq!(ok.status, 200);
    assert_eq!(ok.header("access-control-allow-origin"), Some("http://app.example"));
    assert!(ok.header("access-control-allow-headers").is_some_and(|h| h.contains("authorization")));
    assert_eq!(preflight("http://evil.example").header("access-control-allow-origin"), None);
    let r = server.request("GET", "/health", &[("origin", "http://app.example")], b"");
    assert_eq!(r.header("access-control-allow-origin"), Some("http://app.example"));

    // The golden raw prompts at once: each the f32 reference's greedy text, sharing steps.
    let steps_before = server.metric("flint_steps_total");
    let answers: Vec<Response> = std::thread::scope(|s| {
        let jobs: Vec<_> = (1..=6)
            .map(|i| {
                let server = &server;
                s.spawn(move || {
                    server.post("/v1/completions", &json!({"model": "gemma-3-270m", "prompt": golden_prompt(i), "max_tokens": 16, "temperature": 0}))
                })
            })
            .collect();
        jobs.into_iter().map(|j| j.join().unwrap()).collect()
    });
    for (i, r) in (1..=6).zip(&answers) {
        assert_eq!(r.status, 200, "prompt {i}: {}", r.text());
        let v = r.json();
        let reference = json_file(&format!("golden/f32/gemma/{i}.json"));
        assert_eq!(v["object"], "text_completion");
        assert_eq!(v["choices"][0]["text"], reference["greedy_text_16"], "prompt {i}");
        assert_eq!(v["choices"][0]["finish_reason"], "length");
        let usage = &v["usage"];
        assert_eq!(usage["prompt_tokens"].as_u64().unwrap() as usize, reference["prompt_token_ids"].as_array().unwrap().len());
        assert_eq!(usage["completion_tokens"], 16);
        assert!(usage["prompt_tokens_details"]["cached_tokens"].is_u64());
        assert_eq!(usage["completion_tokens_details"], json!({"accepted_prediction_tokens": 0, "rejected_prediction_tokens": 0}));
    }
    let steps = server.metric("flint_steps_total") - steps_before;
    let single = server.metric("flint_batch_sequences_bucket{le=\"1\"}");
    let all = server.metric("flint_batch_sequences_count");
    assert!(all > single, "no step ran more than one sequence ({all} steps, {single} of one)");
    assert!(steps < 6.0 * 17.0, "{steps} steps for 6 requests of 16 tokens: they did not share steps");

    // Predicted outputs draft from the prediction: the reply is the same, right or wrong, and
    // usage and /metrics count what the model accepted and rejected.
    let want = json_file("golden/f32/gemma/2.json")["greedy_text_16"].as_str().unwrap().to_string();
    let drafted_before = server.metric("flint_spec_draft_tokens_total");
    let predicted = |prediction: &str| {
        let body = json!({"prompt": golden_prompt(2), "max_tokens": 16, "temperature": 0, "prediction": {"type": "content", "content": prediction}});
        let v = server.post("/v1/completions", &body).json();
        assert_eq!(v["choices"][0]["text"], want.as_str(), "prediction {prediction:?}: {v}");
        let d = &v["usage"]["completion_tokens_details"];
        (d["accepted_prediction_tokens"].as_u64().unwrap(), d["rejected_prediction_tokens"].as_u64().unwrap())
    };
    let (right, _) = predicted(&want);
    assert!(right >= 8, "a correct prediction of 16 tokens had {right} accepted");
    let wrong = want.replace("return", "yield");
    let (_, rejected) = predicted(&wrong);
    assert!(rejected > 0, "a wrong prediction had nothing rejected");
    eprintln!("predictions: {right} tokens of the right one accepted, {rejected} of the wrong one rejected");
    assert!(server.metric("flint_spec_draft_tokens_total") > drafted_before, "/metrics counts drafts");
    assert!(server.metric("flint_spec_accepted_tokens_total") >= right as f64);

    // SSE as OpenAI sends it: data lines, one id, the finish chunk, usage, [DONE].
    let r = server.post(
        "/v1/completions",
        &json!({"prompt": golden_prompt(1), "max_tokens": 4, "temperature": 0, "stream": true, "stream_options": {"include_usage": true}}),
    );
    assert_eq!(r.status, 200);
    assert!(r.header("content-type").is_some_and(|c| c.starts_with("text/event-stream")));
    let data = sse_data(&r.text());
    assert_eq!(data.last().unwrap(), "[DONE]");
    let chunks: Vec<Value> = data[..data.len() - 1].iter().map(|d| serde_json::from_str(d).unwrap()).collect();
    let id = chunks[0]["id"].as_str().unwrap();
    assert!(chunks.iter().all(|c| c["id"] == id), "one id for every chunk");
    let usage = chunks.last().unwrap();
    assert_eq!(usage["choices"], json!([]));
    assert_eq!(usage["usage"]["completion_tokens"], 4);
    let finish: Vec<&Value> = chunks.iter().filter(|c| !c["choices"][0]["finish_reason"].is_null()).collect();
    assert_eq!(finish.len(), 1);
    assert_eq!(finish[0]["choices"][0]["finish_reason"], "length");
    let text: String = chunks.iter().filter_map(|c| c["choices"][0]["text"].as_str()).collect();
    let want16 = json_file("golden/f32/gemma/1.json")["greedy_text_16"].as_str().unwrap().to_string();
    assert!(want16.starts_with(&text) && !text.is_empty(), "streamed {text:?}, reference {want16:?}");

    // Every error status with OpenAI's body.
    let bad = |body: &Value| server.post("/v1/completions", body);
    let r = bad(&json!({"prompt": "a", "temperature": 3}));
    assert_eq!((r.status, r.error()), (400, ("invalid_request_error".into(), json!("temperature"), Value::Null)));
    let r = bad(&json!({"prompt": "a", "n": 0}));
    assert_eq!((r.status, r.error().1), (400, json!("n")));
    let r = bad(&json!({"prompt": "a", "model": "gpt-4"}));
    assert_eq!((r.status, r.error().2), (404, json!("model_not_found")));
    let r = bad(&json!({"prompt": golden_prompt(5).repeat(2)}));
    assert_eq!((r.status, r.error().2), (400, json!("context_length_exceeded")));
    let r = bad(&json!({"prompt": "a", "max_tokens": 300}));
    assert_eq!((r.status, r.error().2), (400, json!("context_length_exceeded")));
    // OpenAI's legacy `functions` is not built: refused by name, never ignored.
    let r = server.post("/v1/chat/completions", &json!({"messages": [{"role": "user", "content": "hi"}], "functions": [{"name": "f"}]}));
    assert_eq!((r.status, r.error().1), (400, json!("functions")));
    let tools = json!([{"type": "function", "function": {"name": "f"}}]);
    let r = server.post(
        "/v1/chat/completions",
        &json!({"messages": [{"role": "user", "content": "hi"}], "tools": tools, "tool_choice": {"type": "function", "function": {"name": "g"}}}),
    );
    assert_eq!((r.status, r.error().1), (400, json!("tool_choice")));
    let r = server.request("POST", "/v1/completions", &[("authorization", &format!("Bearer {KEY}"))], b"{\"prompt\": ");
    assert_eq!((r.status, r.error().0.as_str()), (400, "invalid_request_error"));
    let big = vec![b' '; 5 << 20];
    let r = server.request("POST", "/v1/completions", &[("authorization", &format!("Bearer {KEY}"))], &big);
    assert_eq!(r.status, 413);
    // 32 MiB written whole before the answer is read: the server reads and discards it, so the
    // client reads a 413 rather than a reset connection.
    let huge = vec![b' '; 32 << 20];
    let mut s = server.connect();
    let head = format!("POST /v1/completions HTTP/1.1\r\nhost: localhost\r\nauthorization: Bearer {KEY}\r\ncontent-length: {}\r\n\r\n", huge.len());
    s.write_all(head.as_bytes()).unwrap();
    s.write_all(&huge).expect("the server takes the whole body");
    let r = read_response(&mut s);
    assert_eq!((r.status, r.error().0.as_str()), (413, "invalid_request_error"));
    r.error();
    assert_eq!(server.get("/v1/completions").status, 405);
    assert_eq!(server.get("/v1/nothing").status, 404);

    // /tokenize and /detokenize round trip (llama.cpp's shapes).
    let t = server.post("/tokenize", &json!({"content": "Hello world", "with_pieces": true})).json();
    let ids: Vec<Value> = t["tokens"].as_array().unwrap().iter().map(|p| p["id"].clone()).collect();
    let pieces: String = t["tokens"].as_array().unwrap().iter().map(|p| p["piece"].as_str().unwrap()).collect();
    assert_eq!(pieces, "Hello world");
    assert_eq!(server.post("/detokenize", &json!({"tokens": ids})).json()["content"], "Hello world");
    assert_eq!(server.post("/detokenize", &json!({"tokens": [u32::MAX]})).status, 400);

    // A client that goes away mid-stream: its sequence is cancelled and its blocks freed.
    assert_eq!(server.metric("flint_kv_blocks_used"), 0.0);
    let aborted_before = server.metric("flint_requests_total{finish_reason=\"abort\"}");
    let mut s = server.connect();
    let body = json!({"prompt": golden_prompt(2), "max_tokens": 200, "stream": true}).to_string();
    write_request(&mut s, "POST", "/v1/completions", &[("authorization", &format!("Bearer {KEY}"))], body.as_bytes());
    let mut r = BufReader::new(s.try_clone().unwrap());
    let mut line = String::new();
    while !line.starts_with("data: ") {
        line.clear();
        r.read_line(&mut line).unwrap();
    }
    assert!(server.metric("flint_kv_blocks_used") > 0.0, "a streaming request holds blocks");
    drop(r);
    s.shutdown(std::net::Shutdown::Both).unwrap();
    drop(s);
    let t0 = Instant::now();
    while server.metric("flint_kv_blocks_used") > 0.0 {
        assert!(t0.elapsed() < Duration::from_secs(60), "the disconnected request kept its blocks");
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(server.metric("flint_requests_total{finish_reason=\"abort\"}"), aborted_before + 1.0);

    // A client that trickles its headers is cut off after --header-timeout (1 s).
    let mut slow = server.connect();
    slow.write_all(b"POST /v1/completions HTTP/1.1\r\nhost: x\r\n").unwrap();
    slow.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let t0 = Instant::now();
    let mut buf = Vec::new();
    let _ = slow.read_to_end(&mut buf);
    assert!(t0.elapsed() < Duration::from_secs(15), "a slow client held its connection");

    // A full queue: more requests waiting for a first token than --max-queue get 429.
    let statuses: Vec<(u16, Option<String>)> = std::thread::scope(|s| {
        let jobs: Vec<_> = (0..12)
            .map(|i| {
                let server = &server;
                s.spawn(move || {
                    let r = server.post("/v1/completions", &json!({"prompt": format!("Number {i} is"), "max_tokens": 1}));
                    (r.status, r.header("retry-after").map(str::to_string))
                })
            })
            .collect();
        jobs.into_iter().map(|j| j.join().unwrap()).collect()
    });
    assert!(statuses.iter().any(|(s, ra)| *s == 429 && ra.is_some()), "{statuses:?}");
    assert!(statuses.iter().all(|(s, _)| *s == 200 || *s == 429), "{statuses:?}");
    assert!(statuses.iter().filter(|(s, _)| *s == 200).count() >= 8, "{statuses:?}");

    // Graceful shutdown: SIGTERM lets the running stream end (abort after 1 s), exit 0. With
    // ignore_eos the stream cannot end on its own first (a sampled end-of-generation token did,
    // once in CI).
    let mut r = server.stream_started(&json!({"prompt": golden_prompt(3), "max_tokens": 200, "stream": true, "ignore_eos": true}));
    let mut server = server;
    let pid = server.child.id().to_string();
    assert!(Command::new("kill").args(["-TERM", &pid]).status().unwrap().success());
    let mut rest = String::new();
    r.read_to_string(&mut rest).unwrap();
    assert!(rest.contains("\"finish_reason\":\"abort\""), "the running stream did not end with abort: {rest}");
    assert!(rest.contains("data: [DONE]"));
    let status = server.child.wait().unwrap();
    assert!(status.success(), "exit status {status}");
}

/// A hostile chat template (`--chat-template-file`) answers 400 naming the budget it passed,
/// and the server keeps serving.
/// The request-case table (`tests/requests/cases.json`) over HTTP: each case's status, and for
/// a refusal OpenAI's `param` and `code`. The npm package answers the same table in Chromium
/// (tests/web/package.test.mjs), read by the same reader.
#[test]
fn request_cases_answer_as_the_table_says() {
    if flint_gpu::testing::context().is_none() {
        return;
    }
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/requests");
    let table: Value = serde_json::from_str(&std::fs::read_to_string(dir.join("cases.json")).unwrap()).unwrap();
    let model = shared().join("golden/families/qwen3/model.gguf");
    let template = dir.join("template.jinja");
    let args = ["-m", model.to_str().unwrap(), "--port", "0", "-c", "1024", "--chat-template-file", template.to_str().unwrap(), "--no-warmup"];
    let server = Server::start(&args);
    while server.request("GET", "/health", &[], b"").status != 200 {
        std::thread::sleep(Duration::from_millis(100));
    }
    let cases = table["cases"].as_array().unwrap();
    assert!(cases.len() >= 40, "the table has its cases");
    for case in cases {
        let name = case["name"].as_str().unwrap();
        let path = if case["endpoint"] == "chat" { "/v1/chat/completions" } else { "/v1/completions" };
        let r = server.post(path, &case["body"]);
        assert_eq!(r.status as u64, case["status"].as_u64().unwrap(), "{name}: {}", r.text());
        if r.status == 200 {
            let n = case["body"]["n"].as_u64().unwrap_or(1) as usize;
            assert_eq!(r.json()["choices"].as_array().unwrap().len(), n, "{name}");
        } else {
            let (kind, param, code) = r.error();
            assert_eq!(kind, "invalid_request_error", "{name}");
            assert_eq!((param, code), (case["param"].clone(), case["code"].clone()), "{name}: {}", r.text());
        }
    }
}

#[test]
fn hostile_chat_template_is_a_400() {
    let file = std::env::temp_dir().join(format!("flint-serve-hostile-{}.jinja", std::process::id()));
    std::fs::write(&file, "{% set ns = namespace(s='x') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s }}").unwrap();
    // qwen (no sliding-window layers) with --parallel 1: a pool of one context (and a
    // copy-on-write's spare block) loads.
    let model = model_path("qwen2.5-coder-0.5b");
    let template = file.to_str().unwrap();
    let server =
        Server::start(&["-m", &model, "--port", "0", "--backend", "cpu", "--parallel", "1", "--no-warmup", "--api-key", KEY, "--chat-template-file", template]);
    let t0 = Instant::now();
    while server.request("GET", "/health", &[], b"").status != 200 {
        assert!(t0.elapsed() < Duration::from_secs(120), "the model never loaded");
        std::thread::sleep(Duration::from_millis(100));
    }
    let chat = json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2});
    for _ in 0..2 {
        let r = server.post("/v1/chat/completions", &chat);
        assert_eq!((r.status, r.error().1), (400, json!("messages")), "{}", r.text());
        assert!(r.json()["error"]["message"].as_str().unwrap().contains("chat template stopped"), "{}", r.text());
    }
    assert_eq!(server.post("/v1/completions", &json!({"prompt": "a", "max_tokens": 1})).status, 200);
    std::fs::remove_file(&file).unwrap();
}

/// The self-test runs at start-up by default: with a deliberately wrong kernel (the test-only
/// switch) the server never says it is healthy and exits 2 with one line naming the adapter
/// and the first tap that differs.
#[test]
fn a_failed_self_test_stops_the_server() {
    if flint_gpu::testing::context().is_none() {
        return;
    }
    let model = shared().join("golden/families/qwen3/model.gguf");
    let mut child = Command::new(env!("CARGO_BIN_EXE_flint"))
        .args(["serve", "-m", model.to_str().unwrap(), "--port", "0", "-c", "256", "--no-warmup"])
        .env("FLINT_TEST_WRONG_KERNEL", "glu")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start flint serve");
    let mut line = String::new();
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    stdout.read_line(&mut line).unwrap();
    let addr = line.trim().strip_prefix("listening on http://").unwrap_or_else(|| panic!("first line: {line:?}")).to_string();
    let t0 = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        // Until it exits it answers, and never healthy (it may exit mid-request).
        if let Ok(mut s) = TcpStream::connect(&addr) {
            s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
            let mut reply = String::new();
            if s.write_all(b"GET /health HTTP/1.1\r\nhost: localhost\r\nconnection: close\r\n\r\n").is_ok() {
                let _ = s.read_to_string(&mut reply);
            }
            assert!(!reply.starts_with("HTTP/1.1 200"), "healthy with a wrong kernel: {reply}");
        }
        assert!(t0.elapsed() < Duration::from_secs(300), "the server neither failed nor started");
        std::thread::sleep(Duration::from_millis(200));
    };
    let mut stderr = String::new();
    child.stderr.take().unwrap().read_to_string(&mut stderr).unwrap();
    assert_eq!(status.code(), Some(2), "{stderr}");
    let errors: Vec<&str> = stderr.lines().filter(|l| l.starts_with("error:")).collect();
    assert_eq!(errors.len(), 1, "{stderr}");
    let adapter = &flint_gpu::testing::context().unwrap().info.name;
    assert!(errors[0].contains(&format!("self-test failed on {adapter}")), "{stderr}");
    assert!(errors[0].contains("layer 0 after the feed-forward block differs from the CPU reference"), "{stderr}");
}

/// A GPU device lost under a running stream (the `FLINT_TEST_FAULTS=1` hook): the stream ends
/// with a `device_lost` error event and `[DONE]`, its blocks are freed, and the next request
/// gets a new device and the model reloaded, with the same text as before, in the same
/// process.
#[test]
fn a_lost_device_ends_the_stream_and_the_server_recovers() {
    if flint_gpu::testing::context().is_none() {
        return;
    }
    let model = shared().join("golden/families/qwen3/model.gguf");
    let server =
        Server::start_env(&["-m", model.to_str().unwrap(), "--port", "0", "-c", "512", "--api-key", KEY, "--no-warmup"], &[("FLINT_TEST_FAULTS", "1")]);
    let t0 = Instant::now();
    while server.request("GET", "/health", &[], b"").status != 200 {
        assert!(t0.elapsed() < Duration::from_secs(300), "the model never loaded");
        std::thread::sleep(Duration::from_millis(100));
    }
    let greedy = json!({"prompt": "Once upon a time", "max_tokens": 16, "temperature": 0, "ignore_eos": true});
    let before = server.post("/v1/completions", &greedy);
    assert_eq!(before.status, 200, "{}", before.text());

    let mut r = server.stream_started(&json!({"prompt": "Once upon a time", "max_tokens": 400, "temperature": 0, "ignore_eos": true, "stream": true}));
    assert_eq!(server.post("/test/lose-device", &json!({})).status, 200);
    let mut rest = String::new();
    r.read_to_string(&mut rest).unwrap();
    // (The body is chunked: find the events' lines.)
    let error: Value = rest
        .lines()
        .find_map(|l| l.strip_prefix("data: {\"error\"").map(|_| serde_json::from_str(&l["data: ".len()..]).unwrap()))
        .unwrap_or_else(|| panic!("no error event: {rest}"));
    assert_eq!(error["error"]["code"], "device_lost", "{rest}");
    assert!(error["error"]["message"].as_str().unwrap().contains("the GPU device was lost"), "{rest}");
    assert!(rest.contains("data: [DONE]"), "{rest}");
    assert!(!rest.contains("\"finish_reason\":\"length\""), "the stream ran to its end: {rest}");
    assert_eq!(server.metric("flint_kv_blocks_used"), 0.0);

    // The next request reloads the model on a new device; the text is the same as before.
    let after = server.post("/v1/completions", &greedy);
    assert_eq!(after.status, 200, "{}", after.text());
    assert_eq!(after.json()["choices"][0]["text"], before.json()["choices"][0]["text"]);
    assert_eq!(server.request("GET", "/health", &[], b"").status, 200);
    assert_eq!(server.metric("flint_kv_blocks_used"), 0.0);
}

/// What one client of the load test saw.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Outcome {
    /// A whole 200 response (a stream to its `[DONE]`).
    Complete,
    /// An OpenAI error body with this status.
    ApiError(u16),
    /// The client went away mid-stream.
    ClientEnded,
    /// A client trickling its headers, cut off by the server.
    CutOff,
}

/// The resident set of process `pid` in KiB.
fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status.lines().find_map(|l| l.strip_prefix("VmRSS:")).and_then(|v| v.split_whitespace().next()).and_then(|v| v.parse().ok()).unwrap()
}

/// One request of kind `kind` (0..7) from a load-test client.
fn load_request(addr: &str, kind: u64, seed: u64) -> Outcome {
    let auth = format!("Bearer {KEY}");
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
    let post = |s: &mut TcpStream, body: &[u8]| write_request(s, "POST", "/v1/completions", &[("authorization", &auth)], body);
    let prompt = format!("Request {seed} says");
    let answer = |s: &mut TcpStream| -> Outcome {
        let r = try_read_response(s).unwrap_or_else(|e| panic!("request kind {kind} lost its response: {e}"));
        if r.status == 200 {
            let text = r.text();
            // A stream's end, or a whole completion.
            assert!(text.contains("data: [DONE]") || r.json()["choices"][0]["finish_reason"].is_string(), "kind {kind}: {text}");
            if text.contains("data: {\"error\"") {
                return Outcome::ApiError(200);
            }
            return Outcome::Complete;
        }
        r.error();
        Outcome::ApiError(r.status)
    };
    match kind {
        // Plain and streamed completions, seeded sampling.
        0 | 1 => {
            let body = json!({"prompt": prompt, "max_tokens": 1 + seed % 12, "temperature": 0.8, "seed": seed, "stream": kind == 1});
            post(&mut s, body.to_string().as_bytes());
            answer(&mut s)
        }
        // A stream the client leaves after its first event.
        2 => {
            post(&mut s, json!({"prompt": prompt, "max_tokens": 64, "stream": true}).to_string().as_bytes());
            let mut r = BufReader::new(&mut s);
            let mut line = String::new();
            r.read_line(&mut line).unwrap();
            if !line.contains(" 200 ") {
                drop(r);
                return Outcome::ApiError(line.split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or(0));
            }
            while !line.starts_with("data: ") {
                line.clear();
                if r.read_line(&mut line).unwrap() == 0 {
                    panic!("a stream ended before its first event");
                }
            }
            drop(r);
            s.shutdown(std::net::Shutdown::Both).unwrap();
            Outcome::ClientEnded
        }
        // Malformed JSON, and an out-of-range value.
        3 => {
            post(&mut s, b"{\"prompt\": ");
            answer(&mut s)
        }
        4 => {
            post(&mut s, json!({"prompt": prompt, "temperature": 7}).to_string().as_bytes());
            answer(&mut s)
        }
        // A body past the limit.
        5 => {
            post(&mut s, &vec![b' '; 5 << 20]);
            answer(&mut s)
        }
        // Headers one byte a second: the server cuts the connection after --header-timeout.
        _ => {
            let t0 = Instant::now();
            for &b in b"POST /v1/completions HTTP/1.1\r\nhost: x\r\n" {
                if s.write_all(&[b]).is_err() {
                    break;
                }
                std::thread::sleep(Duration::from_secs(1));
                let mut probe = [0u8; 1];
                s.set_nonblocking(true).unwrap();
                let closed = matches!(s.read(&mut probe), Ok(0));
                s.set_nonblocking(false).unwrap();
                if closed {
                    break;
                }
            }
            assert!(t0.elapsed() < Duration::from_secs(30), "a slow client held its connection for {:?}", t0.elapsed());
            Outcome::CutOff
        }
    }
}

/// The server under load and faults (issue 14, part 5): 32 clients, 8 requests each of mixed
/// kinds (plain, streamed, left mid-stream, malformed, out of range, oversize, headers at one
/// byte a second), then a burst past --max-queue. Every request ends complete, with an OpenAI
/// error, or by its own client; afterwards nothing runs, no KV block is held, the resident
/// set is within 10% of its level after the warm-up, and /health answers.
/// `FLINT_SOAK_SECS=1800` makes it a soak: rounds of the same load for that long.
#[test]
fn the_server_under_load_and_faults_loses_nothing() {
    if flint_gpu::testing::context().is_none() {
        return;
    }
    let model = shared().join("golden/families/qwen3/model.gguf");
    let server = Server::start(&[
        "-m",
        model.to_str().unwrap(),
        "--port",
        "0",
        "-c",
        "512",
        "--parallel",
        "8",
        "--api-key",
        KEY,
        "--max-queue",
        "16",
        "--header-timeout",
        "2",
    ]);
    let t0 = Instant::now();
    while server.request("GET", "/health", &[], b"").status != 200 {
        assert!(t0.elapsed() < Duration::from_secs(300), "the model never loaded");
        std::thread::sleep(Duration::from_millis(100));
    }
    let pid = server.child.id();
    let run = |clients: u64, per_client: u64, salt: u64| -> std::collections::BTreeMap<Outcome, usize> {
        let outcomes: Vec<Outcome> = std::thread::scope(|sc| {
            let jobs: Vec<_> = (0..clients)
                .map(|c| {
                    let addr = server.addr.clone();
                    sc.spawn(move || {
                        // A fixed pseudo-random mix per client.
                        let mut x = ((c + 1) * 0x9E37_79B9_7F4A_7C15) ^ salt;
                        (0..per_client)
                            .map(|i| {
                                x ^= x << 13;
                                x ^= x >> 7;
                                x ^= x << 17;
                                // Slow clients are rare: two a run of 32.
                                let kind = if (c + salt) % 16 == 5 && i == 0 { 6 } else { x % 6 };
                                load_request(&addr, kind, c * 100 + i)
                            })
                            .collect::<Vec<_>>()
                    })
                })
                .collect();
            jobs.into_iter().flat_map(|j| j.join().unwrap()).collect()
        });
        let mut counts = std::collections::BTreeMap::new();
        for o in outcomes {
            *counts.entry(o).or_insert(0) += 1;
        }
        counts
    };
    let idle = |what: &str| {
        let t0 = Instant::now();
        while server.metric("flint_requests_running") > 0.0 || server.metric("flint_kv_blocks_used") > 0.0 {
            assert!(t0.elapsed() < Duration::from_secs(60), "{what}: requests still running or blocks held");
            std::thread::sleep(Duration::from_millis(100));
        }
    };
    // Warm-up: the same mix, smaller.
    let warm = run(16, 2, 1);
    idle("after the warm-up");
    let rss_warm = rss_kib(pid);
    // FLINT_SOAK_SECS=N (by hand): rounds of the load for N seconds, not one.
    let soak = std::env::var("FLINT_SOAK_SECS").ok().and_then(|v| v.parse::<u64>().ok());
    let (t_load, mut rounds) = (Instant::now(), 0u64);
    let mut counts = std::collections::BTreeMap::new();
    loop {
        for (o, n) in run(32, 8, 2 + rounds) {
            *counts.entry(o).or_insert(0) += n;
        }
        rounds += 1;
        if soak.is_none_or(|secs| t_load.elapsed() >= Duration::from_secs(secs)) {
            break;
        }
        idle("between soak rounds");
        eprintln!("soak round {rounds} at {:?}: RSS {} KiB, {counts:?}", t_load.elapsed(), rss_kib(pid));
    }
    eprintln!("load: {rounds} rounds in {:?}: {counts:?}", t_load.elapsed());
    let total: usize = counts.values().sum();
    assert_eq!(total as u64, rounds * 32 * 8);
    assert!(counts.keys().all(|o| matches!(o, Outcome::Complete | Outcome::ApiError(400 | 413 | 429) | Outcome::ClientEnded | Outcome::CutOff)), "{counts:?}");
    for o in [Outcome::Complete, Outcome::ApiError(400), Outcome::ApiError(413), Outcome::ClientEnded, Outcome::CutOff] {
        assert!(counts.contains_key(&o), "no request ended {o:?}: {counts:?} (warm-up {warm:?})");
    }

    // A burst past --max-queue: long prompts, all at once; the excess gets 429 + Retry-After.
    let long = "word ".repeat(200);
    let barrier = std::sync::Barrier::new(48);
    let burst: Vec<(u16, bool)> = std::thread::scope(|sc| {
        let jobs: Vec<_> = (0..48)
            .map(|i| {
                let (barrier, server, long) = (&barrier, &server, &long);
                sc.spawn(move || {
                    barrier.wait();
                    let r = server.post("/v1/completions", &json!({"prompt": format!("{i} {long}"), "max_tokens": 4}));
                    if r.status != 200 {
                        r.error();
                    }
                    (r.status, r.header("retry-after").is_some())
                })
            })
            .collect();
        jobs.into_iter().map(|j| j.join().unwrap()).collect()
    });
    eprintln!("burst: {} ok, {} refused", burst.iter().filter(|b| b.0 == 200).count(), burst.iter().filter(|b| b.0 == 429).count());
    assert!(burst.iter().all(|&(s, ra)| s == 200 || (s == 429 && ra)), "{burst:?}");
    assert!(burst.iter().any(|b| b.0 == 429), "the burst never passed --max-queue: {burst:?}");
    assert!(burst.iter().filter(|b| b.0 == 200).count() >= 16, "{burst:?}");

    idle("after the load");
    let rss = rss_kib(pid);
    eprintln!("RSS after the warm-up {rss_warm} KiB, after the load {rss} KiB");
    assert!(rss * 10 <= rss_warm * 11, "RSS grew from {rss_warm} KiB to {rss} KiB");
    assert_eq!(server.request("GET", "/health", &[], b"").status, 200);
    let done = server.post("/v1/completions", &json!({"prompt": "after", "max_tokens": 2}));
    assert_eq!(done.status, 200, "{}", done.text());
}

/// A thinking model (the tiny qwen3 with Qwen3's own template) through the server: its thought
/// comes as `reasoning_content`, streamed in deltas that join to the unstreamed one;
/// `chat_template_kwargs` turns the thought off (Qwen3's `enable_thinking`), leaving the
/// answer held to its schema; a tool call streams as OpenAI's do: index, id, type and name in
/// the call's first delta, its arguments in the next ones, joined equal to the unstreamed call.
#[test]
fn thoughts_come_apart_and_calls_stream_in_pieces() {
    if flint_gpu::testing::context().is_none() {
        return;
    }
    let model = shared().join("golden/families/qwen3/model.gguf");
    let template = shared().join("golden/chat-templates/Qwen-Qwen3-0.6B.jinja");
    let args =
        ["-m", model.to_str().unwrap(), "--port", "0", "-c", "1024", "--chat-template-file", template.to_str().unwrap(), "--no-warmup", "--api-key", KEY];
    let server = Server::start(&args);
    while server.request("GET", "/health", &[], b"").status != 200 {
        std::thread::sleep(Duration::from_millis(100));
    }
    let chunks = |body: &Value| -> Vec<Value> {
        let r = server.post("/v1/chat/completions", body);
        assert_eq!(r.status, 200, "{}", r.text());
        sse_data(&r.text()).into_iter().filter(|d| d != "[DONE]").map(|d| serde_json::from_str(&d).unwrap()).collect()
    };
    let messages = json!([{"role": "user", "content": "Plan a trip."}]);
    let schema =
        json!({"type": "object", "properties": {"days": {"type": "integer", "minimum": 1, "maximum": 9}}, "required": ["days"], "additionalProperties": false});
    let format = json!({"type": "json_schema", "json_schema": {"name": "plan", "schema": schema}});
    // Thinking on: the grammar opens the thought before the answer; random weights do not
    // close it within max_tokens, so the reply is all thought.
    let think = json!({"messages": messages, "max_tokens": 24, "temperature": 1.0, "seed": 3, "response_format": format});
    let r = server.post("/v1/chat/completions", &think).json();
    let message = &r["choices"][0]["message"];
    let reasoning = message["reasoning_content"].as_str().unwrap_or_else(|| panic!("no reasoning_content: {r}"));
    assert!(!reasoning.is_empty() && !reasoning.contains("<think>") && message["content"] == "", "{r}");
    let mut stream_think = think.clone();
    stream_think["stream"] = json!(true);
    let mut streamed = String::new();
    for c in chunks(&stream_think) {
        streamed += c["choices"][0]["delta"]["reasoning_content"].as_str().unwrap_or("");
    }
    assert_eq!(streamed, reasoning);
    // Thinking off: no thought, and the answer held to the schema.
    let body = json!({"messages": messages, "max_tokens": 40, "seed": 5, "chat_template_kwargs": {"enable_thinking": false}, "response_format": format});
    let r = server.post("/v1/chat/completions", &body).json();
    let message = &r["choices"][0]["message"];
    assert!(message.get("reasoning_content").is_none(), "{r}");
    let v: Value = serde_json::from_str(message["content"].as_str().unwrap()).unwrap_or_else(|e| panic!("{r}: {e}"));
    let days = v["days"].as_u64().unwrap_or(0);
    assert!(v.as_object().unwrap().len() == 1 && (1..=9).contains(&days), "{r}");
    let r = server.post("/v1/chat/completions", &json!({"messages": messages, "chat_template_kwargs": "off"}));
    assert_eq!((r.status, r.error().1), (400, json!("chat_template_kwargs")));
    // A call, whole and streamed.
    let tools = json!([{"type": "function", "function": {"name": "book", "parameters": schema}}]);
    let body = json!({"messages": messages, "max_tokens": 60, "seed": 7, "tools": tools, "tool_choice": "required", "parallel_tool_calls": false,
        "chat_template_kwargs": {"enable_thinking": false}});
    let whole = server.post("/v1/chat/completions", &body).json();
    assert_eq!(whole["choices"][0]["finish_reason"], "tool_calls", "{whole}");
    let mut stream_body = body.clone();
    stream_body["stream"] = json!(true);
    let deltas: Vec<Value> = chunks(&stream_body).iter().flat_map(|c| c["choices"][0]["delta"]["tool_calls"].as_array().cloned().unwrap_or_default()).collect();
    assert!(deltas.len() > 2, "the arguments stream in pieces: {deltas:?}");
    assert_eq!((deltas[0]["index"].clone(), deltas[0]["type"].clone(), deltas[0]["function"]["name"].clone()), (json!(0), json!("function"), json!("book")));
    assert!(deltas[1..].iter().all(|d| d.get("id").is_none() && d["function"].get("name").is_none() && d["index"] == 0), "{deltas:?}");
    let arguments: String = deltas.iter().map(|d| d["function"]["arguments"].as_str().unwrap()).collect();
    let call = &whole["choices"][0]["message"]["tool_calls"][0];
    assert_eq!((deltas[0]["id"].clone(), json!(arguments)), (call["id"].clone(), call["function"]["arguments"].clone()), "{whole}");
}

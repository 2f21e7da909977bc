//! Chat-template rendering of arbitrary templates and messages, under the render budgets:
//! the input is a template, a NUL byte, then the messages as JSON (any JSON; an array of
//! objects reaches the template as messages). libFuzzer's -timeout=1 turns a render slower
//! than 1 s into a crash, and -rss_limit_mb an allocation the budget should have stopped.
#![no_main]

use flint_core::chat::ChatTemplate;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let (src, rest) = match data.iter().position(|&b| b == 0) {
        Some(i) => (&data[..i], &data[i + 1..]),
        None => (data, &b"[{\"role\": \"user\", \"content\": \"hi\"}]"[..]),
    };
    let Ok(src) = std::str::from_utf8(src) else { return };
    let Ok(t) = ChatTemplate::new(src, "<s>", "</s>") else { return };
    let messages: Vec<serde_json::Value> = match serde_json::from_slice::<serde_json::Value>(rest) {
        Ok(serde_json::Value::Array(a)) => a,
        Ok(v) => vec![v],
        Err(_) => return,
    };
    let _ = t.render_json(&messages, None, true);
    let _ = t.render_json(&messages, Some(&messages), false);
});

//! The 70 real chat templates of ../shared/golden/chat-templates against transformers' own
//! renderer (`cases.json`: 6 conversations each, `strftime_now` pinned to 2024-07-26 12:00):
//! every case renders byte for byte, or is refused where transformers refused, except the
//! known divergences listed in `KNOWN` with the reason for each.

use flint_core::chat::ChatTemplate;
use serde_json::Value;

const DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../../shared/golden/chat-templates");

/// (template, case) pairs where Flint does not do what transformers did, and why.
const KNOWN: &[(&str, &str, &str)] = &[
    // jinja2 cannot iterate None, so `{% for tool in tools %}` with no tools raises in
    // transformers; minijinja iterates none as empty, so Flint renders the conversation with no
    // tools listed. Right for a server: these are the tool-use variants of their models'
    // templates, and refusing would refuse every plain chat.
    ("CohereForAI-c4ai-command-r-plus-tool_use.jinja", "no-tools", "renders with no tools (None iterated as empty)"),
    ("NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use.jinja", "no-tools", "renders with no tools (None iterated as empty)"),
    ("NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja", "no-tools", "renders with no tools (None iterated as empty)"),
    // transformers fails inside its own tojson (a generator expression is not JSON
    // serializable); minijinja serializes the sequence. Rendering is right.
    ("llama-cpp-deepseek-r1.jinja", "tools", "renders; transformers' tojson cannot serialize a generator"),
    // jinja2's Markup + str HTML-escapes the str even with autoescape off, so transformers
    // feeds functionary `{&#34;name&#34;: ...}`; minijinja escapes only under autoescape.
    ("meetkai-functionary-medium-v3.1.jinja", "tools", "tool JSON not HTML-escaped after a |safe string"),
];

fn known(template: &str, case: &str) -> bool {
    KNOWN.iter().any(|&(t, c, _)| t == template && (c == case || (c == "no-tools" && case != "tools")))
}

/// 2024-07-26 12:00:00 UTC, the renderer's pinned clock.
fn pinned() -> Option<u64> {
    Some(1_721_995_200)
}

#[test]
fn real_templates_render_as_transformers() {
    let cases: Value = serde_json::from_str(&std::fs::read_to_string(format!("{DIR}/cases.json")).unwrap()).unwrap();
    let (mut ok, mut total) = (0, 0);
    let mut fails: std::collections::BTreeMap<String, Vec<String>> = Default::default();
    let mut diverged = 0;
    for case in cases["cases"].as_array().unwrap() {
        total += 1;
        let name = case["template"].as_str().unwrap().to_string();
        let source = std::fs::read_to_string(format!("{DIR}/{name}")).unwrap();
        let kw = &case["kwargs"];
        let t = match ChatTemplate::new(&source, kw["bos_token"].as_str().unwrap(), kw["eos_token"].as_str().unwrap()) {
            Ok(t) => t.with_clock(pinned),
            Err(e) => {
                fails.entry(name).or_default().push(format!("compile: {e}"));
                continue;
            }
        };
        let messages = case["messages"].as_array().unwrap();
        let tools = case["tools"].as_array().map(Vec::as_slice);
        let r = t.render_json(messages, tools, case["add_generation_prompt"].as_bool().unwrap());
        let c = case["case"].as_str().unwrap();
        if known(&name, c) {
            diverged += 1;
            continue;
        }
        match (r, case.get("expected").and_then(Value::as_str)) {
            (Ok(got), Some(want)) if got == want => ok += 1,
            (Err(_), None) => ok += 1,
            (Ok(got), Some(want)) => {
                let at = got.bytes().zip(want.bytes()).position(|(a, b)| a != b).unwrap_or(got.len().min(want.len()));
                let lo = at.saturating_sub(30);
                fails.entry(name).or_default().push(format!(
                    "{c}: differs at {at}: got {:?} want {:?}",
                    got.get(lo..(at + 40).min(got.len())).unwrap_or(""),
                    want.get(lo..(at + 40).min(want.len())).unwrap_or("")
                ));
            }
            (Err(e), Some(_)) => fails.entry(name).or_default().push(format!("{c}: error {e}")),
            (Ok(_), None) => fails.entry(name).or_default().push(format!("{c}: rendered, transformers refused: {}", case["error"])),
        }
    }
    eprintln!("{ok}/{total} cases as transformers, {diverged} known divergences");
    let report: Vec<String> = fails.iter().map(|(name, f)| format!("{name}:\n  {}", f.join("\n  "))).collect();
    assert!(fails.is_empty(), "templates that differ from transformers:\n{}", report.join("\n"));
    assert_eq!(ok + diverged, total);
    assert_eq!(diverged, 17, "a known divergence went away: update KNOWN");
}

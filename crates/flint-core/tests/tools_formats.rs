//! Tool-call formats against the real chat templates of ../shared/golden/chat-templates, and
//! each format's grammar (compiled by llguidance with qwen2's vocabulary) accepting the calls
//! its models write, token by token, while refusing a call to a function not offered.

use std::sync::Arc;

use flint_core::constrain::{Constrainer, Grammar};
use flint_core::gguf::GgufFile;
use flint_core::sampling::mask_allows;
use flint_core::tokenizer::Tokenizer;
use flint_core::tools::{ToolChoice, ToolFormat, Tools};
use serde_json::json;

fn template(name: &str) -> String {
    std::fs::read_to_string(flint_core::testing::shared_dir().join("golden/chat-templates").join(name)).unwrap()
}

#[test]
fn formats_are_told_from_the_templates() {
    for (file, want) in [
        ("Qwen-Qwen2.5-7B-Instruct.jinja", ToolFormat::Hermes),
        ("Qwen-Qwen3-0.6B.jinja", ToolFormat::Hermes),
        ("NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja", ToolFormat::Hermes),
        ("meta-llama-Llama-3.1-8B-Instruct.jinja", ToolFormat::Llama3),
        ("meta-llama-Llama-3.2-3B-Instruct.jinja", ToolFormat::Llama3),
        ("meta-llama-Llama-3.3-70B-Instruct.jinja", ToolFormat::Llama3),
        ("mistralai-Mistral-Nemo-Instruct-2407.jinja", ToolFormat::Mistral),
        ("Mistral-Small-3.2-24B-Instruct-2506.jinja", ToolFormat::Mistral),
        ("google-gemma-2-2b-it.jinja", ToolFormat::Generic),
        ("microsoft-Phi-3.5-mini-instruct.jinja", ToolFormat::Generic),
    ] {
        assert_eq!(ToolFormat::detect(&template(file)), want, "{file}");
    }
}

/// Whether every token of `text` is allowed in turn and the reply may end after them.
fn accepts(c: &Constrainer, g: &Grammar, tok: &Tokenizer, text: &str) -> bool {
    let mut k = c.constraint(g, tok.vocab_size()).unwrap_or_else(|e| panic!("{g:?}: {e}"));
    for id in tok.encode(text, false, false).unwrap() {
        if !mask_allows(&k.mask().unwrap(), id as usize) || k.consume(id).is_err() {
            return false;
        }
    }
    k.is_finished() || mask_allows(&k.mask().unwrap(), tok.eog_ids()[0] as usize)
}

#[test]
fn each_formats_grammar_takes_its_calls() {
    let vocab = GgufFile::open(flint_core::testing::shared_dir().join("golden/llama-cpp-vocab/ggml-vocab-qwen2.gguf")).unwrap();
    let tok = Arc::new(Tokenizer::from_metadata(&vocab.metadata).unwrap());
    let c = Constrainer::new(tok.clone()).unwrap();
    let spec = json!([{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"], "additionalProperties": false}}},
                      {"type": "function", "function": {"name": "get_time"}}]);
    let tools = |choice: &str| Tools::from_openai(Some(&spec), Some(&json!(choice)), None).unwrap().unwrap();
    let call = r#"{"name": "get_weather", "arguments": {"city": "Paris"}}"#;
    let cases = [
        (ToolFormat::Hermes, format!("<tool_call>\n{call}\n</tool_call>"), "<tool_call>\n{\"name\": \"get_date\", \"arguments\": {}}\n</tool_call>"),
        (ToolFormat::Llama3, r#"{"name": "get_weather", "parameters": {"city": "Paris"}}"#.to_string(), r#"{"name": "get_date", "parameters": {}}"#),
        (ToolFormat::Mistral, format!("[TOOL_CALLS][{call}]"), "[TOOL_CALLS][{\"name\": \"get_date\", \"arguments\": {}}]"),
        (ToolFormat::Generic, format!("{{\"tool_calls\": [{call}]}}"), "{\"tool_calls\": [{\"name\": \"get_date\", \"arguments\": {}}]}"),
    ];
    for (format, good, bad) in &cases {
        let required = format.grammar(&tools("required"), None).unwrap();
        assert!(accepts(&c, &required, &tok, good), "{format:?} required: {good}");
        assert!(!accepts(&c, &required, &tok, bad), "{format:?} required took {bad}");
        assert!(!accepts(&c, &required, &tok, "Sure, here you go."), "{format:?} required took free text");
        let auto = format.grammar(&tools("auto"), None).unwrap();
        assert!(accepts(&c, &auto, &tok, good), "{format:?} auto: {good}");
        if *format != ToolFormat::Generic {
            assert!(accepts(&c, &auto, &tok, "Sure, it is sunny."), "{format:?} auto refused free text");
        }
    }
    // Hermes, auto: text, then a call, then (parallel) another.
    let auto = ToolFormat::Hermes.grammar(&tools("auto"), None).unwrap();
    let two = format!("Checking both.<tool_call>\n{call}\n</tool_call>\n<tool_call>\n{{\"name\": \"get_time\", \"arguments\": {{}}}}\n</tool_call>");
    assert!(accepts(&c, &auto, &tok, &two));
    assert!(!accepts(&c, &auto, &tok, "Checking.<tool_call>\n{\"name\": \"nope\"}"));
    // Not parallel: one call only.
    let one = Tools { parallel: false, ..tools("required") };
    assert!(!accepts(&c, &ToolFormat::Hermes.grammar(&one, None).unwrap(), &tok, &two.replace("Checking both.", "")));
    assert_eq!(Tools { choice: ToolChoice::None, ..tools("auto") }.choice, ToolChoice::None);
}

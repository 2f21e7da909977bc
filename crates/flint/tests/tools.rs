//! Tool calls end to end on the tiny random-weight models of ../shared/golden/families with
//! the real chat templates of ../shared/golden/chat-templates, one per call format: whatever
//! the weights draw, `required` and a named function give calls to listed functions whose
//! arguments validate against their parameters (an independent validator), `parallel_tool_calls:
//! false` gives one call and ends the reply, parallel calls are each valid, `auto` and `none`
//! run (none: no calls), a tool-result turn renders, and a seed reproduces the calls, ids
//! included.

use flint::{BackendKind, Engine, Event, FinishReason, GenerateParams, Input, LoadOptions, Request, ToolCall, ToolFormat, Tools};
use flint_core::sampling::SamplingParams;
use serde_json::{json, Value};

fn load(family: &str, template: &str) -> Option<Engine> {
    flint_gpu::testing::context()?;
    let shared = flint_core::testing::shared_dir().join("golden");
    let chat_template = std::fs::read_to_string(shared.join("chat-templates").join(template)).unwrap();
    let opts = LoadOptions { backend: BackendKind::Gpu, n_ctx: 1024, chat_template: Some(chat_template), ..LoadOptions::default() };
    Some(Engine::load_path(&shared.join("families").join(family).join("model.gguf"), &opts).unwrap())
}

fn tool_specs() -> Value {
    json!([
        {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city",
            "parameters": {"type": "object", "properties": {"city": {"enum": ["Paris", "Oslo", "Lima"]}, "unit": {"enum": ["c", "f"]}}, "required": ["city"], "additionalProperties": false}}},
        {"type": "function", "function": {"name": "add", "description": "Adds two numbers",
            "parameters": {"type": "object", "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 99}, "b": {"type": "integer", "minimum": 0, "maximum": 99}}, "required": ["a", "b"], "additionalProperties": false}}}
    ])
}

fn request(messages: Value, choice: Value, parallel: Option<bool>, n: usize, seed: u64) -> Request {
    let sampling = SamplingParams { temperature: 1.0, seed: Some(seed), ..SamplingParams::default() };
    let mut r = Request::new(Input::Chat(messages.as_array().unwrap().clone()), GenerateParams { max_tokens: Some(300), sampling, ..Default::default() });
    r.n = n;
    r.tools = Tools::from_openai(Some(&tool_specs()), Some(&choice), parallel).unwrap();
    // Qwen3's template thinks first: random weights need a short bound on the thought.
    r.thought_budget = 24;
    r
}

/// A choice's content, calls (their streamed pieces joined) and finish reason.
type Reply = (String, Vec<ToolCall>, FinishReason);

fn run(engine: &Engine, req: Request) -> Vec<Reply> {
    run_pieces(engine, req).0
}

/// `run`, and the pieces the calls streamed in.
fn run_pieces(engine: &Engine, req: Request) -> (Vec<Reply>, Vec<ToolCall>) {
    let n = req.n;
    let mut h = engine.submit(req).unwrap();
    futures::executor::block_on(async {
        let mut out = vec![(String::new(), Vec::new(), FinishReason::Abort); n];
        let mut pieces = Vec::new();
        while let Some(ev) = futures::StreamExt::next(&mut h).await {
            let (choice, text, calls) = match ev.unwrap() {
                Event::Token { choice, text, calls, .. } => (choice, text, calls),
                Event::Done { choice, summary, text, calls, .. } => {
                    out[choice].2 = summary.finish_reason;
                    (choice, text, calls)
                }
            };
            out[choice].0.push_str(&text);
            for p in calls {
                pieces.push(p.clone());
                ToolCall::join(&mut out[choice].1, p);
            }
        }
        (out, pieces)
    })
}

fn check_calls(label: &str, calls: &[ToolCall], only: Option<&str>) {
    assert!(!calls.is_empty(), "{label}: no calls");
    let specs = tool_specs();
    for c in calls {
        let spec = specs
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["function"]["name"] == c.name)
            .unwrap_or_else(|| panic!("{label}: {} is not a listed function", c.name));
        if let Some(name) = only {
            assert_eq!(c.name, name, "{label}");
        }
        let args: Value = serde_json::from_str(&c.arguments).unwrap_or_else(|e| panic!("{label}: arguments {:?}: {e}", c.arguments));
        assert!(jsonschema::is_valid(&spec["function"]["parameters"], &args), "{label}: {} {}", c.name, c.arguments);
    }
    let ids: std::collections::HashSet<&str> = calls.iter().map(|c| c.id.as_str()).collect();
    assert_eq!(ids.len(), calls.len(), "{label}: ids repeat");
}

fn format_drill(family: &str, template: &str, format: ToolFormat) {
    let Some(engine) = load(family, template) else { return };
    assert_eq!(ToolFormat::detect(engine.info().template.as_ref().unwrap().source()), format);
    let ask = json!([{"role": "user", "content": "Weather in Oslo, and 2 + 3?"}]);
    let label = |what: &str| format!("{family} {format:?} {what}");
    // One call each: the grammar completes and ends the reply.
    let (required, pieces) = run_pieces(&engine, request(ask.clone(), json!("required"), Some(false), 2, 5));
    for (i, (content, calls, finish)) in required.iter().enumerate() {
        assert_eq!(*finish, FinishReason::ToolCalls, "{}: {content:?}", label("required"));
        check_calls(&format!("{} choice {i}", label("required")), calls, None);
        assert_eq!(calls.len(), 1, "{}", label("required, not parallel"));
    }
    // Calls stream: the first piece names the call, the arguments follow in pieces (the
    // generic format's list too); each call's pieces joined are the call checked above.
    assert!(pieces.len() > 2 * 2, "{}: {pieces:?}", label("streamed pieces"));
    assert!(pieces.iter().all(|p| p.id.is_empty() == p.name.is_empty()), "{}: {pieces:?}", label("pieces"));
    // Parallel: random weights may go on calling until max_tokens; every call made is valid.
    for (content, mut calls, finish) in run(&engine, request(ask.clone(), json!("required"), None, 1, 6)) {
        assert!(matches!(finish, FinishReason::ToolCalls | FinishReason::Length), "{}: {content:?}", label("parallel"));
        // At the length limit the last call streamed is cut short, as OpenAI's are.
        if finish == FinishReason::Length && calls.len() > 1 {
            calls.pop();
        }
        check_calls(&label("parallel"), &calls, None);
    }
    let named = run(&engine, request(ask.clone(), json!({"type": "function", "function": {"name": "add"}}), Some(false), 1, 9));
    for (content, calls, finish) in &named {
        assert_eq!(*finish, FinishReason::ToolCalls, "{}: {content:?}", label("named"));
        check_calls(&label("named"), calls, Some("add"));
        assert_eq!(calls.len(), 1, "{}: parallel_tool_calls false", label("named"));
    }
    // The same seed: the same calls, ids included.
    assert_eq!(run(&engine, request(ask.clone(), json!("required"), Some(false), 2, 5)), required, "{}", label("seeded"));
    for (content, calls, finish) in run(&engine, request(ask.clone(), json!("auto"), None, 1, 3)) {
        if !calls.is_empty() {
            check_calls(&label("auto"), &calls, None);
        }
        eprintln!("{}: {finish:?}, {} calls, content {:?}", label("auto"), calls.len(), content.chars().take(60).collect::<String>());
    }
    for (_, calls, finish) in run(&engine, request(ask.clone(), json!("none"), None, 1, 3)) {
        assert!(calls.is_empty(), "{}", label("none"));
        assert_ne!(finish, FinishReason::ToolCalls, "{}", label("none"));
    }
    // A tool-result turn: the call and its result rendered by the template, then a reply.
    let call = &required[0].1[0];
    let turn = json!([
        {"role": "user", "content": "Weather in Oslo?"},
        {"role": "assistant", "content": null, "tool_calls": [{"id": call.id, "type": "function", "function": {"name": call.name, "arguments": call.arguments}}]},
        {"role": "tool", "tool_call_id": call.id, "content": "12 C"}
    ]);
    let reply = run(&engine, request(turn, json!("auto"), None, 1, 4));
    assert_ne!(reply[0].2, FinishReason::Abort, "{}", label("tool result"));
}

#[test]
fn hermes_calls_on_qwen3_with_its_template() {
    format_drill("qwen3", "Qwen-Qwen3-0.6B.jinja", ToolFormat::Hermes);
}

#[test]
fn llama3_calls_on_llama3_with_its_template() {
    format_drill("llama3", "meta-llama-Llama-3.1-8B-Instruct.jinja", ToolFormat::Llama3);
}

#[test]
fn mistral_calls_with_mistral_nemos_template() {
    format_drill("llama3", "mistralai-Mistral-Nemo-Instruct-2407.jinja", ToolFormat::Mistral);
}

#[test]
fn generic_calls_on_phi3_with_its_template() {
    format_drill("phi3", "microsoft-Phi-3.5-mini-instruct.jinja", ToolFormat::Generic);
}

/// Each choice's reasoning, content, calls and finish reason.
fn run_thinking(engine: &Engine, req: Request) -> Vec<(String, String, Vec<ToolCall>, FinishReason)> {
    let n = req.n;
    let mut h = engine.submit(req).unwrap();
    futures::executor::block_on(async {
        let mut out = vec![(String::new(), String::new(), Vec::new(), FinishReason::Abort); n];
        while let Some(ev) = futures::StreamExt::next(&mut h).await {
            let (choice, reasoning, text, calls) = match ev.unwrap() {
                Event::Token { choice, reasoning, text, calls, .. } => (choice, reasoning, text, calls),
                Event::Done { choice, summary, reasoning, text, calls } => {
                    out[choice].3 = summary.finish_reason;
                    (choice, reasoning, text, calls)
                }
            };
            out[choice].0.push_str(&reasoning);
            out[choice].1.push_str(&text);
            calls.into_iter().for_each(|p| ToolCall::join(&mut out[choice].2, p));
        }
        out
    })
}

#[test]
fn a_thinking_models_thought_is_split_out_and_bounded_before_the_constrained_answer() {
    let Some(engine) = load("qwen3", "Qwen-Qwen3-0.6B.jinja") else { return };
    let schema = json!({"type": "object", "properties": {"city": {"enum": ["Paris", "Oslo"]}, "days": {"type": "integer", "minimum": 1, "maximum": 9}}, "required": ["city", "days"], "additionalProperties": false});
    let ask = json!([{"role": "user", "content": "Plan a trip. Answer in JSON."}]);
    let json_request = |split: bool, kwargs: Value, seed: u64| {
        let sampling = SamplingParams { temperature: 1.0, seed: Some(seed), ..SamplingParams::default() };
        let mut r = Request::new(Input::Chat(ask.as_array().unwrap().clone()), GenerateParams { max_tokens: Some(200), sampling, ..Default::default() });
        r.n = 2;
        r.constraint = Some(flint::Constrained { grammar: flint::Grammar::JsonSchema(schema.clone()), field: "response_format" });
        r.split_thoughts = split;
        r.thought_budget = 24;
        r.template_kwargs = kwargs.as_object().unwrap().clone();
        r
    };
    let valid = |label: &str, text: &str| {
        let v: Value = serde_json::from_str(text).unwrap_or_else(|e| panic!("{label}: {text:?}: {e}"));
        assert!(jsonschema::is_valid(&schema, &v), "{label}: {text}");
    };
    // Thinking on (Qwen3's default): the grammar opens a thought of at most 24 characters,
    // closes it, then holds the answer to the schema; split, the thought is `reasoning`.
    let raw = run_thinking(&engine, json_request(false, json!({}), 3));
    let split = run_thinking(&engine, json_request(true, json!({}), 3));
    for ((_, text, _, finish), (reasoning, content, _, split_finish)) in raw.iter().zip(&split) {
        assert_eq!((*finish, *split_finish), (FinishReason::Stop, FinishReason::Stop), "{text:?}");
        let rest = text.strip_prefix("<think>").unwrap_or_else(|| panic!("the reply opens a thought: {text:?}"));
        let (thought, answer) = rest.split_once("</think>").unwrap_or_else(|| panic!("the thought closes: {text:?}"));
        assert!(thought.chars().count() <= 24, "the thought is bounded: {thought:?}");
        valid("after the thought", answer.trim_start());
        assert_eq!((reasoning.as_str(), content.as_str()), (thought.trim(), answer.trim_start()), "the split reply is the raw one");
    }
    // `enable_thinking: false`: the template closes an empty thought; the reply is the answer.
    for (reasoning, content, _, finish) in run_thinking(&engine, json_request(true, json!({"enable_thinking": false}), 4)) {
        assert_eq!((reasoning.as_str(), finish), ("", FinishReason::Stop));
        valid("without thinking", &content);
    }
    // Tool calls after a thought.
    let mut r = request(json!([{"role": "user", "content": "Weather in Oslo?"}]), json!("required"), Some(false), 2, 8);
    r.split_thoughts = true;
    for (reasoning, content, calls, finish) in run_thinking(&engine, r) {
        assert_eq!(finish, FinishReason::ToolCalls, "{reasoning:?} {content:?}");
        assert!(reasoning.chars().count() <= 24, "{reasoning:?}");
        check_calls("after a thought", &calls, None);
    }
}

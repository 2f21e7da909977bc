//! Chat templates against transformers' rendering: qwen's real template byte for byte on the
//! golden chat prompt (and llama.cpp's token ids for it), edge-case snapshots, the
//! HF-specific globals (`raise_exception`, `tojson`, `strftime_now`), Python methods, and
//! BOS handling with gemma's tokenizer. Expected strings were produced with jinja2 3.1 set
//! up as transformers does (`trim_blocks`, `lstrip_blocks`, loopcontrols, its `tojson`).

#[path = "common/models.rs"]
mod models;

use std::sync::OnceLock;

use flint_core::chat::{tokenize_rendered, ChatError, ChatMessage, ChatTemplate};
use flint_core::gguf::{GgufFile, Metadata};
use flint_core::tokenizer::Tokenizer;
use serde_json::{json, Value as Json};

fn shared() -> String {
    flint_core::testing::shared_dir().to_string_lossy().into_owned()
}
const GEMMA_BOS: u32 = 2;
const QWEN_SYSTEM_DEFAULT: &str = "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n";

struct Loaded {
    md: Metadata,
    tok: Tokenizer,
}

fn load(name: &str) -> Loaded {
    let path = models::model_path(name);
    let file = GgufFile::open(&path).unwrap_or_else(|e| panic!("open {}: {e}", path.display()));
    let tok = Tokenizer::from_metadata(&file.metadata).unwrap_or_else(|e| panic!("{name} tokenizer: {e}"));
    Loaded { md: file.metadata, tok }
}

fn qwen() -> &'static Loaded {
    static Q: OnceLock<Loaded> = OnceLock::new();
    Q.get_or_init(|| load(models::QWEN))
}

fn gemma() -> &'static Loaded {
    static G: OnceLock<Loaded> = OnceLock::new();
    G.get_or_init(|| load(models::GEMMA))
}

fn qwen_template() -> ChatTemplate {
    let q = qwen();
    ChatTemplate::from_metadata(&q.md, &q.tok).expect("qwen template compiles").expect("qwen has a chat template")
}

fn read(rel: &str) -> String {
    let path = format!("{}/{rel}", shared());
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

fn msg(role: &str, content: &str) -> ChatMessage {
    ChatMessage::new(role, content)
}

fn template(source: &str) -> ChatTemplate {
    ChatTemplate::new(source, "<s>", "</s>").unwrap_or_else(|e| panic!("{source:?}: {e}"))
}

#[test]
fn qwen_gguf_template_is_the_golden_one() {
    let q = qwen();
    let from_gguf = q.md.opt_str("tokenizer.chat_template").unwrap().expect("qwen GGUF has tokenizer.chat_template");
    let golden = read("golden/prompts/qwen_chat_template.jinja");
    assert_eq!(from_gguf, golden);
}

#[test]
fn qwen_golden_chat_prompt_byte_for_byte() {
    let messages: Vec<ChatMessage> = serde_json::from_str(&read("golden/prompts/chat_messages_qwen6.json")).expect("chat_messages_qwen6.json");
    let rendered = qwen_template().render(&messages, true).unwrap();
    assert_eq!(rendered, read("golden/prompts/p6q.txt"));

    let golden: Json = serde_json::from_str(&read("golden/qwen/6.json")).unwrap();
    let want: Vec<u32> = golden["prompt_token_ids"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as u32).collect();
    assert_eq!(tokenize_rendered(&qwen().tok, &rendered).unwrap(), want);
}

#[test]
fn qwen_without_system_message_uses_default_prompt() {
    let out = qwen_template().render(&[msg("user", "Hi there")], true).unwrap();
    assert_eq!(out, format!("{QWEN_SYSTEM_DEFAULT}<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n"));
}

#[test]
fn qwen_multiple_turns() {
    let messages = [msg("system", "Be brief."), msg("user", "What is 2+2?"), msg("assistant", "4"), msg("user", "And 3+3?")];
    let out = qwen_template().render(&messages, true).unwrap();
    assert_eq!(
        out,
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n\
         <|im_start|>assistant\n4<|im_end|>\n<|im_start|>user\nAnd 3+3?<|im_end|>\n<|im_start|>assistant\n"
    );
}

#[test]
fn qwen_without_generation_prompt() {
    let messages = [msg("user", "Hello"), msg("assistant", "Hi! How can I help?")];
    let out = qwen_template().render(&messages, false).unwrap();
    assert_eq!(out, format!("{QWEN_SYSTEM_DEFAULT}<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\nHi! How can I help?<|im_end|>\n"));
}

#[test]
fn qwen_tools_and_tool_calls_pass_through_as_json() {
    let messages = [
        json!({"role": "user", "content": "Weather in Paris?"}),
        json!({"role": "assistant", "content": "", "tool_calls": [
            {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris", "unit": "°C <&>"}}}
        ]}),
        json!({"role": "tool", "content": "{\"temp\": 21}"}),
    ];
    let tools = [json!({"type": "function", "function": {
        "name": "get_weather", "description": "Weather <now> & later",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    }})];
    let out = qwen_template().render_json(&messages, Some(&tools), true).unwrap();
    let want = "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.\n\n# Tools\n\n\
        You may call one or more functions to assist with the user query.\n\n\
        You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n\
        {\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"description\": \"Weather <now> & later\", \
        \"parameters\": {\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\"}}, \"required\": [\"city\"]}}}\n\
        </tools>\n\nFor each function call, return a json object with function name and arguments within \
        <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n\
        </tool_call><|im_end|>\n<|im_start|>user\nWeather in Paris?<|im_end|>\n<|im_start|>assistant\n<tool_call>\n\
        {\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"unit\": \"°C <&>\"}}\n</tool_call><|im_end|>\n\
        <|im_start|>user\n<tool_response>\n{\"temp\": 21}\n</tool_response><|im_end|>\n<|im_start|>assistant\n";
    assert_eq!(out, want);
}

#[test]
fn raise_exception_becomes_raised() {
    let t = template(
        "{% for m in messages %}{% if m.role not in ['user', 'assistant'] %}\
         {{ raise_exception('Only user and assistant roles are supported, got ' + m.role) }}{% endif %}{% endfor %}",
    );
    assert_eq!(t.render(&[msg("user", "ok")], false).unwrap(), "");
    match t.render(&[msg("user", "a"), msg("tool", "b")], false) {
        Err(ChatError::Raised(m)) => assert_eq!(m, "Only user and assistant roles are supported, got tool"),
        other => panic!("expected ChatError::Raised, got {other:?}"),
    }
}

#[test]
fn syntax_error_at_compile_time() {
    for bad in ["{% for m in messages %}{{ m.content }}", "{{ messages[0", "{% if %}x{% endif %}"] {
        match ChatTemplate::new(bad, "", "") {
            Err(ChatError::Syntax(m)) => assert!(!m.is_empty()),
            Err(e) => panic!("{bad:?}: expected a syntax error, got {e:?}"),
            Ok(_) => panic!("{bad:?}: compiled"),
        }
    }
}

#[test]
fn render_errors_are_render_errors() {
    let t = template("{{ messages[0].content + 1 }}");
    assert!(matches!(t.render(&[msg("user", "x")], false), Err(ChatError::Render(_))));
    let t = template("{{ nothing.here }}");
    assert!(matches!(t.render(&[], false), Err(ChatError::Render(_))));
}

#[test]
fn tojson_keeps_order_and_does_not_escape_html() {
    let t = template(
        "{% set data = messages[0].data %}{{ data | tojson }}|{{ data | tojson(indent=2) }}|\
         {{ data | tojson(separators=(',', ':')) }}|{{ 'é<' | tojson(true) }}|{{ [1.0, 1e-05, 2] | tojson }}",
    );
    let data = json!({"zeta": {"b": "<b>&amp;</b>", "a": [1, null, true]}, "alpha": "x'y\"z"});
    let out = t.render_json(&[json!({"role": "user", "content": "", "data": data})], None, false).unwrap();
    let want = "{\"zeta\": {\"b\": \"<b>&amp;</b>\", \"a\": [1, null, true]}, \"alpha\": \"x'y\\\"z\"}|\
        {\n  \"zeta\": {\n    \"b\": \"<b>&amp;</b>\",\n    \"a\": [\n      1,\n      null,\n      true\n    ]\n  },\n  \"alpha\": \"x'y\\\"z\"\n}|\
        {\"zeta\":{\"b\":\"<b>&amp;</b>\",\"a\":[1,null,true]},\"alpha\":\"x'y\\\"z\"}|\"\\u00e9<\"|[1.0, 1e-05, 2]";
    assert_eq!(out, want);
}

#[test]
fn strftime_now_uses_the_injected_clock() {
    // 2024-02-29 13:05:09 UTC
    fn leap_day() -> Option<u64> {
        Some(1_709_211_909)
    }
    fn no_clock() -> Option<u64> {
        None
    }
    let t = template("{{ strftime_now('%d %b %Y') }}|{{ strftime_now('%A %B %-d, %H:%M:%S %j %%') }}");
    assert_eq!(t.with_clock(leap_day).render(&[], false).unwrap(), "29 Feb 2024|Thursday February 29, 13:05:09 060 %");

    // Llama 3.x's guard: without a clock the template falls back to its own date.
    let guarded = "{% if strftime_now is defined %}{{ strftime_now('%d %b %Y') }}{% else %}26 Jul 2024{% endif %}";
    assert_eq!(template(guarded).with_clock(no_clock).render(&[], false).unwrap(), "26 Jul 2024");
    assert_eq!(template(guarded).with_clock(leap_day).render(&[], false).unwrap(), "29 Feb 2024");
    // The default clock is the system clock natively.
    let year: u32 = template("{{ strftime_now('%Y') }}").render(&[], false).unwrap().parse().unwrap();
    assert!(year >= 2024);
}

#[test]
fn python_methods_loop_controls_and_whitespace_match_jinja2() {
    let source = "{% set ns = namespace(n=0) %}\n{% for m in messages %}\n    {% if m.role == 'system' %}{% continue %}{% endif %}\n    \
        {% if loop.index > 3 %}{% break %}{% endif %}\n    {% set ns.n = ns.n + 1 %}\n\
        [{{ m.role | upper }}|{{ m.content.strip() }}|{{ m.content.split(' ')[0] }}|{{ m.content.startswith(' hi') }}]\n\
        {% endfor %}\n{% for k, v in {'z': 1, 'a': none}.items() %}{{ k }}={{ v }};{% endfor %}\n\n\
        n={{ ns.n }} {{ 'x' * 3 }} {{ messages[1:] | length }} {{ tools is none }} {{ true }}\n";
    let messages = [msg("system", "sys"), msg("user", " hi there "), msg("assistant", "yo"), msg("user", "a b"), msg("user", "dropped")];
    let out = template(source).render(&messages, false).unwrap();
    assert_eq!(out, "[USER|hi there||True]\n[ASSISTANT|yo|yo|False]\nz=1;a=None;\nn=2 xxx 4 True True");
}

#[test]
fn bos_and_eos_tokens_are_variables() {
    let t = template("{{ bos_token }}{{ messages[0].content }}{{ eos_token }}");
    assert_eq!(t.render(&[msg("user", "x")], false).unwrap(), "<s>x</s>");
}

const GEMMA_STYLE: &str = "{{ bos_token }}{% for m in messages %}<start_of_turn>{{ m.role }}\n{{ m.content }}<end_of_turn>\n{% endfor %}\
    {% if add_generation_prompt %}<start_of_turn>model\n{% endif %}";

#[test]
fn gemma_style_template_gives_exactly_one_bos() {
    let g = gemma();
    assert_eq!(g.tok.bos_id(), Some(GEMMA_BOS));
    assert!(g.tok.add_bos_default(), "gemma adds BOS by default, which is what could double it");
    let bos = g.tok.token_text(GEMMA_BOS).unwrap();
    let eos = g.tok.eos_id().and_then(|id| g.tok.token_text(id)).unwrap();
    let t = ChatTemplate::new(GEMMA_STYLE, bos, eos).unwrap();
    let rendered = t.render(&[msg("user", "Why is the sky blue?")], true).unwrap();
    assert_eq!(rendered, "<bos><start_of_turn>user\nWhy is the sky blue?<end_of_turn>\n<start_of_turn>model\n");

    let ids = tokenize_rendered(&g.tok, &rendered).unwrap();
    assert_eq!(ids[0], GEMMA_BOS);
    assert_eq!(ids.iter().filter(|&&id| id == GEMMA_BOS).count(), 1, "{ids:?}");
    // Same ids as tokenizing the text without the template's BOS, letting the tokenizer add it.
    let without = rendered.strip_prefix(bos).unwrap();
    assert_eq!(ids, tokenize_rendered(&g.tok, without).unwrap());
}

#[test]
fn gemma_270m_has_no_template() {
    let g = gemma();
    assert!(ChatTemplate::from_metadata(&g.md, &g.tok).unwrap().is_none());
}

#[test]
fn template_kwargs_reach_the_template_and_cannot_replace_its_variables() {
    let t = template(&read("golden/chat-templates/Qwen-Qwen3-0.6B.jinja"));
    let messages = [json!({"role": "user", "content": "Hi"})];
    let on = t.render_json(&messages, None, true).unwrap();
    assert!(on.ends_with("<|im_start|>assistant\n"), "{on:?}");
    let kwargs = json!({"enable_thinking": false, "add_generation_prompt": false, "messages": []});
    let off = t.render_json_with(&messages, None, kwargs.as_object().unwrap(), true).unwrap();
    assert_eq!(off, format!("{on}<think>\n\n</think>\n\n"), "enable_thinking: false closes an empty thought; the other keys are ignored");
}

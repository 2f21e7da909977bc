//! Tool calls: the format a model family writes them in (told from its chat template), the
//! grammar that holds a reply to the request's tools, and the parser that turns the reply
//! back into OpenAI's `tool_calls` as it streams.
//!
//! | format | written as | families |
//! |---|---|---|
//! | Hermes | `<tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>`, one per call | Qwen2.5, Qwen3, Hermes |
//! | Llama 3 | `{"name": ..., "parameters": {...}}` as the whole reply (after `<\|python_tag\|>` if any) | Llama 3.1–3.3 |
//! | Mistral | `[TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]` | Mistral, Ministral, Devstral |
//! | generic | `{"tool_calls": [{"name", "arguments"}, ...]}` or `{"response": "..."}`, described in a system message | templates without tools (Gemma, Phi-3) |
//!
//! `tool_choice` `required` and a named function hold the reply to calls from its first token;
//! `auto` lets text run free until the model starts a call (its trigger text or token), then
//! holds the call (lazily, in llguidance's terms); `none` leaves the reply free.

use serde_json::{json, Map, Value};

use crate::constrain::Grammar;
use crate::generate::longest_prefix_suffix;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ToolFormat {
    Hermes,
    Llama3,
    Mistral,
    Generic,
}

/// One function the model may call (OpenAI's `{"type": "function", "function": {...}}`).
#[derive(Clone, Debug, PartialEq)]
pub struct Tool {
    pub name: String,
    /// Its `parameters` schema (`{"type": "object"}` when none is given).
    pub parameters: Value,
    /// The request's whole object, as chat templates read it.
    pub spec: Value,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ToolChoice {
    None,
    Auto,
    Required,
    Named(String),
}

/// A request's tools and how it may use them.
#[derive(Clone, Debug, PartialEq)]
pub struct Tools {
    pub tools: Vec<Tool>,
    pub choice: ToolChoice,
    /// Several calls in one reply (OpenAI's `parallel_tool_calls`, default true).
    pub parallel: bool,
}

/// One call the reply made, or a piece of one as it streams (OpenAI's `delta.tool_calls`
/// entry): a call's first piece has its `id` and `name`, later pieces (`id` empty) add to its
/// `arguments`, JSON text as the model wrote it. `index` counts the choice's calls.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ToolCall {
    pub index: usize,
    pub id: String,
    pub name: String,
    pub arguments: String,
}

impl ToolCall {
    /// Adds a streamed piece to the calls it belongs to.
    pub fn join(calls: &mut Vec<ToolCall>, piece: ToolCall) {
        match calls.iter_mut().find(|c| c.index == piece.index) {
            Some(call) => call.arguments.push_str(&piece.arguments),
            None => calls.push(piece),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ToolError {
    #[error("tools[{index}]: {reason}")]
    BadTool { index: usize, reason: String },
    #[error("`tool_choice` names the function {name:?}, which is not in `tools`")]
    UnknownChoice { name: String },
    #[error("`tool_choice` is {choice} but no `tools` are given")]
    NoTools { choice: &'static str },
    #[error("`tool_choice` must be \"none\", \"auto\", \"required\" or {{\"type\": \"function\", \"function\": {{\"name\": ...}}}}")]
    BadChoice,
}

/// The longest function name (OpenAI's limit).
const MAX_NAME: usize = 64;

impl Tool {
    /// One entry of OpenAI's `tools`.
    pub fn from_openai(index: usize, v: &Value) -> Result<Tool, ToolError> {
        let bad = |reason: &str| ToolError::BadTool { index, reason: reason.to_string() };
        if v.get("type").and_then(Value::as_str) != Some("function") {
            return Err(bad("`type` must be \"function\""));
        }
        let f = v.get("function").and_then(Value::as_object).ok_or_else(|| bad("needs a `function` object"))?;
        let name = f.get("name").and_then(Value::as_str).ok_or_else(|| bad("`function.name` must be a string"))?;
        if name.is_empty() || name.len() > MAX_NAME || !name.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.')) {
            return Err(bad("`function.name` must be 1 to 64 letters, digits, `_`, `-` or `.`"));
        }
        let parameters = match f.get("parameters") {
            None | Some(Value::Null) => json!({"type": "object"}),
            Some(p @ Value::Object(_)) => p.clone(),
            Some(_) => return Err(bad("`function.parameters` must be a JSON schema object")),
        };
        Ok(Tool { name: name.to_string(), parameters, spec: v.clone() })
    }
}

impl Tools {
    /// OpenAI's `tools`, `tool_choice` and `parallel_tool_calls` (None: no tools asked for).
    pub fn from_openai(tools: Option<&Value>, choice: Option<&Value>, parallel: Option<bool>) -> Result<Option<Tools>, ToolError> {
        let list = match tools {
            None | Some(Value::Null) => Vec::new(),
            Some(Value::Array(items)) => items.iter().enumerate().map(|(i, t)| Tool::from_openai(i, t)).collect::<Result<_, _>>()?,
            Some(_) => return Err(ToolError::BadTool { index: 0, reason: "`tools` must be an array".into() }),
        };
        let choice = match choice {
            None | Some(Value::Null) if list.is_empty() => return Ok(None),
            None | Some(Value::Null) => ToolChoice::Auto,
            Some(Value::String(s)) => match s.as_str() {
                "none" => ToolChoice::None,
                "auto" => ToolChoice::Auto,
                "required" => ToolChoice::Required,
                _ => return Err(ToolError::BadChoice),
            },
            Some(Value::Object(o)) => {
                let name = o.get("function").and_then(|f| f.get("name")).and_then(Value::as_str).ok_or(ToolError::BadChoice)?;
                if !list.iter().any(|t: &Tool| t.name == name) {
                    return Err(ToolError::UnknownChoice { name: name.to_string() });
                }
                ToolChoice::Named(name.to_string())
            }
            Some(_) => return Err(ToolError::BadChoice),
        };
        if list.is_empty() {
            return match choice {
                ToolChoice::None | ToolChoice::Auto => Ok(None),
                ToolChoice::Required => Err(ToolError::NoTools { choice: "\"required\"" }),
                ToolChoice::Named(_) => Err(ToolError::NoTools { choice: "a named function" }),
            };
        }
        Ok(Some(Tools { tools: list, choice, parallel: parallel.unwrap_or(true) }))
    }

    /// The tools a call may name: the named one, or all.
    fn callable(&self) -> Vec<&Tool> {
        match &self.choice {
            ToolChoice::Named(n) => self.tools.iter().filter(|t| &t.name == n).collect(),
            _ => self.tools.iter().collect(),
        }
    }

    /// The request's tool objects, as a chat template reads them.
    pub fn specs(&self) -> Vec<Value> {
        self.tools.iter().map(|t| t.spec.clone()).collect()
    }
}

impl ToolFormat {
    /// The format a chat template's model writes calls in.
    pub fn detect(template: &str) -> ToolFormat {
        if template.contains("<tool_call>") {
            ToolFormat::Hermes
        } else if template.contains("[TOOL_CALLS]") {
            ToolFormat::Mistral
        } else if template.contains("\"parameters\"") && (template.contains("<|python_tag|>") || template.contains("<|eot_id|>")) {
            ToolFormat::Llama3
        } else {
            ToolFormat::Generic
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            ToolFormat::Hermes => "hermes",
            ToolFormat::Llama3 => "llama3",
            ToolFormat::Mistral => "mistral",
            ToolFormat::Generic => "generic",
        }
    }

    /// The key a call's arguments go under.
    fn args_key(self) -> &'static str {
        if self == ToolFormat::Llama3 {
            "parameters"
        } else {
            "arguments"
        }
    }

    /// The grammar a reply is held to (None: free). `trigger`: the id of the control token
    /// that starts Mistral's calls, when the vocabulary has one.
    pub fn grammar(self, tools: &Tools, trigger: Option<u32>) -> Option<Grammar> {
        if tools.choice == ToolChoice::None {
            return None;
        }
        let forced = tools.choice != ToolChoice::Auto;
        let one = json_inline(&one_call_schema(tools, self.args_key()));
        let text = match self {
            ToolFormat::Hermes => {
                let call = "\"<tool_call>\\n\" body \"\\n</tool_call>\"";
                match (forced, tools.parallel) {
                    (true, true) => format!("start: call (\"\\n\" call)*\ncall: {call}\nbody: {one}"),
                    (true, false) => format!("start: {call}\nbody: {one}"),
                    // A call starts where the text first reaches `<tool_call>`.
                    (false, parallel) => format!(
                        "start: {}\ncall: call_hd \"\\n\" body \"\\n</tool_call>\"\ncall_hd[lazy]: TEXT \"<tool_call>\"\nTEXT: /(.|\\n)*/\nbody: {one}",
                        if parallel { "call* TEXT" } else { "TEXT | call" }
                    ),
                }
            }
            // One call, as the whole reply; free text may not start with `{`.
            ToolFormat::Llama3 if forced => format!("start: body\nbody: {one}"),
            ToolFormat::Llama3 => format!("start: TEXT | body\nTEXT: /[^{{](.|\\n)*/\nbody: {one}"),
            ToolFormat::Mistral => {
                let list = json_inline(&calls_schema(tools));
                let head = match trigger {
                    Some(id) => format!("<[{id}]>"),
                    None => "\"[TOOL_CALLS]\"".to_string(),
                };
                match (forced, trigger) {
                    (true, _) => format!("start: {head} calls\ncalls: {list}"),
                    (false, Some(_)) => format!("start: TEXT | {head} calls\nTEXT: /(.|\\n)*/\ncalls: {list}"),
                    (false, None) => format!("start: TEXT | call_hd calls\ncall_hd[lazy]: TEXT {head}\nTEXT: /(.|\\n)*/\ncalls: {list}"),
                }
            }
            ToolFormat::Generic => format!("start: body\nbody: {}", json_inline(&generic_schema(tools))),
        };
        Some(Grammar::Lark(text))
    }

    /// The request's messages as the template should see them: a call's `arguments` as an
    /// object (templates apply `tojson` to it), and for the generic format the tools described
    /// in a system message and calls and results written as text.
    pub fn messages(self, messages: &[Value], tools: &Tools) -> Vec<Value> {
        let mut out: Vec<Value> = messages.iter().map(|m| self.message(m)).collect();
        if self == ToolFormat::Generic && tools.choice != ToolChoice::None {
            // After the system message's text where there is one; else before the first
            // user message's (some templates refuse a system role, Gemma's among them).
            let prompt = generic_prompt(tools);
            let role = |m: &Value, r: &str| m.get("role").and_then(Value::as_str) == Some(r);
            if let Some(system) = out.first_mut().filter(|m| role(m, "system")) {
                let text = system.get("content").and_then(Value::as_str).unwrap_or("").to_string();
                system["content"] = Value::String(format!("{text}\n\n{prompt}"));
            } else if let Some(user) = out.iter_mut().find(|m| role(m, "user")) {
                let text = user.get("content").and_then(Value::as_str).unwrap_or("").to_string();
                user["content"] = Value::String(format!("{prompt}\n\n{text}"));
            } else {
                out.insert(0, json!({"role": "user", "content": prompt}));
            }
        }
        out
    }

    fn message(self, m: &Value) -> Value {
        let role = m.get("role").and_then(Value::as_str).unwrap_or("");
        let mut m = m.clone();
        // OpenAI sends a calling turn's content as null; templates test and split it as text.
        if m.get("tool_calls").is_some() && m.get("content").is_none_or(Value::is_null) {
            m["content"] = json!("");
        }
        if let Some(calls) = m.get_mut("tool_calls").and_then(Value::as_array_mut) {
            for call in calls.iter_mut() {
                if let Some(args) = call.pointer_mut("/function/arguments") {
                    if let Some(obj) = args.as_str().and_then(|s| serde_json::from_str::<Value>(s).ok()) {
                        *args = obj;
                    }
                }
            }
        }
        if self != ToolFormat::Generic {
            return m;
        }
        // Templates without tools: calls and results as plain turns.
        match role {
            "assistant" if m.get("tool_calls").is_some_and(|c| c.as_array().is_some_and(|a| !a.is_empty())) => {
                let calls: Vec<Value> = m["tool_calls"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(|c| json!({"name": c.pointer("/function/name"), "arguments": c.pointer("/function/arguments")}))
                    .collect();
                json!({"role": "assistant", "content": json!({"tool_calls": calls}).to_string()})
            }
            "tool" => {
                let content = m.get("content").map(|c| c.as_str().map_or_else(|| c.to_string(), str::to_string)).unwrap_or_default();
                json!({"role": "user", "content": format!("Result of the tool call {}: {content}", m.get("tool_call_id").and_then(Value::as_str).unwrap_or(""))})
            }
            _ => m,
        }
    }

    /// A streaming parser for a reply in this format.
    pub fn stream(self, trigger: Option<u32>, ids: IdMaker) -> ToolStream {
        ToolStream { format: self, trigger, ids, held: String::new(), part: Part::Text, after_call: false, calls: 0 }
    }
}

/// Whitespace a call's JSON may put between two tokens: one space or newline. Models write
/// calls on one line (`{"name": "f", "arguments": {...}}`); more would only let a model
/// wander.
const CALL_WHITESPACE: &str = r"[\x20\x0A]";

/// `schema` with a call's whitespace, as Lark's inline `%json`.
fn json_inline(schema: &Value) -> String {
    let mut s = schema.clone();
    if let Some(o) = s.as_object_mut() {
        o.insert(
            "x-guidance".into(),
            json!({"whitespace_flexible": true, "whitespace_pattern": CALL_WHITESPACE, "item_separator": ",", "key_separator": ":", "lenient": false}),
        );
    }
    format!("%json {s}")
}

/// One call to any callable tool: `{"name": <const>, <args_key>: <its parameters>}`.
fn one_call_schema(tools: &Tools, args_key: &str) -> Value {
    let each: Vec<Value> = tools
        .callable()
        .into_iter()
        .map(|t| {
            let mut props = Map::new();
            props.insert("name".into(), json!({"const": t.name}));
            props.insert(args_key.into(), t.parameters.clone());
            json!({"type": "object", "properties": props, "required": ["name", args_key], "additionalProperties": false})
        })
        .collect();
    match each.len() {
        1 => each.into_iter().next().unwrap_or_default(),
        _ => json!({"anyOf": each}),
    }
}

/// A list of calls (Mistral's, the generic format's): at least one, one only unless parallel.
fn calls_schema(tools: &Tools) -> Value {
    let mut calls = json!({"type": "array", "items": one_call_schema(tools, "arguments"), "minItems": 1});
    if !tools.parallel {
        calls["maxItems"] = json!(1);
    }
    calls
}

/// The generic format's reply: calls, or (with `auto`) a plain response.
fn generic_schema(tools: &Tools) -> Value {
    let call = json!({"type": "object", "properties": {"tool_calls": calls_schema(tools)}, "required": ["tool_calls"], "additionalProperties": false});
    match tools.choice {
        ToolChoice::Auto => {
            json!({"anyOf": [call, {"type": "object", "properties": {"response": {"type": "string"}}, "required": ["response"], "additionalProperties": false}]})
        }
        _ => call,
    }
}

/// The system message that tells a model without tool support about its tools.
fn generic_prompt(tools: &Tools) -> String {
    let list: Vec<Value> = tools.callable().iter().map(|t| t.spec.get("function").cloned().unwrap_or(Value::Null)).collect();
    let how = match tools.choice {
        ToolChoice::Auto => "Respond with a JSON object: either {\"tool_calls\": [{\"name\": <function name>, \"arguments\": <arguments object>}]} to call functions, or {\"response\": <your reply>} to answer directly.",
        _ => "Respond with a JSON object {\"tool_calls\": [{\"name\": <function name>, \"arguments\": <arguments object>}]} that calls the functions the request needs.",
    };
    format!("You can call these functions:\n{}\n{how}", serde_json::to_string_pretty(&list).unwrap_or_default())
}

/// Call ids: unique per response, in the form the format's templates expect (Mistral: nine
/// letters and digits), drawn from the request's seed and the choice.
#[derive(Clone, Debug)]
pub struct IdMaker {
    state: u64,
    mistral: bool,
}

impl IdMaker {
    pub fn new(seed: u64, choice: usize, format: ToolFormat) -> IdMaker {
        IdMaker { state: seed ^ (choice as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0xD1B5_4A32_D192_ED03, mistral: format == ToolFormat::Mistral }
    }

    fn next(&mut self) -> String {
        const ALNUM: &[u8] = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
        let mut chars = String::new();
        let n = if self.mistral { 9 } else { 24 };
        for _ in 0..n {
            // splitmix64
            self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = self.state;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^= z >> 31;
            chars.push(ALNUM[(z % ALNUM.len() as u64) as usize] as char);
        }
        if self.mistral {
            chars
        } else {
            format!("call_{chars}")
        }
    }
}

/// Where a reply's parser is.
#[derive(Clone, Debug)]
enum Part {
    /// Free text; `held` keeps what may begin a call marker (Llama 3 and the generic format:
    /// what comes before the reply's first character decides).
    Text,
    /// Between a call marker or list punctuation and the next call object.
    Between,
    /// Inside a call's JSON object.
    Call(CallScanner),
    /// After a Hermes call's object, until `</tool_call>`.
    Closing,
    /// A Hermes body that is not a JSON object: held until `</tool_call>`, then content.
    NotJson,
    /// The generic format's `{"response": ...}` (or text that is neither form): parsed at the end.
    Whole,
    /// A Llama 3 reply that is not a call: content from here on.
    Plain,
    /// After a call list's end: ignored.
    Rest,
}

/// What a piece of the reply turns into: text for `content`, and pieces of tool calls.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ToolOut {
    pub content: String,
    pub calls: Vec<ToolCall>,
}

impl ToolOut {
    /// Adds a call's piece, joined to the last one where it continues the same call.
    fn piece(&mut self, piece: ToolCall) {
        match self.calls.last_mut() {
            Some(last) if last.index == piece.index && piece.id.is_empty() => last.arguments.push_str(&piece.arguments),
            _ => self.calls.push(piece),
        }
    }
}

/// A reply's text as it streams, split into content and calls. Calls come out as OpenAI
/// streams them: a call's first piece carries its index, id and name once both are known, the
/// next pieces its arguments' text as the model writes it, so the pieces of a call joined
/// ([`ToolCall::join`]) are the call.
#[derive(Clone, Debug)]
pub struct ToolStream {
    format: ToolFormat,
    trigger: Option<u32>,
    ids: IdMaker,
    /// Text not yet given out: it may begin a call, or is a marker being read.
    held: String,
    part: Part,
    /// A Hermes call just closed: a newline after it is not content.
    after_call: bool,
    calls: usize,
}

const HERMES_OPEN: &str = "<tool_call>";
const HERMES_CLOSE: &str = "</tool_call>";
const MISTRAL_TRIGGER: &str = "[TOOL_CALLS]";
const PYTHON_TAG: &str = "<|python_tag|>";

impl ToolStream {
    /// Calls made so far.
    pub fn calls(&self) -> usize {
        self.calls
    }

    /// The next piece of the reply (`id`: the token it came from; `text`: its text, control
    /// tokens as nothing).
    pub fn push(&mut self, id: u32, text: &str) -> ToolOut {
        let mut out = ToolOut::default();
        if self.format == ToolFormat::Mistral && self.trigger == Some(id) && matches!(self.part, Part::Text) {
            out.content = std::mem::take(&mut self.held);
            self.part = Part::Between;
        }
        for c in text.chars() {
            self.char(c, &mut out);
        }
        out
    }

    fn char(&mut self, c: char, out: &mut ToolOut) {
        match &mut self.part {
            Part::Text => self.text_char(c, out),
            Part::Between => match (self.format, c) {
                (_, '{') => self.part = Part::Call(CallScanner::default().with('{')),
                (_, c) if c.is_whitespace() => {}
                (ToolFormat::Mistral | ToolFormat::Generic, '[' | ',') => {}
                (ToolFormat::Mistral | ToolFormat::Generic, _) => self.part = Part::Rest,
                _ => {
                    self.held = format!("{HERMES_OPEN}{c}");
                    self.part = Part::NotJson;
                }
            },
            Part::Call(scan) => {
                let closed = scan.push(c);
                self.emit(out, closed);
            }
            Part::Closing | Part::NotJson => {
                self.held.push(c);
                if self.held.ends_with(HERMES_CLOSE) {
                    if matches!(self.part, Part::NotJson) {
                        out.content.push_str(&self.held);
                    }
                    self.held.clear();
                    self.part = Part::Text;
                    self.after_call = true;
                }
            }
            Part::Whole => self.held.push(c),
            Part::Plain => out.content.push(c),
            Part::Rest => {}
        }
    }

    /// A character of free text.
    fn text_char(&mut self, c: char, out: &mut ToolOut) {
        if std::mem::take(&mut self.after_call) && c == '\n' {
            return;
        }
        self.held.push(c);
        match self.format {
            ToolFormat::Hermes | ToolFormat::Mistral => {
                let marker = if self.format == ToolFormat::Hermes { HERMES_OPEN } else { MISTRAL_TRIGGER };
                if let Some(text) = self.held.strip_suffix(marker) {
                    out.content.push_str(text);
                    self.held.clear();
                    self.part = Part::Between;
                } else {
                    let keep = longest_prefix_suffix(&self.held, marker);
                    out.content.extend(self.held.drain(..self.held.len() - keep));
                }
            }
            // A call is a reply that starts with `{` (after `<|python_tag|>`).
            ToolFormat::Llama3 => {
                let start = self.held.trim_start();
                let start = start.strip_prefix(PYTHON_TAG).unwrap_or(start).trim_start();
                if start == "{" {
                    self.held.clear();
                    self.part = Part::Call(CallScanner::default().with('{'));
                } else if !(start.is_empty() || PYTHON_TAG.starts_with(self.held.trim_start())) {
                    out.content.push_str(&std::mem::take(&mut self.held));
                    self.part = Part::Plain;
                }
            }
            // `{"tool_calls": [...]}` streams as calls; `{"response": ...}` is read whole.
            ToolFormat::Generic => {
                const CALLS: &str = "\"tool_calls\"";
                let t = self.held.trim_start();
                let Some(rest) = t.strip_prefix('{').map(str::trim_start) else {
                    if !t.is_empty() {
                        self.part = Part::Whole;
                    }
                    return;
                };
                if let Some(after) = rest.strip_prefix(CALLS).map(str::trim_start) {
                    if after.starts_with(':') {
                        self.held.clear();
                        self.part = Part::Between;
                    } else if !after.is_empty() {
                        self.part = Part::Whole;
                    }
                } else if !CALLS.starts_with(rest) {
                    self.part = Part::Whole;
                }
            }
        }
    }

    /// Gives out what the call being read has made known: its first piece once its name and
    /// the start of its arguments are known, then its arguments' new text; and when it closed,
    /// the rest (or the whole call, written another way).
    fn emit(&mut self, out: &mut ToolOut, closed: bool) {
        let Part::Call(scan) = &mut self.part else { return };
        if scan.index.is_none() {
            if let Some(name) = scan.name.take() {
                scan.index = Some(self.calls);
                self.calls += 1;
                out.piece(ToolCall { index: self.calls - 1, id: self.ids.next(), name, arguments: String::new() });
            }
        }
        if let Some(index) = scan.index {
            let new = scan.new_arguments();
            if !new.is_empty() {
                out.piece(ToolCall { index, id: String::new(), name: String::new(), arguments: new });
            }
        }
        if !closed {
            return;
        }
        if scan.index.is_none() {
            let text = std::mem::take(&mut scan.text);
            match serde_json::from_str::<Value>(&text).ok().and_then(|v| call_parts(&v)) {
                Some((name, arguments)) => {
                    self.calls += 1;
                    out.piece(ToolCall { index: self.calls - 1, id: self.ids.next(), name, arguments });
                }
                None if self.format == ToolFormat::Hermes => {
                    self.held = format!("{HERMES_OPEN}{text}");
                    self.part = Part::NotJson;
                    return;
                }
                None => out.content.push_str(&text),
            }
        }
        self.part = match self.format {
            ToolFormat::Hermes => Part::Closing,
            ToolFormat::Mistral | ToolFormat::Generic => Part::Between,
            _ => Part::Rest,
        };
    }

    /// The end of the reply: what was held, as content or calls.
    pub fn finish(&mut self) -> ToolOut {
        let mut out = ToolOut::default();
        let held = std::mem::take(&mut self.held);
        match std::mem::replace(&mut self.part, Part::Rest) {
            Part::Text | Part::NotJson => out.content = held,
            // A call cut short (the length limit): what was given out stays; a call whose
            // first piece never came out is text.
            Part::Call(scan) if scan.index.is_none() => {
                let open = if self.format == ToolFormat::Hermes { HERMES_OPEN } else { "" };
                out.content = format!("{open}{}", scan.text);
            }
            Part::Whole => match serde_json::from_str::<Value>(held.trim()) {
                Ok(v) if self.format == ToolFormat::Generic && v.get("response").is_some_and(Value::is_string) => {
                    out.content = v["response"].as_str().unwrap_or("").to_string();
                }
                _ => out.content = held,
            },
            Part::Between | Part::Call(_) | Part::Closing | Part::Plain | Part::Rest => {}
        }
        out
    }
}

/// A call object's name and its arguments as JSON text (`arguments`, or Llama 3's `parameters`).
fn call_parts(v: &Value) -> Option<(String, String)> {
    let name = v.get("name")?.as_str()?.to_string();
    let args = v.get("arguments").or_else(|| v.get("parameters")).cloned().unwrap_or_else(|| json!({}));
    Some((name, args.to_string()))
}

/// One call's JSON object read a character at a time: its nesting and strings tracked, so its
/// end is found exactly (a `}` or `</tool_call>` inside a string ends nothing). Once the
/// object's text reads `{"name": "...", "arguments":` the name is known and the arguments
/// stream as written; keys in another order make a call that is read whole at its end.
#[derive(Clone, Debug, Default)]
struct CallScanner {
    text: String,
    depth: u32,
    in_string: bool,
    escaped: bool,
    /// The name, once read (taken when the call's first piece goes out).
    name: Option<String>,
    /// The call's index, once its first piece went out.
    index: Option<usize>,
    /// Byte offsets in `text`: where the arguments start and end.
    args: Option<usize>,
    args_end: Option<usize>,
    /// Bytes of the arguments' text given out.
    sent: usize,
}

impl CallScanner {
    fn with(mut self, c: char) -> CallScanner {
        self.push(c);
        self
    }

    /// Adds a character; true when it closed the object.
    fn push(&mut self, c: char) -> bool {
        let at = self.text.len();
        self.text.push(c);
        if self.in_string {
            match (self.escaped, c) {
                (true, _) => self.escaped = false,
                (false, '\\') => self.escaped = true,
                (false, '"') => self.in_string = false,
                _ => {}
            }
            return false;
        }
        match c {
            '"' => self.in_string = true,
            '{' | '[' => self.depth += 1,
            '}' | ']' => {
                if self.depth == 1 {
                    self.end_arguments(at);
                }
                self.depth = self.depth.saturating_sub(1);
                return self.depth == 0;
            }
            ',' if self.depth == 1 => self.end_arguments(at),
            ':' if self.depth == 1 && self.args.is_none() => self.header(at + 1),
            _ => {}
        }
        false
    }

    fn end_arguments(&mut self, at: usize) {
        if self.args.is_some() && self.args_end.is_none() {
            self.args_end = Some(at);
        }
    }

    /// At a key's `:` at the top level: the arguments start here if the keys so far are the
    /// name and then the arguments' key.
    fn header(&mut self, start: usize) {
        let Ok(Value::Object(keys)) = serde_json::from_str::<Value>(&format!("{}null}}", &self.text[..start])) else { return };
        let order: Vec<&str> = keys.keys().map(String::as_str).collect();
        if let (["name", "arguments" | "parameters"], Some(name)) = (order.as_slice(), keys.get("name").and_then(Value::as_str)) {
            self.name = Some(name.to_string());
            self.args = Some(start);
        }
    }

    /// The arguments' text written since the last call, trailing whitespace held back.
    fn new_arguments(&mut self) -> String {
        let Some(start) = self.args else { return String::new() };
        let end = self.args_end.unwrap_or(self.text.len());
        let written = self.text[start..end].trim();
        let new = written.get(self.sent..).unwrap_or("").to_string();
        self.sent = self.sent.max(written.len());
        new
    }
}

#[cfg(test)]
mod tests;

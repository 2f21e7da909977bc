//! Chat templates: renders a model's `tokenizer.chat_template` (Jinja) the way Hugging Face's
//! `apply_chat_template` does, on minijinja with Python-compatible methods, and tokenizes the
//! result without doubling the BOS token.

mod json;
mod strftime;

use std::borrow::Cow;

use minijinja::value::{Kwargs, Rest, Serde};
use minijinja::{Environment, ErrorKind, UndefinedBehavior, Value};
use thiserror::Error;

use crate::gguf::Metadata;
use crate::tokenizer::{Tokenizer, TokenizerError};

/// GGUF key holding the default chat template.
pub const KEY_CHAT_TEMPLATE: &str = "tokenizer.chat_template";
/// Name the compiled template is stored under; it appears in error locations.
const TEMPLATE_NAME: &str = "chat_template";

/// One chat turn. Messages with more fields (`tool_calls`, `name`, list-valued `content`)
/// go through [`ChatTemplate::render_json`].
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize, PartialEq)]
pub struct ChatMessage {
    pub role: String,
    pub content: String,
}

impl ChatMessage {
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> ChatMessage {
        ChatMessage { role: role.into(), content: content.into() }
    }
}

#[derive(Debug, Error)]
pub enum ChatError {
    #[error("chat template does not compile: {0}")]
    Syntax(String),
    #[error("chat template failed to render: {0}")]
    Render(String),
    /// The template called `raise_exception(msg)`; holds `msg` unchanged.
    #[error("chat template raised an exception: {0}")]
    Raised(String),
    #[error("the model has no chat template ({KEY_CHAT_TEMPLATE})")]
    NoTemplate,
    /// The render passed one of its bounds (work, output size, recursion): a hostile or
    /// broken template, stopped before the work or the allocation happened.
    #[error("chat template stopped: {0}")]
    Budget(String),
}

/// Fuel (minijinja's one budget for all the work of a render) that every render gets. Each
/// instruction costs one fuel, and every 64 bytes of strings and lists built by operators,
/// literals and filters another (checked before the allocation is made), so this also bounds
/// the strings built: at most 16 MiB, whatever the loop or the chain of `~`/`+`. The real
/// templates (../shared/golden/chat-templates) render their conversations with a tenth of it
/// (tests/template_budget.rs).
pub const FUEL_BASE: u64 = 250_000;
/// More fuel per byte of messages and tools, so a long conversation is never refused: real
/// templates touch each input byte a few times.
const FUEL_PER_INPUT_BYTE: u64 = 2;
/// Nested macro calls and includes; minijinja's own cap is 500, deeper than a wasm stack.
const RECURSION_LIMIT: usize = 64;
/// The output may reach this, or 16× the input, whichever is larger.
const OUTPUT_MIN: usize = 1 << 20;
const OUTPUT_PER_INPUT_BYTE: usize = 16;

/// The bytes of text in a JSON value (string and key lengths; other leaves count a few).
fn json_text_len(v: &serde_json::Value) -> usize {
    match v {
        serde_json::Value::String(s) => s.len(),
        serde_json::Value::Array(a) => a.iter().map(json_text_len).sum(),
        serde_json::Value::Object(o) => o.iter().map(|(k, v)| k.len() + json_text_len(v)).sum(),
        _ => 8,
    }
}

/// A writer that refuses to grow past `limit` bytes, before it copies anything.
struct BoundedOutput {
    buf: Vec<u8>,
    limit: usize,
    over: bool,
}

impl std::io::Write for BoundedOutput {
    fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
        if self.buf.len() + data.len() > self.limit {
            self.over = true;
            return Err(std::io::Error::other("output limit"));
        }
        self.buf.extend_from_slice(data);
        Ok(data.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Unix time in seconds, or `None` where the target has no clock.
pub type Clock = fn() -> Option<u64>;

/// The system clock natively; wasm32-unknown-unknown has none (`SystemTime::now` panics there),
/// so the embedder injects one with [`ChatTemplate::with_clock`].
pub fn system_clock() -> Option<u64> {
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    {
        None
    }
    #[cfg(not(all(target_arch = "wasm32", target_os = "unknown")))]
    {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).ok().map(|d| d.as_secs())
    }
}

/// A compiled chat template plus the token texts it is rendered with; `Send + Sync`, cheap
/// to render many times.
#[derive(Clone)]
pub struct ChatTemplate {
    env: Environment<'static>,
    bos_token: String,
    eos_token: String,
    now: Clock,
    fuel_base: u64,
    /// The Jinja source, as given (tool-call formats are told from it).
    source: String,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate").field("bos_token", &self.bos_token).field("eos_token", &self.eos_token).finish()
    }
}

const _: () = {
    const fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<ChatTemplate>();
};

/// Error source that marks a `raise_exception` call, so it survives minijinja's error
/// plumbing and becomes [`ChatError::Raised`].
#[derive(Debug)]
struct RaisedByTemplate(String);

impl std::fmt::Display for RaisedByTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for RaisedByTemplate {}

fn raise_exception(msg: String) -> Result<Value, minijinja::Error> {
    Err(minijinja::Error::new(ErrorKind::InvalidOperation, msg.clone()).with_source(RaisedByTemplate(msg)))
}

fn chat_error(err: minijinja::Error) -> ChatError {
    let mut source: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(&err);
    while let Some(s) = source {
        if let Some(raised) = s.downcast_ref::<RaisedByTemplate>() {
            return ChatError::Raised(raised.0.clone());
        }
        source = s.source();
    }
    match err.kind() {
        ErrorKind::SyntaxError | ErrorKind::BadEscape | ErrorKind::InvalidDelimiter => ChatError::Syntax(err.to_string()),
        _ => ChatError::Render(err.to_string()),
    }
}

/// HF's `tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False)`:
/// `json.dumps` output, key order kept, nothing HTML-escaped.
fn tojson_filter(value: &Value, args: Rest<Value>, kwargs: Kwargs) -> Result<Value, minijinja::Error> {
    const PARAMS: [&str; 4] = ["ensure_ascii", "indent", "separators", "sort_keys"];
    if args.len() > PARAMS.len() {
        return Err(minijinja::Error::new(ErrorKind::TooManyArguments, "tojson takes at most 4 arguments"));
    }
    let get = |i: usize| -> Result<Option<Value>, minijinja::Error> {
        let from_kwargs: Option<Value> = kwargs.get(PARAMS[i])?;
        match (args.get(i), from_kwargs) {
            (Some(_), Some(_)) => Err(minijinja::Error::new(ErrorKind::InvalidOperation, format!("tojson got multiple values for argument '{}'", PARAMS[i]))),
            (Some(v), None) => Ok(Some(v.clone())),
            (None, v) => Ok(v),
        }
    };
    let ensure_ascii = get(0)?.is_some_and(|v| v.is_true());
    let indent = get(1)?;
    let separators = get(2)?;
    let sort_keys = get(3)?.is_some_and(|v| v.is_true());
    kwargs.assert_all_used()?;
    let opts = json::Options::new(ensure_ascii, indent.as_ref(), separators.as_ref(), sort_keys)?;
    json::dumps(value, &opts).map(Value::from)
}

/// Turns HF's `{% generation %}` ... `{% endgeneration %}` (a transformers extension marking
/// assistant text for training masks, which renders its body unchanged) into an always-true
/// `if`, keeping the tags' whitespace control.
fn rewrite_generation_tags(source: &str) -> Cow<'_, str> {
    if !source.contains("generation") {
        return Cow::Borrowed(source);
    }
    let mut out = String::with_capacity(source.len());
    let mut rest = source;
    while let Some(start) = rest.find("{%") {
        out.push_str(&rest[..start]);
        let tag = &rest[start + 2..];
        let Some(end) = tag.find("%}") else {
            out.push_str(&rest[start..]);
            return Cow::Owned(out);
        };
        let inner = &tag[..end];
        let lead = inner.strip_prefix(['-', '+']).map_or("", |_| &inner[..1]);
        let body = &inner[lead.len()..];
        let trail = body.strip_suffix(['-', '+']).map_or("", |_| &body[body.len() - 1..]);
        let word = body[..body.len() - trail.len()].trim();
        match word {
            "generation" => out.push_str(&format!("{{%{lead} if true {trail}%}}")),
            "endgeneration" => out.push_str(&format!("{{%{lead} endif {trail}%}}")),
            _ => out.push_str(&rest[start..start + 2 + end + 2]),
        }
        rest = &tag[end + 2..];
    }
    out.push_str(rest);
    Cow::Owned(out)
}

impl ChatTemplate {
    /// Compiles `source` once; syntax errors are reported here, not at render time.
    pub fn new(source: &str, bos_token: &str, eos_token: &str) -> Result<ChatTemplate, ChatError> {
        let mut env = Environment::new();
        // jinja2.Environment(trim_blocks=True, lstrip_blocks=True) as transformers builds it;
        // keep_trailing_newline stays off in both.
        let syntax = minijinja::syntax::SyntaxConfig::builder().trim_blocks(true).lstrip_blocks(true).build().map_err(|e| ChatError::Syntax(e.to_string()))?;
        env.set_syntax(syntax);
        env.set_undefined_behavior(UndefinedBehavior::Lenient);
        env.set_recursion_limit(RECURSION_LIMIT);
        // No loader: `include`, `import` and `extends` find nothing, so a template reads no
        // file; minijinja has no access to the environment or the network.
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", raise_exception);
        env.add_filter("tojson", tojson_filter);
        // Python's: None is not iterable (minijinja iterates it as empty, and says it is), so
        // `tools is iterable and tools | length > 0` short-circuits on `tools=None` as in
        // transformers instead of failing on `none | length`.
        env.add_test("iterable", |v: &Value| !v.is_none() && v.try_iter().is_ok());
        env.add_template_owned(TEMPLATE_NAME, rewrite_generation_tags(source).into_owned()).map_err(chat_error)?;
        Ok(ChatTemplate {
            env,
            bos_token: bos_token.to_string(),
            eos_token: eos_token.to_string(),
            now: system_clock,
            fuel_base: FUEL_BASE,
            source: source.to_string(),
        })
    }

    /// The model's default template, rendered with its BOS/EOS token texts; `None` when the
    /// file has no `tokenizer.chat_template`.
    pub fn from_metadata(md: &Metadata, tok: &Tokenizer) -> Result<Option<ChatTemplate>, ChatError> {
        let source = md.opt_str(KEY_CHAT_TEMPLATE).map_err(|e| ChatError::Syntax(format!("{KEY_CHAT_TEMPLATE}: {e}")))?;
        let Some(source) = source else { return Ok(None) };
        let text = |id: Option<u32>| id.and_then(|id| tok.token_text(id)).unwrap_or("");
        ChatTemplate::new(source, text(tok.bos_id()), text(tok.eos_id())).map(Some)
    }

    /// Replaces the clock behind `strftime_now` (wasm embedders pass the JS clock; tests a
    /// fixed time). When it returns `None`, `strftime_now` is left undefined, so templates
    /// guarded by `strftime_now is defined` fall back to their built-in date.
    pub fn with_clock(mut self, now: Clock) -> ChatTemplate {
        self.now = now;
        self
    }

    /// Replaces [`FUEL_BASE`] (tests measure the margin real templates leave with it).
    #[doc(hidden)]
    pub fn with_fuel_base(mut self, fuel: u64) -> ChatTemplate {
        self.fuel_base = fuel;
        self
    }

    /// The template's Jinja source.
    pub fn source(&self) -> &str {
        &self.source
    }

    pub fn bos_token(&self) -> &str {
        &self.bos_token
    }

    pub fn eos_token(&self) -> &str {
        &self.eos_token
    }

    /// Renders `messages`; `tools` and `documents` are none, as transformers passes them
    /// when the caller gives none.
    pub fn render(&self, messages: &[ChatMessage], add_generation_prompt: bool) -> Result<String, ChatError> {
        let input_len = messages.iter().map(|m| m.role.len() + m.content.len()).sum();
        self.render_value(Value::from(Serde(messages)), Value::from(()), Value::from(()), add_generation_prompt, input_len)
    }

    /// Renders messages given as JSON objects (extra fields such as `tool_calls`, `name` or
    /// list-valued `content` pass through, key order kept) with optional tool schemas.
    pub fn render_json(&self, messages: &[serde_json::Value], tools: Option<&[serde_json::Value]>, add_generation_prompt: bool) -> Result<String, ChatError> {
        self.render_json_with(messages, tools, &serde_json::Map::new(), add_generation_prompt)
    }

    /// `render_json` with more variables for the template (a request's
    /// `chat_template_kwargs`, such as Qwen3's `enable_thinking`); they cannot replace the
    /// variables set here (`messages`, `tools`, `add_generation_prompt`, ...).
    pub fn render_json_with(
        &self,
        messages: &[serde_json::Value],
        tools: Option<&[serde_json::Value]>,
        kwargs: &serde_json::Map<String, serde_json::Value>,
        add_generation_prompt: bool,
    ) -> Result<String, ChatError> {
        let input_len = messages.iter().chain(tools.into_iter().flatten()).map(json_text_len).sum::<usize>()
            + kwargs.iter().map(|(k, v)| k.len() + json_text_len(v)).sum::<usize>();
        let tools = tools.map_or(Value::from(()), |t| Value::from(Serde(t)));
        const SET_HERE: [&str; 7] = ["messages", "tools", "documents", "add_generation_prompt", "bos_token", "eos_token", "strftime_now"];
        let kwargs: serde_json::Map<String, serde_json::Value> =
            kwargs.iter().filter(|(k, _)| !SET_HERE.contains(&k.as_str())).map(|(k, v)| (k.clone(), v.clone())).collect();
        self.render_value(Value::from(Serde(messages)), tools, Value::from(Serde(&kwargs)), add_generation_prompt, input_len)
    }

    /// Renders under the budgets: fuel, recursion, output size (see the constants above).
    fn render_value(&self, messages: Value, tools: Value, kwargs: Value, add_generation_prompt: bool, input_len: usize) -> Result<String, ChatError> {
        // One reading of the clock per render, so every call in the template agrees.
        let strftime_now = match (self.now)() {
            Some(secs) => Value::from_function(move |fmt: &str| strftime::format(fmt, secs)),
            None => Value::UNDEFINED,
        };
        let ctx = minijinja::context! {
            messages => messages,
            tools => tools,
            documents => Value::from(()),
            add_generation_prompt => add_generation_prompt,
            bos_token => self.bos_token.as_str(),
            eos_token => self.eos_token.as_str(),
            strftime_now => strftime_now,
            ..kwargs
        };
        let fuel = self.fuel_base.saturating_add(FUEL_PER_INPUT_BYTE.saturating_mul(input_len as u64));
        let mut env = self.env.clone();
        env.set_fuel(Some(fuel));
        let template = env.get_template(TEMPLATE_NAME).map_err(chat_error)?;
        let limit = OUTPUT_MIN.max(input_len.saturating_mul(OUTPUT_PER_INPUT_BYTE));
        let mut out = BoundedOutput { buf: Vec::new(), limit, over: false };
        let rendered = template.render_captured_to(ctx, &mut out).map(drop);
        match rendered {
            Ok(()) => String::from_utf8(out.buf).map_err(|e| ChatError::Render(e.to_string())),
            Err(_) if out.over => Err(ChatError::Budget(format!("its output passed {limit} bytes"))),
            Err(e) if e.kind() == ErrorKind::OutOfFuel => {
                Err(ChatError::Budget(format!("it ran out of fuel ({fuel}: one per instruction and per 64 bytes built): a loop too long or strings too large")))
            }
            Err(e) if e.kind() == ErrorKind::InvalidOperation && e.to_string().contains("recursion limit") => {
                Err(ChatError::Budget(format!("it recursed deeper than {RECURSION_LIMIT} calls")))
            }
            Err(e) => Err(chat_error(e)),
        }
    }
}

/// Tokenizes a rendered chat prompt: special tokens parsed; BOS added per the tokenizer's
/// default unless the rendered text already starts with the BOS token's text (templates such
/// as gemma's print `{{ bos_token }}` themselves), so there is never a double BOS.
pub fn tokenize_rendered(tok: &Tokenizer, rendered: &str) -> Result<Vec<u32>, TokenizerError> {
    let bos_text = tok.bos_id().and_then(|id| tok.token_text(id)).unwrap_or("");
    let already = !bos_text.is_empty() && rendered.starts_with(bos_text);
    tok.encode(rendered, tok.add_bos_default() && !already, true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generation_tags_become_ifs() {
        let src = "a{%- generation -%}b{% endgeneration %}c{% if x %}{% endif %}";
        assert_eq!(rewrite_generation_tags(src), "a{%- if true -%}b{% endif %}c{% if x %}{% endif %}");
        let t = ChatTemplate::new("{% for m in messages %}{% generation %}{{ m.content }}{% endgeneration %}{% endfor %}", "", "").unwrap();
        assert_eq!(t.render(&[ChatMessage::new("user", "hi")], false).unwrap(), "hi");
    }
}

//! One request type for every front end (the CLI, the server, the wasm bindings): the prompt
//! as text, token ids or chat messages, the sampling and stopping settings and the number of
//! choices. It is validated and turned into token ids here, once, before it reaches the run
//! loop, so a request that cannot run fails at `submit` with a typed error.

use flint_core::chat::{tokenize_rendered, ChatError, ChatTemplate};
use flint_core::constrain::{ConstraintError, Grammar};
use flint_core::generate::{GenerateError, GenerateParams, Generation};
use flint_core::reasoning::{thought_start, ThoughtStart, ThoughtStream, THOUGHT_BUDGET};
use flint_core::sampling::clock_seed;
use flint_core::tokenizer::Tokenizer;
use flint_core::tools::{IdMaker, ToolChoice, ToolFormat, Tools};

use crate::{EngineError, EngineInfo};

/// Most choices one request may ask for (OpenAI's limit).
pub const MAX_N: usize = 128;

/// What to complete.
#[derive(Clone, Debug, PartialEq)]
pub enum Input {
    /// Raw text: special tokens parsed, BOS as the model's metadata says.
    Text(String),
    /// Token ids as they are.
    Tokens(Vec<u32>),
    /// Chat messages (`{"role", "content", ...}` objects) rendered with the chat template.
    Chat(Vec<serde_json::Value>),
}

#[derive(Clone, Debug)]
pub struct Request {
    pub input: Input,
    pub params: GenerateParams,
    /// Choices to generate from the same prompt (sharing its KV blocks).
    pub n: usize,
    /// For chat input: end the rendered prompt with the assistant's turn opening.
    pub add_generation_prompt: bool,
    /// Every generated token's event carries the logits it was drawn from (tests and tools:
    /// a full readback per token).
    pub logits: bool,
    /// A predicted output (OpenAI's `prediction`): text the reply is expected to repeat
    /// largely, used as a source of drafts. It changes speed only, never the tokens.
    pub prediction: Option<String>,
    /// Refuse the request when the prompt and `max_tokens` do not fit in the context together
    /// (OpenAI's rule); otherwise generation stops at the context's end (llama.cpp's CLI).
    pub fit_max_tokens: bool,
    /// The grammar every choice's reply is held to (structured output).
    pub constraint: Option<Constrained>,
    /// Functions the model may call (chat input only): the template renders them, the reply
    /// is held to the format's grammar as `tool_choice` says, and split into content and calls.
    pub tools: Option<Tools>,
    /// More variables for the chat template (`chat_template_kwargs`: Qwen3's
    /// `enable_thinking`, ...).
    pub template_kwargs: serde_json::Map<String, serde_json::Value>,
    /// A thinking model's thought comes apart from its answer, as the events' `reasoning`
    /// (the server's and the package's `reasoning_content`); otherwise it stays in the text.
    pub split_thoughts: bool,
    /// Characters a constrained reply's thought may take before its grammar closes it.
    pub thought_budget: usize,
}

/// A reply's grammar and the request field it came from (named in errors: `response_format`,
/// `guided_json`, `--grammar`, ...).
#[derive(Clone, Debug, PartialEq)]
pub struct Constrained {
    pub grammar: Grammar,
    pub field: &'static str,
}

impl Request {
    pub fn new(input: Input, params: GenerateParams) -> Request {
        Request {
            input,
            params,
            n: 1,
            add_generation_prompt: true,
            logits: false,
            prediction: None,
            fit_max_tokens: false,
            constraint: None,
            tools: None,
            template_kwargs: serde_json::Map::new(),
            split_thoughts: false,
            thought_budget: THOUGHT_BUDGET,
        }
    }
}

/// A validated request: its prompt ids and one per-choice generation state each.
pub(crate) struct Prepared {
    pub prompt: Vec<u32>,
    pub choices: Vec<Generation>,
    pub logits: bool,
    /// The predicted output's tokens (empty: none), at most the context's length.
    pub prediction: Vec<u32>,
    /// The request field its grammar came from (empty: none).
    pub constraint_field: &'static str,
}

/// Renders chat `messages` (and `tools`, and the template's extra variables) with `template`;
/// a template's refusal is a typed error.
pub(crate) fn render_with(
    template: Option<&ChatTemplate>,
    messages: &[serde_json::Value],
    tools: Option<&[serde_json::Value]>,
    kwargs: &serde_json::Map<String, serde_json::Value>,
    add_generation_prompt: bool,
) -> Result<String, EngineError> {
    let template = template.ok_or(EngineError::NoChatTemplate)?;
    template.render_json_with(messages, tools, kwargs, add_generation_prompt).map_err(EngineError::Chat)
}

/// Renders chat `messages` with `template`; a template's refusal is a typed error.
pub(crate) fn render(template: Option<&ChatTemplate>, messages: &[serde_json::Value], add_generation_prompt: bool) -> Result<String, EngineError> {
    render_with(template, messages, None, &serde_json::Map::new(), add_generation_prompt)
}

/// The control token that starts Mistral's calls, when the vocabulary has one.
fn mistral_trigger(tokenizer: &Tokenizer) -> Option<u32> {
    match tokenizer.encode("[TOOL_CALLS]", false, true).ok()?.as_slice() {
        [id] if tokenizer.is_control(*id) => Some(*id),
        _ => None,
    }
}

/// Renders chat `messages` with `template` and tokenizes the result as a chat prompt.
pub(crate) fn chat_tokens(
    tokenizer: &Tokenizer,
    template: Option<&ChatTemplate>,
    messages: &[serde_json::Value],
    add_generation_prompt: bool,
) -> Result<Vec<u32>, EngineError> {
    let text = render(template, messages, add_generation_prompt)?;
    tokenize_rendered(tokenizer, &text).map_err(|e| EngineError::Chat(ChatError::Render(e.to_string())))
}

/// Checks `req` against the model and turns it into ids and choices. `drafts`: whether the
/// engine can verify drafts (a prediction needs it).
pub(crate) fn prepare(req: Request, info: &EngineInfo, (n_ctx, n_vocab): (usize, usize), drafts: bool, now: f64) -> Result<Prepared, EngineError> {
    let (tokenizer, template) = (&*info.tokenizer, info.template.as_ref());
    if !(1..=MAX_N).contains(&req.n) {
        return Err(GenerateError::BadN { n: req.n, max: MAX_N }.into());
    }
    // Tools: the format the template's model writes calls in, and the grammar for them.
    let tools = match (&req.tools, &req.input) {
        (Some(t), Input::Chat(_)) => {
            let format = template.map_or(ToolFormat::Generic, |t| ToolFormat::detect(t.source()));
            let trigger = (format == ToolFormat::Mistral).then(|| mistral_trigger(tokenizer)).flatten();
            Some((t, format, trigger, format.grammar(t, trigger)))
        }
        (Some(_), _) => {
            return Err(EngineError::Constraint {
                field: "tools",
                source: ConstraintError::Invalid { kind: "grammar", reason: "tools need chat messages".into() },
            })
        }
        (None, _) => None,
    };
    let wanted = match (&req.constraint, tools.as_ref().and_then(|t| t.3.clone())) {
        (Some(_), Some(_)) => {
            let reason = "tools and a response format both constrain the reply: give one".into();
            return Err(EngineError::Constraint { field: "tools", source: ConstraintError::Invalid { kind: "grammar", reason } });
        }
        (Some(c), None) => Some(c.clone()),
        (None, Some(grammar)) => Some(Constrained { grammar, field: "tools" }),
        (None, None) => None,
    };
    req.params.validate()?;
    // Chat messages rendered: whether a thinking model's reply starts in, before or without a
    // thought decides the thought's split and where a grammar starts to hold.
    let (prompt, thought) = match &req.input {
        Input::Text(t) => (tokenizer.encode(t, tokenizer.add_bos_default(), true)?, None),
        Input::Tokens(ids) => (ids.clone(), None),
        Input::Chat(messages) => {
            let text = match &tools {
                Some((t, format, ..)) => {
                    render_with(template, &format.messages(messages, t), Some(&t.specs()), &req.template_kwargs, req.add_generation_prompt)?
                }
                None => render_with(template, messages, None, &req.template_kwargs, req.add_generation_prompt)?,
            };
            let ids = tokenize_rendered(tokenizer, &text).map_err(|e| EngineError::Chat(ChatError::Render(e.to_string())))?;
            (ids, template.and_then(|t| thought_start(t.source(), &text)))
        }
    };
    let wanted = match (wanted, thought) {
        (Some(Constrained { grammar, field }), Some(start)) => Some(Constrained {
            grammar: Grammar::AfterThought { answer: Box::new(grammar), opened: start == ThoughtStart::Inside, budget: req.thought_budget },
            field,
        }),
        (wanted, _) => wanted,
    };
    // The grammar compiles before the request takes any engine time, so a bad one costs
    // nothing else.
    let constraint = match &wanted {
        Some(Constrained { grammar, field }) => {
            let fail = |source| EngineError::Constraint { field, source };
            Some(info.constrainer().map_err(fail)?.constraint(grammar, n_vocab).map_err(fail)?)
        }
        None => None,
    };
    let prediction = match &req.prediction {
        Some(_) if !drafts => return Err(EngineError::PredictionNeedsDrafts),
        // Plain text: no BOS, special tokens not parsed. The reply fits the context, so the
        // prediction is of use only that far.
        Some(text) => {
            let mut ids = tokenizer.encode(text, false, false)?;
            ids.truncate(n_ctx);
            ids
        }
        None => Vec::new(),
    };
    if prompt.is_empty() {
        return Err(GenerateError::EmptyPrompt.into());
    }
    if let Some(&id) = prompt.iter().find(|&&id| id as usize >= n_vocab) {
        return Err(flint_core::backend::BackendError::BadToken { id, n_vocab }.into());
    }
    if prompt.len() + 1 > n_ctx {
        return Err(GenerateError::ContextExceeded { prompt: prompt.len(), n_ctx }.into());
    }
    match req.params.max_tokens {
        Some(max_tokens) if req.fit_max_tokens && prompt.len().saturating_add(max_tokens) > n_ctx => {
            return Err(GenerateError::ReplyExceedsContext { prompt: prompt.len(), max_tokens, n_ctx }.into());
        }
        _ => {}
    }
    // One seed for the request; choice i draws from its stream i.
    let seed = req.params.sampling.seed.unwrap_or_else(clock_seed);
    let choices = (0..req.n)
        .map(|i| {
            let mut gen = Generation::new(&prompt, &req.params, seed, i, n_vocab, now)?;
            if let Some(start) = thought.filter(|_| req.split_thoughts) {
                gen = gen.with_thoughts(ThoughtStream::new(start));
            }
            // `tool_choice: "none"`: the reply is text, whatever it looks like.
            if let Some((_, format, trigger, _)) = tools.as_ref().filter(|t| t.0.choice != ToolChoice::None) {
                gen = gen.with_tools(format.stream(*trigger, IdMaker::new(seed, i, *format)));
            }
            Ok(match &constraint {
                Some(c) => gen.with_constraint(c.clone()),
                None => gen,
            })
        })
        .collect::<Result<Vec<_>, EngineError>>()?;
    let constraint_field = wanted.as_ref().map_or("", |c| c.field);
    Ok(Prepared { prompt, choices, logits: req.logits, prediction, constraint_field })
}

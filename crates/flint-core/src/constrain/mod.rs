//! Constrained decoding: a reply held to a JSON schema, a grammar (Lark, or GBNF converted to
//! it), a regular expression or a fixed choice, token by token. The grammars are compiled and
//! the per-step token masks computed by llguidance over Flint's own tokenizer ([`env`]); the
//! engine puts each mask into the sampler's allowed-token input and feeds each sampled token
//! back ([`Constraint::consume`]).
//!
//! One [`Constrainer`] per model (its tokenizer trie and token slices are built once, on the
//! first constrained request), one [`Constraint`] per reply.

mod env;
mod gbnf;

use std::sync::Arc;

use llguidance::api::{ParserLimits, TopLevelGrammar};
use llguidance::toktrie::TokEnv;
use llguidance::{Matcher, ParserFactory};
use serde_json::Value;

use crate::tokenizer::Tokenizer;

pub use gbnf::gbnf_to_lark;

/// Whitespace a JSON reply may put between two tokens: a newline and an indentation of up to
/// 19 spaces, so pretty-printed JSON fits and a model cannot run away in whitespace.
pub const JSON_WHITESPACE: &str = r"[\x20\x0A\x0D\x09]{1,20}";

/// The longest error text kept from llguidance (its messages may quote the grammar).
const MAX_REASON: usize = 600;

/// What a reply is held to.
#[derive(Clone, Debug, PartialEq)]
pub enum Grammar {
    /// Any JSON object (OpenAI's `json_object`).
    JsonObject,
    /// A JSON value valid for this schema.
    JsonSchema(Value),
    /// A grammar in llguidance's Lark syntax.
    Lark(String),
    /// A grammar in llama.cpp's GBNF, converted to Lark.
    Gbnf(String),
    /// Text matching this regular expression (whole).
    Regex(String),
    /// Exactly one of these strings.
    Choice(Vec<String>),
    /// A thought (`<think>…</think>`, the opening already in the prompt when `opened`) of at
    /// most `budget` characters, then `answer`: a thinking model's reply, constrained after its
    /// thought.
    AfterThought { answer: Box<Grammar>, opened: bool, budget: usize },
}

/// A constraint that cannot be built or cannot go on.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ConstraintError {
    /// The request's schema, grammar, pattern or choices do not compile.
    #[error("invalid {kind}: {reason}")]
    Invalid { kind: &'static str, reason: String },
    /// The grammar reached a state it cannot leave (a limit hit while computing a mask, or a
    /// token it does not allow).
    #[error("the {kind} constraint cannot continue: {reason}")]
    Stuck { kind: &'static str, reason: String },
    /// The model's vocabulary cannot serve as llguidance's tokenizer.
    #[error("constrained decoding is not available for this vocabulary: {reason}")]
    Vocabulary { reason: String },
}

impl Grammar {
    /// A grammar given as text: GBNF when it defines a rule with `::=`, else Lark.
    pub fn from_text(text: &str) -> Grammar {
        if text.contains("::=") {
            Grammar::Gbnf(text.to_string())
        } else {
            Grammar::Lark(text.to_string())
        }
    }

    /// The kind's name in messages: `json_schema`, `grammar`, `regex`, ...
    pub fn kind(&self) -> &'static str {
        match self {
            Grammar::JsonObject => "json_object",
            Grammar::JsonSchema(_) => "json_schema",
            Grammar::Lark(_) | Grammar::Gbnf(_) => "grammar",
            Grammar::Regex(_) => "regex",
            Grammar::Choice(_) => "choice",
            Grammar::AfterThought { answer, .. } => answer.kind(),
        }
    }

    fn invalid(&self, reason: impl std::fmt::Display) -> ConstraintError {
        ConstraintError::Invalid { kind: self.kind(), reason: short(reason) }
    }

    /// llguidance's form of this grammar.
    fn to_llg(&self) -> Result<TopLevelGrammar, ConstraintError> {
        Ok(match self {
            Grammar::JsonObject => TopLevelGrammar::from_json_schema(bounded_json(serde_json::json!({"type": "object"}))),
            Grammar::JsonSchema(schema) => {
                if !(schema.is_object() || schema.is_boolean()) {
                    return Err(self.invalid("a schema is a JSON object (or true/false)"));
                }
                TopLevelGrammar::from_json_schema(bounded_json(schema.clone()))
            }
            Grammar::Lark(text) => {
                if text.trim().is_empty() {
                    return Err(self.invalid("the grammar is empty"));
                }
                TopLevelGrammar::from_lark(text.clone())
            }
            Grammar::Gbnf(text) => TopLevelGrammar::from_lark(gbnf_to_lark(text).map_err(|e| self.invalid(e))?),
            Grammar::Regex(rx) => TopLevelGrammar::from_regex(rx),
            Grammar::Choice(options) => {
                if options.is_empty() {
                    return Err(self.invalid("no choices given"));
                }
                let alts: Vec<String> = options.iter().map(|o| serde_json::to_string(o).unwrap_or_default()).collect();
                TopLevelGrammar::from_lark(format!("start: {}", alts.join(" | ")))
            }
            Grammar::AfterThought { answer, opened, budget } => {
                let mut inner = answer.to_llg()?;
                if inner.grammars.len() != 1 {
                    return Err(self.invalid("a thought can precede only a single grammar"));
                }
                let mut g = inner.grammars.remove(0);
                g.name = Some("answer".into());
                // The thought ends at its first `</think>`, and after `budget` characters
                // the grammar writes that end itself. Up to two newlines before the answer.
                let open = if *opened { "" } else { "\"<think>\" " };
                let lark = format!("start: {open}thought /\\n{{0,2}}/ @answer\nthought[lazy]: /(.|\\n){{0,{budget}}}/ \"</think>\"");
                TopLevelGrammar { grammars: vec![llguidance::api::GrammarWithLexer::from_lark(lark), g], max_tokens: None }
            }
        })
    }
}

/// `schema` with llguidance's options set by Flint: free but bounded whitespace, strict
/// keywords (an unsupported one is an error, not dropped). A request's own `x-guidance`
/// options are replaced.
fn bounded_json(schema: Value) -> Value {
    let options = serde_json::json!({
        "whitespace_flexible": true,
        "whitespace_pattern": JSON_WHITESPACE,
        "item_separator": ",",
        "key_separator": ":",
        "lenient": false,
    });
    match schema {
        Value::Object(mut map) => {
            map.insert("x-guidance".into(), options);
            Value::Object(map)
        }
        // `true`/`false`: any value, or none.
        other => serde_json::json!({ "x-guidance": options, "allOf": [other] }),
    }
}

fn short(reason: impl std::fmt::Display) -> String {
    let mut s = reason.to_string();
    if s.len() > MAX_REASON {
        let mut cut = MAX_REASON;
        while !s.is_char_boundary(cut) {
            cut -= 1;
        }
        s.truncate(cut);
        s.push('…');
    }
    s
}

/// One model's constraint compiler: its tokenizer as llguidance sees it, and the limits every
/// grammar is compiled and run under (llguidance's defaults: about a second of compile and
/// tens of milliseconds of mask work at most, beyond which a request is refused).
pub struct Constrainer {
    factory: ParserFactory,
    /// End-of-generation ids: all allowed where the grammar may end.
    eog: Arc<[u32]>,
}

impl Constrainer {
    pub fn new(tokenizer: Arc<Tokenizer>) -> Result<Constrainer, ConstraintError> {
        let eog: Arc<[u32]> = tokenizer.eog_ids().into();
        if eog.is_empty() {
            return Err(ConstraintError::Vocabulary { reason: "it has no end-of-generation token".into() });
        }
        let env: TokEnv = Arc::new(env::FlintEnv::new(tokenizer));
        let mut factory = ParserFactory::new_simple(&env).map_err(|e| ConstraintError::Vocabulary { reason: short(e) })?;
        factory.quiet();
        *factory.limits_mut() = ParserLimits { verbose_errors: false, ..ParserLimits::default() };
        Ok(Constrainer { factory, eog })
    }

    /// A constraint for one reply of a model whose output rows have `n_vocab` logits.
    pub fn constraint(&self, grammar: &Grammar, n_vocab: usize) -> Result<Constraint, ConstraintError> {
        let parser = self.factory.create_parser(grammar.to_llg()?).map_err(|e| grammar.invalid(e))?;
        let matcher = Matcher::new(Ok(parser));
        if let Some(e) = matcher.get_error() {
            return Err(grammar.invalid(e));
        }
        Ok(Constraint { matcher, kind: grammar.kind(), eog: self.eog.clone(), words: n_vocab.div_ceil(32), consumed: 0 })
    }
}

/// One reply's place in its grammar.
pub struct Constraint {
    matcher: Matcher,
    kind: &'static str,
    eog: Arc<[u32]>,
    /// Mask length in 32-bit words.
    words: usize,
    consumed: usize,
}

impl Clone for Constraint {
    fn clone(&self) -> Self {
        Constraint { matcher: self.matcher.deep_clone(), kind: self.kind, eog: self.eog.clone(), words: self.words, consumed: self.consumed }
    }
}

impl std::fmt::Debug for Constraint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Constraint").field("kind", &self.kind).field("consumed", &self.consumed).finish_non_exhaustive()
    }
}

impl Constraint {
    fn stuck(&self, reason: impl std::fmt::Display) -> ConstraintError {
        ConstraintError::Stuck { kind: self.kind, reason: short(reason) }
    }

    /// The tokens allowed next, 1 bit per token id (bit i%32 of word i/32), the sampler's
    /// mask form; every end-of-generation token is allowed where the grammar may end.
    pub fn mask(&mut self) -> Result<Vec<u32>, ConstraintError> {
        let accepting = self.matcher.is_accepting().map_err(|e| self.stuck(e))?;
        let mut words = vec![0u32; self.words];
        if !self.matcher.is_stopped() {
            let vob = self.matcher.compute_mask().map_err(|e| self.stuck(e))?;
            for (w, &v) in words.iter_mut().zip(vob.as_slice()) {
                *w = v;
            }
        }
        // llguidance's end token stands for the grammar's end: every end-of-generation token
        // may end the reply where the grammar may end, none elsewhere.
        let ends = self.end_mask();
        let may_end = accepting || self.matcher.is_stopped();
        for (w, e) in words.iter_mut().zip(&ends) {
            *w = if may_end { *w | e } else { *w & !e };
        }
        if words.iter().all(|&w| w == 0) {
            return Err(self.stuck("no token can continue the reply"));
        }
        Ok(words)
    }

    /// Moves past `id`, a token the last mask allowed (end-of-generation tokens end the reply
    /// and are not fed).
    pub fn consume(&mut self, id: u32) -> Result<(), ConstraintError> {
        if self.eog.contains(&id) {
            return Ok(());
        }
        self.matcher.consume_token(id).map_err(|e| self.stuck(e))?;
        self.consumed += 1;
        Ok(())
    }

    /// The grammar is complete and nothing may follow: the reply ends here.
    pub fn is_finished(&self) -> bool {
        self.matcher.is_stopped()
    }

    /// Whether the grammar may end here.
    pub fn is_accepting(&mut self) -> bool {
        self.matcher.is_accepting().unwrap_or(false)
    }

    /// How many leading tokens of `tokens` the grammar allows from here, up to the first
    /// end-of-generation token (drafts past them cannot be taken).
    pub fn valid_prefix(&mut self, tokens: &[u32]) -> usize {
        let text = tokens.iter().position(|t| self.eog.contains(t)).unwrap_or(tokens.len());
        self.matcher.validate_tokens(&tokens[..text]).unwrap_or(0)
    }

    /// A mask that allows only the end-of-generation tokens.
    pub fn end_mask(&self) -> Vec<u32> {
        let mut words = vec![0u32; self.words];
        for &id in self.eog.iter() {
            if let Some(w) = words.get_mut(id as usize / 32) {
                *w |= 1 << (id % 32);
            }
        }
        words
    }

    /// Undoes the last `n` consumed tokens.
    pub fn rollback(&mut self, n: usize) -> Result<(), ConstraintError> {
        self.matcher.rollback(n).map_err(|e| self.stuck(e))?;
        self.consumed -= n.min(self.consumed);
        Ok(())
    }

    /// Tokens the grammar forces next (the only continuation it allows), if any.
    pub fn forced(&mut self) -> Vec<u32> {
        self.matcher.compute_ff_tokens()
    }
}

#[cfg(test)]
mod tests;

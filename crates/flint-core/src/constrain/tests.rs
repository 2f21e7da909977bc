//! Constraints over a small byte-level vocabulary built here (no model file): every byte, a
//! few merged tokens, and a control token that ends a turn.

use std::sync::{Arc, OnceLock};

use serde_json::json;

use super::{Constrainer, Constraint, ConstraintError, Grammar};
use crate::gguf::{Array, Metadata, Value};
use crate::tokenizer::Tokenizer;

/// GPT-2's byte-to-character map.
fn byte_char(b: u8) -> char {
    let printable = |b: u8| (b'!'..=b'~').contains(&b) || (0xA1..=0xAC).contains(&b) || (0xAE..=0xFF).contains(&b);
    if printable(b) {
        return b as char;
    }
    let below = (0..b).filter(|&x| !printable(x)).count() as u32;
    char::from_u32(256 + below).unwrap()
}

fn tokenizer() -> Arc<Tokenizer> {
    static T: OnceLock<Arc<Tokenizer>> = OnceLock::new();
    T.get_or_init(|| {
        let mut tokens: Vec<String> = (0..=255u8).map(|b| byte_char(b).to_string()).collect();
        let merges = ["t r", "u e", "tr ue", "\" a", "\"a \""];
        for m in merges {
            tokens.push(m.replace(' ', ""));
        }
        tokens.push("<|im_end|>".into());
        let mut types = vec![1i32; tokens.len()];
        *types.last_mut().unwrap() = 3;
        let n = tokens.len() as u32;
        let md = Metadata::from_pairs([
            ("tokenizer.ggml.model".to_string(), Value::String("gpt2".into())),
            ("tokenizer.ggml.pre".to_string(), Value::String("qwen2".into())),
            ("tokenizer.ggml.tokens".to_string(), Value::Array(Array::String(tokens))),
            ("tokenizer.ggml.token_type".to_string(), Value::Array(Array::I32(types))),
            ("tokenizer.ggml.merges".to_string(), Value::Array(Array::String(merges.iter().map(|s| s.to_string()).collect()))),
            ("tokenizer.ggml.eos_token_id".to_string(), Value::U32(n - 1)),
        ]);
        Arc::new(Tokenizer::from_metadata(&md).unwrap())
    })
    .clone()
}

fn constrainer() -> &'static Constrainer {
    static C: OnceLock<Constrainer> = OnceLock::new();
    C.get_or_init(|| Constrainer::new(tokenizer()).unwrap())
}

/// The model's rows are wider than the vocabulary (padding), as real files often are.
const N_VOCAB: usize = 300;

fn allows(mask: &[u32], id: u32) -> bool {
    crate::sampling::mask_allows(mask, id as usize)
}

/// Feeds `text`'s tokens one by one, each checked against the mask first; returns the
/// constraint and whether the end token is allowed after it.
fn feed(c: &mut Constraint, text: &str) -> Result<bool, String> {
    let ids = tokenizer().encode(text, false, false).unwrap();
    for (i, &id) in ids.iter().enumerate() {
        let mask = c.mask().map_err(|e| e.to_string())?;
        if !allows(&mask, id) {
            return Err(format!("token {i} ({:?}) of {text:?} not allowed", tokenizer().token_text(id)));
        }
        c.consume(id).map_err(|e| e.to_string())?;
    }
    let end = tokenizer().eos_id().unwrap();
    Ok(c.is_finished() || allows(&c.mask().map_err(|e| e.to_string())?, end))
}

fn check(g: &Grammar, text: &str) -> Result<bool, String> {
    let mut c = constrainer().constraint(g, N_VOCAB).map_err(|e| e.to_string())?;
    feed(&mut c, text)
}

#[test]
fn a_schema_takes_valid_json_whole_and_refuses_the_rest() {
    let g = Grammar::JsonSchema(json!({
        "type": "object",
        "properties": {"a": {"type": "boolean"}, "n": {"type": "integer", "maximum": 50}},
        "required": ["a"],
        "additionalProperties": false
    }));
    assert_eq!(check(&g, r#"{"a":true,"n":7}"#), Ok(true));
    assert_eq!(check(&g, "{\n  \"a\": true\n}"), Ok(true), "pretty-printed");
    assert_eq!(check(&g, r#"{"a":true"#), Ok(false), "not yet complete: no end");
    assert!(check(&g, r#"{"b":1}"#).is_err());
    assert!(check(&g, r#"{"a":true,"n":51}"#).is_err());
    assert!(check(&g, r#"{"a":"true"}"#).is_err());
}

#[test]
fn whitespace_between_tokens_is_bounded() {
    let g = Grammar::JsonObject;
    assert_eq!(check(&g, &format!("{{{}}}", " ".repeat(20))), Ok(true));
    assert!(check(&g, &format!("{{{}}}", " ".repeat(21))).is_err());
}

#[test]
fn the_end_token_is_allowed_only_where_the_grammar_may_end() {
    let end = tokenizer().eos_id().unwrap();
    let mut c = constrainer().constraint(&Grammar::Choice(vec!["true".into(), "tr".into()]), N_VOCAB).unwrap();
    let m = c.mask().unwrap();
    assert!(!allows(&m, end));
    assert_eq!(m.len(), N_VOCAB.div_ceil(32));
    assert_eq!(feed(&mut c, "tr"), Ok(true), "\"tr\" is a whole choice");
    assert_eq!(feed(&mut c, "ue"), Ok(true));
    assert!(c.is_finished() || c.is_accepting());
}

#[test]
fn regex_choice_lark_and_gbnf() {
    assert_eq!(check(&Grammar::Regex("[0-9]{3}-[a-z]+".into()), "123-abc"), Ok(true));
    assert!(check(&Grammar::Regex("[0-9]{3}".into()), "12a").is_err());
    assert_eq!(check(&Grammar::Choice(vec!["red".into(), "green \"x\"".into()]), "green \"x\""), Ok(true));
    assert!(check(&Grammar::Choice(vec!["red".into()]), "blue").is_err());
    let lark = Grammar::from_text("start: \"a\"+ \"b\"");
    assert!(matches!(lark, Grammar::Lark(_)));
    assert_eq!(check(&lark, "aaab"), Ok(true));
    let gbnf = Grammar::from_text("root ::= [ab]+ \".\"");
    assert!(matches!(gbnf, Grammar::Gbnf(_)));
    assert_eq!(check(&gbnf, "abba."), Ok(true));
    assert!(check(&gbnf, "abc").is_err());
}

#[test]
fn control_tokens_are_not_text() {
    // `<|im_end|>` as characters is not the control token, and a string cannot contain it.
    let g = Grammar::JsonSchema(json!({"type": "string"}));
    let mut c = constrainer().constraint(&g, N_VOCAB).unwrap();
    feed(&mut c, "\"x").unwrap();
    let end = tokenizer().eos_id().unwrap();
    assert!(!allows(&c.mask().unwrap(), end), "inside a string the turn cannot end");
}

#[test]
fn rollback_and_valid_prefix_follow_the_tokens() {
    let g = Grammar::Regex("abc".into());
    let mut c = constrainer().constraint(&g, N_VOCAB).unwrap();
    let ids = tokenizer().encode("abx", false, false).unwrap();
    assert_eq!(c.valid_prefix(&ids), 2);
    c.consume(ids[0]).unwrap();
    c.consume(ids[1]).unwrap();
    c.rollback(2).unwrap();
    assert_eq!(feed(&mut c, "abc"), Ok(true));
    let copy = c.clone();
    assert!(copy.is_finished() || copy.clone().is_accepting());
}

#[test]
fn bad_constraints_are_refused_with_their_reason() {
    let cases = [
        (Grammar::JsonSchema(json!({"type": "object", "properties": {"a": {"type": "nosuch"}}})), "json_schema"),
        (Grammar::JsonSchema(json!({"type": "integer", "minimum": 5, "maximum": 1})), "json_schema"),
        (Grammar::JsonSchema(json!({"type": "string", "x-unknown-keyword-check": 1, "format": "no-such-format"})), "json_schema"),
        (Grammar::JsonSchema(json!([1, 2])), "json_schema"),
        (Grammar::Lark("start: undefined_rule".into()), "grammar"),
        (Grammar::Lark("   ".into()), "grammar"),
        (Grammar::Gbnf("root ::= \"a".into()), "grammar"),
        (Grammar::Regex("(".into()), "regex"),
        (Grammar::Choice(vec![]), "choice"),
    ];
    for (g, kind) in cases {
        match constrainer().constraint(&g, N_VOCAB) {
            Err(ConstraintError::Invalid { kind: k, reason }) => {
                assert_eq!(k, kind, "{g:?}");
                assert!(!reason.is_empty());
            }
            Err(e) => panic!("{g:?}: {e}"),
            Ok(_) => panic!("{g:?} compiled"),
        }
    }
}

#[test]
fn a_thought_precedes_the_constrained_answer_and_is_bounded() {
    let answer = Box::new(Grammar::JsonSchema(json!({"type": "object", "properties": {"a": {"type": "boolean"}}, "required": ["a"]})));
    for opened in [false, true] {
        let g = Grammar::AfterThought { answer: answer.clone(), opened, budget: 8 };
        let open = if opened { "" } else { "<think>" };
        for sep in ["\n\n", "\n", ""] {
            assert_eq!(check(&g, &format!("{open}hm</think>{sep}{{\"a\":true}}")), Ok(true), "opened {opened}, {sep:?}");
        }
        assert!(check(&g, &format!("{open}hm</think>{{\"b\":1}}")).is_err(), "the answer is held to its schema");
        assert!(check(&g, &format!("{open}abcdefghi</think>{{\"a\":true}}")).is_err(), "a thought over its budget");
        // At the budget the grammar closes the thought itself.
        let mut c = constrainer().constraint(&g, N_VOCAB).unwrap();
        feed(&mut c, &format!("{open}abcdefgh")).unwrap();
        assert_eq!(tokenizer().decode(&c.forced(), false).unwrap(), "</think>", "opened {opened}");
    }
    assert!(check(&Grammar::AfterThought { answer, opened: false, budget: 8 }, "{\"a\":true}").is_err(), "the thought opens first");
}

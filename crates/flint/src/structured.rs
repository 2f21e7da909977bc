//! A request body's structured-output fields, as each peer spells them, read into one
//! [`Constrained`]: OpenAI's `response_format` (`text`, `json_object`, `json_schema`; WebLLM's
//! `json_object` with a `schema` string and its `grammar` type), llama.cpp's `json_schema`
//! and `grammar`, vLLM's `structured_outputs` (`json`, `regex`, `choice`, `grammar`,
//! `json_object`) and its older `guided_json`, `guided_regex`, `guided_choice` and
//! `guided_grammar`. At most one may ask for a constraint.

use serde_json::{Map, Value};

use crate::openai::ApiError;
use crate::request::Constrained;
use flint_core::constrain::Grammar;

/// The top-level fields read here.
pub(crate) const FIELDS: &[&str] =
    &["response_format", "json_schema", "grammar", "structured_outputs", "guided_json", "guided_regex", "guided_choice", "guided_grammar"];

/// The constraint `obj` asks for, if any.
pub(crate) fn constraint(obj: &Map<String, Value>) -> Result<Option<Constrained>, ApiError> {
    let mut found: Option<Constrained> = None;
    for &field in FIELDS {
        let Some(v) = obj.get(field).filter(|v| !v.is_null()) else { continue };
        let grammar = match field {
            "response_format" => response_format(v)?,
            "json_schema" => Some(schema(field, v)?),
            "grammar" | "guided_grammar" => Some(grammar_text(field, v)?),
            "guided_json" => Some(schema(field, v)?),
            "guided_regex" => Some(Grammar::Regex(string(field, v)?.to_string())),
            "guided_choice" => Some(choice(field, v)?),
            "structured_outputs" => structured_outputs(v)?,
            _ => None,
        };
        if let Some(grammar) = grammar {
            if let Some(first) = &found {
                return Err(ApiError::invalid(field, format!("`{field}` and `{}` both constrain the reply: give one", first.field)));
            }
            found = Some(Constrained { grammar, field });
        }
    }
    Ok(found)
}

fn string<'a>(field: &str, v: &'a Value) -> Result<&'a str, ApiError> {
    v.as_str().ok_or_else(|| ApiError::invalid(field, format!("`{field}` must be a string")))
}

/// A grammar's text: Lark, or GBNF when it defines rules with `::=`.
fn grammar_text(field: &str, v: &Value) -> Result<Grammar, ApiError> {
    let text = string(field, v)?;
    if text.trim().is_empty() {
        return Err(ApiError::invalid(field, format!("`{field}` is empty")));
    }
    Ok(Grammar::from_text(text))
}

/// A JSON schema given as an object (or `true`), or as its JSON text.
fn schema(field: &str, v: &Value) -> Result<Grammar, ApiError> {
    match v {
        Value::Object(_) | Value::Bool(true) => Ok(Grammar::JsonSchema(v.clone())),
        Value::String(text) => match serde_json::from_str::<Value>(text) {
            Ok(parsed @ (Value::Object(_) | Value::Bool(true))) => Ok(Grammar::JsonSchema(parsed)),
            Ok(_) => Err(ApiError::invalid(field, format!("`{field}` must be a JSON schema object"))),
            Err(e) => Err(ApiError::invalid(field, format!("`{field}` is not valid JSON: {e}"))),
        },
        _ => Err(ApiError::invalid(field, format!("`{field}` must be a JSON schema object"))),
    }
}

fn choice(field: &str, v: &Value) -> Result<Grammar, ApiError> {
    let bad = || ApiError::invalid(field, format!("`{field}` must be a non-empty array of strings"));
    let items = v.as_array().filter(|a| !a.is_empty()).ok_or_else(bad)?;
    let options = items.iter().map(|s| s.as_str().map(str::to_string)).collect::<Option<Vec<_>>>().ok_or_else(bad)?;
    Ok(Grammar::Choice(options))
}

/// OpenAI's `response_format`, with WebLLM's and llama.cpp's variants.
fn response_format(v: &Value) -> Result<Option<Grammar>, ApiError> {
    const F: &str = "response_format";
    let bad = |m: &str| ApiError::invalid(F, m.to_string());
    let obj = v.as_object().ok_or_else(|| bad("`response_format` must be an object with a `type`"))?;
    let ty = obj.get("type").and_then(Value::as_str).ok_or_else(|| bad("`response_format` needs a `type`: text, json_object, json_schema or grammar"))?;
    Ok(match ty {
        "text" => None,
        // WebLLM and llama.cpp take a schema beside `json_object`.
        "json_object" => Some(match obj.get("schema").filter(|s| !s.is_null()) {
            Some(s) => schema(F, s)?,
            None => Grammar::JsonObject,
        }),
        "json_schema" => {
            let inner = match (obj.get("json_schema"), obj.get("schema")) {
                (Some(Value::Object(js)), _) => js.get("schema").filter(|s| !s.is_null()).cloned(),
                (Some(Value::Null) | None, Some(s)) => Some(s.clone()),
                (Some(_), _) => return Err(bad("`response_format.json_schema` must be an object with `name` and `schema`")),
                (None, None) => return Err(bad("`response_format` of type json_schema needs `json_schema`")),
            };
            // OpenAI's `strict` asks for what Flint always does (the schema is enforced).
            Some(match inner {
                Some(s) => schema(F, &s)?,
                None => Grammar::JsonSchema(Value::Bool(true)),
            })
        }
        "grammar" => Some(grammar_text(F, obj.get("grammar").unwrap_or(&Value::Null))?),
        other => return Err(bad(&format!("unknown `response_format` type {other:?}: text, json_object, json_schema or grammar"))),
    })
}

/// vLLM's `structured_outputs`: one of `json`, `regex`, `choice`, `grammar`, `json_object`.
fn structured_outputs(v: &Value) -> Result<Option<Grammar>, ApiError> {
    const F: &str = "structured_outputs";
    let obj = v.as_object().ok_or_else(|| ApiError::invalid(F, "`structured_outputs` must be an object"))?;
    let mut found = None;
    for (key, v) in obj.iter().filter(|(_, v)| !v.is_null()) {
        let g = match key.as_str() {
            "json" => schema(F, v)?,
            "regex" => Grammar::Regex(string(F, v)?.to_string()),
            "choice" => choice(F, v)?,
            "grammar" => grammar_text(F, v)?,
            "json_object" if v.as_bool() == Some(true) => Grammar::JsonObject,
            "json_object" => continue,
            // vLLM's own options (backend choice, whitespace pattern): Flint has one engine.
            "disable_any_whitespace" | "disable_additional_properties" | "whitespace_pattern" | "backend" => continue,
            other => return Err(ApiError::invalid(F, format!("unknown `structured_outputs` key {other:?}: json, regex, choice, grammar or json_object"))),
        };
        if found.replace(g).is_some() {
            return Err(ApiError::invalid(F, "`structured_outputs` gives more than one constraint: give one"));
        }
    }
    Ok(found)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    /// The grammar and its field, or the error's `param` and message.
    type Read = Result<Option<(Grammar, &'static str)>, (Option<String>, String)>;

    fn read(body: Value) -> Read {
        constraint(body.as_object().unwrap()).map(|c| c.map(|c| (c.grammar, c.field))).map_err(|e| (e.param, e.message))
    }

    #[test]
    fn every_peer_spelling_reads_to_one_grammar() {
        let s = json!({"type": "object", "properties": {"a": {"type": "integer"}}});
        let js = Grammar::JsonSchema(s.clone());
        let cases = [
            (json!({"response_format": {"type": "text"}}), None),
            (json!({"response_format": {"type": "json_object"}}), Some((Grammar::JsonObject, "response_format"))),
            (
                json!({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": s, "strict": true}}}),
                Some((js.clone(), "response_format")),
            ),
            (json!({"response_format": {"type": "json_object", "schema": s.to_string()}}), Some((js.clone(), "response_format"))),
            (json!({"response_format": {"type": "grammar", "grammar": "root ::= \"a\""}}), Some((Grammar::Gbnf("root ::= \"a\"".into()), "response_format"))),
            (json!({"json_schema": s}), Some((js.clone(), "json_schema"))),
            (json!({"grammar": "start: \"a\""}), Some((Grammar::Lark("start: \"a\"".into()), "grammar"))),
            (json!({"guided_json": s.to_string()}), Some((js.clone(), "guided_json"))),
            (json!({"guided_regex": "[a-z]+"}), Some((Grammar::Regex("[a-z]+".into()), "guided_regex"))),
            (json!({"guided_choice": ["a", "b"]}), Some((Grammar::Choice(vec!["a".into(), "b".into()]), "guided_choice"))),
            (json!({"structured_outputs": {"choice": ["a"]}}), Some((Grammar::Choice(vec!["a".into()]), "structured_outputs"))),
            (json!({"structured_outputs": {"json": s, "backend": "auto"}}), Some((js.clone(), "structured_outputs"))),
            (json!({"structured_outputs": {"json_object": true}}), Some((Grammar::JsonObject, "structured_outputs"))),
            (json!({"response_format": null, "guided_json": null}), None),
        ];
        for (body, want) in cases {
            assert_eq!(read(body.clone()), Ok(want), "{body}");
        }
    }

    #[test]
    fn bad_values_name_their_field() {
        let cases = [
            (json!({"response_format": "json"}), "response_format"),
            (json!({"response_format": {"type": "xml"}}), "response_format"),
            (json!({"response_format": {"type": "json_schema"}}), "response_format"),
            (json!({"response_format": {"type": "json_schema", "json_schema": 3}}), "response_format"),
            (json!({"response_format": {"type": "json_object", "schema": "{not json"}}), "response_format"),
            (json!({"json_schema": [1]}), "json_schema"),
            (json!({"grammar": ""}), "grammar"),
            (json!({"guided_choice": []}), "guided_choice"),
            (json!({"guided_choice": ["a", 1]}), "guided_choice"),
            (json!({"guided_regex": 5}), "guided_regex"),
            (json!({"structured_outputs": {"regex": "a", "choice": ["a"]}}), "structured_outputs"),
            (json!({"structured_outputs": {"nope": 1}}), "structured_outputs"),
            (json!({"response_format": {"type": "json_object"}, "guided_regex": "a"}), "guided_regex"),
        ];
        for (body, field) in cases {
            let (param, message) = read(body.clone()).unwrap_err();
            assert_eq!(param.as_deref(), Some(field), "{body}: {message}");
        }
    }
}

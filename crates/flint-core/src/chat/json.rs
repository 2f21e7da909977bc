//! Python's `json.dumps` over minijinja values, for transformers' `tojson` filter: insertion
//! order, `, `/`: ` separators, `indent`, `ensure_ascii`, `sort_keys`, Python float reprs and
//! no HTML escaping.

use std::fmt::Write;

use minijinja::value::ValueKind;
use minijinja::{Error, ErrorKind, Value};

/// Deeper nesting is refused (Python stops at its recursion limit, about 1000 frames).
const MAX_DEPTH: usize = 512;
/// Python switches float reprs to exponent notation outside `1e-4 <= |x| < 1e16`.
const REPR_MIN_EXP: i32 = -4;
const REPR_MAX_EXP: i32 = 16;

pub struct Options {
    ensure_ascii: bool,
    /// `None`: one line; `Some(s)`: newline plus `s` per level.
    indent: Option<String>,
    item_sep: String,
    key_sep: String,
    sort_keys: bool,
}

fn invalid(msg: impl Into<String>) -> Error {
    Error::new(ErrorKind::InvalidOperation, msg.into())
}

impl Options {
    /// Reads the keyword arguments as `json.dumps` interprets them.
    pub fn new(ensure_ascii: bool, indent: Option<&Value>, separators: Option<&Value>, sort_keys: bool) -> Result<Options, Error> {
        let indent = match indent {
            None => None,
            Some(v) if v.is_none() || v.is_undefined() => None,
            Some(v) if v.kind() == ValueKind::String => Some(v.as_str().unwrap_or_default().to_string()),
            // Python: an int indent means that many spaces (bools are ints there too).
            Some(v) if v.kind() == ValueKind::Bool => Some(" ".repeat(usize::from(v.is_true()))),
            Some(v) => match v.as_i64() {
                Some(n) => Some(" ".repeat(usize::try_from(n).unwrap_or(0))),
                None => return Err(invalid(format!("tojson: indent must be an integer or a string, not {}", v.kind()))),
            },
        };
        let (item_sep, key_sep) = match separators {
            Some(v) if !v.is_none() && !v.is_undefined() => {
                let pair: Vec<Value> = v.try_iter().map_err(|_| invalid("tojson: separators must be a pair of strings"))?.collect();
                match pair.as_slice() {
                    [a, b] if a.as_str().is_some() && b.as_str().is_some() => {
                        (a.as_str().unwrap_or_default().to_string(), b.as_str().unwrap_or_default().to_string())
                    }
                    _ => return Err(invalid("tojson: separators must be a pair of strings")),
                }
            }
            _ if indent.is_some() => (",".to_string(), ": ".to_string()),
            _ => (", ".to_string(), ": ".to_string()),
        };
        Ok(Options { ensure_ascii, indent, item_sep, key_sep, sort_keys })
    }
}

pub fn dumps(value: &Value, opts: &Options) -> Result<String, Error> {
    let mut w = Writer { out: String::new(), opts, depth: 0 };
    w.value(value)?;
    Ok(w.out)
}

struct Writer<'a> {
    out: String,
    opts: &'a Options,
    depth: usize,
}

impl Writer<'_> {
    fn value(&mut self, v: &Value) -> Result<(), Error> {
        match v.kind() {
            ValueKind::None => self.out.push_str("null"),
            ValueKind::Bool => self.out.push_str(if v.is_true() { "true" } else { "false" }),
            ValueKind::Number => self.number(v)?,
            ValueKind::String => self.string(v.as_str().unwrap_or_default()),
            ValueKind::Seq | ValueKind::Iterable => {
                let items: Vec<Value> = v.try_iter()?.collect();
                self.container('[', ']', items.len(), |w, i| w.value(&items[i]))?;
            }
            ValueKind::Map => {
                let mut entries = Vec::new();
                for key in v.try_iter()? {
                    let item = v.get_item(&key)?;
                    entries.push((key_text(&key)?, item));
                }
                if self.opts.sort_keys {
                    entries.sort_by(|a, b| a.0.cmp(&b.0));
                }
                self.container('{', '}', entries.len(), |w, i| {
                    w.string(&entries[i].0);
                    w.out.push_str(&w.opts.key_sep);
                    w.value(&entries[i].1)
                })?;
            }
            ValueKind::Undefined => return Err(invalid("tojson: Object of type Undefined is not JSON serializable")),
            kind => return Err(invalid(format!("tojson: a {kind} is not JSON serializable"))),
        }
        Ok(())
    }

    fn container(&mut self, open: char, close: char, len: usize, mut item: impl FnMut(&mut Self, usize) -> Result<(), Error>) -> Result<(), Error> {
        if len == 0 {
            self.out.push(open);
            self.out.push(close);
            return Ok(());
        }
        if self.depth >= MAX_DEPTH {
            return Err(invalid(format!("tojson: nesting deeper than {MAX_DEPTH} levels")));
        }
        self.depth += 1;
        self.out.push(open);
        self.newline();
        for i in 0..len {
            if i > 0 {
                self.out.push_str(&self.opts.item_sep);
                self.newline();
            }
            item(self, i)?;
        }
        self.depth -= 1;
        self.newline();
        self.out.push(close);
        Ok(())
    }

    fn newline(&mut self) {
        if let Some(indent) = &self.opts.indent {
            self.out.push('\n');
            for _ in 0..self.depth {
                self.out.push_str(indent);
            }
        }
    }

    fn number(&mut self, v: &Value) -> Result<(), Error> {
        if v.is_integer() {
            let _ = write!(self.out, "{v}");
        } else {
            let f = f64::try_from(v.clone())?;
            self.out.push_str(&float_repr(f));
        }
        Ok(())
    }

    /// A JSON string literal as Python writes it (`\uXXXX` in lower-case hex).
    fn string(&mut self, s: &str) {
        self.out.push('"');
        for c in s.chars() {
            match c {
                '"' => self.out.push_str("\\\""),
                '\\' => self.out.push_str("\\\\"),
                '\n' => self.out.push_str("\\n"),
                '\r' => self.out.push_str("\\r"),
                '\t' => self.out.push_str("\\t"),
                '\u{8}' => self.out.push_str("\\b"),
                '\u{c}' => self.out.push_str("\\f"),
                c if (c as u32) < 0x20 => {
                    let _ = write!(self.out, "\\u{:04x}", c as u32);
                }
                c if self.opts.ensure_ascii && !(' '..='~').contains(&c) => {
                    let mut units = [0u16; 2];
                    for unit in c.encode_utf16(&mut units) {
                        let _ = write!(self.out, "\\u{unit:04x}");
                    }
                }
                c => self.out.push(c),
            }
        }
        self.out.push('"');
    }
}

/// Object keys as Python coerces them: strings as is, numbers by repr, booleans and None
/// in JSON spelling.
fn key_text(key: &Value) -> Result<String, Error> {
    Ok(match key.kind() {
        ValueKind::String => key.as_str().unwrap_or_default().to_string(),
        ValueKind::Bool => (if key.is_true() { "true" } else { "false" }).to_string(),
        ValueKind::None => "null".to_string(),
        ValueKind::Number if key.is_integer() => key.to_string(),
        ValueKind::Number => float_repr(f64::try_from(key.clone())?),
        kind => return Err(invalid(format!("tojson: keys must be str, int, float, bool or None, not {kind}"))),
    })
}

/// Python's `float.__repr__` (shortest round-trip digits), with json's spellings of the
/// non-finite values.
pub fn float_repr(f: f64) -> String {
    if f.is_nan() {
        return "NaN".into();
    }
    if f.is_infinite() {
        return if f < 0.0 { "-Infinity".into() } else { "Infinity".into() };
    }
    if f == 0.0 {
        return if f.is_sign_negative() { "-0.0".into() } else { "0.0".into() };
    }
    // `{:e}` gives the shortest round-trip digits as `d.ddde±x`.
    let sci = format!("{:e}", f.abs());
    let (mantissa, exp) = sci.split_once('e').unwrap_or((&sci, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let digits: String = mantissa.chars().filter(|c| c.is_ascii_digit()).collect();
    let sign = if f < 0.0 { "-" } else { "" };
    if (REPR_MIN_EXP..REPR_MAX_EXP).contains(&exp) {
        let point = exp + 1; // digits before the decimal point
        let body = if point <= 0 {
            format!("0.{}{digits}", "0".repeat(point.unsigned_abs() as usize))
        } else if point as usize >= digits.len() {
            format!("{digits}{}.0", "0".repeat(point as usize - digits.len()))
        } else {
            format!("{}.{}", &digits[..point as usize], &digits[point as usize..])
        };
        format!("{sign}{body}")
    } else {
        let (head, tail) = digits.split_at(1);
        let frac = if tail.is_empty() { String::new() } else { format!(".{tail}") };
        let esign = if exp < 0 { '-' } else { '+' };
        format!("{sign}{head}{frac}e{esign}{:02}", exp.unsigned_abs())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn floats_print_like_python() {
        let cases = [
            (1.0, "1.0"),
            (0.1, "0.1"),
            (-2.5, "-2.5"),
            (1e16, "1e+16"),
            (1.5e16, "1.5e+16"),
            (1234567890123456.0, "1234567890123456.0"),
            (1e-4, "0.0001"),
            (1e-5, "1e-05"),
            (1.25e-7, "1.25e-07"),
            (123.456, "123.456"),
            (1e100, "1e+100"),
            (-0.0, "-0.0"),
            (f64::NAN, "NaN"),
            (f64::NEG_INFINITY, "-Infinity"),
        ];
        for (f, want) in cases {
            assert_eq!(float_repr(f), want, "{f:?}");
        }
    }

    fn dumps_with(v: &serde_json::Value, opts: Options) -> String {
        dumps(&Value::from(minijinja::value::Serde(v)), &opts).unwrap()
    }

    #[test]
    fn indent_and_separators_match_python() {
        let v = serde_json::json!({"b": [1, {"x": null}], "a": {}, "c": "é\u{1F600}\u{1}"});
        let plain = Options::new(false, None, None, false).unwrap();
        assert_eq!(dumps_with(&v, plain), "{\"b\": [1, {\"x\": null}], \"a\": {}, \"c\": \"é\u{1F600}\\u0001\"}");
        let two = Value::from(2);
        let pretty = Options::new(true, Some(&two), None, true).unwrap();
        assert_eq!(
            dumps_with(&v, pretty),
            "{\n  \"a\": {},\n  \"b\": [\n    1,\n    {\n      \"x\": null\n    }\n  ],\n  \"c\": \"\\u00e9\\ud83d\\ude00\\u0001\"\n}"
        );
        let seps = Value::from(vec![",", ":"]);
        let compact = Options::new(false, None, Some(&seps), false).unwrap();
        assert_eq!(dumps_with(&serde_json::json!([1, {"k": true}]), compact), "[1,{\"k\":true}]");
    }
}

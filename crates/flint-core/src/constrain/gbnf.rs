//! llama.cpp's GBNF grammars converted to llguidance's Lark: rules (`name ::= ...`, `root`
//! first to run), string literals, character classes, `.`, groups, alternatives, `* + ?` and
//! `{m}`, `{m,}`, `{m,n}` repetition, `#` comments. Token references (`<[1000]>`, `<think>`) have
//! no Lark form here and are refused, as is anything else the converter does not know.

use std::fmt::Write;

/// The Lark text of a GBNF grammar, or what is wrong with it (with its line).
pub fn gbnf_to_lark(src: &str) -> Result<String, String> {
    let mut p = Parser { s: src.as_bytes(), i: 0, src, refs: Vec::new() };
    let mut rules: Vec<(String, String)> = Vec::new();
    p.skip_space(true);
    while p.i < p.s.len() {
        let name = p.name().ok_or_else(|| p.error("expected a rule name"))?;
        p.skip_space(false);
        if !p.eat("::=") {
            return Err(p.error(&format!("expected ::= after {name}")));
        }
        let body = p.alternatives(0)?;
        if rules.iter().any(|(n, _)| *n == name) {
            return Err(p.error(&format!("rule {name} is defined twice")));
        }
        rules.push((name, body));
        p.skip_space(true);
    }
    if !rules.iter().any(|(n, _)| n == "root") {
        return Err("the grammar has no root rule".into());
    }
    let mut out = String::from("start: r_root\n");
    for (name, body) in &rules {
        let _ = writeln!(out, "{}: {body}", rule_name(name));
    }
    for (name, at) in &p.refs {
        if !rules.iter().any(|(n, _)| n == name) {
            p.i = *at;
            return Err(p.error(&format!("rule {name} is used but not defined")));
        }
    }
    Ok(out)
}

/// A Lark rule name for a GBNF one: lowercase, `-` as `_`, an uppercase letter as `_` and
/// its lowercase, prefixed so no name is a Lark keyword.
fn rule_name(gbnf: &str) -> String {
    let mut out = String::from("r_");
    for c in gbnf.chars() {
        match c {
            '-' => out.push('_'),
            c if c.is_ascii_uppercase() => {
                out.push('_');
                out.push(c.to_ascii_lowercase());
            }
            c => out.push(c),
        }
    }
    out
}

struct Parser<'a> {
    s: &'a [u8],
    i: usize,
    src: &'a str,
    /// Rules referenced, with where.
    refs: Vec<(String, usize)>,
}

impl Parser<'_> {
    fn error(&self, what: &str) -> String {
        let line = self.src[..self.i.min(self.src.len())].matches('\n').count() + 1;
        format!("GBNF line {line}: {what}")
    }

    fn peek(&self) -> Option<u8> {
        self.s.get(self.i).copied()
    }

    fn eat(&mut self, t: &str) -> bool {
        if self.s[self.i..].starts_with(t.as_bytes()) {
            self.i += t.len();
            true
        } else {
            false
        }
    }

    /// Skips spaces and comments; newlines too when `newlines` (between rules, or inside
    /// a group).
    fn skip_space(&mut self, newlines: bool) {
        while let Some(c) = self.peek() {
            match c {
                b' ' | b'\t' | b'\r' => self.i += 1,
                b'\n' if newlines => self.i += 1,
                b'#' => {
                    while self.peek().is_some_and(|c| c != b'\n') {
                        self.i += 1;
                    }
                }
                _ => break,
            }
        }
    }

    fn name(&mut self) -> Option<String> {
        let start = self.i;
        while self.peek().is_some_and(|c| c.is_ascii_alphanumeric() || c == b'-' || c == b'_') {
            self.i += 1;
        }
        (self.i > start).then(|| self.src[start..self.i].to_string())
    }

    /// Whether a new rule (`name ::=`) starts at the cursor.
    fn at_rule_start(&self) -> bool {
        let mut j = self.i;
        while self.s.get(j).is_some_and(|c| c.is_ascii_alphanumeric() || *c == b'-' || *c == b'_') {
            j += 1;
        }
        if j == self.i {
            return false;
        }
        while self.s.get(j).is_some_and(|c| *c == b' ' || *c == b'\t') {
            j += 1;
        }
        self.s[j..].starts_with(b"::=")
    }

    /// `seq ('|' seq)*` until `)` (depth > 0) or the next rule / the end (depth 0).
    fn alternatives(&mut self, depth: usize) -> Result<String, String> {
        let mut alts = vec![self.sequence(depth)?];
        while self.eat("|") {
            alts.push(self.sequence(depth)?);
        }
        Ok(alts.join(" | "))
    }

    fn sequence(&mut self, depth: usize) -> Result<String, String> {
        let mut items: Vec<String> = Vec::new();
        loop {
            // A rule's body may continue on the next line; a new rule or the end stops it.
            self.skip_space(true);
            if depth == 0 && self.at_rule_start() {
                break;
            }
            let Some(c) = self.peek() else { break };
            let item = match c {
                b'|' | b')' => break,
                b'"' => self.string()?,
                b'[' => self.class()?,
                b'.' => {
                    self.i += 1;
                    "/(?s:.)/".to_string()
                }
                b'(' => {
                    self.i += 1;
                    let inner = self.alternatives(depth + 1)?;
                    self.skip_space(true);
                    if !self.eat(")") {
                        return Err(self.error("a group is not closed with )"));
                    }
                    format!("({inner})")
                }
                b'<' => return Err(self.error("token references (<...>) are not supported; write the token's text")),
                c if c.is_ascii_alphanumeric() || c == b'-' || c == b'_' => {
                    let at = self.i;
                    let name = self.name().unwrap_or_default();
                    let lark = rule_name(&name);
                    self.refs.push((name, at));
                    lark
                }
                _ => return Err(self.error(&format!("unexpected {:?}", self.src[self.i..].chars().next().unwrap_or(' ')))),
            };
            items.push(self.repetition(item)?);
        }
        Ok(if items.is_empty() { "\"\"".to_string() } else { items.join(" ") })
    }

    /// An item's `*`, `+`, `?` or `{m}`, `{m,}`, `{m,n}`.
    fn repetition(&mut self, item: String) -> Result<String, String> {
        let item = match self.peek() {
            Some(b'*' | b'+' | b'?') => {
                let op = self.peek().unwrap_or(b'*') as char;
                self.i += 1;
                format!("{item}{op}")
            }
            Some(b'{') => {
                let close = self.s[self.i..].iter().position(|&c| c == b'}').ok_or_else(|| self.error("{ is not closed"))?;
                let inner = self.src[self.i + 1..self.i + close].replace(' ', "");
                let (lo, hi) = match inner.split_once(',') {
                    None => (inner.clone(), Some(inner.clone())),
                    Some((lo, hi)) => (lo.to_string(), (!hi.is_empty()).then(|| hi.to_string())),
                };
                let num = |s: &str| s.parse::<u32>().ok().filter(|&n| n <= 10_000);
                let lo = num(&lo).ok_or_else(|| self.error("a repetition count is not a number up to 10000"))?;
                let hi = match hi {
                    Some(h) => {
                        Some(num(&h).filter(|&h| h >= lo).ok_or_else(|| self.error("a repetition's upper bound is not a number from its lower one to 10000"))?)
                    }
                    None => None,
                };
                self.i += close + 1;
                match hi {
                    Some(h) => format!("{item}{{{lo},{h}}}"),
                    None if lo == 0 => format!("{item}*"),
                    None => format!("{item}{{{lo},}}"),
                }
            }
            _ => return Ok(item),
        };
        // `x?*` and the like: wrap and go on.
        if matches!(self.peek(), Some(b'*' | b'+' | b'?' | b'{')) {
            return self.repetition(format!("({item})"));
        }
        Ok(item)
    }

    /// One escaped or plain character inside a string or class.
    fn char(&mut self, end: u8) -> Result<char, String> {
        let rest = &self.src[self.i..];
        let mut chars = rest.chars();
        let c = chars.next().ok_or_else(|| self.error(&format!("missing closing {}", end as char)))?;
        if c != '\\' {
            self.i += c.len_utf8();
            return Ok(c);
        }
        let e = chars.next().ok_or_else(|| self.error("an escape at the end"))?;
        self.i += 2;
        let hex = |p: &mut Self, n: usize| -> Result<char, String> {
            let digits = p.src.get(p.i..p.i + n).ok_or_else(|| p.error("a short escape"))?;
            let v = u32::from_str_radix(digits, 16).map_err(|_| p.error("a bad hex escape"))?;
            p.i += n;
            char::from_u32(v).ok_or_else(|| p.error("an escape that is not a character"))
        };
        Ok(match e {
            'n' => '\n',
            't' => '\t',
            'r' => '\r',
            'x' => hex(self, 2)?,
            'u' => hex(self, 4)?,
            'U' => hex(self, 8)?,
            c @ ('\\' | '"' | '[' | ']' | '-' | '^' | '/') => c,
            other => return Err(self.error(&format!("unknown escape \\{other}"))),
        })
    }

    fn string(&mut self) -> Result<String, String> {
        self.i += 1;
        let mut text = String::new();
        while self.peek() != Some(b'"') {
            if self.peek().is_none() {
                return Err(self.error("a string is not closed"));
            }
            text.push(self.char(b'"')?);
        }
        self.i += 1;
        Ok(serde_json::to_string(&text).unwrap_or_default())
    }

    fn class(&mut self) -> Result<String, String> {
        self.i += 1;
        let mut rx = String::from("[");
        if self.peek() == Some(b'^') {
            self.i += 1;
            rx.push('^');
        }
        let mut any = false;
        while self.peek() != Some(b']') {
            if self.peek().is_none() {
                return Err(self.error("a character class is not closed"));
            }
            let lo = self.char(b']')?;
            push_class_char(&mut rx, lo);
            if self.peek() == Some(b'-') && self.s.get(self.i + 1) != Some(&b']') {
                self.i += 1;
                let hi = self.char(b']')?;
                if hi < lo {
                    return Err(self.error("a range runs backwards"));
                }
                rx.push('-');
                push_class_char(&mut rx, hi);
            }
            any = true;
        }
        self.i += 1;
        if !any {
            return Err(self.error("an empty character class"));
        }
        rx.push(']');
        Ok(format!("/{rx}/"))
    }
}

/// A character inside a regex class, escaped where the class or Lark's `/.../` needs it.
fn push_class_char(rx: &mut String, c: char) {
    match c {
        '\\' | ']' | '[' | '^' | '-' | '/' | '&' | '~' => {
            rx.push('\\');
            rx.push(c);
        }
        '\n' => rx.push_str("\\n"),
        '\r' => rx.push_str("\\r"),
        '\t' => rx.push_str("\\t"),
        c if c.is_control() => {
            let _ = write!(rx, "\\x{{{:x}}}", c as u32);
        }
        c => rx.push(c),
    }
}

#[cfg(test)]
mod tests {
    use super::gbnf_to_lark;

    #[test]
    fn rules_literals_classes_and_repetition_convert() {
        let g = r#"
# a list of answers
root   ::= answer ("," ws answer)* "\n"
answer ::= "yes" | "no" | [0-9]{1,3} | name-part+
name-part ::= [^",\n\\] .?
ws ::= [ \t]*
"#;
        let lark = gbnf_to_lark(g).unwrap();
        assert_eq!(
            lark,
            "start: r_root\n\
             r_root: r_answer (\",\" r_ws r_answer)* \"\\n\"\n\
             r_answer: \"yes\" | \"no\" | /[0-9]/{1,3} | r_name_part+\n\
             r_name_part: /[^\",\\n\\\\]/ /(?s:.)/?\n\
             r_ws: /[ \\t]/*\n"
        );
    }

    #[test]
    fn bad_grammars_name_the_problem_and_line() {
        for (g, want) in [
            ("root ::= \"a", "not closed"),
            ("root ::= foo", "foo is used but not defined"),
            ("item ::= \"a\"", "no root rule"),
            ("root ::= [z-a]", "backwards"),
            ("root ::= <[1000]>", "token references"),
            ("root ::= \"a\"\nroot ::= \"b\"", "defined twice"),
            ("root ::= (\"a\"", "not closed"),
            ("root ::= \"a\"{2,1}", "upper bound"),
            ("root \"a\"", "expected ::="),
            ("root ::= []", "empty character class"),
        ] {
            let e = gbnf_to_lark(g).unwrap_err();
            assert!(e.contains(want), "{g:?}: {e}");
        }
        assert_eq!(gbnf_to_lark("root ::= \"a\"\n\nx ::= y").unwrap_err(), "GBNF line 3: rule y is used but not defined");
    }
}

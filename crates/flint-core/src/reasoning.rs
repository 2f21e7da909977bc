//! Thinking models' thoughts: a reply that starts with `<think>…</think>` (Qwen3, QwQ,
//! DeepSeek-R1 and their distills) is split into the thought (OpenAI-style APIs call it
//! `reasoning_content`) and the answer, as it streams. A constraint on the reply applies to
//! the answer: the thought before it is free text of bounded length
//! ([`crate::constrain::Grammar::AfterThought`]).

use crate::generate::longest_prefix_suffix;

pub const OPEN: &str = "<think>";
pub const CLOSE: &str = "</think>";

/// Characters a constrained reply's thought may take before the grammar closes it (about
/// 4,000 tokens of English).
pub const THOUGHT_BUDGET: usize = 16_000;

/// Where a rendered chat prompt leaves a thinking model's reply.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ThoughtStart {
    /// The reply may open a thought (Qwen3 with thinking on).
    Before,
    /// The prompt opened the thought (QwQ, DeepSeek-R1): the reply starts inside it.
    Inside,
}

/// Whether `template` writes thoughts, and if so where `prompt` (rendered by it) leaves the
/// reply; None: no thought to come (a template without them, or a prompt that closed an empty
/// one, as Qwen3's does for `enable_thinking: false`).
pub fn thought_start(template: &str, prompt: &str) -> Option<ThoughtStart> {
    if !(template.contains(OPEN) && template.contains(CLOSE)) {
        return None;
    }
    let tail = prompt.trim_end();
    if tail.ends_with(OPEN) {
        Some(ThoughtStart::Inside)
    } else if tail.ends_with(CLOSE) {
        None
    } else {
        Some(ThoughtStart::Before)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    /// Nothing but whitespace yet: a thought may open.
    Before,
    /// In the thought; `started`: some of it was given out (leading whitespace is dropped).
    Inside { started: bool },
    /// The answer; `trim`: the thought just closed and whitespace after it is dropped.
    After { trim: bool },
}

/// The thought and the answer of one reply, each piece of text given out once it is known
/// which it belongs to (a tail that may begin `</think>` is held).
#[derive(Clone, Debug)]
pub struct ThoughtStream {
    state: State,
    held: String,
}

/// What a piece of the reply gave out.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Split {
    pub reasoning: String,
    pub content: String,
}

impl ThoughtStream {
    pub fn new(start: ThoughtStart) -> ThoughtStream {
        let state = match start {
            ThoughtStart::Before => State::Before,
            ThoughtStart::Inside => State::Inside { started: false },
        };
        ThoughtStream { state, held: String::new() }
    }

    pub fn push(&mut self, text: &str) -> Split {
        let mut out = Split::default();
        self.held.push_str(text);
        loop {
            match self.state {
                State::Before => {
                    let t = self.held.trim_start();
                    if let Some(rest) = t.strip_prefix(OPEN) {
                        self.held = rest.to_string();
                        self.state = State::Inside { started: false };
                    } else if OPEN.starts_with(t) {
                        return out;
                    } else {
                        self.state = State::After { trim: false };
                    }
                }
                State::Inside { started } => {
                    if !started {
                        let t = self.held.trim_start().len();
                        self.held.drain(..self.held.len() - t);
                    }
                    if let Some(at) = self.held.find(CLOSE) {
                        out.reasoning.push_str(self.held[..at].trim_end());
                        self.held.drain(..at + CLOSE.len());
                        self.state = State::After { trim: true };
                        continue;
                    }
                    // Held: what may begin `</think>`, and trailing whitespace (dropped if
                    // the thought ends there).
                    let marker = longest_prefix_suffix(&self.held, CLOSE);
                    let give = self.held[..self.held.len() - marker].trim_end().len();
                    out.reasoning.extend(self.held.drain(..give));
                    self.state = State::Inside { started: started || give > 0 };
                    return out;
                }
                State::After { trim } => {
                    if trim {
                        let t = self.held.trim_start().len();
                        self.held.drain(..self.held.len() - t);
                        if self.held.is_empty() {
                            return out;
                        }
                        self.state = State::After { trim: false };
                    }
                    out.content.push_str(&std::mem::take(&mut self.held));
                    return out;
                }
            }
        }
    }

    /// The end of the reply: what was held goes where it was (an unclosed thought stays
    /// thought).
    pub fn finish(&mut self) -> Split {
        let held = std::mem::take(&mut self.held);
        match self.state {
            State::Before | State::After { .. } => Split { reasoning: String::new(), content: held },
            State::Inside { .. } => Split { reasoning: held.trim_end().to_string(), content: String::new() },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split(start: ThoughtStart, text: &str) -> Split {
        let mut s = ThoughtStream::new(start);
        let mut all = Split::default();
        for c in text.chars() {
            let o = s.push(&c.to_string());
            all.reasoning += &o.reasoning;
            all.content += &o.content;
        }
        let o = s.finish();
        all.reasoning += &o.reasoning;
        all.content += &o.content;
        all
    }

    fn both(r: &str, c: &str) -> Split {
        Split { reasoning: r.into(), content: c.into() }
    }

    #[test]
    fn thoughts_split_from_the_answer_as_they_stream() {
        // Qwen3's reply with thinking on.
        assert_eq!(split(ThoughtStart::Before, "<think>\nThe user greets me.\n</think>\n\nHello!"), both("The user greets me.", "Hello!"));
        // QwQ / R1: the prompt opened the thought.
        assert_eq!(split(ThoughtStart::Inside, "Two plus two.\n</think>\n\n4"), both("Two plus two.", "4"));
        // No thought at all, or text that only starts like one.
        assert_eq!(split(ThoughtStart::Before, "Hello <think>"), both("", "Hello <think>"));
        assert_eq!(split(ThoughtStart::Before, "<thin"), both("", "<thin"));
        // `</` inside the thought that is not its end stays thought; an unclosed thought
        // (the length limit) is all thought.
        assert_eq!(split(ThoughtStart::Before, "<think>a </b> c</think>d"), both("a </b> c", "d"));
        assert_eq!(split(ThoughtStart::Inside, "still thinking </thi"), both("still thinking </thi", ""));
        // Whitespace inside the thought is kept; around it, dropped.
        assert_eq!(split(ThoughtStart::Inside, "\n a \n b \n</think>\n c "), both("a \n b", "c "));
    }

    #[test]
    fn where_the_prompt_leaves_the_reply() {
        let qwen3 = "{{- '<think>\\n\\n</think>\\n\\n' }}";
        assert_eq!(thought_start(qwen3, "<|im_start|>assistant\n"), Some(ThoughtStart::Before));
        assert_eq!(thought_start(qwen3, "<|im_start|>assistant\n<think>\n\n</think>\n\n"), None);
        assert_eq!(thought_start(qwen3, "<｜Assistant｜><think>\n"), Some(ThoughtStart::Inside));
        assert_eq!(thought_start("{{ messages }}", "<think>\n"), None, "a template without thoughts");
    }
}

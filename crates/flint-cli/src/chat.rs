//! `flint chat`: an interactive conversation through the model's chat template, read line by
//! line from stdin (a terminal or a pipe), with slash commands and Ctrl-C to cut a reply short.

use std::io::{BufRead, IsTerminal, Write};
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};

use clap::Args;
use flint::{Canceller, Engine, EngineError, Event, FinishReason, GenerateParams, Request, Summary};
use futures::StreamExt;

use crate::args::{max_tokens_from, seed_from, GrammarArgs, ModelArgs, SamplingArgs};
use crate::run::{chat_input, Opened, EXIT_INTERRUPTED};
use crate::Failure;

#[derive(Args)]
pub struct ChatArgs {
    #[command(flatten)]
    model: ModelArgs,
    #[command(flatten)]
    sampling: SamplingArgs,
    #[command(flatten)]
    grammar: GrammarArgs,
}

const PROMPT: &str = ">>> ";
const CONTINUATION: &str = "... ";
/// Opens and closes a multi-line message.
const FENCE: &str = "\"\"\"";
const DIM: &str = "\x1b[2m";
const RESET: &str = "\x1b[0m";

const HELP: &str = "\
Commands:
  /set                 show the sampling settings
  /set KEY VALUE       change one: temp, top_k, top_p, min_p, repeat_penalty, repeat_last_n,
                       presence_penalty, frequency_penalty, seed (-1 = random),
                       max_tokens or num_predict (-1 = no limit)
  /system TEXT         set the system message (/system alone removes it)
  /clear               forget the conversation and the KV cache
  /stats               token counts and speed of the last reply
  /bye                 exit (also /exit, Ctrl-D)
  /help                this text
Start and end a multi-line message with \"\"\". Ctrl-C stops a reply.";

/// What the program is doing when Ctrl-C arrives.
const LOADING: u8 = 0;
const AT_PROMPT: u8 = 1;
const GENERATING: u8 = 2;

struct Interrupt {
    state: AtomicU8,
    /// Cancels the reply being generated.
    reply: Mutex<Option<Canceller>>,
    /// Ctrl-C came while a reply streamed (twice ends the program).
    aborted: AtomicBool,
    /// Ctrl-C at the prompt: a multi-line message being typed is dropped.
    at_prompt: AtomicBool,
    interactive: bool,
}

impl Interrupt {
    /// Ctrl-C while loading exits; while a reply streams it ends the reply (twice: the
    /// program); at the prompt it prints how to leave.
    fn on_ctrl_c(&self) {
        match self.state.load(Ordering::SeqCst) {
            GENERATING => {
                if self.aborted.swap(true, Ordering::SeqCst) {
                    std::process::exit(EXIT_INTERRUPTED);
                }
                if let Some(c) = self.reply.lock().ok().and_then(|g| g.clone()) {
                    c.cancel();
                }
            }
            AT_PROMPT => {
                self.at_prompt.store(true, Ordering::SeqCst);
                eprintln!("\nUse /bye or Ctrl-D to exit");
                if self.interactive {
                    print!("{PROMPT}");
                    let _ = std::io::stdout().flush();
                }
            }
            _ => std::process::exit(EXIT_INTERRUPTED),
        }
    }
}

enum Input {
    Message(String),
    Command(String),
    Eof,
}

struct Session {
    engine: Engine,
    params: GenerateParams,
    /// The grammar every reply is held to (`--json-schema`, `--grammar`, ...).
    constraint: Option<flint::Constrained>,
    system: Option<String>,
    /// User and assistant turns (role, content), oldest first.
    history: Vec<(String, String)>,
    last: Option<Summary>,
    ctl: Arc<Interrupt>,
    dim: bool,
}

pub fn chat(args: ChatArgs) -> Result<(), Failure> {
    let params = args.sampling.params(0)?;
    let constraint = args.grammar.constraint()?;
    let opened = Opened::open(&args.model)?;
    if !opened.has_template() {
        return Err(Failure::usage(format!(
            "{} has no chat template, and flint chat needs one: use `flint run` to complete text as is, or pass --chat-template-file FILE",
            opened.path().display()
        )));
    }
    let interactive = std::io::stdin().is_terminal();
    let ctl = Arc::new(Interrupt {
        state: AtomicU8::new(LOADING),
        reply: Mutex::new(None),
        aborted: AtomicBool::new(false),
        at_prompt: AtomicBool::new(false),
        interactive,
    });
    let handler = ctl.clone();
    if let Err(e) = ctrlc::set_handler(move || handler.on_ctrl_c()) {
        eprintln!("warning: Ctrl-C will end the program, not just the reply: {e}");
    }
    let name = opened.path().file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let engine = opened.load(&args.model)?;
    if let Some(c) = &constraint {
        engine.check_constraint(c).map_err(|e| Failure::usage(e.to_string()))?;
    }
    if interactive {
        eprintln!("{name} on {}, context {} tokens. /help for commands, /bye or Ctrl-D to exit.", engine.adapter_name(), engine.n_ctx());
    }
    let mut session =
        Session { engine, params, constraint, system: args.model.system.clone(), history: Vec::new(), last: None, ctl, dim: std::io::stderr().is_terminal() };
    session.repl()
}

impl Session {
    fn repl(&mut self) -> Result<(), Failure> {
        let mut stdin = std::io::stdin().lock();
        loop {
            self.ctl.state.store(AT_PROMPT, Ordering::SeqCst);
            let input = self.read_input(&mut stdin).map_err(|e| Failure::runtime(format!("stdin: {e}")))?;
            match input {
                Input::Eof => {
                    if self.ctl.interactive {
                        println!();
                    }
                    return Ok(());
                }
                Input::Command(line) => {
                    if !self.command(&line) {
                        return Ok(());
                    }
                }
                Input::Message(text) if text.trim().is_empty() => {}
                Input::Message(text) => self.reply(text)?,
            }
        }
    }

    fn prompt(&self, text: &str) {
        if self.ctl.interactive {
            print!("{text}");
            let _ = std::io::stdout().flush();
        }
    }

    /// One message: a line, a `/command`, or lines between `"""` fences.
    fn read_input(&self, stdin: &mut impl BufRead) -> std::io::Result<Input> {
        let mut fenced: Option<Vec<String>> = None;
        self.ctl.at_prompt.store(false, Ordering::SeqCst);
        loop {
            self.prompt(if fenced.is_some() { CONTINUATION } else { PROMPT });
            let mut raw = Vec::new();
            if stdin.read_until(b'\n', &mut raw)? == 0 {
                return Ok(match fenced {
                    Some(lines) if !lines.is_empty() => Input::Message(lines.join("\n")),
                    _ => Input::Eof,
                });
            }
            if self.ctl.at_prompt.swap(false, Ordering::SeqCst) {
                fenced = None;
            }
            let line = String::from_utf8_lossy(&raw);
            let line = line.trim_end_matches(['\n', '\r']);
            match &mut fenced {
                None => {
                    if let Some(rest) = line.trim_start().strip_prefix(FENCE) {
                        if let Some(body) = rest.strip_suffix(FENCE) {
                            return Ok(Input::Message(body.to_string()));
                        }
                        fenced = Some(if rest.is_empty() { Vec::new() } else { vec![rest.to_string()] });
                    } else if line.trim_start().starts_with('/') {
                        return Ok(Input::Command(line.trim().to_string()));
                    } else {
                        return Ok(Input::Message(line.to_string()));
                    }
                }
                Some(lines) => match line.strip_suffix(FENCE) {
                    Some(body) => {
                        if !body.is_empty() {
                            lines.push(body.to_string());
                        }
                        return Ok(Input::Message(lines.join("\n")));
                    }
                    None => lines.push(line.to_string()),
                },
            }
        }
    }

    /// Runs a slash command; false means leave.
    fn command(&mut self, line: &str) -> bool {
        let (name, rest) = line.split_once(char::is_whitespace).unwrap_or((line, ""));
        let rest = rest.trim();
        match name {
            "/bye" | "/exit" | "/quit" => return false,
            "/help" | "/?" => println!("{HELP}"),
            "/clear" => {
                self.history.clear();
                self.last = None;
                self.engine.clear_cache();
                println!("Cleared the conversation.");
            }
            "/system" if rest.is_empty() => {
                self.system = None;
                println!("Removed the system message.");
            }
            "/system" => {
                self.system = Some(rest.to_string());
                println!("Set the system message.");
            }
            "/stats" => self.stats(),
            "/set" if rest.is_empty() => self.show_settings(),
            "/set" => match self.set(rest) {
                Ok(msg) => println!("{msg}"),
                Err(e) => eprintln!("error: {e}"),
            },
            _ => eprintln!("error: unknown command {name} (/help lists them; wrap text starting with / in \"\"\")"),
        }
        let _ = std::io::stdout().flush();
        true
    }

    fn stats(&self) {
        let Some(s) = &self.last else {
            println!("No reply yet.");
            return;
        };
        println!("prompt tokens: {}", s.prompt_tokens);
        println!("cached prompt tokens: {}", s.cached_prompt_tokens);
        println!("completion tokens: {}", s.completion_tokens);
        println!("finish reason: {}", s.finish_reason.as_str());
        println!("ttft: {:.0} ms", s.ttft_ms);
        println!("prefill: {:.1} tok/s", s.prefill_tok_s);
        println!("decode: {:.1} tok/s", s.decode_tok_s);
        println!("context: {} of {} tokens", s.prompt_tokens + s.completion_tokens, self.engine.n_ctx());
    }

    fn show_settings(&self) {
        let p = &self.params.sampling;
        let seed = p.seed.map_or("-1 (random)".to_string(), |s| s.to_string());
        let max = self.params.max_tokens.map_or("-1 (no limit)".to_string(), |n| n.to_string());
        println!(
            "temp {} | top_k {} | top_p {} | min_p {} | repeat_penalty {} | repeat_last_n {} | presence_penalty {} | frequency_penalty {} | seed {seed} | max_tokens {max}",
            p.temperature, p.top_k, p.top_p, p.min_p, p.repeat_penalty, p.repeat_last_n, p.presence_penalty, p.frequency_penalty
        );
    }

    /// `/set KEY VALUE`: the new value is checked with the others before it replaces the old.
    fn set(&mut self, args: &str) -> Result<String, String> {
        let (key, value) = args.split_once(char::is_whitespace).ok_or("usage: /set KEY VALUE (/help lists the keys)")?;
        let (key, value) = (key.replace('-', "_"), value.trim());
        let float = || value.parse::<f32>().map_err(|_| format!("{key} takes a number, got {value:?}"));
        let int = || value.parse::<i64>().map_err(|_| format!("{key} takes a whole number, got {value:?}"));
        let int32 = || int().and_then(|n| i32::try_from(n).map_err(|_| format!("{key} is out of range: {n}")));
        let mut next = self.params.clone();
        let s = &mut next.sampling;
        match key.as_str() {
            "temp" | "temperature" => s.temperature = float()?,
            "top_k" => s.top_k = int32()?,
            "top_p" => s.top_p = float()?,
            "min_p" => s.min_p = float()?,
            "repeat_penalty" => s.repeat_penalty = float()?,
            "repeat_last_n" => s.repeat_last_n = int32()?,
            "presence_penalty" => s.presence_penalty = float()?,
            "frequency_penalty" => s.frequency_penalty = float()?,
            "seed" => s.seed = seed_from(int()?)?,
            "max_tokens" | "num_predict" => next.max_tokens = max_tokens_from(int()?)?,
            _ => return Err(format!("unknown setting {key:?} (/help lists them)")),
        }
        next.validate().map_err(|e| e.to_string())?;
        self.params = next;
        Ok(format!("Set {key} to {value}."))
    }

    fn messages(&self) -> Vec<(String, String)> {
        let system = self.system.iter().map(|s| ("system".to_string(), s.clone()));
        system.chain(self.history.iter().cloned()).collect()
    }

    /// Renders the whole conversation plus `text` and streams the reply; the engine reuses
    /// the KV blocks of the prefix it has cached.
    fn reply(&mut self, text: String) -> Result<(), Failure> {
        self.history.push(("user".to_string(), text));
        let mut request = Request::new(chat_input(&self.messages()), self.params.clone());
        request.constraint = self.constraint.clone();
        let mut stream = match self.engine.submit(request) {
            Ok(s) => s,
            Err(e) => {
                self.history.pop();
                eprintln!("error: {e}");
                return Ok(());
            }
        };
        self.ctl.aborted.store(false, Ordering::SeqCst);
        if let Ok(mut g) = self.ctl.reply.lock() {
            *g = Some(stream.canceller());
        }
        self.ctl.state.store(GENERATING, Ordering::SeqCst);
        let outcome = futures::executor::block_on(async {
            let mut out = std::io::stdout().lock();
            let mut reply = String::new();
            while let Some(event) = stream.next().await {
                let (piece, summary) = match event {
                    Ok(Event::Token { text, .. }) => (text, None),
                    Ok(Event::Done { summary, text, .. }) => (text, Some(summary)),
                    Err(e) => return Ok(Err(e)),
                };
                reply.push_str(&piece);
                write!(out, "{piece}").and_then(|_| out.flush()).map_err(|e| Failure::runtime(format!("stdout: {e}")))?;
                crate::progress::wrote_text(&piece);
                if let Some(summary) = summary {
                    if !reply.ends_with('\n') {
                        let _ = writeln!(out);
                    }
                    crate::progress::wrote_text("\n");
                    return Ok(Ok((reply, summary)));
                }
            }
            Err(Failure::runtime("the reply ended without a summary"))
        });
        self.ctl.state.store(AT_PROMPT, Ordering::SeqCst);
        if let Ok(mut g) = self.ctl.reply.lock() {
            *g = None;
        }
        let (reply, summary) = match outcome? {
            Ok(done) => done,
            Err(e) => return self.failed(e),
        };
        self.timings(&summary);
        if reply.is_empty() && summary.finish_reason == FinishReason::Abort {
            self.history.pop();
        } else {
            self.history.push(("assistant".to_string(), reply));
        }
        self.last = Some(summary);
        Ok(())
    }

    /// A reply that failed mid-stream: the turn is dropped; a lost device ends the program.
    fn failed(&mut self, e: EngineError) -> Result<(), Failure> {
        self.history.pop();
        if matches!(e.backend(), Some(flint::BackendError::DeviceLost { .. })) {
            return Err(Failure::runtime(e));
        }
        eprintln!("error: {e} (/clear starts a new conversation)");
        Ok(())
    }

    /// One dim line after each reply: `[12 tok, 5.1 tok/s, ttft 300 ms, 40 cached]`.
    fn timings(&self, s: &Summary) {
        let end = match s.finish_reason {
            FinishReason::Stop => "",
            FinishReason::Length => ", length limit",
            FinishReason::Abort => ", interrupted",
            FinishReason::ToolCalls => ", tool calls",
        };
        let line = format!("[{} tok, {:.1} tok/s, ttft {:.0} ms, {} cached{end}]", s.completion_tokens, s.decode_tok_s, s.ttft_ms, s.cached_prompt_tokens);
        if self.dim {
            eprintln!("{DIM}{line}{RESET}");
        } else {
            eprintln!("{line}");
        }
    }
}

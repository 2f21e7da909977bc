//! `flint run`: complete one prompt and stream the tokens (text or jsonl), through the model's
//! chat template unless `--raw`. Also the flags and loading code `flint chat` shares.
//! The engine renders, tokenizes and validates; this only builds the request and prints.

use std::io::{Read, Write};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use clap::{Args, ValueEnum};
use flint::{Engine, Event, GgufFile, Input, LoadOptions, Request, KEY_CHAT_TEMPLATE};

use crate::args::{GrammarArgs, ModelArgs, SamplingArgs};
use futures::StreamExt;
use serde_json::json;

use crate::Failure;

/// Exit status after a Ctrl-C that ends the program (128 + SIGINT), as shells report it.
pub const EXIT_INTERRUPTED: i32 = 130;

#[derive(Clone, Copy, ValueEnum)]
pub enum Format {
    Text,
    Jsonl,
}

#[derive(Args)]
pub struct RunArgs {
    #[command(flatten)]
    model: ModelArgs,
    #[command(flatten)]
    sampling: SamplingArgs,
    #[command(flatten)]
    grammar: GrammarArgs,
    /// The prompt (or use -f).
    prompt: Option<String>,
    /// Read the prompt from a file, byte for byte (`-` for stdin).
    #[arg(short = 'f', long = "file", conflicts_with = "prompt")]
    file: Option<String>,
    /// Tokenize the prompt as is (BOS per the model's metadata), no chat template.
    #[arg(long, conflicts_with_all = ["system", "chat_template_file"])]
    raw: bool,
    /// jsonl: add the chosen token's log-probability and the N most likely tokens (≤ 20).
    #[arg(long = "logprobs", value_name = "N", default_value_t = 0)]
    logprobs: usize,
    #[arg(long, value_enum, default_value_t = Format::Text)]
    format: Format,
}

/// An opened model file (metadata parsed, weights not yet loaded) and the template source
/// from `--chat-template-file`.
pub struct Opened {
    path: PathBuf,
    file: GgufFile,
    template_file: Option<String>,
}

impl Opened {
    /// Reads `--chat-template-file` and parses the model's header: cheap, before any weight is touched.
    pub fn open(args: &ModelArgs) -> Result<Opened, Failure> {
        let template_file = match &args.chat_template_file {
            Some(f) => Some(std::fs::read_to_string(f).map_err(|e| Failure::usage(format!("{}: {e}", f.display())))?),
            None => None,
        };
        let path = crate::resolve(&args.model)?;
        let file = GgufFile::open(&path).map_err(|e| Failure::usage(format!("{}: {e}", path.display())))?;
        Ok(Opened { path, file, template_file })
    }

    /// Whether a chat template is at hand (the model's or `--chat-template-file`).
    pub fn has_template(&self) -> bool {
        self.template_file.is_some() || self.file.metadata.get(KEY_CHAT_TEMPLATE).is_some()
    }

    pub fn path(&self) -> &std::path::Path {
        &self.path
    }

    /// Loads the weights onto the backend (on the engine's thread), with the chat template
    /// of `--chat-template-file` when given.
    pub fn load(self, args: &ModelArgs) -> Result<Engine, Failure> {
        let Opened { path, file, template_file } = self;
        drop(file);
        let opts = LoadOptions {
            n_ctx: args.ctx_size,
            kv_budget_mb: args.kv_budget_mb,
            chat_template: template_file,
            self_test: args.self_test,
            ..crate::args::load_options(args.backend, &args.device, Some(&args.spec))?
        };
        let engine = Engine::load_path(&path, &opts).map_err(|e| match e {
            flint::EngineError::SelfTest { .. } => Failure::runtime(format!("{e} (choose another adapter with --device, or run on --backend cpu)")),
            e => {
                let hint = match (&e, e.backend()) {
                    (flint::EngineError::Chat(_), _) => " (pass --chat-template-file FILE, or --raw)",
                    (_, Some(flint::BackendError::OutOfMemory { .. })) => " (a smaller -c/--ctx-size or --kv-budget-mb needs less)",
                    _ => "",
                };
                Failure::usage(format!("{}: {e}{hint}", path.display()))
            }
        })?;
        match &engine.info().self_test {
            Some(report) => eprintln!("{}", report.summary()),
            None if args.self_test => eprintln!("self-test skipped: the cpu backend is the reference it compares with"),
            None => {}
        }
        Ok(engine)
    }
}

/// `messages` (role, content pairs) as the engine's chat input.
pub fn chat_input(messages: &[(String, String)]) -> Input {
    Input::Chat(messages.iter().map(|(role, content)| json!({"role": role, "content": content})).collect())
}

fn read_prompt(args: &RunArgs) -> Result<String, Failure> {
    match (&args.prompt, &args.file) {
        (Some(p), None) => Ok(p.clone()),
        (None, Some(f)) if f == "-" => {
            let mut s = String::new();
            std::io::stdin().read_to_string(&mut s).map_err(|e| Failure::usage(format!("stdin: {e}")))?;
            Ok(s)
        }
        (None, Some(f)) => std::fs::read_to_string(f).map_err(|e| Failure::usage(format!("{f}: {e}"))),
        _ => Err(Failure::usage("give a prompt or -f FILE")),
    }
}

/// The first Ctrl-C ends the reply (the summary still prints); a second one, or one before
/// generation starts, ends the program.
fn install_abort_handler(canceller: flint::Canceller, generating: Arc<AtomicBool>) {
    let aborted = AtomicBool::new(false);
    let handler = move || {
        if !generating.load(Ordering::SeqCst) || aborted.swap(true, Ordering::SeqCst) {
            std::process::exit(EXIT_INTERRUPTED);
        }
        canceller.cancel();
    };
    if let Err(e) = ctrlc::set_handler(handler) {
        eprintln!("warning: Ctrl-C will not stop the reply cleanly: {e}");
    }
}

pub fn run(args: RunArgs) -> Result<(), Failure> {
    let params = args.sampling.params(args.logprobs)?;
    let constraint = args.grammar.constraint()?;
    if args.logprobs > 0 && matches!(args.format, Format::Text) {
        return Err(Failure::usage("--logprobs needs --format jsonl"));
    }
    let prompt = read_prompt(&args)?;
    let opened = Opened::open(&args.model)?;
    let chat = !args.raw && opened.has_template();
    if args.model.system.is_some() && !chat {
        return Err(Failure::usage(format!("{} has no chat template, so --system cannot apply (pass --chat-template-file FILE)", opened.path().display())));
    }
    let path = opened.path().to_path_buf();
    let engine = opened.load(&args.model)?;
    let input = if chat {
        let mut messages: Vec<(String, String)> = args.model.system.iter().map(|s| ("system".to_string(), s.clone())).collect();
        messages.push(("user".to_string(), prompt));
        chat_input(&messages)
    } else {
        Input::Text(prompt)
    };
    let mut request = Request::new(input, params);
    request.constraint = constraint;
    let mut stream = engine.submit(request).map_err(|e| match e {
        flint::EngineError::Constraint { .. } => Failure::usage(e.to_string()),
        e => Failure::usage(format!("{}: {e}", path.display())),
    })?;
    let generating = Arc::new(AtomicBool::new(false));
    install_abort_handler(stream.canceller(), generating.clone());
    let format = args.format;
    let tok = engine.shared_tokenizer();
    futures::executor::block_on(async move {
        generating.store(true, Ordering::SeqCst);
        let mut out = std::io::stdout().lock();
        while let Some(event) = stream.next().await {
            let event = event.map_err(Failure::runtime)?;
            match (format, event) {
                (Format::Text, Event::Token { text, .. }) => {
                    let r = write!(out, "{text}").and_then(|_| out.flush());
                    crate::progress::wrote_text(&text);
                    r
                }
                (Format::Jsonl, Event::Token { id, text, logprobs, .. }) => {
                    let mut line = json!({"token": id, "text": text});
                    if let Some(lp) = logprobs {
                        line["logprob"] = json!(lp.logprob);
                        line["top_logprobs"] = lp
                            .top
                            .iter()
                            .map(|&(id, logprob)| json!({"token": id, "text": tok.decode(&[id], false).unwrap_or_default(), "logprob": logprob}))
                            .collect();
                    }
                    writeln!(out, "{line}")
                }
                (Format::Text, Event::Done { summary: s, text, .. }) => {
                    let r = writeln!(out, "{text}").and_then(|_| out.flush());
                    crate::progress::wrote_text("\n");
                    eprintln!(
                        "\n[{}] prompt {} tok ({} cached), {:.1} tok/s | generated {} tok, {:.1} tok/s | ttft {:.0} ms",
                        s.finish_reason.as_str(),
                        s.prompt_tokens,
                        s.cached_prompt_tokens,
                        s.prefill_tok_s,
                        s.completion_tokens,
                        s.decode_tok_s,
                        s.ttft_ms
                    );
                    if s.draft_tokens > 0 {
                        eprintln!(
                            "[speculative] drafted {} tok, accepted {} ({:.0}%)",
                            s.draft_tokens,
                            s.accepted_draft_tokens,
                            100.0 * s.accepted_draft_tokens as f64 / s.draft_tokens as f64
                        );
                    }
                    r
                }
                (Format::Jsonl, Event::Done { summary: s, text, .. }) => {
                    if !text.is_empty() {
                        let _ = writeln!(out, "{}", json!({"text": text}));
                    }
                    writeln!(
                        out,
                        "{}",
                        json!({
                            "done": true,
                            "finish_reason": s.finish_reason.as_str(),
                            "prompt_tokens": s.prompt_tokens,
                            "cached_prompt_tokens": s.cached_prompt_tokens,
                            "completion_tokens": s.completion_tokens,
                            "ttft_ms": round1(s.ttft_ms),
                            "prefill_tok_s": round1(s.prefill_tok_s),
                            "decode_tok_s": round1(s.decode_tok_s),
                            "draft_tokens": s.draft_tokens,
                            "accepted_draft_tokens": s.accepted_draft_tokens,
                        })
                    )
                }
            }
            .and_then(|_| out.flush())
            .map_err(|e| Failure::runtime(format!("stdout: {e}")))?;
        }
        Ok(())
    })
}

pub fn round1(v: f64) -> f64 {
    (v * 10.0).round() / 10.0
}

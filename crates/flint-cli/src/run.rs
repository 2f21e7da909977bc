//! `flint run`: complete one prompt and stream the tokens (text or jsonl), through the model's
//! chat template unless `--raw`. Also the flags and loading code `flint chat` shares.
//! The engine renders, tokenizes and validates; this only builds the request and prints.

use std::io::{Read, Write};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use clap::{Args, ValueEnum};
use flint::{Engine, Event, GenerateParams, GgufFile, Input, LoadOptions, Request, SamplingError, SamplingParams, KEY_CHAT_TEMPLATE};
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

#[derive(Clone, Copy, ValueEnum)]
pub enum BackendArg {
    /// WGSL kernels on the best GPU adapter (FLINT_ADAPTER=<name substring> picks one).
    Gpu,
    /// The CPU reference forward pass.
    Cpu,
}

impl BackendArg {
    pub fn kind(self) -> flint::BackendKind {
        match self {
            BackendArg::Gpu => flint::BackendKind::Gpu,
            BackendArg::Cpu => flint::BackendKind::Cpu,
        }
    }
}

/// The model, backend and chat-template flags `run` and `chat` share.
#[derive(Args)]
pub struct ModelArgs {
    /// Model: a path, a catalog name (gemma-3-270m, qwen2.5-coder-0.5b) or a URL.
    #[arg(short = 'm', long = "model")]
    pub model: String,
    /// Context size in tokens; 0 = the model's training context.
    #[arg(short = 'c', long = "ctx-size", default_value_t = flint::DEFAULT_CTX)]
    pub ctx_size: usize,
    #[arg(long, value_enum, default_value_t = BackendArg::Gpu)]
    pub backend: BackendArg,
    /// GPU memory for the KV cache in MB: the context plus earlier requests' blocks for prefix
    /// reuse (least recently used evicted first); never less than the context needs.
    #[arg(long = "kv-budget-mb", value_name = "MB")]
    pub kv_budget_mb: Option<u64>,
    /// A system message (needs a chat template).
    #[arg(long)]
    pub system: Option<String>,
    /// A Jinja chat template to use instead of the model's own.
    #[arg(long = "chat-template-file", value_name = "FILE")]
    pub chat_template_file: Option<PathBuf>,
    /// Checks the GPU at load: a short fixed input through the first layer and the head on the
    /// GPU and on the CPU reference, compared tap by tap; a driver that computes wrongly fails
    /// the load (exit 1).
    #[arg(long = "self-test")]
    pub self_test: bool,
    #[command(flatten)]
    pub device: DeviceArgs,
    #[command(flatten)]
    pub spec: SpecArgs,
}

/// Which GPU adapters run the model, and how it is split over several (`run`, `chat`,
/// `serve`, `bench`).
#[derive(Args, Clone)]
pub struct DeviceArgs {
    /// GPU adapters: each an index or a case-insensitive substring of a name, as `flint
    /// devices` lists them (llama.cpp's -dev). Several (`0,1`; one adapter may be named twice,
    /// opening two devices of it) split the model's layers over them. Default: FLINT_ADAPTER,
    /// else the best adapter.
    #[arg(long = "device", value_name = "DEV[,DEV...]")]
    pub device: Option<String>,
    /// With several devices: `layer` splits the layers over them (one range each; the
    /// embedding on the first, the head and sampler on the last); `none` runs the model on the
    /// first alone (also -sm).
    #[arg(long = "split-mode", value_name = "MODE", value_parser = ["layer", "none"])]
    pub split_mode: Option<String>,
    /// Layer proportions per device, as `3,1` (also -ts). Default: equal, or by --device-mem-mb.
    #[arg(long = "tensor-split", value_name = "P,P,...", value_delimiter = ',')]
    pub tensor_split: Option<Vec<f32>>,
    /// Each device's memory budget in MB, as `4096,8192` (wgpu reports no memory size): the
    /// model goes on the first device when it fits, else its layers are spread over the
    /// devices; one too large for all of them together is refused, saying what it needs.
    #[arg(long = "device-mem-mb", value_name = "MB,MB,...", value_delimiter = ',')]
    pub device_mem_mb: Option<Vec<u64>>,
}

impl DeviceArgs {
    /// The adapters asked for (comma-separated, as `LoadOptions::device` takes them).
    pub fn device(&self) -> Result<Option<String>, Failure> {
        let Some(d) = &self.device else { return Ok(None) };
        if self.names().iter().any(|x| x.is_empty()) {
            return Err(Failure::usage(format!("--device {d:?}: an empty device name")));
        }
        Ok(Some(self.names().join(",")))
    }

    fn names(&self) -> Vec<&str> {
        self.device.as_deref().map_or_else(Vec::new, |d| d.split(',').map(str::trim).collect())
    }

    /// The split flags, checked against the devices named.
    pub fn split(&self) -> Result<flint::SplitOptions, Failure> {
        let n = self.names().len().max(1);
        if let Some(ts) = &self.tensor_split {
            if n < 2 {
                return Err(Failure::usage("--tensor-split needs several devices (--device A,B)"));
            }
            if ts.len() != n || ts.iter().any(|p| !p.is_finite() || *p < 0.0) || ts.iter().sum::<f32>() <= 0.0 {
                return Err(Failure::usage(format!("--tensor-split needs {n} non-negative proportions, one per device, not all zero")));
            }
        }
        if let Some(mb) = &self.device_mem_mb {
            if mb.len() != n {
                return Err(Failure::usage(format!("--device-mem-mb needs {n} budgets, one per device ({} given)", mb.len())));
            }
        }
        Ok(flint::SplitOptions {
            none: self.split_mode.as_deref() == Some("none"),
            tensor_split: self.tensor_split.clone(),
            device_mem_mb: self.device_mem_mb.clone(),
        })
    }
}

/// Speculative decoding flags, with llama.cpp's names.
#[derive(Args, Clone)]
pub struct SpecArgs {
    /// Speculative decoding: `ngram` drafts the continuation of the longest recent repeat of
    /// the last tokens (prompt lookup) and the model verifies the draft in one step. The
    /// output is exactly that of decoding without it, greedy or seeded; only the speed changes.
    #[arg(long = "spec-type", value_name = "TYPE", default_value = "none", value_parser = ["none", "ngram"])]
    pub spec_type: String,
    /// The most tokens drafted per step.
    #[arg(long = "draft-max", visible_alias = "draft", value_name = "N", default_value_t = flint::DRAFT_MAX)]
    pub draft_max: usize,
    /// Drafts shorter than this are not verified.
    #[arg(long = "draft-min", value_name = "N", default_value_t = 0)]
    pub draft_min: usize,
    /// A draft model (a path, a catalog name or a URL; also -md) with this model's vocabulary:
    /// it drafts greedily for every request, on the same device. Same output, other speed.
    #[arg(long = "model-draft", value_name = "MODEL")]
    pub model_draft: Option<String>,
    /// A draft model stops drafting where its top token's probability falls below this.
    #[arg(long = "draft-p-min", value_name = "P", default_value_t = flint::DRAFT_P_MIN)]
    pub draft_p_min: f32,
}

impl SpecArgs {
    pub fn config(&self) -> Result<flint::SpecConfig, Failure> {
        let kind = self.spec_type.parse().map_err(Failure::usage)?;
        let c = flint::SpecConfig { kind, draft_max: self.draft_max, draft_min: self.draft_min, predictions: false };
        c.validate().map_err(Failure::usage)?;
        Ok(c)
    }

    /// `--model-draft`, resolved to a file, and `--draft-p-min`, checked.
    pub fn draft_model(&self) -> Result<(Option<PathBuf>, f32), Failure> {
        if !(0.0..=1.0).contains(&self.draft_p_min) {
            return Err(Failure::usage(format!("--draft-p-min must be in [0, 1], got {}", self.draft_p_min)));
        }
        let path = self.model_draft.as_deref().map(crate::resolve).transpose()?;
        Ok((path, self.draft_p_min))
    }

    /// Whether any drafter is asked for.
    pub fn is_on(&self) -> bool {
        self.spec_type != "none" || self.model_draft.is_some()
    }

    /// The drafter, in words (bench reports).
    pub fn label(&self) -> String {
        match &self.model_draft {
            Some(m) => format!("draft model {m}"),
            None => self.spec_type.clone(),
        }
    }
}

/// Sampling and stopping flags, with llama.cpp's names and defaults.
#[derive(Args)]
pub struct SamplingArgs {
    /// Tokens to generate; -1 = until an end-of-generation token or the end of the context.
    #[arg(short = 'n', long = "max-tokens", visible_alias = "n-predict", default_value_t = -1, allow_negative_numbers = true)]
    pub max_tokens: i64,
    /// Temperature; 0 = greedy.
    #[arg(long = "temp", default_value_t = 0.8, allow_negative_numbers = true)]
    pub temp: f32,
    /// Top-k; 0 = off.
    #[arg(long = "top-k", default_value_t = 40, allow_negative_numbers = true)]
    pub top_k: i32,
    /// Top-p (nucleus); 1 = off.
    #[arg(long = "top-p", default_value_t = 0.95, allow_negative_numbers = true)]
    pub top_p: f32,
    /// Min-p; 0 = off.
    #[arg(long = "min-p", default_value_t = 0.05, allow_negative_numbers = true)]
    pub min_p: f32,
    /// Repetition penalty over the last --repeat-last-n tokens; 1 = off.
    #[arg(long = "repeat-penalty", default_value_t = 1.0, allow_negative_numbers = true)]
    pub repeat_penalty: f32,
    /// Tokens the penalties look back over; -1 = the whole context, 0 = off.
    #[arg(long = "repeat-last-n", default_value_t = 64, allow_negative_numbers = true)]
    pub repeat_last_n: i32,
    /// Presence penalty in [-2, 2]; 0 = off.
    #[arg(long = "presence-penalty", default_value_t = 0.0, allow_negative_numbers = true)]
    pub presence_penalty: f32,
    /// Frequency penalty in [-2, 2]; 0 = off.
    #[arg(long = "frequency-penalty", default_value_t = 0.0, allow_negative_numbers = true)]
    pub frequency_penalty: f32,
    /// RNG seed; -1 = random.
    #[arg(long = "seed", default_value_t = -1, allow_negative_numbers = true)]
    pub seed: i64,
    /// Stop when the text contains STR (not printed); repeatable.
    #[arg(long = "stop", value_name = "STR")]
    pub stop: Vec<String>,
    /// Print special and control tokens (`<start_of_image>`, `<|im_end|>`, ...) as text
    /// (also -sp, llama.cpp's flag); by default they print as nothing, as in llama.cpp.
    #[arg(long = "special")]
    pub special: bool,
}

#[derive(Args)]
pub struct RunArgs {
    #[command(flatten)]
    model: ModelArgs,
    #[command(flatten)]
    sampling: SamplingArgs,
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

/// `-n`, `--seed` or `/set max_tokens` as the engine takes them.
pub fn max_tokens_from(n: i64) -> Result<Option<usize>, String> {
    match n {
        -1 => Ok(None),
        n if n >= 1 => Ok(Some(n as usize)),
        n => Err(format!("-n must be -1 (no limit) or at least 1, got {n}")),
    }
}

pub fn seed_from(s: i64) -> Result<Option<u64>, String> {
    match s {
        -1 => Ok(None),
        s if s >= 0 => Ok(Some(s as u64)),
        s => Err(format!("--seed must be -1 (random) or non-negative, got {s}")),
    }
}

/// The flag a sampling error is about, so the message names what the user typed.
fn flag_of(e: &SamplingError) -> &'static str {
    match e {
        SamplingError::Temperature(_) => "--temp",
        SamplingError::TopP(_) => "--top-p",
        SamplingError::TopK(_) => "--top-k",
        SamplingError::MinP(_) => "--min-p",
        SamplingError::RepeatPenalty(_) => "--repeat-penalty",
        SamplingError::RepeatLastN(_) => "--repeat-last-n",
        SamplingError::PresencePenalty(_) => "--presence-penalty",
        SamplingError::FrequencyPenalty(_) => "--frequency-penalty",
        SamplingError::NLogprobs(_) => "--logprobs",
        _ => "sampling",
    }
}

impl SamplingArgs {
    /// Validated request settings; every range is checked here, before the model loads.
    pub fn params(&self, n_logprobs: usize) -> Result<GenerateParams, Failure> {
        let max_tokens = max_tokens_from(self.max_tokens).map_err(Failure::usage)?;
        let seed = seed_from(self.seed).map_err(Failure::usage)?;
        let sampling = SamplingParams {
            temperature: self.temp,
            top_k: self.top_k,
            top_p: self.top_p,
            min_p: self.min_p,
            seed,
            repeat_penalty: self.repeat_penalty,
            repeat_last_n: self.repeat_last_n,
            presence_penalty: self.presence_penalty,
            frequency_penalty: self.frequency_penalty,
            n_logprobs,
            ..SamplingParams::default()
        };
        sampling.validate().map_err(|e| Failure::usage(format!("{}: {e}", flag_of(&e))))?;
        if self.stop.iter().any(String::is_empty) {
            return Err(Failure::usage("--stop: a stop string may not be empty"));
        }
        let params = GenerateParams { max_tokens, sampling, stop: self.stop.clone(), ignore_eos: false, speculative: None, special: self.special };
        params.validate().map_err(Failure::usage)?;
        Ok(params)
    }
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
        let (draft_model, draft_p_min) = args.spec.draft_model()?;
        let opts = LoadOptions {
            backend: args.backend.kind(),
            device: args.device.device()?,
            split: args.device.split()?,
            n_ctx: args.ctx_size,
            kv_budget_mb: args.kv_budget_mb,
            chat_template: template_file,
            compile_observer: Some(crate::progress::compile_line()),
            self_test: args.self_test,
            spec: args.spec.config()?,
            draft_model,
            draft_p_min,
            ..LoadOptions::default()
        };
        let engine = Engine::load_path(&path, &opts).map_err(|e| match e {
            flint::EngineError::SelfTest { .. } => Failure::runtime(format!("{e} (choose another adapter with --device, or run on --backend cpu)")),
            e => {
                let hint = match (&e, e.backend()) {
                    (flint::EngineError::Chat(_), _) => " (pass --chat-template-file FILE, or --raw)",
                    (_, Some(flint::BackendError::OutOfMemory(_))) => " (a smaller -c/--ctx-size or --kv-budget-mb needs less)",
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
    let mut stream = engine.submit(Request::new(input, params)).map_err(|e| Failure::usage(format!("{}: {e}", path.display())))?;
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

//! The flags several commands share (the model, its backend and devices, speculation,
//! sampling), checked here once, and the load options every command starts from.

use std::path::PathBuf;

use clap::{Args, ValueEnum};
use flint::{GenerateParams, LoadOptions, SamplingError, SamplingParams};

use crate::Failure;

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
    #[command(flatten)]
    pub cache: CacheArgs,
}

/// How the KV cache stores keys and values (llama.cpp's -ctk / -ctv), and the exact mode.
#[derive(Args, Clone, Default)]
pub struct CacheArgs {
    /// How keys are stored: f16 (the default), f32 (twice f16's memory) or q8_0 (9/16 of
    /// f16's); also -ctk.
    #[arg(long = "cache-type-k", value_name = "TYPE")]
    pub cache_type_k: Option<flint::KvType>,
    /// How values are stored: f16 (the default), f32 or q8_0; also -ctv.
    #[arg(long = "cache-type-v", value_name = "TYPE")]
    pub cache_type_v: Option<flint::KvType>,
    /// The exact mode: results f32-faithful and batch-invariant (a sequence's logits the same
    /// bits whatever runs beside it); it keeps the KV cache in f32.
    #[arg(long)]
    pub exact: bool,
}

impl CacheArgs {
    /// The cache types and mode asked for, set on `opts`: an unnamed type is the mode's
    /// default; the exact mode with a type other than f32 is a usage error.
    pub fn apply(&self, opts: &mut LoadOptions) -> Result<(), Failure> {
        let base = if self.exact { LoadOptions::exact() } else { LoadOptions::default() };
        opts.exact = self.exact;
        opts.cache_k = self.cache_type_k.unwrap_or(base.cache_k);
        opts.cache_v = self.cache_type_v.unwrap_or(base.cache_v);
        if opts.exact_with_rounded_kv() {
            return Err(Failure::usage("--exact keeps the KV cache in f32: drop --exact or -ctk/-ctv"));
        }
        Ok(())
    }
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

/// The grammar a reply is held to (llama.cpp's flags): at most one of them.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct GrammarArgs {
    /// Hold the reply to this JSON schema (JSON text; `{}` for any JSON value).
    #[arg(short = 'j', long = "json-schema", value_name = "SCHEMA", group = "constraint")]
    pub json_schema: Option<String>,
    /// Hold the reply to the JSON schema in FILE (also -jf).
    #[arg(long = "json-schema-file", value_name = "FILE", group = "constraint")]
    pub json_schema_file: Option<PathBuf>,
    /// Hold the reply to this grammar: GBNF (llama.cpp's, rules with `::=`) or Lark.
    #[arg(long = "grammar", value_name = "GRAMMAR", group = "constraint")]
    pub grammar: Option<String>,
    /// Hold the reply to the grammar in FILE.
    #[arg(long = "grammar-file", value_name = "FILE", group = "constraint")]
    pub grammar_file: Option<PathBuf>,
}

impl GrammarArgs {
    /// The constraint the flags ask for; a file that cannot be read or a schema that is not
    /// JSON is a usage error here, one that does not compile is refused at submit.
    pub fn constraint(&self) -> Result<Option<flint::Constrained>, Failure> {
        let read = |flag: &str, path: &PathBuf| std::fs::read_to_string(path).map_err(|e| Failure::usage(format!("{flag} {}: {e}", path.display())));
        let schema = |field: &'static str, text: &str| -> Result<flint::Constrained, Failure> {
            let value: serde_json::Value = serde_json::from_str(text).map_err(|e| Failure::usage(format!("{field}: not JSON: {e}")))?;
            Ok(flint::Constrained { grammar: flint::Grammar::JsonSchema(value), field })
        };
        let grammar = |field: &'static str, text: &str| flint::Constrained { grammar: flint::Grammar::from_text(text), field };
        Ok(match (&self.json_schema, &self.json_schema_file, &self.grammar, &self.grammar_file) {
            (Some(s), ..) => Some(schema("--json-schema", s)?),
            (_, Some(f), ..) => Some(schema("--json-schema-file", &read("--json-schema-file", f)?)?),
            (_, _, Some(g), _) => Some(grammar("--grammar", g)),
            (_, _, _, Some(f)) => Some(grammar("--grammar-file", &read("--grammar-file", f)?)),
            _ => None,
        })
    }
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

/// The load options every command starts from: the backend, the devices and their split, the
/// kernel-compile line, and (given `spec`) the drafter. Each command adds its own sizes.
pub fn load_options(backend: BackendArg, device: &DeviceArgs, spec: Option<&SpecArgs>) -> Result<LoadOptions, Failure> {
    let mut opts = LoadOptions {
        backend: backend.kind(),
        device: device.device()?,
        split: device.split()?,
        compile_observer: Some(crate::progress::compile_line()),
        // FLINT_NO_OVERLAP=1: every step after the one before is read (to measure the overlap).
        overlap: std::env::var_os("FLINT_NO_OVERLAP").is_none_or(|v| v.is_empty()),
        ..LoadOptions::default()
    };
    device.cache.apply(&mut opts)?;
    if let Some(spec) = spec {
        opts.spec = spec.config()?;
        (opts.draft_model, opts.draft_p_min) = spec.draft_model()?;
    }
    Ok(opts)
}

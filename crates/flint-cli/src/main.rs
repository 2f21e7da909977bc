//! The `flint` binary: run a model, inspect it, fetch it.

mod args;
mod bench;
mod bench_constrained;
mod bench_serve;
mod catalog;
mod chat;
mod devices;
mod heap;
mod info;
mod progress;
mod pull;
mod run;
mod serve;
mod template;
mod tokenize;
mod web;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Counts heap use for `flint bench --concurrency`'s per-level figures.
#[global_allocator]
static HEAP: heap::Counting = heap::Counting;

/// Exit status for bad flags, bad values and unreadable or malformed models.
pub const EXIT_USAGE: u8 = 2;

#[derive(Parser)]
#[command(name = "flint", version, about = "Run GGUF language models on the GPU (WebGPU) or the CPU reference path")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Complete a prompt and stream the tokens.
    Run(run::RunArgs),
    /// Chat with a model interactively (needs a chat template).
    Chat(chat::ChatArgs),
    /// Measure load time, prefill and decode speed, and bandwidth.
    Bench(bench::BenchArgs),
    /// Print a model's architecture, hyperparameters, tensor types and tokenizer.
    Info(info::InfoArgs),
    /// Download catalog models into the local cache.
    Pull {
        /// Catalog names (see `flint list`).
        #[arg(required = true)]
        names: Vec<String>,
    },
    /// List catalog models and what is cached locally.
    List,
    /// List the GPU adapters wgpu finds (also `--list-devices`): index, name, type, backend
    /// and limits; `--device` takes the index or a name substring.
    Devices,
    /// Render a chat template on messages from a file, printing exactly what the model is fed.
    Template(template::TemplateArgs),
    /// A model's token ids for a text, as llama.cpp's llama-tokenize (vocabulary-only files too).
    Tokenize(tokenize::TokenizeArgs),
    /// Serve the browser chat page and the cached models over HTTP (localhost).
    Web(web::WebArgs),
    /// An OpenAI-compatible HTTP server: every request in flight shares the forward steps.
    Serve(serve::ServeArgs),
    /// Load-test an OpenAI-compatible server (Flint's or another's): throughput and latency.
    BenchServe(bench_serve::BenchServeArgs),
}

/// An error with the exit status it should produce.
pub struct Failure {
    pub code: u8,
    pub message: String,
}

impl Failure {
    pub fn usage(message: impl std::fmt::Display) -> Failure {
        Failure { code: EXIT_USAGE, message: message.to_string() }
    }
    pub fn runtime(message: impl std::fmt::Display) -> Failure {
        Failure { code: 1, message: message.to_string() }
    }
}

/// Gives this process (only) a private runtime directory when `XDG_RUNTIME_DIR` is unset or
/// not a directory, before any GPU instance exists. Mesa's implicit Vulkan layer
/// `VK_LAYER_MESA_device_select` links libwayland-client, which prints `error:
/// XDG_RUNTIME_DIR is invalid or not set in the environment.` twice on every headless run; a
/// newcomer reads that as a failure. With a valid, empty directory it finds no Wayland socket
/// and says nothing. The user's other programs keep their environment.
#[cfg(unix)]
fn private_runtime_dir() {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
    if std::env::var_os("XDG_RUNTIME_DIR").is_some_and(|d| std::path::Path::new(&d).is_dir()) {
        return;
    }
    let Ok(uid) = std::fs::metadata("/proc/self").map(|m| m.uid()) else { return };
    let dir = std::env::temp_dir().join(format!("flint-runtime-{uid}"));
    let _ = std::fs::DirBuilder::new().mode(0o700).create(&dir);
    // Only a directory of ours that no one else can write (another user may have made it).
    let ours = std::fs::symlink_metadata(&dir).is_ok_and(|m| m.is_dir() && m.uid() == uid && m.permissions().mode() & 0o077 == 0);
    if ours {
        std::env::set_var("XDG_RUNTIME_DIR", &dir);
    }
}

#[cfg(not(unix))]
fn private_runtime_dir() {}

/// llama.cpp's multi-letter short flags, which clap cannot declare (it would read `-md` as
/// `-m d`), as their long forms; and `flint --list-devices` as `flint devices`.
fn llama_flags(args: impl Iterator<Item = std::ffi::OsString>) -> Vec<std::ffi::OsString> {
    const LONG: [(&str, &str); 8] = [
        ("-md", "--model-draft"),
        ("-dev", "--device"),
        ("-sm", "--split-mode"),
        ("-ts", "--tensor-split"),
        ("-sp", "--special"),
        ("-jf", "--json-schema-file"),
        ("-ctk", "--cache-type-k"),
        ("-ctv", "--cache-type-v"),
    ];
    args.enumerate()
        .map(|(i, a)| match LONG.iter().find(|(short, _)| a == *short) {
            Some((_, long)) => long.into(),
            None if i == 1 && a == "--list-devices" => "devices".into(),
            None => a,
        })
        .collect()
}

fn main() -> ExitCode {
    // First, while the process has one thread.
    private_runtime_dir();
    let cli = match Cli::try_parse_from(llama_flags(std::env::args_os())) {
        Ok(cli) => cli,
        Err(e) => {
            use clap::error::ErrorKind;
            if matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion) {
                let _ = e.print();
                return ExitCode::SUCCESS;
            }
            // One clear line, as the CLI contract asks, instead of clap's usage block.
            let text = e.render().to_string();
            let line = text.lines().find(|l| !l.trim().is_empty()).unwrap_or("invalid arguments");
            eprintln!("{line}");
            return ExitCode::from(EXIT_USAGE);
        }
    };
    let result = match cli.command {
        Command::Run(args) => run::run(args),
        Command::Chat(args) => chat::chat(args),
        Command::Info(args) => info::info(args),
        Command::Devices => devices::devices(),
        Command::Bench(args) => bench::bench(args),
        Command::Pull { names } => pull_all(&names),
        Command::Tokenize(args) => tokenize::tokenize(args),
        Command::Template(args) => template::template(args),
        Command::Web(args) => web::web(args),
        Command::Serve(args) => serve::serve(args),
        Command::BenchServe(args) => bench_serve::bench_serve(args),
        Command::List => {
            list();
            Ok(())
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(f) => {
            eprintln!("error: {}", f.message);
            ExitCode::from(f.code)
        }
    }
}

fn pull_all(names: &[String]) -> Result<(), Failure> {
    for name in names {
        let entry = catalog::find(name).ok_or_else(|| {
            let known: Vec<&str> = catalog::catalog().iter().map(|e| e.name).collect();
            Failure::usage(format!("unknown model {name:?} (catalog: {})", known.join(", ")))
        })?;
        let path = pull::pull(entry).map_err(|e| Failure::runtime(format!("{e:#}")))?;
        eprintln!("{name}: {}", path.display());
    }
    Ok(())
}

fn list() {
    for (name, size) in catalog::list() {
        match size {
            Some(bytes) => println!("{name}\t{:.0} MB\tcached", bytes as f64 / 1e6),
            None => println!("{name}\t-\tnot downloaded"),
        }
    }
}

/// Resolves a MODEL argument to a local file; a missing or unknown model is a usage error.
pub fn resolve(model: &str) -> Result<std::path::PathBuf, Failure> {
    catalog::resolve_model(model).map_err(|e| Failure::usage(format!("{e:#}")))
}

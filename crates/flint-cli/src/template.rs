//! `flint template`: a chat template rendered on messages from a file, printed exactly (nothing
//! added), so a user sees what the model is fed; as llama.cpp users do with its server's
//! `/apply-template`.

use std::io::Write;
use std::path::{Path, PathBuf};

use clap::Args;
use flint::{ChatError, ChatTemplate, GgufFile, Tokenizer};
use serde_json::Value;

use crate::Failure;

#[derive(Args)]
pub struct TemplateArgs {
    /// A Jinja chat template file.
    #[arg(short = 'f', long = "file", required_unless_present = "model", conflicts_with = "model")]
    file: Option<PathBuf>,
    /// Take the model's own template and BOS/EOS texts (a path, a catalog name or a URL).
    #[arg(short = 'm', long = "model")]
    model: Option<String>,
    /// A JSON array of messages ({"role", "content", ...}).
    #[arg(long)]
    messages: PathBuf,
    /// A JSON array of tool schemas.
    #[arg(long)]
    tools: Option<PathBuf>,
    #[arg(long = "add-generation-prompt", default_value_t = true, action = clap::ArgAction::Set, value_name = "true|false")]
    add_generation_prompt: bool,
    /// The `bos_token` text (with -f; default empty).
    #[arg(long = "bos-token", value_name = "S")]
    bos_token: Option<String>,
    /// The `eos_token` text (with -f; default empty).
    #[arg(long = "eos-token", value_name = "S")]
    eos_token: Option<String>,
}

fn json_array(path: &Path, what: &str) -> Result<Vec<Value>, Failure> {
    let text = std::fs::read_to_string(path).map_err(|e| Failure::usage(format!("{}: {e}", path.display())))?;
    match serde_json::from_str(&text) {
        Ok(Value::Array(a)) => Ok(a),
        Ok(_) => Err(Failure::usage(format!("{}: {what} must be a JSON array", path.display()))),
        Err(e) => Err(Failure::usage(format!("{}: {e}", path.display()))),
    }
}

pub fn template(args: TemplateArgs) -> Result<(), Failure> {
    let messages = json_array(&args.messages, "the messages")?;
    let tools = args.tools.as_deref().map(|p| json_array(p, "the tools")).transpose()?;
    let template = match (&args.file, &args.model) {
        (Some(file), _) => {
            let source = std::fs::read_to_string(file).map_err(|e| Failure::usage(format!("{}: {e}", file.display())))?;
            let bos = args.bos_token.as_deref().unwrap_or("");
            let eos = args.eos_token.as_deref().unwrap_or("");
            ChatTemplate::new(&source, bos, eos).map_err(|e| Failure::usage(format!("{}: {e}", file.display())))?
        }
        (None, Some(model)) => {
            let path = crate::resolve(model)?;
            let gguf = GgufFile::open(&path).map_err(|e| Failure::usage(format!("{}: {e}", path.display())))?;
            let tok = Tokenizer::from_metadata(&gguf.metadata).map_err(|e| Failure::usage(format!("{}: {e}", path.display())))?;
            ChatTemplate::from_metadata(&gguf.metadata, &tok)
                .map_err(|e| Failure::usage(format!("{}: {e}", path.display())))?
                .ok_or_else(|| Failure::usage(format!("{}: {}", path.display(), ChatError::NoTemplate)))?
        }
        (None, None) => return Err(Failure::usage("give a template: -f FILE or -m MODEL")),
    };
    let text = template.render_json(&messages, tools.as_deref(), args.add_generation_prompt).map_err(|e| match e {
        ChatError::Raised(m) => Failure::usage(format!("the template refused: {m}")),
        e => Failure::usage(e),
    })?;
    let mut out = std::io::stdout().lock();
    out.write_all(text.as_bytes()).and_then(|()| out.flush()).map_err(Failure::runtime)
}

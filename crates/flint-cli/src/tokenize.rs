//! `flint tokenize`: a model's token ids for a text, as llama.cpp's `llama-tokenize` prints
//! them. Only the tokenizer is built, so vocabulary-only GGUF files (no tensors) work.

use std::io::Read;
use std::path::PathBuf;

use clap::Args;
use flint::{GgufFile, Tokenizer};

use crate::Failure;

#[derive(Args)]
pub struct TokenizeArgs {
    /// Model (or vocabulary-only GGUF file): a path, a catalog name or a URL.
    #[arg(short = 'm', long = "model")]
    model: String,
    /// The text to tokenize.
    #[arg(conflicts_with_all = ["file", "stdin"])]
    prompt: Option<String>,
    /// Read the text from FILE.
    #[arg(short = 'f', long = "file", conflicts_with = "stdin")]
    file: Option<PathBuf>,
    /// Read the text from standard input.
    #[arg(long)]
    stdin: bool,
    /// Print only the ids, as one JSON array on one line.
    #[arg(long)]
    ids: bool,
    /// Add no BOS (or EOS) token, whatever the vocabulary's default.
    #[arg(long = "no-bos")]
    no_bos: bool,
    /// Treat special-token text (`<|im_start|>`, ...) as plain text.
    #[arg(long = "no-parse-special")]
    no_parse_special: bool,
}

pub fn tokenize(args: TokenizeArgs) -> Result<(), Failure> {
    let text = match (&args.prompt, &args.file, args.stdin) {
        (Some(p), _, _) => p.clone(),
        (None, Some(f), _) => std::fs::read_to_string(f).map_err(|e| Failure::usage(format!("{}: {e}", f.display())))?,
        (None, None, true) => {
            let mut s = String::new();
            std::io::stdin().read_to_string(&mut s).map_err(|e| Failure::usage(format!("stdin: {e}")))?;
            s
        }
        (None, None, false) => return Err(Failure::usage("give the text: PROMPT, -f FILE or --stdin")),
    };
    let path = crate::resolve(&args.model)?;
    let file = GgufFile::open(&path).map_err(|e| Failure::usage(format!("{}: {e}", path.display())))?;
    let tok = Tokenizer::from_metadata(&file.metadata).map_err(|e| Failure::usage(format!("{}: {e}", path.display())))?;
    let add_bos = !args.no_bos && tok.add_bos_default();
    let ids = tok.encode(&text, add_bos, !args.no_parse_special).map_err(|e| Failure::usage(e.to_string()))?;
    if args.ids {
        let list: Vec<String> = ids.iter().map(u32::to_string).collect();
        println!("[{}]", list.join(", "));
    } else {
        for &id in &ids {
            println!("{id:6} -> '{}'", String::from_utf8_lossy(&tok.token_bytes(id)));
        }
    }
    Ok(())
}

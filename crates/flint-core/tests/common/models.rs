//! Locates the test models: `$FLINT_HOME/<name>.gguf` (default `~/.cache/flint/models`).
//! A missing model is a test failure that says how to fetch it, never a silent skip.

#![allow(dead_code)]

use std::path::PathBuf;

pub const GEMMA: &str = "gemma-3-270m";
pub const QWEN: &str = "qwen2.5-coder-0.5b";

/// `$FLINT_HOME`, or `~/.cache/flint/models`.
pub fn models_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("FLINT_HOME") {
        return PathBuf::from(dir);
    }
    let home = std::env::var_os("HOME").map(PathBuf::from).unwrap_or_else(|| PathBuf::from("."));
    home.join(".cache/flint/models")
}

/// Path of a catalog model; panics with instructions when it is not there.
pub fn model_path(name: &str) -> PathBuf {
    let path = models_dir().join(format!("{name}.gguf"));
    assert!(path.is_file(), "test model {name} not found at {}: run `flint pull {name}` (or set FLINT_HOME to the folder holding {name}.gguf)", path.display());
    path
}

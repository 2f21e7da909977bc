//! Locates the test models: `$FLINT_HOME/<name>.gguf` (default `~/.cache/flint/models`).
//! A missing model is a test failure that says how to fetch it, never a silent skip.

#![allow(dead_code)]

pub const GEMMA: &str = "gemma-3-270m";
pub const QWEN: &str = "qwen2.5-coder-0.5b";

pub use flint_core::testing::model_path;

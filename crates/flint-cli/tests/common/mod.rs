//! Helpers the CLI's end-to-end tests share.

use std::path::PathBuf;

/// `../shared` beside the repository (the golden files).
#[allow(dead_code)]
pub fn shared() -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../../shared"))
}

/// A test model in the cache ($FLINT_HOME or ~/.cache/flint/models), which must be there.
pub fn model_path(name: &str) -> String {
    let dir = std::env::var_os("FLINT_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(std::env::var("HOME").unwrap_or_default()).join(".cache/flint/models"));
    let p = dir.join(format!("{name}.gguf"));
    assert!(p.exists(), "{} is missing: run `flint pull {name}` (scripts/test.sh does)", p.display());
    p.to_string_lossy().into_owned()
}

//! What every crate's tests share (behind the `testing` feature, never in a release build):
//! the one NMSE the tolerance presets are written for, and where the test models and
//! `../shared` (the golden oracles beside the repository) are.

use std::path::PathBuf;

/// Normalized mean squared error Σ(a−b)² / Σ(b−mean b)² (Σb² when b is constant), as
/// llama.cpp's test-backend-ops computes it.
pub fn nmse(got: &[f32], want: &[f32]) -> f64 {
    assert_eq!(got.len(), want.len(), "length mismatch");
    let mean = want.iter().map(|&v| v as f64).sum::<f64>() / want.len().max(1) as f64;
    let num: f64 = got.iter().zip(want).map(|(&a, &b)| (a as f64 - b as f64).powi(2)).sum();
    let mut den: f64 = want.iter().map(|&b| (b as f64 - mean).powi(2)).sum();
    if den == 0.0 {
        den = want.iter().map(|&b| (b as f64).powi(2)).sum::<f64>().max(1e-30);
    }
    num / den
}

/// `../shared` beside the repository: the golden oracles (`golden/`), which the full tests
/// read and the fast tier does not.
pub fn shared_dir() -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../../shared"))
}

/// `$FLINT_HOME`, or `~/.cache/flint/models`: where `flint pull` keeps the test models.
pub fn models_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("FLINT_HOME") {
        return PathBuf::from(dir);
    }
    let home = std::env::var_os("HOME").map(PathBuf::from).unwrap_or_else(|| PathBuf::from("."));
    home.join(".cache/flint/models")
}

/// A catalog model's file; a missing one fails the test, saying how to fetch it.
pub fn model_path(name: &str) -> PathBuf {
    let path = models_dir().join(format!("{name}.gguf"));
    assert!(path.is_file(), "test model {name} not found at {}: run `flint pull {name}` (scripts/test.sh does)", path.display());
    path
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nmse_is_relative_to_the_spread() {
        assert_eq!(nmse(&[1.0, 2.0, 3.0], &[1.0, 2.0, 3.0]), 0.0);
        // Error 1 at one of three points, spread (1 + 0 + 1) around the mean 2.
        assert!((nmse(&[1.0, 2.0, 4.0], &[1.0, 2.0, 3.0]) - 0.5).abs() < 1e-12);
        // A constant reference falls back to Σb².
        assert!((nmse(&[3.0, 3.0], &[2.0, 2.0]) - 0.25).abs() < 1e-12);
    }
}

//! What `flint bench` and the browser's benchmark share, so their figures compare.

use crate::{Engine, EngineError};

/// Ordinary text, repeated to the requested length.
const BENCH_TEXT: &str =
    "The history of the printing press begins in the fifteenth century, when movable type spread across Europe. ";

impl Engine {
    /// A fixed, ordinary-text prompt of exactly `n` tokens.
    pub fn bench_prompt(&self, n: usize) -> Result<Vec<u32>, EngineError> {
        let base = self.tokenize_raw(BENCH_TEXT)?;
        Ok(base.iter().cycle().take(n).copied().collect())
    }
}

//! Helpers the CLI's end-to-end tests share (the locations are flint_core::testing's).

#[allow(unused_imports)]
pub use flint_gpu::testing::shared_dir as shared;

/// A test model in the cache, as a command-line argument; a missing one fails the test.
pub fn model_path(name: &str) -> String {
    flint_gpu::testing::model_path(name).to_string_lossy().into_owned()
}

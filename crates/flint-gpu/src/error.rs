//! Typed GPU errors: no adapter, validation, out of memory, device lost, limits exceeded.

use thiserror::Error;

#[derive(Debug, Error, Clone)]
pub enum GpuError {
    /// None of the adapters `found` is the one `wanted` (an index or a name substring), or
    /// there is none at all; `cause`: what the platform said.
    #[error("no GPU adapter found{}{}{}", wanted.as_ref().map_or(String::new(), |w| format!(" matching {w:?}")),
        if found.is_empty() { String::new() } else { format!(" (found: {})", found.iter().enumerate().map(|(i, n)| format!("{i}: {n}")).collect::<Vec<_>>().join(", ")) },
        cause.as_ref().map_or(String::new(), |c| format!(": {c}")))]
    NoAdapter { wanted: Option<String>, found: Vec<String>, cause: Option<String> },
    #[error("cannot open the GPU device: {cause}")]
    RequestDevice { cause: String },
    #[error("GPU validation error: {cause}")]
    Validation { cause: String },
    /// `what` did not fit on the device `device`.
    #[error("GPU out of memory: {what} did not fit on {device}{}", cause.as_ref().map_or(String::new(), |c| format!(": {c}")))]
    OutOfMemory { what: String, device: String, cause: Option<String> },
    #[error("the GPU device was lost: {cause}")]
    DeviceLost { cause: String },
    #[error("GPU readback failed: {cause}")]
    Readback { cause: String },
    #[error("{what} needs {need} but the adapter allows {limit}")]
    Limit { what: &'static str, need: u64, limit: u64 },
    #[error("shader {shader}: {message}")]
    Shader { shader: String, message: String },
    #[error("{op}: {message}")]
    Unsupported { op: &'static str, message: String },
    #[error(transparent)]
    Kv(#[from] flint_core::kv::KvError),
}

pub type Result<T, E = GpuError> = std::result::Result<T, E>;

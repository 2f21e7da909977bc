//! Typed GPU errors: no adapter, validation, out of memory, device lost, limits exceeded.

use thiserror::Error;

#[derive(Debug, Error, Clone)]
pub enum GpuError {
    #[error("no GPU adapter found{0}")]
    NoAdapter(String),
    #[error("cannot open the GPU device: {0}")]
    RequestDevice(String),
    #[error("GPU validation error: {0}")]
    Validation(String),
    #[error("GPU out of memory: {0}")]
    OutOfMemory(String),
    #[error("the GPU device was lost: {0}")]
    DeviceLost(String),
    #[error("GPU readback failed: {0}")]
    Readback(String),
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

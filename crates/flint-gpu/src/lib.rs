//! Flint's WebGPU compute: the wgpu context, the shader registry and preprocessor, the
//! pipeline cache, the WGSL kernels and the GPU forward pass.

pub mod backend;
pub mod bench;
pub mod buffer;
pub mod context;
pub mod disk_cache;
pub mod error;
pub mod model;
pub mod ops;
pub mod pipeline;
pub mod shader;
pub mod split;
#[cfg(feature = "testing")]
pub mod testing;
pub mod tune;
pub mod weights;

pub use context::{Caps, GpuContext};
pub use error::{GpuError, Result};

//! Flint's GPU-free core: model files, quantization formats, tokenizer, architectures,
//! sampling and the CPU reference forward pass that every GPU kernel is tested against.

pub mod arch;
pub mod backend;
pub mod chat;
pub mod constrain;
pub mod generate;
pub mod gguf;
pub mod kv;
pub mod quant;
pub mod reasoning;
pub mod reference;
pub mod sampling;
pub mod sched;
pub mod selftest;
pub mod spec;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
pub mod tokenizer;
pub mod tools;

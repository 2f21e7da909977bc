//! The parts of the `flint` command that are useful outside the binary: today the OpenAI
//! request reader of `flint serve`, which the fuzzer (`fuzz/fuzz_targets/openai_request.rs`)
//! drives with arbitrary bodies.

pub mod openai;

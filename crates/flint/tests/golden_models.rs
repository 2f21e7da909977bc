//! Whole-model oracle tests on the CPU reference: all 32 greedy tokens of every golden prompt.

mod common;

use flint::{BackendKind, Engine, LoadOptions};

fn cpu(name: &str) -> Engine {
    let opts = LoadOptions { backend: BackendKind::Cpu, ..LoadOptions::default() };
    Engine::load_path(&common::model_path(name), &opts).unwrap()
}

#[test]
fn gemma_3_270m_cpu_matches_f32_reference() {
    common::run_golden(&mut cpu("gemma-3-270m"), "gemma", 1..=7, 32, "cpu");
}

#[test]
fn qwen2_5_coder_0_5b_cpu_matches_f32_reference() {
    common::run_golden(&mut cpu("qwen2.5-coder-0.5b"), "qwen", 1..=7, 32, "cpu");
}

//! Whole-model oracle tests on the CPU reference: all 32 greedy tokens of every golden prompt.

mod common;

use common::{check_golden, golden_prompt, solo, Job};
use flint::{BackendKind, Engine, LoadOptions};

fn cpu_golden(name: &str, golden: &str) {
    let opts = LoadOptions { backend: BackendKind::Cpu, ..LoadOptions::exact() };
    let engine = Engine::load_path(&common::model_path(name), &opts).unwrap();
    let jobs: Vec<Job> = (1..=7).map(|i| Job::greedy(golden_prompt(&engine, golden, i), 32)).collect();
    let outs = solo(&engine, &jobs);
    let agree: Vec<usize> = outs.iter().enumerate().map(|(i, o)| check_golden("cpu", golden, i + 1, o)).collect();
    eprintln!("cpu {golden}: tokens before the first difference from llama.cpp's greedy output: {agree:?}");
}

#[test]
fn gemma_3_270m_cpu_matches_f32_reference() {
    cpu_golden("gemma-3-270m", "gemma");
}

#[test]
fn qwen2_5_coder_0_5b_cpu_matches_f32_reference() {
    cpu_golden("qwen2.5-coder-0.5b", "qwen");
}

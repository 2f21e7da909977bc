//! Whole-model oracle tests on the GPU (lavapipe in CI): 16 greedy tokens per golden prompt
//! for both models at the device's binding limit, and gemma again with weights split at 64 MB.

mod common;

use flint::{BackendKind, Engine, LoadOptions};

fn gpu(name: &str, max_binding_mb: Option<u64>) -> Option<Engine> {
    flint_gpu::testing::context()?;
    let opts = LoadOptions { backend: BackendKind::Gpu, max_binding_mb, ..LoadOptions::default() };
    Some(Engine::load_path(&common::model_path(name), &opts).unwrap())
}

const GREEDY: usize = 16;

#[test]
fn gemma_3_270m_gpu_matches_f32_reference() {
    let Some(mut e) = gpu("gemma-3-270m", None) else { return };
    common::run_golden(&mut e, "gemma", 1..=7, GREEDY, "gpu");
}

#[test]
fn gemma_3_270m_gpu_split_at_64mb_matches_f32_reference() {
    let Some(mut e) = gpu("gemma-3-270m", Some(64)) else { return };
    common::run_golden(&mut e, "gemma", 1..=7, GREEDY, "gpu/64MB");
}

#[test]
fn qwen2_5_coder_0_5b_gpu_matches_f32_reference() {
    let Some(mut e) = gpu("qwen2.5-coder-0.5b", None) else { return };
    common::run_golden(&mut e, "qwen", 1..=7, GREEDY, "gpu");
}

//! KV caches stored as f16 and as q8_0 (`--cache-type-k/-v`) on the GPU (lavapipe in CI):
//! - both test models keep the f32 reference's greedy ids on the seven golden prompts under
//!   the near-tie rule, except where llama.cpp's own q8_0 cache leaves them the same way
//!   (`tests/data/kv/llama_q8_0.json`: qwen prompt 7 takes 382 for 198 at step 13, a
//!   margin of 0.35, in both engines); the last-position NMSE against the f32 reference is printed, and
//!   bounded: f16 by the f32 bar (1e-5), q8_0 by 5e-2 (what 8 bits give: qwen2.5's keys reach
//!   1e-2 at 1,187 tokens even rotated; a broken kernel lands near 1);
//! - a position takes half of f32's KV bytes (f16) and 9/32 of them (q8_0);
//! - batched equals alone, bit for bit, with q8_0 keys and values (the stored rounding is a
//!   function of each row alone);
//! - the GPU computes what the CPU reference computes with the same types (a tiny model of
//!   the families oracle, every pair of types: last-position NMSE ≤ 1e-5, greedy ids equal).

mod common;

use common::{assert_same, check_greedy, golden_prompt, ids, json, nmse, shared, solo, together, Job, Output};
use flint::{BackendKind, Engine, KvType, LoadOptions};

/// Last-position NMSE bounds against the f32 reference, per cache type.
fn max_nmse(t: KvType) -> f64 {
    match t {
        KvType::Q8_0 => 5e-2,
        _ => common::MAX_NMSE,
    }
}
const GREEDY: usize = 16;

fn load(path: &std::path::Path, backend: BackendKind, k: KvType, v: KvType) -> Option<Engine> {
    if backend == BackendKind::Gpu {
        flint_gpu::testing::context()?;
    }
    let opts = LoadOptions { backend, n_ctx: 2048, cache_k: k, cache_v: v, ..LoadOptions::default() };
    Some(Engine::load_path(path, &opts).unwrap_or_else(|e| panic!("{}: {e}", path.display())))
}

/// The seven golden prompts together through `engine` (greedy, 16 tokens), checked against
/// the f32 reference; returns the outputs.
/// The first step where `got` leaves the reference's greedy ids, if no near tie forgives it.
fn unforgiven(got: &[u32], reference: &serde_json::Value) -> Option<usize> {
    let want = ids(&reference["greedy_token_ids"]);
    let steps = reference["greedy_steps_top2"].as_array().unwrap();
    let i = got.iter().zip(&want).position(|(g, w)| g != w)?;
    let tie = (0..=i).any(|j| (steps[j]["logit"].as_f64().unwrap() - steps[j]["second_logit"].as_f64().unwrap()).abs() < common::NEAR_TIE);
    (!tie).then_some(i)
}

fn golden(label: &str, engine: &Engine, golden: &str, t: KvType) -> Vec<Output> {
    let bound = max_nmse(t);
    let llama_q8 = json(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/data/kv/llama_q8_0.json"));
    let jobs: Vec<Job> = (1..=7).map(|i| Job::greedy(golden_prompt(engine, golden, i), GREEDY)).collect();
    let outs = together(engine, &jobs);
    for (i, out) in outs.iter().enumerate() {
        let reference = json(shared().join(format!("golden/f32/{golden}/{}.json", i + 1)));
        let bytes = std::fs::read(shared().join(format!("golden/f32/{golden}/{}.last_logits.f32", i + 1))).unwrap();
        let want: Vec<f32> = bytes.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect();
        let e = nmse(&out.logits[0], &want);
        eprintln!("{label} prompt {}: last-position NMSE {e:.2e} against the f32 reference", i + 1);
        assert!(e <= bound, "{label} prompt {}: NMSE {e:e} > {bound:e}", i + 1);
        match unforgiven(&out.ids, &reference) {
            Some(step) if t == KvType::Q8_0 => {
                let llama = ids(&llama_q8["models"][golden][(i + 1).to_string()]);
                assert_eq!(
                    out.ids[..=step],
                    llama[..=step],
                    "{label} prompt {}: left the reference at step {step}, where llama.cpp's q8_0 cache does not",
                    i + 1
                );
                eprintln!("{label} prompt {}: leaves the reference at step {step} with llama.cpp's q8_0 cache (same token)", i + 1);
            }
            _ => check_greedy(&format!("{label} prompt {}", i + 1), &out.ids, &reference),
        }
    }
    outs
}

fn model(name: &str, golden_dir: &str) {
    let path = common::model_path(name);
    let cfg = flint::ModelConfig::from_gguf(&flint::GgufFile::open(&path).unwrap()).unwrap();
    // f32: every layer's K and V rows, 4 bytes an element.
    let f32_bytes = (cfg.n_layer * (cfg.kv_dim() + cfg.v_dim()) * 4) as u64;
    for t in [KvType::F16, KvType::Q8_0] {
        let t0 = std::time::Instant::now();
        let Some(engine) = load(&path, BackendKind::Gpu, t, t) else { return };
        let bytes = engine.info().kv_bytes_per_position;
        let want = if t == KvType::F16 { f32_bytes / 2 } else { f32_bytes * 9 / 32 };
        assert_eq!(bytes, want, "{name} {t}: KV bytes per position");
        eprintln!("{name} {t}: {bytes} KV bytes per position ({:.3} of f32's)", bytes as f64 / f32_bytes as f64);
        let outs = golden(&format!("{name} {t}"), &engine, golden_dir, t);
        if t == KvType::Q8_0 {
            // Alone equals together (prompts 2 and 5: one short, one long).
            let jobs: Vec<Job> = [2, 5].iter().map(|&i| Job::greedy(golden_prompt(&engine, golden_dir, i), GREEDY)).collect();
            let alone = solo(&engine, &jobs);
            assert_same(&format!("{name} {t} batched"), &alone, &[outs[1].clone(), outs[4].clone()]);
        }
        eprintln!("{name} {t}: done in {:.1}s", t0.elapsed().as_secs_f64());
    }
}

#[test]
fn qwen_f16_and_q8_0_caches_keep_the_reference_greedy_ids() {
    model("qwen2.5-coder-0.5b", "qwen");
}

#[test]
fn gemma_f16_and_q8_0_caches_keep_the_reference_greedy_ids() {
    model("gemma-3-270m", "gemma");
}

/// Every (K, V) pair of types on a tiny model: the GPU against the CPU reference storing the
/// same types, prompts alone.
#[test]
fn gpu_equals_the_cpu_reference_for_every_cache_type() {
    let dir = shared().join("golden/families/qwen3");
    let path = dir.join("model.gguf");
    if flint_gpu::testing::context().is_none() {
        return;
    }
    for k in KvType::ALL {
        for v in KvType::ALL {
            let gpu = load(&path, BackendKind::Gpu, k, v).unwrap();
            let cpu = load(&path, BackendKind::Cpu, k, v).unwrap();
            for i in [1, 3] {
                let reference = json(dir.join(format!("{i}.json")));
                let jobs = [Job::greedy(ids(&reference["prompt_token_ids"]), 12)];
                let (g, c) = (solo(&gpu, &jobs).remove(0), solo(&cpu, &jobs).remove(0));
                let e = nmse(&g.logits[0], &c.logits[0]);
                eprintln!("qwen3 K {k} V {v} prompt {i}: GPU against CPU NMSE {e:.2e}");
                assert!(e <= common::MAX_NMSE, "K {k} V {v} prompt {i}: NMSE {e:e}");
                assert_eq!(g.ids, c.ids, "K {k} V {v} prompt {i}: greedy ids");
            }
        }
    }
}

//! Shared oracle checks for the whole-model tests: llama.cpp's prompt ids, the f32
//! reference's last-position logits (NMSE ≤ 1e-5) and its greedy continuation.
#![allow(dead_code)]

use std::path::PathBuf;

use flint::{Backend, Engine, SamplingParams};
use serde_json::Value;

/// NMSE = Σ(a−b)² / Σ(b−mean(b))², the foundation issue's definition.
pub const MAX_NMSE: f64 = 1e-5;
/// A divergence is tolerated only right after a step whose reference top-2 margin is below this.
pub const NEAR_TIE: f64 = 1e-2;

pub fn shared() -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../../shared"))
}

pub fn model_path(name: &str) -> PathBuf {
    let dir = std::env::var_os("FLINT_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(std::env::var("HOME").unwrap_or_default()).join(".cache/flint/models"));
    let p = dir.join(format!("{name}.gguf"));
    assert!(p.exists(), "{} is missing: run `flint pull {name}` (scripts/test.sh does)", p.display());
    p
}

fn json(path: PathBuf) -> Value {
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap()
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect()
}

fn prompt_file(golden: &str, index: usize) -> PathBuf {
    let name = match (golden, index) {
        (_, 7) => "p7long.txt".to_string(),
        ("gemma", 6) => "p6g.txt".to_string(),
        ("qwen", 6) => "p6q.txt".to_string(),
        (_, i) => format!("p{i}.txt"),
    };
    shared().join("golden/prompts").join(name)
}

fn nmse(got: &[f32], want: &[f32]) -> f64 {
    assert_eq!(got.len(), want.len());
    let mean = want.iter().map(|&v| v as f64).sum::<f64>() / want.len() as f64;
    let num: f64 = got.iter().zip(want).map(|(&a, &b)| (a as f64 - b as f64).powi(2)).sum();
    let den: f64 = want.iter().map(|&b| (b as f64 - mean).powi(2)).sum();
    num / den
}

/// Greedy ids must equal the reference's, except after a step whose top-2 margin is a near tie.
fn check_greedy(label: &str, got: &[u32], reference: &Value) {
    let want = ids(&reference["greedy_token_ids"]);
    let steps = reference["greedy_steps_top2"].as_array().unwrap();
    assert!(got.len() <= want.len());
    for (i, (&g, &w)) in got.iter().zip(&want).enumerate() {
        if g != w {
            let tie_before = (0..=i).any(|j| {
                let s = &steps[j];
                (s["logit"].as_f64().unwrap() - s["second_logit"].as_f64().unwrap()).abs() < NEAR_TIE
            });
            assert!(tie_before, "{label}: token {i} is {g}, the f32 reference has {w}\n got  {got:?}\n want {want:?}");
            eprintln!("{label}: diverged at {i} after a near tie (allowed)");
            return;
        }
    }
}

/// Prefills the prompt once, checks its logits, then decodes `n` greedy tokens from there
/// through the backend's own sampling path (on the GPU: argmax on the device).
fn logits_then_greedy(engine: &mut Engine, prompt: &[u32], n: usize) -> (Vec<f32>, Vec<u32>) {
    futures::executor::block_on(async {
        let backend: &mut dyn Backend = engine.backend_mut();
        backend.truncate(0);
        let logits = backend.forward(prompt).await.unwrap();
        let mut sampler = flint_core::sampling::Sampler::new(SamplingParams::greedy()).unwrap();
        let mut out = vec![flint_core::sampling::argmax(&logits)];
        while out.len() < n {
            let next = backend.forward_sample(&out[out.len() - 1..], &mut sampler).await.unwrap().id;
            out.push(next);
        }
        (logits, out)
    })
}

/// Golden prompts `prompts` (1..=7 is all) of one model: prompt ids, last logits, `n_greedy` greedy ids.
pub fn run_golden(engine: &mut Engine, golden: &str, prompts: std::ops::RangeInclusive<usize>, n_greedy: usize, label: &str) {
    let mut llama_agree = Vec::new();
    for index in prompts {
        let t0 = std::time::Instant::now();
        let label = format!("{label} {golden} prompt {index}");
        let llama = json(shared().join(format!("golden/{golden}/{index}.json")));
        let reference = json(shared().join(format!("golden/f32/{golden}/{index}.json")));
        let text = std::fs::read_to_string(prompt_file(golden, index)).unwrap();
        let prompt = engine.tokenize_raw(&text).unwrap();
        assert_eq!(prompt, ids(&llama["prompt_token_ids"]), "{label}: prompt ids differ from llama.cpp's");

        let (logits, greedy) = logits_then_greedy(engine, &prompt, n_greedy);
        let bytes = std::fs::read(shared().join(format!("golden/f32/{golden}/{index}.last_logits.f32"))).unwrap();
        let want: Vec<f32> = bytes.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect();
        let e = nmse(&logits, &want);
        assert!(e <= MAX_NMSE, "{label}: last-position logits NMSE {e:e} > {MAX_NMSE:e}");
        check_greedy(&label, &greedy, &reference);
        let llama_ids = ids(&llama["greedy_token_ids"]);
        let agree = greedy.iter().zip(&llama_ids).take_while(|(a, b)| a == b).count();
        llama_agree.push(agree);
        eprintln!(
            "{label}: NMSE {e:.2e}, {n_greedy} greedy ids match, llama.cpp agrees for {agree}, {:.1}s",
            t0.elapsed().as_secs_f64()
        );
    }
    eprintln!("{label} {golden}: tokens before the first difference from llama.cpp's greedy output: {llama_agree:?}");
}

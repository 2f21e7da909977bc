//! One model split by layers over several devices (`--device A,B`): golden greedy ids (and
//! first logits) for both models with the layers over two lavapipe devices, several prompts
//! batched (their shared prompt step runs as micro-batches that cross the devices as a
//! wavefront); gemma
//! prompts 1–4 over lavapipe and SwiftShader at once; the automatic split from per-device
//! budgets, and its error when the model fits none of them together.

mod common;

use common::{check_golden, golden_prompt, together, Job};
use flint::{BackendKind, Engine, LoadOptions, ModelPart, SplitOptions};

/// Set (to anything) in the child this binary re-runs itself as, with `VK_ICD_FILENAMES`.
const CHILD: &str = "FLINT_SPLIT_TEST_CHILD";

/// Where a split at `share` of `n` layers falls (rounded, as llama.cpp's tensor split).
fn cut(n: usize, share: f64) -> usize {
    (n as f64 * share).round() as usize
}

/// Greedy tokens each request generates.
const N_GEN: usize = 8;

fn split_engine(path: &std::path::Path, device: &str, split: SplitOptions) -> Result<Engine, flint::EngineError> {
    let opts = LoadOptions { backend: BackendKind::Gpu, device: Some(device.into()), split, ..LoadOptions::exact() };
    Engine::load_path(path, &opts)
}

/// The golden prompts `prompts` together through a split engine, each checked against the
/// f32 reference (first logits, greedy ids under the near-tie rule).
fn golden_split(name: &str, golden: &str, device: &str, prompts: &[usize]) {
    if flint_gpu::testing::context().is_none() {
        return;
    }
    let engine = split_engine(&common::model_path(name), device, SplitOptions::default()).unwrap();
    let parts = &engine.info().parts;
    eprintln!("{name} on {}", engine.info().backend_name);
    assert_eq!(parts.len(), 2, "{name}: two parts, one a device: {parts:?}");
    let (n_layer, half) = (engine.config().n_layer, cut(engine.config().n_layer, 0.5));
    assert_eq!(parts[0].layers, 0..half, "{name}: equal halves by default");
    assert_eq!(parts[1].layers, half..n_layer);
    let t0 = std::time::Instant::now();
    let jobs: Vec<Job> = prompts.iter().map(|&i| Job::greedy(golden_prompt(&engine, golden, i), N_GEN)).collect();
    // The prompts share the first step, which is long enough to run as two micro-batches
    // (the decode steps after it go through whole).
    let prompt_tokens: usize = jobs.iter().map(|j| j.prompt.len()).sum();
    assert!((2 * flint_gpu::model::MIN_MICRO_TOKENS..=flint::DEFAULT_MAX_BATCH_TOKENS).contains(&prompt_tokens), "{prompt_tokens} prompt tokens");
    let outs = together(&engine, &jobs);
    eprintln!("{name}: {} prompts together over {device} in {:.1}s", prompts.len(), t0.elapsed().as_secs_f64());
    for (&i, out) in prompts.iter().zip(&outs) {
        check_golden(&format!("{name} split over {device}"), golden, i, out);
    }
}

#[test]
fn gemma_3_270m_split_over_two_lavapipe_devices_matches_the_f32_reference() {
    golden_split("gemma-3-270m", "gemma", "llvmpipe,llvmpipe", &[1, 2, 3, 4]);
}

#[test]
fn qwen2_5_coder_0_5b_split_over_two_lavapipe_devices_matches_the_f32_reference() {
    golden_split("qwen2.5-coder-0.5b", "qwen", "llvmpipe,llvmpipe", &[1, 2, 3, 4]);
}

/// Gemma over two different adapters at once, lavapipe and SwiftShader: this binary runs
/// itself again with both ICDs named (the Vulkan loader reads `VK_ICD_FILENAMES` once a
/// process), the child running only this test.
#[test]
fn gemma_3_270m_split_over_lavapipe_and_swiftshader_matches_the_f32_reference() {
    if flint_gpu::testing::context().is_none() {
        return;
    }
    let name = "gemma_3_270m_split_over_lavapipe_and_swiftshader_matches_the_f32_reference";
    if std::env::var_os(CHILD).is_some() {
        golden_split("gemma-3-270m", "gemma", "swiftshader,llvmpipe", &[1, 2, 3, 4]);
        return;
    }
    let icds = flint_gpu::testing::lavapipe_and_swiftshader_icds();
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", name, "--nocapture", "--test-threads=1"])
        .env(CHILD, "1")
        .env("VK_ICD_FILENAMES", icds)
        .env_remove("FLINT_ADAPTER")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    let stdout = String::from_utf8_lossy(&out.stdout);
    eprintln!("{stderr}");
    assert!(out.status.success(), "the lavapipe + SwiftShader run failed:\n{stdout}\n{stderr}");
    assert!(stdout.contains("1 passed"), "the child ran no test:\n{stdout}");
    assert!(stderr.contains("SwiftShader") && stderr.contains("llvmpipe"), "the split did not run on both adapters:\n{stderr}");
}

/// Budgets per device decide the split (tiny qwen3, whose parts cost a few MiB): a model
/// that fits the first device stays whole there; one that does not is spread in the
/// budgets' proportions; one that fits none of them together is refused, saying what it
/// needs and what there is. The split engine's greedy ids equal the whole one's, and the
/// load-time self-test runs across its devices.
#[test]
fn device_budgets_make_the_automatic_split() {
    if flint_gpu::testing::context().is_none() {
        return;
    }
    let path = common::shared().join("golden/families/qwen3/model.gguf");
    let budgets = |mb: &[u64]| SplitOptions { device_mem_mb: Some(mb.to_vec()), ..SplitOptions::default() };
    let layers = |e: &Engine| e.info().parts.iter().map(|p: &ModelPart| p.layers.clone()).collect::<Vec<_>>();

    let whole = split_engine(&path, "llvmpipe,llvmpipe", budgets(&[64, 64])).unwrap();
    let n = whole.config().n_layer;
    assert_eq!(layers(&whole), vec![0..n], "fits the first device: not split");
    let jobs = vec![Job::greedy(common::ids(&common::json(common::shared().join("golden/families/qwen3/1.json"))["prompt_token_ids"]), 16)];
    let want = together(&whole, &jobs);
    drop(whole);

    // Too large for the first device alone (about 6 MiB, 3 MiB of it each device's
    // activations and attention partials): spread 1:1, then 5:8 by the budgets.
    let opts =
        LoadOptions { backend: BackendKind::Gpu, device: Some("llvmpipe,llvmpipe".into()), split: budgets(&[5, 5]), self_test: true, ..LoadOptions::exact() };
    let even = Engine::load_path(&path, &opts).unwrap();
    assert_eq!(layers(&even), vec![0..cut(n, 0.5), cut(n, 0.5)..n]);
    // The self-test ran across the split: embedding and layer 0 on one device, head on the other.
    let report = even.info().self_test.as_ref().expect("the self-test ran");
    assert!(report.adapter.contains(" + "), "{}", report.adapter);
    let got = together(&even, &jobs);
    assert_eq!(got[0].ids, want[0].ids, "the split's greedy ids differ from the whole model's");
    assert_eq!(got[0].logits, want[0].logits, "one adapter twice runs the same kernels: the logits must be equal bit for bit");
    drop(even);
    let uneven = split_engine(&path, "llvmpipe,llvmpipe", budgets(&[5, 8])).unwrap();
    let at = cut(n, 5.0 / 13.0);
    assert_eq!(layers(&uneven), vec![0..at, at..n]);
    drop(uneven);

    // Far too small: refused before any weight is loaded, with what it needs.
    let err = split_engine(&path, "llvmpipe,llvmpipe", budgets(&[1, 1])).err().expect("a model larger than both budgets loaded");
    let msg = err.to_string();
    assert!(msg.contains("needs about") && msg.contains("2.0 MiB in all"), "{msg}");
}

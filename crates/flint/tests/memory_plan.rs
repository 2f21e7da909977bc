//! The memory plan against what wgpu's allocator reports after loading: for the two test
//! models (and any listed in `FLINT_PLAN_MODELS`, colon-separated: the bench's 7B shapes), at
//! two contexts and sequence counts and with f16 and q8_0 KV caches, the plan's total is within 5% of the bytes
//! allocated on the device (about 0.5 MiB of small buffers, uniforms and the sampler's state,
//! are not in the plan: a tiny model is off by more than 5% for them). And `flint info`'s
//! plan (from the header alone) equals the loaded engine's.

use std::sync::Mutex;

use flint::{BackendKind, Engine, GgufFile, KvType, LoadOptions};

/// The allocator counts every model on the (shared) device: one test loads at a time.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

#[test]
fn the_plan_matches_the_allocator_within_five_percent() {
    if flint_gpu::testing::context().is_none() {
        return;
    }
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let mut models = vec![flint_core::testing::model_path("gemma-3-270m"), flint_core::testing::model_path("qwen2.5-coder-0.5b")];
    models.extend(std::env::var("FLINT_PLAN_MODELS").iter().flat_map(|v| v.split(':').map(std::path::PathBuf::from)));
    for path in &models {
        for (n_ctx, max_seqs, cache_k, cache_v) in
            [(1024, 1, KvType::F32, KvType::F32), (4096, 4, KvType::F32, KvType::F32), (2048, 2, KvType::Q8_0, KvType::F16)]
        {
            let opts = LoadOptions { backend: BackendKind::Gpu, n_ctx, max_seqs, self_test: false, cache_k, cache_v, ..LoadOptions::default() };
            let from_header = flint::memory_plan(&GgufFile::open(path).unwrap(), &opts).unwrap();
            let engine = Engine::load_path(path, &opts).unwrap();
            let plan = engine.info().memory;
            let Some(allocated) = engine.info().allocated_bytes() else {
                eprintln!("{}: the backend reports no allocations", path.display());
                return;
            };
            let ratio = plan.total() as f64 / allocated as f64;
            eprintln!("{} ctx {n_ctx} × {max_seqs}: plan {} B, allocated {allocated} B ({ratio:.4})\n{}", path.display(), plan.total(), plan.describe(None));
            assert!((ratio - 1.0).abs() <= 0.05, "{}: plan {} vs allocated {allocated}", path.display(), plan.total());
            assert_eq!(from_header.weights, plan.weights);
            assert_eq!(from_header.total(), plan.total(), "the header's plan is the loaded engine's");
            drop(engine);
        }
    }
}

#[test]
fn a_device_too_small_for_the_plan_is_refused_with_its_figures() {
    if flint_gpu::testing::context().is_none() {
        return;
    }
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let path = flint_core::testing::model_path("qwen2.5-coder-0.5b");
    let mut opts = LoadOptions { backend: BackendKind::Gpu, n_ctx: 1024, self_test: false, ..LoadOptions::default() };
    let plan = flint::memory_plan(&GgufFile::open(&path).unwrap(), &opts).unwrap();
    let mb = plan.total() >> 20;
    // The plan is checked when the devices are planned, before the weights are read.
    opts.split.device_mem_mb = Some(vec![mb / 2]);
    let e = Engine::load_path(&path, &opts).err().expect("a device of half the plan is refused");
    let text = e.to_string();
    assert!(matches!(e, flint::EngineError::Split(_)), "{text}");
    assert!(text.contains("needs about") && text.contains(&format!("{:.1} MiB", (mb / 2) as f64)), "{text}");
    // Room for it: it loads.
    opts.split.device_mem_mb = Some(vec![mb + mb / 10]);
    assert!(Engine::load_path(&path, &opts).is_ok());
}

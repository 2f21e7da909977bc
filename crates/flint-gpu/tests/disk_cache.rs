//! The driver's pipeline cache on disk: a context saves what it compiled, the next reads it
//! back, and a damaged or foreign file is ignored rather than trusted or fatal.
//! One test in this binary: it sets `FLINT_PIPELINE_CACHE` for the process.

use flint_gpu::disk_cache::ENV;
use flint_gpu::pipeline::PipelineKey;
use flint_gpu::shader::ShaderDefs;
use flint_gpu::GpuContext;

/// A context on the test adapter; None (a loud skip) without one unless FLINT_REQUIRE_GPU=1.
fn open() -> Option<GpuContext> {
    match futures::executor::block_on(GpuContext::new()) {
        Ok(ctx) => Some(ctx),
        Err(e) if std::env::var("FLINT_REQUIRE_GPU").is_ok_and(|v| v == "1") => panic!("FLINT_REQUIRE_GPU=1 but no adapter: {e}"),
        Err(e) => {
            eprintln!("SKIPPING GPU TEST: {e}");
            None
        }
    }
}

fn compile_one(ctx: &GpuContext) {
    let key = PipelineKey::new("add.wgsl", "main", ShaderDefs::new().u32("WG", 64).flag("BIAS", false));
    futures::executor::block_on(ctx.pipelines.get(ctx, &key)).unwrap();
    ctx.check().unwrap();
}

#[test]
fn pipelines_are_saved_read_back_and_a_damaged_file_is_ignored() {
    let dir = std::env::temp_dir().join(format!("flint-pipeline-cache-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::env::set_var(ENV, &dir);
    let Some(ctx) = open() else { return };
    if !ctx.adapter.features().contains(wgpu::Features::PIPELINE_CACHE) {
        assert!(ctx.pipelines.disk_path().is_none(), "no cache without the feature");
        eprintln!("{} has no pipeline cache: nothing kept on disk", ctx.adapter_name());
        return;
    }
    let path = ctx.pipelines.disk_path().expect("a cache file for a Vulkan adapter").to_path_buf();
    assert!(path.starts_with(&dir), "{} is not under {}", path.display(), dir.display());
    compile_one(&ctx);
    ctx.pipelines.save();
    let saved = std::fs::read(&path).expect("the cache was saved");
    assert!(!saved.is_empty());
    drop(ctx);

    // Read back: the next context starts from the file and still compiles and saves.
    let ctx = open().unwrap();
    compile_one(&ctx);
    drop(ctx);
    assert!(path.exists());

    // Damaged (truncated, then garbage): ignored, the kernel compiles as if there were none.
    for bad in [saved[..saved.len() / 2].to_vec(), vec![0xA5; 4096]] {
        std::fs::write(&path, &bad).unwrap();
        let ctx = open().unwrap();
        compile_one(&ctx);
    }
    std::env::set_var(ENV, "off");
    assert!(open().unwrap().pipelines.disk_path().is_none(), "off turns it off");
    std::fs::remove_dir_all(&dir).unwrap();
}

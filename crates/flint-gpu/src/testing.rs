//! The one harness of the GPU op tests: a shared context (a missing adapter is a loud skip,
//! or a failure when `FLINT_REQUIRE_GPU=1`), submit, sentinels, tolerance presets, seeded
//! data, and a case runner that runs every case of a test and reports every failing one.

#![cfg(not(target_arch = "wasm32"))]

use std::fmt::Debug;
use std::future::Future;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::OnceLock;
use std::time::Instant;

use crate::context::GpuContext;
use crate::pipeline::PipelineCache;

static CONTEXT: OnceLock<Option<GpuContext>> = OnceLock::new();
static PIPELINES: OnceLock<PipelineCache> = OnceLock::new();
static GPU_LIKE: [OnceLock<(GpuContext, PipelineCache)>; 2] = [OnceLock::new(), OnceLock::new()];

/// The shared test context, or None (with a message) when there is no adapter and the
/// environment does not require one. Panics when `FLINT_REQUIRE_GPU=1` and none is found.
pub fn context() -> Option<&'static GpuContext> {
    CONTEXT
        .get_or_init(|| match futures::executor::block_on(GpuContext::new()) {
            Ok(ctx) => {
                eprintln!("GPU tests on {}", ctx.adapter_name());
                Some(ctx)
            }
            Err(e) => {
                if std::env::var("FLINT_REQUIRE_GPU").is_ok_and(|v| v == "1") {
                    panic!("FLINT_REQUIRE_GPU=1 but no GPU adapter is usable: {e}");
                }
                eprintln!("SKIPPING GPU TEST: {e} (set FLINT_REQUIRE_GPU=1 to make this a failure)");
                None
            }
        })
        .as_ref()
}

/// Runs a GPU test body with the shared context, or reports loudly that it could not run.
#[macro_export]
macro_rules! gpu_test {
    ($ctx:ident => $body:block) => {{
        let Some($ctx) = $crate::testing::context() else { return };
        futures::executor::block_on(async move $body)
    }};
}

/// The pipeline cache of the shared context, so that a test binary compiles each kernel once.
/// Call it where [`context`] is Some.
pub fn pipelines() -> &'static PipelineCache {
    PIPELINES.get_or_init(|| PipelineCache::for_context(context().expect("pipelines() without a GPU context")))
}

/// A second context on the shared adapter, told it is not CPU-like, with its own pipeline
/// cache: the kernels a discrete GPU takes (lanes sharing a row; subgroup shuffles unless
/// `subgroups` is false) then run on lavapipe and SwiftShader too. None (a skip) where
/// [`context`] is None. It blocks on the device, so call it from the test function, not from
/// inside a case's future.
pub fn gpu_like(subgroups: bool) -> Option<&'static (GpuContext, PipelineCache)> {
    context()?;
    Some(GPU_LIKE[subgroups as usize].get_or_init(|| {
        let mut ctx = futures::executor::block_on(GpuContext::new()).expect("a second context on the shared adapter");
        ctx.caps.cpu_like = false;
        if !subgroups {
            ctx.caps.subgroups = false;
            ctx.caps.subgroup_min_size = 0;
        }
        eprintln!("{} as a GPU, subgroups {} (smallest {})", ctx.adapter_name(), ctx.caps.subgroups, ctx.caps.subgroup_min_size);
        let cache = PipelineCache::for_context(&ctx);
        (ctx, cache)
    }))
}

/// A fresh context on the shared adapter told it is a GPU (as [`gpu_like`], with subgroups
/// where the adapter has them) and given the shape knobs `tune` (`FLINT_TUNE`'s syntax), so
/// that a test runs the variants a tuned run would (its own pipeline cache compiles with the
/// runtime checks `tune` names). None without an adapter.
pub fn gpu_tuned(tune: &str) -> Option<GpuContext> {
    context()?;
    let mut ctx = futures::executor::block_on(GpuContext::new()).expect("a second context on the shared adapter");
    ctx.caps.cpu_like = false;
    ctx.caps.tune = crate::tune::Tuning::parse(tune).expect("a valid tuning");
    ctx.pipelines = PipelineCache::for_context(&ctx);
    Some(ctx)
}

/// Runs `run` on a fresh [`gpu_tuned`] context (tuned `tune`) for each setting of wgpu's runtime
/// checks (`FLINT_TUNE` `loop_bounding`, `bounds_checks`): every check, no loop counters (the
/// GPUs' default), and no bounds checks either. A kernel with no endless loop and no index out
/// of range computes the same bits under all three, so each run's labelled results must equal
/// the first setting's; a clamp that changed what a kernel read would show. Returns at once
/// without an adapter.
pub fn assert_same_whatever_the_checks<T: PartialEq>(tune: &str, run: impl Fn(&mut GpuContext) -> Vec<(String, T)>) {
    let mut first: Option<(&str, Vec<(String, T)>)> = None;
    for checks in ["loop_bounding=on", "loop_bounding=off", "loop_bounding=off,bounds_checks=off"] {
        let Some(mut ctx) = gpu_tuned(&format!("{checks},{tune}")) else { return };
        let got = run(&mut ctx);
        match &first {
            None => first = Some((checks, got)),
            Some((was, want)) => {
                assert_eq!(got.len(), want.len(), "results with checks {checks:?} and {was:?}");
                for ((label, g), (_, w)) in got.iter().zip(want) {
                    assert!(g == w, "{label}: the result with checks {checks:?} differs from that with {was:?}");
                }
            }
        }
    }
}

/// Records one compute pass with `f` and submits it: one encoder, one pass, one submit.
pub fn submit(ctx: &GpuContext, f: impl FnOnce(&mut wgpu::ComputePass<'_>)) {
    let mut enc = ctx.device.create_command_encoder(&Default::default());
    {
        let mut pass = enc.begin_compute_pass(&Default::default());
        f(&mut pass);
    }
    ctx.queue.submit([enc.finish()]);
}

/// Written into every f32 cell an op must leave alone: exact in f32, far from any test value.
pub const SENTINEL: f32 = -12345.5;
/// Written into every u32 cell (ids, counts, lists) an op must leave alone.
pub const SENTINEL_U32: u32 = 0xdead_beef;

/// A cell type with a sentinel, compared bit for bit.
pub trait Sentinel: Copy + Debug {
    const SENTINEL: Self;
    fn is_sentinel(self) -> bool;
}

impl Sentinel for f32 {
    const SENTINEL: f32 = SENTINEL;
    fn is_sentinel(self) -> bool {
        self.to_bits() == SENTINEL.to_bits()
    }
}

impl Sentinel for u32 {
    const SENTINEL: u32 = SENTINEL_U32;
    fn is_sentinel(self) -> bool {
        self == SENTINEL_U32
    }
}

/// `data` followed by sentinels up to `cap` cells (a buffer for the op's most tokens).
pub fn padded<T: Sentinel>(data: &[T], cap: usize) -> Vec<T> {
    assert!(data.len() <= cap, "{} cells do not fit in {cap}", data.len());
    let mut v = data.to_vec();
    v.resize(cap, T::SENTINEL);
    v
}

/// Panics unless every cell of `cells`, a range the op must not write, still holds the
/// sentinel; the message says `what`, how many cells changed and the first one.
pub fn assert_untouched<T: Sentinel>(cells: &[T], what: &str) {
    let mut changed = cells.iter().enumerate().filter(|(_, v)| !v.is_sentinel());
    if let Some((first, v)) = changed.next() {
        let n = 1 + changed.count();
        panic!("{what}: {n} of {} sentinel cells overwritten, the first at +{first} ({v:?})", cells.len());
    }
}

/// Runs `run` on every case with the shared context (a loud skip without an adapter, a
/// failure when `FLINT_REQUIRE_GPU=1`), each case on its own: a case that panics, or leaves a
/// device error behind, does not stop the rest. At the end it panics listing every failing
/// case (its `Debug` label and message) and how many passed. A test function calls it (it
/// blocks on each case), never a future.
pub fn run_cases<C, F, Fut>(test: &str, cases: impl IntoIterator<Item = C>, run: F)
where
    C: Debug,
    F: Fn(&'static GpuContext, C) -> Fut,
    Fut: Future<Output = ()>,
{
    if let Some(ctx) = context() {
        run_cases_on(ctx, test, cases, run);
    }
}

/// [`run_cases`] on another context than the shared one (e.g. [`gpu_like`]'s), whose device
/// errors it then checks after each case.
pub fn run_cases_on<C, F, Fut>(ctx: &'static GpuContext, test: &str, cases: impl IntoIterator<Item = C>, run: F)
where
    C: Debug,
    F: Fn(&'static GpuContext, C) -> Fut,
    Fut: Future<Output = ()>,
{
    let cases: Vec<C> = cases.into_iter().collect();
    assert!(!cases.is_empty(), "{test}: no cases");
    let n = cases.len();
    let mut failed = Vec::new();
    for case in cases {
        let label = format!("{case:?}");
        let t0 = Instant::now();
        let outcome = catch_unwind(AssertUnwindSafe(|| futures::executor::block_on(run(ctx, case))));
        // A device error the case left behind is its failure, not the next case's.
        let error = match (outcome, ctx.check()) {
            (Ok(()), Ok(())) => None,
            (Ok(()), Err(e)) => Some(format!("device error: {e}")),
            (Err(p), Ok(())) => Some(panic_message(p.as_ref())),
            (Err(p), Err(e)) => Some(format!("{}; then device error: {e}", panic_message(p.as_ref()))),
        };
        eprintln!("{test} [{label}]: {} in {:.2?}", if error.is_some() { "FAILED" } else { "ok" }, t0.elapsed());
        if let Some(e) = error {
            failed.push(format!("  {label}\n    {e}"));
        }
    }
    if !failed.is_empty() {
        panic!("{test}: {} of {n} cases failed, {} passed:\n{}", failed.len(), n - failed.len(), failed.join("\n"));
    }
}

fn panic_message(p: &(dyn std::any::Any + Send)) -> String {
    p.downcast_ref::<String>().cloned().or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string())).unwrap_or_else(|| "a panic without a message".into())
}

/// One `#[test]` per `name => cases` pair, each running its cases (anything iterable whose
/// items are `Debug`) through [`run_cases`](crate::testing::run_cases) with the async case
/// function given first (`async fn(&GpuContext, Case)`):
///
/// ```ignore
/// flint_gpu::op_tests! { run;
///     add_residual => cases(AddKind::Residual),
///     add_bias => [Case { kind: AddKind::Bias, n: 100, n_tok: 3 }],
/// }
/// ```
#[macro_export]
macro_rules! op_tests {
    ($run:expr; $($(#[$attr:meta])* $name:ident => $cases:expr),+ $(,)?) => {
        $(
            $(#[$attr])*
            #[test]
            fn $name() {
                $crate::testing::run_cases(stringify!($name), $cases, $run);
            }
        )+
    };
}

pub use flint_core::testing::{model_path, models_dir, nmse, shared_dir};

/// Edited logits against the CPU's: None unless `got` is non-finite exactly where `want` is
/// (banned and masked tokens), else the NMSE over the finite values (0 when there are none).
/// A GPU may divide within 2.5 ulp and fuse a multiply with an add, so edits are compared
/// within f32 rounding, not bit for bit.
pub fn finite_nmse(got: &[f32], want: &[f32]) -> Option<f64> {
    assert_eq!(got.len(), want.len(), "length mismatch");
    if got.iter().zip(want).any(|(g, w)| g.is_finite() != w.is_finite()) {
        return None;
    }
    let (g, w): (Vec<f32>, Vec<f32>) = got.iter().zip(want).filter(|(_, w)| w.is_finite()).map(|(g, w)| (*g, *w)).unzip();
    Some(if w.is_empty() { 0.0 } else { nmse(&g, &w) })
}

/// Tolerance presets (llama.cpp's test-backend-ops).
pub const NMSE_F32: f64 = 1e-7;
pub const NMSE_QUANT: f64 = 5e-4;

/// A small deterministic generator for test data.
pub struct TestRng(u64);

impl TestRng {
    pub fn new(seed: u64) -> Self {
        TestRng(seed ^ 0x9E37_79B9_7F4A_7C15)
    }
    pub fn next_u32(&mut self) -> u32 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 >> 32) as u32
    }
    /// Uniform in [-1, 1).
    pub fn f32(&mut self) -> f32 {
        self.next_u32() as f32 / 2_147_483_648.0 - 1.0
    }
    pub fn vec(&mut self, n: usize) -> Vec<f32> {
        (0..n).map(|_| self.f32()).collect()
    }
    pub fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next_u32() as u8).collect()
    }
}

/// Encodes one f16 value for [`random_quant`]; may draw from the generator (e.g. to mix in
/// subnormals).
pub type F16Encoder = fn(f32, &mut TestRng) -> u16;

/// Plain round-to-nearest f16 bits.
pub fn f16_nearest(v: f32, _: &mut TestRng) -> u16 {
    half::f16::from_f32(v).to_bits()
}

/// Seeded random data of `ty` for `n_elems` elements: random quant payloads whose f16 scales
/// are small finite values (`0.004 + 0.02·u`, encoded by `f16`), never NaN or inf.
pub fn random_quant(ty: flint_core::quant::QuantType, n_elems: usize, rng: &mut TestRng, f16: F16Encoder) -> Vec<u8> {
    use flint_core::quant::{
        BlockIQ4NL, BlockIQ4XS, BlockQ2K, BlockQ3K, BlockQ4K, BlockQ4_0, BlockQ4_1, BlockQ5K, BlockQ5_0, BlockQ5_1, BlockQ6K, BlockQ8_0, QuantType,
    };

    fn patch<B: bytemuck::Pod>(bytes: &mut [u8], f: impl FnOnce(&mut B)) {
        let mut b: B = bytemuck::pod_read_unaligned(bytes);
        f(&mut b);
        bytes.copy_from_slice(bytemuck::bytes_of(&b));
    }
    let scale = |rng: &mut TestRng| {
        let v = 0.004 + 0.02 * rng.f32();
        f16(v, rng)
    };
    match ty {
        QuantType::F32 => bytemuck::cast_slice(&rng.vec(n_elems)).to_vec(),
        QuantType::F16 => (0..n_elems)
            .flat_map(|_| {
                let v = rng.f32();
                f16(v, rng).to_le_bytes()
            })
            .collect(),
        QuantType::BF16 => rng.vec(n_elems).into_iter().flat_map(|v| half::bf16::from_f32(v).to_bits().to_le_bytes()).collect(),
        _ => {
            let mut bytes = rng.bytes(n_elems / ty.block_elems() * ty.block_bytes());
            for b in bytes.chunks_exact_mut(ty.block_bytes()) {
                match ty {
                    QuantType::Q4_0 => patch(b, |b: &mut BlockQ4_0| b.d = scale(rng)),
                    QuantType::Q4_1 => patch(b, |b: &mut BlockQ4_1| (b.d, b.m) = (scale(rng), scale(rng))),
                    QuantType::Q5_0 => patch(b, |b: &mut BlockQ5_0| b.d = scale(rng)),
                    QuantType::Q5_1 => patch(b, |b: &mut BlockQ5_1| (b.d, b.m) = (scale(rng), scale(rng))),
                    QuantType::Q8_0 => patch(b, |b: &mut BlockQ8_0| b.d = scale(rng)),
                    QuantType::Q4K => patch(b, |b: &mut BlockQ4K| (b.d, b.dmin) = (scale(rng), scale(rng))),
                    QuantType::Q5K => patch(b, |b: &mut BlockQ5K| (b.d, b.dmin) = (scale(rng), scale(rng))),
                    QuantType::Q6K => patch(b, |b: &mut BlockQ6K| b.d = scale(rng)),
                    QuantType::Q2K => patch(b, |b: &mut BlockQ2K| (b.d, b.dmin) = (scale(rng), scale(rng))),
                    QuantType::Q3K => patch(b, |b: &mut BlockQ3K| b.d = scale(rng)),
                    QuantType::IQ4NL => patch(b, |b: &mut BlockIQ4NL| b.d = scale(rng)),
                    QuantType::IQ4XS => patch(b, |b: &mut BlockIQ4XS| b.d = scale(rng)),
                    QuantType::F32 | QuantType::F16 | QuantType::BF16 => unreachable!("float formats handled above"),
                }
            }
            bytes
        }
    }
}

/// `VK_ICD_FILENAMES` naming both software Vulkan devices: Mesa's lavapipe and SwiftShader
/// (which Debian's chromium ships), for tests that run on two different adapters at once.
/// Panics when either is missing.
pub fn lavapipe_and_swiftshader_icds() -> String {
    let lvp = std::fs::read_dir("/usr/share/vulkan/icd.d")
        .expect("mesa's Vulkan ICDs")
        .flatten()
        .map(|e| e.path())
        .find(|p| p.file_name().is_some_and(|n| n.to_string_lossy().starts_with("lvp_icd")))
        .expect("lavapipe's ICD file");
    let swiftshader = std::path::Path::new("/usr/lib/chromium/vk_swiftshader_icd.json");
    assert!(swiftshader.exists(), "{} is missing (Debian's chromium ships it)", swiftshader.display());
    format!("{}:{}", lvp.display(), swiftshader.display())
}

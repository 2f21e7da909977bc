//! The wgpu device: adapter choice (best available; an index or a name substring — `--device`,
//! `FLINT_ADAPTER` — picks one of those [`adapters`] lists), the adapter's
//! own limits, optional features, the pipelines compiled for it, and errors captured instead
//! of panicking.

use std::sync::{Arc, Mutex};

use crate::error::{GpuError, Result};
use crate::pipeline::PipelineCache;

/// Optional capabilities the kernels may use; every kernel has a path without them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Caps {
    pub shader_f16: bool,
    pub subgroups: bool,
    /// The adapter's smallest subgroup (0 without subgroups): kernels that need a group of
    /// lanes inside one subgroup use subgroup operations only up to this size.
    pub subgroup_min_size: u32,
    pub timestamps: bool,
    /// A CPU-type adapter (lavapipe, SwiftShader): its invocations run as SIMD lanes of CPU
    /// threads, where cross-lane reductions and barriers cost more than uncoalesced reads.
    pub cpu_like: bool,
    /// The GPU kernels' shape knobs (`FLINT_TUNE`, see [`crate::tune`]).
    pub tune: crate::tune::Tuning,
}

/// Errors reported by wgpu outside error scopes, collected until the next check.
#[derive(Default)]
struct ErrorSink {
    errors: Vec<GpuError>,
    lost: Option<String>,
}

pub struct GpuContext {
    pub adapter: wgpu::Adapter,
    pub device: wgpu::Device,
    pub queue: wgpu::Queue,
    pub limits: wgpu::Limits,
    pub caps: Caps,
    pub info: wgpu::AdapterInfo,
    /// Every pipeline compiled on this device, shared by the models loaded on it.
    pub pipelines: PipelineCache,
    /// A test-only switch (`FLINT_TEST_WRONG_KERNEL=glu`, native): the op it names builds a
    /// deliberately wrong variant, so that the self-test's failure path can be shown.
    pub wrong_kernel: Option<String>,
    /// A test-only switch (`FLINT_TEST_FAIL_ALLOC=kv|weights|activations`, native): that part
    /// of a model's load fails as if the device were out of memory, since lavapipe overcommits
    /// host memory and never does.
    pub fail_alloc: Option<String>,
    sink: Arc<Mutex<ErrorSink>>,
}

fn runtime_checks(caps: &Caps, info: &wgpu::AdapterInfo) -> wgpu::ShaderRuntimeChecks {
    caps.tune.runtime_checks(info.device_type == wgpu::DeviceType::Cpu)
}

/// The process's contexts (native), one per adapter choice and ordinal: see
/// [`GpuContext::shared_nth`].
#[cfg(not(target_arch = "wasm32"))]
static SHARED: Mutex<Vec<(SharedKey, Arc<GpuContext>)>> = Mutex::new(Vec::new());

/// The adapter choice (None: the default) and which device opened on it.
#[cfg(not(target_arch = "wasm32"))]
type SharedKey = (Option<String>, usize);

/// An adapter wgpu finds (native), as `flint devices` lists it: its index (the `--device`
/// number), its description and the limits it reports.
#[derive(Clone, Debug)]
pub struct AdapterEntry {
    pub index: usize,
    pub info: wgpu::AdapterInfo,
    pub limits: wgpu::Limits,
    /// The subgroup sizes the adapter reports (0, 0 without subgroups).
    pub subgroup_sizes: (u32, u32),
    /// The matrix multiply-accumulate tiles its cooperative-matrix extension lists (tensor
    /// cores), as `MxNxK A->C` (e.g. `16x16x16 f16->f32`); empty where it lists none.
    pub cooperative_matrices: Vec<String>,
}

/// `m×n×k a→c` of one cooperative-matrix configuration.
#[cfg(not(target_arch = "wasm32"))]
fn matrix_config(p: &wgpu::CooperativeMatrixProperties) -> String {
    let ty = |t: wgpu::CooperativeScalarType| format!("{t:?}").to_lowercase();
    let sat = if p.saturating_accumulation { " (saturating)" } else { "" };
    format!("{}x{}x{} {}->{}{sat}", p.m_size, p.n_size, p.k_size, ty(p.ab_type), ty(p.cr_type))
}

/// Every adapter wgpu finds, in its enumeration order (the order `--device` indexes).
#[cfg(not(target_arch = "wasm32"))]
pub async fn adapters() -> Vec<AdapterEntry> {
    let instance = wgpu::Instance::new(wgpu::InstanceDescriptor::new_without_display_handle_from_env());
    instance
        .enumerate_adapters(wgpu::Backends::all())
        .await
        .iter()
        .enumerate()
        .map(|(index, a)| {
            let info = a.get_info();
            let subgroups = a.features().contains(wgpu::Features::SUBGROUP);
            let subgroup_sizes = if subgroups { (info.subgroup_min_size, info.subgroup_max_size) } else { (0, 0) };
            let cooperative_matrices = a.cooperative_matrix_properties().iter().map(matrix_config).collect();
            AdapterEntry { index, info, limits: a.limits(), subgroup_sizes, cooperative_matrices }
        })
        .collect()
}

/// The adapter `wanted` names among `names` (enumeration order): a number is an index, other
/// text a case-insensitive substring of the name (the first that contains it).
pub fn choose_adapter(names: &[String], wanted: &str) -> Result<usize> {
    let none = || GpuError::NoAdapter { wanted: Some(wanted.to_string()), found: names.to_vec(), cause: None };
    if let Ok(i) = wanted.trim().parse::<usize>() {
        return if i < names.len() { Ok(i) } else { Err(none()) };
    }
    let lw = wanted.to_lowercase();
    names.iter().position(|n| n.to_lowercase().contains(&lw)).ok_or_else(none)
}

impl std::fmt::Debug for GpuContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GpuContext").field("adapter", &self.info.name).field("caps", &self.caps).finish()
    }
}

fn rank(ty: wgpu::DeviceType) -> u32 {
    match ty {
        wgpu::DeviceType::DiscreteGpu => 4,
        wgpu::DeviceType::IntegratedGpu => 3,
        wgpu::DeviceType::VirtualGpu => 2,
        wgpu::DeviceType::Cpu => 1,
        wgpu::DeviceType::Other => 0,
    }
}

impl GpuContext {
    /// The process's device, opened on first use (as [`GpuContext::new`]) and kept, so every
    /// model a process loads shares one device and the pipelines compiled for it — on a
    /// CPU-type adapter a model's kernels take tens of seconds to compile. Opened again once
    /// the device is lost. Errors wgpu reports outside error scopes reach whichever model
    /// checks first.
    #[cfg(not(target_arch = "wasm32"))]
    pub async fn shared() -> Result<Arc<GpuContext>> {
        Self::shared_on(None).await
    }

    /// [`GpuContext::shared`] on the adapter `device` names (an index or a name substring;
    /// None: `FLINT_ADAPTER` or the best): one context per choice, kept for the process.
    #[cfg(not(target_arch = "wasm32"))]
    pub async fn shared_on(device: Option<&str>) -> Result<Arc<GpuContext>> {
        Self::shared_nth(device, 0).await
    }

    /// The `nth` device opened on the adapter `device` names, kept for the process as
    /// [`GpuContext::shared_on`] keeps the first: a model split over one adapter named twice
    /// runs on two devices of it.
    #[cfg(not(target_arch = "wasm32"))]
    pub async fn shared_nth(device: Option<&str>, nth: usize) -> Result<Arc<GpuContext>> {
        let key = (device.map(str::to_string), nth);
        let lock = || SHARED.lock().map_err(|_| GpuError::DeviceLost { cause: "shared context poisoned".into() });
        let find = |g: &[(SharedKey, Arc<GpuContext>)]| g.iter().find(|(k, c)| *k == key && !c.is_lost()).map(|(_, c)| c.clone());
        if let Some(ctx) = find(&lock()?) {
            return Ok(ctx);
        }
        let fresh = Arc::new(match device {
            Some(d) => GpuContext::with_adapter(Some(d)).await?,
            None => GpuContext::new().await?,
        });
        let mut g = lock()?;
        // Another thread may have opened one meanwhile: keep the first.
        if let Some(ctx) = find(&g) {
            return Ok(ctx);
        }
        g.retain(|(k, c)| *k != key || !c.is_lost());
        g.push((key, fresh.clone()));
        Ok(fresh)
    }

    /// Opens the best adapter, or the one `FLINT_ADAPTER` names (see [`choose_adapter`]).
    pub async fn new() -> Result<GpuContext> {
        let wanted = std::env::var("FLINT_ADAPTER").ok().filter(|s| !s.is_empty());
        Self::with_adapter(wanted.as_deref()).await
    }

    pub async fn with_adapter(wanted: Option<&str>) -> Result<GpuContext> {
        let instance = wgpu::Instance::new(wgpu::InstanceDescriptor::new_without_display_handle_from_env());
        let adapter = pick_adapter(&instance, wanted).await?;
        let info = adapter.get_info();
        let limits = adapter.limits();
        let features = adapter.features();
        let switch = |name: &str| {
            #[cfg(not(target_arch = "wasm32"))]
            return std::env::var(name).ok().filter(|s| !s.is_empty());
            #[cfg(target_arch = "wasm32")]
            return {
                let _ = name;
                None
            };
        };
        let mut required = wgpu::Features::empty();
        // FLINT_NO_SUBGROUPS=1 (native) opens the device without subgroups, as a browser's
        // WebGPU may be: the kernels' fallbacks, measured on a real GPU.
        let subgroups = features.contains(wgpu::Features::SUBGROUP) && switch("FLINT_NO_SUBGROUPS").is_none();
        let caps = Caps {
            shader_f16: features.contains(wgpu::Features::SHADER_F16),
            subgroups,
            subgroup_min_size: if subgroups { info.subgroup_min_size } else { 0 },
            timestamps: features.contains(wgpu::Features::TIMESTAMP_QUERY),
            // FLINT_TEST_GPU_KERNELS=1 (a test-only switch, native) runs a CPU-type adapter as
            // a GPU: the GPU kernels and graph (lane teams, folded norms, split attention) then
            // run in CI on lavapipe.
            cpu_like: info.device_type == wgpu::DeviceType::Cpu && switch("FLINT_TEST_GPU_KERNELS").is_none(),
            tune: crate::tune::Tuning::from_env().map_err(|message| GpuError::Unsupported { op: "tuning", message })?,
        };
        // The driver's pipeline cache is kept on disk where the backend has one (Vulkan).
        let disk_path = crate::disk_cache::path_for(&info).filter(|_| features.contains(wgpu::Features::PIPELINE_CACHE));
        for (on, f) in [
            (caps.shader_f16, wgpu::Features::SHADER_F16),
            (caps.subgroups, wgpu::Features::SUBGROUP),
            (caps.timestamps, wgpu::Features::TIMESTAMP_QUERY),
            (disk_path.is_some(), wgpu::Features::PIPELINE_CACHE),
        ] {
            if on {
                required |= f;
            }
        }
        let (device, queue) = adapter
            .request_device(&wgpu::DeviceDescriptor {
                label: Some("flint"),
                required_features: required,
                required_limits: limits.clone(),
                experimental_features: wgpu::ExperimentalFeatures::disabled(),
                memory_hints: wgpu::MemoryHints::Performance,
                trace: wgpu::Trace::Off,
            })
            .await
            .map_err(|e| GpuError::RequestDevice { cause: e.to_string() })?;
        let sink = Arc::new(Mutex::new(ErrorSink::default()));
        let s = sink.clone();
        let device_name = adapter.get_info().name;
        device.on_uncaptured_error(Arc::new(move |e: wgpu::Error| {
            let err = match e {
                wgpu::Error::OutOfMemory { .. } => {
                    GpuError::OutOfMemory { what: "an allocation".into(), device: device_name.clone(), cause: Some(e.to_string()) }
                }
                other => GpuError::Validation { cause: other.to_string() },
            };
            if let Ok(mut g) = s.lock() {
                g.errors.push(err);
            }
        }));
        let s = sink.clone();
        device.set_device_lost_callback(move |reason, message| {
            if let Ok(mut g) = s.lock() {
                g.lost = Some(format!("{reason:?}: {message}"));
            }
        });
        let (wrong_kernel, fail_alloc) = (switch("FLINT_TEST_WRONG_KERNEL"), switch("FLINT_TEST_FAIL_ALLOC"));
        let pipelines = PipelineCache::with_checks(disk_path.map(|p| crate::disk_cache::DiskCache::open(&device, p)), runtime_checks(&caps, &info));
        Ok(GpuContext { adapter, device, queue, limits, caps, info, pipelines, wrong_kernel, fail_alloc, sink })
    }

    /// What wgpu compiles into this device's kernels to guard them at run time: the tuning's
    /// choice for a CPU-type adapter or a GPU (see [`crate::tune::Tuning::runtime_checks`]).
    pub fn runtime_checks(&self) -> wgpu::ShaderRuntimeChecks {
        runtime_checks(&self.caps, &self.info)
    }

    /// A short adapter description for reports: `llvmpipe (LLVM 15.0.6, 256 bits) (Vulkan, Cpu)`.
    pub fn adapter_name(&self) -> String {
        format!("{} ({:?}, {:?})", self.info.name, self.info.backend, self.info.device_type)
    }

    /// Runs `allocate` under an out-of-memory error scope: when the device cannot hold what it
    /// allocates, a typed [`GpuError::OutOfMemory`] saying what did not fit and how much was
    /// asked for (`what`, from the result) instead of a later, anonymous failure. `part`
    /// names it for the test-only switch `FLINT_TEST_FAIL_ALLOC`.
    pub async fn allocating<T>(&self, part: &str, allocate: impl std::future::Future<Output = Result<T>>, what: impl FnOnce(&T) -> String) -> Result<T> {
        let scope = self.device.push_error_scope(wgpu::ErrorFilter::OutOfMemory);
        let made = allocate.await;
        let oom = scope.pop().await;
        let made = made?;
        let name = &self.info.name;
        match oom {
            Some(e) => Err(GpuError::OutOfMemory { what: what(&made), device: name.clone(), cause: Some(e.to_string()) }),
            None if self.fail_alloc.as_deref() == Some(part) => {
                Err(GpuError::OutOfMemory { what: what(&made), device: name.clone(), cause: Some(format!("the test switch FLINT_TEST_FAIL_ALLOC={part}")) })
            }
            None => Ok(made),
        }
    }

    /// Whether the test-only switch asks op `op` for its wrong variant.
    pub fn wrong(&self, op: &str) -> bool {
        self.wrong_kernel.as_deref() == Some(op)
    }

    /// Whether wgpu reported the device lost.
    pub fn is_lost(&self) -> bool {
        self.lost_reason().is_some()
    }

    /// Why wgpu reported the device lost, if it did.
    pub fn lost_reason(&self) -> Option<String> {
        match self.sink.lock() {
            Ok(g) => g.lost.clone(),
            Err(_) => Some("error sink poisoned".into()),
        }
    }

    /// Returns the first error wgpu reported since the last check (device loss first).
    pub fn check(&self) -> Result<()> {
        let mut g = self.sink.lock().map_err(|_| GpuError::DeviceLost { cause: "error sink poisoned".into() })?;
        if let Some(l) = &g.lost {
            return Err(GpuError::DeviceLost { cause: l.clone() });
        }
        if !g.errors.is_empty() {
            let first = g.errors.remove(0);
            g.errors.clear();
            return Err(first);
        }
        Ok(())
    }

    /// Largest storage buffer binding, lowered by `FLINT_MAX_BINDING_MB` when set.
    pub fn max_binding(&self) -> u64 {
        let limit = self.limits.max_storage_buffer_binding_size.min(self.limits.max_buffer_size);
        match std::env::var("FLINT_MAX_BINDING_MB").ok().and_then(|v| v.parse::<u64>().ok()) {
            Some(mb) if mb > 0 => limit.min(mb << 20),
            _ => limit,
        }
    }

    /// Waits until the device has done the submitted work: natively by polling, in the
    /// browser through the queue's callback (which also hands the event loop its turn).
    pub async fn work_done(&self) -> Result<()> {
        self.work_done_through(None).await
    }

    /// [`GpuContext::work_done`] natively only through submission `index` (None: every
    /// submission so far), so work submitted after it keeps running; the browser waits for
    /// all.
    pub async fn work_done_through(&self, index: Option<wgpu::SubmissionIndex>) -> Result<()> {
        #[cfg(not(target_arch = "wasm32"))]
        {
            self.poll_wait_through(index)?;
        }
        #[cfg(target_arch = "wasm32")]
        {
            let _ = index;
            let (tx, rx) = futures::channel::oneshot::channel();
            self.queue.on_submitted_work_done(move || {
                let _ = tx.send(());
            });
            rx.await.map_err(|_| GpuError::DeviceLost { cause: "the queue dropped its work-done callback".into() })?;
        }
        self.check()
    }

    /// Waits for submitted work natively; a no-op in the browser, where mapping drives it.
    pub fn poll_wait(&self) -> Result<()> {
        self.poll_wait_through(None)
    }

    /// Whether the device has finished every submission, polled without waiting (natively:
    /// the browser cannot be asked).
    #[cfg(not(target_arch = "wasm32"))]
    pub fn idle(&self) -> Result<bool> {
        let status = self.device.poll(wgpu::PollType::Poll).map_err(|e| GpuError::DeviceLost { cause: e.to_string() })?;
        Ok(status.is_queue_empty())
    }

    /// Waits natively for submission `index` and those before it (None: the latest), not
    /// for any submitted after it; a no-op in the browser.
    pub fn poll_wait_through(&self, index: Option<wgpu::SubmissionIndex>) -> Result<()> {
        #[cfg(not(target_arch = "wasm32"))]
        self.device.poll(wgpu::PollType::Wait { submission_index: index, timeout: None }).map_err(|e| GpuError::DeviceLost { cause: e.to_string() })?;
        #[cfg(target_arch = "wasm32")]
        let _ = index;
        Ok(())
    }
}

async fn pick_adapter(instance: &wgpu::Instance, wanted: Option<&str>) -> Result<wgpu::Adapter> {
    #[cfg(not(target_arch = "wasm32"))]
    {
        let mut adapters = instance.enumerate_adapters(wgpu::Backends::all()).await;
        let names: Vec<String> = adapters.iter().map(|a| a.get_info().name).collect();
        if let Some(w) = wanted {
            let i = choose_adapter(&names, w)?;
            return Ok(adapters.swap_remove(i));
        }
        adapters.sort_by_key(|a| std::cmp::Reverse(rank(a.get_info().device_type)));
        adapters.into_iter().next().ok_or(GpuError::NoAdapter { wanted: None, found: Vec::new(), cause: None })
    }
    #[cfg(target_arch = "wasm32")]
    {
        let _ = (wanted, rank as fn(_) -> _, choose_adapter as fn(_, _) -> _);
        instance
            .request_adapter(&wgpu::RequestAdapterOptions {
                power_preference: wgpu::PowerPreference::HighPerformance,
                force_fallback_adapter: false,
                compatible_surface: None,
                apply_limit_buckets: false,
            })
            .await
            .map_err(|e| GpuError::NoAdapter { wanted: None, found: Vec::new(), cause: Some(e.to_string()) })
    }
}

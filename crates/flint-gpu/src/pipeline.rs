//! A typed pipeline cache: `PipelineKey { shader, entry, defs }` → compiled pipeline, each
//! labelled with its key so validation errors name the culprit.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use crate::context::GpuContext;
use crate::disk_cache::DiskCache;
use crate::error::{GpuError, Result};
use crate::shader::{preprocess, ShaderDefs};

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct PipelineKey {
    pub shader: &'static str,
    pub entry: &'static str,
    pub defs: ShaderDefs,
}

impl PipelineKey {
    pub fn new(shader: &'static str, entry: &'static str, defs: ShaderDefs) -> Self {
        PipelineKey { shader, entry, defs }
    }

    pub fn label(&self) -> String {
        let base = self.shader.trim_end_matches(".wgsl");
        let defs = self.defs.label();
        if defs.is_empty() {
            format!("{base}_{}", self.entry)
        } else {
            format!("{base}_{}[{defs}]", self.entry)
        }
    }
}

/// What the cache reports around each compile: a driver may take tens of seconds for its
/// first compile of a kernel on a device (lavapipe: ~35 s for a model's kernels), and a
/// caller shows that rather than sit silent.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CompileEvent {
    Start {
        label: String,
    },
    /// `compiled`: pipelines this cache has compiled so far.
    Done {
        label: String,
        compiled: usize,
    },
    /// A step that runs kernels for the first time starts or ends: a driver that compiles on
    /// first use (Mesa's llvmpipe) spends their compile inside it.
    FirstUse {
        done: bool,
    },
}

/// Called on the compiling thread, before and after each compile.
pub type CompileObserver = Arc<dyn Fn(&CompileEvent) + Send + Sync>;

/// Compiled pipelines by key; cloning shares the cache (and its observer).
#[derive(Clone)]
pub struct PipelineCache {
    map: Arc<Mutex<HashMap<PipelineKey, Arc<wgpu::ComputePipeline>>>>,
    observer: Arc<Mutex<Option<CompileObserver>>>,
    /// A kernel was recorded for its first dispatch since the last `take_first_use`.
    first_use: Arc<std::sync::atomic::AtomicBool>,
    /// The driver's cache kept on disk, where the device has one (see [`crate::disk_cache`]).
    disk: Option<Arc<DiskCache>>,
    /// What wgpu compiles into every kernel to guard it at run time (the tuning's
    /// `loop_bounding` and `bounds_checks`).
    checks: wgpu::ShaderRuntimeChecks,
}

impl PipelineCache {
    /// A cache for `ctx`'s device, compiling with the runtime checks its tuning asks of it
    /// ([`GpuContext::runtime_checks`]).
    pub fn for_context(ctx: &GpuContext) -> Self {
        Self::with_checks(None, ctx.runtime_checks())
    }

    /// A cache compiling with `checks`, through `disk` where given (and saved to it).
    pub fn with_checks(disk: Option<DiskCache>, checks: wgpu::ShaderRuntimeChecks) -> Self {
        PipelineCache { map: Default::default(), observer: Default::default(), first_use: Default::default(), disk: disk.map(Arc::new), checks }
    }

    /// The file the driver's cache is kept in, if any.
    pub fn disk_path(&self) -> Option<&std::path::Path> {
        self.disk.as_deref().map(DiskCache::path)
    }

    /// Writes the driver's cache to disk if kernels were compiled since the last save.
    pub fn save(&self) {
        if let Some(d) = &self.disk {
            d.save();
        }
    }

    /// Reports every later compile to `observer` (None: to nobody).
    pub fn set_observer(&self, observer: Option<CompileObserver>) {
        if let Ok(mut o) = self.observer.lock() {
            *o = observer;
        }
    }

    /// Notes that a kernel is being recorded for its first dispatch (a driver may compile it
    /// then).
    pub fn mark_first_use(&self) {
        self.first_use.store(true, std::sync::atomic::Ordering::Relaxed);
    }

    /// Whether a kernel was first recorded since the last call.
    pub fn take_first_use(&self) -> bool {
        self.first_use.swap(false, std::sync::atomic::Ordering::Relaxed)
    }

    /// Whether `key` is compiled.
    pub fn contains(&self, key: &PipelineKey) -> bool {
        self.map.lock().is_ok_and(|m| m.contains_key(key))
    }

    /// Tells the observer, if any, of `event`.
    pub fn notify(&self, event: &CompileEvent) {
        let observer = self.observer.lock().ok().and_then(|o| o.clone());
        if let Some(o) = observer {
            o(event);
        }
    }

    /// Compiles `key` on `device`, telling the observer.
    fn compile(&self, device: &wgpu::Device, key: &PipelineKey) -> Result<wgpu::ComputePipeline> {
        self.notify(&CompileEvent::Start { label: key.label() });
        let p = compile(device, key, self.checks, self.disk.as_deref());
        let compiled = self.map.lock().map_err(poisoned)?.len() + 1;
        self.notify(&CompileEvent::Done { label: key.label(), compiled });
        p
    }

    /// The pipeline for `key`, compiled on first use; compile errors become typed errors.
    pub async fn get(&self, ctx: &GpuContext, key: &PipelineKey) -> Result<Arc<wgpu::ComputePipeline>> {
        if let Some(p) = self.map.lock().map_err(poisoned)?.get(key) {
            return Ok(p.clone());
        }
        let scope = ctx.device.push_error_scope(wgpu::ErrorFilter::Validation);
        let pipeline = self.compile(&ctx.device, key)?;
        if let Some(e) = scope.pop().await {
            return Err(GpuError::Shader { shader: key.label(), message: e.to_string() });
        }
        let p = Arc::new(pipeline);
        self.map.lock().map_err(poisoned)?.insert(key.clone(), p.clone());
        Ok(p)
    }

    /// The pipeline for `key`, compiled now if it is not cached, without waiting for the
    /// device's verdict: for kernels built on first use inside a step, whose compile errors
    /// surface as the step's validation error (`GpuContext::check`). The key's source is
    /// preprocessed, so only the device can still refuse it.
    pub fn get_now(&self, device: &wgpu::Device, key: &PipelineKey) -> Result<Arc<wgpu::ComputePipeline>> {
        if let Some(p) = self.map.lock().map_err(poisoned)?.get(key) {
            return Ok(p.clone());
        }
        let p = Arc::new(self.compile(device, key)?);
        self.map.lock().map_err(poisoned)?.insert(key.clone(), p.clone());
        Ok(p)
    }
}

impl PipelineCache {
    /// Compiles every key of `keys` not yet cached, natively on up to as many threads as the
    /// machine has cores (wgpu devices compile from any thread), one after another in the
    /// browser. Errors are left for [`get_now`](Self::get_now) to meet again.
    pub fn build_all(&self, device: &wgpu::Device, mut keys: Vec<PipelineKey>) {
        keys.sort_by_cached_key(PipelineKey::label);
        keys.dedup();
        keys.retain(|k| self.map.lock().is_ok_and(|m| !m.contains_key(k)));
        #[cfg(not(target_arch = "wasm32"))]
        if keys.len() > 1 {
            self.build_in_parallel(device, &keys);
            self.save();
            return;
        }
        for key in &keys {
            let _ = self.get_now(device, key);
        }
        self.save();
    }

    #[cfg(not(target_arch = "wasm32"))]
    fn build_in_parallel(&self, device: &wgpu::Device, keys: &[PipelineKey]) {
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get()).min(keys.len());
        let next = std::sync::atomic::AtomicUsize::new(0);
        std::thread::scope(|s| {
            for _ in 0..threads {
                s.spawn(|| loop {
                    let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let Some(key) = keys.get(i) else { break };
                    let _ = self.get_now(device, key);
                });
            }
        });
    }
}

fn compile(device: &wgpu::Device, key: &PipelineKey, checks: wgpu::ShaderRuntimeChecks, disk: Option<&DiskCache>) -> Result<wgpu::ComputePipeline> {
    let source = preprocess(key.shader, &key.defs)?;
    let label = key.label();
    let desc = wgpu::ShaderModuleDescriptor { label: Some(&label), source: wgpu::ShaderSource::Wgsl(source.into()) };
    // SAFETY: the kernels are Flint's own, never a user's. The checks a tuning may turn off
    // guard against endless loops and out-of-range indices: every loop in `shaders/` ends by
    // construction (its bound is a constant or a host-validated size, its step a nonzero
    // constant or a count the loop tests first), and every index stays inside what the host
    // sized; the GPU op tests check each kernel against the CPU reference, with sentinels
    // around what it writes. wgpu still validates the module.
    let module = unsafe { device.create_shader_module_trusted(desc, checks) };
    Ok(device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
        label: Some(&label),
        layout: None,
        module: &module,
        entry_point: Some(key.entry),
        compilation_options: Default::default(),
        cache: disk.inspect(|d| d.touch()).map(|d| &d.cache),
    }))
}

fn poisoned<T>(_: T) -> GpuError {
    GpuError::DeviceLost { cause: "pipeline cache lock poisoned".into() }
}

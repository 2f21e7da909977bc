//! A typed pipeline cache: `PipelineKey { shader, entry, defs }` → compiled pipeline, each
//! labelled with its key so validation errors name the culprit.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use crate::context::GpuContext;
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

/// Compiled pipelines by key; cloning shares the cache.
#[derive(Clone, Default)]
pub struct PipelineCache {
    map: Arc<Mutex<HashMap<PipelineKey, Arc<wgpu::ComputePipeline>>>>,
}

impl PipelineCache {
    pub fn new() -> Self {
        Self::default()
    }

    /// The pipeline for `key`, compiled on first use; compile errors become typed errors.
    pub async fn get(&self, ctx: &GpuContext, key: &PipelineKey) -> Result<Arc<wgpu::ComputePipeline>> {
        if let Some(p) = self.map.lock().map_err(poisoned)?.get(key) {
            return Ok(p.clone());
        }
        let scope = ctx.device.push_error_scope(wgpu::ErrorFilter::Validation);
        let pipeline = compile(&ctx.device, key)?;
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
        let p = Arc::new(compile(device, key)?);
        self.map.lock().map_err(poisoned)?.insert(key.clone(), p.clone());
        Ok(p)
    }
}

fn compile(device: &wgpu::Device, key: &PipelineKey) -> Result<wgpu::ComputePipeline> {
    let source = preprocess(key.shader, &key.defs)?;
    let label = key.label();
    let module = device.create_shader_module(wgpu::ShaderModuleDescriptor { label: Some(&label), source: wgpu::ShaderSource::Wgsl(source.into()) });
    Ok(device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
        label: Some(&label),
        layout: None,
        module: &module,
        entry_point: Some(key.entry),
        compilation_options: Default::default(),
        cache: None,
    }))
}

fn poisoned<T>(_: T) -> GpuError {
    GpuError::DeviceLost("pipeline cache lock poisoned".into())
}

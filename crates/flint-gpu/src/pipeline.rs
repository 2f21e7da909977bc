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

#[derive(Default)]
pub struct PipelineCache {
    map: Mutex<HashMap<PipelineKey, Arc<wgpu::ComputePipeline>>>,
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
        let source = preprocess(key.shader, &key.defs)?;
        let label = key.label();
        let scope = ctx.device.push_error_scope(wgpu::ErrorFilter::Validation);
        let module = ctx.device.create_shader_module(wgpu::ShaderModuleDescriptor {
            label: Some(&label),
            source: wgpu::ShaderSource::Wgsl(source.into()),
        });
        let pipeline = ctx.device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
            label: Some(&label),
            layout: None,
            module: &module,
            entry_point: Some(key.entry),
            compilation_options: Default::default(),
            cache: None,
        });
        if let Some(e) = scope.pop().await {
            return Err(GpuError::Shader { shader: label, message: e.to_string() });
        }
        let p = Arc::new(pipeline);
        self.map.lock().map_err(poisoned)?.insert(key.clone(), p.clone());
        Ok(p)
    }
}

fn poisoned<T>(_: T) -> GpuError {
    GpuError::DeviceLost("pipeline cache lock poisoned".into())
}

//! Buffer helpers: labelled storage/uniform buffers, uploads, and async readback with one
//! signature on every target.

use wgpu::util::DeviceExt;

use crate::context::GpuContext;
use crate::error::{GpuError, Result};

pub const STORAGE: wgpu::BufferUsages = wgpu::BufferUsages::STORAGE.union(wgpu::BufferUsages::COPY_DST).union(wgpu::BufferUsages::COPY_SRC);

/// A zero-filled storage buffer of `size` bytes (rounded up to 4), checked against the limits.
pub fn storage(ctx: &GpuContext, label: &str, size: u64) -> Result<wgpu::Buffer> {
    let size = size.max(4).next_multiple_of(4);
    if size > ctx.limits.max_buffer_size {
        return Err(GpuError::Limit { what: "buffer size", need: size, limit: ctx.limits.max_buffer_size });
    }
    Ok(ctx.device.create_buffer(&wgpu::BufferDescriptor { label: Some(label), size, usage: STORAGE, mapped_at_creation: false }))
}

/// A storage buffer initialised with `data` (padded to 4 bytes).
pub fn storage_init(ctx: &GpuContext, label: &str, data: &[u8]) -> Result<wgpu::Buffer> {
    if data.len().is_multiple_of(4) && !data.is_empty() {
        return Ok(ctx.device.create_buffer_init(&wgpu::util::BufferInitDescriptor { label: Some(label), contents: data, usage: STORAGE }));
    }
    let mut padded = data.to_vec();
    padded.resize(data.len().max(4).next_multiple_of(4), 0);
    Ok(ctx.device.create_buffer_init(&wgpu::util::BufferInitDescriptor { label: Some(label), contents: &padded, usage: STORAGE }))
}

pub fn uniform_init(ctx: &GpuContext, label: &str, data: &[u8]) -> wgpu::Buffer {
    ctx.device.create_buffer_init(&wgpu::util::BufferInitDescriptor {
        label: Some(label),
        contents: data,
        usage: wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST,
    })
}

/// Copies `size` bytes at `offset` of `src` to the host. Async everywhere: natively it polls
/// the device, in the browser the map promise resolves on its own.
pub async fn read(ctx: &GpuContext, src: &wgpu::Buffer, offset: u64, size: u64) -> Result<Vec<u8>> {
    let size4 = size.next_multiple_of(4);
    let staging = ctx.device.create_buffer(&wgpu::BufferDescriptor {
        label: Some("readback"),
        size: size4,
        usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
        mapped_at_creation: false,
    });
    let mut enc = ctx.device.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some("readback") });
    enc.copy_buffer_to_buffer(src, offset, &staging, 0, size4);
    ctx.queue.submit([enc.finish()]);
    read_staging(ctx, &staging, size).await
}

/// Maps an already-filled MAP_READ buffer and copies out its first `size` bytes.
pub async fn read_staging(ctx: &GpuContext, staging: &wgpu::Buffer, size: u64) -> Result<Vec<u8>> {
    read_staging_after(ctx, staging, size, None).await
}

/// [`read_staging`] of a buffer filled by submission `filled_by` (None: any so far): natively
/// it waits for that submission only, so the work submitted after it runs on meanwhile.
pub async fn read_staging_after(ctx: &GpuContext, staging: &wgpu::Buffer, size: u64, filled_by: Option<wgpu::SubmissionIndex>) -> Result<Vec<u8>> {
    let (tx, rx) = futures::channel::oneshot::channel();
    staging.slice(..size.next_multiple_of(4)).map_async(wgpu::MapMode::Read, move |r| {
        let _ = tx.send(r);
    });
    ctx.poll_wait_through(filled_by)?;
    rx.await.map_err(|_| GpuError::Readback { cause: "map callback dropped".into() })?.map_err(|e| GpuError::Readback { cause: e.to_string() })?;
    let data = {
        let view = staging.slice(..size.next_multiple_of(4)).get_mapped_range().map_err(|e| GpuError::Readback { cause: e.to_string() })?;
        view[..size as usize].to_vec()
    };
    staging.unmap();
    ctx.check()?;
    Ok(data)
}

pub async fn read_f32(ctx: &GpuContext, src: &wgpu::Buffer, offset_elems: u64, n: usize) -> Result<Vec<f32>> {
    let bytes = read(ctx, src, offset_elems * 4, n as u64 * 4).await?;
    Ok(bytemuck::pod_collect_to_vec(&bytes))
}

pub async fn read_u32(ctx: &GpuContext, src: &wgpu::Buffer, offset_elems: u64, n: usize) -> Result<Vec<u32>> {
    let bytes = read(ctx, src, offset_elems * 4, n as u64 * 4).await?;
    Ok(bytemuck::pod_collect_to_vec(&bytes))
}

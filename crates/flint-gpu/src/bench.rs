//! Device measurements for `flint bench`: buffer-copy bandwidth in the same run.

use crate::context::GpuContext;
use crate::error::Result;

const COPY_BYTES: u64 = 64 << 20;
const COPY_REPS: u32 = 4;
/// The timed copies last at least this long, so that a fast device's submission and readback
/// latency does not hide its bandwidth: four 64 MiB copies measured 600 GB/s on an NVIDIA H200
/// (about 4 TB/s of memory bandwidth), where they take a tenth of a millisecond.
const MIN_TIMED_MS: f64 = 20.0;
const MAX_COPY_REPS: u32 = 4096;

/// Copies a 64 MiB buffer in one submission, as many times as it takes to keep the device busy
/// for [`MIN_TIMED_MS`], and returns GB/s counting bytes read plus written.
pub async fn copy_bandwidth_gbs(ctx: &GpuContext, clock: fn() -> f64) -> Result<f64> {
    let size = COPY_BYTES.min(ctx.limits.max_buffer_size / 2);
    let a = crate::buffer::storage(ctx, "copy_src", size)?;
    let b = crate::buffer::storage(ctx, "copy_dst", size)?;
    // Warm-up copy so first-touch costs are not timed.
    let run = |n: u32| {
        let mut enc = ctx.device.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some("copy_bandwidth") });
        for _ in 0..n {
            enc.copy_buffer_to_buffer(&a, 0, &b, 0, size);
        }
        ctx.queue.submit([enc.finish()]);
    };
    run(1);
    crate::buffer::read(ctx, &b, 0, 4).await?;
    let mut reps = COPY_REPS;
    loop {
        let t0 = clock();
        run(reps);
        crate::buffer::read(ctx, &b, 0, 4).await?;
        let ms = clock() - t0;
        if ms >= MIN_TIMED_MS || reps >= MAX_COPY_REPS {
            return Ok(if ms > 0.0 { 2.0 * (size * reps as u64) as f64 / (ms * 1e6) } else { 0.0 });
        }
        // Aim at twice the minimum, from what these copies took.
        let scale = if ms > 0.0 { (2.0 * MIN_TIMED_MS / ms).ceil() } else { 16.0 };
        reps = (reps as f64 * scale).min(MAX_COPY_REPS as f64) as u32;
    }
}

/// What a layer split's boundary costs the host: `bytes` of residual stream copied into a
/// staging buffer on `from`, mapped and read, written into a buffer of `to` and waited for,
/// as a step does between two parts with both devices otherwise idle. Median over `reps`,
/// in milliseconds.
pub async fn boundary_copy_ms(from: &GpuContext, to: &GpuContext, bytes: u64, reps: usize, clock: fn() -> f64) -> Result<f64> {
    let bytes = bytes.next_multiple_of(4).max(4);
    let src = crate::buffer::storage(from, "boundary_src", bytes)?;
    let dst = crate::buffer::storage(to, "boundary_dst", bytes)?;
    let staging = from.device.create_buffer(&wgpu::BufferDescriptor {
        label: Some("boundary_staging"),
        size: bytes,
        usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
        mapped_at_creation: false,
    });
    let mut times = Vec::with_capacity(reps + 1);
    // The first crossing (first map, first write) is not counted.
    for _ in 0..=reps.max(1) {
        let t0 = clock();
        let mut enc = from.device.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some("boundary") });
        enc.copy_buffer_to_buffer(&src, 0, &staging, 0, bytes);
        from.queue.submit([enc.finish()]);
        let x = crate::buffer::read_staging(from, &staging, bytes).await?;
        to.queue.write_buffer(&dst, 0, &x);
        to.queue.submit([]);
        to.work_done().await?;
        times.push(clock() - t0);
    }
    let mut times = times.split_off(1);
    times.sort_by(|a, b| a.total_cmp(b));
    Ok(times[times.len() / 2])
}

//! Device measurements for `flint bench`: buffer-copy bandwidth in the same run.

use crate::context::GpuContext;
use crate::error::Result;

const COPY_BYTES: u64 = 64 << 20;
const COPY_REPS: u32 = 4;

/// Copies a 64 MiB buffer a few times and returns GB/s counting bytes read plus written.
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
    let t0 = clock();
    run(COPY_REPS);
    crate::buffer::read(ctx, &b, 0, 4).await?;
    let ms = clock() - t0;
    Ok(if ms > 0.0 { 2.0 * (size * COPY_REPS as u64) as f64 / (ms * 1e6) } else { 0.0 })
}

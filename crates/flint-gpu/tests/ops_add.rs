//! Residual and bias adds against plain CPU sums, odd widths, sentinels past n_tok.

use flint_gpu::buffer::{read_f32, storage_init};
use flint_gpu::ops::add::{Add, AddKind};
use flint_gpu::ops::Batch;
use flint_gpu::pipeline::PipelineCache;
use flint_gpu::testing::{nmse, TestRng, NMSE_F32};
use flint_gpu::GpuContext;

const MAX_TOKENS: u32 = 16;
const SENTINEL: f32 = -12345.5;

fn submit(ctx: &GpuContext, f: impl FnOnce(&mut wgpu::ComputePass<'_>)) {
    let mut enc = ctx.device.create_command_encoder(&Default::default());
    {
        let mut pass = enc.begin_compute_pass(&Default::default());
        f(&mut pass);
    }
    ctx.queue.submit([enc.finish()]);
}

#[test]
fn add_residual_and_bias() {
    flint_gpu::gpu_test!(ctx => {
        let cache = PipelineCache::new();
        for kind in [AddKind::Residual, AddKind::Bias] {
            for &n in &[100usize, 640, 896, 2560] {
                for &n_tok in &[1usize, 3, 13] {
                    let mut rng = TestRng::new((n * 17 + n_tok) as u64);
                    let used = n_tok * n;
                    let x = rng.vec(used);
                    let y = rng.vec(if kind == AddKind::Bias { n } else { used });
                    let mut xbuf = x.clone();
                    xbuf.resize(MAX_TOKENS as usize * n, SENTINEL);
                    let mut ybuf = y.clone();
                    if kind == AddKind::Residual {
                        ybuf.resize(MAX_TOKENS as usize * n, 7.0);
                    }
                    let xb = storage_init(ctx, "x", bytemuck::cast_slice(&xbuf)).unwrap();
                    let yb = storage_init(ctx, "y", bytemuck::cast_slice(&ybuf)).unwrap();
                    let batch = Batch::new(ctx, MAX_TOKENS, 1, 1, 16).unwrap();
                    batch.write(ctx, &vec![0; n_tok], &vec![0; n_tok], &vec![0; n_tok], &[]);
                    let op = Add::new(ctx, &cache, &batch, kind, n as u32, &xb, &yb).await.unwrap();
                    submit(ctx, |p| op.encode(p, n_tok as u32));
                    let got = read_f32(ctx, &xb, 0, xbuf.len()).await.unwrap();
                    let want: Vec<f32> = x.iter().enumerate().map(|(i, &a)| a + if kind == AddKind::Bias { y[i % n] } else { y[i] }).collect();
                    let label = format!("{kind:?} n {n} n_tok {n_tok}");
                    let e = nmse(&got[..used], &want);
                    assert!(e <= NMSE_F32, "{label}: nmse {e}");
                    assert!(got[used..].iter().all(|&v| v == SENTINEL), "{label}: wrote past n_tok");
                    ctx.check().unwrap();
                }
            }
        }
    });
}

#[test]
fn add_rejects_aliasing_and_short_buffers() {
    flint_gpu::gpu_test!(ctx => {
        let cache = PipelineCache::new();
        let batch = Batch::new(ctx, MAX_TOKENS, 1, 1, 16).unwrap();
        let xb = storage_init(ctx, "x", &vec![0u8; 16 * 64 * 4]).unwrap();
        let yb = storage_init(ctx, "y", &vec![0u8; 64 * 4]).unwrap();
        assert!(Add::new(ctx, &cache, &batch, AddKind::Residual, 64, &xb, &xb).await.is_err());
        assert!(Add::new(ctx, &cache, &batch, AddKind::Residual, 64, &xb, &yb).await.is_err());
        assert!(Add::new(ctx, &cache, &batch, AddKind::Bias, 64, &xb, &yb).await.is_ok());
    });
}

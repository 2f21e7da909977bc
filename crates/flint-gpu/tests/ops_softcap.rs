//! The soft cap (gemma2's final logits) against the CPU reference's, on seeded values that the
//! cap bends (scaled to several times the cap, and exact zeros), odd widths, sentinels past
//! n_tok; and the caps and buffers it refuses.

use flint_core::reference::ops::softcap;
use flint_gpu::buffer::{read_f32, storage_init};
use flint_gpu::ops::softcap::SoftCap;
use flint_gpu::ops::Batch;
use flint_gpu::pipeline::PipelineCache;
use flint_gpu::testing::{nmse, TestRng, NMSE_F32};
use flint_gpu::GpuContext;

const MAX_TOKENS: u32 = 8;
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
fn soft_cap_matches_the_reference() {
    flint_gpu::gpu_test!(ctx => {
        let cache = PipelineCache::new();
        for &(n, cap) in &[(1000usize, 30.0f32), (2053, 5.0), (257, 0.5)] {
            for &n_tok in &[1usize, 3, 8] {
                let mut rng = TestRng::new((n * 31 + n_tok) as u64);
                let used = n_tok * n;
                let mut x: Vec<f32> = rng.vec(used).iter().map(|v| v * 4.0 * cap).collect();
                x[0] = 0.0;
                let mut buf = x.clone();
                buf.resize(MAX_TOKENS as usize * n, SENTINEL);
                let xb = storage_init(ctx, "x", bytemuck::cast_slice(&buf)).unwrap();
                let batch = Batch::new(ctx, MAX_TOKENS, 1, 1, 16).unwrap();
                batch.write(ctx, &vec![0; n_tok], &vec![0; n_tok], &vec![0; n_tok], &[]);
                let op = SoftCap::new(ctx, &cache, &batch, n as u32, cap, &xb).await.unwrap();
                submit(ctx, |p| op.encode(p, n_tok as u32));
                let got = read_f32(ctx, &xb, 0, buf.len()).await.unwrap();
                let want: Vec<f32> = x.iter().map(|&v| softcap(v, cap)).collect();
                let label = format!("n {n} cap {cap} n_tok {n_tok}");
                let e = nmse(&got[..used], &want);
                assert!(e <= NMSE_F32, "{label}: nmse {e}");
                assert_eq!(got[0], 0.0, "{label}: tanh(0) is 0");
                assert!(got[..used].iter().all(|v| v.abs() <= cap), "{label}: a value past the cap");
                assert!(got[used..].iter().all(|&v| v == SENTINEL), "{label}: wrote past n_tok");
                ctx.check().unwrap();
            }
        }
    });
}

#[test]
fn soft_cap_refuses_bad_caps_and_short_buffers() {
    flint_gpu::gpu_test!(ctx => {
        let cache = PipelineCache::new();
        let batch = Batch::new(ctx, MAX_TOKENS, 1, 1, 16).unwrap();
        let xb = storage_init(ctx, "x", bytemuck::cast_slice(&vec![0f32; MAX_TOKENS as usize * 100])).unwrap();
        for cap in [0.0, -1.0, f32::NAN, f32::INFINITY] {
            assert!(SoftCap::new(ctx, &cache, &batch, 100, cap, &xb).await.is_err(), "cap {cap}");
        }
        assert!(SoftCap::new(ctx, &cache, &batch, 101, 30.0, &xb).await.is_err(), "x too small");
    });
}

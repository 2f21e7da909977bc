//! The soft cap (gemma2's final logits) against the CPU reference's, on seeded values that the
//! cap bends (scaled to several times the cap, and exact zeros), odd widths, sentinels past
//! n_tok; and the caps and buffers it refuses.

use flint_core::reference::ops::softcap;
use flint_gpu::buffer::{read_f32, storage_init};
use flint_gpu::ops::softcap::SoftCap;
use flint_gpu::ops::Batch;
use flint_gpu::pipeline::PipelineCache;
use flint_gpu::testing::{assert_untouched, nmse, padded, pipelines, submit, TestRng, NMSE_F32};
use flint_gpu::GpuContext;

const MAX_TOKENS: u32 = 8;

#[derive(Clone, Copy, Debug)]
struct Case {
    n: usize,
    cap: f32,
    n_tok: usize,
}

/// One to MAX_TOKENS tokens of width `n` capped at `cap`.
fn cases(n: usize, cap: f32) -> impl Iterator<Item = Case> {
    [1usize, 3, 8].into_iter().map(move |n_tok| Case { n, cap, n_tok })
}

async fn run(ctx: &GpuContext, Case { n, cap, n_tok }: Case) {
    let mut rng = TestRng::new((n * 31 + n_tok) as u64);
    let used = n_tok * n;
    let mut x: Vec<f32> = rng.vec(used).iter().map(|v| v * 4.0 * cap).collect();
    x[0] = 0.0;
    let buf = padded(&x, MAX_TOKENS as usize * n);
    let xb = storage_init(ctx, "x", bytemuck::cast_slice(&buf)).unwrap();
    let batch = Batch::new(ctx, MAX_TOKENS, 1, 1, 16).unwrap();
    batch.write(ctx, &vec![0; n_tok], &vec![0; n_tok], &vec![0; n_tok], &[]);
    let op = SoftCap::new(ctx, pipelines(), &batch, n as u32, cap, &xb).await.unwrap();
    submit(ctx, |p| op.encode(p, n_tok as u32));
    let got = read_f32(ctx, &xb, 0, buf.len()).await.unwrap();
    let want: Vec<f32> = x.iter().map(|&v| softcap(v, cap)).collect();
    let e = nmse(&got[..used], &want);
    assert!(e <= NMSE_F32, "nmse {e}");
    assert_eq!(got[0], 0.0, "tanh(0) is 0");
    assert!(got[..used].iter().all(|v| v.abs() <= cap), "a value past the cap");
    assert_untouched(&got[used..], "wrote past n_tok");
    ctx.check().unwrap();
}

flint_gpu::op_tests! { run;
    soft_cap_30_width_1000 => cases(1000, 30.0),
    soft_cap_5_width_2053 => cases(2053, 5.0),
    soft_cap_half_width_257 => cases(257, 0.5),
}

#[test]
fn soft_cap_refuses_bad_caps_and_short_buffers() {
    flint_gpu::gpu_test!(ctx => {
        let cache = PipelineCache::for_context(ctx);
        let batch = Batch::new(ctx, MAX_TOKENS, 1, 1, 16).unwrap();
        let xb = storage_init(ctx, "x", bytemuck::cast_slice(&vec![0f32; MAX_TOKENS as usize * 100])).unwrap();
        for cap in [0.0, -1.0, f32::NAN, f32::INFINITY] {
            assert!(SoftCap::new(ctx, &cache, &batch, 100, cap, &xb).await.is_err(), "cap {cap}");
        }
        assert!(SoftCap::new(ctx, &cache, &batch, 101, 30.0, &xb).await.is_err(), "x too small");
    });
}

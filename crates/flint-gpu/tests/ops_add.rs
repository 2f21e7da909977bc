//! Residual and bias adds against plain CPU sums, odd widths, sentinels past n_tok.

use flint_gpu::buffer::{read_f32, storage_init};
use flint_gpu::ops::add::{Add, AddKind};
use flint_gpu::ops::Batch;
use flint_gpu::pipeline::PipelineCache;
use flint_gpu::testing::{assert_untouched, nmse, padded, pipelines, submit, TestRng, NMSE_F32};
use flint_gpu::GpuContext;

const MAX_TOKENS: u32 = 16;

#[derive(Clone, Copy, Debug)]
struct Case {
    kind: AddKind,
    n: usize,
    n_tok: usize,
}

/// Odd and model widths, one to thirteen tokens.
fn cases(kind: AddKind) -> impl Iterator<Item = Case> {
    [100usize, 640, 896, 2560].into_iter().flat_map(move |n| [1usize, 3, 13].map(|n_tok| Case { kind, n, n_tok }))
}

async fn run(ctx: &GpuContext, Case { kind, n, n_tok }: Case) {
    let mut rng = TestRng::new((n * 17 + n_tok) as u64);
    let used = n_tok * n;
    let x = rng.vec(used);
    let y = rng.vec(if kind == AddKind::Bias { n } else { used });
    let xbuf = padded(&x, MAX_TOKENS as usize * n);
    let mut ybuf = y.clone();
    if kind == AddKind::Residual {
        ybuf.resize(MAX_TOKENS as usize * n, 7.0);
    }
    let xb = storage_init(ctx, "x", bytemuck::cast_slice(&xbuf)).unwrap();
    let yb = storage_init(ctx, "y", bytemuck::cast_slice(&ybuf)).unwrap();
    let batch = Batch::new(ctx, MAX_TOKENS, 1, 1, 16).unwrap();
    batch.write(ctx, &vec![0; n_tok], &vec![0; n_tok], &vec![0; n_tok], &[]);
    let op = Add::new(ctx, pipelines(), &batch, kind, n as u32, &xb, &yb).await.unwrap();
    submit(ctx, |p| op.encode(p, n_tok as u32));
    let got = read_f32(ctx, &xb, 0, xbuf.len()).await.unwrap();
    let want: Vec<f32> = x.iter().enumerate().map(|(i, &a)| a + if kind == AddKind::Bias { y[i % n] } else { y[i] }).collect();
    let e = nmse(&got[..used], &want);
    assert!(e <= NMSE_F32, "nmse {e}");
    assert_untouched(&got[used..], "wrote past n_tok");
    ctx.check().unwrap();
}

flint_gpu::op_tests! { run;
    add_residual => cases(AddKind::Residual),
    add_bias => cases(AddKind::Bias),
}

#[test]
fn add_rejects_aliasing_and_short_buffers() {
    flint_gpu::gpu_test!(ctx => {
        let cache = PipelineCache::for_context(ctx);
        let batch = Batch::new(ctx, MAX_TOKENS, 1, 1, 16).unwrap();
        let xb = storage_init(ctx, "x", &vec![0u8; 16 * 64 * 4]).unwrap();
        let yb = storage_init(ctx, "y", &vec![0u8; 64 * 4]).unwrap();
        assert!(Add::new(ctx, &cache, &batch, AddKind::Residual, 64, &xb, &xb).await.is_err());
        assert!(Add::new(ctx, &cache, &batch, AddKind::Residual, 64, &xb, &yb).await.is_err());
        assert!(Add::new(ctx, &cache, &batch, AddKind::Bias, 64, &xb, &yb).await.is_ok());
    });
}

//! RMSNorm against flint_core's reference on seeded data: per-token rows (n_embd and
//! head_dim sized), in place and out of place, and the last-token-only form.

use flint_core::reference::ops;
use flint_gpu::buffer::{read_f32, storage_init};
use flint_gpu::ops::rms_norm::{RmsNorm, RmsNormDesc, Rows};
use flint_gpu::ops::Batch;
use flint_gpu::pipeline::PipelineCache;
use flint_gpu::testing::{nmse, TestRng, NMSE_F32};
use flint_gpu::GpuContext;

const MAX_TOKENS: u32 = 16;
const SENTINEL: f32 = -12345.5;
const EPS: f32 = 1e-6;

fn submit(ctx: &GpuContext, f: impl FnOnce(&mut wgpu::ComputePass<'_>)) {
    let mut enc = ctx.device.create_command_encoder(&Default::default());
    {
        let mut pass = enc.begin_compute_pass(&Default::default());
        f(&mut pass);
    }
    ctx.queue.submit([enc.finish()]);
}

fn batch(ctx: &GpuContext, n_tok: u32) -> Batch {
    let b = Batch::new(ctx, MAX_TOKENS, 1, 1, 16).unwrap();
    let ids: Vec<u32> = (0..n_tok).collect();
    b.write(ctx, &ids, &ids, &vec![0; n_tok as usize], &[]);
    b
}

/// Runs one case; `rows` = rows per token (None = last token only).
async fn case(ctx: &GpuContext, cache: &PipelineCache, row_len: usize, rows: Option<usize>, n_tok: usize, in_place: bool) {
    let mut rng = TestRng::new((row_len * 131 + n_tok * 7 + rows.unwrap_or(0) + in_place as usize) as u64);
    let per_tok = rows.unwrap_or(1);
    let cap = MAX_TOKENS as usize * per_tok * row_len;
    let used = n_tok * per_tok * row_len;
    // Scaled inputs so the mean square is far from 1, plus a non-trivial weight.
    let mut x: Vec<f32> = rng.vec(used).iter().map(|v| v * 3.0).collect();
    let w: Vec<f32> = rng.vec(row_len).iter().map(|v| 1.0 + 0.5 * v).collect();
    let mut x_buf = x.clone();
    x_buf.resize(cap, SENTINEL);
    let xb = storage_init(ctx, "x", bytemuck::cast_slice(&x_buf)).unwrap();
    let wb = storage_init(ctx, "w", bytemuck::cast_slice(&w)).unwrap();
    let out_len = if rows.is_some() { cap } else { row_len + 64 };
    let ob = if in_place { xb.clone() } else { storage_init(ctx, "out", bytemuck::cast_slice(&vec![SENTINEL; out_len])).unwrap() };
    let b = batch(ctx, n_tok as u32);
    let desc = RmsNormDesc { row_len: row_len as u32, eps: EPS, rows: rows.map_or(Rows::LastToken, |r| Rows::PerToken(r as u32)) };
    let op = RmsNorm::new(ctx, cache, &b, desc, &wb, &xb, &ob).await.unwrap();
    submit(ctx, |p| op.encode(p, n_tok as u32));

    let want: Vec<f32> = match rows {
        Some(_) => {
            ops::rms_norm(&mut x, &w, EPS);
            x.clone()
        }
        None => {
            let mut last = x[(n_tok - 1) * row_len..].to_vec();
            ops::rms_norm(&mut last, &w, EPS);
            last
        }
    };
    let got = read_f32(ctx, &ob, 0, if in_place { cap } else { out_len }).await.unwrap();
    let e = nmse(&got[..want.len()], &want);
    let label = format!("row_len {row_len} rows {rows:?} n_tok {n_tok} in_place {in_place}");
    assert!(e <= NMSE_F32, "{label}: nmse {e}");
    if in_place && rows.is_none() {
        // Rows 1.. of x keep their input (row 0 was overwritten by the last row's norm).
        assert_eq!(&got[row_len..used], &x_buf[row_len..used], "{label}: rows past row 0 changed");
        assert!(got[used..].iter().all(|&v| v == SENTINEL), "{label}: wrote past n_tok");
    } else {
        assert!(got[want.len()..].iter().all(|&v| v == SENTINEL), "{label}: wrote past the output rows");
    }
    ctx.check().unwrap();
}

#[test]
fn rms_norm_per_token_rows() {
    flint_gpu::gpu_test!(ctx => {
        let cache = PipelineCache::new();
        for &row_len in &[640usize, 896, 2560] {
            for &n_tok in &[1usize, 3, 13] {
                case(ctx, &cache, row_len, Some(1), n_tok, false).await;
            }
        }
        case(ctx, &cache, 896, Some(1), 13, true).await;
    });
}

#[test]
fn rms_norm_head_rows_for_qk_norm() {
    flint_gpu::gpu_test!(ctx => {
        let cache = PipelineCache::new();
        for &(row_len, heads) in &[(256usize, 4usize), (128, 14), (100, 3), (64, 5)] {
            for &n_tok in &[1usize, 13] {
                case(ctx, &cache, row_len, Some(heads), n_tok, true).await;
                case(ctx, &cache, row_len, Some(heads), n_tok, false).await;
            }
        }
    });
}

#[test]
fn rms_norm_last_token_only() {
    flint_gpu::gpu_test!(ctx => {
        let cache = PipelineCache::new();
        for &n_tok in &[1usize, 3, 13] {
            case(ctx, &cache, 896, None, n_tok, false).await;
            case(ctx, &cache, 640, None, n_tok, true).await;
        }
    });
}

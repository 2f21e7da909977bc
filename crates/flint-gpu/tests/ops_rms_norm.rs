//! RMSNorm against flint_core's reference on seeded data: per-token rows (n_embd and
//! head_dim sized), in place and out of place, and the gathering form the head uses (output
//! rows picked from the step's tokens, repeats and any order allowed).

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

/// Runs one case of `rows` rows per token.
async fn case(ctx: &GpuContext, cache: &PipelineCache, row_len: usize, rows: usize, n_tok: usize, in_place: bool) {
    let mut rng = TestRng::new((row_len * 131 + n_tok * 7 + rows + in_place as usize) as u64);
    let cap = MAX_TOKENS as usize * rows * row_len;
    let used = n_tok * rows * row_len;
    // Scaled inputs so the mean square is far from 1, plus a non-trivial weight.
    let mut x: Vec<f32> = rng.vec(used).iter().map(|v| v * 3.0).collect();
    let w: Vec<f32> = rng.vec(row_len).iter().map(|v| 1.0 + 0.5 * v).collect();
    let mut x_buf = x.clone();
    x_buf.resize(cap, SENTINEL);
    let xb = storage_init(ctx, "x", bytemuck::cast_slice(&x_buf)).unwrap();
    let wb = storage_init(ctx, "w", bytemuck::cast_slice(&w)).unwrap();
    let ob = if in_place { xb.clone() } else { storage_init(ctx, "out", bytemuck::cast_slice(&vec![SENTINEL; cap])).unwrap() };
    let b = batch(ctx, n_tok as u32);
    let desc = RmsNormDesc { row_len: row_len as u32, eps: EPS, rows: Rows::PerToken(rows as u32) };
    let op = RmsNorm::new(ctx, cache, &b, desc, &wb, &xb, &ob).await.unwrap();
    submit(ctx, |p| op.encode(p, n_tok as u32));
    ops::rms_norm(&mut x, &w, EPS);
    let got = read_f32(ctx, &ob, 0, cap).await.unwrap();
    let e = nmse(&got[..used], &x);
    let label = format!("row_len {row_len} rows {rows} n_tok {n_tok} in_place {in_place}");
    assert!(e <= NMSE_F32, "{label}: nmse {e}");
    assert!(got[used..].iter().all(|&v| v == SENTINEL), "{label}: wrote past the rows");
    ctx.check().unwrap();
}

#[test]
fn rms_norm_per_token_rows() {
    flint_gpu::gpu_test!(ctx => {
        let cache = PipelineCache::new();
        for &row_len in &[640usize, 896, 2560] {
            for &n_tok in &[1usize, 3, 13] {
                case(ctx, &cache, row_len, 1, n_tok, false).await;
            }
        }
        case(ctx, &cache, 896, 1, 13, true).await;
    });
}

#[test]
fn rms_norm_head_rows_for_qk_norm() {
    flint_gpu::gpu_test!(ctx => {
        let cache = PipelineCache::new();
        for &(row_len, heads) in &[(256usize, 4usize), (128, 14), (100, 3), (64, 5)] {
            for &n_tok in &[1usize, 13] {
                case(ctx, &cache, row_len, heads, n_tok, true).await;
                case(ctx, &cache, row_len, heads, n_tok, false).await;
            }
        }
    });
}

#[test]
fn rms_norm_gathers_output_rows() {
    flint_gpu::gpu_test!(ctx => {
        let cache = PipelineCache::new();
        let src_rows = MAX_TOKENS;
        for &row_len in &[896usize, 640] {
            let mut rng = TestRng::new(row_len as u64);
            let x: Vec<f32> = rng.vec(src_rows as usize * row_len).iter().map(|v| v * 2.0).collect();
            let w: Vec<f32> = rng.vec(row_len).iter().map(|v| 1.0 + 0.5 * v).collect();
            let (xb, wb) = (storage_init(ctx, "x", bytemuck::cast_slice(&x)).unwrap(), storage_init(ctx, "w", bytemuck::cast_slice(&w)).unwrap());
            // Output rows: the last token, the first, one twice (n > 1 choices), any order.
            for gather in [vec![12u32], vec![12, 0, 5, 5, 15, 3, 1, 9]] {
                let max_out = 8u32;
                let head = Batch::new(ctx, max_out, 1, 1, 16).unwrap();
                head.write_rows(ctx, &gather);
                let ob = storage_init(ctx, "out", bytemuck::cast_slice(&vec![SENTINEL; (max_out as usize + 1) * row_len])).unwrap();
                let desc = RmsNormDesc { row_len: row_len as u32, eps: EPS, rows: Rows::Gather { src_rows } };
                let op = RmsNorm::new(ctx, &cache, &head, desc, &wb, &xb, &ob).await.unwrap();
                submit(ctx, |p| op.encode(p, gather.len() as u32));
                let got = read_f32(ctx, &ob, 0, (max_out as usize + 1) * row_len).await.unwrap();
                let mut want: Vec<f32> = gather.iter().flat_map(|&r| x[r as usize * row_len..][..row_len].to_vec()).collect();
                ops::rms_norm(&mut want, &w, EPS);
                let n = want.len();
                let e = nmse(&got[..n], &want);
                assert!(e <= NMSE_F32, "row_len {row_len} gather {gather:?}: nmse {e}");
                assert!(got[n..].iter().all(|&v| v == SENTINEL), "wrote past the output rows");
                // A gathering norm cannot be in place.
                assert!(RmsNorm::new(ctx, &cache, &head, desc, &wb, &xb, &xb).await.is_err());
                ctx.check().unwrap();
            }
        }
    });
}

//! RMSNorm against flint_core's reference on seeded data: per-token rows (n_embd and
//! head_dim sized), in place and out of place, and the gathering form the head uses (output
//! rows picked from the step's tokens, repeats and any order allowed).

use flint_core::reference::ops;
use flint_gpu::buffer::{read_f32, storage_init};
use flint_gpu::ops::rms_norm::{RmsNorm, RmsNormDesc, Rows};
use flint_gpu::ops::Batch;
use flint_gpu::testing::{assert_untouched, nmse, padded, pipelines, submit, TestRng, NMSE_F32, SENTINEL};
use flint_gpu::GpuContext;

const MAX_TOKENS: u32 = 16;
const EPS: f32 = 1e-6;

fn batch(ctx: &GpuContext, n_tok: u32) -> Batch {
    let b = Batch::new(ctx, MAX_TOKENS, 1, 1, 16).unwrap();
    let ids: Vec<u32> = (0..n_tok).collect();
    b.write(ctx, &ids, &ids, &vec![0; n_tok as usize], &[]);
    b
}

/// `rows` rows of `row_len` per token.
#[derive(Clone, Copy, Debug)]
struct Case {
    row_len: usize,
    rows: usize,
    n_tok: usize,
    in_place: bool,
}

async fn run(ctx: &GpuContext, Case { row_len, rows, n_tok, in_place }: Case) {
    let mut rng = TestRng::new((row_len * 131 + n_tok * 7 + rows + in_place as usize) as u64);
    let cap = MAX_TOKENS as usize * rows * row_len;
    let used = n_tok * rows * row_len;
    // Scaled inputs so the mean square is far from 1, plus a non-trivial weight.
    let mut x: Vec<f32> = rng.vec(used).iter().map(|v| v * 3.0).collect();
    let w: Vec<f32> = rng.vec(row_len).iter().map(|v| 1.0 + 0.5 * v).collect();
    let xb = storage_init(ctx, "x", bytemuck::cast_slice(&padded(&x, cap))).unwrap();
    let wb = storage_init(ctx, "w", bytemuck::cast_slice(&w)).unwrap();
    let ob = if in_place { xb.clone() } else { storage_init(ctx, "out", bytemuck::cast_slice(&vec![SENTINEL; cap])).unwrap() };
    let b = batch(ctx, n_tok as u32);
    let desc = RmsNormDesc { row_len: row_len as u32, eps: EPS, rows: Rows::PerToken(rows as u32), residual: false };
    let op = RmsNorm::new(ctx, pipelines(), &b, desc, &wb, &xb, &ob).await.unwrap();
    submit(ctx, |p| op.encode(p, n_tok as u32));
    ops::rms_norm(&mut x, &w, EPS);
    let got = read_f32(ctx, &ob, 0, cap).await.unwrap();
    let e = nmse(&got[..used], &x);
    assert!(e <= NMSE_F32, "nmse {e}");
    assert_untouched(&got[used..], "wrote past the rows");
    ctx.check().unwrap();
}

/// One row a token: model widths, one to thirteen tokens, and one in place.
fn token_rows() -> Vec<Case> {
    let mut cases: Vec<Case> =
        [640usize, 896, 2560].into_iter().flat_map(|row_len| [1usize, 3, 13].map(|n_tok| Case { row_len, rows: 1, n_tok, in_place: false })).collect();
    cases.push(Case { row_len: 896, rows: 1, n_tok: 13, in_place: true });
    cases
}

/// A row per head (QK norm): head sizes and counts of the catalog's models and odd ones.
fn head_rows(in_place: bool) -> impl Iterator<Item = Case> {
    [(256usize, 4usize), (128, 14), (100, 3), (64, 5)]
        .into_iter()
        .flat_map(move |(row_len, rows)| [1usize, 13].map(|n_tok| Case { row_len, rows, n_tok, in_place }))
}

/// The head's output rows gathered from `row_len`-wide token rows.
#[derive(Clone, Debug)]
struct Gather {
    row_len: usize,
    rows: Vec<u32>,
}

async fn gather(ctx: &GpuContext, Gather { row_len, rows: gather }: Gather) {
    let src_rows = MAX_TOKENS;
    let cache = pipelines();
    let mut rng = TestRng::new(row_len as u64);
    let x: Vec<f32> = rng.vec(src_rows as usize * row_len).iter().map(|v| v * 2.0).collect();
    let w: Vec<f32> = rng.vec(row_len).iter().map(|v| 1.0 + 0.5 * v).collect();
    let (xb, wb) = (storage_init(ctx, "x", bytemuck::cast_slice(&x)).unwrap(), storage_init(ctx, "w", bytemuck::cast_slice(&w)).unwrap());
    let max_out = 8u32;
    let head = Batch::new(ctx, max_out, 1, 1, 16).unwrap();
    head.write_rows(ctx, &gather);
    let ob = storage_init(ctx, "out", bytemuck::cast_slice(&vec![SENTINEL; (max_out as usize + 1) * row_len])).unwrap();
    let desc = RmsNormDesc { row_len: row_len as u32, eps: EPS, rows: Rows::Gather { src_rows }, residual: false };
    let op = RmsNorm::new(ctx, cache, &head, desc, &wb, &xb, &ob).await.unwrap();
    submit(ctx, |p| op.encode(p, gather.len() as u32));
    let got = read_f32(ctx, &ob, 0, (max_out as usize + 1) * row_len).await.unwrap();
    let mut want: Vec<f32> = gather.iter().flat_map(|&r| x[r as usize * row_len..][..row_len].to_vec()).collect();
    ops::rms_norm(&mut want, &w, EPS);
    let n = want.len();
    let e = nmse(&got[..n], &want);
    assert!(e <= NMSE_F32, "nmse {e}");
    assert_untouched(&got[n..], "wrote past the output rows");
    // A gathering norm cannot be in place.
    assert!(RmsNorm::new(ctx, cache, &head, desc, &wb, &xb, &xb).await.is_err());
    ctx.check().unwrap();
}

/// Output rows: the last token, the first, one twice (n > 1 choices), any order.
fn gathers() -> impl Iterator<Item = Gather> {
    [896usize, 640].into_iter().flat_map(|row_len| [vec![12u32], vec![12, 0, 5, 5, 15, 3, 1, 9]].map(|rows| Gather { row_len, rows }))
}

flint_gpu::op_tests! { run;
    rms_norm_token_rows => token_rows(),
    rms_norm_head_rows_in_place => head_rows(true),
    rms_norm_head_rows_out_of_place => head_rows(false),
}

flint_gpu::op_tests! { gather;
    rms_norm_gathers_output_rows => gathers(),
}

/// The residual form (gemma's post-norms): out += norm(x) · w over each token's row, bit for
/// bit what the separate norm and add compute.
async fn residual(ctx: &GpuContext, (row_len, n_tok): (usize, usize)) {
    let mut rng = TestRng::new((row_len * 17 + n_tok) as u64);
    let cap = MAX_TOKENS as usize * row_len;
    let used = n_tok * row_len;
    let mut x: Vec<f32> = rng.vec(used).iter().map(|v| v * 3.0).collect();
    let w: Vec<f32> = rng.vec(row_len).iter().map(|v| 1.0 + 0.5 * v).collect();
    let res = rng.vec(used);
    let xb = storage_init(ctx, "x", bytemuck::cast_slice(&padded(&x, cap))).unwrap();
    let wb = storage_init(ctx, "w", bytemuck::cast_slice(&w)).unwrap();
    let ob = storage_init(ctx, "out", bytemuck::cast_slice(&padded(&res, cap))).unwrap();
    let b = batch(ctx, n_tok as u32);
    let desc = RmsNormDesc { row_len: row_len as u32, eps: EPS, rows: Rows::PerToken(1), residual: true };
    let op = RmsNorm::new(ctx, pipelines(), &b, desc, &wb, &xb, &ob).await.unwrap();
    // The same norm alone, into a scratch buffer.
    let nb = storage_init(ctx, "normed", bytemuck::cast_slice(&vec![SENTINEL; cap])).unwrap();
    let plain = RmsNorm::new(ctx, pipelines(), &b, RmsNormDesc { residual: false, ..desc }, &wb, &xb, &nb).await.unwrap();
    submit(ctx, |p| {
        op.encode(p, n_tok as u32);
        plain.encode(p, n_tok as u32);
    });
    let got = read_f32(ctx, &ob, 0, cap).await.unwrap();
    let normed = read_f32(ctx, &nb, 0, used).await.unwrap();
    for i in 0..used {
        assert_eq!(got[i].to_bits(), (res[i] + normed[i]).to_bits(), "element {i}");
    }
    ops::rms_norm(&mut x, &w, EPS);
    let want: Vec<f32> = res.iter().zip(&x).map(|(r, v)| r + v).collect();
    let e = nmse(&got[..used], &want);
    assert!(e <= NMSE_F32, "nmse {e}");
    assert_untouched(&got[used..], "wrote past the rows");
    ctx.check().unwrap();
}

flint_gpu::op_tests! { residual;
    rms_norm_adds_to_the_residual => [(640usize, 1usize), (640, 13), (2560, 3)],
}

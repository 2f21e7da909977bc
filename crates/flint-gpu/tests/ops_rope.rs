//! RoPE against flint_core's reference, both styles, partial rotation, several bases and
//! frequency scales, and positions up to 10^5.

use flint_core::arch::RopeStyle;
use flint_core::reference::ops;
use flint_gpu::buffer::{read_f32, storage_init};
use flint_gpu::ops::rope::{Rope, RopeDesc};
use flint_gpu::ops::Batch;
use flint_gpu::pipeline::PipelineCache;
use flint_gpu::testing::{assert_untouched, nmse, padded, pipelines, submit, TestRng, NMSE_F32};
use flint_gpu::GpuContext;

const MAX_TOKENS: u32 = 16;

#[derive(Clone, Debug)]
struct Case {
    desc: RopeDesc,
    pos: Vec<u32>,
}

async fn run(ctx: &GpuContext, Case { desc, pos }: Case) {
    let n_tok = pos.len();
    let (nh, hd) = (desc.n_heads as usize, desc.head_dim as usize);
    let mut rng = TestRng::new((nh * 1000 + hd * 10 + n_tok) as u64 + pos[0] as u64);
    let used = n_tok * nh * hd;
    let mut x = rng.vec(used);
    let buf = padded(&x, MAX_TOKENS as usize * nh * hd);
    let xb = storage_init(ctx, "x", bytemuck::cast_slice(&buf)).unwrap();
    let batch = Batch::new(ctx, MAX_TOKENS, 1, 1, 16).unwrap();
    batch.write(ctx, &vec![0; n_tok], &pos, &vec![0; n_tok], &[]);
    let op = Rope::new(ctx, pipelines(), &batch, desc, &xb).await.unwrap();
    submit(ctx, |p| op.encode(p, n_tok as u32));

    for (t, &p) in pos.iter().enumerate() {
        for head in x[t * nh * hd..(t + 1) * nh * hd].chunks_mut(hd) {
            ops::rope(head, p as usize, &flint_core::arch::rope_inv_freq(desc.rope_dim as usize, desc.base, None), desc.freq_scale, desc.style);
        }
    }
    let got = read_f32(ctx, &xb, 0, buf.len()).await.unwrap();
    let e = nmse(&got[..used], &x);
    let worst = got[..used].iter().zip(&x).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
    assert!(e <= NMSE_F32, "nmse {e}, max abs err {worst}");
    assert!(worst < 1e-5, "max abs err {worst}");
    assert_untouched(&got[used..], "wrote past n_tok");
    ctx.check().unwrap();
}

fn desc(style: RopeStyle, n_heads: u32, head_dim: u32, rope_dim: u32, base: f32, freq_scale: f32) -> RopeDesc {
    RopeDesc { n_heads, head_dim, rope_dim, style, base, freq_scale }
}

fn small_positions(style: RopeStyle) -> Vec<Case> {
    let case = |desc, pos: &[u32]| Case { desc, pos: pos.to_vec() };
    vec![
        case(desc(style, 4, 128, 128, 10000.0, 1.0), &[0]),
        case(desc(style, 4, 128, 128, 10000.0, 1.0), &[5, 6, 7]),
        // Partial rotation, odd pair count, a GQA-sized K (2 heads).
        case(desc(style, 3, 64, 32, 10000.0, 1.0), &(0..13).collect::<Vec<_>>()),
        case(desc(style, 2, 100, 100, 500000.0, 1.0), &[1, 2, 3]),
        case(desc(style, 5, 256, 256, 1_000_000.0, 0.125), &[17, 40, 41]),
    ]
}

fn large_positions(style: RopeStyle) -> Vec<Case> {
    let far: Vec<u32> = vec![3000, 2999, 3001, 4095, 8191, 12345, 32767, 65535, 100_000, 131_071, 7, 0, 3000];
    let case = |desc, pos: &[u32]| Case { desc, pos: pos.to_vec() };
    vec![
        case(desc(style, 4, 128, 128, 10000.0, 1.0), &[3000]),
        case(desc(style, 2, 128, 128, 10000.0, 1.0), &far),
        case(desc(style, 3, 64, 64, 1_000_000.0, 0.25), &far),
        case(desc(style, 2, 80, 40, 10000.0, 1.0), &far[..3]),
    ]
}

flint_gpu::op_tests! { run;
    rope_normal_small_positions => small_positions(RopeStyle::Normal),
    rope_neox_small_positions => small_positions(RopeStyle::Neox),
    rope_normal_large_positions => large_positions(RopeStyle::Normal),
    rope_neox_large_positions => large_positions(RopeStyle::Neox),
}

#[test]
fn rope_rejects_bad_rope_dim() {
    flint_gpu::gpu_test!(ctx => {
        let cache = PipelineCache::for_context(ctx);
        let batch = Batch::new(ctx, MAX_TOKENS, 1, 1, 16).unwrap();
        let xb = storage_init(ctx, "x", &vec![0u8; 16 * 2 * 64 * 4]).unwrap();
        assert!(Rope::new(ctx, &cache, &batch, desc(RopeStyle::Neox, 2, 64, 33, 1e4, 1.0), &xb).await.is_err());
        assert!(Rope::new(ctx, &cache, &batch, desc(RopeStyle::Neox, 2, 64, 128, 1e4, 1.0), &xb).await.is_err());
        assert!(Rope::new(ctx, &cache, &batch, desc(RopeStyle::Neox, 4, 64, 64, 1e4, 1.0), &xb).await.is_err());
    });
}

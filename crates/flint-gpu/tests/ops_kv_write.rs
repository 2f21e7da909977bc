//! kv_write against a CPU oracle: a step's K and V rows of three interleaved sequences land in
//! their sequences' slots through scattered block tables, K rotated by fused RoPE (both styles,
//! partial rotation) or copied exactly; every other slot keeps its sentinel. And the
//! copy-on-write block copy moves exactly one block.

use flint_core::arch::rope_inv_freq;
use flint_core::arch::RopeStyle;
use flint_core::reference::ops::rope_scaled;
use flint_gpu::buffer::{read_f32, storage, storage_init};
use flint_gpu::ops::attention::AttentionDesc;
use flint_gpu::ops::kv_write::{encode_block_copy, KvWrite};
use flint_gpu::ops::rope::RopeSpec;
use flint_gpu::ops::Batch;
use flint_gpu::testing::{nmse, pipelines, submit, Sentinel, TestRng, NMSE_F32, SENTINEL};
use flint_gpu::GpuContext;

fn desc(rope: Option<RopeSpec>) -> AttentionDesc {
    let f32 = flint_core::kv::KvType::F32;
    AttentionDesc { n_head: 4, n_head_kv: 2, head_dim: 64, head_dim_v: 32, scale: 0.125, window: None, rope, softcap: None, k_type: f32, v_type: f32 }
}

/// The rotation K takes on its way into the cache (None: copied), and the data's seed.
#[derive(Clone, Debug)]
struct Case {
    rope: Option<RopeSpec>,
    seed: u64,
}

/// Three sequences (a fresh prefill, a decode, a continued prefill), tokens interleaved.
async fn run(ctx: &GpuContext, Case { rope: rope_spec, seed }: Case) {
    let d = desc(rope_spec.clone());
    let (kv_dim, v_dim, hd) = (d.kv_dim() as usize, d.v_dim() as usize, d.head_dim as usize);
    let (bs, n_blocks) = (8usize, 12usize);
    let mut rng = TestRng::new(seed);
    let tables: Vec<Vec<u32>> = vec![vec![7, 2], vec![0, 9, 4, 11], vec![5, 1]];
    let toks: Vec<(usize, usize)> = vec![(0, 0), (1, 27), (2, 9), (0, 1), (2, 10), (0, 2), (2, 11)];
    let n_tok = toks.len();
    let spare = 2; // rows past the step, kept at SENTINEL in the inputs
    let k: Vec<f32> = rng.vec((n_tok + spare) * kv_dim);
    let v: Vec<f32> = rng.vec((n_tok + spare) * v_dim);
    let batch = Batch::new(ctx, (n_tok + spare) as u32, 3, 4, bs as u32).unwrap();
    let pos: Vec<u32> = toks.iter().map(|t| t.1 as u32).collect();
    let seq: Vec<u32> = toks.iter().map(|t| t.0 as u32).collect();
    let refs: Vec<&[u32]> = tables.iter().map(|t| t.as_slice()).collect();
    batch.write(ctx, &vec![0; n_tok], &pos, &seq, &refs);
    let n_slots = n_blocks * bs;
    let buf = |label: &str, data: &[f32]| storage_init(ctx, label, bytemuck::cast_slice(data)).unwrap();
    let (k_buf, v_buf) = (buf("k", &k), buf("v", &v));
    let kc = buf("k_cache", &vec![SENTINEL; n_slots * kv_dim]);
    let vc = buf("v_cache", &vec![SENTINEL; n_slots * v_dim]);
    let write = KvWrite::new(ctx, pipelines(), &batch, &d, &k_buf, &v_buf, &kc, &vc).await.unwrap();
    submit(ctx, |p| write.encode(p, n_tok as u32));
    let got_k = read_f32(ctx, &kc, 0, n_slots * kv_dim).await.unwrap();
    let got_v = read_f32(ctx, &vc, 0, n_slots * v_dim).await.unwrap();
    ctx.check().unwrap();

    let mut want_k = vec![SENTINEL; n_slots * kv_dim];
    let mut want_v = vec![SENTINEL; n_slots * v_dim];
    for (t, &(s, p)) in toks.iter().enumerate() {
        let slot = tables[s][p / bs] as usize * bs + p % bs;
        let mut row = k[t * kv_dim..][..kv_dim].to_vec();
        if let Some(r) = &rope_spec {
            for head in row.chunks_mut(hd) {
                rope_scaled(head, p, &rope_inv_freq(r.rope_dim as usize, r.base, r.freq_factors.as_deref()), r.freq_scale, r.style, r.mscale);
            }
        }
        want_k[slot * kv_dim..][..kv_dim].copy_from_slice(&row);
        want_v[slot * v_dim..][..v_dim].copy_from_slice(&v[t * v_dim..][..v_dim]);
    }
    assert!(got_v == want_v, "V rows must be copied exactly, nowhere else");
    let untouched = |g: &[f32], w: &[f32]| g.iter().zip(w).filter(|(_, w)| w.is_sentinel()).all(|(g, _)| g.is_sentinel());
    assert!(untouched(&got_k, &want_k), "K written outside the step's slots");
    if rope_spec.is_some() {
        let e = nmse(&got_k, &want_k);
        assert!(e <= NMSE_F32, "rotated K nmse {e:e}");
    } else {
        assert!(got_k == want_k, "K rows must be copied exactly");
    }
}

flint_gpu::op_tests! { run;
    kv_write_copies_k_without_rope => [Case { rope: None, seed: 50 }],
    kv_write_rotates_k_neox => [Case {
        rope: Some(RopeSpec { rope_dim: 64, style: RopeStyle::Neox, base: 10000.0, freq_scale: 1.0, mscale: 1.0, freq_factors: None }),
        seed: 51,
    }],
    kv_write_rotates_k_normal_partial_scaled => [Case {
        rope: Some(RopeSpec { rope_dim: 32, style: RopeStyle::Normal, base: 1e6, freq_scale: 0.25, mscale: 1.0, freq_factors: None }),
        seed: 52,
    }],
    // Per-pair divisors (Llama 3's rope_freqs.weight, LongRoPE's, YaRN's), seeded, and a
    // magnitude (YaRN's and LongRoPE's attention factor).
    kv_write_rotates_k_freq_factors_and_mscale => [Case {
        rope: Some(RopeSpec {
            rope_dim: 64,
            style: RopeStyle::Normal,
            base: 5e5,
            freq_scale: 1.0,
            mscale: 1.1386, freq_factors: Some(TestRng::new(9).vec(32).iter().map(|x| 1.0 + 16.0 * x.abs()).collect()),
        }),
        seed: 53,
    }],
}

#[test]
fn block_copy_moves_one_block() {
    flint_gpu::gpu_test!(ctx => {
        let (bs, row, n_blocks) = (16u64, 24u64, 5u64);
        let mut rng = TestRng::new(3);
        let data = rng.vec((n_blocks * bs * row) as usize);
        let cache = storage_init(ctx, "cache", bytemuck::cast_slice(&data)).unwrap();
        let block_bytes = bs * row * 4;
        let scratch = storage(ctx, "scratch", block_bytes).unwrap();
        let mut enc = ctx.device.create_command_encoder(&Default::default());
        encode_block_copy(&mut enc, &cache, &scratch, block_bytes, 3, 1);
        ctx.queue.submit([enc.finish()]);
        let got = read_f32(ctx, &cache, 0, data.len()).await.unwrap();
        let b = (bs * row) as usize;
        let mut want = data.clone();
        want.copy_within(3 * b..4 * b, b);
        assert!(got == want, "only block 1 changes, to block 3's contents");
    });
}

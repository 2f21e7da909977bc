//! Paged attention (after kv_write) against an f64 CPU reference: mixed batches, scattered
//! block tables, GQA, sliding windows, prefill and long decode, forced split counts,
//! sentinels; and batch invariance: a token's output is bit-identical whatever shares its step.

use flint_core::arch::RopeStyle;
use flint_core::kv::KvType;
use flint_core::reference::ops::rope_scaled;
use flint_gpu::buffer::{read_f32, read_u32, storage, storage_init};
use flint_gpu::ops::attention::{
    tiles_fit, Attention, AttentionDesc, Tiles, GPU_SPLIT_MIN_POSITIONS, MAX_SPLITS, ROWS_TARGET_INVOCATIONS, SPLIT_MIN_POSITIONS, SPLIT_TARGET_GROUPS,
};
use flint_gpu::ops::kv_write::{decode_rows, encode_block_copy, encode_rows, KvWrite};
use flint_gpu::ops::rope::RopeSpec;
use flint_gpu::ops::Batch;
use flint_gpu::pipeline::PipelineCache;
use flint_gpu::testing::{assert_untouched, nmse, pipelines, submit, TestRng, NMSE_F32, SENTINEL};
use flint_gpu::GpuContext;

/// Extra batch rows past the step's tokens, kept at SENTINEL to catch stray writes.
const SPARE_TOKENS: u32 = 3;
/// Unused cache blocks mixed into the pool, kept at SENTINEL.
const SPARE_BLOCKS: u32 = 5;

/// Rows of one sequence by position.
type Rows = Vec<Vec<f32>>;

#[derive(Clone, Copy, Debug)]
enum Split {
    /// A grid for the batch's longest possible context (each token still takes its own count).
    Auto,
    /// A grid for the true longest context.
    Kv,
    /// Every token takes this many splits.
    Fixed(u32),
}

#[derive(Debug)]
struct Case {
    desc: AttentionDesc,
    block_size: u32,
    /// Per sequence: (positions already cached, tokens added this step).
    seqs: &'static [(u32, u32)],
    split: Split,
    /// Interleave the step's tokens instead of listing them sequence by sequence.
    shuffle_tokens: bool,
    seed: u64,
}

fn desc(n_head: u32, n_head_kv: u32, hd: u32, window: Option<u32>) -> AttentionDesc {
    let scale = 1.0 / (hd as f32).sqrt();
    AttentionDesc { n_head, n_head_kv, head_dim: hd, head_dim_v: hd, scale, window, rope: None, softcap: None, k_type: KvType::F32, v_type: KvType::F32 }
}

/// The tolerance of a case: f32 caches compute what the f64 reference does up to f32
/// rounding; f16 and q8_0 caches are compared with a reference over the rounded rows, and a
/// rotated element may land on the other side of a rounding boundary.
fn tolerance(d: &AttentionDesc) -> f64 {
    if (d.k_type, d.v_type) == (KvType::F32, KvType::F32) {
        NMSE_F32
    } else {
        1e-6
    }
}

/// Checks one cache after kv_write: slots the step did not write keep their words, the
/// written rows read back as `want` stored as `ty` (exactly where `exact`).
#[allow(clippy::too_many_arguments)]
fn check_cache(what: &str, ty: KvType, got: &[u32], init: &[u32], want: &[f32], dim: usize, head_dim: usize, written: &[usize], exact: bool, tol: f64) {
    let words = ty.row_bytes(dim) as usize / 4;
    let is_k = what.starts_with('k');
    let (mut g, mut w) = (Vec::new(), Vec::new());
    for slot in 0..got.len() / words {
        let r = slot * words..(slot + 1) * words;
        if written.contains(&slot) {
            g.extend(decode_rows(ty, &got[r]));
            w.extend(decode_rows(ty, &encode_rows(ty, &want[slot * dim..][..dim], head_dim, is_k)));
        } else {
            assert!(got[r.clone()] == init[r], "{what}: slot {slot} written outside the step's slots");
        }
    }
    if exact {
        assert!(g == w, "{what} differs after kv_write");
    } else {
        let e = nmse(&g, &w);
        assert!(e <= tol, "{what} after kv_write: nmse {e:e}");
    }
}

fn shuffle<T>(v: &mut [T], rng: &mut TestRng) {
    for i in (1..v.len()).rev() {
        v.swap(i, rng.next_u32() as usize % (i + 1));
    }
}

/// f64 attention of one token (its sequence's K/V rows by position) for every head.
fn reference(d: &AttentionDesc, q: &[f32], k: &Rows, v: &Rows, pos: usize) -> Vec<f32> {
    let (hd, hdv) = (d.head_dim as usize, d.head_dim_v as usize);
    let group = (d.n_head / d.n_head_kv) as usize;
    let first = d.window.map_or(0, |w| (pos + 1).saturating_sub(w as usize));
    let mut out = vec![0f32; d.out_dim() as usize];
    for h in 0..d.n_head as usize {
        let kvh = h / group;
        let qh = &q[h * hd..][..hd];
        let scores: Vec<f64> = (first..=pos)
            .map(|j| qh.iter().zip(&k[j][kvh * hd..][..hd]).map(|(&a, &b)| a as f64 * b as f64).sum::<f64>() * d.scale as f64)
            .map(|s| d.softcap.map_or(s, |c| c as f64 * (s / c as f64).tanh()))
            .collect();
        let max = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let w: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
        let sum: f64 = w.iter().sum();
        for e in 0..hdv {
            let o: f64 = (first..=pos).zip(&w).map(|(j, p)| p * v[j][kvh * hdv + e] as f64).sum();
            out[h * hdv + e] = (o / sum) as f32;
        }
    }
    out
}

/// Which attention kernel a run takes.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Kernel {
    /// The adapter's choice for the default mode.
    Chosen,
    Split,
    /// The query-tiled kernel at every step size.
    Tiles,
}

/// Runs kv_write then attention in one pass with `kernel`; checks caches exactly and
/// sentinels; returns the output's NMSE against the reference and the kernel that ran.
async fn run_case(ctx: &GpuContext, c: &Case, kernel: Kernel) -> (f64, &'static str) {
    let d = &c.desc;
    let (kv_dim, v_dim, q_dim, out_dim) = (d.kv_dim() as usize, d.v_dim() as usize, d.q_dim() as usize, d.out_dim() as usize);
    let bs = c.block_size as usize;
    let mut rng = TestRng::new(c.seed);

    // Every sequence's K/V history (cached part and this step's rows), by position.
    let hist: Vec<(Rows, Rows)> = c
        .seqs
        .iter()
        .map(|&(past, new)| {
            let n = (past + new) as usize;
            ((0..n).map(|_| rng.vec(kv_dim)).collect(), (0..n).map(|_| rng.vec(v_dim)).collect())
        })
        .collect();

    // Scattered block tables drawn from a shuffled pool with spare blocks left unused.
    let needed: Vec<usize> = c.seqs.iter().map(|&(p, n)| ((p + n) as usize).div_ceil(bs)).collect();
    let n_blocks = needed.iter().sum::<usize>() + SPARE_BLOCKS as usize;
    let mut pool: Vec<u32> = (0..n_blocks as u32).collect();
    shuffle(&mut pool, &mut rng);
    let mut tables: Vec<Vec<u32>> = Vec::new();
    for &n in &needed {
        tables.push(pool.drain(..n).collect());
    }
    let max_blocks = needed.iter().copied().max().unwrap() as u32 + 1;
    let slot = |s: usize, p: usize| tables[s][p / bs] as usize * bs + p % bs;

    // Caches: sentinel everywhere, history rows before this step.
    let n_slots = n_blocks * bs;
    let mut k_cache = vec![SENTINEL; n_slots * kv_dim];
    let mut v_cache = vec![SENTINEL; n_slots * v_dim];
    for (s, &(past, _)) in c.seqs.iter().enumerate() {
        for p in 0..past as usize {
            k_cache[slot(s, p) * kv_dim..][..kv_dim].copy_from_slice(&hist[s].0[p]);
            v_cache[slot(s, p) * v_dim..][..v_dim].copy_from_slice(&hist[s].1[p]);
        }
    }

    // The step's tokens: (sequence, position), optionally interleaved.
    let mut toks: Vec<(usize, usize)> = c.seqs.iter().enumerate().flat_map(|(s, &(p, n))| (p..p + n).map(move |pos| (s, pos as usize))).collect();
    if c.shuffle_tokens {
        shuffle(&mut toks, &mut rng);
    }
    let n_tok = toks.len() as u32;
    let max_tokens = n_tok + SPARE_TOKENS;
    let mut q = rng.vec(max_tokens as usize * q_dim);
    let mut k_step = vec![SENTINEL; max_tokens as usize * kv_dim];
    let mut v_step = vec![SENTINEL; max_tokens as usize * v_dim];
    for (t, &(s, p)) in toks.iter().enumerate() {
        k_step[t * kv_dim..][..kv_dim].copy_from_slice(&hist[s].0[p]);
        v_step[t * v_dim..][..v_dim].copy_from_slice(&hist[s].1[p]);
    }
    q.iter_mut().skip(n_tok as usize * q_dim).for_each(|x| *x = SENTINEL);
    // With fused RoPE the reference sees q and this step's K rows rotated at their positions
    // (cached rows count as rotated when they were written).
    let mut q_ref = q.clone();
    let mut hist = hist;
    if let Some(r) = &d.rope {
        let rot = |row: &mut [f32], hd: usize, p: usize| {
            for head in row.chunks_mut(hd) {
                rope_scaled(head, p, &flint_core::arch::rope_inv_freq(r.rope_dim as usize, r.base, r.freq_factors.as_deref()), r.freq_scale, r.style, r.mscale);
            }
        };
        for (t, &(s, p)) in toks.iter().enumerate() {
            rot(&mut q_ref[t * q_dim..][..q_dim], d.head_dim as usize, p);
            rot(&mut hist[s].0[p], d.head_dim as usize, p);
        }
    }

    let batch = Batch::new(ctx, max_tokens, c.seqs.len() as u32, max_blocks, c.block_size).unwrap();
    let tok_ids: Vec<u32> = (0..n_tok).collect();
    let pos: Vec<u32> = toks.iter().map(|&(_, p)| p as u32).collect();
    let seq: Vec<u32> = toks.iter().map(|&(s, _)| s as u32).collect();
    let table_refs: Vec<&[u32]> = tables.iter().map(|t| t.as_slice()).collect();
    batch.write(ctx, &tok_ids, &pos, &seq, &table_refs);

    let buf = |label: &str, data: &[f32]| storage_init(ctx, label, bytemuck::cast_slice(data)).unwrap();
    let (q_buf, k_buf, v_buf) = (buf("q", &q), buf("k", &k_step), buf("v", &v_step));
    let (kc_init, vc_init) = (encode_rows(d.k_type, &k_cache, d.head_dim as usize, true), encode_rows(d.v_type, &v_cache, d.head_dim_v as usize, false));
    let words = |label: &str, data: &[u32]| storage_init(ctx, label, bytemuck::cast_slice(data)).unwrap();
    let (kc_buf, vc_buf) = (words("k_cache", &kc_init), words("v_cache", &vc_init));
    let out_buf = buf("out", &vec![SENTINEL; max_tokens as usize * out_dim]);

    let cache = pipelines();
    let write = KvWrite::new(ctx, cache, &batch, d, &k_buf, &v_buf, &kc_buf, &vc_buf).await.unwrap();
    let scratch = storage(ctx, "scratch", Attention::scratch_bytes(d, max_tokens)).unwrap();
    let tiles = if kernel == Kernel::Tiles { Tiles::Always } else { Tiles::OnGpus };
    let mut attn = Attention::new(ctx, cache, &batch, d, &q_buf, &kc_buf, &vc_buf, &out_buf, &scratch, tiles).await.unwrap();
    if kernel == Kernel::Split {
        attn.force_split(ctx);
    }
    let max_kv = toks.iter().map(|&(_, p)| p as u32 + 1).max().unwrap();
    let grid_kv = match c.split {
        Split::Auto => max_blocks * c.block_size,
        Split::Kv | Split::Fixed(_) => max_kv,
    };
    if let Split::Fixed(n) = c.split {
        attn.fix_splits(ctx, Some(n));
    }
    submit(ctx, |pass| {
        write.encode(pass, n_tok);
        attn.encode_kv(pass, n_tok, grid_kv);
    });

    let out = read_f32(ctx, &out_buf, 0, max_tokens as usize * out_dim).await.unwrap();
    let kc = read_u32(ctx, &kc_buf, 0, kc_init.len()).await.unwrap();
    let vc = read_u32(ctx, &vc_buf, 0, vc_init.len()).await.unwrap();
    ctx.check().unwrap();

    // The caches now hold every history row in its slot, stored as their types, and their
    // first words elsewhere. Rotated K rows: the same f32 operations as the reference, up to
    // sin/cos rounding; V rows are copied (and rounded as the CPU rounds).
    let tol = tolerance(d);
    for (t, &(s, p)) in toks.iter().enumerate() {
        k_cache[slot(s, p) * kv_dim..][..kv_dim].copy_from_slice(&hist[s].0[p]);
        v_cache[slot(s, p) * v_dim..][..v_dim].copy_from_slice(&v_step[t * v_dim..][..v_dim]);
    }
    let written: Vec<usize> = toks.iter().map(|&(s, p)| slot(s, p)).collect();
    let (hd, hdv) = (d.head_dim as usize, d.head_dim_v as usize);
    check_cache("k_cache", d.k_type, &kc, &kc_init, &k_cache, kv_dim, hd, &written, d.rope.is_none() && d.k_type == KvType::F32, tol);
    check_cache("v_cache", d.v_type, &vc, &vc_init, &v_cache, v_dim, hdv, &written, d.v_type != KvType::Q8_0, tol);
    // The reference attends over the rows as the caches hold them.
    for (k, v) in hist.iter_mut() {
        k.iter_mut().for_each(|r| d.k_type.read_back(r, hd, true));
        v.iter_mut().for_each(|r| d.v_type.read_back(r, hdv, false));
    }

    let (got, tail) = out.split_at(n_tok as usize * out_dim);
    assert_untouched(tail, &format!("attention wrote past its {n_tok} tokens"));
    let want: Vec<f32> = toks.iter().enumerate().flat_map(|(t, &(s, p))| reference(d, &q_ref[t * q_dim..][..q_dim], &hist[s].0, &hist[s].1, p)).collect();
    assert!(got.iter().all(|x| x.is_finite()), "non-finite attention output");
    let ran = if attn.tiled(n_tok) {
        "tiles"
    } else if attn.serial() {
        "rows"
    } else {
        "split"
    };
    (nmse(got, &want), ran)
}

/// The adapter's kernel, then `split` and the query-tiled kernel where it chose another
/// (the tiled one where it fits the shape and no split count is forced).
async fn check(ctx: &GpuContext, c: Case) {
    let mut ran = Vec::new();
    for kernel in [Kernel::Chosen, Kernel::Split, Kernel::Tiles] {
        let tiles = kernel == Kernel::Tiles;
        if (tiles && (!tiles_fit(&c.desc) || matches!(c.split, Split::Fixed(_)))) || ran.contains(&if tiles { "tiles" } else { "split" }) {
            continue;
        }
        let t0 = std::time::Instant::now();
        let (e, name) = run_case(ctx, &c, kernel).await;
        eprintln!("{:?} seqs {:?} bs {} split {:?} {name}: nmse {e:.3e} in {:.2?}", c.desc, c.seqs, c.block_size, c.split, t0.elapsed());
        let tol = tolerance(&c.desc);
        assert!(e <= tol, "{name}: nmse {e:e} > {tol:e}");
        if kernel != Kernel::Chosen {
            assert_eq!(name, if tiles { "tiles" } else { "split" }, "{kernel:?} did not run");
        }
        ran.push(name);
    }
}

/// gemma2's cap, small enough to bite on these scores (scale 1: scores of several units);
/// every kernel (rows, split, tiles) and a window.
fn soft_capped() -> [Case; 3] {
    let capped = |d: AttentionDesc| AttentionDesc { softcap: Some(2.0), scale: 1.0, ..d };
    [
        Case { desc: capped(desc(4, 2, 64, Some(24))), block_size: 16, seqs: &[(30, 21), (0, 4)], split: Split::Auto, shuffle_tokens: false, seed: 23 },
        Case { desc: capped(desc(4, 2, 32, None)), block_size: 16, seqs: &[(40, 3), (0, 7)], split: Split::Auto, shuffle_tokens: true, seed: 21 },
        Case { desc: capped(desc(4, 2, 32, Some(16))), block_size: 16, seqs: &[(300, 2)], split: Split::Kv, shuffle_tokens: false, seed: 22 },
    ]
}

/// q and this step's K rows rotated by attention and kv_write, against the CPU reference.
fn fused_rope() -> Vec<Case> {
    type RopeCase = (RopeStyle, u32, &'static [(u32, u32)]);
    let styles: [RopeCase; 2] = [(RopeStyle::Neox, 64, &[(0, 9), (30, 1)]), (RopeStyle::Normal, 32, &[(70, 2)])];
    let mut cases: Vec<Case> = styles
        .into_iter()
        .map(|(style, rope_dim, seqs)| {
            let rope = Some(RopeSpec { rope_dim, style, base: 10000.0, freq_scale: 0.5, mscale: 1.0, freq_factors: None });
            Case { desc: AttentionDesc { rope, ..desc(14, 2, 64, None) }, block_size: 16, seqs, split: Split::Auto, shuffle_tokens: true, seed: 11 }
        })
        .collect();
    let rope = Some(RopeSpec { rope_dim: 256, style: RopeStyle::Neox, base: 1e6, freq_scale: 1.0, mscale: 1.0, freq_factors: None });
    cases.push(Case {
        desc: AttentionDesc { rope, ..desc(4, 1, 256, Some(50)) },
        block_size: 16,
        seqs: &[(100, 3)],
        split: Split::Kv,
        shuffle_tokens: false,
        seed: 12,
    });
    // Per-pair frequency divisors (Llama 3's rope_freqs.weight, LongRoPE's, YaRN's), 1 to 17, and a
    // magnitude (LongRoPE's attention factor), on q and K.
    let factors: Vec<f32> = TestRng::new(31).vec(32).iter().map(|x| 1.0 + 16.0 * x.abs()).collect();
    let rope = Some(RopeSpec { rope_dim: 64, style: RopeStyle::Normal, base: 5e5, freq_scale: 1.0, mscale: 1.1547, freq_factors: Some(factors.into()) });
    cases.push(Case {
        desc: AttentionDesc { rope, ..desc(8, 2, 64, None) },
        block_size: 16,
        seqs: &[(200, 2), (0, 5)],
        split: Split::Auto,
        shuffle_tokens: true,
        seed: 16,
    });
    cases
}

/// f16 and q8_0 caches, separately for K and V: kv_write stores the rows (K rotated) as the
/// CPU rounds them and both kernels read them back, over prefill, decode, several splits and a
/// window.
fn typed_caches() -> Vec<Case> {
    let pairs = [(KvType::F16, KvType::F16), (KvType::Q8_0, KvType::Q8_0), (KvType::F16, KvType::Q8_0), (KvType::Q8_0, KvType::F32)];
    let mut cases = Vec::new();
    for (i, (k_type, v_type)) in pairs.into_iter().enumerate() {
        let rope = Some(RopeSpec { rope_dim: 64, style: RopeStyle::Neox, base: 10000.0, freq_scale: 1.0, mscale: 1.0, freq_factors: None });
        cases.push(Case {
            desc: AttentionDesc { rope, k_type, v_type, ..desc(14, 2, 64, None) },
            block_size: 16,
            seqs: &[(45, 1), (0, 9), (130, 3)],
            split: Split::Auto,
            shuffle_tokens: true,
            seed: 40 + i as u64,
        });
    }
    cases.push(Case {
        desc: AttentionDesc { k_type: KvType::Q8_0, v_type: KvType::F16, ..desc(4, 1, 256, Some(100)) },
        block_size: 16,
        seqs: &[(350, 1), (3, 2)],
        split: Split::Kv,
        shuffle_tokens: false,
        seed: 45,
    });
    cases.push(Case {
        desc: AttentionDesc { k_type: KvType::F16, v_type: KvType::F16, ..desc(4, 2, 32, None) },
        block_size: 7,
        seqs: &[(300, 1), (20, 4)],
        split: Split::Fixed(3),
        shuffle_tokens: true,
        seed: 46,
    });
    cases
}

flint_gpu::op_tests! { check;
    f16_and_q8_0_caches => typed_caches(),
    decode_one_sequence_gqa_hd64 => [Case { desc: desc(14, 2, 64, None), block_size: 16, seqs: &[(45, 1)], split: Split::Auto, shuffle_tokens: false, seed: 1 }],
    // A fresh prefill, a decode and a continued (chunked) prefill in one batch, interleaved.
    three_sequences_prefill_decode_and_chunk => [Case {
        desc: desc(14, 2, 64, None),
        block_size: 16,
        seqs: &[(0, 5), (37, 1), (20, 3)],
        split: Split::Auto,
        shuffle_tokens: true,
        seed: 2,
    }],
    // Contexts past several splits, a block size that is no power of two, split counts 1..=5.
    three_sequences_odd_block_size_forced_splits => [1, 2, 5].map(|n| Case {
        desc: desc(14, 2, 64, None),
        block_size: 7,
        seqs: &[(300, 1), (0, 6), (130, 4)],
        split: Split::Fixed(n),
        shuffle_tokens: true,
        seed: 3,
    }),
    // Each token sees the rows written earlier in the same pass.
    prefill_one_sequence_hd128 => [Case { desc: desc(8, 2, 128, None), block_size: 16, seqs: &[(0, 40)], split: Split::Auto, shuffle_tokens: false, seed: 4 }],
    // Window 100 < context: the visible range starts mid-block and crosses split boundaries.
    gqa_4_1_hd256_sliding_window => [Case {
        desc: desc(4, 1, 256, Some(100)),
        block_size: 16,
        seqs: &[(350, 1), (90, 12), (3, 2)],
        split: Split::Kv,
        shuffle_tokens: true,
        seed: 5,
    }],
    soft_capped_scores => soft_capped(),
    fused_rope_both_styles_partial_rotation => fused_rope(),
    prefill_with_small_window => [Case { desc: desc(4, 1, 256, Some(5)), block_size: 8, seqs: &[(0, 17)], split: Split::Auto, shuffle_tokens: false, seed: 6 }],
    // gemma-3-270m's shape: a 173-token chunk after 1024 cached positions, window 512 (golden
    // prompt 7's last chunk).
    long_prefill_chunk_hd256_windowed => [
        Case { desc: desc(4, 1, 256, Some(512)), block_size: 16, seqs: &[(1024, 173)], split: Split::Kv, shuffle_tokens: false, seed: 13 },
        Case { desc: desc(4, 1, 256, None), block_size: 16, seqs: &[(1024, 173)], split: Split::Kv, shuffle_tokens: false, seed: 14 },
    ],
    // One split of 1024 positions at head size 256: 66k iterations had the per-position loops
    // been loops (llvmpipe stops a loop nest there).
    serial_kernel_walks_past_65535_loop_iterations => [Case {
        desc: desc(4, 1, 256, None),
        block_size: 16,
        seqs: &[(1024, 1)],
        split: Split::Fixed(1),
        shuffle_tokens: false,
        seed: 15,
    }],
    long_decode_1500 => [
        Case { desc: desc(14, 2, 64, None), block_size: 16, seqs: &[(1500, 1)], split: Split::Auto, shuffle_tokens: false, seed: 7 },
        Case { desc: desc(16, 8, 128, None), block_size: 32, seqs: &[(1531, 1)], split: Split::Fixed(1), shuffle_tokens: false, seed: 8 },
    ],
    long_decode_1500_windowed_hd256 => [Case {
        desc: desc(4, 1, 256, Some(512)),
        block_size: 16,
        seqs: &[(1499, 1), (700, 1)],
        split: Split::Kv,
        shuffle_tokens: false,
        seed: 9,
    }],
}

/// A layer of 14 heads (2 KV heads) of 64 for the policy tests: steps of up to 512 tokens.
async fn policy_layer(ctx: &GpuContext) -> Attention {
    let d = desc(14, 2, 64, None);
    let batch = Batch::new(ctx, 512, 4, 256, 16).unwrap();
    let b = |n: u64| storage(ctx, "t", n).unwrap();
    let (q, out) = (b(512 * 14 * 64 * 4), b(512 * 14 * 64 * 4));
    let (kc, vc) = (b(256 * 16 * 128 * 4), b(256 * 16 * 128 * 4));
    let scratch = b(Attention::scratch_bytes(&d, 512));
    Attention::new(ctx, &PipelineCache::for_context(ctx), &batch, &d, &q, &kc, &vc, &out, &scratch, Tiles::OnGpus).await.unwrap()
}

#[test]
fn split_count_policy() {
    flint_gpu::gpu_test!(ctx => {
        let attn = policy_layer(ctx).await;
        let (target, min) = if attn.serial() { (ROWS_TARGET_INVOCATIONS, SPLIT_MIN_POSITIONS) } else { (SPLIT_TARGET_GROUPS, GPU_SPLIT_MIN_POSITIONS) };
        let p = attn.policy();
        // A token's count depends on its own visible length only: a split per 64 positions
        // (CPU-type adapters) or 256 (GPUs), up to the decode target's share per head.
        let most = (target / 14).min(MAX_SPLITS);
        assert_eq!(p.split_len, min);
        assert_eq!(p.splits(8192), most);
        assert_eq!(p.splits(min + min / 2), 2.min(most));
        assert_eq!(p.splits(1), 1);
        assert_eq!(p.splits(min), 1);
        assert_eq!(p.splits(min + 1), 2.min(most));
    });
}

/// A tuned run's split policy and query tiles (`FLINT_TUNE`: `split_groups`, `split_min`,
/// `tiles_from`) are what it names.
#[test]
fn tuned_split_policy_and_tiles() {
    for (tune, split_len, most, tiles_at) in
        [("split_groups=64,split_min=32,tiles_from=4", 32, 64 / 14, Some(5)), ("split_groups=100000,tiles_from=off", GPU_SPLIT_MIN_POSITIONS, MAX_SPLITS, None)]
    {
        let Some(ctx) = flint_gpu::testing::gpu_tuned(tune) else { return };
        futures::executor::block_on(async {
            let attn = policy_layer(&ctx).await;
            let p = attn.policy();
            assert_eq!((p.split_len, p.max_split), (split_len, most), "{tune}");
            assert_eq!((p.splits(split_len), p.splits(split_len + 1)), (1, 2), "{tune}");
            assert_eq!(attn.tiled(64), tiles_at.is_some(), "{tune}");
            if let Some(at) = tiles_at {
                assert!(attn.tiled(at) && !attn.tiled(at - 1), "{tune}");
            }
        });
    }
}

/// Runs kv_write + attention for `toks` ((sequence, position); each sequence's K/V history
/// seeded from `seed`) with `cache`'s pipelines and returns the output rows of the tokens, in
/// order.
async fn outputs_for(
    ctx: &GpuContext,
    cache: &PipelineCache,
    d: &AttentionDesc,
    force_split: bool,
    tiles: Tiles,
    toks: &[(usize, usize)],
    seed: u64,
) -> Vec<Vec<f32>> {
    let (kv_dim, q_dim, out_dim) = (d.kv_dim() as usize, d.q_dim() as usize, d.out_dim() as usize);
    let bs = 16usize;
    let n_seq = toks.iter().map(|t| t.0).max().unwrap() + 1;
    let max_pos = toks.iter().map(|t| t.1).max().unwrap() + 1;
    let blocks_per_seq = max_pos.div_ceil(bs);
    // Sequence s's history is the same whatever step it runs in (seeded by s).
    let hist: Vec<Vec<Vec<f32>>> = (0..n_seq)
        .map(|s| {
            let mut rng = TestRng::new(seed + s as u64);
            (0..max_pos).map(|_| rng.vec(kv_dim)).collect()
        })
        .collect();
    let tables: Vec<Vec<u32>> = (0..n_seq).map(|s| (0..blocks_per_seq as u32).map(|b| s as u32 * blocks_per_seq as u32 + b).collect()).collect();
    let n_slots = n_seq * blocks_per_seq * bs;
    let mut kc = vec![0f32; n_slots * kv_dim];
    for s in 0..n_seq {
        for p in 0..max_pos {
            let slot = tables[s][p / bs] as usize * bs + p % bs;
            kc[slot * kv_dim..][..kv_dim].copy_from_slice(&hist[s][p]);
        }
    }
    let n_tok = toks.len();
    let mut q = Vec::new();
    let mut rows = Vec::new();
    for &(s, p) in toks {
        let mut rng = TestRng::new(seed * 31 + s as u64 * 7919 + p as u64);
        q.extend(rng.vec(q_dim));
        rows.extend(hist[s][p].iter().copied());
    }
    let batch = Batch::new(ctx, n_tok as u32, n_seq as u32, blocks_per_seq as u32, bs as u32).unwrap();
    let pos: Vec<u32> = toks.iter().map(|t| t.1 as u32).collect();
    let seq: Vec<u32> = toks.iter().map(|t| t.0 as u32).collect();
    let refs: Vec<&[u32]> = tables.iter().map(|t| t.as_slice()).collect();
    batch.write(ctx, &vec![0; n_tok], &pos, &seq, &refs);
    let buf = |label: &str, data: &[f32]| storage_init(ctx, label, bytemuck::cast_slice(data)).unwrap();
    let (q_buf, k_buf, kc_buf, vc_buf) = (buf("q", &q), buf("k", &rows), buf("kc", &kc), buf("vc", &kc));
    let out_buf = buf("out", &vec![SENTINEL; n_tok * out_dim]);
    let scratch = storage(ctx, "scratch", Attention::scratch_bytes(d, n_tok as u32)).unwrap();
    let write = KvWrite::new(ctx, cache, &batch, d, &k_buf, &k_buf, &kc_buf, &vc_buf).await.unwrap();
    let mut attn = Attention::new(ctx, cache, &batch, d, &q_buf, &kc_buf, &vc_buf, &out_buf, &scratch, tiles).await.unwrap();
    if force_split {
        attn.force_split(ctx);
    }
    submit(ctx, |pass| {
        write.encode(pass, n_tok as u32);
        attn.encode_kv(pass, n_tok as u32, max_pos as u32);
    });
    let got = read_f32(ctx, &out_buf, 0, n_tok * out_dim).await.unwrap();
    ctx.check().unwrap();
    got.chunks_exact(out_dim).map(|r| r.to_vec()).collect()
}

/// A token's step mates, on one kernel family.
#[derive(Debug)]
struct Neighbours {
    desc: AttentionDesc,
    force_split: bool,
}

/// A decode at position 700 alone, then beside a 40-token prefill of another sequence (which
/// widens the split grid and the step), then beside more decodes: the same bits.
async fn same_bits_whatever_the_step(ctx: &GpuContext, Neighbours { desc: d, force_split }: Neighbours) {
    let alone = outputs_for(ctx, pipelines(), &d, force_split, Tiles::Off, &[(0, 700)], 21).await;
    let mut with_prefill: Vec<(usize, usize)> = (0..40).map(|p| (1, 900 + p)).collect();
    with_prefill.insert(17, (0, 700));
    let mixed = outputs_for(ctx, pipelines(), &d, force_split, Tiles::Off, &with_prefill, 21).await;
    let busy = outputs_for(ctx, pipelines(), &d, force_split, Tiles::Off, &[(2, 30), (0, 700), (3, 1)], 21).await;
    assert!(alone[0] == mixed[17], "{d:?} split {force_split}: a prefill beside it changed the output");
    assert!(alone[0] == busy[1], "{d:?} split {force_split}: other decodes beside it changed the output");
}

flint_gpu::op_tests! { same_bits_whatever_the_step;
    a_tokens_output_does_not_depend_on_its_step => [desc(14, 2, 64, None), desc(4, 1, 256, Some(512))]
        .into_iter()
        .flat_map(|desc| [false, true].map(|force_split| Neighbours { desc: desc.clone(), force_split })),
}

/// The attention kernels compute the same bits whatever runtime checks wgpu compiles into them
/// (`testing::assert_same_whatever_the_checks`): the CPU adapters' kernel (a token's head a
/// lane), the GPUs' split kernel and its combine, and their query-tiled kernel, each for a
/// 40-token prefill beside two decodes.
#[test]
fn attention_computes_the_same_bits_whatever_runtime_checks_wgpu_adds() {
    let mut toks: Vec<(usize, usize)> = (0..40).map(|p| (1, 300 + p)).collect();
    toks.extend([(0, 700), (2, 5)]);
    let d = desc(14, 2, 64, None);
    flint_gpu::testing::assert_same_whatever_the_checks("", |ctx| {
        let mut results = Vec::new();
        for (kernels, cpu_like, force_split, tiles) in [
            ("the CPU adapters' kernel", true, false, Tiles::Off),
            ("split and combine", false, true, Tiles::Off),
            ("the query tiles", false, false, Tiles::OnGpus),
        ] {
            ctx.caps.cpu_like = cpu_like;
            let rows = futures::executor::block_on(outputs_for(ctx, &ctx.pipelines, &d, force_split, tiles, &toks, 23));
            results.push((kernels.to_string(), rows.iter().flatten().map(|v| v.to_bits()).collect::<Vec<_>>()));
        }
        results
    });
}

#[test]
fn bad_shapes_are_errors() {
    flint_gpu::gpu_test!(ctx => {
        let batch = Batch::new(ctx, 4, 1, 4, 16).unwrap();
        let b = |n: u64| flint_gpu::buffer::storage(ctx, "t", n).unwrap();
        let big = b(1 << 20);
        let cache = PipelineCache::for_context(ctx);
        for d in [desc(14, 3, 64, None), desc(4, 1, 512, None), desc(4, 1, 66, None), desc(4, 1, 64, Some(0))] {
            assert!(Attention::new(ctx, &cache, &batch, &d, &big, &big, &big, &big, &big, Tiles::OnGpus).await.is_err(), "{d:?}");
            assert!(KvWrite::new(ctx, &cache, &batch, &d, &big, &big, &big, &big).await.is_err(), "{d:?}");
        }
        // Buffers too small for the batch, for one block, or for the split scratch.
        let d = desc(4, 1, 64, None);
        assert!(Attention::new(ctx, &cache, &batch, &d, &b(16), &big, &big, &big, &big, Tiles::OnGpus).await.is_err());
        assert!(Attention::new(ctx, &cache, &batch, &d, &big, &big, &big, &big, &b(64), Tiles::OnGpus).await.is_err());
        assert!(KvWrite::new(ctx, &cache, &batch, &d, &big, &big, &b(64), &big).await.is_err());
        ctx.check().unwrap();
    });
}

#[test]
fn forked_sequences_share_prefix_blocks_with_copy_on_write() {
    use flint_core::kv::{BlockCopy, BlockManager, SeqKv};
    flint_gpu::gpu_test!(ctx => {
        let d = desc(14, 2, 64, None);
        let (kv_dim, q_dim, out_dim) = (d.kv_dim() as usize, d.q_dim() as usize, d.out_dim() as usize);
        let (bs, n_blocks, past) = (16u32, 8u32, 40usize);
        let mut rng = TestRng::new(10);
        let mut kv = BlockManager::new(n_blocks, bs);
        let mut a = SeqKv::new();
        let _ = kv.reserve(&mut a, past).unwrap();
        let mut b = kv.fork(&a);
        // Earlier steps cached the shared prefix (V = K rows' own copy keeps the test small).
        let prefix: Rows = (0..past).map(|_| rng.vec(kv_dim)).collect();
        let mut k_cache = vec![SENTINEL; (n_blocks * bs) as usize * kv_dim];
        for (p, row) in prefix.iter().enumerate() {
            k_cache[kv.slot(&a, p).unwrap() as usize * kv_dim..][..kv_dim].copy_from_slice(row);
        }
        // This step: a adds 1 token, b adds 3; position 40 is inside shared block 2.
        let cow = kv.reserve(&mut a, past + 1).unwrap().copy;
        assert_eq!(cow, Some(BlockCopy { src: 2, dst: 3 }));
        assert_eq!(kv.reserve(&mut b, past + 3).unwrap().copy, None);
        let toks: Vec<(usize, usize)> = vec![(0, past), (1, past), (1, past + 1), (1, past + 2)];
        let n_tok = toks.len();
        let new_rows: Rows = (0..n_tok).map(|_| rng.vec(kv_dim)).collect();
        let q = rng.vec(n_tok * q_dim);

        let batch = Batch::new(ctx, n_tok as u32, 2, 4, bs).unwrap();
        let pos: Vec<u32> = toks.iter().map(|&(_, p)| p as u32).collect();
        let seq: Vec<u32> = toks.iter().map(|&(s, _)| s as u32).collect();
        batch.write(ctx, &[0; 4], &pos, &seq, &[a.table(), b.table()]);
        let buf = |label: &str, data: &[f32]| storage_init(ctx, label, bytemuck::cast_slice(data)).unwrap();
        let step: Vec<f32> = new_rows.concat();
        let (q_buf, k_buf, kc_buf, vc_buf) = (buf("q", &q), buf("k", &step), buf("k_cache", &k_cache), buf("v_cache", &k_cache));
        let out_buf = buf("out", &vec![SENTINEL; n_tok * out_dim]);
        let cache = PipelineCache::for_context(ctx);
        let write = KvWrite::new(ctx, &cache, &batch, &d, &k_buf, &k_buf, &kc_buf, &vc_buf).await.unwrap();
        let scratch = flint_gpu::buffer::storage(ctx, "scratch", Attention::scratch_bytes(&d, n_tok as u32)).unwrap();
        let attn = Attention::new(ctx, &cache, &batch, &d, &q_buf, &kc_buf, &vc_buf, &out_buf, &scratch, Tiles::OnGpus).await.unwrap();
        let mut enc = ctx.device.create_command_encoder(&Default::default());
        // The copy-on-write block is copied in every cache before the step writes.
        if let Some(BlockCopy { src, dst }) = cow {
            let block_bytes = (bs as usize * kv_dim * 4) as u64;
            let scratch = flint_gpu::buffer::storage(ctx, "block_copy", block_bytes).unwrap();
            for c in [&kc_buf, &vc_buf] {
                encode_block_copy(&mut enc, c, &scratch, block_bytes, src, dst);
            }
        }
        {
            let mut pass = enc.begin_compute_pass(&Default::default());
            write.encode(&mut pass, n_tok as u32);
            attn.encode_kv(&mut pass, n_tok as u32, (past + 3) as u32);
        }
        ctx.queue.submit([enc.finish()]);
        let got = read_f32(ctx, &out_buf, 0, n_tok * out_dim).await.unwrap();
        ctx.check().unwrap();

        let mut hist: Vec<Rows> = vec![prefix.clone(), prefix];
        for (&(s, _), row) in toks.iter().zip(&new_rows) {
            hist[s].push(row.clone());
        }
        let want: Vec<f32> = toks
            .iter()
            .enumerate()
            .flat_map(|(t, &(s, p))| reference(&d, &q[t * q_dim..][..q_dim], &hist[s], &hist[s], p))
            .collect();
        let e = nmse(&got, &want);
        assert!(e <= NMSE_F32, "nmse {e:e}");
        kv.release(&mut a);
        kv.release(&mut b);
        assert_eq!(kv.n_free(), n_blocks);
    });
}

//! The penalize kernel against flint_core's `Sampler::penalize` on random logits:
//! repetition/presence/frequency penalties over bounded and whole-context windows, logit
//! bias with bans and repeated ids, the allowed-token mask, odd vocabulary sizes, a
//! sentinel past the logits, and the errors `prepare` reports; then 3 and 8 rows with their
//! own edits in one step, each equal to the CPU's and to the row alone; and rows whose pending
//! token the device holds (overlapped steps), equal to the rows after the host accepted it.

use flint_core::sampling::{LogitEdit, Penalties, Sampler, SamplingParams};
use flint_gpu::buffer::{read_f32, storage_init};
use flint_gpu::ops::penalize::{mask_words, Penalize, StepEdits};
use flint_gpu::pipeline::PipelineCache;
use flint_gpu::testing::{assert_untouched, finite_nmse, pipelines, submit, TestRng, NMSE_F32, SENTINEL};
use flint_gpu::GpuContext;

/// Logits in [-10, 10) with a few exact zeros (the penalty's `> 0` boundary).
fn random_logits(rng: &mut TestRng, n: usize) -> Vec<f32> {
    let mut l: Vec<f32> = rng.vec(n).iter().map(|v| v * 10.0).collect();
    for i in (0..n).step_by(97) {
        l[i] = 0.0;
    }
    l
}

struct Case {
    label: &'static str,
    params: SamplingParams,
    history: usize,
    n_bias: usize,
    mask: bool,
}

/// A sampler for `case` with a random history (ids drawn from a small range so tokens
/// repeat), random biases (some −inf, some ids twice) and optionally a random mask.
fn cpu_sampler(rng: &mut TestRng, n: usize, case: &Case) -> Sampler {
    let range = (n as u32).min(500);
    let mut bias = Vec::new();
    for k in 0..case.n_bias {
        let id = rng.next_u32() % n as u32;
        let b = if k % 7 == 3 { f32::NEG_INFINITY } else { rng.f32() * 5.0 };
        bias.push((id, b));
        if k % 5 == 0 {
            bias.push((id, 0.5));
        }
    }
    let mut s = Sampler::new(SamplingParams { logit_bias: bias, ..case.params.clone() }).unwrap();
    for _ in 0..case.history {
        s.accept(rng.next_u32() % range);
    }
    if case.mask {
        // About three tokens in four allowed.
        let m: Vec<u32> = (0..mask_words(n as u32)).map(|_| rng.next_u32() | rng.next_u32()).collect();
        s.set_mask(Some(m));
    }
    s.check_vocab(n).unwrap();
    s
}

fn cases() -> Vec<Case> {
    let pen = SamplingParams { repeat_penalty: 1.3, presence_penalty: 0.4, frequency_penalty: 0.15, ..Default::default() };
    vec![
        Case { label: "penalties, window 64", params: pen.clone(), history: 300, n_bias: 0, mask: false },
        Case { label: "penalties, whole context", params: SamplingParams { repeat_last_n: -1, ..pen.clone() }, history: 3000, n_bias: 0, mask: false },
        Case {
            label: "repeat < 1",
            params: SamplingParams { repeat_penalty: 0.7, frequency_penalty: -1.5, ..pen.clone() },
            history: 100,
            n_bias: 0,
            mask: false,
        },
        Case { label: "bias only", params: SamplingParams::default(), history: 50, n_bias: 300, mask: false },
        Case { label: "mask only", params: SamplingParams::default(), history: 0, n_bias: 0, mask: true },
        Case { label: "everything", params: SamplingParams { repeat_last_n: 256, ..pen }, history: 1000, n_bias: 200, mask: true },
    ]
}

/// The edits of `cases()[kind]` on a vocabulary of `n`.
#[derive(Clone, Copy)]
struct Vocab {
    kind: usize,
    n: usize,
}

impl std::fmt::Debug for Vocab {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}, n {}", cases()[self.kind].label, self.n)
    }
}

/// The edits labelled `label` on a model's vocabulary, a small one, an odd one and one token.
fn vocabs(label: &str) -> Vec<Vocab> {
    let kind = cases().iter().position(|c| c.label == label).unwrap_or_else(|| panic!("no case {label:?}"));
    [151_936usize, 1000, 37, 1].into_iter().map(|n| Vocab { kind, n }).collect()
}

async fn run(ctx: &GpuContext, Vocab { kind, n }: Vocab) {
    let all = cases();
    let mut rng = TestRng::new(n as u64 + 17);
    // The kinds before this one draw from the same generator first: replay their draws.
    for case in &all[..kind] {
        random_logits(&mut rng, n);
        cpu_sampler(&mut rng, n, case);
    }
    let case = &all[kind];
    // Two sentinels past the logits catch out-of-bounds writes.
    let buf = storage_init(ctx, "logits", bytemuck::cast_slice(&vec![SENTINEL; n + 2])).unwrap();
    let mut pen = Penalize::new(ctx, pipelines(), n as u32, 1, &buf, None).await.unwrap();
    let logits = random_logits(&mut rng, n);
    let s = cpu_sampler(&mut rng, n, case);
    let mut want = logits.clone();
    s.penalize(&mut want);
    ctx.queue.write_buffer(&buf, 0, bytemuck::cast_slice(&logits));
    let plan = pen.prepare(ctx, &[StepEdits::from_sampler(&s)]).unwrap();
    submit(ctx, |p| pen.encode(p, &plan));
    let got = read_f32(ctx, &buf, 0, n + 2).await.unwrap();
    ctx.check().unwrap();
    assert_untouched(&got[n..], "wrote past the logits");
    let got = &got[..n];
    // Bans and mask: the same tokens at −inf; every untouched logit bit-exact.
    let touched: std::collections::HashSet<u32> = s.edits().iter().map(|e| e.id).collect();
    let mut exact = 0;
    for i in 0..n {
        assert_eq!(got[i] == f32::NEG_INFINITY, want[i] == f32::NEG_INFINITY, "token {i} got {} want {}", got[i], want[i]);
        if !touched.contains(&(i as u32)) || want[i] == f32::NEG_INFINITY {
            assert_eq!(got[i].to_bits(), want[i].to_bits(), "untouched token {i}");
        }
        exact += (got[i].to_bits() == want[i].to_bits()) as usize;
    }
    let e = finite_nmse(got, &want).unwrap_or_else(|| panic!("non-finite logits where the CPU's are finite"));
    eprintln!("{}: {} edits, {exact}/{n} bit-exact, nmse {e:.2e}", case.label, touched.len());
    assert!(e <= NMSE_F32, "nmse {e}");
}

flint_gpu::op_tests! { run;
    penalize_penalties_window_64 => vocabs("penalties, window 64"),
    penalize_penalties_whole_context => vocabs("penalties, whole context"),
    penalize_repeat_below_1 => vocabs("repeat < 1"),
    penalize_bias_only => vocabs("bias only"),
    penalize_mask_only => vocabs("mask only"),
    penalize_everything => vocabs("everything"),
}

#[test]
fn hand_computed_edits() {
    flint_gpu::gpu_test!(ctx => {
        let cache = PipelineCache::for_context(ctx);
        let logits = [1.0f32, 2.0, -1.0, 3.0, 0.5, -2.0, 0.0, 4.0, 7.0];
        let buf = storage_init(ctx, "logits", bytemuck::cast_slice(&logits)).unwrap();
        let mut pen = Penalize::new(ctx, &cache, 9, 1, &buf, None).await.unwrap();
        let edits = vec![
            LogitEdit { id: 1, count: 1, bias: 0.0 },
            LogitEdit { id: 5, count: 2, bias: 0.0 },
            LogitEdit { id: 6, count: 1, bias: 1.0 },
            LogitEdit { id: 7, count: 0, bias: f32::NEG_INFINITY },
            LogitEdit { id: 0, count: 0, bias: 2.0 },
        ];
        // Token 8 masked out: word 0 has bits 0..=7.
        let mask = [0xffu32];
        let step = StepEdits { penalties: Penalties { repeat: 2.0, presence: 0.5, frequency: 0.25 }, edits, mask: Some(&mask), pending: None };
        let plan = pen.prepare(ctx, &[step]).unwrap();
        submit(ctx, |p| pen.encode(p, &plan));
        let got = read_f32(ctx, &buf, 0, 9).await.unwrap();
        let ninf = f32::NEG_INFINITY;
        // 1: 2/2 − 0.75; 5: −2·2 − 1.0; 6: 0·2 − 0.75 + 1; 7 banned; 0: +2; 8 masked.
        assert_eq!(got, vec![3.0, 0.25, -1.0, 3.0, 0.5, -5.0, 0.25, ninf, ninf]);
    });
}

#[test]
fn prepare_rejects_what_does_not_fit() {
    flint_gpu::gpu_test!(ctx => {
        let cache = PipelineCache::for_context(ctx);
        let n = 100u32;
        let buf = storage_init(ctx, "logits", bytemuck::cast_slice(&vec![0f32; n as usize])).unwrap();
        let mut pen = Penalize::new(ctx, &cache, n, 1, &buf, None).await.unwrap();
        let p = Penalties { repeat: 1.1, presence: 0.0, frequency: 0.0 };
        let e = |id| LogitEdit { id, count: 1, bias: 0.0 };
        let step = |edits: Vec<LogitEdit>, mask: Option<&'static [u32]>| StepEdits { penalties: p, edits, mask, pending: None };
        assert!(pen.prepare(ctx, &[step(vec![e(1)], None), step(vec![e(2)], None)]).is_err(), "more rows than the buffers hold");
        assert!(pen.prepare(ctx, &[step(vec![e(100)], None)]).is_err(), "id outside the vocabulary");
        assert!(pen.prepare(ctx, &[step(vec![], Some(&[0u32; 3]))]).is_err(), "mask too short");
        assert!(pen.prepare(ctx, &[step(vec![], Some(&[0u32; 5]))]).is_err(), "mask too long");
        let ok = pen.prepare(ctx, &[step(vec![e(99)], Some(&[u32::MAX; 4]))]).unwrap();
        assert_eq!((ok.n_edits, ok.mask), (1, true));
        // A list longer than the one allocated at load grows it.
        let many: Vec<LogitEdit> = (0..3000).map(|i| e(i % n)).collect();
        assert_eq!(pen.prepare(ctx, &[step(many, None)]).unwrap().n_edits, 3000);
        assert!(Penalize::new(ctx, &cache, 200, 1, &buf, None).await.is_err(), "logits too small");
        ctx.check().unwrap();
    });
}

/// `n_rows` rows with their own edits in one step, each equal to the CPU's and to the row
/// alone.
async fn rows(ctx: &GpuContext, n_rows: usize) {
    let n = 1000usize;
    let mut rng = TestRng::new(40 + n_rows as u64);
    let all = cases();
    let samplers: Vec<Sampler> = (0..n_rows).map(|r| cpu_sampler(&mut rng, n, &all[r % all.len()])).collect();
    let logits: Vec<Vec<f32>> = (0..n_rows).map(|_| random_logits(&mut rng, n)).collect();
    let buf = storage_init(ctx, "logits", bytemuck::cast_slice(&vec![SENTINEL; n_rows * n + 2])).unwrap();
    let mut pen = Penalize::new(ctx, pipelines(), n as u32, n_rows as u32, &buf, None).await.unwrap();
    ctx.queue.write_buffer(&buf, 0, bytemuck::cast_slice(&logits.concat()));
    let edits: Vec<StepEdits> = samplers.iter().map(StepEdits::from_sampler).collect();
    let plan = pen.prepare(ctx, &edits).unwrap();
    submit(ctx, |p| pen.encode(p, &plan));
    let together = read_f32(ctx, &buf, 0, n_rows * n + 2).await.unwrap();
    assert_untouched(&together[n_rows * n..], "wrote past the logits");
    for (r, s) in samplers.iter().enumerate() {
        let mut want = logits[r].clone();
        s.penalize(&mut want);
        let got = &together[r * n..(r + 1) * n];
        let e = finite_nmse(got, &want).unwrap_or_else(|| panic!("row {r}'s bans"));
        assert!(e <= NMSE_F32, "row {r} nmse {e}");
        // Alone, the row edits to the same bits.
        ctx.queue.write_buffer(&buf, 0, bytemuck::cast_slice(&logits[r]));
        let plan = pen.prepare(ctx, &[StepEdits::from_sampler(s)]).unwrap();
        submit(ctx, |p| pen.encode(p, &plan));
        let alone = read_f32(ctx, &buf, 0, n).await.unwrap();
        assert!(alone.iter().zip(got).all(|(a, b)| a.to_bits() == b.to_bits()), "row {r} differs from alone");
    }
    ctx.check().unwrap();
}

flint_gpu::op_tests! { rows;
    rows_edit_their_own_logits => [3usize, 8],
}

/// Rows whose pending token only the device holds (an overlapped step feeds it into the
/// batch) get the same bits as once their samplers accepted it: the token already in the
/// window's counts, the one a full window pushes out, biased only, new; windows of 4 and 64
/// and the whole context; a row without penalties and a row with no pending token beside them.
#[test]
fn pending_tokens_are_counted_as_once_accepted() {
    flint_gpu::gpu_test!(ctx => {
        let n = 1000usize;
        let mut rng = TestRng::new(91);
        let pen = SamplingParams { repeat_penalty: 1.3, presence_penalty: 0.4, frequency_penalty: 0.15, ..Default::default() };
        let sampler = |window: i32, bias: Vec<(u32, f32)>, history: &[u32]| {
            let mut s = Sampler::new(SamplingParams { repeat_last_n: window, logit_bias: bias, ..pen.clone() }).unwrap();
            s.accept_all(history);
            s
        };
        let history = [7u32, 3, 7, 9, 11, 3];
        // (sampler, its pending token; None: the host has read it)
        let rows: Vec<(Sampler, Option<u32>)> = vec![
            (sampler(4, vec![], &history), Some(7)),
            (sampler(4, vec![], &history), Some(9)),
            (sampler(4, vec![(500, 2.0)], &history), Some(500)),
            (sampler(64, vec![], &history), Some(42)),
            (sampler(-1, vec![(3, -1.0)], &history), Some(3)),
            (Sampler::new(SamplingParams::default()).unwrap(), Some(7)),
            (sampler(4, vec![], &history), None),
        ];
        let n_rows = rows.len();
        // The step's tokens: row r's pending token at 2r + 1, other ids around it.
        let mut tokens: Vec<u32> = (0..2 * n_rows as u32 + 1).map(|i| 600 + i).collect();
        for (r, (_, p)) in rows.iter().enumerate() {
            if let Some(id) = p {
                tokens[2 * r + 1] = *id;
            }
        }
        let tok_buf = storage_init(ctx, "tokens", bytemuck::cast_slice(&tokens)).unwrap();
        let logits: Vec<f32> = (0..n_rows).flat_map(|_| random_logits(&mut rng, n)).collect();
        let buf = storage_init(ctx, "logits", bytemuck::cast_slice(&vec![SENTINEL; n_rows * n + 2])).unwrap();
        let mut pen = Penalize::new(ctx, pipelines(), n as u32, n_rows as u32, &buf, Some(&tok_buf)).await.unwrap();
        let run = |pen: &mut Penalize, edits: &[StepEdits]| {
            ctx.queue.write_buffer(&buf, 0, bytemuck::cast_slice(&logits));
            let plan = pen.prepare(ctx, edits).unwrap();
            submit(ctx, |p| pen.encode(p, &plan));
            plan
        };
        let pending: Vec<StepEdits> = rows
            .iter()
            .enumerate()
            .map(|(r, (s, p))| match p {
                Some(_) => StepEdits::with_pending(s, 2 * r as u32 + 1),
                None => StepEdits::from_sampler(s),
            })
            .collect();
        let plan = run(&mut pen, &pending);
        assert!(plan.pending);
        let got = read_f32(ctx, &buf, 0, n_rows * n + 2).await.unwrap();
        assert_untouched(&got[n_rows * n..], "wrote past the logits");
        let accepted: Vec<Sampler> = rows
            .iter()
            .map(|(s, p)| {
                let mut s = s.clone();
                s.accept_all(p.as_slice());
                s
            })
            .collect();
        run(&mut pen, &accepted.iter().map(StepEdits::from_sampler).collect::<Vec<_>>());
        let want = read_f32(ctx, &buf, 0, n_rows * n).await.unwrap();
        for r in 0..n_rows {
            let (g, w) = (&got[r * n..(r + 1) * n], &want[r * n..(r + 1) * n]);
            let differ = (0..n).find(|&i| g[i].to_bits() != w[i].to_bits());
            assert!(differ.is_none(), "row {r}: token {:?}: {:?} pending, {:?} accepted", differ, differ.map(|i| g[i]), differ.map(|i| w[i]));
            // And the edits did something where penalties are on.
            if let (Some(id), true) = (rows[r].1, rows[r].0.params().penalties_on()) {
                assert_ne!(g[id as usize].to_bits(), logits[r * n + id as usize].to_bits(), "row {r}: its pending token {id} was not penalized");
            }
        }
        // A pending token outside the step's tokens, or with no tokens bound, is refused.
        let s = &rows[0].0;
        assert!(pen.prepare(ctx, &[StepEdits::with_pending(s, tokens.len() as u32)]).is_err());
        let mut unbound = Penalize::new(ctx, pipelines(), n as u32, 1, &buf, None).await.unwrap();
        assert!(unbound.prepare(ctx, &[StepEdits::with_pending(s, 0)]).is_err());
        ctx.check().unwrap();
    });
}

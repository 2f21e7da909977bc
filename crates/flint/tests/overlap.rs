//! Overlapped steps on the GPU (`Backend::submit` / `collect`, issue 35's async scheduling):
//! a step submitted before the previous one is read, its tokens fed on the device from that
//! step's draws, draws what the same steps run one after another draw, bit for bit (ids and
//! log-probabilities), with a greedy and a seeded sampler, rows crossing between the steps.
//! Misuse is refused with an error: a feed past the previous step's rows, a third
//! outstanding step, collecting out of order, a plain step while steps are outstanding.
//! And the engine: requests decoded with overlapped steps get the tokens and finish reasons
//! they get without them (greedy, seeded, different lengths, a penalized request that
//! joins midway), and the overlap did happen; penalized requests alone overlap too (the
//! device counts the token it feeds) and draw what they draw without; constrained and
//! predicted requests sit out every other step while the rest overlap, and reply as without.

mod common;

use std::sync::Arc;

use flint_core::arch::ModelConfig;
use flint_core::backend::{Backend, BackendOptions, Feed, OutputRow, StepBatch, StepEntry, StepResult, Ticket};
use flint_core::gguf::GgufFile;
use flint_core::kv::KvCache;
use flint_core::sampling::{Sampler, SamplingParams};
use flint_gpu::backend::GpuBackend;
use futures::executor::block_on;
use futures::StreamExt;

use common::{shared, together_with, Job};
use flint::{BackendKind, Constrained, Engine, Event, GenerateParams, Grammar, Input, LoadOptions, Request, SchedStats, SpecConfig};

/// Two sequences' prompts (the starts of the tiny qwen3's golden prompts 1 and 2).
const PROMPTS: [&[u32]; 2] = [&[292, 309, 273, 992, 287, 791, 13], &[764, 1504, 661, 478, 325]];

fn samplers() -> [Sampler; 2] {
    let seeded = SamplingParams { temperature: 0.9, top_k: 0, top_p: 1.0, min_p: 0.0, seed: Some(7), n_logprobs: 2, ..SamplingParams::greedy() };
    [Sampler::new(SamplingParams { n_logprobs: 2, ..SamplingParams::greedy() }).unwrap(), Sampler::new(seeded).unwrap()]
}

/// One step: `order` lists the sequences (0, 1) in entry order, each with its tokens from
/// `start`; every entry has an output at its last token.
fn batch<'a>(kv: &'a KvCache, order: &[usize], tokens: &'a [Vec<u32>; 2], starts: [usize; 2], samplers: &'a mut [Sampler; 2]) -> StepBatch<'a> {
    let [a, b] = samplers;
    let mut by_seq = [Some(a), Some(b)];
    let entries = order
        .iter()
        .map(|&s| StepEntry {
            tokens: &tokens[s],
            start: starts[s],
            tables: kv.tables(s as u64 + 1),
            outputs: vec![OutputRow { index: tokens[s].len() - 1, sampler: by_seq[s].take().unwrap() }],
        })
        .collect();
    StepBatch { entries, copies: &[], logits: false }
}

/// Steps of the prompts, then two decode steps (sequence 1 first in the first of them).
const ORDERS: [[usize; 2]; 3] = [[0, 1], [1, 0], [0, 1]];

fn reserve(kv: &mut KvCache, len: [usize; 2]) {
    for (s, &n) in len.iter().enumerate() {
        assert!(kv.reserve(s as u64 + 1, n).unwrap().is_empty());
    }
}

fn fresh_kv(backend: &dyn Backend) -> KvCache {
    let mut kv = KvCache::new(backend.kv_layout().clone());
    kv.open(1);
    kv.open(2);
    kv
}

/// The three steps one after another, each decode step's tokens the host's.
fn one_by_one(backend: &mut dyn Backend) -> Vec<StepResult> {
    let mut kv = fresh_kv(backend);
    let mut samplers = samplers();
    let mut tokens = PROMPTS.map(|p| p.to_vec());
    let mut starts = [0, 0];
    let mut out = Vec::new();
    for order in ORDERS {
        reserve(&mut kv, [starts[0] + tokens[0].len(), starts[1] + tokens[1].len()]);
        let r = block_on(backend.step(batch(&kv, &order, &tokens, starts, &mut samplers))).unwrap();
        for (row, &s) in order.iter().enumerate() {
            starts[s] += tokens[s].len();
            tokens[s] = vec![r.sampled[row].id];
        }
        out.push(r);
    }
    out
}

/// The same steps overlapped: each decode step is submitted before the previous one is
/// collected, its tokens fed from that step's rows (stand-in ids 0 on the host).
fn overlapped(backend: &mut dyn Backend) -> Vec<StepResult> {
    let mut kv = fresh_kv(backend);
    let mut samplers = samplers();
    let mut tokens = PROMPTS.map(|p| p.to_vec());
    let mut starts = [0, 0];
    let mut tickets = std::collections::VecDeque::new();
    let mut out = Vec::new();
    let mut prev: Option<[usize; 2]> = None;
    for order in ORDERS {
        reserve(&mut kv, [starts[0] + tokens[0].len(), starts[1] + tokens[1].len()]);
        // Token i of this step is sequence order[i]'s, drawn at the row it had before.
        let feeds: Vec<Feed> = match prev {
            None => Vec::new(),
            Some(p) => order.iter().enumerate().map(|(i, s)| Feed { token: i, row: p.iter().position(|x| x == s).unwrap() }).collect(),
        };
        let t = block_on(backend.submit(batch(&kv, &order, &tokens, starts, &mut samplers), &feeds, None)).unwrap();
        tickets.push_back(t);
        for &s in &order {
            starts[s] += tokens[s].len();
            tokens[s] = vec![0];
        }
        if tickets.len() == 2 {
            out.push(block_on(backend.collect(tickets.pop_front().unwrap())).unwrap());
        }
        prev = Some(order);
    }
    out.push(block_on(backend.collect(tickets.pop_front().unwrap())).unwrap());
    out
}

fn load() -> Option<GpuBackend> {
    let ctx = flint_gpu::testing::context()?;
    let file = GgufFile::open(shared().join("golden/families/qwen3/model.gguf")).unwrap();
    let cfg = ModelConfig::from_gguf(&file).unwrap();
    let opts = BackendOptions {
        n_ctx: 64,
        max_seqs: 2,
        max_batch_tokens: 16,
        max_outputs: 2,
        kv_budget_bytes: None,
        cache_k: Default::default(),
        cache_v: Default::default(),
        exact: true,
    };
    let gpu_ctx = Arc::new(block_on(flint_gpu::GpuContext::with_adapter(Some(&ctx.info.name))).unwrap());
    Some(block_on(GpuBackend::new(gpu_ctx, &file, cfg, &opts, None)).unwrap())
}

#[test]
fn overlapped_steps_draw_what_steps_one_after_another_draw() {
    let Some(mut gpu) = load() else { return };
    assert!(gpu.overlaps());
    let want = one_by_one(&mut gpu);
    let got = overlapped(&mut gpu);
    assert_eq!(got, want, "overlapped steps differ from the same steps one after another");
    // The seeded row really samples: its draws carry log-probabilities like the greedy one's.
    assert!(want.iter().all(|r| r.sampled.iter().all(|s| s.logprob.is_some() && s.top_logprobs.len() == 2)));
}

#[test]
fn overlapped_steps_refuse_misuse() {
    let Some(mut gpu) = load() else { return };
    let mut kv = fresh_kv(&gpu);
    reserve(&mut kv, [PROMPTS[0].len() + 1, PROMPTS[1].len() + 1]);
    let tokens = PROMPTS.map(|p| p.to_vec());
    let one = [vec![0u32], vec![0u32]];
    let (mut s1, mut s2, mut s3, mut s4) = (samplers(), samplers(), samplers(), samplers());
    let t0: Ticket = block_on(gpu.submit(batch(&kv, &[0, 1], &tokens, [0, 0], &mut s1), &[], None)).unwrap();
    // Row 2 does not exist: the step before had two output rows.
    let starts = [PROMPTS[0].len(), PROMPTS[1].len()];
    let bad = [Feed { token: 0, row: 2 }];
    assert!(block_on(gpu.submit(batch(&kv, &[0, 1], &one, starts, &mut s2), &bad, None)).is_err());
    let feeds = [Feed { token: 0, row: 0 }, Feed { token: 1, row: 1 }];
    let t1 = block_on(gpu.submit(batch(&kv, &[0, 1], &one, starts, &mut s3), &feeds, None)).unwrap();
    // A third outstanding step, and a plain step while two are outstanding.
    assert!(block_on(gpu.submit(batch(&kv, &[0, 1], &one, starts, &mut s4), &feeds, None)).is_err());
    assert!(block_on(gpu.step(batch(&kv, &[0, 1], &one, starts, &mut samplers()))).is_err());
    // The newer one cannot be collected first.
    assert!(block_on(gpu.collect(Ticket(t1.0))).is_err());
    block_on(gpu.collect(t0)).unwrap();
    block_on(gpu.collect(t1)).unwrap();
}

/// Collecting a step waits for that step only: the step submitted after it is still running
/// when the first one's draws come back, so the device works while the host reads one step
/// and encodes the next. (Waiting for every submission, as reads did before, leaves the
/// device idle then, and the later step always done.) A 16-token prompt step follows a 7-token
/// one; it may by chance finish before the host looks, so up to eight rounds run and one
/// that finds it running passes.
#[test]
fn collecting_a_step_leaves_the_step_after_it_running() {
    let Some(mut gpu) = load() else { return };
    let mut kv = fresh_kv(&gpu);
    let long: Vec<u32> = (0..16).map(|i| 300 + 17 * i).collect();
    reserve(&mut kv, [PROMPTS[0].len(), long.len()]);
    let tokens = [PROMPTS[0].to_vec(), long];
    let running = (0..8).any(|_| {
        let (mut s1, mut s2) = (samplers(), samplers());
        let first = block_on(gpu.submit(batch(&kv, &[0], &tokens, [0, 0], &mut s1), &[], None)).unwrap();
        let second = block_on(gpu.submit(batch(&kv, &[1], &tokens, [0, 0], &mut s2), &[], None)).unwrap();
        block_on(gpu.collect(first)).unwrap();
        let idle = gpu.model().ctx.idle().unwrap();
        block_on(gpu.collect(second)).unwrap();
        !idle
    });
    assert!(running, "in eight rounds the step after a collected one had always finished: collect waits for more than its step");
}

/// Four requests on the tiny qwen3: two greedy of 12 and 5 tokens, a seeded one of 9, and one
/// with a repetition penalty joining once the first has 4 tokens.
fn jobs() -> Vec<Job> {
    let seeded = SamplingParams { temperature: 0.8, seed: Some(3), ..SamplingParams::default() };
    let penalized = SamplingParams { repeat_penalty: 1.3, ..SamplingParams::greedy() };
    vec![
        Job::greedy(PROMPTS[0].to_vec(), 12),
        Job::greedy(PROMPTS[1].to_vec(), 5),
        Job { sampling: seeded, ..Job::greedy(PROMPTS[1][..3].to_vec(), 9) },
        Job { sampling: penalized, join_after: Some((0, 4)), ..Job::greedy(PROMPTS[0][2..].to_vec(), 6) },
    ]
}

/// Runs `work` on the tiny qwen3 loaded on the GPU in the exact mode with overlapped steps
/// on or off, a context of `n_ctx` and a KV pool of `kv_budget_positions`; returns what it
/// made and the engine's counts after.
fn on_qwen3<T>(overlap: bool, n_ctx: usize, kv_budget_positions: Option<usize>, work: impl FnOnce(&Engine) -> T) -> (T, SchedStats) {
    on_qwen3_with(LoadOptions { backend: BackendKind::Gpu, n_ctx, overlap, kv_budget_positions, ..LoadOptions::exact() }, work)
}

/// [`on_qwen3`] with load options of the caller's.
fn on_qwen3_with<T>(opts: LoadOptions, work: impl FnOnce(&Engine) -> T) -> (T, SchedStats) {
    let path = shared().join("golden/families/qwen3/model.gguf");
    let engine = Engine::load_path(&path, &opts).unwrap();
    let out = work(&engine);
    (out, block_on(engine.stats()).unwrap())
}

#[test]
fn the_engine_draws_the_same_tokens_with_and_without_overlapped_steps() {
    if flint_gpu::testing::context().is_none() {
        return;
    }
    let run = |overlap: bool| on_qwen3(overlap, 128, None, |e| together_with(e, &jobs(), false));
    let (plain, none) = run(false);
    let (overlapped, stats) = run(true);
    let steps = stats.overlapped.steps;
    assert_eq!(none.overlapped, flint::Overlap::default(), "steps one after another are not timed as overlapped");
    assert!(steps > 0, "no step was overlapped");
    // The run loop timed them: every step is submitted, encoding takes time.
    assert!(stats.overlapped.submit_us > 0, "{:?}", stats.overlapped);
    for (i, (a, b)) in plain.iter().zip(&overlapped).enumerate() {
        assert_eq!(a.ids, b.ids, "request {i}'s tokens differ with overlapped steps");
        assert_eq!(a.ids.len(), jobs()[i].n_gen);
        let reason = |o: &common::Output| o.summary.as_ref().map(|s| s.finish_reason);
        assert_eq!(reason(a), reason(b), "request {i}'s finish reason differs");
    }
    eprintln!("{steps} steps overlapped: {:?}", stats.overlapped);
}

/// Requests with penalties over windows that fill and slide (8 and 16 tokens, repetition,
/// presence and frequency), greedy and seeded, overlap their steps and draw the tokens they
/// draw one step after another; the penalties change those tokens (against the same requests
/// without them), so they did apply.
#[test]
fn penalized_requests_overlap_and_draw_what_they_draw_without() {
    if flint_gpu::testing::context().is_none() {
        return;
    }
    let pen = |window: i32, seed: Option<u64>| SamplingParams {
        repeat_penalty: 4.0,
        presence_penalty: 1.0,
        frequency_penalty: 1.0,
        repeat_last_n: window,
        temperature: if seed.is_some() { 0.9 } else { 0.0 },
        seed,
        ..SamplingParams::default()
    };
    let jobs = |penalized: bool| {
        let plain = |s: SamplingParams| if penalized { s } else { SamplingParams { repeat_penalty: 1.0, presence_penalty: 0.0, frequency_penalty: 0.0, ..s } };
        vec![
            Job { sampling: plain(pen(8, None)), ..Job::greedy(PROMPTS[0].to_vec(), 24) },
            Job { sampling: plain(pen(16, Some(5))), ..Job::greedy(PROMPTS[1].to_vec(), 20) },
        ]
    };
    let run = |overlap: bool, penalized: bool| on_qwen3(overlap, 128, None, |e| together_with(e, &jobs(penalized), false));
    let (plain, none) = run(false, true);
    let (overlapped, stats) = run(true, true);
    let (unpenalized, _) = run(true, false);
    assert_eq!(none.overlapped.steps, 0);
    assert!(stats.overlapped.steps > 0, "the penalized requests' steps did not overlap");
    for (i, (a, b)) in plain.iter().zip(&overlapped).enumerate() {
        assert_eq!(a.ids, b.ids, "penalized request {i}'s tokens differ with overlapped steps");
    }
    assert_ne!(plain[0].ids, unpenalized[0].ids, "the penalties changed nothing: the test shows nothing");
    eprintln!("{} steps overlapped", stats.overlapped.steps);
}

/// The browser's concurrent-request scenario: two streams together, then one broken off
/// after two tokens while another runs on, then one request with two greedy choices.
/// Returns every reply's tokens per choice.
fn scenario(engine: &Engine) -> Vec<Vec<Vec<u32>>> {
    let req = |prompt: &[u32], n_gen: usize, n: usize| {
        let params = GenerateParams { max_tokens: Some(n_gen), sampling: SamplingParams::greedy(), ignore_eos: true, ..Default::default() };
        let mut r = Request::new(Input::Tokens(prompt.to_vec()), params);
        r.n = n;
        engine.submit(r).unwrap()
    };
    // Reads a stream's tokens per choice, dropping it (a cancel) after `stop_after` tokens.
    let read = |mut h: flint::RequestHandle, n: usize, stop_after: usize| async move {
        let mut ids = vec![Vec::new(); n];
        let mut got = 0;
        while let Some(ev) = h.next().await {
            if let Event::Token { choice, id, .. } = ev.unwrap() {
                ids[choice].push(id);
                got += 1;
                if got >= stop_after {
                    break;
                }
            }
        }
        ids
    };
    block_on(async {
        let (a, b) = futures::future::join(read(req(PROMPTS[0], 5, 1), 1, usize::MAX), read(req(PROMPTS[1], 5, 1), 1, usize::MAX)).await;
        let (c, d) = futures::future::join(read(req(PROMPTS[0], 12, 1), 1, 2), read(req(PROMPTS[1], 5, 1), 1, usize::MAX)).await;
        let two = read(req(PROMPTS[0], 3, 2), 2, usize::MAX).await;
        let after = read(req(PROMPTS[1], 4, 1), 1, usize::MAX).await;
        vec![a, b, c, d, two, after]
    })
}

#[test]
fn cancels_and_several_choices_go_through_overlapped_steps() {
    if flint_gpu::testing::context().is_none() {
        return;
    }
    let (plain, _) = on_qwen3(false, 128, None, scenario);
    let (overlapped, stats) = on_qwen3(true, 128, None, scenario);
    assert!(stats.overlapped.steps > 0, "no step was overlapped");
    assert_eq!(overlapped, plain, "overlapped steps changed a reply");
    let lens: Vec<Vec<usize>> = plain.iter().map(|r| r.iter().map(Vec::len).collect()).collect();
    assert_eq!(lens, [vec![5], vec![5], vec![2], vec![5], vec![3, 3], vec![4]]);
    assert_eq!(plain[4][0], plain[4][1], "greedy choices agree");
}

#[test]
fn preempted_sequences_recompute_through_overlapped_steps() {
    // A 48-token context, a pool of two contexts and a block, four requests that each grow to
    // 44 positions: the scheduler must preempt as they grow, while steps overlap. The same
    // requests with room for all, one step after another, are the oracle.
    if flint_gpu::testing::context().is_none() {
        return;
    }
    let jobs: Vec<Job> = (0..4u32).map(|j| Job::greedy((0..20 + j).map(|i| (i * 37 + 11 * j + 5) % 1500).collect(), 24 - j as usize)).collect();
    let (want, _) = on_qwen3(false, 48, None, |e| together_with(e, &jobs, false));
    let (got, stats) = on_qwen3(true, 48, Some(2 * 48 + 16), |e| together_with(e, &jobs, false));
    assert!(stats.preemptions > 0, "the pool never ran short: {stats:?}");
    assert!(stats.overlapped.steps > 0, "no step was overlapped: {stats:?}");
    for (i, (a, b)) in want.iter().zip(&got).enumerate() {
        assert_eq!(a.ids, b.ids, "request {i}'s tokens differ after preemption with overlapped steps");
    }
}

/// A greedy request for `n_gen` tokens of `prompt` with OpenAI's `prediction`; its tokens and
/// text.
fn predicted(engine: &Engine, prompt: &[u32], n_gen: usize, prediction: Option<String>) -> (Vec<u32>, String) {
    let params = GenerateParams { max_tokens: Some(n_gen), sampling: SamplingParams::greedy(), ignore_eos: true, ..Default::default() };
    let mut r = Request::new(Input::Tokens(prompt.to_vec()), params);
    r.prediction = prediction;
    replies(engine, vec![r]).swap_remove(0).swap_remove(0)
}

/// The tiny qwen3's load options for an engine that accepts predictions (as the server's and
/// the browser's do), overlapping or not, with a context of `n_ctx`.
fn predicting(overlap: bool, n_ctx: usize) -> LoadOptions {
    LoadOptions { backend: BackendKind::Gpu, n_ctx, overlap, spec: SpecConfig { predictions: true, ..LoadOptions::default().spec }, ..LoadOptions::exact() }
}

#[test]
fn an_engine_that_accepts_predictions_overlaps_the_requests_without_one() {
    // The server and the browser load engines that accept predicted outputs. Their requests
    // without a prediction overlap as any engine's do; one with a prediction drafts from it
    // (sitting out every other step while others run) and draws what it draws without one.
    if flint_gpu::testing::context().is_none() {
        return;
    }
    let opts = |overlap| predicting(overlap, 128);
    let (plain, none) = on_qwen3_with(opts(false), |e| together_with(e, &jobs(), false));
    let ((got, alone, with), stats) = on_qwen3_with(opts(true), |e| {
        let got = together_with(e, &jobs(), false);
        let alone = predicted(e, PROMPTS[0], 12, None);
        let with = predicted(e, PROMPTS[0], 12, Some(alone.1.clone()));
        (got, alone, with)
    });
    assert_eq!(none.overlapped.steps, 0);
    assert!(stats.overlapped.steps > 0, "an engine that accepts predictions overlapped no step: {stats:?}");
    for (i, (a, b)) in plain.iter().zip(&got).enumerate() {
        assert_eq!(a.ids, b.ids, "request {i}'s tokens differ with overlapped steps");
    }
    assert!(stats.spec.drafted > 0, "the prediction was not drafted from: {stats:?}");
    assert_eq!(with.0, alone.0, "a prediction changed the greedy tokens");
}

/// Each reply's token ids and text, per request and choice, the requests read together.
fn replies(engine: &Engine, reqs: Vec<Request>) -> Vec<Vec<(Vec<u32>, String)>> {
    let handles: Vec<_> = reqs.into_iter().map(|r| (r.n, engine.submit(r).unwrap())).collect();
    block_on(futures::future::join_all(handles.into_iter().map(|(n, mut h)| async move {
        let mut out = vec![(Vec::new(), String::new()); n];
        while let Some(ev) = h.next().await {
            match ev.unwrap() {
                Event::Token { choice, id, text, .. } => {
                    out[choice].0.push(id);
                    out[choice].1.push_str(&text);
                }
                Event::Done { choice, text, .. } => out[choice].1.push_str(&text),
            }
        }
        out
    })))
}

#[test]
fn constrained_and_predicted_requests_sit_out_every_other_step_while_the_rest_overlap() {
    // A choice whose next step needs the host (its grammar's mask, drafts from its
    // prediction) is not fed: it waits for its readback, sitting out the step submitted
    // meanwhile, and the other requests overlap theirs. Forty digits (one token each) keep a
    // grammar live past the free requests' ends, so an overlapped step means one ran beside
    // it; a JSON schema's keys are forced tokens (fast-forward) and its choices sampled; a
    // prediction is drafted from. Every reply is the one the same engine gives without
    // overlapped steps.
    if flint_gpu::testing::context().is_none() {
        return;
    }
    let opts = |overlap| predicting(overlap, 256);
    let schema = serde_json::json!({
        "type": "object",
        "properties": {"ok": {"type": "boolean"}, "n": {"type": "integer", "minimum": 0, "maximum": 99}, "color": {"enum": ["red", "green", "blue"]}},
        "required": ["ok", "n", "color"],
        "additionalProperties": false
    });
    let reqs = |prediction: &str| {
        let req = |prompt: &[u32], n_gen: usize, sampling: SamplingParams| {
            let params = GenerateParams { max_tokens: Some(n_gen), sampling, ignore_eos: true, ..Default::default() };
            Request::new(Input::Tokens(prompt.to_vec()), params)
        };
        let constrained = |grammar: Grammar, sampling: SamplingParams, n: usize| {
            let params = GenerateParams { max_tokens: Some(120), sampling, ..Default::default() };
            let mut r = Request::new(Input::Text("Answer:".into()), params);
            r.constraint = Some(Constrained { grammar, field: "test" });
            r.n = n;
            r
        };
        let seeded = |seed| SamplingParams { temperature: 0.9, seed: Some(seed), ..SamplingParams::default() };
        let mut with_prediction = req(PROMPTS[0], 12, SamplingParams::greedy());
        with_prediction.prediction = Some(prediction.to_string());
        vec![
            constrained(Grammar::Regex("[0-9]{40}".into()), SamplingParams::greedy(), 1),
            constrained(Grammar::JsonSchema(schema.clone()), seeded(4), 2),
            req(PROMPTS[0], 10, SamplingParams::greedy()),
            req(PROMPTS[1], 12, seeded(8)),
            with_prediction,
        ]
    };
    let alone = on_qwen3_with(opts(false), |e| predicted(e, PROMPTS[0], 12, None)).0;
    let (plain, none) = on_qwen3_with(opts(false), |e| replies(e, reqs(&alone.1)));
    let (got, stats) = on_qwen3_with(opts(true), |e| replies(e, reqs(&alone.1)));
    assert_eq!(none.overlapped.steps, 0);
    assert!(stats.overlapped.steps > 0, "no step overlapped while a grammar was live: {stats:?}");
    assert!(stats.spec.drafted > 0, "the prediction was not drafted from: {stats:?}");
    let digits = &got[0][0].1;
    assert!(digits.len() == 40 && digits.bytes().all(|b| b.is_ascii_digit()), "the regex reply {digits:?}");
    let json: serde_json::Value = serde_json::from_str(&got[1][0].1).unwrap_or_else(|e| panic!("{e}: {:?}", got[1][0].1));
    assert!(json["color"].is_string(), "{json}");
    assert_eq!(got[4][0].0, alone.0, "a prediction changed the greedy tokens");
    for (i, (a, b)) in plain.iter().zip(&got).enumerate() {
        assert_eq!(a, b, "request {i}'s replies differ with overlapped steps");
    }
    eprintln!("{} steps overlapped", stats.overlapped.steps);
}

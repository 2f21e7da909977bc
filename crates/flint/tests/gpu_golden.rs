//! Whole-model oracle tests on the GPU (lavapipe in CI), and batched equals alone. Every
//! golden prompt runs alone (its last-position logits against the f32 reference, 16 greedy
//! ids under the near-tie rule; qwen's 1,187-token prompt 7 runs in `kv_types.rs` instead,
//! with f16 and q8_0 caches, f16 at this file's bar: on lavapipe it costs as much as qwen's
//! other six together, and gemma's prompt 7 takes the f32 cache past 512 tokens here), then
//! the prompts run together: different lengths, so prompt chunks and decodes share steps; a
//! second wave joins while the first decodes; two requests sample with seeds; and a copy of a
//! long prompt (gemma: prompt 7, past its 512-token window; qwen: prompt 5) joins once the
//! first copy is decoding and must start from its KV blocks. Every request's every logit must
//! equal its solo run's bit for bit (the kernels are batch-invariant). And gemma once more
//! with its weights split at 64 MB (two prompts); and forced preemption.
//!
//! Speculative decoding with n-gram drafts rides on the same runs (the kernels are compiled
//! already): greedy requests that draft from their own tokens must give the tokens and logits
//! of greedy decoding without speculation, bit for bit (a verify entry's rows equal one-token
//! steps), alone and sharing steps with seeded sampled requests, which speculate too and must
//! draw their solo tokens; and drafts must have been both accepted and rejected, so the
//! verify path really ran; and a stop string (gemma) and an end-of-generation token (qwen)
//! inside a run of accepted drafts end the reply where plain decoding ends it.

mod common;

use common::{assert_same, check_golden, golden_prompt, solo, together, Job, Output};
use flint::{BackendKind, Engine, Event, FinishReason, GenerateParams, Input, LoadOptions, Request, SamplingParams, SpecConfig};
use futures::StreamExt;

fn gpu(name: &str, max_binding_mb: Option<u64>) -> Option<Engine> {
    gpu_with(name, LoadOptions { max_binding_mb, ..LoadOptions::exact() })
}

fn gpu_with(name: &str, opts: LoadOptions) -> Option<Engine> {
    flint_gpu::testing::context()?;
    let opts = LoadOptions { backend: BackendKind::Gpu, ..opts };
    Some(Engine::load_path(&common::model_path(name), &opts).unwrap())
}

/// Greedy tokens each speculative request runs alone.
const SPECULATIVE: usize = 8;

const GREEDY: usize = 16;
/// Tokens each request generates in the batched run (short: the prompts are the point).
const BATCHED: usize = 8;
/// Tokens a seeded request draws.
const SEEDED: usize = 6;

/// Greedy jobs of golden prompts 1 to `n`.
fn golden_jobs(engine: &Engine, golden: &str, n: usize) -> Vec<Job> {
    (1..=n).map(|i| Job::greedy(golden_prompt(engine, golden, i), GREEDY)).collect()
}

/// The first `n` tokens of a run.
fn first(out: &Output, n: usize) -> Output {
    Output { ids: out.ids[..n].to_vec(), logits: out.logits[..n].to_vec(), summary: out.summary.clone() }
}

/// `long`: the golden prompt whose copy joins later (its index, 1-based); `prompts`: the
/// golden prompts of the batched run (and 1 to their largest run alone); `spec_alone`: those
/// that also run alone with n-gram drafts.
fn batched_equals_alone(name: &str, golden: &str, prompts: &[usize], long: usize, spec_alone: &[usize]) {
    let Some(engine) = gpu(name, None) else { return };
    let t0 = std::time::Instant::now();
    let n = *prompts.iter().max().unwrap();
    let mut jobs = golden_jobs(&engine, golden, n);
    let seeded = |p: &Job, seed| Job {
        n_gen: SEEDED,
        sampling: SamplingParams { temperature: 0.9, top_k: 0, top_p: 0.95, min_p: 0.0, seed: Some(seed), ..Default::default() },
        ..p.clone()
    };
    jobs.push(seeded(&jobs[1], 11));
    jobs.push(seeded(&jobs[3], 12));
    let alone = solo(&engine, &jobs);
    eprintln!("{name}: {} requests alone in {:.1}s", jobs.len(), t0.elapsed().as_secs_f64());
    let agree: Vec<usize> = (0..n).map(|i| check_golden(&format!("{name} alone"), golden, i + 1, &alone[i])).collect();
    eprintln!("{name}: tokens before the first difference from llama.cpp's greedy output: {agree:?}");

    // Together: the first half of the prompts and a seeded request at once, the rest joining
    // once the first has two tokens, and the long prompt's copy once its first has one.
    let t1 = std::time::Instant::now();
    let mut batched: Vec<Job> = Vec::new();
    let mut want: Vec<Output> = Vec::new();
    for (k, &p) in prompts.iter().enumerate() {
        let join_after = if k % 2 == 0 { None } else { Some((0, 2)) };
        batched.push(Job { n_gen: BATCHED, join_after, ..jobs[p - 1].clone() });
        want.push(first(&alone[p - 1], BATCHED));
    }
    batched.push(Job { join_after: None, ..jobs[n].clone() });
    batched.push(Job { join_after: Some((0, 2)), ..jobs[n + 1].clone() });
    want.extend([alone[n].clone(), alone[n + 1].clone()]);
    let at = prompts.iter().position(|&p| p == long).expect("the long prompt runs batched");
    batched.push(Job { n_gen: BATCHED, join_after: Some((at, 1)), ..jobs[long - 1].clone() });
    want.push(first(&alone[long - 1], BATCHED));
    let got = together(&engine, &batched);
    eprintln!("{name}: {} requests together in {:.1}s", batched.len(), t1.elapsed().as_secs_f64());
    assert_same(&format!("{name} batched"), &want, &got);
    let copy = got.last().unwrap().summary.as_ref().unwrap();
    let len = jobs[long - 1].prompt.len();
    assert_eq!(copy.cached_prompt_tokens, (len - 1) / 16 * 16, "{name}: the copy of prompt {long} must start from the first's full blocks");
    assert_eq!(got[at].summary.as_ref().unwrap().cached_prompt_tokens, 0, "{name}: the first copy runs cold");
    drop(engine);

    // With n-gram drafts: alone, then the batched run again (its seeded requests draft too).
    let spec = gpu_with(name, LoadOptions { spec: SpecConfig::ngram(), ..LoadOptions::exact() }).expect("the adapter was found above");
    let t2 = std::time::Instant::now();
    let solo_jobs: Vec<Job> = spec_alone.iter().map(|&p| Job { n_gen: SPECULATIVE, ..jobs[p - 1].clone() }).collect();
    let spec_solo = solo(&spec, &solo_jobs);
    let spec_want: Vec<Output> = spec_alone.iter().map(|&p| first(&alone[p - 1], SPECULATIVE)).collect();
    assert_same(&format!("{name} speculative alone"), &spec_want, &spec_solo);
    let spec_got = together(&spec, &batched);
    assert_same(&format!("{name} speculative batched"), &want, &spec_got);
    eprintln!("{name}: speculative, alone and batched, in {:.1}s", t2.elapsed().as_secs_f64());
    let (drafted, accepted) =
        spec_solo.iter().chain(&spec_got).map(|o| o.summary.as_ref().unwrap()).fold((0, 0), |(d, a), s| (d + s.draft_tokens, a + s.accepted_draft_tokens));
    eprintln!("{name}: drafted {drafted}, accepted {accepted}");
    assert!(accepted > 0, "{name}: no draft was accepted ({drafted} drafted)");
    assert!(accepted < drafted, "{name}: no draft was rejected ({drafted} drafted)");
    let stats = futures::executor::block_on(spec.stats()).unwrap();
    assert_eq!(stats.spec.accepted as usize, accepted, "the engine's counters sum the requests'");
    if name.starts_with("gemma") {
        stop_inside_an_accepted_run(&spec);
    } else {
        eog_inside_an_accepted_run(&spec);
    }
}

/// Text, finish reason and accepted drafts of one greedy request.
fn complete(engine: &Engine, prompt: &str, n: usize, stop: &[&str], speculative: bool) -> (String, FinishReason, usize) {
    let (text, reason, accepted, _) = complete_counted(engine, prompt, n, stop, speculative);
    (text, reason, accepted)
}

/// [`complete`], and the tokens generated.
fn complete_counted(engine: &Engine, prompt: &str, n: usize, stop: &[&str], speculative: bool) -> (String, FinishReason, usize, usize) {
    let params = GenerateParams {
        max_tokens: Some(n),
        sampling: SamplingParams::greedy(),
        stop: stop.iter().map(|s| s.to_string()).collect(),
        speculative: Some(speculative),
        ..Default::default()
    };
    futures::executor::block_on(async {
        let mut events = engine.submit(Request::new(Input::Text(prompt.into()), params)).unwrap();
        let mut text = String::new();
        while let Some(ev) = events.next().await {
            match ev.unwrap() {
                Event::Token { text: t, .. } => text.push_str(&t),
                Event::Done { summary, text: t, .. } => {
                    text.push_str(&t);
                    return (text, summary.finish_reason, summary.accepted_draft_tokens, summary.completion_tokens);
                }
            }
        }
        panic!("the request ended without Done")
    })
}

/// A stop string met inside a run of accepted drafts ends the reply there, as plain decoding
/// would: nothing after it is emitted. The list repeats, so the drafts run through the stop.
fn stop_inside_an_accepted_run(engine: &Engine) {
    let list = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu.";
    let prompt = format!("Repeat this list exactly: {list} Again: {list} Again:");
    let (plain, reason, _) = complete(engine, &prompt, 24, &[], false);
    assert_eq!(reason, FinishReason::Length);
    let stop = "theta";
    let at = plain.find(stop).expect("the plain reply reaches the stop string");
    let (text, reason, accepted) = complete(engine, &prompt, 24, &[stop], true);
    assert_eq!((text.as_str(), reason), (&plain[..at], FinishReason::Stop), "speculative reply with a stop string");
    assert!(accepted > 0, "the drafts were accepted up to the stop");
}

/// An end-of-generation token met inside a run of accepted drafts ends the reply there, as
/// plain decoding would. The earlier turn gives the reply and its end as a draft: after the
/// first token, the rest of the reply and `<|im_end|>` (and more) are drafted at once.
fn eog_inside_an_accepted_run(engine: &Engine) {
    let turn = "<|im_start|>user\nSay the word yes.<|im_end|>\n<|im_start|>assistant\n";
    let prompt = format!("{turn}The word is yes.<|im_end|>\n{turn}");
    let plain = complete_counted(engine, &prompt, 16, &[], false);
    assert_eq!((plain.0.as_str(), plain.1), ("The word is yes.", FinishReason::Stop), "the plain reply");
    let (text, reason, accepted, n) = complete_counted(engine, &prompt, 16, &[], true);
    assert_eq!((text, reason, n), (plain.0, plain.1, plain.3), "speculative reply ending on end-of-generation");
    // Every token after the first, and the end-of-generation token, were accepted drafts.
    assert_eq!(accepted, n, "the end-of-generation token was not inside an accepted run");
}

/// Prompt 7 (past gemma's 512-token window) drafts in the speculative batched run; alone with
/// drafts, prompts 5, 3 and 1, as qwen's.
#[test]
fn gemma_3_270m_gpu_batched_equals_alone_and_the_f32_reference() {
    batched_equals_alone("gemma-3-270m", "gemma", &[7, 1, 3, 2, 5, 4, 6], 7, &[5, 3, 1]);
}

#[test]
fn qwen2_5_coder_0_5b_gpu_batched_equals_alone_and_the_f32_reference() {
    batched_equals_alone("qwen2.5-coder-0.5b", "qwen", &[5, 1, 3, 2, 4, 6], 5, &[5, 3, 1]);
}

/// Golden prompts the split-weights run checks: a short one and one of a few hundred tokens
/// (the split is in the weights, which every token reads; the batched tests cover the rest).
const SPLIT_PROMPTS: [usize; 2] = [1, 5];

/// A model drafting for itself (the same file as target and draft): greedy requests
/// get plain decoding's tokens and logits bit for bit, and every greedy draft is accepted
/// (the draft's one-token steps and the target's verify rows compute the same logits); seeded
/// requests draw plain decoding's tokens, and their sampled drafts (drawn with the request's
/// settings and random counters, verified against the draft's distribution) are all kept.
/// Checks the draft model's plumbing: its own KV, prefill, catching up and rollback, and the
/// store of draft distributions.
/// On prompt 5 (a few hundred tokens: the draft's prefill is more than a step) and one seed:
/// every step runs the draft up to its draft length, so on lavapipe each request costs
/// several of the batched test's.
#[test]
fn gemma_3_270m_drafts_for_itself() {
    drafts_for_itself("gemma-3-270m", "gemma", &[5], 5..6);
}

/// qwen2.5-coder-0.5b drafting for itself, as gemma above, on a short prompt.
#[test]
fn qwen2_5_coder_0_5b_drafts_for_itself() {
    drafts_for_itself("qwen2.5-coder-0.5b", "qwen", &[1], 5..6);
}

fn drafts_for_itself(name: &str, golden: &str, prompts: &[usize], seeds: std::ops::Range<u64>) {
    let Some(plain) = gpu(name, None) else { return };
    let path = common::model_path(name);
    let mut jobs: Vec<Job> = prompts.iter().map(|&i| Job::greedy(golden_prompt(&plain, golden, i), SPECULATIVE)).collect();
    let n_greedy = jobs.len();
    for seed in seeds {
        let sampling = SamplingParams { temperature: 1.0, top_k: 40, top_p: 0.9, min_p: 0.0, seed: Some(seed), ..Default::default() };
        jobs.push(Job { n_gen: SEEDED, sampling, ..jobs[0].clone() });
    }
    let t0 = std::time::Instant::now();
    let want = solo(&plain, &jobs);
    drop(plain);
    // Every step drafts (no confidence cut), so the draft runs long and is cut back often.
    let opts = LoadOptions { draft_model: Some(path), draft_p_min: 0.0, ..LoadOptions::exact() };
    let drafting = gpu_with(name, opts).expect("the adapter was found above");
    let alone = solo(&drafting, &jobs);
    assert_same(&format!("{name} drafting for itself, alone"), &want, &alone);
    let got = together(&drafting, &jobs);
    assert_same(&format!("{name} drafting for itself, batched"), &want, &got);
    let counts = |outs: &[Output]| outs.iter().map(|o| o.summary.as_ref().unwrap()).fold((0, 0), |(d, a), s| (d + s.draft_tokens, a + s.accepted_draft_tokens));
    let greedy = counts(&[&alone[..n_greedy], &got[..n_greedy]].concat());
    let sampled = counts(&[&alone[n_greedy..], &got[n_greedy..]].concat());
    eprintln!("{name} drafting for itself in {:.1}s: greedy {greedy:?}, sampled {sampled:?} (drafted, accepted)", t0.elapsed().as_secs_f64());
    assert!(greedy.0 > 0, "nothing was drafted");
    assert_eq!(greedy.1, greedy.0, "a greedy draft of the same model was rejected");
    // Sampled drafts are drawn as the request draws, from the same distribution: all kept.
    assert!(sampled.0 > 0 && sampled.1 == sampled.0, "seeded requests drafted by the same model were rejected: {sampled:?}");
}

#[test]
fn gemma_3_270m_gpu_split_at_64mb_matches_f32_reference() {
    let Some(engine) = gpu("gemma-3-270m", Some(64)) else { return };
    let jobs: Vec<Job> = SPLIT_PROMPTS.iter().map(|&i| Job::greedy(golden_prompt(&engine, "gemma", i), GREEDY)).collect();
    let outs = solo(&engine, &jobs);
    for (&i, out) in SPLIT_PROMPTS.iter().zip(&outs) {
        check_golden("gpu/64MB", "gemma", i, out);
    }
}

#[test]
fn preempted_requests_recompute_to_the_same_tokens() {
    // A 48-token context, a pool of two contexts (and a block), and four requests that each
    // grow to most of one: the scheduler admits three on their prompts and must preempt as
    // they grow. The same four with room for all are the oracle (batched equals alone is
    // shown above).
    if flint_gpu::testing::context().is_none() {
        return;
    }
    let path = common::model_path("gemma-3-270m");
    let roomy = Engine::load_path(&path, &LoadOptions { n_ctx: 48, ..LoadOptions::exact() }).unwrap();
    let texts = [
        "The first law of thermodynamics states that energy cannot be created or destroyed, only",
        "In the beginning of the seventeenth century, the city of Amsterdam grew into a center of",
        "A good recipe for bread needs flour, water, salt and yeast, and the dough must rest for",
        "The river flows from the mountains through three countries before it reaches the sea at",
    ];
    // Each ends at 44 positions: three blocks of the seven.
    let jobs: Vec<Job> = texts.iter().map(|t| roomy.tokenize_raw(t).unwrap()).map(|p| Job::greedy(p.clone(), 44 - p.len())).collect();
    assert!(jobs.iter().all(|j| j.prompt.len() >= 16 && j.prompt.len() < 32), "prompt lengths {:?}", jobs.iter().map(|j| j.prompt.len()).collect::<Vec<_>>());
    let want = together(&roomy, &jobs);
    drop(roomy);
    let tight = Engine::load_path(&path, &LoadOptions { n_ctx: 48, kv_budget_positions: Some(2 * 48 + 16), ..LoadOptions::exact() }).unwrap();
    let got = together(&tight, &jobs);
    let stats = futures::executor::block_on(tight.stats()).unwrap();
    eprintln!("preemption run: {stats:?}");
    assert!(stats.preemptions > 0, "the pool never ran short: {stats:?}");
    assert_same("preempted", &want, &got);
    assert!(got.iter().zip(&jobs).all(|(o, j)| o.ids.len() == j.n_gen));
}

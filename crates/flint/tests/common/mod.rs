//! Shared oracle checks for the whole-model tests: llama.cpp's prompt ids, the f32
//! reference's last-position logits (NMSE ≤ 1e-5) and its greedy continuation; and a driver
//! that runs requests alone or together through `Engine::submit`, keeping every token's
//! logits, so batched runs can be compared with solo ones bit for bit.
#![allow(dead_code)]

use std::path::PathBuf;

use flint::{Engine, Event, GenerateParams, Input, Request, SamplingParams, Summary};
use futures::StreamExt;
use serde_json::Value;

/// NMSE = Σ(a−b)² / Σ(b−mean(b))², the foundation issue's definition.
pub const MAX_NMSE: f64 = 1e-5;
/// A divergence is tolerated only right after a step whose reference top-2 margin is below this.
pub const NEAR_TIE: f64 = 1e-2;

#[allow(unused_imports)]
pub use flint_gpu::testing::{model_path, nmse, shared_dir as shared};

pub fn json(path: PathBuf) -> Value {
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap()
}

pub fn ids(v: &Value) -> Vec<u32> {
    v.as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect()
}

fn prompt_file(golden: &str, index: usize) -> PathBuf {
    let name = match (golden, index) {
        (_, 7) => "p7long.txt".to_string(),
        ("gemma", 6) => "p6g.txt".to_string(),
        ("qwen", 6) => "p6q.txt".to_string(),
        (_, i) => format!("p{i}.txt"),
    };
    shared().join("golden/prompts").join(name)
}

/// Golden prompt `index` of model `golden`, tokenized, checked against llama.cpp's ids.
pub fn golden_prompt(engine: &Engine, golden: &str, index: usize) -> Vec<u32> {
    let llama = json(shared().join(format!("golden/{golden}/{index}.json")));
    let text = std::fs::read_to_string(prompt_file(golden, index)).unwrap();
    let prompt = engine.tokenize_raw(&text).unwrap();
    assert_eq!(prompt, ids(&llama["prompt_token_ids"]), "{golden} prompt {index}: prompt ids differ from llama.cpp's");
    prompt
}

/// Greedy ids must equal the reference's, except after a step whose top-2 margin is a near tie.
pub fn check_greedy(label: &str, got: &[u32], reference: &Value) {
    let want = ids(&reference["greedy_token_ids"]);
    let steps = reference["greedy_steps_top2"].as_array().unwrap();
    assert!(got.len() <= want.len());
    for (i, (&g, &w)) in got.iter().zip(&want).enumerate() {
        if g != w {
            let tie_before = (0..=i).any(|j| {
                let s = &steps[j];
                (s["logit"].as_f64().unwrap() - s["second_logit"].as_f64().unwrap()).abs() < NEAR_TIE
            });
            assert!(tie_before, "{label}: token {i} is {g}, the f32 reference has {w}\n got  {got:?}\n want {want:?}");
            eprintln!("{label}: diverged at {i} after a near tie (allowed)");
            return;
        }
    }
}

/// Checks one golden prompt's run: the first logits against the f32 reference's last-position
/// logits, the greedy ids under the near-tie rule; returns how long llama.cpp agrees.
pub fn check_golden(label: &str, golden: &str, index: usize, out: &Output) -> usize {
    let reference = json(shared().join(format!("golden/f32/{golden}/{index}.json")));
    let llama = json(shared().join(format!("golden/{golden}/{index}.json")));
    let bytes = std::fs::read(shared().join(format!("golden/f32/{golden}/{index}.last_logits.f32"))).unwrap();
    let want: Vec<f32> = bytes.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect();
    let e = nmse(&out.logits[0], &want);
    assert!(e <= MAX_NMSE, "{label}: last-position logits NMSE {e:e} > {MAX_NMSE:e}");
    check_greedy(label, &out.ids, &reference);
    let agree = out.ids.iter().zip(ids(&llama["greedy_token_ids"])).take_while(|(a, b)| **a == *b).count();
    eprintln!("{label}: NMSE {e:.2e}, {} greedy ids match, llama.cpp agrees for {agree}", out.ids.len());
    agree
}

/// One request of a run: its prompt, how many tokens, its sampling, and when it joins.
#[derive(Clone, Debug)]
pub struct Job {
    pub prompt: Vec<u32>,
    pub n_gen: usize,
    pub sampling: SamplingParams,
    /// Submitted once job `.0` has produced `.1` tokens (None: at the start).
    pub join_after: Option<(usize, usize)>,
}

impl Job {
    pub fn greedy(prompt: Vec<u32>, n_gen: usize) -> Job {
        Job { prompt, n_gen, sampling: SamplingParams::greedy(), join_after: None }
    }
}

/// What one request produced: its tokens, the logits each was drawn from, its summary.
#[derive(Clone, Debug, Default)]
pub struct Output {
    pub ids: Vec<u32>,
    pub logits: Vec<Vec<f32>>,
    pub summary: Option<Summary>,
}

fn request(job: &Job, logits: bool) -> Request {
    let params = GenerateParams { max_tokens: Some(job.n_gen), sampling: job.sampling.clone(), ignore_eos: true, ..Default::default() };
    let mut r = Request::new(Input::Tokens(job.prompt.clone()), params);
    r.logits = logits;
    r
}

/// Each job alone, one after another, each from an empty prefix cache; the cache is left
/// empty too.
pub fn solo(engine: &Engine, jobs: &[Job]) -> Vec<Output> {
    let outs = jobs
        .iter()
        .map(|j| {
            engine.clear_cache();
            together(engine, std::slice::from_ref(&Job { join_after: None, ..j.clone() })).remove(0)
        })
        .collect();
    engine.clear_cache();
    outs
}

/// Every job through the engine at once, later ones joining as their `join_after` says.
pub fn together(engine: &Engine, jobs: &[Job]) -> Vec<Output> {
    together_with(engine, jobs, true)
}

/// [`together`], each request asking for its logits (a full readback a token) or not.
pub fn together_with(engine: &Engine, jobs: &[Job], logits: bool) -> Vec<Output> {
    futures::executor::block_on(async {
        let mut outs = vec![Output::default(); jobs.len()];
        let mut pending: Vec<usize> = (0..jobs.len()).collect();
        let mut streams = futures::stream::SelectAll::new();
        let submit = |i: usize| engine.submit(request(&jobs[i], logits)).unwrap().map(move |e| (i, e));
        pending.retain(|&i| {
            if jobs[i].join_after.is_none() {
                streams.push(submit(i));
                false
            } else {
                true
            }
        });
        while let Some((i, ev)) = streams.next().await {
            match ev.unwrap() {
                Event::Token { id, logits: row, .. } => {
                    outs[i].ids.push(id);
                    if logits {
                        outs[i].logits.push(row.expect("logits were asked for"));
                    }
                }
                Event::Done { summary, .. } => outs[i].summary = Some(summary),
            }
            pending.retain(|&k| {
                let (after, n) = jobs[k].join_after.expect("pending jobs join later");
                if outs[after].ids.len() >= n {
                    streams.push(submit(k));
                    false
                } else {
                    true
                }
            });
        }
        assert!(pending.is_empty(), "jobs {pending:?} never joined");
        outs
    })
}

/// Asserts every job's tokens and logits equal the oracle's, bit for bit.
pub fn assert_same(label: &str, want: &[Output], got: &[Output]) {
    for (i, (a, b)) in want.iter().zip(got).enumerate() {
        assert_eq!(a.ids, b.ids, "{label}: request {i}'s tokens differ");
        for (k, (la, lb)) in a.logits.iter().zip(&b.logits).enumerate() {
            if la != lb {
                let worst = la.iter().zip(lb).map(|(x, y)| (x - y).abs()).fold(0f32, f32::max);
                panic!("{label}: request {i}'s logits at token {k} differ (largest difference {worst:e})");
            }
        }
    }
}

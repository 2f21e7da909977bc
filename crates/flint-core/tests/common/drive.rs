//! A minimal run loop for backend tests: prompts joining at given steps, greedy (or seeded)
//! sampling, every output row's logits kept; and the same prompts run alone through
//! [`Solo`], so "batched equals alone" can be checked on any backend.
#![allow(dead_code)]

use std::collections::HashMap;

use flint_core::backend::{Backend, Solo};
use flint_core::kv::{KvCache, SeqId};
use flint_core::sampling::{Sampler, SamplingParams};
use flint_core::sched::{Flow, SchedConfig, Scheduler, SeqEnd};

/// One request: its prompt, the step it arrives at, and how many tokens it generates.
#[derive(Clone, Debug)]
pub struct Job {
    pub prompt: Vec<u32>,
    pub arrive: usize,
    pub n_gen: usize,
    pub sampling: SamplingParams,
}

impl Job {
    pub fn greedy(prompt: Vec<u32>, arrive: usize, n_gen: usize) -> Job {
        Job { prompt, arrive, n_gen, sampling: SamplingParams::greedy() }
    }
}

/// What one request produced: its tokens and the logits each was drawn from.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Output {
    pub ids: Vec<u32>,
    pub logits: Vec<Vec<f32>>,
}

fn sampler(job: &Job) -> Sampler {
    let seed = job.sampling.seed.unwrap_or(0);
    let mut s = Sampler::with_stream(job.sampling.clone(), seed, 0).unwrap();
    s.accept_all(&job.prompt);
    s
}

/// Each job alone, one after another, from an empty cache.
pub fn solo(backend: &mut dyn Backend, jobs: &[Job]) -> Vec<Output> {
    jobs.iter()
        .map(|job| {
            let mut seq = Solo::new(backend);
            let mut s = sampler(job);
            let mut out = Output::default();
            let mut next: Vec<u32> = job.prompt.clone();
            while out.ids.len() < job.n_gen {
                let (sampled, logits) = futures::executor::block_on(seq.run(backend, &next, &mut s, true)).unwrap();
                s.accept(sampled.id);
                out.ids.push(sampled.id);
                out.logits.push(logits.unwrap());
                next = vec![sampled.id];
            }
            out
        })
        .collect()
}

/// Statistics of a batched run.
#[derive(Clone, Copy, Debug, Default)]
pub struct RunStats {
    pub steps: usize,
    pub preemptions: u64,
    /// Most sequences in one step.
    pub max_entries: usize,
    /// Steps that mixed a prompt chunk with other sequences' tokens.
    pub mixed_steps: usize,
}

/// All jobs through one scheduler, each arriving at its step.
pub fn batched(backend: &mut dyn Backend, jobs: &[Job], cfg: SchedConfig) -> (Vec<Output>, RunStats) {
    let mut sched = Scheduler::new(cfg, KvCache::new(backend.kv_layout().clone())).unwrap();
    let mut samplers: HashMap<SeqId, (usize, Sampler)> = HashMap::new();
    let mut outs = vec![Output::default(); jobs.len()];
    let mut stats = RunStats::default();
    let mut step = 0;
    loop {
        for (i, job) in jobs.iter().enumerate().filter(|(_, j)| j.arrive == step) {
            let id = sched.add(job.prompt.clone(), 0).unwrap()[0];
            samplers.insert(id, (i, sampler(job)));
        }
        step += 1;
        if sched.is_idle() {
            if jobs.iter().all(|j| j.arrive < step) {
                break;
            }
            continue;
        }
        let plan = sched.schedule();
        assert!(!plan.is_empty(), "a step with work to do planned nothing");
        stats.steps += 1;
        stats.max_entries = stats.max_entries.max(plan.entries.len());
        if plan.entries.len() > 1 && plan.entries.iter().any(|e| e.len > 1) {
            stats.mixed_steps += 1;
        }
        let owners: Vec<SeqId> = plan.output_seqs();
        let result = {
            let mut by_id: HashMap<SeqId, &mut Sampler> = samplers.iter_mut().filter(|(id, _)| owners.contains(id)).map(|(&id, (_, s))| (id, s)).collect();
            let batch = sched.batch(&plan, &mut by_id, true);
            futures::executor::block_on(backend.step(batch)).unwrap()
        };
        let ids: Vec<u32> = result.sampled.iter().map(|s| s.id).collect();
        let updates = sched.update(&plan, &ids, |row| {
            let (job, s) = samplers.get_mut(&row.seq).unwrap();
            let tok = ids[row.index];
            s.accept(tok);
            let out = &mut outs[*job];
            out.ids.push(tok);
            out.logits.push(result.logits[row.index].clone());
            if out.ids.len() >= jobs[*job].n_gen {
                Flow::Stop
            } else {
                Flow::Next
            }
        });
        for u in updates.iter().filter(|u| u.end == SeqEnd::Finished) {
            samplers.remove(&u.seq);
        }
    }
    stats.preemptions = sched.stats().preemptions;
    (outs, stats)
}

/// Asserts every job's batched tokens and logits equal its solo run's, bit for bit.
pub fn assert_same(label: &str, solo: &[Output], batched: &[Output]) {
    for (i, (a, b)) in solo.iter().zip(batched).enumerate() {
        assert_eq!(a.ids, b.ids, "{label}: job {i}'s tokens differ batched");
        for (k, (la, lb)) in a.logits.iter().zip(&b.logits).enumerate() {
            if la != lb {
                let worst = la.iter().zip(lb).map(|(x, y)| (x - y).abs()).fold(0f32, f32::max);
                panic!("{label}: job {i}'s logits at output {k} differ batched (largest difference {worst:e})");
            }
        }
    }
}

//! A draft model for speculative decoding (`--model-draft`): a smaller model with the
//! target's vocabulary, on the same device, that drafts greedily for every speculating
//! sequence. It keeps its own KV in a pool of its own, managed by a scheduler of its own: each
//! target sequence that drafts has a mirror sequence here, prefilled with the target's tokens
//! the first time it drafts (in chunks, sharing steps with the others' drafting). Before each
//! target step the mirrors catch up with their targets' tokens (cut back to the longest common
//! prefix, so rejected drafts are rolled back, then extended), and k draft steps, batched over
//! the sequences, draft up to k tokens each.
//!
//! Greedy requests are drafted greedily: a greedy draft is a function of the context alone,
//! so the target keeps it exactly where it draws the same token
//! ([`flint_core::spec::accepted_prefix`]). Sampled requests, on a GPU, are drafted by
//! sampling with the request's own settings and history (its penalties, bias and mask), and
//! each drafted row records the draft's distribution q in a store on the device that the
//! target's verify rows read: the target keeps a draft with probability min(1, p/q), the rule
//! of Leviathan et al. ([`flint_core::sampling::DraftLink`]). Each draft position draws with
//! the random counter plain decoding uses there, so where the two models agree (a model
//! drafting for itself) the drafts are plain decoding's tokens and all are kept.

use std::collections::HashMap;

use flint_core::backend::{Backend, BackendError};
use flint_core::kv::{KvCache, SeqId};
use flint_core::sampling::{DraftLink, Sampler, SamplingParams};
use flint_core::sched::{Flow, SchedConfig, Scheduler, SeqEnd};

/// Opens the draft backend again (after a lost device).
pub(crate) type RebuildDraft = Box<dyn FnMut() -> futures::future::LocalBoxFuture<'static, Result<Box<dyn Backend>, crate::EngineError>>>;

pub(crate) struct DraftModel {
    backend: Box<dyn Backend>,
    sched: Scheduler,
    /// Target sequence → its mirror here.
    mirrors: HashMap<SeqId, SeqId>,
    /// Drafted ids must be below the target's vocabulary size (the two may differ a little).
    n_vocab: usize,
    /// And target tokens below the draft's, for the draft to read them.
    draft_vocab: usize,
    /// Drafting stops where the draft's top probability falls below this.
    p_min: f32,
    /// Sampled requests drafting at once, each with `draft_max` rows of the target's store
    /// of draft distributions (0: no store; sampled requests are drafted greedily).
    q_slots: usize,
    draft_max: usize,
    /// The store asked for at the last link: (sequences, draft_max).
    linked: Option<(usize, usize)>,
    rebuild: RebuildDraft,
}

/// One target sequence wanting drafts: at most `k` of them, sampled with `sampler` (the
/// request's, as it stands before the step) or greedy when None.
pub(crate) struct Want {
    pub seq: SeqId,
    pub k: usize,
    pub sampler: Option<Sampler>,
}

/// A sequence's drafts, and for sampled ones the slot of the store their distributions are
/// in: draft j's is row `slot · draft_max + j`.
pub(crate) struct Drafted {
    pub tokens: Vec<u32>,
    pub slot: Option<usize>,
}

impl DraftModel {
    pub fn new(backend: Box<dyn Backend>, cfg: SchedConfig, n_vocab: usize, p_min: f32, rebuild: RebuildDraft) -> Result<DraftModel, crate::EngineError> {
        let sched = Scheduler::new(cfg, KvCache::new(backend.kv_layout().clone()))?;
        let draft_vocab = backend.config().n_vocab;
        Ok(DraftModel { backend, sched, mirrors: HashMap::new(), n_vocab, draft_vocab, p_min, q_slots: 0, draft_max: 0, linked: None, rebuild })
    }

    /// Joins the draft to the target's backend for sampled drafts (both on one GPU): the
    /// target opens a store for `max_seqs` drafts of `draft_max` tokens (or as many as fit).
    /// Elsewhere (the CPU backend, or a draft with ids the target lacks) sampled requests
    /// stay drafted greedily.
    pub async fn link(&mut self, target: &mut dyn Backend, max_seqs: usize, draft_max: usize) -> Result<(), BackendError> {
        self.q_slots = 0;
        self.linked = Some((max_seqs, draft_max));
        let (Some(t), Some(d)) = (target.as_any_mut(), self.backend.as_any_mut()) else { return Ok(()) };
        let (Some(t), Some(d)) = (t.downcast_mut::<flint_gpu::backend::GpuBackend>(), d.downcast_mut::<flint_gpu::backend::GpuBackend>()) else {
            return Ok(());
        };
        // A draft that could sample ids the target lacks would have to drop those draws,
        // which skews the distribution its drafts come from: such a draft drafts greedily.
        if draft_max == 0 || self.draft_vocab > self.n_vocab {
            return Ok(());
        }
        let rows = (max_seqs * draft_max).min(u32::MAX as usize) as u32;
        self.q_slots = t.link_draft(d, rows).await? as usize / draft_max;
        self.draft_max = draft_max;
        Ok(())
    }

    /// Drafts up to `k` tokens after the tokens of each target sequence in `wants`, whose
    /// tokens `target` holds. Sequences still prefilling here, or whose draft's first token
    /// is below `p_min`, get none.
    pub async fn draft(&mut self, target: &Scheduler, wants: Vec<Want>) -> Result<HashMap<SeqId, Drafted>, BackendError> {
        // Mirrors of sequences that ended go (their full blocks stay indexed here).
        let sched = &mut self.sched;
        self.mirrors.retain(|s, d| {
            let keep = target.contains(*s);
            if !keep {
                sched.finish(*d);
            }
            keep
        });
        let n_ctx = self.sched.config().n_ctx;
        // Mirror → (target, k, sampler and slot); each mirror catches up with its target's
        // tokens. Sampled requests take the store's slots in turn; the rest draft greedily.
        type Want = (SeqId, usize, Option<(Sampler, usize)>);
        let mut want: HashMap<SeqId, Want> = HashMap::new();
        let steps = wants.iter().map(|w| w.k).max().unwrap_or(0);
        let mut slots = 0..self.q_slots;
        for w in wants {
            let tokens = target.tokens(w.seq);
            if w.k == 0 || tokens.len() + 1 >= n_ctx {
                continue;
            }
            if let Some(d) = self.follow(w.seq, tokens) {
                // Its bias and mask must name the draft's ids.
                let sampled = w.sampler.filter(|s| s.check_vocab(self.draft_vocab).is_ok()).and_then(|s| Some((s, slots.next()?)));
                want.insert(d, (w.seq, w.k, sampled));
            }
        }
        let mut drafts: HashMap<SeqId, Drafted> = HashMap::new();
        for _ in 0..steps {
            let plan = self.sched.schedule();
            if plan.is_empty() {
                break;
            }
            let outs = plan.output_seqs();
            // With the top token's log-probability (for p_min); a sampled draft is drawn as the
            // request draws at that position, and records its distribution.
            let greedy = Sampler::new(SamplingParams { n_logprobs: 1, ..SamplingParams::greedy() })?;
            let mut samplers: Vec<Sampler> = outs
                .iter()
                .map(|d| match want.get(d) {
                    Some((s, _, Some((base, slot)))) => {
                        let done = drafts.get(s).map_or(&[][..], |x| &x.tokens[..]);
                        let mut row = base.after(done).with_logprobs(1);
                        row.set_link(Some(DraftLink::Record { q_row: (slot * self.draft_max + done.len()) as u32 }));
                        row
                    }
                    _ => greedy.clone(),
                })
                .collect();
            let result = {
                let mut map: HashMap<SeqId, &mut Sampler> = outs.iter().copied().zip(samplers.iter_mut()).collect();
                let batch = self.sched.batch(&plan, &mut map, false);
                self.backend.step(batch).await?
            };
            let ids: Vec<u32> = result.sampled.iter().map(|s| s.id).collect();
            let (n_vocab, p_min) = (self.n_vocab, self.p_min);
            let updates = self.sched.update(&plan, &ids, |row| {
                // A mirror not drafting this step (still prefilling for a finished target)
                // just keeps what it computed.
                let Some(&(s, k, ref sampled_with)) = want.get(&row.seq) else { return Flow::Hold };
                let sampled = &result.sampled[row.index];
                let slot = sampled_with.as_ref().map(|w| w.1);
                let list = &mut drafts.entry(s).or_insert_with(|| Drafted { tokens: Vec::new(), slot }).tokens;
                // The draft's top probability (its token's, when greedy).
                let p = sampled.top_logprobs.first().map(|t| t.1).or(sampled.logprob).map_or(1.0, f32::exp);
                let usable = (sampled.id as usize) < n_vocab && p >= p_min;
                if usable {
                    list.push(sampled.id);
                }
                // Past the last draft nothing more runs: the mirror is cut back next time.
                if usable && list.len() < k && row.held + 2 < n_ctx {
                    Flow::Next
                } else {
                    want.remove(&row.seq);
                    Flow::Hold
                }
            });
            // A broken row drafts nothing more for its mirror.
            for u in updates.iter().filter(|u| u.end == SeqEnd::Broken) {
                want.remove(&u.seq);
            }
            if want.is_empty() {
                break;
            }
        }
        drafts.retain(|_, v| !v.tokens.is_empty());
        Ok(drafts)
    }

    /// The mirror of target sequence `s`, caught up with its `tokens`: a new one (to be
    /// prefilled) the first time, else cut back to their common prefix and extended. None
    /// when the mirror cannot be made (its prompt is refused here).
    fn follow(&mut self, s: SeqId, tokens: &[u32]) -> Option<SeqId> {
        let readable = |t: &[u32]| t.iter().all(|&id| (id as usize) < self.draft_vocab);
        if let Some(&d) = self.mirrors.get(&s) {
            let have = self.sched.tokens(d);
            let common = have.iter().zip(tokens).take_while(|(a, b)| a == b).count();
            if !readable(&tokens[common..]) {
                return None;
            }
            // A cut past what the sliding windows keep (or to nothing) starts the mirror over.
            if common > 0 && (common == have.len() || self.sched.truncate(d, common).is_ok()) {
                self.sched.extend(d, &tokens[common..]);
                return Some(d);
            }
            self.sched.discard(d);
            self.mirrors.remove(&s);
        }
        if !readable(tokens) {
            return None;
        }
        let d = self.sched.add(tokens.to_vec(), 0).ok()?[0];
        self.mirrors.insert(s, d);
        Some(d)
    }

    /// Drops every mirror and cached prefix (the device's KV is gone or suspect).
    pub fn reset(&mut self) {
        for (_, d) in self.mirrors.drain() {
            self.sched.discard(d);
        }
        self.sched.clear_cache();
    }

    /// Loads the draft model again (on a new device after a lost one, with `target` loaded
    /// again there); its KV starts empty.
    pub async fn rebuild(&mut self, target: &mut dyn Backend) -> Result<(), crate::EngineError> {
        self.reset();
        let backend = (self.rebuild)().await?;
        if backend.kv_layout() != self.backend.kv_layout() {
            return Err(crate::EngineError::Draft { model: String::new(), source: crate::DraftError::KvLayoutChanged });
        }
        self.backend = backend;
        if let Some((max_seqs, draft_max)) = self.linked {
            self.link(target, max_seqs, draft_max).await?;
        }
        Ok(())
    }
}

//! A draft model for speculative decoding (`--model-draft`): a smaller model with the
//! target's vocabulary, on the same device, that drafts greedily for every speculating
//! sequence. It keeps its own KV in a pool of its own, managed by a scheduler of its own: each
//! target sequence that drafts has a mirror sequence here, prefilled with the target's tokens
//! the first time it drafts (in chunks, sharing steps with the others' drafting). Before each
//! target step the mirrors catch up with their targets' tokens (cut back to the longest common
//! prefix, so rejected drafts are rolled back, then extended), and k draft steps, batched over
//! the sequences, draft up to k tokens each. Greedy drafts are a function of the context
//! alone, so the target keeps a draft exactly where it draws the same token
//! ([`flint_core::spec::accepted_prefix`]): greedy and seeded output stay those of decoding
//! without speculation.

use std::collections::HashMap;

use flint_core::backend::{Backend, BackendError};
use flint_core::kv::{KvCache, SeqId};
use flint_core::sampling::{Sampler, SamplingParams, NON_FINITE};
use flint_core::sched::{SchedConfig, Scheduler};

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
    rebuild: RebuildDraft,
}

impl DraftModel {
    pub fn new(backend: Box<dyn Backend>, cfg: SchedConfig, n_vocab: usize, p_min: f32, rebuild: RebuildDraft) -> Result<DraftModel, crate::EngineError> {
        let sched = Scheduler::new(cfg, KvCache::new(backend.kv_layout().clone()))?;
        let draft_vocab = backend.config().n_vocab;
        Ok(DraftModel { backend, sched, mirrors: HashMap::new(), n_vocab, draft_vocab, p_min, rebuild })
    }

    /// Drafts up to `k` tokens after the tokens of each target sequence in `wants`, whose
    /// tokens `target` holds. Sequences still prefilling here, or whose draft's first token
    /// is below `p_min`, get none.
    pub async fn draft(&mut self, target: &Scheduler, wants: &[(SeqId, usize)]) -> Result<HashMap<SeqId, Vec<u32>>, BackendError> {
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
        // Mirror → (target, k); each mirror catches up with its target's tokens.
        let mut want: HashMap<SeqId, (SeqId, usize)> = HashMap::new();
        for &(s, k) in wants {
            let tokens = target.tokens(s);
            if k == 0 || tokens.len() + 1 >= n_ctx {
                continue;
            }
            if let Some(d) = self.follow(s, tokens) {
                want.insert(d, (s, k));
            }
        }
        let mut drafts: HashMap<SeqId, Vec<u32>> = HashMap::new();
        let steps = wants.iter().map(|w| w.1).max().unwrap_or(0);
        for _ in 0..steps {
            let plan = self.sched.schedule();
            if plan.is_empty() {
                break;
            }
            let outs = plan.output_seqs();
            // Greedy, with the top token's log-probability (for p_min).
            let params = SamplingParams { n_logprobs: 1, ..SamplingParams::greedy() };
            let mut samplers: Vec<Sampler> = outs.iter().map(|_| Sampler::new(params.clone())).collect::<Result<_, _>>()?;
            let result = {
                let mut map: HashMap<SeqId, &mut Sampler> = outs.iter().copied().zip(samplers.iter_mut()).collect();
                let batch = self.sched.batch(&plan, &mut map, false);
                self.backend.step(batch).await?
            };
            self.sched.step_done(&plan);
            for (d, sampled) in outs.iter().zip(&result.sampled) {
                // A mirror not drafting this step (still prefilling for a finished target)
                // just keeps what it computed.
                let Some(&(s, k)) = want.get(d) else { continue };
                let list = drafts.entry(s).or_default();
                let p = sampled.logprob.map_or(1.0, f32::exp);
                let usable = sampled.id != NON_FINITE && (sampled.id as usize) < self.n_vocab && p >= self.p_min;
                if usable {
                    list.push(sampled.id);
                }
                // Past the last draft nothing more runs: the mirror is cut back next time.
                if usable && list.len() < k && self.sched.tokens(*d).len() + 2 < n_ctx {
                    self.sched.append(*d, sampled.id);
                } else {
                    want.remove(d);
                }
            }
            if want.is_empty() {
                break;
            }
        }
        drafts.retain(|_, v| !v.is_empty());
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

    /// Loads the draft model again (on a new device after a lost one); its KV starts empty.
    pub async fn rebuild(&mut self) -> Result<(), crate::EngineError> {
        self.reset();
        let backend = (self.rebuild)().await?;
        if backend.kv_layout() != self.backend.kv_layout() {
            return Err(crate::EngineError::Config("the draft model's new backend lays out its KV cache differently".into()));
        }
        self.backend = backend;
        Ok(())
    }
}

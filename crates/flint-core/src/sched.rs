//! Continuous batching: which sequences run in the next forward step, and how much of each.
//! Pure logic over the [`KvCache`] (vLLM v1's `Scheduler`): no GPU, no async runtime.
//!
//! Each step first takes every running sequence's pending tokens, oldest first (decodes are one
//! token; a prompt being prefilled continues with its next chunk), then admits waiting
//! sequences first come first served while the token budget (`max_batch_tokens`) and the
//! running limit (`max_seqs`) allow. A waiting sequence is admitted only when the pool holds
//! its whole prompt plus one block; it starts from the longest cached prefix. When blocks run
//! out for a running sequence, the newest running one is preempted by recompute: its blocks go
//! back (full ones stay indexed), it returns to the front of the queue with its generated
//! tokens as part of its prompt, and its sampler state (held by the caller) is untouched.
//!
//! A sequence may carry forks (a request's `n` choices): when its prompt is computed they
//! share its blocks (copy-on-write) and join the running set, each wanting its own sample of
//! the prompt's last position; forks beyond `max_seqs` wait as ordinary sequences instead.

use std::collections::{HashMap, VecDeque};

use thiserror::Error;

use crate::backend::{OutputRow, StepBatch, StepEntry};
use crate::kv::{GroupCopy, KvCache, SeqId};
use crate::sampling::Sampler;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SchedConfig {
    /// Tokens one step may run, all sequences together.
    pub max_batch_tokens: usize,
    /// Sequences running at once.
    pub max_seqs: usize,
    /// The most positions one sequence may hold.
    pub n_ctx: usize,
}

#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum SchedError {
    #[error("the prompt is empty")]
    EmptyPrompt,
    #[error("the prompt has {prompt} tokens but the context holds {n_ctx} (one more is needed to generate)")]
    ContextExceeded { prompt: usize, n_ctx: usize },
    #[error("invalid scheduler settings: {0}")]
    Invalid(&'static str),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    Waiting,
    Running,
    /// A fork waiting for its parent's prompt.
    Pending,
}

struct Seq {
    /// Prompt and generated tokens.
    tokens: Vec<u32>,
    /// Positions whose KV is stored.
    computed: usize,
    /// Prompt tokens taken from the prefix cache when first admitted.
    cached: Option<usize>,
    /// Forks made once the prompt is computed.
    forks: Vec<SeqId>,
    state: State,
    /// Tokens proposed for the next step (see [`Scheduler::propose`]).
    draft: Vec<u32>,
    /// The last `drafted` of `tokens` are drafts under verification, until
    /// [`Scheduler::resolve`].
    drafted: usize,
}

/// One sequence's share of a step: tokens `start..start + len` of the sequence.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlanEntry {
    pub seq: SeqId,
    pub start: usize,
    pub len: usize,
    /// The last token's output is wanted: it ends the tokens known so far.
    pub output: bool,
    /// Forks made at this step from this entry's last position; each wants its own output.
    pub forked: Vec<SeqId>,
    /// The entry's last `drafted` tokens are drafts: it wants an output at each of its last
    /// `drafted + 1` positions (a verify step; see [`crate::spec`]).
    pub drafted: usize,
}

/// What the next forward step runs.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StepPlan {
    pub entries: Vec<PlanEntry>,
    /// Copy-on-write block copies to perform before the step's KV writes.
    pub copies: Vec<GroupCopy>,
}

impl StepPlan {
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
    pub fn n_tokens(&self) -> usize {
        self.entries.iter().map(|e| e.len).sum()
    }
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SchedStats {
    pub steps: u64,
    pub preemptions: u64,
    pub running: usize,
    pub waiting: usize,
    /// KV blocks of every group, now.
    pub kv: BlockCounts,
    /// Sequences per step, over every step so far.
    pub batch_seqs: Histogram,
    /// Tokens per step, over every step so far.
    pub batch_tokens: Histogram,
    /// Speculative decoding: tokens drafted and accepted so far (the engine's run loop keeps
    /// these).
    pub spec: crate::spec::SpecCounts,
}

/// KV blocks summed over the block groups.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BlockCounts {
    pub total: u64,
    /// Held by live sequences (shared ones once).
    pub used: u64,
    /// Held only by the prefix index: what eviction may free.
    pub cached: u64,
}

/// Counts of observations by power-of-two bucket: `counts[i]` holds those in
/// (2^(i-1), 2^i] (the first: ≤ 1; the last: everything larger), with their sum.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Histogram {
    pub counts: [u64; Histogram::BUCKETS],
    pub sum: u64,
}

impl Histogram {
    pub const BUCKETS: usize = 12;

    pub fn observe(&mut self, v: u64) {
        let i = (v.max(1).next_power_of_two().trailing_zeros() as usize).min(Self::BUCKETS - 1);
        self.counts[i] += 1;
        self.sum += v;
    }

    /// Upper bound of bucket `i` (None: the last, unbounded).
    pub fn bound(i: usize) -> Option<u64> {
        (i + 1 < Self::BUCKETS).then(|| 1u64 << i)
    }
}

pub struct Scheduler {
    cfg: SchedConfig,
    kv: KvCache,
    seqs: HashMap<SeqId, Seq>,
    waiting: VecDeque<SeqId>,
    /// In admission order: the newest last.
    running: Vec<SeqId>,
    next_id: SeqId,
    stats: SchedStats,
    /// Output rows a step may give drafts, beyond one per sequence.
    draft_rows: usize,
}

impl Scheduler {
    pub fn new(cfg: SchedConfig, kv: KvCache) -> Result<Scheduler, SchedError> {
        if cfg.max_batch_tokens == 0 || cfg.max_seqs == 0 || cfg.n_ctx == 0 {
            return Err(SchedError::Invalid("max_batch_tokens, max_seqs and n_ctx must be positive"));
        }
        Ok(Scheduler { cfg, kv, seqs: HashMap::new(), waiting: VecDeque::new(), running: Vec::new(), next_id: 1, stats: SchedStats::default(), draft_rows: 0 })
    }

    pub fn config(&self) -> &SchedConfig {
        &self.cfg
    }

    /// Output rows each step may spend on drafted tokens, all sequences together (the
    /// backend's output rows beyond one per sequence); 0, the default, turns drafting off.
    pub fn set_draft_rows(&mut self, rows: usize) {
        self.draft_rows = rows;
    }

    /// Proposes `draft` to follow running sequence `id`'s pending token in the next step: if
    /// `id` is decoding and the budget, the output rows and its context allow, the step runs
    /// the pending token and as many drafts as fit, with an output at each; otherwise (or for
    /// what does not fit) they are dropped. Proposals last one step.
    pub fn propose(&mut self, id: SeqId, draft: Vec<u32>) {
        if let Some(s) = self.seqs.get_mut(&id).filter(|s| Self::decoding(s)) {
            s.draft = draft;
        }
    }

    /// `id` runs and its next step would decode one token (where drafts may follow it).
    pub fn is_decoding(&self, id: SeqId) -> bool {
        self.seqs.get(&id).is_some_and(Self::decoding)
    }

    fn decoding(s: &Seq) -> bool {
        s.state == State::Running && s.tokens.len() == s.computed + 1 && s.drafted == 0
    }

    /// The drafts `id` is running this step (empty when none).
    pub fn drafts(&self, id: SeqId) -> &[u32] {
        let s = self.seq(id);
        &s.tokens[s.tokens.len() - s.drafted..]
    }

    /// After a verify step: keeps `id`'s first `accepted` drafts and rolls its KV back past
    /// them; only the kept tokens reach the prefix index. The token the target chose next is
    /// then [`Scheduler::append`]ed as after any step.
    pub fn resolve(&mut self, id: SeqId, accepted: usize) -> Result<(), crate::kv::KvError> {
        let s = self.seqs.get_mut(&id).expect("running");
        if s.drafted == 0 {
            return Ok(());
        }
        Self::undraft(s, accepted);
        self.kv.truncate(id, s.computed)?;
        self.kv.commit(id, &s.tokens);
        Ok(())
    }

    /// Drops the drafts under verification but the first `kept` (their positions' KV is
    /// rolled back by the caller, or the sequence's blocks go entirely).
    fn undraft(s: &mut Seq, kept: usize) {
        let keep = s.tokens.len() - s.drafted + kept.min(s.drafted);
        s.tokens.truncate(keep);
        s.computed = s.computed.min(keep);
        s.drafted = 0;
        s.draft.clear();
    }

    pub fn kv(&self) -> &KvCache {
        &self.kv
    }

    /// Queues a sequence of `prompt` and `n_forks` forks of it; returns their ids, the
    /// sequence's first.
    pub fn add(&mut self, prompt: Vec<u32>, n_forks: usize) -> Result<Vec<SeqId>, SchedError> {
        if prompt.is_empty() {
            return Err(SchedError::EmptyPrompt);
        }
        if prompt.len() + 1 > self.cfg.n_ctx {
            return Err(SchedError::ContextExceeded { prompt: prompt.len(), n_ctx: self.cfg.n_ctx });
        }
        let ids: Vec<SeqId> = (0..=n_forks as u64).map(|i| self.next_id + i).collect();
        self.next_id += ids.len() as u64;
        for &id in &ids[1..] {
            self.seqs
                .insert(id, Seq { tokens: prompt.clone(), computed: 0, cached: None, forks: Vec::new(), state: State::Pending, draft: Vec::new(), drafted: 0 });
        }
        self.seqs
            .insert(ids[0], Seq { tokens: prompt, computed: 0, cached: None, forks: ids[1..].to_vec(), state: State::Waiting, draft: Vec::new(), drafted: 0 });
        self.kv.open(ids[0]);
        self.waiting.push_back(ids[0]);
        Ok(ids)
    }

    fn seq(&self, id: SeqId) -> &Seq {
        self.seqs.get(&id).unwrap_or_else(|| panic!("unknown sequence {id}"))
    }

    /// Prompt and generated tokens of `id`.
    pub fn tokens(&self, id: SeqId) -> &[u32] {
        &self.seq(id).tokens
    }

    /// Prompt tokens `id` took from the prefix cache when first admitted.
    pub fn cached(&self, id: SeqId) -> usize {
        self.seq(id).cached.unwrap_or(0)
    }

    pub fn contains(&self, id: SeqId) -> bool {
        self.seqs.contains_key(&id)
    }

    /// Block tables of `id`, one per KV group.
    pub fn tables(&self, id: SeqId) -> Vec<&[u32]> {
        self.kv.tables(id)
    }

    /// Nothing waits and nothing runs.
    pub fn is_idle(&self) -> bool {
        self.running.is_empty() && self.waiting.is_empty()
    }

    pub fn stats(&self) -> SchedStats {
        SchedStats { running: self.running.len(), waiting: self.waiting.len(), kv: self.kv.block_counts(), ..self.stats }
    }

    /// Plans the next step (empty when nothing can run).
    pub fn schedule(&mut self) -> StepPlan {
        let mut entries: Vec<PlanEntry> = Vec::new();
        let mut copies: Vec<(SeqId, GroupCopy)> = Vec::new();
        let mut preempted = Vec::new();
        let mut budget = self.cfg.max_batch_tokens;
        let mut draft_rows = self.draft_rows;
        let n_ctx = self.cfg.n_ctx;
        let pending = |s: &Seq| s.tokens.len() - s.computed;
        // Decodes first, then the chunks of prompts being prefilled; oldest first in each.
        let (decodes, chunks): (Vec<SeqId>, Vec<SeqId>) = self.running.iter().partition(|id| pending(&self.seqs[id]) <= 1);
        for id in decodes.into_iter().chain(chunks) {
            if budget == 0 {
                break;
            }
            let s = self.seqs.get_mut(&id).expect("running");
            if s.state != State::Running || pending(s) == 0 {
                continue;
            }
            // A decode with a proposal takes the drafts that fit: the budget, the rows, and
            // the context with room for the token after the last.
            let draft = std::mem::take(&mut s.draft);
            if pending(s) == 1 && !draft.is_empty() {
                let k = draft.len().min(budget - 1).min(draft_rows).min(n_ctx.saturating_sub(s.tokens.len() + 1));
                s.tokens.extend_from_slice(&draft[..k]);
                s.drafted = k;
                draft_rows -= k;
            }
            let (n, drafted) = (pending(s).min(budget), s.drafted);
            let (start, end) = (s.computed, s.computed + n);
            let output = end == s.tokens.len();
            loop {
                if let Ok(c) = self.kv.reserve(id, end) {
                    copies.extend(c.into_iter().map(|c| (id, c)));
                    budget -= n;
                    entries.push(PlanEntry { seq: id, start, len: n, output, forked: Vec::new(), drafted });
                    break;
                }
                // Short of blocks: the newest running sequence goes, its plan entry with it.
                let victim = *self.running.last().expect("id is running");
                self.preempt(victim);
                preempted.push(victim);
                if let Some(at) = entries.iter().position(|e| e.seq == victim) {
                    let e = entries.remove(at);
                    budget += e.len;
                    draft_rows += e.drafted;
                }
                copies.retain(|(s, _)| *s != victim);
                if victim == id {
                    break;
                }
            }
        }
        // Waiting sequences, first come first served (not one preempted just now).
        while budget > 0 && self.running.len() < self.cfg.max_seqs {
            let Some(&id) = self.waiting.front() else { break };
            if preempted.contains(&id) {
                break;
            }
            let s = &self.seqs[&id];
            let len = s.tokens.len();
            if self.kv.len(id) == 0 {
                let cached = self.kv.attach_prefix(id, &s.tokens[..len - 1]);
                let s = self.seqs.get_mut(&id).expect("queued");
                s.computed = cached;
                s.cached.get_or_insert(cached);
            }
            if !self.kv.fits(id, len, 1) {
                // Hand attached blocks back so they stay evictable while this waits.
                self.kv.reset(id);
                self.seqs.get_mut(&id).expect("queued").computed = 0;
                break;
            }
            let s = &self.seqs[&id];
            let n = (len - s.computed).min(budget);
            let (start, end) = (s.computed, s.computed + n);
            let Ok(c) = self.kv.reserve(id, end) else { break };
            copies.extend(c.into_iter().map(|c| (id, c)));
            self.waiting.pop_front();
            self.seqs.get_mut(&id).expect("queued").state = State::Running;
            self.running.push(id);
            budget -= n;
            entries.push(PlanEntry { seq: id, start, len: n, output: end == len, forked: Vec::new(), drafted: 0 });
        }
        // Prompts computed by this step fork their choices (no preemption follows).
        for e in &mut entries {
            if e.output {
                e.forked = self.make_forks(e.seq, e.start + e.len);
            }
        }
        if !entries.is_empty() {
            self.stats.steps += 1;
            self.stats.batch_seqs.observe(entries.iter().map(|e| 1 + e.forked.len() as u64).sum());
            self.stats.batch_tokens.observe(entries.iter().map(|e| e.len as u64).sum());
        }
        StepPlan { entries, copies: copies.into_iter().map(|(_, c)| c).collect() }
    }

    /// Forks `id`'s pending choices at `end` positions (its prompt): those that fit beside the
    /// running sequences share its blocks and run; the others wait as sequences of their own,
    /// ahead of requests that came later. Returns the forks made.
    fn make_forks(&mut self, id: SeqId, end: usize) -> Vec<SeqId> {
        let forks = std::mem::take(&mut self.seqs.get_mut(&id).expect("running").forks);
        let cached = self.seqs[&id].cached;
        let mut made = Vec::new();
        // Before the first sequence never admitted: after preempted ones, before later requests.
        let mut at = self.waiting.iter().position(|w| self.seqs[w].cached.is_none()).unwrap_or(self.waiting.len());
        for child in forks {
            let c = self.seqs.get_mut(&child).expect("pending fork");
            if self.running.len() < self.cfg.max_seqs {
                (c.computed, c.cached, c.state) = (end, cached, State::Running);
                self.kv.fork(id, child);
                self.running.push(child);
                made.push(child);
            } else {
                c.state = State::Waiting;
                self.kv.open(child);
                self.waiting.insert(at, child);
                at += 1;
            }
        }
        made
    }

    /// Frees `id`'s blocks (indexing the full ones first) and queues it again at the front,
    /// its generated tokens now part of its prompt.
    fn preempt(&mut self, id: SeqId) {
        let s = self.seqs.get_mut(&id).expect("running");
        Self::undraft(s, 0);
        // Only computed positions may be indexed: this step may already have reserved more
        // (a victim planned earlier in the same step), which hold nothing yet.
        self.kv.commit(id, &s.tokens[..s.computed]);
        self.kv.reset(id);
        s.computed = 0;
        s.state = State::Waiting;
        self.running.retain(|&r| r != id);
        self.waiting.push_front(id);
        self.stats.preemptions += 1;
    }

    /// Records that `plan` ran: its positions are stored; full blocks are indexed and
    /// windows slide.
    pub fn step_done(&mut self, plan: &StepPlan) {
        for e in &plan.entries {
            for &id in std::iter::once(&e.seq).chain(&e.forked) {
                let s = self.seqs.get_mut(&id).expect("planned");
                s.computed = e.start + e.len;
                // Drafts reach the index only once accepted (`resolve`).
                if e.drafted == 0 {
                    self.kv.commit(id, &s.tokens);
                }
                self.kv.slide(id);
            }
        }
    }

    /// A token sampled for `id` joins it (its KV is computed in a later step).
    pub fn append(&mut self, id: SeqId, token: u32) {
        self.seqs.get_mut(&id).expect("running").tokens.push(token);
    }

    /// Tokens join `id` (computed by later steps, in chunks as a prompt is).
    pub fn extend(&mut self, id: SeqId, tokens: &[u32]) {
        self.seqs.get_mut(&id).expect("known").tokens.extend_from_slice(tokens);
    }

    /// Cuts `id` back to its first `len` tokens (at least one), rolling its KV back with them:
    /// a draft model's sequence follows its target's, which kept only some of the drafts.
    pub fn truncate(&mut self, id: SeqId, len: usize) -> Result<(), crate::kv::KvError> {
        let s = self.seqs.get_mut(&id).expect("known");
        Self::undraft(s, 0);
        s.tokens.truncate(len.max(1));
        s.computed = s.computed.min(s.tokens.len());
        if s.state == State::Running {
            self.kv.truncate(id, s.computed)?;
        }
        Ok(())
    }

    /// Ends `id` whatever its state: full blocks stay indexed for later requests, the rest
    /// go back to the pool; a fork not yet made is dropped.
    pub fn finish(&mut self, id: SeqId) {
        self.end(id, true);
    }

    /// Ends `id` as [`Scheduler::finish`] does but indexes none of its blocks: their contents
    /// are suspect (its logits came out broken).
    pub fn discard(&mut self, id: SeqId) {
        self.end(id, false);
    }

    fn end(&mut self, id: SeqId, commit: bool) {
        let Some(mut s) = self.seqs.remove(&id) else { return };
        Self::undraft(&mut s, 0);
        match s.state {
            State::Pending => {
                for p in self.seqs.values_mut() {
                    p.forks.retain(|&f| f != id);
                }
                return;
            }
            State::Running => self.running.retain(|&r| r != id),
            State::Waiting => self.waiting.retain(|&w| w != id),
        }
        if self.kv.is_open(id) {
            if commit {
                self.kv.commit(id, &s.tokens[..s.computed]);
            }
            self.kv.release(id);
        }
        // Forks that never got made wait as sequences of their own.
        for child in s.forks {
            if let Some(c) = self.seqs.get_mut(&child) {
                c.state = State::Waiting;
                self.kv.open(child);
                self.waiting.push_front(child);
            }
        }
    }

    /// Drops every cached prefix no sequence holds.
    pub fn clear_cache(&mut self) {
        self.kv.clear_unheld();
    }

    /// The backend step for `plan`: each entry's tokens and tables, and one output row per
    /// sequence that wants a sample (the entry's own and its forks'), drawn with its sampler
    /// from `samplers` (taken out of the map).
    pub fn batch<'a>(&'a self, plan: &'a StepPlan, samplers: &mut HashMap<SeqId, &'a mut Sampler>, logits: bool) -> StepBatch<'a> {
        let mut rows: HashMap<SeqId, Vec<&'a mut Sampler>> = samplers.drain().map(|(id, s)| (id, vec![s])).collect();
        self.batch_rows(plan, &mut rows, logits)
    }

    /// [`Scheduler::batch`] with one sampler per output row: a verify entry's rows in order
    /// (row j draws the token after draft j, so its penalty history holds drafts 1..j).
    pub fn batch_rows<'a>(&'a self, plan: &'a StepPlan, samplers: &mut HashMap<SeqId, Vec<&'a mut Sampler>>, logits: bool) -> StepBatch<'a> {
        let entries = plan
            .entries
            .iter()
            .map(|e| {
                let outputs = if e.output {
                    let mut rows = Vec::new();
                    for id in std::iter::once(&e.seq).chain(&e.forked) {
                        let list = samplers.remove(id).unwrap_or_else(|| panic!("no sampler for sequence {id}"));
                        let first = if *id == e.seq { e.len - 1 - e.drafted } else { e.len - 1 };
                        assert!(list.len() > e.len - 1 - first, "sequence {id} needs a sampler per output row");
                        rows.extend(list.into_iter().enumerate().map(|(j, sampler)| OutputRow { index: first + j, sampler }));
                    }
                    rows
                } else {
                    Vec::new()
                };
                StepEntry { tokens: &self.tokens(e.seq)[e.start..e.start + e.len], start: e.start, tables: self.tables(e.seq), outputs }
            })
            .collect();
        StepBatch { entries, copies: &plan.copies, logits }
    }
}

impl StepPlan {
    /// Every sequence that gets an output row, in row order.
    pub fn output_seqs(&self) -> Vec<SeqId> {
        self.entries.iter().filter(|e| e.output).flat_map(|e| std::iter::once(e.seq).chain(e.forked.iter().copied())).collect()
    }

    /// Every sequence that gets output rows and how many, in row order.
    pub fn output_rows(&self) -> Vec<(SeqId, usize)> {
        self.entries.iter().filter(|e| e.output).flat_map(|e| std::iter::once((e.seq, 1 + e.drafted)).chain(e.forked.iter().map(|&f| (f, 1)))).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kv::{KvGroupSpec, KvLayout, NO_BLOCK};

    #[test]
    fn histogram_buckets_are_powers_of_two() {
        let mut h = Histogram::default();
        for v in [0, 1, 2, 3, 4, 5, 256, 1 << 20] {
            h.observe(v);
        }
        // ≤1: 0 and 1; (1,2]: 2; (2,4]: 3, 4; (4,8]: 5; (128,256]: 256; the last: 2^20.
        assert_eq!(&h.counts[..4], &[2, 1, 2, 1]);
        assert_eq!(h.counts[8], 1);
        assert_eq!(h.counts[Histogram::BUCKETS - 1], 1);
        assert_eq!(h.sum, 1 + 2 + 3 + 4 + 5 + 256 + (1 << 20));
        assert_eq!((Histogram::bound(0), Histogram::bound(3), Histogram::bound(Histogram::BUCKETS - 1)), (Some(1), Some(8), None));
    }

    const BS: u32 = 4;

    fn sched(max_batch_tokens: usize, max_seqs: usize, n_ctx: usize, blocks: u32) -> Scheduler {
        let layout = KvLayout {
            block_size: BS,
            slack: 4,
            max_blocks_per_seq: (n_ctx as u32).div_ceil(BS),
            groups: vec![KvGroupSpec { n_blocks: blocks, window: None, layers: vec![0] }],
        };
        Scheduler::new(SchedConfig { max_batch_tokens, max_seqs, n_ctx }, KvCache::new(layout)).unwrap()
    }

    fn toks(seed: u32, n: usize) -> Vec<u32> {
        (0..n as u32).map(|i| seed * 1000 + i).collect()
    }

    /// A fake backend: runs the plan and samples token `seq * 100 + position` for each output,
    /// finishing sequences once they hold `until` tokens.
    fn step(s: &mut Scheduler, until: usize) -> StepPlan {
        let plan = s.schedule();
        for e in &plan.entries {
            let tables = s.tables(e.seq);
            assert!(tables[0].len() * BS as usize >= e.start + e.len, "blocks reserved for every position");
            assert!(tables[0].iter().all(|&b| b != NO_BLOCK));
        }
        s.step_done(&plan);
        for e in &plan.entries {
            if !e.output {
                continue;
            }
            for &id in std::iter::once(&e.seq).chain(&e.forked) {
                if s.tokens(id).len() >= until {
                    s.finish(id);
                } else {
                    let t = id as u32 * 100 + s.tokens(id).len() as u32;
                    s.append(id, t);
                }
            }
        }
        plan
    }

    #[test]
    fn decodes_come_first_then_prompt_chunks_fill_the_budget() {
        let mut s = sched(8, 4, 64, 64);
        let a = s.add(toks(1, 3), 0).unwrap()[0];
        let p = step(&mut s, 100);
        assert_eq!(p.entries, vec![PlanEntry { seq: a, start: 0, len: 3, output: true, forked: vec![], drafted: 0 }]);
        let b = s.add(toks(2, 20), 0).unwrap()[0];
        // a decodes one token; b's prompt takes the other seven of the budget, then eight more.
        let p = step(&mut s, 100);
        assert_eq!(p.entries.iter().map(|e| (e.seq, e.start, e.len, e.output)).collect::<Vec<_>>(), vec![(a, 3, 1, true), (b, 0, 7, false)]);
        let p = step(&mut s, 100);
        assert_eq!(p.entries.iter().map(|e| (e.seq, e.start, e.len, e.output)).collect::<Vec<_>>(), vec![(a, 4, 1, true), (b, 7, 7, false)]);
        let p = step(&mut s, 100);
        assert_eq!(p.entries.iter().map(|e| (e.seq, e.start, e.len, e.output)).collect::<Vec<_>>(), vec![(a, 5, 1, true), (b, 14, 6, true)]);
        assert_eq!(s.tokens(b).len(), 21);
        assert_eq!(s.stats().steps, 4);
    }

    #[test]
    fn at_most_max_seqs_run_and_the_rest_wait_in_order() {
        let mut s = sched(64, 2, 64, 64);
        let ids: Vec<SeqId> = (0..4).map(|i| s.add(toks(i, 5), 0).unwrap()[0]).collect();
        let p = step(&mut s, 6);
        assert_eq!(p.entries.iter().map(|e| e.seq).collect::<Vec<_>>(), &ids[..2]);
        assert_eq!((s.stats().running, s.stats().waiting), (2, 2));
        // Both finish after one decode; the next two are admitted in order.
        step(&mut s, 6);
        let p = step(&mut s, 6);
        assert_eq!(p.entries.iter().map(|e| e.seq).collect::<Vec<_>>(), &ids[2..]);
    }

    #[test]
    fn a_new_request_starts_from_a_running_sequences_full_blocks() {
        let mut s = sched(64, 4, 64, 64);
        let prompt = toks(1, 10);
        let a = s.add(prompt.clone(), 0).unwrap()[0];
        step(&mut s, 100);
        let mut other = prompt[..9].to_vec();
        other.push(7);
        let b = s.add(other, 0).unwrap()[0];
        let p = step(&mut s, 100);
        // b reuses a's two full blocks and runs its last two tokens only.
        assert_eq!((p.entries[1].seq, p.entries[1].start, p.entries[1].len), (b, 8, 2));
        assert_eq!(s.cached(b), 8);
        assert_eq!(s.tables(b)[0][..2], s.tables(a)[0][..2]);
    }

    #[test]
    fn running_out_of_blocks_preempts_the_newest_by_recompute() {
        // 8 blocks of 4: two sequences of 12 prompt tokens fit; growing to 16+ they do not.
        let mut s = sched(64, 4, 32, 8);
        let a = s.add(toks(1, 12), 0).unwrap()[0];
        let b = s.add(toks(2, 12), 0).unwrap()[0];
        let mut preempted_at = None;
        for i in 0..40 {
            step(&mut s, 30);
            if preempted_at.is_none() && s.stats().preemptions > 0 {
                preempted_at = Some(i);
                // b was newest: it waits at the front with its generated tokens, blocks freed.
                assert_eq!(s.stats().waiting, 1);
                assert!(s.tokens(b).len() > 12);
                assert_eq!(s.kv().len(b), 0);
            }
            if s.is_idle() {
                break;
            }
        }
        assert!(preempted_at.is_some(), "the pool was never short");
        assert!(s.is_idle(), "both sequences must finish");
        assert!(!s.contains(a) && !s.contains(b));
        let st = s.kv().stats()[0];
        assert_eq!(st.free + st.indexed, 8, "every block is free or indexed at the end");
    }

    #[test]
    fn admission_waits_for_the_whole_prompt_plus_one_block() {
        let mut s = sched(64, 4, 32, 8);
        let a = s.add(toks(1, 20), 0).unwrap()[0];
        step(&mut s, 100);
        // 5 blocks held: a 12-token prompt needs 3 + 1, there are 3.
        let b = s.add(toks(2, 12), 0).unwrap()[0];
        let p = step(&mut s, 100);
        assert_eq!(p.entries.iter().map(|e| e.seq).collect::<Vec<_>>(), vec![a]);
        s.finish(a);
        let p = step(&mut s, 100);
        assert_eq!(p.entries.iter().map(|e| e.seq).collect::<Vec<_>>(), vec![b]);
        assert!(matches!(s.add(toks(3, 32), 0), Err(SchedError::ContextExceeded { prompt: 32, n_ctx: 32 })));
        assert_eq!(s.add(Vec::new(), 0), Err(SchedError::EmptyPrompt));
    }

    #[test]
    fn forks_share_the_prompt_and_each_gets_an_output() {
        let mut s = sched(64, 3, 64, 64);
        let ids = s.add(toks(1, 6), 3).unwrap();
        let p = step(&mut s, 100);
        // Two forks fit beside the parent; the third waits as its own sequence.
        assert_eq!(p.entries.len(), 1);
        assert_eq!(p.entries[0].forked, ids[1..3]);
        assert_eq!(s.tables(ids[1]), s.tables(ids[0]));
        assert_eq!(s.stats().waiting, 1);
        // Next step: the three decode, each writing the shared partial block: two copies.
        let p = step(&mut s, 100);
        assert_eq!(p.entries.len(), 3);
        assert_eq!(p.copies.len(), 2);
        for &id in &ids[..3] {
            s.finish(id);
        }
        // The last fork starts from the prompt's full block in the index.
        let p = step(&mut s, 100);
        assert_eq!((p.entries[0].seq, p.entries[0].start, p.entries[0].len), (ids[3], 4, 2));
        assert_eq!(s.cached(ids[3]), 4);
    }

    #[test]
    fn drafts_run_with_the_pending_token_and_only_accepted_ones_stay() {
        let mut s = sched(8, 4, 32, 64);
        s.set_draft_rows(4);
        let a = s.add(toks(1, 6), 0).unwrap()[0];
        step(&mut s, 100);
        assert_eq!(s.tokens(a).len(), 7);
        // Five drafted, but the budget (8) holds the pending token and four rows' worth.
        s.propose(a, vec![11, 12, 13, 14, 15]);
        let p = s.schedule();
        assert_eq!(p.entries.iter().map(|e| (e.start, e.len, e.drafted)).collect::<Vec<_>>(), vec![(6, 5, 4)]);
        assert_eq!(p.output_rows(), vec![(a, 5)]);
        assert_eq!(s.drafts(a), &[11, 12, 13, 14]);
        s.step_done(&p);
        // Two accepted: positions 0..9 stay (prompt, the pending token, two drafts).
        s.resolve(a, 2).unwrap();
        assert_eq!(s.tokens(a)[6..], [106, 11, 12]);
        assert_eq!(s.kv().len(a), 9);
        // Rows are built per sequence in order.
        s.append(a, 77);
        let p = s.schedule();
        assert_eq!(p.entries.iter().map(|e| (e.start, e.len, e.drafted)).collect::<Vec<_>>(), vec![(9, 1, 0)], "a proposal lasts one step");
        s.step_done(&p);
        s.append(a, 78);
        // No rows for drafts, no drafts.
        s.set_draft_rows(0);
        s.propose(a, vec![1, 2]);
        assert_eq!(s.schedule().entries[0].drafted, 0);
    }

    #[test]
    fn only_accepted_drafts_reach_the_prefix_index() {
        let mut s = sched(16, 4, 32, 64);
        s.set_draft_rows(8);
        let a = s.add(toks(1, 3), 0).unwrap()[0];
        step(&mut s, 100);
        // Pending token at position 3; drafts fill positions 4..8, completing block 1 (4..8).
        s.propose(a, vec![20, 21, 22, 23, 24]);
        let p = s.schedule();
        s.step_done(&p);
        s.resolve(a, 0).unwrap();
        s.finish(a);
        // A request with the drafted tokens as its prompt finds only block 0.
        let mut with_drafts = toks(1, 3);
        with_drafts.extend([103, 20, 21, 22, 23, 24, 5]);
        let b = s.add(with_drafts, 0).unwrap()[0];
        s.schedule();
        assert_eq!(s.cached(b), 4);
    }

    #[test]
    fn a_truncated_sequence_recomputes_from_where_it_was_cut() {
        // A draft model's sequence: it ran three of its own tokens past 6 prompt tokens; the
        // target kept one of them and chose its own next.
        let mut s = sched(16, 4, 32, 64);
        let a = s.add(toks(1, 6), 0).unwrap()[0];
        step(&mut s, 100);
        step(&mut s, 100);
        step(&mut s, 100);
        assert_eq!(s.tokens(a).len(), 9);
        s.truncate(a, 7).unwrap();
        assert_eq!(s.tables(a)[0].len(), 2, "positions 0..7 keep two blocks of 4");
        s.extend(a, &[77, 78]);
        let p = s.schedule();
        assert_eq!(p.entries, vec![PlanEntry { seq: a, start: 7, len: 2, output: true, forked: vec![], drafted: 0 }]);
        s.step_done(&p);
        assert_eq!(&s.tokens(a)[6..], &[106, 77, 78]);
        assert_eq!(s.tables(a)[0].len(), 3);
        // Cut into the first block: the others go.
        s.truncate(a, 3).unwrap();
        assert_eq!(s.tables(a)[0].len(), 1);
        assert_eq!(s.schedule().entries, vec![], "nothing is pending after a cut");
    }

    #[test]
    fn a_preempted_verify_drops_its_drafts() {
        // 8 blocks of 4, two sequences; the older one's drafts need the blocks the newer holds.
        let mut s = sched(64, 4, 32, 8);
        s.set_draft_rows(16);
        let a = s.add(toks(1, 11), 0).unwrap()[0];
        let b = s.add(toks(2, 11), 0).unwrap()[0];
        step(&mut s, 100);
        s.propose(a, (0..12).collect());
        let p = s.schedule();
        assert_eq!(s.stats().preemptions, 1);
        assert_eq!(p.entries.iter().map(|e| (e.seq, e.drafted)).collect::<Vec<_>>(), vec![(a, 12)]);
        assert_eq!(s.tokens(b).len(), 12, "b keeps its tokens, drafts are a's only");
        s.step_done(&p);
        s.resolve(a, 12).unwrap();
        assert_eq!(s.tokens(a).len(), 24);
    }

    #[test]
    fn finishing_frees_blocks_and_pending_forks_go_with_their_request() {
        let mut s = sched(4, 4, 64, 64);
        let ids = s.add(toks(1, 10), 1).unwrap();
        step(&mut s, 100);
        // Cancelled mid-prompt: the fork is dropped with it.
        s.finish(ids[1]);
        s.finish(ids[0]);
        assert!(s.is_idle());
        assert_eq!(s.kv().stats()[0].free + s.kv().stats()[0].indexed, 64);
        assert!(s.schedule().is_empty());
    }
}

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

mod update;
pub use update::{Flow, Row, SeqEnd, SeqUpdate, STAND_IN};

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
    /// Steps submitted before the step before them was read (the run loop keeps these).
    pub overlapped: Overlap,
}

/// The run loop's overlapped steps and its time on them. Each turn of the loop plans and
/// submits a step, then reads the step before it (waiting for the device) and folds it in;
/// the device runs the submitted step meanwhile, so a decode step takes the longer of the
/// host's work and the device's. Little waiting means the host bounds decode.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Overlap {
    /// Steps submitted so.
    pub steps: u64,
    /// Microseconds spent submitting them: the batch built, encoded and handed to the driver
    /// (a driver may wait there for the step before to end: Mesa's lavapipe does).
    pub submit_us: u64,
    /// Microseconds spent waiting in those turns for the step before's draws.
    pub wait_us: u64,
    /// Microseconds of the rest of those turns: planning, folding draws in.
    pub other_us: u64,
}

/// What a span of running added: the counts at its end less those at its start.
impl std::ops::Sub for Overlap {
    type Output = Overlap;
    fn sub(self, start: Overlap) -> Overlap {
        Overlap {
            steps: self.steps.saturating_sub(start.steps),
            submit_us: self.submit_us.saturating_sub(start.submit_us),
            wait_us: self.wait_us.saturating_sub(start.wait_us),
            other_us: self.other_us.saturating_sub(start.other_us),
        }
    }
}

impl std::ops::Add for Overlap {
    type Output = Overlap;
    fn add(self, o: Overlap) -> Overlap {
        Overlap {
            steps: self.steps + o.steps,
            submit_us: self.submit_us + o.submit_us,
            wait_us: self.wait_us + o.wait_us,
            other_us: self.other_us + o.other_us,
        }
    }
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

    /// The tokens still to compute of the one sequence that has any, when it is the only
    /// sequence with work (no other running, waiting or forked): a lone request's prompt.
    pub fn lone_pending(&self) -> Option<usize> {
        let mut busy = self.seqs.values().filter(|s| s.tokens.len() > s.computed || s.state == State::Pending);
        let s = busy.next()?;
        if busy.next().is_some() || s.state == State::Pending || !s.forks.is_empty() {
            return None;
        }
        Some(s.tokens.len() - s.computed)
    }

    /// [`Scheduler::schedule`] with the step's token budget cut to `max_tokens` (at least 1).
    pub fn schedule_within(&mut self, max_tokens: usize) -> StepPlan {
        let full = self.cfg.max_batch_tokens;
        self.cfg.max_batch_tokens = max_tokens.clamp(1, full);
        let plan = self.schedule();
        self.cfg.max_batch_tokens = full;
        plan
    }

    /// Records that `plan` ran: its positions are stored; full blocks are indexed and
    /// windows slide.
    pub fn step_done(&mut self, plan: &StepPlan) {
        for e in &plan.entries {
            for &id in std::iter::once(&e.seq).chain(&e.forked) {
                // Ended since it was planned (a cancel): nothing of it to keep.
                let Some(s) = self.seqs.get_mut(&id) else { continue };
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
mod tests;

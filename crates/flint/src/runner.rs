//! The engine's run loop: it owns the backend and the scheduler, takes commands from a
//! channel (natively on the engine's own thread, in the browser on its event loop), and runs
//! one forward step after another while any request waits or runs. Each step serves every
//! running sequence (continuous batching); per-request state turns each sampled token into
//! the request's events. A cancelled request stops within one step and frees its blocks.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use futures::channel::{mpsc, oneshot};
use futures::future::LocalBoxFuture;
use futures::StreamExt;

use flint_core::backend::{Backend, BackendError, Feed, LateMasks, StepResult, Ticket};
use flint_core::generate::{Clock, Event, FinishReason, Generation, MaskJob};
use flint_core::kv::SeqId;
use flint_core::sampling::{DraftLink, Sampler, SamplingParams};
use flint_core::sched::{Flow, Overlap, SchedStats, Scheduler, SeqEnd, StepPlan};
use flint_core::spec::{fit_draft, ngram_draft, prediction_draft, Adapt, SpecConfig, SpecCounts, SpecKind};
use flint_core::tokenizer::Tokenizer;

use flint_gpu::GpuContext;

use crate::draft::{DraftModel, Want};
use crate::request::Prepared;
use crate::EngineError;

/// The longest lone prompt run one token a step while its step size's kernels are not built
/// (see `Runner::cold_prompt`).
const COLD_PROMPT_TOKENS: usize = 16;

/// What a request's stream yields.
pub type EventResult = Result<Event, EngineError>;

/// Timings of each op of one step.
pub type OpTimes = Vec<flint_core::backend::OpTime>;

pub(crate) enum Command {
    Submit {
        id: u64,
        prepared: Prepared,
        events: mpsc::UnboundedSender<EventResult>,
    },
    Cancel(u64),
    CancelAll,
    /// Drop every cached prefix no running request holds.
    ClearCache,
    Stats(oneshot::Sender<SchedStats>),
    /// Answered once nothing runs or waits.
    WhenIdle(oneshot::Sender<()>),
    /// Once idle: per-op timings of a step of `prompt` (prefill) and of decode steps of each
    /// size in `decode_sizes` (that many sequences after the prompt).
    Profile {
        prompt: Vec<u32>,
        decode_sizes: Vec<usize>,
        reply: oneshot::Sender<Result<(OpTimes, Vec<OpTimes>), EngineError>>,
    },
    /// Once idle: one step of every kind traffic will run (a prompt, decodes of 1 to
    /// `max_seqs` sequences), so that kernels compiled at first use are ready.
    WarmUp(oneshot::Sender<Result<(), EngineError>>),
    /// Destroy the GPU device of the model's part `.0` (fault injection; see
    /// `Engine::lose_device`).
    LoseDevice(usize),
    /// Once idle: a new backend (on a new device if the old one was lost), weights reloaded.
    Reload(oneshot::Sender<Result<(), EngineError>>),
}

/// Opens a new device and loads the model again (after the old device was lost).
pub(crate) type Rebuild = Box<dyn FnMut() -> LocalBoxFuture<'static, Result<(Box<dyn Backend>, Vec<Arc<GpuContext>>), EngineError>>>;

/// A step submitted to an overlapping backend whose results are not read yet.
struct InFlight {
    plan: StepPlan,
    ticket: Ticket,
    /// Its sequences whose draft is the tokens their grammar forces (see `Runner::forced`).
    forced: HashSet<SeqId>,
}

/// What [`Runner::run_plan`] did with a plan: ran it, or submitted it to be read later.
enum Ran {
    Done(StepResult),
    Submitted(Ticket),
}

struct Choice {
    seq: SeqId,
    gen: Generation,
    /// Its draft length, adapted to its own acceptance.
    adapt: Adapt,
}

struct RequestState {
    events: mpsc::UnboundedSender<EventResult>,
    choices: Vec<Choice>,
    logits: bool,
    /// Its predicted output's tokens, a draft source for every choice (empty: none).
    prediction: Vec<u32>,
    /// The request field its grammar came from, named in a constraint's error.
    constraint_field: &'static str,
}

pub(crate) struct Runner {
    backend: Box<dyn Backend>,
    /// The backend's devices (GPU backend): one, or one per part of a layer split.
    gpus: Vec<Arc<GpuContext>>,
    rebuild: Rebuild,
    /// The device was lost: the next step first rebuilds the backend.
    lost: bool,
    sched: Scheduler,
    tokenizer: Arc<Tokenizer>,
    clock: Clock,
    n_ctx: usize,
    requests: HashMap<u64, RequestState>,
    /// The request and choice of every live sequence.
    owner: HashMap<SeqId, (u64, usize)>,
    /// Profiles and waits for the engine to be idle.
    profiles: Vec<Command>,
    /// Speculative decoding (choices draft by n-gram lookup when on).
    spec: SpecConfig,
    spec_counts: SpecCounts,
    /// The draft model (`--model-draft`), when speculation drafts with one.
    draft: Option<DraftModel>,
    /// Sequences whose drafts this step were sampled by the draft model, with the slot of
    /// the store that holds their distributions (their verify rows are linked to it).
    linked: HashMap<SeqId, (usize, usize)>,
    /// Sequences whose draft this step is the tokens their grammar forces (fast-forward:
    /// certain, so neither counted as drafts nor adapting the draft length).
    forced: HashSet<SeqId>,
    /// Overlapped steps (`LoadOptions::overlap`), and the step submitted and not read yet.
    pub overlap: bool,
    in_flight: Option<InFlight>,
    /// Steps submitted before the one before them was read, and the host's time on them.
    overlapped: Overlap,
    /// Microseconds spent collecting steps, all told.
    waited_us: u64,
}

impl Runner {
    // Each piece the loop owns, handed over once by the load.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        backend: Box<dyn Backend>,
        gpus: Vec<Arc<GpuContext>>,
        rebuild: Rebuild,
        sched: Scheduler,
        tokenizer: Arc<Tokenizer>,
        clock: Clock,
        n_ctx: usize,
        spec: SpecConfig,
        draft: Option<DraftModel>,
    ) -> Runner {
        let (requests, owner, profiles) = (HashMap::new(), HashMap::new(), Vec::new());
        let spec_counts = SpecCounts::default();
        Runner {
            backend,
            gpus,
            rebuild,
            lost: false,
            sched,
            tokenizer,
            clock,
            n_ctx,
            requests,
            owner,
            profiles,
            spec,
            spec_counts,
            draft,
            linked: HashMap::new(),
            forced: HashSet::new(),
            overlap: true,
            in_flight: None,
            overlapped: Overlap::default(),
            waited_us: 0,
        }
    }

    /// Runs until every engine handle is gone.
    pub async fn run(mut self, mut commands: mpsc::UnboundedReceiver<Command>) {
        loop {
            if self.sched.is_idle() {
                // A step may still be out whose sequences all ended: read it first.
                if let Err(e) = self.drain().await {
                    self.fail_all(e);
                }
                for c in std::mem::take(&mut self.profiles) {
                    self.profile(c).await;
                }
                match commands.next().await {
                    Some(c) => self.handle(c),
                    None => return,
                }
            }
            // Everything that arrived meanwhile joins this step.
            loop {
                match commands.try_recv() {
                    Ok(c) => self.handle(c),
                    Err(mpsc::TryRecvError::Closed) if self.sched.is_idle() => return,
                    Err(_) => break,
                }
            }
            if !self.sched.is_idle() {
                let stepped = match self.recover().await {
                    Ok(()) => self.step().await,
                    Err(e) => Err(e),
                };
                match stepped {
                    Ok(true) => {}
                    // Work that cannot run and nothing out: only a command (a cancel, a
                    // request, a cleared cache) changes that. Wait for one rather than spin,
                    // which in the browser would freeze the page the command must come from.
                    Ok(false) => match commands.next().await {
                        Some(c) => self.handle(c),
                        None => return,
                    },
                    Err(e) => {
                        self.abandon().await;
                        self.fail_all(e);
                    }
                }
            }
        }
    }

    fn handle(&mut self, c: Command) {
        match c {
            Command::Submit { id, prepared, events } => self.submit(id, prepared, events),
            Command::Cancel(id) => self.cancel(id),
            Command::CancelAll => {
                let ids: Vec<u64> = self.requests.keys().copied().collect();
                for id in ids {
                    self.cancel(id);
                }
            }
            Command::ClearCache => self.sched.clear_cache(),
            Command::Stats(reply) => {
                let _ = reply.send(SchedStats { spec: self.spec_counts, overlapped: self.overlapped, ..self.sched.stats() });
            }
            c @ (Command::Profile { .. } | Command::WhenIdle(_) | Command::WarmUp(_) | Command::Reload(_)) => self.profiles.push(c),
            Command::LoseDevice(part) => {
                if let Some(ctx) = self.gpus.get(part) {
                    ctx.device.destroy();
                    // Natively the loss is reported at the next poll.
                    let _ = ctx.poll_wait();
                }
            }
        }
    }

    /// After a lost device: a new device and the weights loaded again, before the step that
    /// needs them. The KV layout must be the old one (the scheduler's blocks are its ids).
    async fn recover(&mut self) -> Result<(), BackendError> {
        if self.lost {
            return self.rebuild_backend().await;
        }
        // Lost between steps (or reported only after the step that met it failed, as in the
        // browser): the requests' KV went with it, so they fail first; the next request
        // rebuilds.
        match self.gpus.iter().find_map(|g| g.lost_reason()) {
            Some(reason) => Err(BackendError::DeviceLost { cause: reason }),
            None => Ok(()),
        }
    }

    fn gpu_lost(&self) -> bool {
        self.gpus.iter().any(|g| g.is_lost())
    }

    async fn rebuild_backend(&mut self) -> Result<(), BackendError> {
        self.sched.clear_cache();
        let lost = self.lost || self.gpu_lost();
        let failed =
            |m: String| if lost { BackendError::DeviceLost { cause: format!("the device was lost and {m}") } } else { BackendError::Device { cause: m } };
        let (backend, gpus) = (self.rebuild)().await.map_err(|e| failed(format!("loading the model again failed: {e}")))?;
        if backend.kv_layout() != self.backend.kv_layout() {
            return Err(failed("the new backend lays out the KV cache differently".into()));
        }
        (self.backend, self.gpus, self.lost) = (backend, gpus, false);
        if let Some(d) = &mut self.draft {
            d.rebuild(self.backend.as_mut()).await.map_err(|e| failed(format!("loading the draft model again failed: {e}")))?;
        }
        Ok(())
    }

    fn submit(&mut self, id: u64, prepared: Prepared, events: mpsc::UnboundedSender<EventResult>) {
        let Prepared { prompt, choices, logits, prediction, constraint_field } = prepared;
        let seqs = match self.sched.add(prompt, choices.len() - 1) {
            Ok(s) => s,
            Err(e) => {
                let _ = events.unbounded_send(Err(EngineError::Sched(e)));
                return;
            }
        };
        let choices: Vec<Choice> = seqs.iter().zip(choices).map(|(&seq, gen)| Choice { seq, gen, adapt: Adapt::new(&self.spec) }).collect();
        for (i, c) in choices.iter().enumerate() {
            self.owner.insert(c.seq, (id, i));
        }
        self.requests.insert(id, RequestState { events, choices, logits, prediction, constraint_field });
    }

    /// Ends every unfinished choice of request `id` with `abort` and frees its sequences.
    fn cancel(&mut self, id: u64) {
        let Some(mut req) = self.requests.remove(&id) else { return };
        let now = (self.clock)();
        for c in &mut req.choices {
            self.owner.remove(&c.seq);
            self.sched.finish(c.seq);
            if !c.gen.is_done() {
                let _ = req.events.unbounded_send(Ok(c.gen.finish(FinishReason::Abort, now)));
            }
        }
    }

    /// Ends request `id` with `e`, keeping none of its blocks as cached prefixes.
    fn fail(&mut self, id: u64, e: EngineError) {
        let Some(req) = self.requests.remove(&id) else { return };
        for c in &req.choices {
            self.owner.remove(&c.seq);
            self.sched.discard(c.seq);
        }
        let _ = req.events.unbounded_send(Err(e));
    }

    /// A failed step fails every request: the device state is unknown, so no block becomes
    /// a cached prefix. A lost device also drops every cached prefix (its KV is gone) and
    /// marks the backend for a rebuild.
    fn fail_all(&mut self, e: BackendError) {
        let lost = matches!(e.root(), BackendError::DeviceLost { .. });
        let e = Arc::new(e);
        for (_, req) in self.requests.drain() {
            for c in &req.choices {
                self.sched.discard(c.seq);
            }
            let _ = req.events.unbounded_send(Err(EngineError::Step(e.clone())));
        }
        self.owner.clear();
        if let Some(d) = &mut self.draft {
            d.reset();
        }
        if lost {
            self.sched.clear_cache();
            self.lost = true;
        }
    }

    /// Drafts for every choice about to decode but those of `skip` (sequences holding a
    /// stand-in for a token not read yet), as long as its adapted length and its remaining
    /// tokens allow: from the request's predicted output where it has one and it matches, else
    /// by n-gram lookup in the choice's own tokens where the engine has it on.
    async fn propose_drafts(&mut self, skip: &HashSet<SeqId>) -> Result<(), BackendError> {
        let sizes = self.backend.verify_sizes();
        let ngram = self.spec.kind == SpecKind::Ngram;
        // Choices the draft model drafts for, with their most tokens.
        let mut wants: Vec<Want> = Vec::new();
        self.linked.clear();
        self.forced.clear();
        for req in self.requests.values_mut() {
            let sources = ngram || self.draft.is_some() || !req.prediction.is_empty();
            for c in req.choices.iter_mut() {
                if c.gen.is_done() || !self.sched.is_decoding(c.seq) || skip.contains(&c.seq) {
                    continue;
                }
                // k drafts yield up to k + 1 tokens (the model's own after them): no more
                // than the choice may still generate.
                let room = c.gen.remaining().map_or(usize::MAX, |r| r.saturating_sub(1));
                // Fast-forward: tokens the grammar forces go in as a draft the verify step
                // takes whole (each of its rows allows only that token).
                let forced = c.gen.forced_tokens(self.spec.draft_max.min(room));
                let forced = &forced[..fit_draft(forced.len(), sizes)];
                if !forced.is_empty() {
                    self.sched.propose(c.seq, forced.to_vec());
                    self.forced.insert(c.seq);
                    continue;
                }
                if !sources || !c.gen.speculates() {
                    continue;
                }
                let k = c.adapt.budget(&self.spec).min(room);
                let tokens = self.sched.tokens(c.seq);
                let generated = &tokens[tokens.len().saturating_sub(c.gen.completion_tokens())..];
                let mut draft = if req.prediction.is_empty() { Vec::new() } else { prediction_draft(&req.prediction, generated, k) };
                if draft.is_empty() && ngram {
                    draft = ngram_draft(tokens, k);
                }
                if draft.is_empty() && self.draft.is_some() {
                    // Draft no more than the entry keeps; sampled requests with their sampler.
                    let sampler = Some(c.gen.sampler_mut()).filter(|s| s.params().temperature > 0.0).map(|s| s.clone());
                    wants.push(Want { seq: c.seq, k: fit_draft(k, sizes), sampler });
                    continue;
                }
                draft.truncate(c.gen.grammar_prefix(&draft));
                draft.truncate(fit_draft(draft.len(), sizes));
                if !draft.is_empty() && draft.len() >= self.spec.draft_min {
                    self.sched.propose(c.seq, draft);
                }
            }
        }
        if let Some(model) = self.draft.as_mut().filter(|_| !wants.is_empty()) {
            let draft_max = self.spec.draft_max;
            for (seq, drafted) in model.draft(&self.sched, wants).await? {
                // It may have stopped early (p_min), or left the grammar: cut again.
                let mut draft = drafted.tokens;
                if let Some(c) = self.choice_mut(seq) {
                    draft.truncate(c.gen.grammar_prefix(&draft));
                }
                draft.truncate(fit_draft(draft.len(), sizes));
                if !draft.is_empty() && draft.len() >= self.spec.draft_min {
                    self.sched.propose(seq, draft);
                    if let Some(slot) = drafted.slot {
                        self.linked.insert(seq, (slot, draft_max));
                    }
                }
            }
        }
        Ok(())
    }

    /// One forward step: drafts proposed, the plan run, its results folded back. Where the
    /// backend overlaps steps, the step is submitted and read at the next one
    /// ([`Runner::step_overlapped`]).
    /// Returns whether anything ran or was read (false: the plan was empty, nothing out).
    async fn step(&mut self) -> Result<bool, BackendError> {
        if let Some(prev) = self.in_flight.take() {
            let (t0, waited, submitted) = ((self.clock)(), self.waited_us, self.overlapped.submit_us);
            self.step_overlapped(prev).await?;
            let (turn, wait) = (us_since(self.clock, t0), self.waited_us - waited);
            let o = &mut self.overlapped;
            o.wait_us += wait;
            o.other_us += turn.saturating_sub(wait + o.submit_us - submitted);
            return Ok(true);
        }
        if self.spec.drafts() {
            self.propose_drafts(&HashSet::new()).await?;
        }
        let plan = self.schedule();
        if plan.is_empty() {
            return Ok(false);
        }
        self.started(&plan);
        if self.overlappable() {
            if let Ran::Submitted(ticket) = self.run_plan(&plan, Some(&[])).await? {
                self.in_flight = Some(InFlight { plan, ticket, forced: std::mem::take(&mut self.forced) });
            }
            return Ok(true);
        }
        let result = self.run_plan(&plan, None).await;
        // Links hold for this step only.
        for req in self.requests.values_mut() {
            for c in req.choices.iter_mut() {
                c.gen.sampler_mut().set_link(None);
            }
        }
        if let Ran::Done(result) = result? {
            self.fold(&plan, result, None);
        }
        Ok(true)
    }

    /// The next step's plan: a cold lone prompt one token a step ([`Runner::cold_prompt`]).
    fn schedule(&mut self) -> StepPlan {
        match self.cold_prompt() {
            true => self.sched.schedule_within(1),
            false => self.sched.schedule(),
        }
    }

    /// Tells each choice of `plan` that its request's computation started.
    fn started(&mut self, plan: &StepPlan) {
        let now = (self.clock)();
        for e in &plan.entries {
            for &seq in std::iter::once(&e.seq).chain(&e.forked) {
                let cached = self.sched.cached(seq);
                if let Some(c) = self.choice_mut(seq) {
                    c.gen.started(now, cached);
                }
            }
        }
    }

    /// Whether steps may run overlapped: the backend overlaps, the loop drafts for no
    /// sequence on its own (no n-gram drafts, no draft model: each sequence would need the
    /// host between two steps) and no request reads logits back. Choices that need the host
    /// between two steps (a grammar's mask, a prediction to draft from: [`Runner::host_bound`])
    /// are not fed: they sit out the step submitted while their last one runs, and the rest
    /// go on. Penalties need no host: the device counts a fed row's pending token in
    /// (`ops::penalize` in flint-gpu).
    fn overlappable(&self) -> bool {
        self.overlap && self.backend.overlaps() && !self.spec.drafts_every_sequence() && self.draft.is_none() && self.requests.values().all(|r| !r.logits)
    }

    /// Whether `c` of `r` needs the host between two steps: its grammar's mask for the next
    /// token follows the last one, and so do the drafts from its prediction.
    fn host_bound(&self, r: &RequestState, c: &Choice) -> bool {
        !c.gen.is_done() && (c.gen.is_constrained() || (!r.prediction.is_empty() && self.spec.drafts()))
    }

    /// With `prev` submitted and unread: where it may, plans and submits the next step first,
    /// the tokens `prev` draws for the sequences that go on fed on the device, then reads
    /// `prev` and folds it in ([`Scheduler::update_overlapped`]: stops apply one step late,
    /// the overrun row is dropped); else reads `prev` and folds it in as any step.
    async fn step_overlapped(&mut self, prev: InFlight) -> Result<(), BackendError> {
        if !self.overlappable() {
            return self.read_in(prev, None).await;
        }
        let rows = prev.plan.output_rows();
        // Sequences expected to go on: one output row (no drafts to verify), not done, not
        // bound to the host, more tokens allowed, room in the context.
        let fed: HashSet<SeqId> = rows
            .iter()
            .filter(|&&(seq, n)| {
                let held = self.sched.contains(seq).then(|| self.sched.tokens(seq).len());
                let owner = self.owner.get(&seq).and_then(|&(r, c)| self.requests.get(&r).map(|r| (r, &r.choices[c])));
                match (held, owner) {
                    (Some(held), Some((r, c))) => {
                        n == 1 && !c.gen.is_done() && !self.host_bound(r, c) && c.gen.remaining().is_none_or(|r| r > 1) && held + 1 < self.n_ctx
                    }
                    _ => false,
                }
            })
            .map(|&(seq, _)| seq)
            .collect();
        self.sched.overlap(&prev.plan, &fed);
        // The sequences that sat out `prev` may draft (forced tokens, predictions).
        if self.spec.drafts() {
            self.propose_drafts(&fed).await?;
        }
        let plan = self.schedule();
        let mut feeds = Vec::new();
        let mut at = 0;
        for e in &plan.entries {
            // The stand-in is the sequence's last token: a decode step's one token, or the
            // last of a recompute (the scheduler preempted and took it back at once).
            let stand_in = self.sched.tokens(e.seq).len() - 1;
            if fed.contains(&e.seq) && (e.start..e.start + e.len).contains(&stand_in) {
                // Its row among `prev`'s output rows, entries of several rows counted whole.
                if let Some(i) = rows.iter().position(|&(s, _)| s == e.seq) {
                    let row = rows[..i].iter().map(|&(_, n)| n).sum();
                    feeds.push(Feed { token: at + stand_in - e.start, row });
                }
            }
            at += e.len;
        }
        if !plan.is_empty() {
            self.started(&plan);
            let t0 = (self.clock)();
            let ran = self.run_plan(&plan, Some(&feeds)).await;
            self.overlapped.submit_us += us_since(self.clock, t0);
            match ran {
                Ok(ran) => {
                    if let Ran::Submitted(ticket) = ran {
                        self.in_flight = Some(InFlight { plan, ticket, forced: std::mem::take(&mut self.forced) });
                        self.overlapped.steps += 1;
                    }
                }
                Err(e) => {
                    let _ = self.backend.collect(prev.ticket).await;
                    return Err(e);
                }
            }
        }
        self.read_in(prev, Some(&fed)).await
    }

    /// Reads submitted step `f` and folds it in (`fed`: the sequences the step after it runs).
    async fn read_in(&mut self, f: InFlight, fed: Option<&HashSet<SeqId>>) -> Result<(), BackendError> {
        let t0 = (self.clock)();
        let result = self.backend.collect(f.ticket).await;
        self.waited_us += us_since(self.clock, t0);
        let result = result?;
        self.forced = f.forced;
        self.fold(&f.plan, result, fed);
        Ok(())
    }

    /// Reads and folds in the step still out, if any.
    async fn drain(&mut self) -> Result<(), BackendError> {
        match self.in_flight.take() {
            Some(f) => self.read_in(f, None).await,
            None => Ok(()),
        }
    }

    /// After a failed step: the step still out is read and dropped (the backend takes no
    /// other step before).
    async fn abandon(&mut self) {
        if let Some(f) = self.in_flight.take() {
            let _ = self.backend.collect(f.ticket).await;
        }
    }

    /// Whether a lone short prompt should run one token a step: its step size's kernels are
    /// not built, and [`COLD_PROMPT_TOKENS`] one-token steps (whose kernels the load built)
    /// cost less than building them where a driver compiles on the CPU (lavapipe: seconds
    /// per kernel, in every process), and little elsewhere. The tokens are the same either
    /// way: a token's result does not depend on its step's size.
    fn cold_prompt(&self) -> bool {
        self.sched.lone_pending().is_some_and(|n| (2..=COLD_PROMPT_TOKENS).contains(&n) && !self.backend.step_ready(n))
    }

    /// The choice sequence `seq` belongs to.
    fn choice_mut(&mut self, seq: SeqId) -> Option<&mut Choice> {
        let &(rid, ci) = self.owner.get(&seq)?;
        self.requests.get_mut(&rid).map(|r| &mut r.choices[ci])
    }

    /// Runs `plan` on the backend, each output row with its sampler: a verify entry's row j
    /// draws after drafts 1..j, so its sampler is a copy of the choice's whose penalty
    /// history holds them; sampled drafts link row j to draft j's distribution. With `feeds`
    /// (tokens whose ids are the draws of the step still out) it is submitted, not waited for
    /// ([`Backend::submit`]).
    async fn run_plan(&mut self, plan: &StepPlan, feeds: Option<&[Feed]>) -> Result<Ran, BackendError> {
        let rows = plan.output_rows();
        let want_logits = rows.iter().any(|(s, _)| self.owner.get(s).and_then(|(r, _)| self.requests.get(r)).is_some_and(|r| r.logits));
        let mut copies: Vec<(SeqId, Vec<Sampler>)> = Vec::new();
        for &(seq, n) in rows.iter().filter(|(_, n)| *n > 1) {
            let Some(&(rid, ci)) = self.owner.get(&seq) else { continue };
            let Some(req) = self.requests.get_mut(&rid) else { continue };
            let drafts = self.sched.drafts(seq);
            let base = req.choices[ci].gen.sampler_mut();
            let mut list: Vec<Sampler> = (1..n).map(|j| base.after(&drafts[..j])).collect();
            if let Some(&(slot, draft_max)) = self.linked.get(&seq) {
                let link = |j: usize| Some(DraftLink::Verify { token: drafts[j], q_row: (slot * draft_max + j) as u32 });
                base.set_link(link(0));
                for (j, row) in list.iter_mut().enumerate().take(drafts.len().saturating_sub(1)) {
                    row.set_link(link(j + 1));
                }
            }
            copies.push((seq, list));
        }
        let mut samplers: HashMap<SeqId, Vec<&mut Sampler>> = HashMap::new();
        // Constrained choices' mask work, with the drafts their verify rows follow.
        let mut jobs: HashMap<SeqId, (MaskJob<'_>, Vec<u32>)> = HashMap::new();
        for req in self.requests.values_mut() {
            for c in req.choices.iter_mut().filter(|c| rows.iter().any(|(s, _)| *s == c.seq)) {
                let (sampler, job) = c.gen.split_mut();
                samplers.insert(c.seq, vec![sampler]);
                if let Some(job) = job {
                    jobs.insert(c.seq, (job, self.sched.drafts(c.seq).to_vec()));
                }
            }
        }
        for (seq, list) in &mut copies {
            if let Some(v) = samplers.get_mut(seq) {
                v.extend(list.iter_mut());
            }
        }
        let batch = self.sched.batch_rows(plan, &mut samplers, want_logits);
        if jobs.is_empty() {
            return match feeds {
                Some(feeds) => self.backend.submit(batch, feeds, None).await.map(Ran::Submitted),
                None => self.backend.step(batch).await.map(Ran::Done),
            };
        }
        // Each output row's mask (None for free rows), computed while the forward pass runs.
        let masks: LateMasks<'_> = Box::new(move || {
            let mut out = Vec::new();
            for (seq, n) in rows {
                match jobs.remove(&seq) {
                    Some((job, drafts)) => out.extend(job.masks(&drafts, n).into_iter().map(Some)),
                    None => out.extend(std::iter::repeat_n(None, n)),
                }
            }
            out
        });
        match feeds {
            Some(feeds) => self.backend.submit(batch, feeds, Some(masks)).await.map(Ran::Submitted),
            None => self.backend.step_with_masks(batch, masks).await.map(Ran::Done),
        }
    }

    /// Folds a step's results back ([`Scheduler::update`], or with `fed` the sequences the
    /// next step already runs, [`Scheduler::update_overlapped`]): each row a plain decode
    /// would have drawn goes through its choice (events, stops), then each request's state
    /// follows its sequences' ends.
    fn fold(&mut self, plan: &StepPlan, result: StepResult, fed: Option<&HashSet<SeqId>>) {
        let now = (self.clock)();
        let ids: Vec<u32> = result.sampled.iter().map(|s| s.id).collect();
        let (requests, owner, spec, forced) = (&mut self.requests, &self.owner, &self.spec, &self.forced);
        let (tokenizer, n_ctx) = (&self.tokenizer, self.n_ctx);
        let mut deaf: Vec<u64> = Vec::new();
        // Requests whose grammar could not go on, with why.
        let mut broken: Vec<(u64, flint_core::constrain::ConstraintError)> = Vec::new();
        let take = |row: flint_core::sched::Row| {
            let Some(&(rid, ci)) = owner.get(&row.seq) else { return Flow::Stop };
            let Some(req) = requests.get_mut(&rid) else { return Flow::Stop };
            let c = &mut req.choices[ci];
            let drafted = !forced.contains(&row.seq);
            if row.j == 0 && row.drafts > 0 && drafted {
                c.adapt.record(spec, row.drafts, row.accepted);
                c.gen.record_drafts(row.drafts, 0);
            }
            // Counted as accepted: the drafts the reply takes. A stop or an end-of-generation
            // token may end it inside the run; that token counts, what follows does not.
            if row.confirms_draft() && drafted {
                c.gen.record_drafts(0, 1);
            }
            if let Some(e) = c.gen.take_constraint_error() {
                broken.push((rid, e));
                return Flow::Stop;
            }
            let (mut events, on) = c.gen.on_sampled(tokenizer, result.sampled[row.index].clone(), now, row.held < n_ctx);
            if let Some(e) = c.gen.take_constraint_error() {
                broken.push((rid, e));
                return Flow::Stop;
            }
            if let (true, Some(Event::Token { logits, .. })) = (req.logits, events.first_mut()) {
                *logits = result.logits.get(row.index).cloned();
            }
            let delivered = events.into_iter().all(|e| req.events.unbounded_send(Ok(e)).is_ok());
            if !delivered {
                deaf.push(rid);
            }
            if on && delivered {
                Flow::Next
            } else {
                Flow::Stop
            }
        };
        let updates = match fed {
            Some(fed) => self.sched.update_overlapped(plan, &ids, fed, take),
            None => self.sched.update(plan, &ids, take),
        };
        for u in updates {
            let Some(&(rid, ci)) = self.owner.get(&u.seq) else { continue };
            if let Some(i) = broken.iter().position(|(r, _)| *r == rid) {
                let (_, source) = broken.swap_remove(i);
                let field = self.requests.get(&rid).map_or("grammar", |r| r.constraint_field);
                self.fail(rid, EngineError::Constraint { field, source });
                continue;
            }
            let Some(req) = self.requests.get_mut(&rid) else { continue };
            let gen = &mut req.choices[ci].gen;
            // Rows 1..taken drew on the choice's behalf (row 0 with its own sampler).
            gen.sampler_mut().advance(u.taken as u32 - 1);
            if !self.forced.contains(&u.seq) {
                self.spec_counts.add(u.drafts, u.accepted.min(u.taken));
            }
            match u.end {
                SeqEnd::Broken => {
                    let token = gen.completion_tokens() + 1;
                    self.fail(rid, BackendError::NonFiniteLogits { token, backend: self.backend.name() }.into())
                }
                SeqEnd::Kv(e) => self.fail(rid, BackendError::Kv(e).into()),
                SeqEnd::Finished | SeqEnd::Continues | SeqEnd::Held => {
                    if u.end == SeqEnd::Finished {
                        self.owner.remove(&u.seq);
                    }
                    if deaf.contains(&rid) {
                        // Nobody listens: the request was dropped without a cancel.
                        self.cancel(rid);
                    } else if self.requests.get(&rid).is_some_and(|r| r.choices.iter().all(|c| c.gen.is_done())) {
                        self.requests.remove(&rid);
                    }
                }
            }
        }
    }

    /// A profile, run while idle on a private sequence; cached prefixes are dropped before and
    /// after, since its blocks overwrite whatever they held.
    async fn profile(&mut self, c: Command) {
        match c {
            Command::Profile { prompt, decode_sizes, reply } => {
                self.sched.clear_cache();
                let r = self.profile_steps(&prompt, &decode_sizes, true).await;
                self.sched.clear_cache();
                let _ = reply.send(r.map_err(|e| EngineError::Step(Arc::new(e))));
            }
            Command::WarmUp(reply) => {
                let limits = self.backend.limits();
                let n_vocab = self.backend.config().n_vocab as u32;
                // A prompt past the largest small-step size, of ordinary ids.
                let prompt: Vec<u32> = (0..32u32.min(limits.max_tokens as u32)).map(|i| (1000 + 7 * i) % n_vocab).collect();
                let sizes: Vec<usize> = (1..=limits.max_seqs.min(limits.max_outputs)).collect();
                self.sched.clear_cache();
                let r = self.profile_steps(&prompt, &sizes, false).await;
                self.sched.clear_cache();
                let _ = reply.send(r.map(|_| ()).map_err(|e| EngineError::Step(Arc::new(e))));
            }
            Command::WhenIdle(reply) => {
                let _ = reply.send(());
            }
            Command::Reload(reply) => {
                let r = self.rebuild_backend().await;
                self.lost = r.is_err();
                let _ = reply.send(r.map_err(|e| EngineError::Step(Arc::new(e))));
            }
            _ => {}
        }
    }

    /// A prefill step of `prompt`, then decode steps of each of `decode_sizes` sequences,
    /// each step timed per op when `timed` (a decode size runs once untimed first), else just
    /// run once (a warm-up).
    async fn profile_steps(&mut self, prompt: &[u32], decode_sizes: &[usize], timed: bool) -> Result<(OpTimes, Vec<OpTimes>), BackendError> {
        use flint_core::backend::{OutputRow, StepBatch, StepEntry};
        use flint_core::kv::KvCache;
        let limits = self.backend.limits();
        let prompt = &prompt[..prompt.len().min(limits.max_tokens)];
        let layout = self.backend.kv_layout().clone();
        let mut kv = KvCache::new(layout);
        kv.open(0);
        let copies = kv.reserve(0, prompt.len())?;
        let mut greedy = Sampler::new(SamplingParams::greedy())?;
        let prefill = {
            let outputs = vec![OutputRow { index: prompt.len() - 1, sampler: &mut greedy }];
            let batch = StepBatch { entries: vec![StepEntry { tokens: prompt, start: 0, tables: kv.tables(0), outputs }], copies: &copies, logits: false };
            if timed {
                self.backend.profile(batch).await?
            } else {
                self.backend.step(batch).await?;
                OpTimes::new()
            }
        };
        // The profiled prefill stored the prompt's KV: decode steps of n sequences fork it.
        let mut decodes = Vec::new();
        for &n in decode_sizes {
            // A step of n sequences is n tokens: within the step budget too.
            let n = n.clamp(1, limits.max_seqs.min(limits.max_outputs).min(limits.max_tokens));
            let mut copies = Vec::new();
            for s in 1..=n as u64 {
                kv.fork(0, s);
                copies.extend(kv.reserve(s, prompt.len() + 1)?);
            }
            let token = [prompt[0]];
            // Once to build and warm this step size's kernels (untimed), then timed.
            let passes: &[bool] = if timed { &[true, false] } else { &[true] };
            for &warm in passes {
                let mut samplers: Vec<Sampler> = (0..n).map(|_| Sampler::new(SamplingParams::greedy())).collect::<Result<_, _>>()?;
                let entries = samplers
                    .iter_mut()
                    .enumerate()
                    .map(|(i, sampler)| StepEntry {
                        tokens: &token,
                        start: prompt.len(),
                        tables: kv.tables(i as u64 + 1),
                        outputs: vec![OutputRow { index: 0, sampler }],
                    })
                    .collect();
                let copies = if warm { &copies[..] } else { &[][..] };
                let batch = StepBatch { entries, copies, logits: false };
                if !timed {
                    self.backend.step(batch).await?;
                } else if warm {
                    self.backend.profile(batch).await?;
                } else {
                    decodes.push(self.backend.profile(batch).await?);
                }
            }
            for s in 1..=n as u64 {
                kv.release(s);
            }
        }
        Ok((prefill, decodes))
    }
}

/// Whole microseconds from `t0` (a `clock` reading, in ms) to now.
fn us_since(clock: Clock, t0: f64) -> u64 {
    ((clock() - t0) * 1e3).max(0.0) as u64
}

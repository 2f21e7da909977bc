//! Folding a step's results back into the scheduler (after vLLM's
//! `Scheduler.update_from_output`): which output rows belong to which sequence and draft, how
//! many drafts the target's own tokens accepted, and what each sequence keeps. The caller's
//! per-request state sees every row a plain decode would have drawn, in order, and says whether
//! its sequence goes on.

use std::collections::HashSet;

use crate::kv::{KvError, SeqId};
use crate::sampling::NON_FINITE;
use crate::spec::accepted_prefix;

use super::{Scheduler, StepPlan};

/// One output row handed to the caller: the token a plain decode step would have drawn next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Row {
    pub seq: SeqId,
    /// Index into the step's sampled rows.
    pub index: usize,
    /// Position among the sequence's rows this step (0: the pending token's row).
    pub j: usize,
    /// Drafts the sequence ran this step, and how many of them the target's tokens accepted.
    pub drafts: usize,
    pub accepted: usize,
    /// Tokens the sequence holds before this row's token joins (confirmed drafts counted).
    pub held: usize,
}

impl Row {
    /// This row's token confirms a draft (rows before the first mismatch).
    pub fn confirms_draft(&self) -> bool {
        self.j < self.accepted
    }
}

/// What the caller made of a row.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Flow {
    /// The token joins the sequence; further accepted rows follow.
    Next,
    /// The sequence ends with this token (a stop, its length, or nobody listening).
    Stop,
    /// The sequence keeps what it holds and takes no token, to be extended later (a draft
    /// model's mirror of a target sequence).
    Hold,
}

/// How a sequence came out of the step.
#[derive(Debug, PartialEq)]
pub enum SeqEnd {
    /// Its last token joined it; it runs on.
    Continues,
    /// It ended ([`Scheduler::finish`]ed: its full blocks stay cached).
    Finished,
    /// It stays as it was, without the row's token ([`Flow::Hold`]).
    Held,
    /// A row's logits were not finite: the caller discards the request's sequences.
    Broken,
    /// Rolling its drafts back failed; the caller discards the request's sequences.
    Kv(KvError),
}

/// One sequence's share of a step's results.
#[derive(Debug, PartialEq)]
pub struct SeqUpdate {
    pub seq: SeqId,
    pub drafts: usize,
    pub accepted: usize,
    /// Rows handed to the caller (a broken row included).
    pub taken: usize,
    pub end: SeqEnd,
}

/// The token a fed sequence holds until its step's draw is read (any valid id: the device
/// runs the real one).
pub const STAND_IN: u32 = 0;

impl Scheduler {
    /// Records that `plan` ran and folds its sampled ids (`sampled[i]`: output row i, in
    /// [`StepPlan::output_rows`] order) back: for each sequence with rows, the rows up to its
    /// first rejected draft go to `take` one by one, until it says [`Flow::Stop`]; the drafts
    /// before the last row taken stay, the rest roll back; the last row's token joins the
    /// sequence, or the sequence ends. Sequences no longer held (cancelled during the step) are
    /// skipped.
    pub fn update(&mut self, plan: &StepPlan, sampled: &[u32], take: impl FnMut(Row) -> Flow) -> Vec<SeqUpdate> {
        self.step_done(plan);
        self.fold(plan, sampled, &HashSet::new(), take)
    }

    /// Before `plan`'s results are read, so that the next step can be planned and submitted
    /// while it runs: records that it ran ([`Scheduler::step_done`]) and gives each of `fed`
    /// (sequences with an output row in it, expected to go on) a stand-in for the token it
    /// draws, so that the next plan decodes them; the backend feeds the real ids on the
    /// device. [`Scheduler::update_overlapped`] folds the results in later.
    pub fn overlap(&mut self, plan: &StepPlan, fed: &HashSet<SeqId>) {
        self.step_done(plan);
        for &id in fed {
            if let Some(s) = self.seqs.get_mut(&id) {
                s.tokens.push(STAND_IN);
            }
        }
    }

    /// Folds in the results of a step [`Scheduler::overlap`] let the next one overtake: as
    /// [`Scheduler::update`], but a row of `fed` puts its token in the place of the stand-in
    /// (the next step ran it already), and where its sequence ends the stand-in goes (the
    /// next step's row for it is an overrun the caller drops: the sequence is gone).
    pub fn update_overlapped(&mut self, plan: &StepPlan, sampled: &[u32], fed: &HashSet<SeqId>, take: impl FnMut(Row) -> Flow) -> Vec<SeqUpdate> {
        self.fold(plan, sampled, fed, take)
    }

    fn fold(&mut self, plan: &StepPlan, sampled: &[u32], fed: &HashSet<SeqId>, mut take: impl FnMut(Row) -> Flow) -> Vec<SeqUpdate> {
        let mut out = Vec::new();
        let mut at = 0;
        for (seq, n) in plan.output_rows() {
            let rows = at..at + n;
            at += n;
            if !self.contains(seq) {
                continue;
            }
            let target = &sampled[rows.clone()];
            let drafts = self.drafts(seq).len();
            let accepted = accepted_prefix(self.drafts(seq), target);
            // A fed sequence holds the stand-in past its rows' tokens.
            let stand_in = fed.contains(&seq) as usize;
            let base = self.tokens(seq).len() - drafts - stand_in;
            let (mut last, mut flow, mut broken) = (0, Flow::Next, false);
            for (j, &id) in target[..=accepted].iter().enumerate() {
                last = j;
                if id == NON_FINITE {
                    broken = true;
                    break;
                }
                flow = take(Row { seq, index: rows.start + j, j, drafts, accepted, held: base + j });
                if flow != Flow::Next {
                    break;
                }
            }
            let mut resolved = self.resolve(seq, last);
            if stand_in == 1 && (broken || flow != Flow::Next) {
                // It ends or holds: the stand-in goes, and with it the next step's KV for it.
                resolved = resolved.and_then(|()| self.truncate(seq, base));
            }
            let end = match (resolved, broken, flow) {
                (_, true, _) => SeqEnd::Broken,
                (Err(e), _, _) => SeqEnd::Kv(e),
                (Ok(()), _, Flow::Next) if stand_in == 1 => {
                    let s = self.seqs.get_mut(&seq).expect("running");
                    s.tokens[base] = target[last];
                    SeqEnd::Continues
                }
                (Ok(()), _, Flow::Next) => {
                    self.append(seq, target[last]);
                    SeqEnd::Continues
                }
                (Ok(()), _, Flow::Stop) => {
                    self.finish(seq);
                    SeqEnd::Finished
                }
                (Ok(()), _, Flow::Hold) => SeqEnd::Held,
            };
            out.push(SeqUpdate { seq, drafts, accepted, taken: last + 1, end });
        }
        out
    }
}

//! The scheduler's unit tests: a fake backend drives plans in microseconds.

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
        k_type: crate::kv::KvType::F32,
        v_type: crate::kv::KvType::F32,
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

/// `update` over a scheduled plan with the rows' ids; `take` records each row handed over and
/// stops a sequence at the ids in `stop_at`.
fn update(s: &mut Scheduler, plan: &StepPlan, ids: &[u32], stop_at: &[u32]) -> (Vec<Row>, Vec<SeqUpdate>) {
    let mut seen = Vec::new();
    let ups = s.update(plan, ids, |row| {
        seen.push(row);
        if stop_at.contains(&ids[row.index]) {
            Flow::Stop
        } else {
            Flow::Next
        }
    });
    (seen, ups)
}

#[test]
fn update_accepts_drafts_up_to_the_first_mismatch() {
    let mut s = sched(16, 4, 32, 64);
    s.set_draft_rows(4);
    let a = s.add(toks(1, 6), 0).unwrap()[0];
    let p = s.schedule();
    let (rows, ups) = update(&mut s, &p, &[50], &[]);
    assert_eq!(rows, vec![Row { seq: a, index: 0, j: 0, drafts: 0, accepted: 0, held: 6 }]);
    assert_eq!(ups, vec![SeqUpdate { seq: a, drafts: 0, accepted: 0, taken: 1, end: SeqEnd::Continues }]);
    assert_eq!(s.tokens(a)[6..], [50]);
    // Three drafts; the target agrees on the first two and then draws 99: rows 0..=2 go to
    // the caller (two confirm drafts), the third draft rolls back and 99 joins.
    s.propose(a, vec![11, 12, 13]);
    let p = s.schedule();
    assert_eq!(p.output_rows(), vec![(a, 4)]);
    let (rows, ups) = update(&mut s, &p, &[11, 12, 99, 7], &[]);
    assert_eq!(rows.iter().map(|r| (r.index, r.confirms_draft())).collect::<Vec<_>>(), vec![(0, true), (1, true), (2, false)]);
    assert_eq!(ups, vec![SeqUpdate { seq: a, drafts: 3, accepted: 2, taken: 3, end: SeqEnd::Continues }]);
    assert_eq!(s.tokens(a)[6..], [50, 11, 12, 99]);
    assert_eq!(s.kv().len(a), 9, "the rejected draft's position rolled back");
    // Every draft rejected: only the pending token's row, and the target's token joins.
    s.propose(a, vec![21, 22]);
    let p = s.schedule();
    let (rows, ups) = update(&mut s, &p, &[5, 6, 7], &[]);
    assert_eq!(rows.len(), 1);
    assert_eq!((ups[0].accepted, ups[0].taken), (0, 1));
    assert_eq!(s.tokens(a)[9..], [99, 5]);
    // All accepted, and a stop on the second: the sequence ends with it, the rest dropped.
    s.propose(a, vec![31, 32, 33]);
    let p = s.schedule();
    let (rows, ups) = update(&mut s, &p, &[31, 32, 33, 34], &[32]);
    assert_eq!(rows.len(), 2);
    assert_eq!(ups, vec![SeqUpdate { seq: a, drafts: 3, accepted: 3, taken: 2, end: SeqEnd::Finished }]);
    assert!(!s.contains(a));
}

#[test]
fn update_hands_every_fork_its_own_row() {
    // n = 3: the prompt runs once; the parent and two forks each get a row, then decode apart.
    let mut s = sched(64, 4, 64, 64);
    let ids = s.add(toks(1, 5), 2).unwrap();
    let p = s.schedule();
    assert_eq!(p.output_rows(), vec![(ids[0], 1), (ids[1], 1), (ids[2], 1)]);
    let (rows, ups) = update(&mut s, &p, &[7, 8, 9], &[8]);
    assert_eq!(rows.iter().map(|r| (r.seq, r.index)).collect::<Vec<_>>(), vec![(ids[0], 0), (ids[1], 1), (ids[2], 2)]);
    assert_eq!(ups.iter().map(|u| &u.end).collect::<Vec<_>>(), vec![&SeqEnd::Continues, &SeqEnd::Finished, &SeqEnd::Continues]);
    assert_eq!((s.tokens(ids[0])[5], s.tokens(ids[2])[5]), (7, 9));
    // The finished fork is gone; the others decode on, a row each.
    let p = s.schedule();
    assert_eq!(p.output_rows(), vec![(ids[0], 1), (ids[2], 1)]);
    let (_, ups) = update(&mut s, &p, &[10, 11], &[]);
    assert_eq!(ups.len(), 2);
    assert_eq!((s.tokens(ids[0])[6], s.tokens(ids[2])[6]), (10, 11));
}

#[test]
fn update_skips_the_preempted_and_the_cancelled() {
    // 8 blocks of 4: two 12-token sequences fill 6; growing, the newer is preempted in the
    // step that runs the older.
    let mut s = sched(64, 4, 32, 8);
    let a = s.add(toks(1, 12), 0).unwrap()[0];
    let b = s.add(toks(2, 12), 0).unwrap()[0];
    let mut t = 0;
    while s.stats().preemptions == 0 {
        let p = s.schedule();
        let ids: Vec<u32> = (0..p.output_rows().len() as u32).map(|i| 500 + t + i).collect();
        t += 10;
        let (_, ups) = update(&mut s, &p, &ids, &[]);
        if s.stats().preemptions > 0 {
            // The step ran a alone; b waits with its tokens and no blocks.
            assert_eq!(p.output_rows().iter().map(|r| r.0).collect::<Vec<_>>(), vec![a]);
            assert_eq!(ups.iter().map(|u| u.seq).collect::<Vec<_>>(), vec![a]);
            assert_eq!(s.kv().len(b), 0);
            assert_eq!(s.stats().waiting, 1);
        }
        assert!(t < 400, "the pool was never short");
    }
    // A sequence cancelled after its step was planned gets no rows.
    let p = s.schedule();
    s.finish(a);
    let (rows, ups) = update(&mut s, &p, &vec![1; p.output_rows().len()], &[]);
    assert!(rows.iter().all(|r| r.seq != a) && ups.iter().all(|u| u.seq != a));
}

#[test]
fn update_reports_a_broken_row_and_leaves_the_sequence_to_the_caller() {
    let mut s = sched(16, 4, 32, 64);
    s.set_draft_rows(4);
    let a = s.add(toks(1, 6), 0).unwrap()[0];
    let p = s.schedule();
    update(&mut s, &p, &[50], &[]);
    s.propose(a, vec![11, 12]);
    let p = s.schedule();
    let (rows, ups) = update(&mut s, &p, &[11, crate::sampling::NON_FINITE, 3], &[]);
    assert_eq!(rows.len(), 1, "the broken row is not handed over");
    assert_eq!(ups, vec![SeqUpdate { seq: a, drafts: 2, accepted: 1, taken: 2, end: SeqEnd::Broken }]);
    assert!(s.contains(a));
    s.discard(a);
}

#[test]
fn a_lone_prompt_can_run_a_token_a_step() {
    let mut s = sched(16, 4, 64, 64);
    assert_eq!(s.lone_pending(), None, "nothing to do");
    let a = s.add(toks(1, 5), 0).unwrap()[0];
    assert_eq!(s.lone_pending(), Some(5));
    // One token a step: the prompt's positions in order, the output at the last.
    for i in 0..5 {
        let p = s.schedule_within(1);
        assert_eq!(p.entries.iter().map(|e| (e.start, e.len, e.output)).collect::<Vec<_>>(), vec![(i, 1, i == 4)]);
        update(&mut s, &p, &vec![60; p.output_rows().len()], &[]);
    }
    assert_eq!(s.lone_pending(), Some(1), "decoding its next token");
    assert_eq!(s.tokens(a)[5], 60);
    // The full budget again afterwards; another sequence, or a fork, ends the lone case.
    let b = s.add(toks(2, 3), 0).unwrap()[0];
    assert_eq!(s.lone_pending(), None);
    let p = s.schedule();
    assert_eq!(p.n_tokens(), 4);
    s.finish(b);
    s.finish(a);
    s.add(toks(3, 4), 1).unwrap();
    assert_eq!(s.lone_pending(), None, "a request with a fork to make");
}

/// Overlapped steps: the next plan decodes the fed sequences on a stand-in, the late fold puts
/// the drawn token in its place, and a sequence that ends loses the stand-in (and the KV the
/// overrun step took for it); what reaches the prefix index is the real tokens only.
#[test]
fn overlapped_steps_fill_the_stand_in_or_drop_the_overrun() {
    use std::collections::HashSet;
    let mut s = sched(16, 4, 64, 64);
    let a = s.add(toks(1, 6), 0).unwrap()[0];
    let b = s.add(toks(2, 5), 0).unwrap()[0];
    // Step 1: both prompts, an output each; step 2 is planned before its draws are read.
    let p1 = s.schedule();
    assert_eq!(p1.output_rows(), vec![(a, 1), (b, 1)]);
    let fed: HashSet<SeqId> = [a, b].into();
    s.overlap(&p1, &fed);
    let p2 = s.schedule();
    let starts: Vec<(SeqId, usize, usize)> = p2.entries.iter().map(|e| (e.seq, e.start, e.len)).collect();
    assert_eq!(starts, vec![(a, 6, 1), (b, 5, 1)], "the fed sequences decode their stand-ins");
    assert_eq!((s.tokens(a)[6], s.tokens(b)[5]), (STAND_IN, STAND_IN));
    // Step 1's draws arrive while step 2 runs: a goes on, b stops.
    let mut rows = Vec::new();
    let ups = s.update_overlapped(&p1, &[111, 222], &fed, |r| {
        rows.push((r.seq, r.held));
        if r.seq == b {
            Flow::Stop
        } else {
            Flow::Next
        }
    });
    assert_eq!(rows, vec![(a, 6), (b, 5)], "held counts the real tokens, not the stand-in");
    assert_eq!(ups.iter().map(|u| (u.seq, &u.end)).collect::<Vec<_>>(), vec![(a, &SeqEnd::Continues), (b, &SeqEnd::Finished)]);
    assert_eq!(s.tokens(a), [toks(1, 6), vec![111]].concat(), "the draw takes the stand-in's place");
    assert!(!s.contains(b));
    // b's blocks went back (its 5 prompt tokens fill one block of 4: indexed; the rest freed).
    assert_eq!(s.kv().block_counts().cached, 1);
    // Step 2 ends: its row for b is skipped (b is gone); a appends as after any step.
    let ups = update(&mut s, &p2, &[333, 444], &[]).1;
    assert_eq!(ups.len(), 1);
    assert_eq!(s.tokens(a), [toks(1, 6), vec![111, 333]].concat());
    // Only real tokens were indexed: a's second block holds prompt tokens 4, 5, then 111, 333.
    let p3 = s.schedule();
    s.step_done(&p3);
    s.finish(a);
    let start = |s: &mut Scheduler, tokens: Vec<u32>| {
        let id = s.add(tokens, 0).unwrap()[0];
        let plan = s.schedule();
        let e = plan.entries.iter().find(|e| e.seq == id).unwrap().start;
        s.finish(id);
        e
    };
    assert_eq!(start(&mut s, [toks(1, 6), vec![111, 333, 9]].concat()), 8, "both of a's blocks are reused");
    assert_eq!(start(&mut s, [toks(1, 6), vec![STAND_IN, 333, 9]].concat()), 4, "no block holds the stand-in");
}

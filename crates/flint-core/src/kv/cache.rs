//! The KV cache of many sequences (vLLM's `KVCacheManager`): one block pool and prefix index
//! per block group of the [`KvLayout`], and per sequence one table per group.
//!
//! Full-attention groups keep every position. Sliding-window groups free the blocks that fall
//! out of a sequence's window, lagging by the layout's slack so a rollback of up to that many
//! positions stays possible. Full blocks are indexed as soon as they are computed, in every
//! group that still holds them, so a request can start from any sequence's prefix, live or
//! finished; on a sliding-window group a prefix is usable only if the blocks covering its last
//! window are still indexed. Nothing here touches a GPU: backends store what the tables say.

use std::collections::HashMap;

use super::layout::KvLayout;
use super::prefix::{block_key, Eviction, PrefixIndex, ROOT};
use super::{BlockManager, GroupCopy, KvError, SeqKv, NO_BLOCK};

/// A sequence's id, chosen by the caller (the scheduler).
pub type SeqId = u64;

struct Group {
    blocks: BlockManager,
    index: PrefixIndex,
    window: Option<usize>,
}

#[derive(Default)]
struct SeqState {
    /// One table per group.
    kv: Vec<SeqKv>,
    /// Chain keys of the full blocks indexed so far, in position order.
    keys: Vec<u64>,
}

/// Free and indexed blocks of one group.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GroupStats {
    pub n_blocks: u32,
    pub free: u32,
    pub indexed: u32,
}

pub struct KvCache {
    layout: KvLayout,
    groups: Vec<Group>,
    seqs: HashMap<SeqId, SeqState>,
}

impl KvCache {
    pub fn new(layout: KvLayout) -> KvCache {
        let groups = layout
            .groups
            .iter()
            .map(|g| {
                let eviction = if g.window.is_some() { Eviction::Any } else { Eviction::Leaves };
                Group {
                    blocks: BlockManager::new(g.n_blocks, layout.block_size),
                    index: PrefixIndex::new(layout.block_size, eviction),
                    window: g.window.map(|w| w as usize),
                }
            })
            .collect();
        KvCache { layout, groups, seqs: HashMap::new() }
    }

    pub fn layout(&self) -> &KvLayout {
        &self.layout
    }

    fn bs(&self) -> usize {
        self.layout.block_size as usize
    }

    fn state(&self, id: SeqId) -> &SeqState {
        self.seqs.get(&id).unwrap_or_else(|| panic!("sequence {id} is not open"))
    }

    fn state_mut(&mut self, id: SeqId) -> &mut SeqState {
        self.seqs.get_mut(&id).unwrap_or_else(|| panic!("sequence {id} is not open"))
    }

    /// Starts an empty sequence.
    pub fn open(&mut self, id: SeqId) {
        let kv = vec![SeqKv::new(); self.groups.len()];
        let old = self.seqs.insert(id, SeqState { kv, keys: Vec::new() });
        assert!(old.is_none(), "sequence {id} opened twice");
    }

    pub fn is_open(&self, id: SeqId) -> bool {
        self.seqs.contains_key(&id)
    }

    /// Positions the sequence holds.
    pub fn len(&self, id: SeqId) -> usize {
        self.state(id).kv.first().map_or(0, |s| s.len())
    }

    /// The sequence's block table in each group; [`NO_BLOCK`] marks blocks that fell out of a
    /// window.
    pub fn tables(&self, id: SeqId) -> Vec<&[u32]> {
        self.state(id).kv.iter().map(|s| s.table()).collect()
    }

    /// Blocks a sliding-window sequence needs for a query at position `len`: from this one on.
    fn first_needed_block(&self, window: usize, len: usize) -> usize {
        (len + 1).saturating_sub(window) / self.bs()
    }

    /// Makes the empty sequence `id` start from the longest cached prefix of `tokens` (whole
    /// blocks) that every group can serve, and returns how many positions it holds now.
    pub fn attach_prefix(&mut self, id: SeqId, tokens: &[u32]) -> usize {
        assert_eq!(self.len(id), 0, "attach_prefix needs an empty sequence");
        let bs = self.bs();
        let chunks: Vec<&[u32]> = tokens.chunks_exact(bs).collect();
        let mut keys = Vec::with_capacity(chunks.len());
        let mut parent = ROOT;
        for c in &chunks {
            parent = block_key(parent, c);
            keys.push(parent);
        }
        let parent_of = |i: usize| if i == 0 { ROOT } else { keys[i - 1] };
        // The longest prefix every full-attention group holds from its first block.
        let mut k = chunks.len();
        for g in self.groups.iter().filter(|g| g.window.is_none()) {
            let held = (0..k).take_while(|&i| g.index.contains(parent_of(i), chunks[i])).count();
            k = k.min(held);
        }
        // Shortened until each sliding-window group holds the blocks of its last window.
        while k > 0 {
            let ok = self
                .groups
                .iter()
                .filter_map(|g| g.window.map(|w| (g, w)))
                .all(|(g, w)| (self.first_needed_block(w, k * bs)..k).all(|i| g.index.contains(parent_of(i), chunks[i])));
            if ok {
                break;
            }
            k -= 1;
        }
        if k == 0 {
            return 0;
        }
        let first_needed: Vec<usize> = self.groups.iter().map(|g| g.window.map_or(0, |w| self.first_needed_block(w, k * bs))).collect();
        let mut tables = Vec::with_capacity(self.groups.len());
        for (g, &first) in self.groups.iter_mut().zip(&first_needed) {
            let mut table = vec![NO_BLOCK; k];
            for (i, slot) in table.iter_mut().enumerate().skip(first) {
                let b = g.index.get(parent_of(i), chunks[i]).expect("checked above");
                g.blocks.add_ref(b);
                *slot = b;
            }
            tables.push(SeqKv::from_blocks(table, k * bs));
        }
        let st = self.state_mut(id);
        st.kv = tables;
        st.keys = keys[..k].to_vec();
        k * bs
    }

    /// Blocks group `g` must allocate to grow `seq` to `new_len` positions (a copy-on-write
    /// block counts), at most what a sliding window can hold at once when `span_cap`.
    fn needed(&self, g: usize, seq: &SeqKv, new_len: usize) -> u32 {
        let group = &self.groups[g];
        if new_len <= seq.len() {
            return 0;
        }
        let bs = self.bs();
        let grow = group.blocks.blocks_for(new_len).saturating_sub(seq.table().len());
        let partial = (!seq.len().is_multiple_of(bs)).then(|| seq.len() / bs).filter(|&i| i < seq.table().len());
        let cow = partial.is_some_and(|i| group.blocks.refcount(seq.table()[i]) > 1) as usize;
        (grow + cow) as u32
    }

    /// Whether the pool could grow `id` to `new_len` positions with `spare` blocks left in
    /// every group, counting indexed blocks no sequence holds as free (they would be evicted).
    /// Sliding-window groups count at most the blocks their window spans.
    pub fn fits(&self, id: SeqId, new_len: usize, spare: u32) -> bool {
        let st = self.state(id);
        self.groups.iter().enumerate().all(|(g, group)| {
            let mut need = self.needed(g, &st.kv[g], new_len);
            if let Some(w) = group.window {
                let span = (w + self.layout.slack as usize + self.bs()).div_ceil(self.bs()) as u32 + 1;
                need = need.min(span);
            }
            need + spare <= group.blocks.n_free() + group.index.evictable(&group.blocks)
        })
    }

    /// Grows `id` to `new_len` positions in every group, evicting least recently used indexed
    /// blocks where a pool is short. On error nothing changes. The copies must be performed
    /// before this step's KV writes (see the module docs of [`crate::kv`]).
    pub fn reserve(&mut self, id: SeqId, new_len: usize) -> Result<Vec<GroupCopy>, KvError> {
        let st = self.state(id);
        let needs: Vec<u32> = (0..self.groups.len()).map(|g| self.needed(g, &st.kv[g], new_len)).collect();
        for (group, &need) in self.groups.iter_mut().zip(&needs) {
            if need > group.blocks.n_free() {
                group.index.evict(&mut group.blocks, need);
            }
            if need > group.blocks.n_free() {
                return Err(KvError::OutOfBlocks { needed: need, free: group.blocks.n_free() });
            }
        }
        let mut copies = Vec::new();
        let st = self.seqs.get_mut(&id).expect("checked above");
        for (g, (group, seq)) in self.groups.iter_mut().zip(&mut st.kv).enumerate() {
            let r = group.blocks.reserve(seq, new_len).expect("room checked above");
            copies.extend(r.copy.map(|c| GroupCopy { group: g, src: c.src, dst: c.dst }));
        }
        Ok(copies)
    }

    /// Indexes the full blocks of `id` not indexed yet; `tokens` are what its positions hold
    /// (at least its length).
    pub fn commit(&mut self, id: SeqId, tokens: &[u32]) {
        let bs = self.bs();
        let len = self.len(id).min(tokens.len());
        let st = self.seqs.get_mut(&id).expect("sequence is open");
        for i in st.keys.len()..len / bs {
            let parent = st.keys.last().copied().unwrap_or(ROOT);
            let chunk = &tokens[i * bs..(i + 1) * bs];
            for (group, seq) in self.groups.iter_mut().zip(&st.kv) {
                let b = seq.table()[i];
                if b != NO_BLOCK {
                    group.index.insert_block(&mut group.blocks, parent, chunk, b);
                }
            }
            st.keys.push(block_key(parent, chunk));
        }
    }

    /// Frees the sliding-window blocks `id` can no longer need: those before its window and
    /// slack.
    pub fn slide(&mut self, id: SeqId) {
        let slack = self.layout.slack as usize;
        let st = self.seqs.get_mut(&id).expect("sequence is open");
        for (group, seq) in self.groups.iter_mut().zip(&mut st.kv) {
            if let Some(w) = group.window {
                let first = (seq.len() + 1).saturating_sub(w + slack);
                group.blocks.free_before(seq, first);
            }
        }
    }

    /// Rolls `id` back to `len` positions; an error (changing nothing) if a sliding-window
    /// group no longer holds what a query at `len` sees.
    pub fn truncate(&mut self, id: SeqId, len: usize) -> Result<(), KvError> {
        let bs = self.bs();
        let st = self.state(id);
        for (group, seq) in self.groups.iter().zip(&st.kv) {
            if let Some(w) = group.window {
                if len < seq.len() && self.first_needed_block(w, len) * bs < group.blocks.first_held(seq) {
                    return Err(KvError::RollbackTooFar { len });
                }
            }
        }
        let st = self.seqs.get_mut(&id).expect("checked above");
        for (group, seq) in self.groups.iter_mut().zip(&mut st.kv) {
            group.blocks.truncate(seq, len);
        }
        st.keys.truncate(len / bs);
        Ok(())
    }

    /// Opens `child` sharing every block of `id` (copy-on-write).
    pub fn fork(&mut self, id: SeqId, child: SeqId) {
        let st = self.state(id);
        let keys = st.keys.clone();
        let kv: Vec<SeqKv> = self.groups.iter_mut().zip(&self.seqs[&id].kv).map(|(g, s)| g.blocks.fork(s)).collect();
        let old = self.seqs.insert(child, SeqState { kv, keys });
        assert!(old.is_none(), "sequence {child} opened twice");
    }

    /// Gives back every block of `id` (indexed ones stay with the index) and forgets it.
    pub fn release(&mut self, id: SeqId) {
        if let Some(mut st) = self.seqs.remove(&id) {
            for (group, seq) in self.groups.iter_mut().zip(&mut st.kv) {
                group.blocks.release(seq);
            }
        }
    }

    /// Empties `id` (its blocks go back) but keeps it open.
    pub fn reset(&mut self, id: SeqId) {
        self.release(id);
        self.open(id);
    }

    /// Drops every indexed block no sequence holds.
    pub fn clear_unheld(&mut self) {
        for g in &mut self.groups {
            g.index.clear_unheld(&mut g.blocks);
        }
    }

    /// Blocks of every group: all, held by sequences, held only by the prefix index.
    pub fn block_counts(&self) -> crate::sched::BlockCounts {
        let mut c = crate::sched::BlockCounts::default();
        for g in &self.groups {
            let cached = g.index.evictable(&g.blocks) as u64;
            c.total += g.blocks.n_blocks() as u64;
            c.cached += cached;
            c.used += (g.blocks.n_blocks() - g.blocks.n_free()) as u64 - cached;
        }
        c
    }

    pub fn stats(&self) -> Vec<GroupStats> {
        self.groups.iter().map(|g| GroupStats { n_blocks: g.blocks.n_blocks(), free: g.blocks.n_free(), indexed: g.index.len() as u32 }).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kv::layout::KvGroupSpec;
    use crate::kv::KvType;

    const BS: u32 = 4;

    fn layout(global: u32, windowed: Option<(u32, u32)>) -> KvLayout {
        let mut groups = vec![KvGroupSpec { n_blocks: global, window: None, layers: vec![0] }];
        if let Some((n, w)) = windowed {
            groups.push(KvGroupSpec { n_blocks: n, window: Some(w), layers: vec![1] });
        }
        KvLayout { block_size: BS, slack: 4, max_blocks_per_seq: 64, groups, k_type: KvType::F32, v_type: KvType::F32 }
    }

    fn toks(seed: u32, n: usize) -> Vec<u32> {
        (0..n as u32).map(|i| seed * 1000 + i).collect()
    }

    /// Runs `tokens` through sequence `id` as a backend would see it: reserve, then commit.
    fn run(kv: &mut KvCache, id: SeqId, tokens: &[u32], end: usize) {
        let _ = kv.reserve(id, end).unwrap();
        kv.commit(id, tokens);
        kv.slide(id);
    }

    #[test]
    fn sequences_share_a_finished_requests_prefix() {
        let mut kv = KvCache::new(layout(16, None));
        let a = toks(1, 10);
        kv.open(1);
        run(&mut kv, 1, &a, 10);
        kv.release(1);
        assert_eq!(kv.stats()[0].indexed, 2);
        // A prompt sharing a's first 9 tokens gets both full blocks; one sharing 6 gets one.
        kv.open(2);
        assert_eq!(kv.attach_prefix(2, &a[..9]), 8);
        let mut c = a[..6].to_vec();
        c.extend(toks(3, 5));
        kv.open(3);
        assert_eq!(kv.attach_prefix(3, &c), 4);
        assert_eq!(kv.tables(3)[0], &kv.tables(2)[0][..1]);
        // Writing past the shared blocks appends fresh ones without copying.
        assert!(kv.reserve(3, 11).unwrap().is_empty());
        assert_ne!(kv.tables(3)[0][1], kv.tables(2)[0][1]);
    }

    #[test]
    fn forks_copy_on_write_in_every_group() {
        let mut kv = KvCache::new(layout(16, Some((16, 8))));
        let p = toks(1, 6);
        kv.open(1);
        run(&mut kv, 1, &p, 6);
        kv.fork(1, 2);
        assert_eq!(kv.tables(1), kv.tables(2));
        // The child writes position 6 in the shared partial block: a copy in both groups.
        let copies = kv.reserve(2, 7).unwrap();
        assert_eq!(copies.len(), 2);
        assert_eq!(copies.iter().map(|c| c.group).collect::<Vec<_>>(), vec![0, 1]);
        assert!(copies.iter().all(|c| c.src == kv.tables(1)[c.group][1] && c.dst == kv.tables(2)[c.group][1]));
        // The parent is now the only holder and writes in place.
        assert!(kv.reserve(1, 7).unwrap().is_empty());
    }

    #[test]
    fn windowed_groups_free_old_blocks_and_prefixes_need_the_last_window() {
        // Window 8 + slack 4: a sequence keeps the positions from len + 1 − 12 on. The windowed
        // pool (8 blocks) is too small to index all ten full blocks, the global one is not.
        let mut kv = KvCache::new(layout(32, Some((8, 8))));
        let a = toks(1, 40);
        kv.open(1);
        for end in (4..=40).step_by(4) {
            run(&mut kv, 1, &a, end);
        }
        let t = kv.tables(1);
        assert_eq!(t[0].len(), 10);
        // First kept position 29: blocks 0..7 are gone, 7..10 held.
        assert!(t[1][..7].iter().all(|&b| b == NO_BLOCK));
        assert!(t[1][7..].iter().all(|&b| b != NO_BLOCK));
        // Freed blocks stay indexed until evicted: the two oldest were, to make room.
        assert_eq!(kv.stats()[1], GroupStats { n_blocks: 8, free: 0, indexed: 8 });
        assert_eq!(kv.stats()[0].indexed, 10);
        // A rollback within the slack works; one past it is refused and changes nothing.
        assert_eq!(kv.truncate(1, 36), Ok(()));
        assert_eq!(kv.truncate(1, 32), Err(KvError::RollbackTooFar { len: 32 }));
        assert_eq!(kv.len(1), 36);
        kv.release(1);
        // A 36-token prefix: its last window (positions 29..36, blocks 7 and 8) is indexed.
        kv.open(2);
        assert_eq!(kv.attach_prefix(2, &a[..37]), 36);
        let t = kv.tables(2);
        assert_eq!((t[0].len(), t[1].iter().filter(|&&b| b != NO_BLOCK).count()), (9, 2));
        // An 8-token prefix needs windowed blocks 0 and 1, which were evicted: nothing is
        // reused, though the global group still holds it.
        kv.open(3);
        assert_eq!(kv.attach_prefix(3, &a[..9]), 0);
    }

    #[test]
    fn a_short_pool_evicts_unheld_prefixes_and_refuses_the_rest() {
        let mut kv = KvCache::new(layout(4, None));
        kv.open(1);
        run(&mut kv, 1, &toks(1, 8), 8);
        kv.release(1);
        assert_eq!(kv.stats()[0], GroupStats { n_blocks: 4, free: 2, indexed: 2 });
        kv.open(2);
        assert!(kv.fits(2, 16, 0));
        assert!(!kv.fits(2, 16, 1));
        let _ = kv.reserve(2, 16).unwrap();
        assert_eq!(kv.stats()[0].indexed, 0, "both indexed blocks were evicted");
        kv.open(3);
        assert_eq!(kv.reserve(3, 1), Err(KvError::OutOfBlocks { needed: 1, free: 0 }));
        assert_eq!(kv.len(3), 0);
    }
}

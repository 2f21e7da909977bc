//! A prefix index over full KV blocks, so any request whose prompt starts with blocks an
//! earlier request computed reuses them instead of prefilling them again.
//!
//! A block's key chains its parent's key with its own token ids, so equal keys mean equal
//! prefixes (entries keep their tokens and parent, so a hash collision is a miss, never a wrong
//! hit). The index holds one reference on each block it lists, which makes the block manager's
//! copy-on-write rule protect indexed blocks from being written. Eviction drops the least
//! recently used entries that no sequence holds: for full-attention layers only leaves (blocks
//! no indexed block continues), so every listed prefix stays reachable from its first block;
//! for sliding-window layers any entry, since only a prefix's last window is ever needed.

use std::collections::hash_map::DefaultHasher;
use std::collections::{BTreeSet, HashMap};
use std::hash::{Hash, Hasher};

use super::{BlockManager, SeqKv};

/// The parent key of a sequence's first block.
pub const ROOT: u64 = 0;

/// Which entries eviction may take.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Eviction {
    /// Only entries without indexed children (full-attention groups: prefixes stay walkable).
    Leaves,
    /// Any entry no sequence holds (sliding-window groups).
    Any,
}

struct Entry {
    parent: u64,
    tokens: Box<[u32]>,
    block: u32,
    /// Indexed blocks whose parent this is; with [`Eviction::Leaves`] only a block without
    /// children may be evicted.
    children: u32,
    last_used: u64,
}

/// Full blocks of earlier sequences, keyed by the token prefix they hold.
pub struct PrefixIndex {
    block_size: usize,
    eviction: Eviction,
    entries: HashMap<u64, Entry>,
    /// (last use, key), least recently used first.
    lru: BTreeSet<(u64, u64)>,
    clock: u64,
}

/// The key of the block holding `tokens` right after the block keyed `parent`.
pub fn block_key(parent: u64, tokens: &[u32]) -> u64 {
    let mut h = DefaultHasher::new();
    parent.hash(&mut h);
    tokens.hash(&mut h);
    // ROOT is reserved for "no parent".
    h.finish().max(1)
}

impl PrefixIndex {
    pub fn new(block_size: u32, eviction: Eviction) -> Self {
        PrefixIndex { block_size: block_size.max(1) as usize, eviction, entries: HashMap::new(), lru: BTreeSet::new(), clock: 0 }
    }

    /// Blocks the index holds.
    pub fn len(&self) -> usize {
        self.entries.len()
    }
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The key of the block holding `tokens` after the block keyed `parent`, if indexed.
    fn find(&self, parent: u64, tokens: &[u32]) -> Option<u64> {
        let key = block_key(parent, tokens);
        let e = self.entries.get(&key)?;
        (e.parent == parent && *e.tokens == *tokens).then_some(key)
    }

    fn touch(&mut self, key: u64) {
        self.clock += 1;
        if let Some(e) = self.entries.get_mut(&key) {
            self.lru.remove(&(e.last_used, key));
            e.last_used = self.clock;
            self.lru.insert((e.last_used, key));
        }
    }

    /// The blocks holding the longest indexed prefix of `tokens` (whole blocks only), in
    /// position order; they become the most recently used.
    pub fn lookup(&mut self, tokens: &[u32]) -> Vec<u32> {
        let mut parent = ROOT;
        let mut keys = Vec::new();
        for chunk in tokens.chunks_exact(self.block_size) {
            let Some(key) = self.find(parent, chunk) else { break };
            keys.push(key);
            parent = key;
        }
        keys.iter()
            .map(|&k| {
                self.touch(k);
                self.entries[&k].block
            })
            .collect()
    }

    /// Whether the block holding `tokens` after the block keyed `parent` is indexed.
    pub fn contains(&self, parent: u64, tokens: &[u32]) -> bool {
        self.find(parent, tokens).is_some()
    }

    /// The block holding `tokens` after the block keyed `parent`, if indexed (it becomes the
    /// most recently used).
    pub fn get(&mut self, parent: u64, tokens: &[u32]) -> Option<u32> {
        let key = self.find(parent, tokens)?;
        self.touch(key);
        Some(self.entries[&key].block)
    }

    /// Indexes `block`, which holds `tokens` after the block keyed `parent`, and returns its
    /// key. An entry already indexed for the same prefix is kept (and marked as used); a hash
    /// collision with another prefix leaves the block unindexed.
    pub fn insert_block(&mut self, blocks: &mut BlockManager, parent: u64, tokens: &[u32], block: u32) -> u64 {
        let key = block_key(parent, tokens);
        match self.entries.get(&key) {
            Some(e) if e.parent == parent && *e.tokens == *tokens => self.touch(key),
            Some(_) => {}
            None => {
                blocks.add_ref(block);
                if let Some(p) = self.entries.get_mut(&parent) {
                    p.children += 1;
                }
                self.entries.insert(key, Entry { parent, tokens: tokens.into(), block, children: 0, last_used: 0 });
                self.touch(key);
            }
        }
        key
    }

    /// Indexes the full blocks of `seq`, whose positions hold `tokens` (the caller's record of
    /// what it ran). Blocks already indexed for the same prefix are only marked as used.
    pub fn insert(&mut self, blocks: &mut BlockManager, seq: &SeqKv, tokens: &[u32]) {
        let n_full = seq.len().min(tokens.len()) / self.block_size;
        let mut parent = ROOT;
        for (i, chunk) in tokens.chunks_exact(self.block_size).take(n_full).enumerate() {
            parent = self.insert_block(blocks, parent, chunk, seq.table()[i]);
        }
    }

    /// Entries no sequence holds: what eviction could free.
    pub fn evictable(&self, blocks: &BlockManager) -> u32 {
        self.entries.values().filter(|e| blocks.refcount(e.block) == 1).count() as u32
    }

    fn may_evict(&self, e: &Entry, blocks: &BlockManager) -> bool {
        blocks.refcount(e.block) == 1 && (self.eviction == Eviction::Any || e.children == 0)
    }

    /// Drops least recently used entries until `blocks` has `needed` free blocks or nothing
    /// more may go (see [`Eviction`]; a block a sequence holds always stays). Returns how many
    /// entries were dropped.
    pub fn evict(&mut self, blocks: &mut BlockManager, needed: u32) -> usize {
        let mut dropped = 0;
        while blocks.n_free() < needed {
            let victim = self.lru.iter().map(|&(_, key)| key).find(|k| self.may_evict(&self.entries[k], blocks));
            let Some(key) = victim else { break };
            self.remove(blocks, key);
            dropped += 1;
        }
        dropped
    }

    fn remove(&mut self, blocks: &mut BlockManager, key: u64) {
        if let Some(e) = self.entries.remove(&key) {
            self.lru.remove(&(e.last_used, key));
            blocks.unref(e.block);
            if let Some(p) = self.entries.get_mut(&e.parent) {
                p.children = p.children.saturating_sub(1);
            }
        }
    }

    /// Drops every entry no sequence holds, returning its block (`resetChat`, `/clear`);
    /// blocks of running sequences stay indexed.
    pub fn clear_unheld(&mut self, blocks: &mut BlockManager) {
        let unheld: Vec<u64> = self.entries.iter().filter(|(_, e)| blocks.refcount(e.block) == 1).map(|(&k, _)| k).collect();
        for key in unheld {
            self.remove(blocks, key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kv::{KvError, Reservation};

    const BS: u32 = 4;

    /// The sequence starts from the longest indexed prefix of `tokens`.
    fn restore(m: &mut BlockManager, ix: &mut PrefixIndex, seq: &mut SeqKv, tokens: &[u32]) -> usize {
        m.release(seq);
        let found = ix.lookup(tokens);
        for &b in &found {
            m.add_ref(b);
        }
        *seq = SeqKv::from_blocks(found.clone(), found.len() * BS as usize);
        seq.len()
    }

    /// Grows the sequence, evicting least recently used entries when the pool is short.
    fn reserve(m: &mut BlockManager, ix: &mut PrefixIndex, seq: &mut SeqKv, len: usize) -> Result<Reservation, KvError> {
        match m.reserve(seq, len) {
            Err(KvError::OutOfBlocks { needed, .. }) => {
                ix.evict(m, needed);
                m.reserve(seq, len)
            }
            r => r,
        }
    }

    /// Runs a "request": the sequence takes `tokens` (restoring what the index has), then its
    /// full blocks are indexed. Returns how many positions were restored.
    fn request(m: &mut BlockManager, ix: &mut PrefixIndex, seq: &mut SeqKv, tokens: &[u32]) -> usize {
        let restored = restore(m, ix, seq, &tokens[..tokens.len() - 1]);
        let _ = reserve(m, ix, seq, tokens.len()).unwrap();
        ix.insert(m, seq, tokens);
        restored
    }

    fn toks(seed: u32, n: usize) -> Vec<u32> {
        (0..n as u32).map(|i| seed * 1000 + i).collect()
    }

    #[test]
    fn longest_prefix_matches_across_earlier_requests() {
        let mut m = BlockManager::new(32, BS);
        let mut ix = PrefixIndex::new(BS, Eviction::Leaves);
        let mut s = SeqKv::new();
        let a = toks(1, 10);
        let b = toks(2, 13);
        assert_eq!(request(&mut m, &mut ix, &mut s, &a), 0);
        let a_blocks = s.table()[..2].to_vec();
        assert_eq!(request(&mut m, &mut ix, &mut s, &b), 0);
        assert_eq!(ix.len(), 2 + 3);
        // A prompt sharing a's first 6 tokens gets a's first full block, not b's, not the last request's.
        let mut c = a[..6].to_vec();
        c.extend(toks(3, 5));
        assert_eq!(request(&mut m, &mut ix, &mut s, &c), 4);
        assert_eq!(s.table()[0], a_blocks[0]);
        // All of a's full blocks, then b's three from their prefix.
        assert_eq!(ix.lookup(&a), a_blocks);
        assert_eq!(ix.lookup(&b[..12]).len(), 3);
        assert_eq!(ix.lookup(&b[..11]).len(), 2);
        // A different first block matches nothing, even if later blocks are equal.
        let mut d = b.clone();
        d[0] = 7;
        assert!(ix.lookup(&d).is_empty());
    }

    #[test]
    fn eviction_drops_least_recently_used_leaves_first() {
        // 6 blocks: a, b, c take one full block each (and a partial one while live).
        let mut m = BlockManager::new(6, BS);
        let mut ix = PrefixIndex::new(BS, Eviction::Leaves);
        let mut s = SeqKv::new();
        let (a, b, c) = (toks(1, 5), toks(2, 5), toks(3, 5));
        for t in [&a, &b, &c] {
            request(&mut m, &mut ix, &mut s, t);
        }
        assert_eq!(request(&mut m, &mut ix, &mut s, &a), 4); // a is now more recent than b
        m.release(&mut s);
        assert_eq!((ix.len(), m.n_free()), (3, 3));
        // Needing 4 free blocks evicts exactly the least recently used: b.
        assert_eq!(ix.evict(&mut m, 4), 1);
        assert_eq!(ix.lookup(&b).len(), 0);
        assert_eq!(ix.lookup(&c).len(), 1);
        assert_eq!(ix.lookup(&a).len(), 1); // a is the most recent again, c the oldest
        assert_eq!(ix.evict(&mut m, 5), 1);
        assert!(ix.lookup(&c).is_empty());
        assert_eq!(ix.lookup(&a).len(), 1);
    }

    #[test]
    fn only_leaves_are_evicted() {
        let mut m = BlockManager::new(8, BS);
        let mut ix = PrefixIndex::new(BS, Eviction::Leaves);
        let mut s = SeqKv::new();
        let a = toks(1, 12);
        request(&mut m, &mut ix, &mut s, &a);
        m.release(&mut s);
        // The first block is the most recently used, yet it goes last: its descendants first,
        // deepest first.
        ix.lookup(&a);
        ix.lookup(&a[..4]);
        assert_eq!(ix.evict(&mut m, 6), 1);
        assert_eq!(ix.lookup(&a).len(), 2);
        assert_eq!(ix.evict(&mut m, 8), 2);
        assert!(ix.is_empty());
    }

    #[test]
    fn eviction_never_frees_a_block_the_live_sequence_holds() {
        let mut m = BlockManager::new(4, BS);
        let mut ix = PrefixIndex::new(BS, Eviction::Leaves);
        let mut s = SeqKv::new();
        let a = toks(1, 9);
        request(&mut m, &mut ix, &mut s, &a); // 3 blocks live, 2 of them indexed
        assert_eq!(m.n_free(), 1);
        assert_eq!(ix.evict(&mut m, 4), 0);
        assert_eq!(ix.len(), 2);
        assert!(s.table().iter().all(|&b| m.refcount(b) >= 1));
        // Growing past the pool fails cleanly instead of stealing the live blocks.
        let _ = reserve(&mut m, &mut ix, &mut s, 16).unwrap();
        assert_eq!(reserve(&mut m, &mut ix, &mut s, 17), Err(KvError::OutOfBlocks { needed: 1, free: 0 }));
        assert_eq!(s.len(), 16);
        // A live sequence restored from the index shares its blocks; they survive eviction,
        // and a write into a shared block copies it instead of changing the indexed one.
        assert_eq!(restore(&mut m, &mut ix, &mut s, &a[..8]), 8);
        let shared = s.table().to_vec();
        assert_eq!(ix.evict(&mut m, 4), 0);
        m.truncate(&mut s, 6);
        let r = reserve(&mut m, &mut ix, &mut s, 7).unwrap();
        assert_eq!(r.copy.map(|c| c.src), Some(shared[1]));
        assert_ne!(s.table()[1], shared[1]);
        assert_eq!(ix.lookup(&a[..8]), shared);
    }

    #[test]
    fn capacity_is_respected_over_many_requests() {
        let mut m = BlockManager::new(10, BS);
        let mut ix = PrefixIndex::new(BS, Eviction::Leaves);
        let mut s = SeqKv::new();
        for seed in 0..50 {
            let t = toks(seed, 3 + (seed as usize * 7) % 30);
            request(&mut m, &mut ix, &mut s, &t);
            let mut listed: Vec<u32> = ix.entries.values().map(|e| e.block).collect();
            listed.sort_unstable();
            listed.dedup();
            assert_eq!(listed.len(), ix.len(), "two entries share a block");
            let held = (0..10).filter(|&b| m.refcount(b) > 0).count();
            assert_eq!(held + m.n_free() as usize, 10);
            // Every listed block is held, by the index at least.
            assert!(ix.entries.values().all(|e| m.refcount(e.block) >= 1));
        }
        // The latest request's full blocks are indexed.
        assert!(!ix.is_empty());
        m.release(&mut s);
        ix.clear_unheld(&mut m);
        assert_eq!(m.n_free(), 10);
    }

    #[test]
    fn a_hash_collision_is_a_miss() {
        let mut m = BlockManager::new(4, BS);
        let mut ix = PrefixIndex::new(BS, Eviction::Leaves);
        let mut s = SeqKv::new();
        let a = toks(1, 8);
        request(&mut m, &mut ix, &mut s, &a);
        // Forge an entry under b's key that holds other tokens.
        let b = toks(2, 4);
        let key = block_key(ROOT, &b);
        let block = s.table()[0];
        m.add_ref(block);
        ix.entries.insert(key, Entry { parent: ROOT, tokens: a[..4].into(), block, children: 0, last_used: 0 });
        assert!(ix.lookup(&b).is_empty());
    }
}

//! A paged KV-cache block manager with no GPU types: fixed-size blocks of positions, a free
//! list, per-sequence block tables and reference counts so sequences can share prefix blocks.
//!
//! Sharing rule (copy-on-write): a block whose reference count is above one is never written
//! in place. When [`BlockManager::reserve`] grows a sequence whose next position falls inside
//! a shared, partly filled last block, it swaps in a fresh block and returns a [`BlockCopy`]
//! in the [`Reservation`]; the caller must copy that block's positions (every layer, K and V)
//! from `src` to `dst` before this step's KV writes. Blocks are otherwise only appended.
//!
//! [`PrefixIndex`] lists full blocks of earlier sequences by the tokens they hold, so a new
//! sequence can start from them; it holds a reference on each, so the same rule keeps them intact.
//! [`KvCache`] puts these together for many sequences and one block group per kind of layer
//! (full attention, sliding window), as vLLM's `KVCacheManager`; [`KvLayout`] sizes the groups.

pub mod cache;
pub mod layout;
pub mod prefix;
pub mod types;

use thiserror::Error;

pub use cache::{KvCache, SeqId};
pub use layout::{KvGroupSpec, KvLayout, PoolRequest, KV_BLOCK_SIZE, WINDOW_SLACK};
pub use prefix::PrefixIndex;
pub use types::KvType;

/// A table entry for a block a sliding-window sequence no longer holds (it fell out of the
/// window); kernels never read it.
pub const NO_BLOCK: u32 = u32::MAX;

#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum KvError {
    #[error("KV cache out of blocks: {needed} needed, {free} free")]
    OutOfBlocks { needed: u32, free: u32 },
    #[error("KV budget of {budget_bytes} bytes holds no block of {block_size} positions at {bytes_per_position} bytes each (one buffer may hold {max_buffer_bytes} bytes)")]
    BudgetTooSmall { budget_bytes: u64, bytes_per_position: u64, block_size: u32, max_buffer_bytes: u64 },
    #[error("invalid KV configuration: {0}")]
    Invalid(&'static str),
    #[error("the KV budget of {budget_bytes} bytes cannot hold one context of {n_ctx} tokens: {needed_bytes} bytes are needed (raise the budget or lower the context size)")]
    ContextTooLarge { budget_bytes: u64, needed_bytes: u64, n_ctx: usize },
    #[error("{0}")]
    Type(String),
    #[error("cannot roll back to {len} positions: a sliding-window group no longer holds them")]
    RollbackTooFar { len: usize },
}

/// The cache geometry chosen from a memory budget: `n_blocks` blocks of `block_size` positions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KvConfig {
    pub n_blocks: u32,
    pub block_size: u32,
}

impl KvConfig {
    /// The most blocks that fit both `budget_bytes` for the whole cache (`bytes_per_position`
    /// counts every layer, K and V) and `max_buffer_bytes` for the largest single buffer, one
    /// layer's K or V cache, whose rows are `buffer_bytes_per_position` bytes.
    pub fn from_budget(
        budget_bytes: u64,
        bytes_per_position: u64,
        block_size: u32,
        max_buffer_bytes: u64,
        buffer_bytes_per_position: u64,
    ) -> Result<KvConfig, KvError> {
        if block_size == 0 {
            return Err(KvError::Invalid("block_size is 0"));
        }
        if bytes_per_position == 0 || buffer_bytes_per_position == 0 {
            return Err(KvError::Invalid("bytes per position is 0"));
        }
        if buffer_bytes_per_position > bytes_per_position {
            return Err(KvError::Invalid("one buffer's row is larger than all layers' rows together"));
        }
        let bs = block_size as u64;
        let by_budget = budget_bytes / bytes_per_position.saturating_mul(bs);
        let by_buffer = max_buffer_bytes / buffer_bytes_per_position.saturating_mul(bs);
        // Slot indices (block * block_size + offset) are u32 on the GPU.
        let by_index = u32::MAX as u64 / bs;
        let n = by_budget.min(by_buffer).min(by_index);
        if n == 0 {
            return Err(KvError::BudgetTooSmall { budget_bytes, bytes_per_position, block_size, max_buffer_bytes });
        }
        Ok(KvConfig { n_blocks: n as u32, block_size })
    }

    /// No more blocks than `max_positions` needs (rounded up to whole blocks, at least one).
    pub fn capped(self, max_positions: u64) -> KvConfig {
        let need = max_positions.div_ceil(self.block_size as u64).max(1);
        KvConfig { n_blocks: (self.n_blocks as u64).min(need) as u32, ..self }
    }

    /// Positions the cache holds: `n_blocks * block_size`.
    pub fn n_positions(&self) -> u64 {
        self.n_blocks as u64 * self.block_size as u64
    }

    /// Bytes of one buffer whose rows are `row_bytes` (e.g. one layer's K cache).
    pub fn buffer_bytes(&self, row_bytes: u64) -> u64 {
        self.n_positions() * row_bytes
    }
}

/// One sequence's view of the cache: its block table and how many positions it holds.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SeqKv {
    blocks: Vec<u32>,
    len: usize,
}

impl SeqKv {
    pub fn new() -> Self {
        Self::default()
    }
    /// A sequence of `len` positions held in `blocks` (references already taken).
    pub(crate) fn from_blocks(blocks: Vec<u32>, len: usize) -> Self {
        SeqKv { blocks, len }
    }
    /// Block ids in position order: position p lives in block `table()[p / block_size]`.
    pub fn table(&self) -> &[u32] {
        &self.blocks
    }
    pub fn len(&self) -> usize {
        self.len
    }
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// A block the caller must copy (all layers, K and V) before writing into `dst`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockCopy {
    pub src: u32,
    pub dst: u32,
}

/// A block copy in one block group: every layer of that group, K and V.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GroupCopy {
    pub group: usize,
    pub src: u32,
    pub dst: u32,
}

/// What [`BlockManager::reserve`] did; `copy`, when set, must be performed before the writes.
#[must_use = "a copy-on-write block must be copied before this step writes the cache"]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Reservation {
    pub copy: Option<BlockCopy>,
}

#[derive(Clone, Debug)]
pub struct BlockManager {
    block_size: u32,
    /// Free block ids; popped from the back, so allocation starts at block 0.
    free: Vec<u32>,
    refs: Vec<u32>,
}

impl BlockManager {
    pub fn new(n_blocks: u32, block_size: u32) -> Self {
        assert!(block_size > 0, "block_size must be positive");
        BlockManager { block_size, free: (0..n_blocks).rev().collect(), refs: vec![0; n_blocks as usize] }
    }

    pub fn from_config(c: &KvConfig) -> Self {
        Self::new(c.n_blocks, c.block_size)
    }

    pub fn block_size(&self) -> u32 {
        self.block_size
    }
    pub fn n_blocks(&self) -> u32 {
        self.refs.len() as u32
    }
    pub fn n_free(&self) -> u32 {
        self.free.len() as u32
    }
    /// How many sequences hold `block` (0 when it is free).
    pub fn refcount(&self, block: u32) -> u32 {
        self.refs.get(block as usize).copied().unwrap_or(0)
    }

    /// Blocks needed to hold `len` positions.
    pub fn blocks_for(&self, len: usize) -> usize {
        len.div_ceil(self.block_size as usize)
    }

    /// The cache slot (`block * block_size + offset`) of position `pos` of `seq`.
    pub fn slot(&self, seq: &SeqKv, pos: usize) -> Option<u32> {
        let bs = self.block_size as usize;
        seq.blocks.get(pos / bs).map(|&b| b * self.block_size + (pos % bs) as u32)
    }

    /// Grows `seq` to `new_len` positions (the positions this step will write), allocating
    /// blocks and, under the copy-on-write rule, replacing a shared partly filled last block.
    /// On error nothing changes. A `new_len` at or below the current length does nothing.
    pub fn reserve(&mut self, seq: &mut SeqKv, new_len: usize) -> Result<Reservation, KvError> {
        if new_len <= seq.len {
            return Ok(Reservation::default());
        }
        let bs = self.block_size as usize;
        let have = seq.blocks.len();
        let want = self.blocks_for(new_len);
        // The first written position lands in an existing block when len is not block-aligned.
        let offset = seq.len % bs;
        let partial = (offset > 0).then(|| seq.len / bs).filter(|&i| i < have);
        let cow = partial.filter(|&i| self.refs[seq.blocks[i] as usize] > 1);
        let needed = want.saturating_sub(have) + cow.is_some() as usize;
        if needed > self.free.len() {
            return Err(KvError::OutOfBlocks { needed: needed as u32, free: self.free.len() as u32 });
        }
        let mut res = Reservation::default();
        if let Some(i) = cow {
            let src = seq.blocks[i];
            let dst = self.alloc();
            self.refs[src as usize] -= 1;
            seq.blocks[i] = dst;
            res.copy = Some(BlockCopy { src, dst });
        }
        while seq.blocks.len() < want {
            let b = self.alloc();
            seq.blocks.push(b);
        }
        seq.len = new_len;
        Ok(res)
    }

    /// Shrinks `seq` to `len` positions, returning blocks no longer needed (shared blocks
    /// only lose a reference). A `len` at or above the current length does nothing.
    pub fn truncate(&mut self, seq: &mut SeqKv, len: usize) {
        if len >= seq.len {
            return;
        }
        let keep = self.blocks_for(len);
        for b in seq.blocks.drain(keep..) {
            self.unref(b);
        }
        seq.len = len;
    }

    /// Gives back the blocks of `seq` that lie wholly before position `first` (a sliding
    /// window's past); their table entries become [`NO_BLOCK`]. Returns how many were freed.
    pub fn free_before(&mut self, seq: &mut SeqKv, first: usize) -> usize {
        let n = (first / self.block_size as usize).min(seq.blocks.len());
        let mut freed = 0;
        for i in 0..n {
            let b = std::mem::replace(&mut seq.blocks[i], NO_BLOCK);
            if b != NO_BLOCK {
                self.unref(b);
                freed += 1;
            }
        }
        freed
    }

    /// The first position `seq` still holds (0 unless [`BlockManager::free_before`] dropped some).
    pub fn first_held(&self, seq: &SeqKv) -> usize {
        seq.blocks.iter().take_while(|&&b| b == NO_BLOCK).count() * self.block_size as usize
    }

    /// Returns all of `seq`'s blocks; `seq` is left empty and may be reused.
    pub fn release(&mut self, seq: &mut SeqKv) {
        self.truncate(seq, 0);
        for b in seq.blocks.drain(..) {
            self.unref(b);
        }
    }

    /// A new sequence sharing every block of `seq` (a common prefix); each block gains a
    /// reference, and the first write into a shared block copies it (see the module docs).
    pub fn fork(&mut self, seq: &SeqKv) -> SeqKv {
        for &b in seq.blocks.iter().filter(|&&b| b != NO_BLOCK) {
            self.refs[b as usize] += 1;
        }
        seq.clone()
    }

    /// One more holder of `block` (an index entry, a restored prefix).
    pub(crate) fn add_ref(&mut self, block: u32) {
        self.refs[block as usize] += 1;
    }

    fn alloc(&mut self) -> u32 {
        let b = self.free.pop().expect("caller checked the free count");
        debug_assert_eq!(self.refs[b as usize], 0);
        self.refs[b as usize] = 1;
        b
    }

    pub(crate) fn unref(&mut self, b: u32) {
        if b == NO_BLOCK {
            return;
        }
        let r = &mut self.refs[b as usize];
        debug_assert!(*r > 0, "block {b} released more often than held");
        *r = r.saturating_sub(1);
        if *r == 0 {
            self.free.push(b);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn budget_respects_total_and_buffer_limits() {
        // 24 layers, kv_dim 128 f32, K+V: 24 * 2 * 512 B per position; one buffer row 512 B.
        let per_pos = 24 * 2 * 512;
        let c = KvConfig::from_budget(1 << 30, per_pos, 16, 128 << 20, 512).unwrap();
        assert_eq!(c.n_blocks, (1u64 << 30) as u32 / (per_pos as u32 * 16));
        assert!(c.n_positions() * per_pos <= 1 << 30);
        // The per-buffer limit binds: a huge budget, 1 MiB buffers.
        let c = KvConfig::from_budget(1 << 40, per_pos, 16, 1 << 20, 512).unwrap();
        assert_eq!(c.n_blocks, 128);
        assert!(c.buffer_bytes(512) <= 1 << 20);
        assert_eq!(c.capped(100).n_blocks, 7);
        assert!(matches!(KvConfig::from_budget(1000, per_pos, 16, 1 << 20, 512), Err(KvError::BudgetTooSmall { .. })));
        assert!(KvConfig::from_budget(1 << 30, per_pos, 0, 1 << 20, 512).is_err());
        assert!(KvConfig::from_budget(1 << 30, 0, 16, 1 << 20, 0).is_err());
    }

    #[test]
    fn reserve_grows_by_blocks_and_sets_len() {
        let mut m = BlockManager::new(8, 4);
        let mut s = SeqKv::new();
        assert_eq!(m.reserve(&mut s, 5).unwrap(), Reservation::default());
        assert_eq!((s.len(), s.table()), (5, &[0, 1][..]));
        let _ = m.reserve(&mut s, 8).unwrap();
        assert_eq!(s.table().len(), 2);
        let _ = m.reserve(&mut s, 9).unwrap();
        assert_eq!(s.table(), &[0, 1, 2]);
        assert_eq!(m.n_free(), 5);
        assert_eq!(m.slot(&s, 6), Some(4 + 2));
        assert_eq!(m.slot(&s, 12), None);
        // Shrinking through reserve is a no-op.
        let _ = m.reserve(&mut s, 3).unwrap();
        assert_eq!(s.len(), 9);
    }

    #[test]
    fn exhaustion_is_an_error_and_changes_nothing() {
        let mut m = BlockManager::new(3, 4);
        let mut a = SeqKv::new();
        let _ = m.reserve(&mut a, 8).unwrap();
        let before = a.clone();
        let err = m.reserve(&mut a, 17).unwrap_err();
        assert_eq!(err, KvError::OutOfBlocks { needed: 3, free: 1 });
        assert_eq!(a, before);
        assert_eq!(m.n_free(), 1);
        let _ = m.reserve(&mut a, 12).unwrap();
        assert_eq!(m.n_free(), 0);
        let mut b = SeqKv::new();
        assert!(matches!(m.reserve(&mut b, 1), Err(KvError::OutOfBlocks { needed: 1, free: 0 })));
        assert!(b.is_empty() && b.table().is_empty());
    }

    #[test]
    fn truncate_and_release_return_blocks() {
        let mut m = BlockManager::new(6, 4);
        let mut s = SeqKv::new();
        let _ = m.reserve(&mut s, 20).unwrap();
        assert_eq!(m.n_free(), 1);
        m.truncate(&mut s, 9);
        assert_eq!((s.len(), s.table().len(), m.n_free()), (9, 3, 3));
        m.truncate(&mut s, 8);
        assert_eq!((s.table().len(), m.n_free()), (2, 4));
        m.truncate(&mut s, 100);
        assert_eq!(s.len(), 8);
        m.release(&mut s);
        assert_eq!((s.len(), s.table().len(), m.n_free()), (0, 0, 6));
        m.release(&mut s);
        assert_eq!(m.n_free(), 6);
        // Freed blocks are reused.
        let _ = m.reserve(&mut s, 24).unwrap();
        assert_eq!(m.n_free(), 0);
    }

    #[test]
    fn fork_shares_blocks_and_copies_on_write() {
        let mut m = BlockManager::new(8, 4);
        let mut a = SeqKv::new();
        let _ = m.reserve(&mut a, 6).unwrap(); // blocks 0, 1; block 1 half full
        let mut b = m.fork(&a);
        assert_eq!(b.table(), a.table());
        assert_eq!((m.refcount(0), m.refcount(1), m.n_free()), (2, 2, 6));
        // b writes position 6, inside shared block 1: it gets a private copy.
        let r = m.reserve(&mut b, 7).unwrap();
        assert_eq!(r.copy, Some(BlockCopy { src: 1, dst: 2 }));
        assert_eq!(b.table(), &[0, 2]);
        assert_eq!((m.refcount(1), m.refcount(2)), (1, 1));
        // a is now the only holder of block 1 and writes in place.
        assert_eq!(m.reserve(&mut a, 8).unwrap().copy, None);
        assert_eq!(a.table(), &[0, 1]);
        // A block-aligned fork appends fresh blocks without copying.
        let mut c = m.fork(&a);
        assert_eq!(m.reserve(&mut c, 9).unwrap().copy, None);
        assert_eq!(c.table(), &[0, 1, 3]);
        assert_eq!(m.refcount(0), 3);
        // Releasing drops references; shared blocks stay until the last holder goes.
        m.release(&mut a);
        assert_eq!((m.refcount(0), m.refcount(1)), (2, 1));
        m.release(&mut b);
        m.release(&mut c);
        assert_eq!(m.n_free(), 8);
        assert!((0..8).all(|i| m.refcount(i) == 0));
    }

    #[test]
    fn copy_on_write_counts_against_free_blocks() {
        let mut m = BlockManager::new(2, 4);
        let mut a = SeqKv::new();
        let _ = m.reserve(&mut a, 6).unwrap();
        let mut b = m.fork(&a);
        assert_eq!(m.n_free(), 0);
        assert_eq!(m.reserve(&mut b, 7).unwrap_err(), KvError::OutOfBlocks { needed: 1, free: 0 });
        assert_eq!(b.table(), a.table());
        // Truncating a fork back into a shared block then growing also copies.
        let mut m = BlockManager::new(3, 4);
        let mut b = SeqKv::new();
        let _ = m.reserve(&mut b, 6).unwrap();
        let mut c = m.fork(&b);
        m.truncate(&mut c, 2);
        assert_eq!((c.table(), m.refcount(1)), (&[0][..], 1));
        let r = m.reserve(&mut c, 3).unwrap();
        assert_eq!(r.copy, Some(BlockCopy { src: 0, dst: 2 }));
        assert_eq!(c.table(), &[2]);
        assert_eq!(m.refcount(0), 1);
    }
}

//! How many KV blocks each block group gets. Full-attention layers share one group, sized for
//! whole contexts; sliding-window layers (gemma3's local layers) get their own, sized for
//! their window (plus a slack for rollbacks and one step's tokens) per running sequence, as
//! vLLM's hybrid allocator does. Backends store what this plans; the scheduler hands out ids.

use crate::arch::ModelConfig;

use super::{KvError, KvType};

/// One block group: the layers that share its block ids and tables.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KvGroupSpec {
    pub n_blocks: u32,
    /// The group's sliding window in positions; None = full attention (every position kept).
    pub window: Option<u32>,
    /// The layers stored in this group, in order.
    pub layers: Vec<usize>,
}

/// The block groups of one model instance.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KvLayout {
    /// Positions per block.
    pub block_size: u32,
    /// Positions a sliding-window group keeps beyond its window, so rolling a sequence back
    /// by up to this many positions never needs a freed block.
    pub slack: u32,
    /// Blocks one sequence's table may list (its context, rounded up).
    pub max_blocks_per_seq: u32,
    pub groups: Vec<KvGroupSpec>,
    /// How K and V elements are stored.
    pub k_type: KvType,
    pub v_type: KvType,
}

/// What the pools must serve.
#[derive(Clone, Copy, Debug)]
pub struct PoolRequest {
    /// The most positions one sequence holds.
    pub n_ctx: usize,
    /// Sequences running at once.
    pub max_seqs: usize,
    /// Tokens one step may add to a sequence.
    pub max_batch_tokens: usize,
    /// Bytes for every group together; None = one context plus a quarter for prefix reuse.
    pub budget_bytes: Option<u64>,
    /// The largest single buffer (one layer's K or V cache) the backend can bind.
    pub max_buffer_bytes: u64,
    pub block_size: u32,
    pub slack: u32,
    /// How K and V elements are stored.
    pub k_type: KvType,
    pub v_type: KvType,
}

/// Positions per KV block.
pub const KV_BLOCK_SIZE: u32 = 16;
/// Positions a sliding-window group keeps beyond the window (rollbacks of up to this many).
pub const WINDOW_SLACK: u32 = 256;

/// Spare blocks for the prefix index, as a divisor of what sequences need (1/4).
const SPARE_DIVISOR: u64 = 4;

impl KvLayout {
    /// Plans the groups for `cfg`. A budget that cannot hold one whole context (and the one
    /// spare block a copy-on-write needs) is an error, never a silent clamp.
    pub fn plan(cfg: &ModelConfig, req: &PoolRequest) -> Result<KvLayout, KvError> {
        if req.block_size == 0 || req.max_seqs == 0 || req.n_ctx == 0 {
            return Err(KvError::Invalid("block size, sequences and context must be positive"));
        }
        let bs = req.block_size as u64;
        let ctx_blocks = (req.n_ctx as u64).div_ceil(bs);
        let window = cfg.layers.iter().filter_map(|l| l.sliding_window).max();
        // Blocks a windowed sequence holds at most: window, slack and one step, plus a partial one.
        let span = window.map(|w| ((w as u64 + req.slack as u64 + req.max_batch_tokens as u64).div_ceil(bs) + 1).min(ctx_blocks));
        let windowed = span.filter(|&s| s < ctx_blocks);
        let (global_layers, local_layers): (Vec<usize>, Vec<usize>) = match windowed {
            Some(_) => (0..cfg.n_layer).partition(|&i| cfg.layers[i].sliding_window.is_none()),
            None => ((0..cfg.n_layer).collect(), Vec::new()),
        };
        req.k_type.check_head_dim(cfg.head_dim).and_then(|_| req.v_type.check_head_dim(cfg.head_dim_v)).map_err(KvError::Type)?;
        let row = row_bytes(cfg, req.k_type, req.v_type);
        let buffer_row = req.k_type.row_bytes(cfg.kv_dim()).max(req.v_type.row_bytes(cfg.v_dim()));
        let g_bytes = global_layers.len() as u64 * row * bs;
        let w_bytes = local_layers.len() as u64 * row * bs;
        let by_buffer = req.max_buffer_bytes / (buffer_row * bs).max(1);
        let by_index = u32::MAX as u64 / bs - 1;
        let cap = by_buffer.min(by_index);
        let g_min = ctx_blocks + 1;
        let w_min = windowed.map_or(0, |s| s + 1);
        // Windowed blocks that let every running sequence hold its window, plus the spare share.
        let w_want = windowed.map_or(0, |s| {
            let all = s * req.max_seqs as u64;
            (all + all.div_ceil(SPARE_DIVISOR)).max(w_min)
        });
        let (n_g, n_w) = match req.budget_bytes {
            None => {
                let n_g = g_min + ctx_blocks.div_ceil(SPARE_DIVISOR);
                (n_g, w_want.min(n_g).max(w_min))
            }
            Some(budget) => {
                let needed = g_bytes * g_min + w_bytes * w_min;
                if budget < needed {
                    return Err(KvError::ContextTooLarge { budget_bytes: budget, needed_bytes: needed, n_ctx: req.n_ctx });
                }
                if w_bytes == 0 {
                    (budget / g_bytes.max(1), 0)
                } else {
                    // As many blocks in both groups as the budget holds, the windowed group
                    // capped at what the sequences can use; the rest to the global group.
                    let n_w = (budget / (g_bytes + w_bytes)).clamp(w_min, w_want.max(w_min));
                    let n_g = (budget - w_bytes * n_w) / g_bytes.max(1);
                    if n_g >= g_min || g_bytes == 0 {
                        (n_g, n_w)
                    } else {
                        (g_min, (budget - g_bytes * g_min) / w_bytes)
                    }
                }
            }
        };
        if g_min.max(w_min) > cap {
            let need = g_min.max(w_min) * bs * buffer_row;
            return Err(KvError::ContextTooLarge { budget_bytes: req.max_buffer_bytes, needed_bytes: need, n_ctx: req.n_ctx });
        }
        let mut groups = vec![KvGroupSpec { n_blocks: n_g.min(cap) as u32, window: None, layers: global_layers }];
        if !local_layers.is_empty() {
            groups.push(KvGroupSpec { n_blocks: n_w.min(cap) as u32, window, layers: local_layers });
        }
        groups.retain(|g| !g.layers.is_empty());
        Ok(KvLayout { block_size: req.block_size, slack: req.slack, max_blocks_per_seq: ctx_blocks as u32, groups, k_type: req.k_type, v_type: req.v_type })
    }

    /// The group that stores layer `layer`.
    pub fn group_of(&self, layer: usize) -> usize {
        self.groups.iter().position(|g| g.layers.contains(&layer)).unwrap_or(0)
    }

    /// Bytes the groups take for `cfg` (every layer's K and V).
    pub fn bytes(&self, cfg: &ModelConfig) -> u64 {
        let row = row_bytes(cfg, self.k_type, self.v_type);
        self.groups.iter().map(|g| g.n_blocks as u64 * self.block_size as u64 * row * g.layers.len() as u64).sum()
    }
}

/// Bytes one position of one layer takes, K and V.
pub fn row_bytes(cfg: &ModelConfig, k_type: KvType, v_type: KvType) -> u64 {
    k_type.row_bytes(cfg.kv_dim()) + v_type.row_bytes(cfg.v_dim())
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::arch::{Activation, LayerConfig, RopeStyle};

    pub(crate) fn cfg(windows: &[Option<u32>]) -> ModelConfig {
        ModelConfig {
            arch: "test".into(),
            n_vocab: 100,
            n_embd: 64,
            n_layer: windows.len(),
            n_head: 2,
            n_head_kv: 1,
            head_dim: 32,
            head_dim_v: 32,
            n_ff: 128,
            n_ctx_train: 1 << 20,
            rms_eps: 1e-6,
            rope_style: RopeStyle::Neox,
            rope_dim: 32,
            layers: windows.iter().map(|&w| LayerConfig { sliding_window: w, rope_base: 1e4, rope_freq_scale: 1.0 }).collect(),
            qkv_bias: false,
            qk_norm: false,
            post_norms: false,
            embed_scale: None,
            activation: Activation::Silu,
            attn_scale: 1.0,
            tied_output: true,
            rope_freqs: false,
            rope_scaling: Default::default(),
            fused_qkv: false,
            fused_gate_up: false,
            attn_softcap: None,
            final_softcap: None,
            moe: None,
        }
    }

    fn req(n_ctx: usize, budget: Option<u64>) -> PoolRequest {
        PoolRequest {
            n_ctx,
            max_seqs: 4,
            max_batch_tokens: 64,
            budget_bytes: budget,
            max_buffer_bytes: 1 << 30,
            block_size: 16,
            slack: 32,
            k_type: KvType::F32,
            v_type: KvType::F32,
        }
    }

    #[test]
    fn full_attention_pool_follows_the_budget() {
        let c = cfg(&[None, None]);
        // Per block: 2 layers × (32 + 32) floats × 4 B × 16 positions.
        let block = 2 * 64 * 4 * 16;
        let l = KvLayout::plan(&c, &req(160, None)).unwrap();
        assert_eq!(l.groups.len(), 1);
        assert_eq!(l.groups[0].n_blocks, 10 + 1 + 3, "the context, one spare, a quarter more");
        assert_eq!(l.max_blocks_per_seq, 10);
        let l = KvLayout::plan(&c, &req(160, Some(40 * block + 7))).unwrap();
        assert_eq!(l.groups[0].n_blocks, 40);
        assert_eq!(l.bytes(&c), 40 * block);
        // One block short of a context plus one: a typed error naming both sizes.
        let e = KvLayout::plan(&c, &req(160, Some(10 * block))).unwrap_err();
        assert_eq!(e, KvError::ContextTooLarge { budget_bytes: 10 * block, needed_bytes: 11 * block, n_ctx: 160 });
        // One buffer must hold a layer's whole K cache.
        let small = PoolRequest { max_buffer_bytes: 5 * 32 * 4 * 16, ..req(160, None) };
        assert!(matches!(KvLayout::plan(&c, &small), Err(KvError::ContextTooLarge { .. })));
    }

    #[test]
    fn windowed_layers_get_their_own_group_sized_per_sequence() {
        let c = cfg(&[Some(64), Some(64), None]);
        let l = KvLayout::plan(&c, &req(4096, None)).unwrap();
        assert_eq!(l.groups.len(), 2);
        assert_eq!((l.groups[0].window, &l.groups[0].layers[..]), (None, &[2][..]));
        assert_eq!((l.groups[1].window, &l.groups[1].layers[..]), (Some(64), &[0, 1][..]));
        assert_eq!(l.group_of(1), 1);
        // Span: (64 + 32 + 64) / 16 + 1 = 11 blocks per sequence, 4 sequences and a quarter.
        assert_eq!(l.groups[1].n_blocks, 55);
        assert_eq!(l.groups[0].n_blocks, 256 + 1 + 64);
        // A window as long as the context: one group, nothing to free.
        let l = KvLayout::plan(&c, &req(128, None)).unwrap();
        assert_eq!(l.groups.len(), 1);
        assert_eq!(l.groups[0].layers, vec![0, 1, 2]);
        // A budget: windowed capped at what sequences use, the rest to the global layers.
        let (g, w) = (64 * 4 * 16, 2 * 64 * 4 * 16);
        let l = KvLayout::plan(&c, &req(4096, Some(1000 * g + 55 * w))).unwrap();
        assert_eq!((l.groups[0].n_blocks, l.groups[1].n_blocks), (1000, 55));
        assert_eq!(l.bytes(&c), 1000 * g + 55 * w);
        // Just one context: 257 global and 12 windowed blocks.
        let l = KvLayout::plan(&c, &req(4096, Some(257 * g + 12 * w))).unwrap();
        assert_eq!((l.groups[0].n_blocks, l.groups[1].n_blocks), (257, 12));
        assert!(KvLayout::plan(&c, &req(4096, Some(257 * g + 11 * w))).is_err());
    }
}

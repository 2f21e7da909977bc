//! Where the KV blocks live on the device: per layer a K and a V buffer holding its group's
//! whole pool ([n_blocks · block_size] rows of kv_dim, stored as the layout's types), as the
//! [`KvLayout`] plans, and the
//! copy-on-write block copies a step performs before its KV writes.

use flint_core::arch::ModelConfig;
use flint_core::kv::{GroupCopy, KvLayout};

use crate::buffer::storage;
use crate::context::GpuContext;
use crate::error::Result;
use crate::ops::kv_write::encode_block_copy;

pub struct KvStore {
    /// Per layer of the range it holds: K and V caches.
    pub layers: Vec<(wgpu::Buffer, wgpu::Buffer)>,
    /// The block group of each of those layers.
    pub layer_group: Vec<usize>,
    /// One block of one layer's K or V: copies go through it (WebGPU copies no buffer onto itself).
    scratch: wgpu::Buffer,
    /// Bytes of one block of one layer's K and of its V.
    k_block: u64,
    v_block: u64,
}

impl KvStore {
    /// The KV of layers `range` (a model's part; every part stores its layers' share of every
    /// block, under the same block ids).
    pub fn new(ctx: &GpuContext, c: &ModelConfig, layout: &KvLayout, range: std::ops::Range<usize>) -> Result<KvStore> {
        let bs = layout.block_size as u64;
        let (k_row, v_row) = (layout.k_type.row_bytes(c.kv_dim()), layout.v_type.row_bytes(c.v_dim()));
        let mut layers = Vec::with_capacity(range.len());
        let mut layer_group = Vec::with_capacity(range.len());
        for il in range {
            let g = layout.group_of(il);
            let slots = layout.groups[g].n_blocks as u64 * bs;
            layers.push((storage(ctx, &format!("k_cache.{il}"), slots * k_row)?, storage(ctx, &format!("v_cache.{il}"), slots * v_row)?));
            layer_group.push(g);
        }
        let scratch = storage(ctx, "kv_scratch", bs * k_row.max(v_row))?;
        Ok(KvStore { layers, layer_group, scratch, k_block: bs * k_row, v_block: bs * v_row })
    }

    /// Records `copies` (every layer of each copy's group, K and V) into `enc`.
    pub fn encode_copies(&self, enc: &mut wgpu::CommandEncoder, copies: &[GroupCopy]) {
        for c in copies {
            for ((k, v), _) in self.layers.iter().zip(&self.layer_group).filter(|(_, &g)| g == c.group) {
                encode_block_copy(enc, k, &self.scratch, self.k_block, c.src, c.dst);
                encode_block_copy(enc, v, &self.scratch, self.v_block, c.src, c.dst);
            }
        }
    }

    /// Bytes of KV cache allocated (all layers, K and V).
    pub fn bytes(&self) -> u64 {
        self.layers.iter().map(|(k, v)| k.size() + v.size()).sum()
    }
}

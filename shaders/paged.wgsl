// The paged KV layout (common.wgsl's BatchInfo): the cache slot of position j of sequence seq.
// The including shader declares `info: BatchInfo` and `block_table: array<u32>`.
fn kv_slot(seq: u32, j: u32) -> u32 {
    return block_table[seq * info.max_blocks + j / info.block_size] * info.block_size + j % info.block_size;
}

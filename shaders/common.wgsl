// Shared declarations: the batch every kernel is shaped by.
//
// A batch is n_tok tokens drawn from n_seq sequences; token t belongs to sequence
// tok_seq[t] at position tok_pos[t]. Sequence s's KV positions live in the blocks
// block_table[s * max_blocks + i], block_size positions each (a paged layout).
struct BatchInfo {
    n_tok: u32,
    n_seq: u32,
    max_blocks: u32,
    block_size: u32,
}

// Grids larger than 65535 workgroups in x are folded into y; this recovers the linear id.
fn linear_group(wg: vec3<u32>, n_groups_x: u32) -> u32 {
    return wg.y * n_groups_x + wg.x;
}

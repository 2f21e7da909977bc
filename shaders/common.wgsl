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

// tanh(x) from one exp of a non-positive argument: no overflow, odd by construction (soft caps).
fn tanh_f32(x: f32) -> f32 {
    let e = exp(-2.0 * abs(x));
    return sign(x) * (1.0 - e) / (1.0 + e);
}

// Grids larger than 65535 workgroups in x are folded into y; this recovers the linear id.
fn linear_group(wg: vec3<u32>, n_groups_x: u32) -> u32 {
    return wg.y * n_groups_x + wg.x;
}

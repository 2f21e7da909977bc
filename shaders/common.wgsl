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

// The gated activations' act (glu.wgsl, and matmuls that end in the gate): SiLU,
// x / (1 + e^−x), or with GELU_TANH GELU's tanh approximation, written as
// x · sigmoid(2·√(2/π)·(x + 0.044715·x³)) so large |x| cannot produce inf/inf.
const SQRT_2_OVER_PI: f32 = 0.7978845608;
const GELU_COEF: f32 = 0.044715;

fn glu_act(x: f32) -> f32 {
#ifdef GELU_TANH
    let z = SQRT_2_OVER_PI * (x + GELU_COEF * x * x * x);
    return x / (1.0 + exp(-2.0 * z));
#else
    return x / (1.0 + exp(-x));
#endif
}

// RoPE's shared math: sin_cos, and with ROPE the rotation of one element for kernels that
// rotate while they copy (kv_write's K rows, attention's q). Those declare
//   var<uniform> rope: RopeParams;  var<storage, read> inv_freq: array<f32>;  (rope_dim / 2)
// and NEOX for half-split pairs, as rope.wgsl does.

// pi/2 split for Cody-Waite reduction: P1..P3 have at most 7 significant bits, so k·Pi is
// exact for |k| < 2^17 (|theta| < ~205000).
const PIO2_1: f32 = 1.5625;
const PIO2_2: f32 = 0.0081787109375;
const PIO2_3: f32 = 0.00011730194091796875;
const PIO2_4: f32 = 3.1391647326017846e-07;
const TWO_OVER_PI: f32 = 0.6366197723675814;

// (sin, cos) of theta; minimax polynomials on [-pi/4, pi/4] (Cephes sinf/cosf).
fn sin_cos(theta: f32) -> vec2<f32> {
    let k = floor(theta * TWO_OVER_PI + 0.5);
    let r = ((theta - k * PIO2_1) - k * PIO2_2) - k * PIO2_3 - k * PIO2_4;
    let z = r * r;
    let s = ((-1.9515295891e-4 * z + 8.3321608736e-3) * z - 1.6666654611e-1) * z * r + r;
    let c = ((2.443315711809948e-5 * z - 1.388731625493765e-3) * z + 4.166664568298827e-2) * z * z - 0.5 * z + 1.0;
    let q = u32(i32(k)) & 3u;
    switch q {
        case 0u: { return vec2<f32>(s, c); }
        case 1u: { return vec2<f32>(c, -s); }
        case 2u: { return vec2<f32>(-s, -c); }
        default: { return vec2<f32>(-c, s); }
    }
}

#ifdef ROPE
struct RopeParams {
    n_pairs: u32, // rope_dim / 2
    freq_scale: f32,
    mscale: f32, // multiplies cos and sin (YaRN, LongRoPE)
    _pad1: u32,
}

// Index within the head of element d's pair partner (d itself past the rotated dims).
fn rope_partner(d: u32) -> u32 {
    if (d >= 2u * rope.n_pairs) {
        return d;
    }
#ifdef NEOX
    return select(d - rope.n_pairs, d + rope.n_pairs, d < rope.n_pairs);
#else
    return d ^ 1u;
#endif
}

// Element d of a head at position pos after RoPE, from its value xd and its partner's xp:
// the same operations, in the same order, as rope.wgsl.
fn rope_rotate(d: u32, xd: f32, xp: f32, pos: u32) -> f32 {
    if (d >= 2u * rope.n_pairs) {
        return xd;
    }
#ifdef NEOX
    let first = d < rope.n_pairs;
    let i = select(d - rope.n_pairs, d, first);
#else
    let first = (d & 1u) == 0u;
    let i = d >> 1u;
#endif
    let sc = sin_cos(f32(pos) * rope.freq_scale * inv_freq[i]) * rope.mscale;
    if (first) {
        return xd * sc.y - xp * sc.x;
    }
    return xp * sc.x + xd * sc.y;
}
#endif

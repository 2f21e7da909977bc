// In-shader dequantization of raw GGUF blocks, bit-faithful to flint_core::quant::dequantize
// (same f32 operations in the same order; scales are f16).
//
// The including shader declares the weights and sets the format (ShaderDefs::quant):
//   var<storage, read> w: array<u32>;   // little-endian bytes of the weight rows
//   (array<vec4<u32>> where the format defines W_VEC4: every quantized format, Q4_K and Q5_K in
//   the file's layout, the others in their GPU layout)
//   Q_<NAME> (Q_F32, Q_Q4_K, ...), BLOCK_ELEMS, BLOCK_BYTES
//
// The unit is a 32-element chunk: dequant_chunk(row_base, c) returns elements 32c .. 32c + 32
// of the row starting at byte row_base, as 8 vec4 in element order. Rows hold whole blocks
// and a multiple of 32 elements, so a chunk never straddles two legacy blocks and a K-quant
// super-block is 8 chunks. The quantized formats' blocks are regrouped at upload so that every
// field is 16-aligned (weights::layout), except Q4_K's and Q5_K's (144 and 176 bytes), which
// already are: all are read as 16-byte vectors. The float formats are read as words.

const CHUNK: u32 = 32u;
// f32 exponent bias minus f16 exponent bias, and the smallest f16 subnormal (2^-24).
const F16_TO_F32_BIAS: u32 = 112u;
const F16_SUBNORMAL_UNIT: f32 = 5.9604644775390625e-8;
const BYTE_SHIFTS: vec4<u32> = vec4<u32>(0u, 8u, 16u, 24u);

// f16 bits (low 16 bits of h) to f32, exactly as flint_core::quant::f16_to_f32, subnormals
// included. In integer ops rather than unpack2x16float, which naga gates behind a capability
// (SHADER_FLOAT16_IN_FLOAT32) that not every validator grants.
fn f16_to_f32(h: vec4<u32>) -> vec4<f32> {
    let sign = (h & vec4<u32>(0x8000u)) << vec4<u32>(16u);
    let mag = h & vec4<u32>(0x7fffu);
    let normal = (mag << vec4<u32>(13u)) + vec4<u32>(F16_TO_F32_BIAS << 23u);
    let inf_nan = (mag << vec4<u32>(13u)) | vec4<u32>(0x7f800000u);
    let subnormal = bitcast<vec4<u32>>(vec4<f32>(mag) * F16_SUBNORMAL_UNIT);
    let bits = select(select(normal, subnormal, mag < vec4<u32>(0x400u)), inf_nan, mag >= vec4<u32>(0x7c00u));
    return bitcast<vec4<f32>>(sign | bits);
}

#ifdef W_VEC4
// 16-byte vector loads; b is 16-aligned (Q4_K's and Q5_K's fields are).
// The 4 words at byte offset b, one load.
fn load_4_words_at(b: u32) -> array<u32, 4> {
    let v = w[b >> 4u];
    return array<u32, 4>(v.x, v.y, v.z, v.w);
}

// The 8 words at byte offset b, two loads.
fn load_8_words_at(b: u32) -> array<u32, 8> {
    let v0 = w[b >> 4u];
    let v1 = w[(b >> 4u) + 1u];
    return array<u32, 8>(v0.x, v0.y, v0.z, v0.w, v1.x, v1.y, v1.z, v1.w);
}

// Block j's f16 scale (j < 8) from the 16 bytes at vector g that lead a group in the GPU layout
// (weights::layout).
fn group_scale(g: u32, j: u32) -> f32 {
    return f16_to_f32(vec4<u32>((w[g][j >> 1u] >> ((j & 1u) * 16u)) & 0xffffu)).x;
}

// Block j's two f16 (Q4_1's d and m, Q2_K's d and dmin) from the 32 bytes at vectors g, g + 1.
fn group_pair(g: u32, j: u32) -> vec2<f32> {
    let word = w[g + (j >> 2u)][j & 3u];
    return f16_to_f32(vec4<u32>(word, word >> 16u, 0u, 0u) & vec4<u32>(0xffffu)).xy;
}
#endif

#ifdef GROUP_VEC4S
// The first vector of the group that holds block `blk` of the row starting at byte row_base,
// in a regrouped format: every group but a row's last is full, GROUP_VEC4S vectors long
// (weights::layout::group_vectors).
fn group_start(row_base: u32, blk: u32) -> u32 {
    return (row_base >> 4u) + (blk >> 3u) * GROUP_VEC4S;
}
#endif

// Low and high nibbles of the 4 bytes of q, in byte order.
fn nibbles_lo(q: u32) -> vec4<u32> {
    return (vec4<u32>(q) >> BYTE_SHIFTS) & vec4<u32>(15u);
}

fn nibbles_hi(q: u32) -> vec4<u32> {
    return (vec4<u32>(q) >> (BYTE_SHIFTS + vec4<u32>(4u))) & vec4<u32>(15u);
}

// The 4 bytes of q sign-extended, in byte order.
fn bytes_i8(q: u32) -> vec4<i32> {
    return bitcast<vec4<i32>>(vec4<u32>(q) << vec4<u32>(24u, 16u, 8u, 0u)) >> vec4<u32>(24u);
}

#ifdef Q_F32
fn dequant_chunk(row_base: u32, c: u32) -> array<vec4<f32>, 8> {
    let i = (row_base >> 2u) + c * CHUNK;
    var out: array<vec4<f32>, 8>;
    for (var k = 0u; k < 8u; k++) {
        let j = i + 4u * k;
        out[k] = bitcast<vec4<f32>>(vec4<u32>(w[j], w[j + 1u], w[j + 2u], w[j + 3u]));
    }
    return out;
}
#endif

#ifdef Q_F16
fn dequant_chunk(row_base: u32, c: u32) -> array<vec4<f32>, 8> {
    let i = (row_base >> 2u) + c * (CHUNK / 2u);
    var out: array<vec4<f32>, 8>;
    for (var k = 0u; k < 8u; k++) {
        let a = w[i + 2u * k];
        let b = w[i + 2u * k + 1u];
        out[k] = f16_to_f32(vec4<u32>(a, a >> 16u, b, b >> 16u) & vec4<u32>(0xffffu));
    }
    return out;
}
#endif

#ifdef Q_BF16
fn dequant_chunk(row_base: u32, c: u32) -> array<vec4<f32>, 8> {
    let i = (row_base >> 2u) + c * (CHUNK / 2u);
    var out: array<vec4<f32>, 8>;
    for (var k = 0u; k < 8u; k++) {
        let a = w[i + 2u * k];
        let b = w[i + 2u * k + 1u];
        out[k] = bitcast<vec4<f32>>(vec4<u32>(a << 16u, a & 0xffff0000u, b << 16u, b & 0xffff0000u));
    }
    return out;
}
#endif

#ifdef Q_Q4_0
// Block (18 B): d f16, qs[16]; y = (q - 8) * d, low nibbles are elements 0..16.
// GPU layout (weights::layout): groups of 8 blocks, each 16 bytes of their d, then their qs;
// every group but a row's last is full, so chunk c's group starts (c / 8) · 9 vectors in.
fn dequant_chunk(row_base: u32, c: u32) -> array<vec4<f32>, 8> {
    let j = c & 7u;
    let g = group_start(row_base, c);
    let d = group_scale(g, j);
    let q = w[g + 1u + j];
    var out: array<vec4<f32>, 8>;
    for (var k = 0u; k < 4u; k++) {
        out[k] = vec4<f32>(vec4<i32>(nibbles_lo(q[k])) - vec4<i32>(8)) * d;
        out[k + 4u] = vec4<f32>(vec4<i32>(nibbles_hi(q[k])) - vec4<i32>(8)) * d;
    }
    return out;
}
#endif

#ifdef Q_Q4_1
// Block (20 B): d f16, m f16, qs[16]; y = q * d + m.
// GPU layout (weights::layout): groups of 8 blocks, each 32 bytes of their (d, m), then their
// qs; chunk c's group starts (c / 8) · 10 vectors in.
fn dequant_chunk(row_base: u32, c: u32) -> array<vec4<f32>, 8> {
    let j = c & 7u;
    let g = group_start(row_base, c);
    let dm = group_pair(g, j);
    let q = w[g + 2u + j];
    var out: array<vec4<f32>, 8>;
    for (var k = 0u; k < 4u; k++) {
        out[k] = vec4<f32>(nibbles_lo(q[k])) * dm.x + dm.y;
        out[k + 4u] = vec4<f32>(nibbles_hi(q[k])) * dm.x + dm.y;
    }
    return out;
}
#endif

// Bit 4 of 5-bit quants j .. j + 4 (element j takes bit j of qh; element j + 16 bit j + 16).
fn q5_high(qh: u32, j: u32) -> vec4<u32> {
    return ((vec4<u32>(qh) >> (vec4<u32>(j) + vec4<u32>(0u, 1u, 2u, 3u))) & vec4<u32>(1u)) << vec4<u32>(4u);
}

#ifdef W_VEC4
// The 32 5-bit quants of Q5_0's or Q5_1's block j (< 8) of a group, whose fours start at
// vector `fours` (weights::layout): each four's qh words, then its blocks' qs.
fn q5_quants(fours: u32, j: u32) -> array<vec4<u32>, 8> {
    let four = fours + 5u * (j >> 2u);
    let qh = w[four][j & 3u];
    let q = w[four + 1u + (j & 3u)];
    var out: array<vec4<u32>, 8>;
    for (var k = 0u; k < 4u; k++) {
        out[k] = nibbles_lo(q[k]) | q5_high(qh, 4u * k);
        out[k + 4u] = nibbles_hi(q[k]) | q5_high(qh, 4u * k + 16u);
    }
    return out;
}
#endif

#ifdef Q_Q5_0
// Block (22 B): d f16, qh u32, qs[16]; y = (q - 16) * d.
// GPU layout (weights::layout): groups of 8 blocks, each 16 bytes of their d, then per four
// blocks 16 bytes of their qh and their qs (5 vectors); every group but a row's last is full,
// so chunk c's group starts (c / 8) · 11 vectors in.
fn dequant_chunk(row_base: u32, c: u32) -> array<vec4<f32>, 8> {
    let j = c & 7u;
    let g = group_start(row_base, c);
    let d = group_scale(g, j);
    let q = q5_quants(g + 1u, j);
    var out: array<vec4<f32>, 8>;
    for (var k = 0u; k < 8u; k++) {
        out[k] = vec4<f32>(vec4<i32>(q[k]) - vec4<i32>(16)) * d;
    }
    return out;
}
#endif

#ifdef Q_Q5_1
// Block (24 B): d f16, m f16, qh u32, qs[16]; y = q * d + m.
// GPU layout (weights::layout): groups of 8 blocks, each 32 bytes of their (d, m), then per
// four blocks 16 bytes of their qh and their qs (5 vectors); chunk c's group starts (c / 8) ·
// 12 vectors in.
fn dequant_chunk(row_base: u32, c: u32) -> array<vec4<f32>, 8> {
    let j = c & 7u;
    let g = group_start(row_base, c);
    let dm = group_pair(g, j);
    let q = q5_quants(g + 2u, j);
    var out: array<vec4<f32>, 8>;
    for (var k = 0u; k < 8u; k++) {
        out[k] = vec4<f32>(q[k]) * dm.x + dm.y;
    }
    return out;
}
#endif

#ifdef Q_Q8_0
// GPU layout (weights::layout): groups of Q8_0_GROUP blocks, each 16 bytes of f16 scales then
// the blocks' 32 i8 quants (QS 0..31); rows start 16-aligned, and every group but a row's last
// is full, so chunk c's group starts (c / 8) · 17 vectors in. y = q * d.
fn dequant_chunk(row_base: u32, c: u32) -> array<vec4<f32>, 8> {
    let j = c & 7u;
    let g = group_start(row_base, c);
    let d = group_scale(g, j);
    let q0 = w[g + 1u + 2u * j];
    let q1 = w[g + 2u + 2u * j];
    var out: array<vec4<f32>, 8>;
    for (var k = 0u; k < 4u; k++) {
        out[k] = vec4<f32>(bytes_i8(q0[k])) * d;
        out[k + 4u] = vec4<f32>(bytes_i8(q1[k])) * d;
    }
    return out;
}
#endif

#ifdef W_VEC4
// Q4_K / Q5_K: the super-block's first 16 bytes (d, dmin, scales[12]) as 4 words.
fn k_header(base: u32) -> array<u32, 4> {
    return load_4_words_at(base);
}
#endif

// Byte n (< 12) of the scales, which are words 1..4 of the header.
fn k_scale_byte(h: array<u32, 4>, n: u32) -> u32 {
    let word = select(select(h[3], h[2], n < 8u), h[1], n < 4u);
    return (word >> ((n & 3u) * 8u)) & 0xffu;
}

// 6-bit scale and min of sub-block j (0..8), without branches.
fn k_scale_min(h: array<u32, 4>, j: u32) -> vec2<u32> {
    let lo = vec2<u32>(k_scale_byte(h, j) & 63u, k_scale_byte(h, j + 4u) & 63u);
    let a = k_scale_byte(h, j + 4u);
    // For j < 4, j - 4u wraps; that lane of the select is unused.
    let hi = vec2<u32>((a & 15u) | ((k_scale_byte(h, j - 4u) >> 6u) << 4u), (a >> 4u) | ((k_scale_byte(h, j) >> 6u) << 4u));
    return select(hi, lo, j < 4u);
}

// d * sc and dmin * m of sub-block j.
fn k_scales(h: array<u32, 4>, j: u32) -> vec2<f32> {
    let sm = vec2<f32>(k_scale_min(h, j));
    return f16_to_f32(vec4<u32>(h[0], h[0] >> 16u, 0u, 0u) & vec4<u32>(0xffffu)).xy * sm;
}

#ifdef Q_Q4_K
// Super-block (144 B): d, dmin f16, scales[12], qs[128]; chunk j of the block is sub-block j:
// y = d*sc * q - dmin*m, q the low (j even) or high (j odd) nibbles of qs[32 * (j / 2) ..].
fn dequant_chunk(row_base: u32, c: u32) -> array<vec4<f32>, 8> {
    let j = c & 7u;
    let base = row_base + (c >> 3u) * BLOCK_BYTES;
    let dm = k_scales(k_header(base), j);
    let qs = load_8_words_at(base + 16u + 32u * (j >> 1u));
    let shift = BYTE_SHIFTS + vec4<u32>(4u * (j & 1u));
    var out: array<vec4<f32>, 8>;
    for (var k = 0u; k < 8u; k++) {
        let q = (vec4<u32>(qs[k]) >> shift) & vec4<u32>(15u);
        out[k] = dm.x * vec4<f32>(q) - dm.y;
    }
    return out;
}
#endif

#ifdef Q_Q5_K
// Super-block (176 B): d, dmin f16, scales[12], qh[32], qs[128]; as Q4_K plus bit j of qh[l]
// as the fifth bit of element l of sub-block j.
fn dequant_chunk(row_base: u32, c: u32) -> array<vec4<f32>, 8> {
    let j = c & 7u;
    let base = row_base + (c >> 3u) * BLOCK_BYTES;
    let dm = k_scales(k_header(base), j);
    let qh = load_8_words_at(base + 16u);
    let qs = load_8_words_at(base + 48u + 32u * (j >> 1u));
    let shift = BYTE_SHIFTS + vec4<u32>(4u * (j & 1u));
    var out: array<vec4<f32>, 8>;
    for (var k = 0u; k < 8u; k++) {
        let lo = (vec4<u32>(qs[k]) >> shift) & vec4<u32>(15u);
        let hi = ((vec4<u32>(qh[k]) >> (BYTE_SHIFTS + vec4<u32>(j))) & vec4<u32>(1u)) << vec4<u32>(4u);
        out[k] = dm.x * vec4<f32>(lo + hi) - dm.y;
    }
    return out;
}
#endif

#ifdef Q_Q6_K
// Super-block (210 B): ql[128], qh[64], scales[16] i8, d f16; two halves of 128 elements, each
// four quarters (chunks) qq of 32: q = nibble (qq / 2) of ql[32 * (qq % 2) + l] | bits 2qq..2qq+2
// of qh[l] << 4; y = (d * sc[l / 16 + 2qq]) * (q - 32).
// GPU layout (weights::layout): groups of 8 super-blocks, each 16 bytes of their d (f16), then
// per super-block its first 208 bytes (ql, qh, scales: 13 vectors); rows start 16-aligned, and
// every group but a row's last is full, so super-block b's group starts (b / 8) · 105 vectors in.
const Q6_K_BLOCK_VEC4S: u32 = 13u;

// Chunk c's fields: d * sc of its two 16-element halves, the ql and qh vectors of each half,
// and the shifts that take its nibbles of ql and its 2 bits of qh (also dequant_q8.wgsl's).
struct Q6KChunk {
    ds: vec2<f32>,
    ql0: vec4<u32>,
    ql1: vec4<u32>,
    qh0: vec4<u32>,
    qh1: vec4<u32>,
    ql_shift: u32,
    qh_shift: u32,
}

fn q6_k_chunk(row_base: u32, c: u32) -> Q6KChunk {
    let j = c & 7u;
    let half = j >> 2u;
    let qq = j & 3u;
    let b = c >> 3u;
    let g = group_start(row_base, b);
    let i = b & 7u;
    let blk = g + 1u + i * Q6_K_BLOCK_VEC4S;
    // d * sc for the chunk's two 16-element halves: scales 8 half + 2 qq and the next.
    let d = group_scale(g, i);
    let sc = w[blk + 12u][2u * half + (qq >> 1u)] >> ((qq & 1u) * 16u);
    var o: Q6KChunk;
    o.ds = d * vec2<f32>(vec2<i32>(bitcast<i32>(sc << 24u) >> 24u, bitcast<i32>(sc << 16u) >> 24u));
    o.ql0 = w[blk + 4u * half + 2u * (qq & 1u)];
    o.ql1 = w[blk + 4u * half + 2u * (qq & 1u) + 1u];
    o.qh0 = w[blk + 8u + 2u * half];
    o.qh1 = w[blk + 9u + 2u * half];
    o.ql_shift = 4u * (qq >> 1u);
    o.qh_shift = 2u * qq;
    return o;
}

fn dequant_chunk(row_base: u32, c: u32) -> array<vec4<f32>, 8> {
    let f = q6_k_chunk(row_base, c);
    let ql_shift = BYTE_SHIFTS + vec4<u32>(f.ql_shift);
    let qh_shift = BYTE_SHIFTS + vec4<u32>(f.qh_shift);
    var out: array<vec4<f32>, 8>;
    for (var k = 0u; k < 4u; k++) {
        out[k] = f.ds.x * q6_k_quants(f.ql0[k], f.qh0[k], ql_shift, qh_shift);
        out[k + 4u] = f.ds.y * q6_k_quants(f.ql1[k], f.qh1[k], ql_shift, qh_shift);
    }
    return out;
}

// Four 6-bit quants minus 32: nibbles of the ql word at ql_shift, 2 bits of the qh word at
// qh_shift above them.
fn q6_k_quants(ql: u32, qh: u32, ql_shift: vec4<u32>, qh_shift: vec4<u32>) -> vec4<f32> {
    let lo = (vec4<u32>(ql) >> ql_shift) & vec4<u32>(15u);
    let hi = (vec4<u32>(qh) >> qh_shift) & vec4<u32>(3u);
    return vec4<f32>(vec4<i32>(lo | (hi << vec4<u32>(4u))) - vec4<i32>(32));
}
#endif

#ifdef Q_Q2_K
// Super-block (84 B): scales[16] (scale in the low nibble, min in the high), qs[64], d, dmin
// f16. Chunk j is quarter j % 4 of half j / 4: q = bits 2(j % 4)..+2 of qs[32 (j / 4) + l],
// and its two 16-element halves are sub-blocks 2j and 2j + 1: y = d*sc * q - dmin*m.
// GPU layout (weights::layout): groups of 8 super-blocks, each 32 bytes of their (d, dmin),
// then per super-block its first 80 bytes (scales, qs: 5 vectors); super-block b's group
// starts (b / 8) · 42 vectors in.
const Q2_K_BLOCK_VEC4S: u32 = 5u;

fn dequant_chunk(row_base: u32, c: u32) -> array<vec4<f32>, 8> {
    let j = c & 7u;
    let b = c >> 3u;
    let g = group_start(row_base, b);
    let i = b & 7u;
    let blk = g + 2u + i * Q2_K_BLOCK_VEC4S;
    let dm = group_pair(g, i).xyxy;
    let sc = (w[blk][j >> 1u] >> ((j & 1u) * 16u)) & 0xffffu;
    // (d * sc, dmin * m) of the first half, then of the second.
    let dl = dm * vec4<f32>((vec4<u32>(sc) >> vec4<u32>(0u, 4u, 8u, 12u)) & vec4<u32>(15u));
    let q0 = w[blk + 1u + 2u * (j >> 2u)];
    let q1 = w[blk + 2u + 2u * (j >> 2u)];
    let shift = BYTE_SHIFTS + vec4<u32>(2u * (j & 3u));
    var out: array<vec4<f32>, 8>;
    for (var k = 0u; k < 4u; k++) {
        out[k] = dl.x * vec4<f32>((vec4<u32>(q0[k]) >> shift) & vec4<u32>(3u)) - dl.y;
        out[k + 4u] = dl.z * vec4<f32>((vec4<u32>(q1[k]) >> shift) & vec4<u32>(3u)) - dl.w;
    }
    return out;
}
#endif

#ifdef Q_Q3_K
// Super-block (110 B): hmask[32], qs[64], scales[12], d f16. 2-bit quants as in Q2_K, less 4
// where bit 4(j / 4) + j % 4 of hmask[l] is clear; y = d*(sc - 32) * q with 6-bit scales:
// sub-block i's low nibble is nibble i / 8 of scales[i % 8], its top bits are bits
// 2(i / 4)..+2 of scales[8 + i % 4].
// GPU layout (weights::layout): groups of 8 super-blocks, each 96 bytes of their scales, then
// 16 of their d, then per super-block its first 96 bytes (hmask, qs: 6 vectors); super-block
// b's group starts (b / 8) · 55 vectors in.
const Q3_K_BLOCK_VEC4S: u32 = 6u;

// Word n of the vectors from g on.
fn group_word(g: u32, n: u32) -> u32 {
    return w[g + (n >> 2u)][n & 3u];
}

// d * (sc - 32) of chunk j's two sub-blocks 2j and 2j + 1, from the super-block's scales
// (words 0..2 of tail) and d (the low 16 bits of word 3).
fn q3_k_scales(tail: array<u32, 4>, j: u32) -> vec2<f32> {
    let n = j >> 2u;
    let jj = j & 3u;
    // Bytes 2jj, 2jj + 1 (low nibbles) and 8 + 2(jj % 2), + 1 (top bits).
    let lo = select(tail[1], tail[0], jj < 2u) >> (16u * (jj & 1u));
    let hi = tail[2] >> (16u * (jj & 1u));
    let hs = 2u * (2u * n + (jj >> 1u));
    let l = (vec2<u32>(lo) >> vec2<u32>(4u * n, 8u + 4u * n)) & vec2<u32>(15u);
    let h = (vec2<u32>(hi) >> vec2<u32>(hs, 8u + hs)) & vec2<u32>(3u);
    let d = f16_to_f32(vec4<u32>(tail[3] & 0xffffu)).x;
    return d * vec2<f32>(vec2<i32>(l | (h << vec2<u32>(4u))) - vec2<i32>(32));
}

fn dequant_chunk(row_base: u32, c: u32) -> array<vec4<f32>, 8> {
    let j = c & 7u;
    let b = c >> 3u;
    let g = group_start(row_base, b);
    let i = b & 7u;
    let blk = g + 7u + i * Q3_K_BLOCK_VEC4S;
    let d = w[g + 6u][i >> 1u] >> ((i & 1u) * 16u);
    let dl = q3_k_scales(array<u32, 4>(group_word(g, 3u * i), group_word(g, 3u * i + 1u), group_word(g, 3u * i + 2u), d), j);
    let hm0 = w[blk];
    let hm1 = w[blk + 1u];
    let q0 = w[blk + 2u + 2u * (j >> 2u)];
    let q1 = w[blk + 3u + 2u * (j >> 2u)];
    let shift = BYTE_SHIFTS + vec4<u32>(2u * (j & 3u));
    let bit = BYTE_SHIFTS + vec4<u32>(4u * (j >> 2u) + (j & 3u));
    var out: array<vec4<f32>, 8>;
    for (var k = 0u; k < 4u; k++) {
        out[k] = dl.x * q3_k_quants(q0[k], hm0[k], shift, bit);
        out[k + 4u] = dl.y * q3_k_quants(q1[k], hm1[k], shift, bit);
    }
    return out;
}

// Four 2-bit quants of the qs word at shift, less 4 where the hmask word's bit is clear.
fn q3_k_quants(qs: u32, hm: u32, shift: vec4<u32>, bit: vec4<u32>) -> vec4<f32> {
    let q = (vec4<u32>(qs) >> shift) & vec4<u32>(3u);
    let offset = (~(vec4<u32>(hm) >> bit) & vec4<u32>(1u)) << vec4<u32>(2u);
    return vec4<f32>(vec4<i32>(q) - vec4<i32>(offset));
}
#endif

// IQ4_NL's 16 levels (ggml's kvalues_iq4nl) as i8, four to a word.
const KVALUES_IQ4NL: vec4<u32> = vec4<u32>(0xbfad9881u, 0xf6eaddcfu, 0x26190d01u, 0x71594535u);

// The levels of 4-bit indices n, picked with selects rather than a table in memory.
fn iq4nl_values(n: vec4<u32>) -> vec4<f32> {
    let word = n >> vec4<u32>(2u);
    let odd = (word & vec4<u32>(1u)) != vec4<u32>(0u);
    let lo = select(vec4<u32>(KVALUES_IQ4NL.x), vec4<u32>(KVALUES_IQ4NL.y), odd);
    let hi = select(vec4<u32>(KVALUES_IQ4NL.z), vec4<u32>(KVALUES_IQ4NL.w), odd);
    let words = select(lo, hi, word >= vec4<u32>(2u));
    let v = bitcast<vec4<i32>>(words << (vec4<u32>(24u) - 8u * (n & vec4<u32>(3u)))) >> vec4<u32>(24u);
    return vec4<f32>(v);
}

// 32 elements from 16 bytes of IQ4 nibbles scaled by `d`: low nibbles are elements 0..16.
fn iq4_chunk(d: f32, qs: vec4<u32>) -> array<vec4<f32>, 8> {
    var out: array<vec4<f32>, 8>;
    for (var k = 0u; k < 4u; k++) {
        out[k] = d * iq4nl_values(nibbles_lo(qs[k]));
        out[k + 4u] = d * iq4nl_values(nibbles_hi(qs[k]));
    }
    return out;
}

#ifdef Q_IQ4_NL
// Block (18 B): d f16, qs[16]; y = d * kvalues[q], low nibbles are elements 0..16.
// GPU layout as Q4_0's (weights::layout): chunk c's group starts (c / 8) · 9 vectors in.
fn dequant_chunk(row_base: u32, c: u32) -> array<vec4<f32>, 8> {
    let j = c & 7u;
    let g = group_start(row_base, c);
    return iq4_chunk(group_scale(g, j), w[g + 1u + j]);
}
#endif

#ifdef Q_IQ4_XS
// Super-block (136 B): d f16, scales_h u16, scales_l[4], qs[128]; chunk j is an IQ4_NL block
// (16 bytes of qs at 16j) scaled by d * (ls - 32), ls = nibble j of scales_l | bits
// 2j..2j+2 of scales_h << 4.
// GPU layout (weights::layout): groups of 8 super-blocks, each 64 bytes of their first 8
// (d, scales_h, scales_l), then each one's qs (8 vectors); super-block b's group starts
// (b / 8) · 68 vectors in.
fn dequant_chunk(row_base: u32, c: u32) -> array<vec4<f32>, 8> {
    let j = c & 7u;
    let b = c >> 3u;
    let g = group_start(row_base, b);
    let i = b & 7u;
    let h = w[g + (i >> 1u)];
    let head = h[2u * (i & 1u)];
    let ls = ((h[2u * (i & 1u) + 1u] >> (4u * j)) & 15u) | (((head >> (16u + 2u * j)) & 3u) << 4u);
    let dl = f16_to_f32(vec4<u32>(head & 0xffffu)).x * f32(i32(ls) - 32);
    return iq4_chunk(dl, w[g + 4u + 8u * i + j]);
}
#endif

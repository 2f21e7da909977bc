// Weight chunks as packed 8-bit integers, for products with 8-bit activations (matmul.wgsl's
// Q8_SLICE, matmul_tiled.wgsl's Q8_CHUNKS; q8_quantize makes the activations' chunks):
// q8w_chunk(row_base, c) returns the quants of chunk c (elements 32c .. 32c + 32 of the row
// starting at byte row_base) four to a word in element order, each a byte that dot4I8Packed
// reads as signed, with the chunk's scales: element e is d[e / 16] · q[e] + m.
// Where a format offsets its quants by a constant (Q4_0 by 8, Q5_0 by 16, Q6_K by 32) the
// offset is taken off in the packed bytes and m is 0; the affine formats (Q4_1, Q5_1, Q4_K,
// Q5_K) keep their unsigned quants (below 32, so positive as i8) and their m. The same
// fields as dequant.wgsl reads, in the same GPU layout (weights::layout); included after it.
// Formats: ops::matmul::Q8_FORMATS.

struct Q8Chunk {
    q: array<u32, 8>,
    // The scale of elements 0..16 and of 16..32 (the same but in Q6_K).
    d: vec2<f32>,
    m: f32,
}

// A 32-element chunk of activations as signed bytes, four to a word in element order, with
// its scale (element e is about d · q[e]) and the sum of its f32 elements (for the affine
// formats' m).
struct Q8Act {
    q: array<u32, 8>,
    d: f32,
    sum: f32,
}

// Quantizes a chunk of activations: scale max |v| / 127, each element rounded to the nearest
// step (a chunk of zeros is all zeros, scale 0).
fn q8_quantize(v: array<vec4<f32>, 8>) -> Q8Act {
    var most = abs(v[0]);
    var sum = v[0];
    for (var k = 1u; k < 8u; k++) {
        most = max(most, abs(v[k]));
        sum += v[k];
    }
    let a = max(max(most.x, most.y), max(most.z, most.w));
    let inv = select(0.0, 127.0 / a, a > 0.0);
    var o: Q8Act;
    for (var k = 0u; k < 8u; k++) {
        o.q[k] = pack4xI8(vec4<i32>(round(v[k] * inv)));
    }
    o.d = a / 127.0;
    o.sum = (sum.x + sum.y) + (sum.z + sum.w);
    return o;
}

const LOW_NIBBLES: u32 = 0x0f0f0f0fu;
const BYTE_ONES: u32 = 0x01010101u;

// Four `bits`-bit quants packed in bytes, minus 2^(bits - 1), as signed bytes: flipping the
// top bit gives the difference in `bits`-bit two's complement, and the product sets the
// bits above it where that bit is set (top · (2^(9 - bits) - 2) = 256 - 2^bits, one byte).
fn centred(b: u32, bits: u32) -> u32 {
    let top = BYTE_ONES << (bits - 1u);
    let v = b ^ top;
    return v | ((v & top) * ((512u >> bits) - 2u));
}

// Bits 0..4 of h as bit 0 of bytes 0..4 (the shifted copies do not overlap, so no carries).
fn bits_to_bytes(h: u32) -> u32 {
    return ((h & 15u) * 0x00204081u) & BYTE_ONES;
}

#ifdef Q_Q4_0
fn q8w_chunk(row_base: u32, c: u32) -> Q8Chunk {
    let j = c & 7u;
    let g = group_start(row_base, c);
    let d = group_scale(g, j);
    let q = w[g + 1u + j];
    var o: Q8Chunk;
    for (var k = 0u; k < 4u; k++) {
        o.q[k] = centred(q[k] & LOW_NIBBLES, 4u);
        o.q[k + 4u] = centred((q[k] >> 4u) & LOW_NIBBLES, 4u);
    }
    o.d = vec2<f32>(d);
    return o;
}
#endif

#ifdef Q_Q4_1
fn q8w_chunk(row_base: u32, c: u32) -> Q8Chunk {
    let j = c & 7u;
    let g = group_start(row_base, c);
    let dm = group_pair(g, j);
    let q = w[g + 2u + j];
    var o: Q8Chunk;
    for (var k = 0u; k < 4u; k++) {
        o.q[k] = q[k] & LOW_NIBBLES;
        o.q[k + 4u] = (q[k] >> 4u) & LOW_NIBBLES;
    }
    o.d = vec2<f32>(dm.x);
    o.m = dm.y;
    return o;
}
#endif

#ifdef W_VEC4
// The 32 5-bit quants of Q5_0's or Q5_1's block j (as q5_quants in dequant.wgsl), packed:
// element e takes bit e of qh as its fifth bit.
fn q5_packed(fours: u32, j: u32) -> array<u32, 8> {
    let four = fours + 5u * (j >> 2u);
    let qh = w[four][j & 3u];
    let q = w[four + 1u + (j & 3u)];
    var out: array<u32, 8>;
    for (var k = 0u; k < 4u; k++) {
        out[k] = (q[k] & LOW_NIBBLES) | (bits_to_bytes(qh >> (4u * k)) << 4u);
        out[k + 4u] = ((q[k] >> 4u) & LOW_NIBBLES) | (bits_to_bytes(qh >> (4u * k + 16u)) << 4u);
    }
    return out;
}
#endif

#ifdef Q_Q5_0
fn q8w_chunk(row_base: u32, c: u32) -> Q8Chunk {
    let j = c & 7u;
    let g = group_start(row_base, c);
    let q = q5_packed(g + 1u, j);
    var o: Q8Chunk;
    for (var k = 0u; k < 8u; k++) {
        o.q[k] = centred(q[k], 5u);
    }
    o.d = vec2<f32>(group_scale(g, j));
    return o;
}
#endif

#ifdef Q_Q5_1
fn q8w_chunk(row_base: u32, c: u32) -> Q8Chunk {
    let j = c & 7u;
    let g = group_start(row_base, c);
    let dm = group_pair(g, j);
    var o: Q8Chunk;
    o.q = q5_packed(g + 2u, j);
    o.d = vec2<f32>(dm.x);
    o.m = dm.y;
    return o;
}
#endif

#ifdef Q_Q8_0
fn q8w_chunk(row_base: u32, c: u32) -> Q8Chunk {
    let j = c & 7u;
    let g = group_start(row_base, c);
    let q0 = w[g + 1u + 2u * j];
    let q1 = w[g + 2u + 2u * j];
    var o: Q8Chunk;
    for (var k = 0u; k < 4u; k++) {
        o.q[k] = q0[k];
        o.q[k + 4u] = q1[k];
    }
    o.d = vec2<f32>(group_scale(g, j));
    return o;
}
#endif

#ifdef Q_Q4_K
fn q8w_chunk(row_base: u32, c: u32) -> Q8Chunk {
    let j = c & 7u;
    let base = row_base + (c >> 3u) * BLOCK_BYTES;
    let dm = k_scales(k_header(base), j);
    let qs = load_8_words_at(base + 16u + 32u * (j >> 1u));
    var o: Q8Chunk;
    for (var k = 0u; k < 8u; k++) {
        o.q[k] = (qs[k] >> (4u * (j & 1u))) & LOW_NIBBLES;
    }
    o.d = vec2<f32>(dm.x);
    o.m = -dm.y;
    return o;
}
#endif

#ifdef Q_Q5_K
fn q8w_chunk(row_base: u32, c: u32) -> Q8Chunk {
    let j = c & 7u;
    let base = row_base + (c >> 3u) * BLOCK_BYTES;
    let dm = k_scales(k_header(base), j);
    let qh = load_8_words_at(base + 16u);
    let qs = load_8_words_at(base + 48u + 32u * (j >> 1u));
    var o: Q8Chunk;
    for (var k = 0u; k < 8u; k++) {
        o.q[k] = ((qs[k] >> (4u * (j & 1u))) & LOW_NIBBLES) | (((qh[k] >> j) & BYTE_ONES) << 4u);
    }
    o.d = vec2<f32>(dm.x);
    o.m = -dm.y;
    return o;
}
#endif

#ifdef Q_Q6_K
// Each byte's 6-bit quant: its nibble of ql, its 2 bits of qh above it, less 32.
fn q6_k_packed(ql: u32, qh: u32, f: Q6KChunk) -> u32 {
    return centred(((ql >> f.ql_shift) & LOW_NIBBLES) | (((qh >> f.qh_shift) & 0x03030303u) << 4u), 6u);
}

fn q8w_chunk(row_base: u32, c: u32) -> Q8Chunk {
    let f = q6_k_chunk(row_base, c);
    var o: Q8Chunk;
    for (var k = 0u; k < 4u; k++) {
        o.q[k] = q6_k_packed(f.ql0[k], f.qh0[k], f);
        o.q[k + 4u] = q6_k_packed(f.ql1[k], f.qh1[k], f);
    }
    o.d = f.ds;
    return o;
}
#endif

// In-shader dequantization of raw GGUF blocks, bit-faithful to flint_core::quant::dequantize
// (same f32 operations in the same order; scales are f16).
//
// The including shader declares the weights and sets the format (ShaderDefs::quant):
//   var<storage, read> w: array<u32>;   // raw little-endian bytes of the weight rows
//   Q_<NAME> (Q_F32, Q_Q4_K, ...), BLOCK_ELEMS, BLOCK_BYTES
//
// The unit is a 32-element chunk: dequant_chunk(row_base, c) returns elements 32c .. 32c + 32
// of the row starting at byte row_base, as 8 vec4 in element order. Rows hold whole blocks
// and a multiple of 32 elements, so a chunk never straddles two legacy blocks and a K-quant
// super-block is 8 chunks. Blocks of 18, 22, 34 or 210 bytes are not word-aligned, hence the
// byte-offset loads below.

const CHUNK: u32 = 32u;
// f32 exponent bias minus f16 exponent bias, and the smallest f16 subnormal (2^-24).
const F16_TO_F32_BIAS: u32 = 112u;
const F16_SUBNORMAL_UNIT: f32 = 5.9604644775390625e-8;
const BYTE_SHIFTS: vec4<u32> = vec4<u32>(0u, 8u, 16u, 24u);

// The byte at byte offset b.
fn hsum4(v: vec4<f32>) -> f32 {
    return (v.x + v.y) + (v.z + v.w);
}

fn load_u8_at(b: u32) -> u32 {
    return (w[b >> 2u] >> ((b & 3u) * 8u)) & 0xffu;
}

// The signed byte at byte offset b.
fn load_i8_at(b: u32) -> i32 {
    return bitcast<i32>(load_u8_at(b) << 24u) >> 24u;
}

// The u16 at an even byte offset b (every 16-bit field of every format is 2-aligned).
fn load_u16_at(b: u32) -> u32 {
    return (w[b >> 2u] >> ((b & 2u) * 8u)) & 0xffffu;
}

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

fn load_f16_at(b: u32) -> f32 {
    return f16_to_f32(vec4<u32>(load_u16_at(b))).x;
}

// The u32 at any byte offset b; reads the next word only through a shift that is zero when
// b is aligned, so there is no branch.
fn load_u32_at(b: u32) -> u32 {
    let i = b >> 2u;
    let s = (b & 3u) * 8u;
    return (w[i] >> s) | ((w[i + 1u] << (31u - s)) << 1u);
}

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
fn dequant_chunk(row_base: u32, c: u32) -> array<vec4<f32>, 8> {
    let base = row_base + c * BLOCK_BYTES;
    let d = load_f16_at(base);
    var out: array<vec4<f32>, 8>;
    for (var k = 0u; k < 4u; k++) {
        let q = load_u32_at(base + 2u + 4u * k);
        out[k] = vec4<f32>(vec4<i32>(nibbles_lo(q)) - vec4<i32>(8)) * d;
        out[k + 4u] = vec4<f32>(vec4<i32>(nibbles_hi(q)) - vec4<i32>(8)) * d;
    }
    return out;
}
#endif

#ifdef Q_Q4_1
// Block (20 B): d f16, m f16, qs[16]; y = q * d + m.
fn dequant_chunk(row_base: u32, c: u32) -> array<vec4<f32>, 8> {
    let base = row_base + c * BLOCK_BYTES;
    let d = load_f16_at(base);
    let m = load_f16_at(base + 2u);
    var out: array<vec4<f32>, 8>;
    for (var k = 0u; k < 4u; k++) {
        let q = load_u32_at(base + 4u + 4u * k);
        out[k] = vec4<f32>(nibbles_lo(q)) * d + m;
        out[k + 4u] = vec4<f32>(nibbles_hi(q)) * d + m;
    }
    return out;
}
#endif

// Bit 4 of 5-bit quants j .. j + 4 (element j takes bit j of qh; element j + 16 bit j + 16).
fn q5_high(qh: u32, j: u32) -> vec4<u32> {
    return ((vec4<u32>(qh) >> (vec4<u32>(j) + vec4<u32>(0u, 1u, 2u, 3u))) & vec4<u32>(1u)) << vec4<u32>(4u);
}

#ifdef Q_Q5_0
// Block (22 B): d f16, qh u32, qs[16]; y = (q - 16) * d.
#define HAS_DOT_CHUNK
fn dot_chunk(row_base: u32, c: u32, xb: u32) -> f32 {
    let base = row_base + c * BLOCK_BYTES;
    let qh = load_u32_at(base + 2u);
    var s = vec4<f32>(0.0);
    for (var k = 0u; k < 4u; k++) {
        let q = load_u32_at(base + 6u + 4u * k);
        let lo = vec4<i32>(nibbles_lo(q) | q5_high(qh, 4u * k)) - vec4<i32>(16);
        let hi = vec4<i32>(nibbles_hi(q) | q5_high(qh, 4u * k + 16u)) - vec4<i32>(16);
        s += vec4<f32>(lo) * x[xb + k] + vec4<f32>(hi) * x[xb + k + 4u];
    }
    return load_f16_at(base) * hsum4(s);
}

fn dequant_chunk(row_base: u32, c: u32) -> array<vec4<f32>, 8> {
    let base = row_base + c * BLOCK_BYTES;
    let d = load_f16_at(base);
    let qh = load_u32_at(base + 2u);
    var out: array<vec4<f32>, 8>;
    for (var k = 0u; k < 4u; k++) {
        let q = load_u32_at(base + 6u + 4u * k);
        let lo = nibbles_lo(q) | q5_high(qh, 4u * k);
        let hi = nibbles_hi(q) | q5_high(qh, 4u * k + 16u);
        out[k] = vec4<f32>(vec4<i32>(lo) - vec4<i32>(16)) * d;
        out[k + 4u] = vec4<f32>(vec4<i32>(hi) - vec4<i32>(16)) * d;
    }
    return out;
}
#endif

#ifdef Q_Q5_1
// Block (24 B): d f16, m f16, qh u32, qs[16]; y = q * d + m.
fn dequant_chunk(row_base: u32, c: u32) -> array<vec4<f32>, 8> {
    let base = row_base + c * BLOCK_BYTES;
    let d = load_f16_at(base);
    let m = load_f16_at(base + 2u);
    let qh = load_u32_at(base + 4u);
    var out: array<vec4<f32>, 8>;
    for (var k = 0u; k < 4u; k++) {
        let q = load_u32_at(base + 8u + 4u * k);
        out[k] = vec4<f32>(nibbles_lo(q) | q5_high(qh, 4u * k)) * d + m;
        out[k + 4u] = vec4<f32>(nibbles_hi(q) | q5_high(qh, 4u * k + 16u)) * d + m;
    }
    return out;
}
#endif

#ifdef Q_Q8_0
// Block (34 B): d f16, qs[32] i8; y = q * d.
#define HAS_DOT_CHUNK
fn dot_chunk(row_base: u32, c: u32, xb: u32) -> f32 {
    let base = row_base + c * BLOCK_BYTES;
    var s = vec4<f32>(bytes_i8(load_u32_at(base + 2u))) * x[xb];
    for (var k = 1u; k < 8u; k++) {
        s += vec4<f32>(bytes_i8(load_u32_at(base + 2u + 4u * k))) * x[xb + k];
    }
    return load_f16_at(base) * hsum4(s);
}

fn dequant_chunk(row_base: u32, c: u32) -> array<vec4<f32>, 8> {
    let base = row_base + c * BLOCK_BYTES;
    let d = load_f16_at(base);
    var out: array<vec4<f32>, 8>;
    for (var k = 0u; k < 8u; k++) {
        out[k] = vec4<f32>(bytes_i8(load_u32_at(base + 2u + 4u * k))) * d;
    }
    return out;
}
#endif

// Q4_K / Q5_K: 6-bit scale and min of sub-block j (0..8) from the 12 bytes at byte sb.
fn scale_min_k4(sb: u32, j: u32) -> vec2<u32> {
    if (j < 4u) {
        return vec2<u32>(load_u8_at(sb + j) & 63u, load_u8_at(sb + j + 4u) & 63u);
    }
    let a = load_u8_at(sb + j + 4u);
    return vec2<u32>((a & 15u) | ((load_u8_at(sb + j - 4u) >> 6u) << 4u), (a >> 4u) | ((load_u8_at(sb + j) >> 6u) << 4u));
}

#ifdef Q_Q4_K
// Super-block (144 B): d, dmin f16, scales[12], qs[128]; chunk j of the block is sub-block j:
// y = d*sc * q - dmin*m, q the low (j even) or high (j odd) nibbles of qs[32 * (j / 2) ..].
#define HAS_DOT_CHUNK
// Σ (d1 q - m1) x = d1 Σ q x - m1 Σ x.
fn dot_chunk(row_base: u32, c: u32, xb: u32) -> f32 {
    let j = c & 7u;
    let base = row_base + (c >> 3u) * BLOCK_BYTES;
    let qs = base + 16u + 32u * (j >> 1u);
    let shift = BYTE_SHIFTS + vec4<u32>(4u * (j & 1u));
    var sq = vec4<f32>(0.0);
    var sx = vec4<f32>(0.0);
    for (var k = 0u; k < 8u; k++) {
        let q = (vec4<u32>(load_u32_at(qs + 4u * k)) >> shift) & vec4<u32>(15u);
        let xv = x[xb + k];
        sq += vec4<f32>(q) * xv;
        sx += xv;
    }
    let sm = scale_min_k4(base + 4u, j);
    return load_f16_at(base) * f32(sm.x) * hsum4(sq) - load_f16_at(base + 2u) * f32(sm.y) * hsum4(sx);
}

fn dequant_chunk(row_base: u32, c: u32) -> array<vec4<f32>, 8> {
    let j = c & 7u;
    let base = row_base + (c >> 3u) * BLOCK_BYTES;
    let sm = scale_min_k4(base + 4u, j);
    let d1 = load_f16_at(base) * f32(sm.x);
    let m1 = load_f16_at(base + 2u) * f32(sm.y);
    let qs = base + 16u + 32u * (j >> 1u);
    let shift = BYTE_SHIFTS + vec4<u32>(4u * (j & 1u));
    var out: array<vec4<f32>, 8>;
    for (var k = 0u; k < 8u; k++) {
        let q = (vec4<u32>(load_u32_at(qs + 4u * k)) >> shift) & vec4<u32>(15u);
        out[k] = d1 * vec4<f32>(q) - m1;
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
    let sm = scale_min_k4(base + 4u, j);
    let d1 = load_f16_at(base) * f32(sm.x);
    let m1 = load_f16_at(base + 2u) * f32(sm.y);
    let qh = base + 16u;
    let qs = base + 48u + 32u * (j >> 1u);
    let shift = BYTE_SHIFTS + vec4<u32>(4u * (j & 1u));
    var out: array<vec4<f32>, 8>;
    for (var k = 0u; k < 8u; k++) {
        let lo = (vec4<u32>(load_u32_at(qs + 4u * k)) >> shift) & vec4<u32>(15u);
        let hi = ((vec4<u32>(load_u32_at(qh + 4u * k)) >> (BYTE_SHIFTS + vec4<u32>(j))) & vec4<u32>(1u)) << vec4<u32>(4u);
        out[k] = d1 * vec4<f32>(lo + hi) - m1;
    }
    return out;
}
#endif

#ifdef Q_Q6_K
// Super-block (210 B): ql[128], qh[64], scales[16] i8, d f16; two halves of 128 elements, each
// four quarters (chunks) qq of 32: q = nibble (qq / 2) of ql[32 * (qq % 2) + l] | bits 2qq..2qq+2
// of qh[l] << 4; y = (d * sc[l / 16 + 2qq]) * (q - 32).
#define HAS_DOT_CHUNK
fn dot_chunk(row_base: u32, c: u32, xb: u32) -> f32 {
    let j = c & 7u;
    let half = j >> 2u;
    let qq = j & 3u;
    let base = row_base + (c >> 3u) * BLOCK_BYTES;
    let ql = base + 64u * half + 32u * (qq & 1u);
    let qh = base + 128u + 32u * half;
    let ql_shift = BYTE_SHIFTS + vec4<u32>(4u * (qq >> 1u));
    let qh_shift = BYTE_SHIFTS + vec4<u32>(2u * qq);
    // Elements 0..16 take scale ds0, 16..32 scale ds1.
    var s0 = vec4<f32>(0.0);
    var s1 = vec4<f32>(0.0);
    for (var k = 0u; k < 8u; k++) {
        let lo = (vec4<u32>(load_u32_at(ql + 4u * k)) >> ql_shift) & vec4<u32>(15u);
        let hi = (vec4<u32>(load_u32_at(qh + 4u * k)) >> qh_shift) & vec4<u32>(3u);
        let p = vec4<f32>(vec4<i32>(lo | (hi << vec4<u32>(4u))) - vec4<i32>(32)) * x[xb + k];
        if (k < 4u) {
            s0 += p;
        } else {
            s1 += p;
        }
    }
    let d = load_f16_at(base + 208u);
    let ds0 = d * f32(load_i8_at(base + 192u + 8u * half + 2u * qq));
    let ds1 = d * f32(load_i8_at(base + 193u + 8u * half + 2u * qq));
    return ds0 * hsum4(s0) + ds1 * hsum4(s1);
}

fn dequant_chunk(row_base: u32, c: u32) -> array<vec4<f32>, 8> {
    let j = c & 7u;
    let half = j >> 2u;
    let qq = j & 3u;
    let base = row_base + (c >> 3u) * BLOCK_BYTES;
    let d = load_f16_at(base + 208u);
    let ds0 = d * f32(load_i8_at(base + 192u + 8u * half + 2u * qq));
    let ds1 = d * f32(load_i8_at(base + 193u + 8u * half + 2u * qq));
    let ql = base + 64u * half + 32u * (qq & 1u);
    let qh = base + 128u + 32u * half;
    let ql_shift = BYTE_SHIFTS + vec4<u32>(4u * (qq >> 1u));
    let qh_shift = BYTE_SHIFTS + vec4<u32>(2u * qq);
    var out: array<vec4<f32>, 8>;
    for (var k = 0u; k < 8u; k++) {
        let lo = (vec4<u32>(load_u32_at(ql + 4u * k)) >> ql_shift) & vec4<u32>(15u);
        let hi = (vec4<u32>(load_u32_at(qh + 4u * k)) >> qh_shift) & vec4<u32>(3u);
        let q = vec4<i32>(lo | (hi << vec4<u32>(4u))) - vec4<i32>(32);
        out[k] = select(ds1, ds0, k < 4u) * vec4<f32>(q);
    }
    return out;
}
#endif

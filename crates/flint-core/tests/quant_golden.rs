//! Quantization against gguf-py's dequantized goldens (bit-exact): the shared ones, and for the
//! formats they lack the repository's (`tests/data/dequant`, written by its `make.py`); plus
//! `dot_row`, block sizes, type ids and length errors.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use bytemuck::Pod;
use flint_core::quant::{
    dequantize, dot_row, BlockIQ4NL, BlockIQ4XS, BlockQ2K, BlockQ3K, BlockQ4K, BlockQ4_0, BlockQ4_1, BlockQ5K, BlockQ5_0, BlockQ5_1, BlockQ6K, BlockQ8_0,
    QuantError, QuantType,
};
use serde_json::Value;

const GOLDEN_DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../../shared/golden/dequant");
/// Goldens of the formats the shared set lacks, in the same shape.
const LOCAL_GOLDEN_DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/data/dequant");
/// The formats whose goldens live in [`LOCAL_GOLDEN_DIR`].
const LOCAL_GOLDEN_TYPES: [&str; 4] = ["Q2_K", "Q3_K", "IQ4_NL", "IQ4_XS"];
/// `dot_row` may sum in any order: its error is bounded relative to `sum |w_i * x_i|`.
const DOT_REL_TOL: f64 = 1e-5;
const SEED: u64 = 0x5eed_f117;

/// SplitMix64: a seeded source of test inputs with no dependency.
struct Rng(u64);

impl Rng {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in [-1, 1).
    fn signed(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }

    fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next_u64() as u8).collect()
    }

    fn vec(&mut self, n: usize) -> Vec<f32> {
        (0..n).map(|_| self.signed()).collect()
    }

    /// f16 bits of a finite value in [-scale, scale).
    fn f16(&mut self, scale: f32) -> u16 {
        half::f16::from_f32(self.signed() * scale).to_bits()
    }
}

fn decode_hex(hex: &str) -> Vec<u8> {
    assert!(hex.len().is_multiple_of(2), "odd hex length {}", hex.len());
    (0..hex.len()).step_by(2).map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap_or_else(|e| panic!("bad hex at {i}: {e}"))).collect()
}

fn json_files(dir: &Path) -> Vec<PathBuf> {
    let entries = std::fs::read_dir(dir).unwrap_or_else(|e| panic!("golden dir {} unreadable ({e})", dir.display()));
    let mut files: Vec<PathBuf> = entries.map(|e| e.expect("golden dir entry").path()).filter(|p| p.extension().is_some_and(|x| x == "json")).collect();
    files.sort();
    assert!(!files.is_empty(), "no golden files in {}", dir.display());
    files
}

/// The shared goldens (shared/ must sit beside the repo), then the repository's.
fn golden_files() -> Vec<PathBuf> {
    let local = json_files(Path::new(LOCAL_GOLDEN_DIR));
    let names: BTreeSet<String> = local.iter().filter_map(|p| p.file_stem()).map(|s| s.to_string_lossy().into_owned()).collect();
    let want: BTreeSet<String> = LOCAL_GOLDEN_TYPES.iter().map(|s| s.to_string()).collect();
    assert_eq!(names, want, "goldens in {LOCAL_GOLDEN_DIR}");
    let mut files = json_files(Path::new(GOLDEN_DIR));
    files.extend(local);
    files
}

fn type_by_name(name: &str) -> Option<QuantType> {
    QuantType::ALL.into_iter().find(|ty| ty.name() == name)
}

/// `src` copied one byte past an even address, so block reads are unaligned.
fn misaligned(src: &[u8]) -> Vec<u8> {
    let mut buf = Vec::with_capacity(src.len() + 1);
    buf.push(0xa5);
    buf.extend_from_slice(src);
    buf
}

fn dequantized(ty: QuantType, src: &[u8]) -> Vec<f32> {
    let n = ty.block_elems() * (src.len() / ty.block_bytes());
    let mut out = vec![f32::NAN; n];
    dequantize(ty, src, &mut out).unwrap_or_else(|e| panic!("{e}"));
    out
}

/// Asserts `dot_row(ty, row, x)` matches an f64 dot of the dequantized row.
fn check_dot(ty: QuantType, row: &[u8], x: &[f32], what: &str) {
    let w = dequantized(ty, row);
    let exact: f64 = w.iter().zip(x).map(|(&w, &x)| f64::from(w) * f64::from(x)).sum();
    let magnitude: f64 = w.iter().zip(x).map(|(&w, &x)| (f64::from(w) * f64::from(x)).abs()).sum();
    let got = dot_row(ty, row, x).unwrap_or_else(|e| panic!("{what}: {e}"));
    let err = (f64::from(got) - exact).abs();
    assert!(err <= DOT_REL_TOL * magnitude + f64::from(f32::MIN_POSITIVE), "{what}: dot_row {got} vs {exact} (err {err:e}, sum|wx| {magnitude:e})");
}

#[test]
fn dequantize_matches_gguf_py_goldens_bit_exactly() {
    let mut rng = Rng(SEED);
    let mut covered = BTreeSet::new();
    for path in golden_files() {
        let file = path.display();
        let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{file}: {e}"));
        let json: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{file}: {e}"));
        let name = json["type"].as_str().unwrap_or_else(|| panic!("{file}: no \"type\""));
        let ty = type_by_name(name).unwrap_or_else(|| panic!("{file}: golden for unsupported type {name}"));
        assert_eq!(json["ggml_type_id"].as_u64(), Some(u64::from(ty.ggml_id())), "{file}: ggml_type_id");
        assert_eq!(json["block_elems"].as_u64(), Some(ty.block_elems() as u64), "{file}: block_elems");
        assert_eq!(json["block_bytes"].as_u64(), Some(ty.block_bytes() as u64), "{file}: block_bytes");
        let cases = json["cases"].as_array().unwrap_or_else(|| panic!("{file}: no cases"));
        assert!(!cases.is_empty(), "{file}: empty cases");
        for case in cases {
            let source = case["source"].as_str().unwrap_or("?");
            let what = format!("{name} [{source}]");
            let bytes = decode_hex(case["bytes_hex"].as_str().unwrap_or_else(|| panic!("{what}: no bytes_hex")));
            let expected: Vec<u32> = case["values_f32_bits"]
                .as_array()
                .unwrap_or_else(|| panic!("{what}: no values_f32_bits"))
                .iter()
                .map(|v| v.as_u64().and_then(|v| u32::try_from(v).ok()).expect("f32 bits fit u32"))
                .collect();
            assert_eq!(case["n_bytes"].as_u64(), Some(bytes.len() as u64), "{what}: n_bytes");
            assert_eq!(case["n_values"].as_u64(), Some(expected.len() as u64), "{what}: n_values");

            let padded = misaligned(&bytes);
            for (src, align) in [(&bytes[..], "aligned"), (&padded[1..], "unaligned")] {
                let got = dequantized(ty, src);
                assert_eq!(got.len(), expected.len(), "{what}: element count");
                for (i, (g, &e)) in got.iter().zip(&expected).enumerate() {
                    assert_eq!(g.to_bits(), e, "{what} ({align}) element {i}: got {g:e} ({:#010x}), expected {:e} ({e:#010x})", g.to_bits(), f32::from_bits(e));
                }
            }
            let x = rng.vec(expected.len());
            check_dot(ty, &padded[1..], &x, &what);
        }
        covered.insert(name.to_owned());
    }
    let missing: Vec<&str> = QuantType::ALL.iter().map(|ty| ty.name()).filter(|n| !covered.contains(*n)).collect();
    assert!(missing.is_empty(), "no dequant golden for {missing:?}");
}

/// Random blocks of `B` (raw bytes in `row`) with `fix` giving each block sane f16 scales.
fn sanitize<B: Pod>(row: &mut [u8], rng: &mut Rng, fix: impl Fn(&mut B, &mut Rng)) {
    for chunk in row.chunks_exact_mut(core::mem::size_of::<B>()) {
        let mut block: B = bytemuck::pod_read_unaligned(chunk);
        fix(&mut block, rng);
        chunk.copy_from_slice(bytemuck::bytes_of(&block));
    }
}

/// A random row of `n` elements of `ty` whose values are all finite.
fn random_row(ty: QuantType, n: usize, rng: &mut Rng) -> Vec<u8> {
    let mut row = match ty {
        QuantType::F32 => return (0..n).flat_map(|_| (rng.signed() * 4.0).to_le_bytes()).collect(),
        QuantType::F16 => return (0..n).flat_map(|_| rng.f16(4.0).to_le_bytes()).collect(),
        QuantType::BF16 => return (0..n).flat_map(|_| half::bf16::from_f32(rng.signed() * 4.0).to_bits().to_le_bytes()).collect(),
        _ => rng.bytes(n / ty.block_elems() * ty.block_bytes()),
    };
    let r = &mut *rng;
    match ty {
        QuantType::Q4_0 => sanitize(&mut row, r, |b: &mut BlockQ4_0, r| b.d = r.f16(0.1)),
        QuantType::Q4_1 => sanitize(&mut row, r, |b: &mut BlockQ4_1, r| (b.d, b.m) = (r.f16(0.1), r.f16(1.0))),
        QuantType::Q5_0 => sanitize(&mut row, r, |b: &mut BlockQ5_0, r| b.d = r.f16(0.1)),
        QuantType::Q5_1 => sanitize(&mut row, r, |b: &mut BlockQ5_1, r| (b.d, b.m) = (r.f16(0.1), r.f16(1.0))),
        QuantType::Q8_0 => sanitize(&mut row, r, |b: &mut BlockQ8_0, r| b.d = r.f16(0.01)),
        QuantType::Q4K => sanitize(&mut row, r, |b: &mut BlockQ4K, r| (b.d, b.dmin) = (r.f16(0.01), r.f16(0.01))),
        QuantType::Q5K => sanitize(&mut row, r, |b: &mut BlockQ5K, r| (b.d, b.dmin) = (r.f16(0.01), r.f16(0.01))),
        QuantType::Q6K => sanitize(&mut row, r, |b: &mut BlockQ6K, r| b.d = r.f16(0.001)),
        QuantType::Q2K => sanitize(&mut row, r, |b: &mut BlockQ2K, r| (b.d, b.dmin) = (r.f16(0.01), r.f16(0.01))),
        QuantType::Q3K => sanitize(&mut row, r, |b: &mut BlockQ3K, r| b.d = r.f16(0.01)),
        QuantType::IQ4NL => sanitize(&mut row, r, |b: &mut BlockIQ4NL, r| b.d = r.f16(0.01)),
        QuantType::IQ4XS => sanitize(&mut row, r, |b: &mut BlockIQ4XS, r| b.d = r.f16(0.001)),
        QuantType::F32 | QuantType::F16 | QuantType::BF16 => unreachable!("handled above"),
    }
    row
}

#[test]
fn dot_row_matches_dequantize_then_dot() {
    let mut rng = Rng(SEED ^ 1);
    for ty in QuantType::ALL {
        // Odd lengths exercise the float path's tail; block formats take 1, 3 and 7 blocks.
        let lengths: Vec<usize> =
            if ty.block_elems() == 1 { vec![1, 15, 64, 131, 1000, 4099] } else { [1, 3, 7].iter().map(|b| b * ty.block_elems()).collect() };
        for n in lengths {
            let row = random_row(ty, n, &mut rng);
            let x = rng.vec(n);
            assert!(dequantized(ty, &row).iter().all(|v| v.is_finite()), "{ty}: non-finite test row");
            check_dot(ty, &row, &x, &format!("{ty} n={n}"));
            check_dot(ty, &misaligned(&row)[1..], &x, &format!("{ty} n={n} unaligned"));
        }
    }
}

#[test]
fn dot_row_of_empty_row_is_zero() {
    for ty in QuantType::ALL {
        assert_eq!(dot_row(ty, &[], &[]), Ok(0.0), "{ty}");
    }
}

#[test]
fn block_sizes_names_and_ids() {
    let table = [
        (QuantType::F32, "F32", 0, 1, 4),
        (QuantType::F16, "F16", 1, 1, 2),
        (QuantType::BF16, "BF16", 30, 1, 2),
        (QuantType::Q4_0, "Q4_0", 2, 32, 18),
        (QuantType::Q4_1, "Q4_1", 3, 32, 20),
        (QuantType::Q5_0, "Q5_0", 6, 32, 22),
        (QuantType::Q5_1, "Q5_1", 7, 32, 24),
        (QuantType::Q8_0, "Q8_0", 8, 32, 34),
        (QuantType::Q2K, "Q2_K", 10, 256, 84),
        (QuantType::Q3K, "Q3_K", 11, 256, 110),
        (QuantType::Q4K, "Q4_K", 12, 256, 144),
        (QuantType::Q5K, "Q5_K", 13, 256, 176),
        (QuantType::Q6K, "Q6_K", 14, 256, 210),
        (QuantType::IQ4NL, "IQ4_NL", 20, 32, 18),
        (QuantType::IQ4XS, "IQ4_XS", 23, 256, 136),
    ];
    assert_eq!(table.map(|t| t.0), QuantType::ALL);
    for (ty, name, id, elems, bytes) in table {
        assert_eq!(ty.name(), name);
        assert_eq!(ty.to_string(), name);
        assert_eq!(ty.ggml_id(), id, "{name}");
        assert_eq!(ty.block_elems(), elems, "{name}");
        assert_eq!(ty.block_bytes(), bytes, "{name}");
    }
}

#[test]
fn ggml_id_round_trips_and_unsupported_ids_are_none() {
    for ty in QuantType::ALL {
        assert_eq!(QuantType::from_ggml_id(ty.ggml_id()), Some(ty));
    }
    let supported: Vec<u32> = QuantType::ALL.iter().map(|ty| ty.ggml_id()).collect();
    // 4 and 5 were Q4_2/Q4_3; 9 Q8_1; 15 Q8_K; then the other IQ and the integer types.
    for id in (0..64).chain([u32::MAX]).filter(|id| !supported.contains(id)) {
        assert_eq!(QuantType::from_ggml_id(id), None, "id {id}");
    }
}

#[test]
fn bytes_for_whole_blocks_only() {
    assert_eq!(QuantType::Q4K.bytes_for(0), Some(0));
    assert_eq!(QuantType::Q4K.bytes_for(512), Some(288));
    assert_eq!(QuantType::Q6K.bytes_for(4096 * 256), Some(4096 * 210));
    assert_eq!(QuantType::Q8_0.bytes_for(96), Some(102));
    assert_eq!(QuantType::Q3K.bytes_for(3 * 256), Some(330));
    assert_eq!(QuantType::IQ4NL.bytes_for(64), Some(36));
    assert_eq!(QuantType::F32.bytes_for(7), Some(28));
    assert_eq!(QuantType::BF16.bytes_for(3), Some(6));
    assert_eq!(QuantType::Q4K.bytes_for(255), None);
    assert_eq!(QuantType::Q4_0.bytes_for(33), None);
    // Overflow needs more than one byte per element: F32, F16, BF16 and Q8_0 (34 B per 32).
    assert_eq!(QuantType::F32.bytes_for(u64::MAX), None);
    assert_eq!(QuantType::F16.bytes_for(u64::MAX / 2 + 1), None);
    assert_eq!(QuantType::Q8_0.bytes_for(u64::MAX / 32 * 32), None);
}

#[test]
fn length_mismatches_are_errors() {
    let ty = QuantType::Q4K;
    let block = random_row(ty, 256, &mut Rng(SEED ^ 2));
    let mut two = block.clone();
    two.extend_from_slice(&block);

    let mut out = vec![0.0; 256];
    assert!(matches!(dequantize(ty, &block[..143], &mut out), Err(QuantError::LengthMismatch { ty: QuantType::Q4K, bytes: 143, elems: 256, .. })));
    assert!(matches!(dequantize(ty, &two, &mut out), Err(QuantError::LengthMismatch { bytes: 288, .. })));
    assert!(matches!(dequantize(ty, &block, &mut out[..255]), Err(QuantError::PartialBlock { ty: QuantType::Q4K, elems: 255, block_elems: 256, .. })));
    assert!(matches!(dequantize(QuantType::F32, &[0; 7], &mut [0.0; 2]), Err(QuantError::LengthMismatch { .. })));
    assert_eq!(dequantize(ty, &[], &mut []), Ok(()));

    let x = vec![0.5; 256];
    assert!(matches!(dot_row(ty, &two, &x), Err(QuantError::LengthMismatch { op: "dot_row", .. })));
    assert!(matches!(dot_row(ty, &block, &x[..200]), Err(QuantError::PartialBlock { op: "dot_row", .. })));
    assert!(matches!(dot_row(QuantType::Q8_0, &[0; 34], &x[..31]), Err(QuantError::PartialBlock { elems: 31, block_elems: 32, .. })));
    assert!(dot_row(ty, &block, &x).is_ok());

    let msg = dequantize(ty, &block[..143], &mut out).unwrap_err().to_string();
    assert!(msg.contains("dequantize") && msg.contains("Q4_K") && msg.contains("143"), "{msg}");
}

//! Hand-built malformed GGUF files: each must be refused with its own error variant and never
//! panic, both in memory (`from_bytes`) and through a ranged source read in growing prefixes.

#[path = "common/gguf_writer.rs"]
mod gguf_writer;

use std::cell::RefCell;
use std::mem::discriminant;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::rc::Rc;

use flint_core::arch::{ArchError, ModelConfig};
use flint_core::gguf::{Array, ByteSource, GgufError, GgufFile, Value, MAX_ALIGNMENT, MAX_ARRAY_DEPTH};
use flint_core::quant::QuantType;
use flint_core::tokenizer::{Tokenizer, TokenizerError};
use futures::executor::block_on;
use futures::future::LocalBoxFuture;
use gguf_writer::{ggml, gguf_string, vt, GgufWriter, TensorSpec, Val, KEY_ALIGNMENT};

/// Longer than the reader's first ranged read (1 MiB), so a padded header takes several reads.
const FILLER_LEN: usize = 5 << 19;

// Harness

/// A source with no slice, like an HTTP range reader: every byte goes through `read_at`.
struct RangedSource {
    data: Vec<u8>,
    /// (offset, length) of every read, shared with the test after the source is moved in.
    reads: Rc<RefCell<Vec<(u64, usize)>>>,
}

impl ByteSource for RangedSource {
    fn len(&self) -> u64 {
        self.data.len() as u64
    }
    fn read_at<'a>(&'a self, offset: u64, buf: &'a mut [u8]) -> LocalBoxFuture<'a, Result<(), GgufError>> {
        self.reads.borrow_mut().push((offset, buf.len()));
        Box::pin(async move {
            let end = offset.checked_add(buf.len() as u64).filter(|&e| e <= self.len()).ok_or(GgufError::Truncated { what: "read", offset })?;
            buf.copy_from_slice(&self.data[offset as usize..end as usize]);
            Ok(())
        })
    }
}

/// Parses through `from_source` with a [`RangedSource`]; returns the reads it made.
fn open_ranged(data: Vec<u8>) -> (Result<GgufFile, GgufError>, Vec<(u64, usize)>) {
    let reads = Rc::new(RefCell::new(Vec::new()));
    let source = RangedSource { data, reads: reads.clone() };
    let res = block_on(GgufFile::from_source(Box::new(source)));
    let reads = reads.borrow().clone();
    (res, reads)
}

/// Reads the file `build` describes three ways: in memory, ranged, and ranged with a header
/// padded past the first read so the parser must stop and ask for a longer prefix.
fn read_all_ways(build: &dyn Fn() -> GgufWriter) -> Vec<(&'static str, Result<GgufFile, GgufError>)> {
    let plain = build().finish();
    let padded = build().filler(FILLER_LEN).finish();
    let (ranged, _) = open_ranged(plain.clone());
    let (ranged_padded, reads) = open_ranged(padded.clone());
    assert!(reads[0].1 < padded.len(), "the padded file's first read should be a prefix: {reads:?}");
    vec![("from_bytes", GgufFile::from_bytes(plain)), ("from_source", ranged), ("from_source, 2.5 MiB header", ranged_padded)]
}

/// Asserts that every way of reading the file fails with an error matching the pattern.
macro_rules! assert_rejects {
    ($build:expr, $pat:pat $(if $guard:expr)?) => {
        for (how, res) in read_all_ways(&$build) {
            match res {
                Err($pat) $(if $guard)? => {}
                Err(e) => panic!("{how}: expected {}, got {e:?}", stringify!($pat $(if $guard)?)),
                Ok(f) => panic!("{how}: expected {}, but the file parsed: {f:?}", stringify!($pat)),
            }
        }
    };
}

/// Parses the file every way, asserting success; for files that are valid but hold a key of the
/// wrong type, which only a typed accessor refuses.
fn parse_all_ways(build: impl Fn() -> GgufWriter) -> Vec<GgufFile> {
    read_all_ways(&build).into_iter().map(|(how, res)| res.unwrap_or_else(|e| panic!("{how}: expected a valid file, got {e:?}"))).collect()
}

/// A small valid file: one KV and one F32 tensor, the base most cases break one thing in.
fn base() -> GgufWriter {
    GgufWriter::new().kv("general.architecture", Val::string("llama")).tensor("a", &[32], ggml::F32)
}

/// A small valid file without tensors, so a malformed value can be the last thing in it.
fn base_kv_only() -> GgufWriter {
    GgufWriter::new().kv("general.architecture", Val::string("llama"))
}

fn quant(id: u32) -> QuantType {
    QuantType::from_ggml_id(id).expect("known ggml type")
}

// A valid file round-trips

const TOKENS: [&str; 6] = ["<unk>", "<s>", "</s>", "▁hi", "", "\u{1F600}"];
const SCORES: [f32; 6] = [0.0, -1.5, -2.25, 3.5e-3, f32::MIN_POSITIVE, -1e30];

/// Every value type, arrays of strings, f32, bool and arrays of (differently typed) arrays, and
/// tensors of F32, Q8_0 and Q4_K with a tensor-free gap between them.
fn rich_file(version: u32) -> GgufWriter {
    GgufWriter::new()
        .version(version)
        .kv("general.architecture", Val::string("llama"))
        .kv("general.name", Val::string("tiny ünïcode ✓"))
        .kv("t.u8", Val::u8(200))
        .kv("t.i8", Val::i8(-5))
        .kv("t.u16", Val::u16(65_000))
        .kv("t.i16", Val::i16(-30_000))
        .kv("t.u32", Val::u32(4_000_000_000))
        .kv("t.i32", Val::i32(-2_000_000_000))
        .kv("t.f32", Val::f32(0.125))
        .kv("t.bool", Val::bool(true))
        .kv("t.u64", Val::u64(u64::MAX))
        .kv("t.i64", Val::i64(i64::MIN))
        .kv("t.f64", Val::f64(-1.0e300))
        .kv("t.empty_string", Val::string(""))
        .kv("tokenizer.ggml.tokens", Val::str_array(&TOKENS))
        .kv("tokenizer.ggml.scores", Val::f32_array(&SCORES))
        .kv("tokenizer.ggml.token_type", Val::i32_array(&[2, 3, 3, 1, 1, 1]))
        .kv("t.bools", Val::array(vt::BOOL, &[Val::bool(false), Val::bool(true)]))
        .kv("t.empty_array", Val::u32_array(&[]))
        .kv("t.nested", Val::array(vt::ARRAY, &[Val::i32_array(&[1, -2, 3]), Val::str_array(&["x", "yz"]), Val::array(vt::ARRAY, &[Val::u8_array(&[9])])]))
        .tensor("token_embd.weight", &[8, 3], ggml::F32)
        .tensor("blk.0.attn_q.weight", &[64, 2], ggml::Q8_0)
        .tensor("output.weight", &[256, 2], ggml::Q4_K)
        .tensor("output_norm.weight", &[5], ggml::F32)
}

fn expected_values() -> Vec<(&'static str, Value)> {
    vec![
        ("general.architecture", Value::String("llama".into())),
        ("general.name", Value::String("tiny ünïcode ✓".into())),
        ("t.u8", Value::U8(200)),
        ("t.i8", Value::I8(-5)),
        ("t.u16", Value::U16(65_000)),
        ("t.i16", Value::I16(-30_000)),
        ("t.u32", Value::U32(4_000_000_000)),
        ("t.i32", Value::I32(-2_000_000_000)),
        ("t.f32", Value::F32(0.125)),
        ("t.bool", Value::Bool(true)),
        ("t.u64", Value::U64(u64::MAX)),
        ("t.i64", Value::I64(i64::MIN)),
        ("t.f64", Value::F64(-1.0e300)),
        ("t.empty_string", Value::String(String::new())),
        ("tokenizer.ggml.tokens", Value::Array(Array::String(TOKENS.iter().map(|s| s.to_string()).collect()))),
        ("tokenizer.ggml.scores", Value::Array(Array::F32(SCORES.to_vec()))),
        ("tokenizer.ggml.token_type", Value::Array(Array::I32(vec![2, 3, 3, 1, 1, 1]))),
        ("t.bools", Value::Array(Array::Bool(vec![false, true]))),
        ("t.empty_array", Value::Array(Array::U32(vec![]))),
        (
            "t.nested",
            Value::Array(Array::Array(vec![Array::I32(vec![1, -2, 3]), Array::String(vec!["x".into(), "yz".into()]), Array::Array(vec![Array::U8(vec![9])])])),
        ),
    ]
}

/// Checks a parsed file against the writer that built it: values, key order, tensor infos and
/// every tensor byte, read both as a slice (where the source has one) and through `read_at`.
fn check_round_trip(f: &GgufFile, w: &GgufWriter, version: u32, how: &str) {
    assert_eq!(f.version, version, "{how}");
    let expected = expected_values();
    for (key, value) in &expected {
        assert_eq!(f.metadata.get(key), Some(value), "{how}: {key}");
    }
    let keys: Vec<&str> = f.metadata.keys().filter(|k| *k != gguf_writer::KEY_FILLER).collect();
    assert_eq!(keys, expected.iter().map(|(k, _)| *k).collect::<Vec<_>>(), "{how}: key order");

    assert_eq!(f.metadata.str("general.architecture").unwrap(), "llama");
    assert_eq!(f.metadata.u32("t.u32").unwrap(), 4_000_000_000);
    assert_eq!(f.metadata.u32("t.u16").unwrap(), 65_000);
    assert_eq!(f.metadata.f32("t.f32").unwrap(), 0.125);
    assert_eq!(f.metadata.opt_bool("t.bool").unwrap(), Some(true));
    let tokens: Vec<&str> = f.metadata.str_array("tokenizer.ggml.tokens").unwrap().iter().map(|s| s.as_str()).collect();
    assert_eq!(tokens, TOKENS);
    assert_eq!(f.metadata.opt_f32_array("tokenizer.ggml.scores").unwrap(), Some(&SCORES[..]));
    assert_eq!(f.metadata.opt_i32_array("tokenizer.ggml.token_type").unwrap(), Some(&[2, 3, 3, 1, 1, 1][..]));
    assert_eq!(f.metadata.opt_str("absent.key").unwrap(), None);

    assert_eq!(f.alignment, 32, "{how}");
    assert_eq!(f.data_offset, w.data_offset(), "{how}");
    assert_eq!(f.tensors.len(), w.tensors.len(), "{how}");
    for ((t, spec), offset) in f.tensors.iter().zip(&w.tensors).zip(w.layout_offsets()) {
        let name = std::str::from_utf8(&spec.name).unwrap();
        assert_eq!(t.name, name, "{how}");
        assert_eq!(f.tensor(name).map(|x| &x.name), Some(&t.name), "{how}: index");
        assert_eq!(t.dims, spec.dims, "{how}: {name}");
        assert_eq!(t.ty, quant(spec.ty), "{how}: {name}");
        assert_eq!(t.offset, offset, "{how}: {name}");
        assert_eq!(t.n_elems, spec.dims.iter().product::<u64>(), "{how}: {name}");
        assert_eq!(t.n_bytes, spec.data.len() as u64, "{how}: {name}");
        assert_eq!(t.row_len(), spec.dims[0]);
        if let Some(bytes) = f.tensor_bytes(t) {
            assert_eq!(bytes, &spec.data[..], "{how}: {name} bytes");
        }
        let mut all = vec![0u8; t.n_bytes as usize];
        block_on(f.read_tensor_range(t, 0, &mut all)).unwrap();
        assert_eq!(all, spec.data, "{how}: {name} read_at");
        let mut tail = vec![0u8; 3];
        block_on(f.read_tensor_range(t, t.n_bytes - 3, &mut tail)).unwrap();
        assert_eq!(tail, spec.data[spec.data.len() - 3..], "{how}: {name} tail");
    }
    assert_eq!(f.tensor("blk.0.attn_q.weight").unwrap().n_bytes, 2 * 2 * 34);
    assert_eq!(f.tensor("output.weight").unwrap().n_bytes, 2 * 144);
    assert_eq!(f.tensor("token_embd.weight").unwrap().n_rows(), 3);
}

fn round_trip(version: u32) {
    let w = rich_file(version);
    for (how, res) in read_all_ways(&|| rich_file(version)) {
        let f = res.unwrap_or_else(|e| panic!("{how}: {e:?}"));
        if how.contains("2.5 MiB") {
            let padded = w.clone().filler(FILLER_LEN);
            assert_eq!(f.data_offset, padded.data_offset(), "{how}");
            check_round_trip(&f, &padded, version, how);
        } else {
            check_round_trip(&f, &w, version, how);
        }
    }
}

#[test]
fn valid_v3_file_round_trips_values_and_tensor_bytes() {
    round_trip(3);
}

#[test]
fn valid_v2_file_round_trips_values_and_tensor_bytes() {
    round_trip(2);
}

#[test]
fn ranged_reader_grows_its_prefix_until_the_header_fits() {
    let bytes = rich_file(3).filler(FILLER_LEN).finish();
    let (res, reads) = open_ranged(bytes.clone());
    res.unwrap();
    assert!(reads.len() >= 3, "expected several growing header reads, got {reads:?}");
    assert!(reads.iter().all(|&(offset, _)| offset == 0));
    assert!(reads.windows(2).all(|w| w[0].1 < w[1].1), "reads should grow: {reads:?}");
    assert!(reads.iter().all(|&(_, len)| len <= bytes.len()));
}

#[test]
fn empty_file_with_no_tensors_and_no_metadata_is_valid() {
    for f in parse_all_ways(GgufWriter::new) {
        assert!(f.tensors.is_empty());
        assert_eq!(f.alignment, 32);
    }
}

#[test]
fn alignment_1_and_64_are_honoured() {
    for a in [1u32, 64] {
        let build = || base().alignment_kv(a).tensor("b", &[3], ggml::F32).tensor("c", &[32], ggml::Q8_0);
        let w = build();
        for f in parse_all_ways(build) {
            assert_eq!(f.alignment, a as u64);
            let offsets: Vec<u64> = f.tensors.iter().map(|t| t.offset).collect();
            assert_eq!(offsets, w.layout_offsets());
            assert!(offsets.iter().all(|o| o % a as u64 == 0));
        }
    }
}

// Truncation

/// The only errors a prefix of a valid file may give: it ran out, or a count or length read
/// from it no longer fits what remains.
fn is_truncation_error(e: &GgufError) -> bool {
    matches!(e, GgufError::Truncated { .. } | GgufError::StringTooLong { .. } | GgufError::CountTooLarge { .. } | GgufError::TensorOutOfBounds { .. })
}

fn check_prefix(full: &[u8], len: usize) -> GgufError {
    let prefix = full[..len].to_vec();
    let sync =
        catch_unwind(AssertUnwindSafe(|| GgufFile::from_bytes(prefix.clone()))).unwrap_or_else(|_| panic!("from_bytes panicked on the {len}-byte prefix"));
    let e = match sync {
        Ok(_) => panic!("the {len}-byte prefix of a {}-byte file parsed", full.len()),
        Err(e) => e,
    };
    assert!(is_truncation_error(&e), "{len}-byte prefix: unexpected {e:?}");
    let ranged = catch_unwind(AssertUnwindSafe(|| open_ranged(prefix.clone()).0)).unwrap_or_else(|_| panic!("from_source panicked on the {len}-byte prefix"));
    let e2 = ranged.err().unwrap_or_else(|| panic!("from_source parsed the {len}-byte prefix"));
    assert_eq!(discriminant(&e), discriminant(&e2), "{len}-byte prefix: from_bytes {e:?}, from_source {e2:?}");
    e
}

#[test]
fn every_truncated_prefix_is_rejected() {
    for version in [2, 3] {
        let full = rich_file(version).finish();
        let mut seen = std::collections::BTreeMap::new();
        for len in 0..full.len() {
            let e = check_prefix(&full, len);
            *seen.entry(format!("{:?}", discriminant(&e))).or_insert(0) += 1;
            if let GgufError::Truncated { offset, .. } = e {
                assert!(offset <= len as u64, "{len}-byte prefix: Truncated at {offset}");
            }
        }
        // Each of the four kinds shows up somewhere in a file this varied.
        assert_eq!(seen.len(), 4, "error kinds seen: {seen:?}");
        assert!(GgufFile::from_bytes(full).is_ok());
    }
}

#[test]
fn truncated_prefixes_of_a_large_header_are_rejected_by_the_ranged_reader() {
    let w = rich_file(3).filler(FILLER_LEN);
    let full = w.finish();
    let header = w.header_len() as usize;
    let first_read = 1usize << 20;
    for len in
        [first_read - 1, first_read, first_read + 1, FILLER_LEN, FILLER_LEN + 40, header - 50, header - 1, header, w.data_offset() as usize, full.len() - 1]
    {
        check_prefix(&full, len);
    }
}

#[test]
fn empty_file_is_truncated() {
    assert!(matches!(GgufFile::from_bytes(Vec::new()), Err(GgufError::Truncated { offset: 0, .. })));
    assert!(matches!(open_ranged(Vec::new()).0, Err(GgufError::Truncated { offset: 0, .. })));
}

#[test]
fn metadata_count_one_past_the_pairs_present_is_truncated() {
    assert_rejects!(|| base_kv_only().n_kv(2), GgufError::Truncated { .. });
}

// Header

#[test]
fn bad_magic_is_rejected() {
    assert_rejects!(|| base().magic(*b"GGUG"), GgufError::BadMagic(m) if &m == b"GGUG");
}

#[test]
fn byte_swapped_magic_is_rejected() {
    assert_rejects!(|| base().magic(*b"FUGG"), GgufError::BadMagic(m) if &m == b"FUGG");
}

#[test]
fn version_0_is_rejected() {
    assert_rejects!(|| base().version(0), GgufError::UnsupportedVersion(0));
}

#[test]
fn version_1_is_rejected() {
    assert_rejects!(|| base().version(1), GgufError::UnsupportedVersion(1));
}

#[test]
fn version_4_is_rejected() {
    assert_rejects!(|| base().version(4), GgufError::UnsupportedVersion(4));
}

#[test]
fn big_endian_version_3_is_rejected() {
    assert_rejects!(|| base().version(3u32.swap_bytes()), GgufError::UnsupportedVersion(v) if v == 3 << 24);
}

#[test]
fn tensor_count_2_pow_32_is_rejected() {
    assert_rejects!(|| base().n_tensors(1 << 32), GgufError::CountTooLarge { count, .. } if count == 1 << 32);
}

#[test]
fn tensor_count_2_pow_63_is_rejected() {
    assert_rejects!(|| base().n_tensors(1 << 63), GgufError::CountTooLarge { count, .. } if count == 1 << 63);
}

#[test]
fn tensor_count_u64_max_is_rejected() {
    assert_rejects!(|| base().n_tensors(u64::MAX), GgufError::CountTooLarge { count: u64::MAX, .. });
}

#[test]
fn metadata_count_2_pow_32_is_rejected() {
    // The padded variant writes one more than asked, so compare with >=.
    assert_rejects!(|| base().n_kv(1 << 32), GgufError::CountTooLarge { count, .. } if count >= 1 << 32);
}

#[test]
fn metadata_count_2_pow_63_is_rejected() {
    assert_rejects!(|| base().n_kv(1 << 63), GgufError::CountTooLarge { count, .. } if count >= 1 << 63);
}

#[test]
fn metadata_count_u64_max_is_rejected() {
    assert_rejects!(|| base().n_kv(u64::MAX), GgufError::CountTooLarge { count: u64::MAX, .. });
}

// Strings and arrays

#[test]
fn key_length_past_the_end_is_rejected() {
    let mut raw = 1000u64.to_le_bytes().to_vec();
    raw.extend_from_slice(b"general.");
    assert_rejects!(|| base_kv_only().kv_raw(raw.clone()), GgufError::StringTooLong { len: 1000, .. });
}

#[test]
fn key_length_u64_max_is_rejected() {
    let raw = u64::MAX.to_le_bytes().to_vec();
    assert_rejects!(|| base().kv_raw(raw.clone()), GgufError::StringTooLong { len: u64::MAX, .. });
}

#[test]
fn string_value_length_past_the_end_is_rejected() {
    assert_rejects!(|| base_kv_only().kv("general.name", Val::string_claiming(1000, b"abc")), GgufError::StringTooLong { len: 1000, .. });
}

#[test]
fn string_value_length_past_the_end_with_tensors_after_it_is_rejected() {
    // The tensor infos and data that follow do not make 2^40 bytes fit.
    assert_rejects!(
        || base().kv("general.name", Val::string_claiming(1 << 40, b"abc")),
        GgufError::StringTooLong { len, .. } if len == 1 << 40
    );
}

#[test]
fn string_value_length_u64_max_is_rejected() {
    assert_rejects!(|| base().kv("general.name", Val::string_claiming(u64::MAX, b"abc")), GgufError::StringTooLong { len: u64::MAX, .. });
}

#[test]
fn array_length_past_the_end_is_rejected() {
    assert_rejects!(
        || base().kv("a", Val::array_claiming(vt::U32, 1 << 40, vec![1, 0, 0, 0])),
        GgufError::CountTooLarge { count, .. } if count == 1 << 40
    );
}

#[test]
fn array_length_one_past_the_elements_present_is_rejected() {
    // Three u32 claimed, two present, nothing after: 12 bytes do not fit in 8.
    assert_rejects!(|| base_kv_only().kv("a", Val::array_claiming(vt::U32, 3, vec![1, 0, 0, 0, 2, 0, 0, 0])), GgufError::CountTooLarge { count: 3, .. });
}

#[test]
fn byte_array_length_u64_max_is_rejected() {
    assert_rejects!(|| base().kv("a", Val::array_claiming(vt::U8, u64::MAX, vec![1, 2, 3])), GgufError::CountTooLarge { count: u64::MAX, .. });
}

#[test]
fn string_array_length_whose_byte_size_overflows_is_rejected() {
    // 2^61 strings of at least 8 bytes each is 2^64 bytes: the bound must not wrap.
    assert_rejects!(
        || base().kv("a", Val::array_claiming(vt::STRING, 1 << 61, gguf_string(b"x"))),
        GgufError::CountTooLarge { count, .. } if count == 1 << 61
    );
}

#[test]
fn string_inside_an_array_running_past_the_end_is_rejected() {
    let mut payload = gguf_string(b"ok");
    payload.extend_from_slice(&999u64.to_le_bytes());
    payload.extend_from_slice(b"x");
    assert_rejects!(
        || base_kv_only().kv("tokenizer.ggml.tokens", Val::array_claiming(vt::STRING, 2, payload.clone())),
        GgufError::StringTooLong { len: 999, .. }
    );
}

#[test]
fn arrays_nested_256_deep_are_rejected() {
    assert_rejects!(|| base().kv("deep", Val::nested(256)), GgufError::NestingTooDeep { max: MAX_ARRAY_DEPTH, .. });
}

#[test]
fn arrays_nested_one_past_the_limit_are_rejected() {
    assert_rejects!(|| base().kv("deep", Val::nested(MAX_ARRAY_DEPTH + 1)), GgufError::NestingTooDeep { max: MAX_ARRAY_DEPTH, .. });
}

#[test]
fn arrays_nested_to_the_limit_parse() {
    for f in parse_all_ways(|| base().kv("deep", Val::nested(MAX_ARRAY_DEPTH))) {
        let mut a = match f.metadata.get("deep") {
            Some(Value::Array(a)) => a,
            v => panic!("deep: {v:?}"),
        };
        let mut levels = 1;
        while let Array::Array(inner) = a {
            a = &inner[0];
            levels += 1;
        }
        assert_eq!(levels, MAX_ARRAY_DEPTH);
        assert_eq!(a, &Array::U8(vec![7]));
    }
}

#[test]
fn value_type_13_is_rejected() {
    assert_rejects!(|| base().kv("a", Val::raw(13, vec![0; 8])), GgufError::BadValueType { id: 13, .. });
}

#[test]
fn value_type_u32_max_is_rejected() {
    assert_rejects!(|| base().kv("a", Val::raw(u32::MAX, vec![0; 8])), GgufError::BadValueType { id: u32::MAX, .. });
}

#[test]
fn array_element_type_13_is_rejected() {
    assert_rejects!(|| base().kv("a", Val::array_claiming(13, 1, vec![0; 8])), GgufError::BadValueType { id: 13, .. });
}

#[test]
fn empty_key_is_rejected() {
    assert_rejects!(|| base().kv("", Val::u32(1)), GgufError::EmptyKey { .. });
}

#[test]
fn duplicate_key_is_rejected() {
    assert_rejects!(
        || base().kv("llama.block_count", Val::u32(1)).kv("llama.block_count", Val::u32(2)),
        GgufError::DuplicateKey(k) if k == "llama.block_count"
    );
}

#[test]
fn duplicate_key_with_a_different_type_is_rejected() {
    assert_rejects!(
        || base().kv("general.architecture", Val::u32(7)),
        GgufError::DuplicateKey(k) if k == "general.architecture"
    );
}

#[test]
fn bool_byte_2_is_rejected() {
    assert_rejects!(|| base().kv("b", Val::bool_byte(2)), GgufError::BadBool { byte: 2, .. });
}

#[test]
fn bool_byte_255_in_an_array_is_rejected() {
    assert_rejects!(|| base().kv("b", Val::array(vt::BOOL, &[Val::bool(true), Val::bool_byte(255)])), GgufError::BadBool { byte: 255, .. });
}

#[test]
fn invalid_utf8_in_a_key_is_rejected() {
    assert_rejects!(|| base().kv_raw_key(b"general.\xff", Val::u32(1)), GgufError::InvalidUtf8 { .. });
}

#[test]
fn invalid_utf8_in_a_string_value_is_rejected() {
    // An overlong encoding of '/', which lenient decoders have turned into path traversal.
    assert_rejects!(|| base().kv("general.name", Val::string_bytes(b"a\xc0\xafb")), GgufError::InvalidUtf8 { .. });
}

#[test]
fn utf16_surrogate_in_a_vocabulary_string_is_rejected() {
    assert_rejects!(
        || base().kv("tokenizer.ggml.tokens", Val::array(vt::STRING, &[Val::string("a"), Val::string_bytes(b"\xed\xa0\x80")])),
        GgufError::InvalidUtf8 { .. }
    );
}

#[test]
fn invalid_utf8_in_a_tensor_name_is_rejected() {
    let mut t = TensorSpec::new("b", &[32], ggml::F32);
    t.name = b"blk.\xfe.attn_q.weight".to_vec();
    assert_rejects!(|| base().tensor_spec(t.clone()), GgufError::InvalidUtf8 { .. });
}

// Alignment

#[test]
fn alignment_zero_is_rejected() {
    assert_rejects!(|| base().alignment_kv(0), GgufError::BadAlignment(0));
}

#[test]
fn alignment_3_is_rejected() {
    assert_rejects!(|| base().alignment_kv(3), GgufError::BadAlignment(3));
}

#[test]
fn alignment_2_pow_31_is_rejected() {
    // Written without laying the data out at 2 GiB alignment.
    assert_rejects!(|| base().kv(KEY_ALIGNMENT, Val::u32(1 << 31)), GgufError::BadAlignment(a) if a == 1 << 31);
}

#[test]
fn alignment_just_past_the_maximum_is_rejected() {
    let a = MAX_ALIGNMENT * 2;
    assert_rejects!(|| base().kv(KEY_ALIGNMENT, Val::u32(a as u32)), GgufError::BadAlignment(x) if x == a);
}

#[test]
fn alignment_stored_as_u64_is_rejected() {
    assert_rejects!(
        || base().kv(KEY_ALIGNMENT, Val::u64(32)),
        GgufError::WrongType { key, .. } if key == KEY_ALIGNMENT
    );
}

#[test]
fn alignment_stored_as_string_is_rejected() {
    assert_rejects!(
        || base().kv(KEY_ALIGNMENT, Val::string("32")),
        GgufError::WrongType { key, .. } if key == KEY_ALIGNMENT
    );
}

// Tensor infos

fn tensor_with(name: &str, dims: &[u64], ty: u32) -> TensorSpec {
    // Impossible shapes get no data; the parser must refuse them before looking for any.
    TensorSpec::with_data(name, dims, ty, Vec::new())
}

#[test]
fn duplicate_tensor_names_are_rejected() {
    assert_rejects!(|| base().tensor("a", &[32], ggml::F32), GgufError::DuplicateTensor(n) if n == "a");
}

#[test]
fn empty_tensor_name_is_rejected() {
    assert_rejects!(|| base().tensor("", &[32], ggml::F32), GgufError::EmptyTensorName { index: 1 });
}

#[test]
fn zero_dimensions_are_rejected() {
    let mut t = TensorSpec::with_data("b", &[], ggml::F32, vec![0; 4]);
    t.n_dims = Some(0);
    assert_rejects!(|| base().tensor_spec(t.clone()), GgufError::BadDimCount { n_dims: 0, .. });
}

#[test]
fn five_dimensions_are_rejected() {
    assert_rejects!(|| base().tensor_spec(tensor_with("b", &[32, 1, 1, 1, 1], ggml::F32)), GgufError::BadDimCount { n_dims: 5, .. });
}

#[test]
fn dimension_count_u32_max_is_rejected() {
    let mut t = tensor_with("b", &[32], ggml::F32);
    t.n_dims = Some(u32::MAX);
    assert_rejects!(|| base().tensor_spec(t.clone()), GgufError::BadDimCount { n_dims: u32::MAX, .. });
}

#[test]
fn dimension_of_zero_is_rejected() {
    assert_rejects!(|| base().tensor_spec(tensor_with("b", &[32, 0], ggml::F32)), GgufError::BadDim { dim: 0, .. });
}

#[test]
fn dimension_of_i64_max_overflows_the_byte_size() {
    // i64::MAX is a legal dimension, but i64::MAX f32 values do not fit in u64 bytes.
    let max = i64::MAX as u64;
    assert_rejects!(|| base().tensor_spec(tensor_with("b", &[max], ggml::F32)), GgufError::SizeOverflow { .. });
}

#[test]
fn dimension_of_2_pow_63_is_rejected() {
    assert_rejects!(
        || base().tensor_spec(tensor_with("b", &[32, 1 << 63], ggml::F32)),
        GgufError::BadDim { dim, .. } if dim == 1 << 63
    );
}

#[test]
fn dimension_of_u64_max_is_rejected() {
    assert_rejects!(|| base().tensor_spec(tensor_with("b", &[u64::MAX, 2], ggml::F32)), GgufError::BadDim { dim: u64::MAX, .. });
}

#[test]
fn element_count_overflowing_u64_is_rejected() {
    assert_rejects!(|| base().tensor_spec(tensor_with("b", &[1 << 32, 1 << 32], ggml::F32)), GgufError::SizeOverflow { .. });
}

#[test]
fn element_count_past_i64_max_is_rejected() {
    assert_rejects!(|| base().tensor_spec(tensor_with("b", &[1 << 32, 1 << 31], ggml::F16)), GgufError::SizeOverflow { .. });
}

#[test]
fn byte_size_overflowing_u64_is_rejected() {
    // 2^62 elements is a legal count; 2^62 f32 is 2^64 bytes.
    assert_rejects!(|| base().tensor_spec(tensor_with("b", &[1 << 32, 1 << 30], ggml::F32)), GgufError::SizeOverflow { .. });
}

#[test]
fn huge_but_representable_tensor_is_out_of_bounds() {
    // 2^62 Q8_0 elements need about 2^62 bytes: no overflow, just far past the end of the file.
    assert_rejects!(|| base().tensor_spec(tensor_with("b", &[1 << 32, 1 << 30], ggml::Q8_0)), GgufError::TensorOutOfBounds { .. });
}

#[test]
fn offset_plus_size_overflowing_u64_is_rejected() {
    let mut t = TensorSpec::new("b", &[16], ggml::F32);
    t.offset = Some(u64::MAX - 31); // a multiple of 32, so only the end overflows
    assert_rejects!(|| base().tensor_spec(t.clone()), GgufError::SizeOverflow { tensor } if tensor == "b");
}

#[test]
fn unknown_tensor_type_99_is_rejected() {
    assert_rejects!(|| base().tensor_spec(tensor_with("b", &[32], 99)), GgufError::UnknownTensorType { id: 99, .. });
}

#[test]
fn removed_tensor_type_q4_2_is_rejected() {
    assert_rejects!(|| base().tensor_spec(tensor_with("b", &[32], 4)), GgufError::UnknownTensorType { id: 4, .. });
}

#[test]
fn tensor_type_u32_max_is_rejected() {
    assert_rejects!(|| base().tensor_spec(tensor_with("b", &[32], u32::MAX)), GgufError::UnknownTensorType { id: u32::MAX, .. });
}

#[test]
fn q8_0_row_not_a_multiple_of_32_is_rejected() {
    assert_rejects!(|| base().tensor("b", &[48, 2], ggml::Q8_0), GgufError::RowNotBlockAligned { row: 48, block: 32, .. });
}

#[test]
fn q4_k_row_of_128_is_rejected_even_when_the_total_is_a_whole_block() {
    assert_rejects!(|| base().tensor("b", &[128, 2], ggml::Q4_K), GgufError::RowNotBlockAligned { row: 128, block: 256, .. });
}

#[test]
fn tensor_data_past_the_end_of_file_is_rejected() {
    // A 256-byte tensor with only 100 bytes before the file ends.
    let t = TensorSpec::with_data("b", &[64], ggml::F32, vec![1; 100]);
    assert_rejects!(
        || base().tensor_spec(t.clone()),
        GgufError::TensorOutOfBounds { tensor, start: 128, end: 384, len: 228 } if tensor == "b"
    );
}

#[test]
fn tensor_offset_past_the_end_of_file_is_rejected() {
    let mut t = TensorSpec::new("b", &[32], ggml::F32);
    t.offset = Some(1 << 40);
    assert_rejects!(|| base().tensor_spec(t.clone()), GgufError::TensorOutOfBounds { start, .. } if start == 1 << 40);
}

#[test]
fn overlapping_tensors_are_rejected() {
    // Two 128-byte tensors, the second declared to start halfway through the first.
    let mut t = TensorSpec::new("b", &[32], ggml::F32);
    t.offset = Some(64);
    assert_rejects!(|| base().tensor_spec(t.clone()), GgufError::TensorOverlap { a, b } if a == "a" && b == "b");
}

#[test]
fn tensors_at_the_same_offset_are_rejected() {
    let mut t = TensorSpec::new("b", &[32], ggml::F32);
    t.offset = Some(0);
    assert_rejects!(|| base().tensor_spec(t.clone()), GgufError::TensorOverlap { .. });
}

#[test]
fn misaligned_tensor_offset_is_rejected() {
    let mut t = TensorSpec::new("b", &[32], ggml::F32);
    t.offset = Some(136);
    assert_rejects!(|| base().tensor_spec(t.clone()), GgufError::TensorMisaligned { offset: 136, alignment: 32, .. });
}

#[test]
fn offset_aligned_to_32_but_not_to_the_declared_64_is_rejected() {
    let mut t = TensorSpec::new("b", &[32], ggml::F32);
    t.offset = Some(160);
    assert_rejects!(|| base().alignment_kv(64).tensor_spec(t.clone()), GgufError::TensorMisaligned { offset: 160, alignment: 64, .. });
}

#[test]
fn missing_tensor_is_reported() {
    for f in parse_all_ways(base) {
        assert!(f.require_tensor("a").is_ok());
        assert!(matches!(f.require_tensor("output.weight"), Err(GgufError::MissingTensor(n)) if n == "output.weight"));
    }
}

#[test]
fn tensor_range_read_past_the_tensor_is_rejected() {
    for f in parse_all_ways(base) {
        let t = f.tensor("a").unwrap().clone();
        let mut buf = [0u8; 8];
        let res = block_on(f.read_tensor_range(&t, t.n_bytes - 4, &mut buf));
        assert!(matches!(res, Err(GgufError::TensorOutOfBounds { start: 124, end: 132, len: 128, .. })), "{res:?}");
    }
}

#[test]
fn tensor_range_read_at_u64_max_is_rejected_without_overflow() {
    for f in parse_all_ways(base) {
        let t = f.tensor("a").unwrap().clone();
        let mut buf = [0u8; 8];
        let res = catch_unwind(AssertUnwindSafe(|| block_on(f.read_tensor_range(&t, u64::MAX, &mut buf))))
            .unwrap_or_else(|_| panic!("read_tensor_range panicked on start = u64::MAX"));
        // The reported range must not wrap around (a release build would otherwise say [2^64-1, 7)).
        assert!(matches!(res, Err(GgufError::TensorOutOfBounds { start, end, .. }) if end >= start), "{res:?}");
    }
}

// Keys the engine reads, stored with the wrong type

#[test]
fn scores_stored_as_i8_array_are_the_wrong_type() {
    for f in parse_all_ways(|| base().kv("tokenizer.ggml.scores", Val::i8_array(&[1, -2, 3]))) {
        let e = f.metadata.opt_f32_array("tokenizer.ggml.scores").unwrap_err();
        assert!(matches!(&e, GgufError::WrongType { key, got, .. } if key == "tokenizer.ggml.scores" && got == "array<i8>"), "{e:?}");
    }
}

#[test]
fn architecture_stored_as_u32_is_the_wrong_type() {
    for f in parse_all_ways(|| GgufWriter::new().kv("general.architecture", Val::u32(1))) {
        let e = f.metadata.str("general.architecture").unwrap_err();
        assert!(matches!(&e, GgufError::WrongType { key, got, .. } if key == "general.architecture" && got == "u32"), "{e:?}");
    }
}

#[test]
fn u32_key_stored_as_string_is_the_wrong_type() {
    for f in parse_all_ways(|| base().kv("llama.block_count", Val::string("32"))) {
        let e = f.metadata.u32("llama.block_count").unwrap_err();
        assert!(matches!(&e, GgufError::WrongType { key, got, .. } if key == "llama.block_count" && got == "string"), "{e:?}");
    }
}

#[test]
fn u32_key_stored_as_a_negative_i32_is_the_wrong_type() {
    for f in parse_all_ways(|| base().kv("llama.context_length", Val::i32(-1))) {
        let e = f.metadata.u32("llama.context_length").unwrap_err();
        assert!(matches!(&e, GgufError::WrongType { .. }), "{e:?}");
    }
}

#[test]
fn u32_key_holding_a_u64_past_u32_max_is_an_invalid_value() {
    for f in parse_all_ways(|| base().kv("llama.context_length", Val::u64(1 << 32))) {
        let e = f.metadata.u32("llama.context_length").unwrap_err();
        assert!(matches!(&e, GgufError::InvalidValue { key, .. } if key == "llama.context_length"), "{e:?}");
    }
}

#[test]
fn f32_key_stored_as_u32_is_the_wrong_type() {
    for f in parse_all_ways(|| base().kv("llama.attention.layer_norm_rms_epsilon", Val::u32(1))) {
        let e = f.metadata.f32("llama.attention.layer_norm_rms_epsilon").unwrap_err();
        assert!(matches!(&e, GgufError::WrongType { .. }), "{e:?}");
    }
}

#[test]
fn tokens_stored_as_i32_array_are_the_wrong_type() {
    for f in parse_all_ways(|| base().kv("tokenizer.ggml.tokens", Val::i32_array(&[1, 2]))) {
        let e = f.metadata.str_array("tokenizer.ggml.tokens").unwrap_err();
        assert!(matches!(&e, GgufError::WrongType { got, .. } if got == "array<i32>"), "{e:?}");
    }
}

#[test]
fn missing_required_key_is_reported() {
    for f in parse_all_ways(base) {
        let e = f.metadata.u32("llama.block_count").unwrap_err();
        assert!(matches!(&e, GgufError::MissingKey(k) if k == "llama.block_count"), "{e:?}");
        assert_eq!(f.metadata.opt_u32("llama.block_count").unwrap(), None);
    }
}

// Tokenizer: special token ids outside the vocabulary

const TINY_TOKENS: [&str; 8] = ["<unk>", "<s>", "</s>", "\u{2581}", "a", "b", "\u{2581}a", "ab"];

/// A tiny llama (SentencePiece) vocabulary of eight tokens.
fn with_spm_vocab(w: GgufWriter) -> GgufWriter {
    w.kv("tokenizer.ggml.model", Val::string("llama"))
        .kv("tokenizer.ggml.tokens", Val::str_array(&TINY_TOKENS))
        .kv("tokenizer.ggml.scores", Val::f32_array(&[0.0, 0.0, 0.0, -1.0, -2.0, -3.0, -0.5, -0.75]))
        .kv("tokenizer.ggml.token_type", Val::i32_array(&[2, 3, 3, 1, 1, 1, 1, 1]))
}

fn spm_vocab() -> GgufWriter {
    with_spm_vocab(GgufWriter::new().kv("general.architecture", Val::string("llama")))
}

fn tokenizer_errors(build: impl Fn() -> GgufWriter) -> Vec<TokenizerError> {
    parse_all_ways(build).iter().map(|f| Tokenizer::from_metadata(&f.metadata).expect_err("the tokenizer should refuse this vocabulary")).collect()
}

#[test]
fn tiny_spm_vocabulary_builds_a_tokenizer() {
    for f in parse_all_ways(|| spm_vocab().kv("tokenizer.ggml.bos_token_id", Val::u32(1))) {
        let tk = Tokenizer::from_metadata(&f.metadata).unwrap();
        assert_eq!(tk.vocab_size(), TINY_TOKENS.len());
        assert_eq!(tk.bos_id(), Some(1));
    }
}

#[test]
fn bos_token_id_equal_to_the_vocab_size_is_out_of_range() {
    for e in tokenizer_errors(|| spm_vocab().kv("tokenizer.ggml.bos_token_id", Val::u32(8))) {
        assert!(matches!(&e, TokenizerError::SpecialTokenOutOfRange { key, id: 8, vocab: 8 } if key == "tokenizer.ggml.bos_token_id"), "{e:?}");
    }
}

#[test]
fn eos_token_id_u32_max_is_out_of_range() {
    for e in tokenizer_errors(|| spm_vocab().kv("tokenizer.ggml.eos_token_id", Val::u32(u32::MAX))) {
        assert!(matches!(&e, TokenizerError::SpecialTokenOutOfRange { id: u32::MAX, vocab: 8, .. }), "{e:?}");
    }
}

#[test]
fn padding_token_id_past_the_vocab_is_out_of_range() {
    for e in tokenizer_errors(|| spm_vocab().kv("tokenizer.ggml.padding_token_id", Val::u32(100))) {
        assert!(matches!(&e, TokenizerError::SpecialTokenOutOfRange { key, id: 100, .. } if key == "tokenizer.ggml.padding_token_id"), "{e:?}");
    }
}

#[test]
fn tokenizer_scores_stored_as_i8_array_are_the_wrong_type() {
    let build = || {
        let mut w = spm_vocab();
        let scores = Val::i8_array(&[0, 0, 0, -1, -2, -3, -1, -1]);
        for kv in &mut w.kvs {
            if let gguf_writer::KvEntry::Pair(k, v) = kv {
                if k == b"tokenizer.ggml.scores" {
                    *v = scores.clone();
                }
            }
        }
        w
    };
    for e in tokenizer_errors(build) {
        assert!(matches!(&e, TokenizerError::Gguf(GgufError::WrongType { key, got, .. }) if key == "tokenizer.ggml.scores" && got == "array<i8>"), "{e:?}");
    }
}

// Architecture: tensor shapes the metadata does not imply

const N_EMBD: u64 = 32;
const N_FF: u64 = 64;
const N_VOCAB: u64 = TINY_TOKENS.len() as u64;

/// Every tensor of a one-layer model (n_embd 32, two heads, n_ff 64) in ggml order.
fn tiny_model_tensors(arch: &str) -> Vec<(String, Vec<u64>)> {
    let (e, ff, v) = (N_EMBD, N_FF, N_VOCAB);
    let mut t: Vec<(&str, Vec<u64>)> = vec![
        ("token_embd.weight", vec![e, v]),
        ("output_norm.weight", vec![e]),
        ("output.weight", vec![e, v]),
        ("blk.0.attn_norm.weight", vec![e]),
        ("blk.0.attn_q.weight", vec![e, e]),
        ("blk.0.attn_k.weight", vec![e, e]),
        ("blk.0.attn_v.weight", vec![e, e]),
        ("blk.0.attn_output.weight", vec![e, e]),
        ("blk.0.ffn_norm.weight", vec![e]),
        ("blk.0.ffn_gate.weight", vec![e, ff]),
        ("blk.0.ffn_up.weight", vec![e, ff]),
        ("blk.0.ffn_down.weight", vec![ff, e]),
    ];
    if arch == "qwen2" {
        t.extend([("blk.0.attn_q.bias", vec![e]), ("blk.0.attn_k.bias", vec![e]), ("blk.0.attn_v.bias", vec![e])]);
    }
    t.into_iter().map(|(n, d)| (n.to_string(), d)).collect()
}

/// A tiny valid model of `arch` whose tensor shapes pass through `edit` (None leaves one out).
fn tiny_model(arch: &str, edit: impl Fn(&str, Vec<u64>) -> Option<Vec<u64>>) -> GgufWriter {
    let key = |name: &str| format!("{arch}.{name}");
    let mut w = with_spm_vocab(GgufWriter::new().kv("general.architecture", Val::string(arch)))
        .kv(&key("embedding_length"), Val::u32(N_EMBD as u32))
        .kv(&key("block_count"), Val::u32(1))
        .kv(&key("attention.head_count"), Val::u32(2))
        .kv(&key("attention.head_count_kv"), Val::u32(2))
        .kv(&key("feed_forward_length"), Val::u32(N_FF as u32))
        .kv(&key("context_length"), Val::u32(128))
        .kv(&key("attention.layer_norm_rms_epsilon"), Val::f32(1e-6))
        .kv(&key("rope.freq_base"), Val::f32(10_000.0));
    for (name, dims) in tiny_model_tensors(arch) {
        if let Some(dims) = edit(&name, dims) {
            w = w.tensor_spec(TensorSpec::f32_seeded(&name, &dims));
        }
    }
    w
}

fn keep(_: &str, dims: Vec<u64>) -> Option<Vec<u64>> {
    Some(dims)
}

/// The model with one tensor's shape replaced.
fn reshaped(arch: &str, tensor: &'static str, shape: &'static [u64]) -> GgufWriter {
    tiny_model(arch, move |name, dims| Some(if name == tensor { shape.to_vec() } else { dims }))
}

/// The model with one tensor left out.
fn without(arch: &str, tensor: &'static str) -> GgufWriter {
    tiny_model(arch, move |name, dims| (name != tensor).then_some(dims))
}

fn arch_errors(build: impl Fn() -> GgufWriter) -> Vec<ArchError> {
    parse_all_ways(build).iter().map(|f| ModelConfig::from_gguf(f).expect_err("the architecture check should refuse this model")).collect()
}

macro_rules! assert_arch_rejects {
    ($build:expr, $pat:pat $(if $guard:expr)?) => {
        for e in arch_errors($build) {
            match e {
                $pat $(if $guard)? => {}
                e => panic!("expected {}, got {e:?}", stringify!($pat $(if $guard)?)),
            }
        }
    };
}

#[test]
fn tiny_llama_model_passes_the_architecture_checks() {
    for f in parse_all_ways(|| tiny_model("llama", keep)) {
        let c = ModelConfig::from_gguf(&f).unwrap();
        assert_eq!((c.n_vocab, c.n_embd, c.n_layer, c.n_head, c.n_head_kv, c.head_dim, c.n_ff), (8, 32, 1, 2, 2, 16, 64));
        assert!(!c.tied_output && !c.qkv_bias);
        assert!(Tokenizer::from_metadata(&f.metadata).is_ok());
    }
}

#[test]
fn tiny_qwen2_model_passes_the_architecture_checks() {
    for f in parse_all_ways(|| tiny_model("qwen2", keep)) {
        let c = ModelConfig::from_gguf(&f).unwrap();
        assert!(c.qkv_bias);
        assert_eq!(c.q_dim(), 32);
    }
}

#[test]
fn tiny_llama_model_with_tied_output_passes_the_architecture_checks() {
    for f in parse_all_ways(|| without("llama", "output.weight")) {
        assert!(ModelConfig::from_gguf(&f).unwrap().tied_output);
    }
}

#[test]
fn attn_q_with_the_wrong_shape_is_a_shape_mismatch() {
    for arch in ["llama", "qwen2"] {
        assert_arch_rejects!(
            || reshaped(arch, "blk.0.attn_q.weight", &[32, 16]),
            ArchError::ShapeMismatch { tensor, expected, got }
                if tensor == "blk.0.attn_q.weight" && expected == [32, 32] && got == [32, 16]
        );
    }
}

#[test]
fn transposed_ffn_down_is_a_shape_mismatch() {
    assert_arch_rejects!(
        || reshaped("llama", "blk.0.ffn_down.weight", &[32, 64]),
        ArchError::ShapeMismatch { tensor, expected, got }
            if tensor == "blk.0.ffn_down.weight" && expected == [64, 32] && got == [32, 64]
    );
}

#[test]
fn attn_k_with_an_extra_unit_dimension_is_a_shape_mismatch() {
    assert_arch_rejects!(
        || reshaped("llama", "blk.0.attn_k.weight", &[32, 32, 1]),
        ArchError::ShapeMismatch { tensor, .. } if tensor == "blk.0.attn_k.weight"
    );
}

#[test]
fn output_with_a_different_vocabulary_is_a_shape_mismatch() {
    assert_arch_rejects!(
        || reshaped("llama", "output.weight", &[32, 7]),
        ArchError::ShapeMismatch { tensor, expected, .. } if tensor == "output.weight" && expected == [32, 8]
    );
}

#[test]
fn qwen2_bias_with_the_wrong_length_is_a_shape_mismatch() {
    assert_arch_rejects!(
        || reshaped("qwen2", "blk.0.attn_v.bias", &[16]),
        ArchError::ShapeMismatch { tensor, .. } if tensor == "blk.0.attn_v.bias"
    );
}

#[test]
fn one_dimensional_token_embedding_is_a_shape_mismatch() {
    assert_arch_rejects!(
        || reshaped("llama", "token_embd.weight", &[256]),
        ArchError::ShapeMismatch { tensor, .. } if tensor == "token_embd.weight"
    );
}

#[test]
fn missing_ffn_up_is_a_missing_tensor() {
    assert_arch_rejects!(|| without("llama", "blk.0.ffn_up.weight"), ArchError::MissingTensor(n) if n == "blk.0.ffn_up.weight");
}

#[test]
fn missing_token_embedding_is_a_missing_tensor() {
    assert_arch_rejects!(|| without("llama", "token_embd.weight"), ArchError::MissingTensor(n) if n == "token_embd.weight");
}

#[test]
fn qwen2_without_its_q_bias_is_a_missing_tensor() {
    assert_arch_rejects!(|| without("qwen2", "blk.0.attn_q.bias"), ArchError::MissingTensor(n) if n == "blk.0.attn_q.bias");
}

#[test]
fn embedding_rows_disagreeing_with_the_token_list_are_invalid() {
    let build = || tiny_model("llama", |name, dims| Some(if name.ends_with("token_embd.weight") || name == "output.weight" { vec![32, 9] } else { dims }));
    assert_arch_rejects!(build, ArchError::Invalid { key, .. } if key == "tokenizer.ggml.tokens");
}

#[test]
fn block_count_stored_as_string_is_the_wrong_type() {
    let build = || tiny_model("llama", keep).kv("llama.block_count", Val::string("1"));
    // A duplicate key: the reader refuses the file before the architecture sees it.
    assert_rejects!(build, GgufError::DuplicateKey(k) if k == "llama.block_count");
    let build = || {
        let mut w = tiny_model("llama", keep);
        for kv in &mut w.kvs {
            if let gguf_writer::KvEntry::Pair(k, v) = kv {
                if k == b"llama.block_count" {
                    *v = Val::string("1");
                }
            }
        }
        w
    };
    assert_arch_rejects!(build, ArchError::Gguf(GgufError::WrongType { key, .. }) if key == "llama.block_count");
}

#[test]
fn unknown_architecture_is_unsupported() {
    assert_arch_rejects!(|| tiny_model("mamba", keep), ArchError::Unsupported(a) if a == "mamba");
}

//! A small GGUF writer for tests: builds files byte by byte, valid by default, malformed on request.
//!
//! Every count, length, type id, dimension and offset the format stores can be overridden, so a
//! test produces exactly the malformation it names and nothing else. Include it from a test with
//! `#[path = "common/gguf_writer.rs"] mod gguf_writer;`.

#![allow(dead_code)]

/// GGUF metadata value type ids.
pub mod vt {
    pub const U8: u32 = 0;
    pub const I8: u32 = 1;
    pub const U16: u32 = 2;
    pub const I16: u32 = 3;
    pub const U32: u32 = 4;
    pub const I32: u32 = 5;
    pub const F32: u32 = 6;
    pub const BOOL: u32 = 7;
    pub const STRING: u32 = 8;
    pub const ARRAY: u32 = 9;
    pub const U64: u32 = 10;
    pub const I64: u32 = 11;
    pub const F64: u32 = 12;
}

/// ggml tensor type ids.
pub mod ggml {
    pub const F32: u32 = 0;
    pub const F16: u32 = 1;
    pub const Q4_0: u32 = 2;
    pub const Q4_1: u32 = 3;
    pub const Q5_0: u32 = 6;
    pub const Q5_1: u32 = 7;
    pub const Q8_0: u32 = 8;
    pub const Q4_K: u32 = 12;
    pub const Q5_K: u32 = 13;
    pub const Q6_K: u32 = 14;
    pub const BF16: u32 = 30;
}

pub const MAGIC: [u8; 4] = *b"GGUF";
pub const VERSION: u32 = 3;
pub const DEFAULT_ALIGNMENT: u64 = 32;
pub const KEY_ALIGNMENT: &str = "general.alignment";
/// Key of the padding value [`GgufWriter::filler`] puts first.
pub const KEY_FILLER: &str = "flint.test.filler";

/// (elements per block, bytes per block) of the ggml types the writer knows.
pub fn block_layout(ty: u32) -> Option<(u64, u64)> {
    Some(match ty {
        ggml::F32 => (1, 4),
        ggml::F16 | ggml::BF16 => (1, 2),
        ggml::Q4_0 => (32, 18),
        ggml::Q4_1 => (32, 20),
        ggml::Q5_0 => (32, 22),
        ggml::Q5_1 => (32, 24),
        ggml::Q8_0 => (32, 34),
        ggml::Q4_K => (256, 144),
        ggml::Q5_K => (256, 176),
        ggml::Q6_K => (256, 210),
        _ => return None,
    })
}

/// Bytes a tensor of this type and shape occupies; panics on shapes a valid file cannot have.
pub fn tensor_len(ty: u32, dims: &[u64]) -> u64 {
    let (block, size) = block_layout(ty).expect("type known to the writer");
    let n: u64 = dims.iter().product();
    assert_eq!(n % block, 0, "element count {n} is not a multiple of the block {block}");
    n / block * size
}

/// `len` bytes of seeded pseudo-random data (xorshift64*), never all zeros.
pub fn seeded_bytes(seed: u64, len: usize) -> Vec<u8> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            s ^= s >> 12;
            s ^= s << 25;
            s ^= s >> 27;
            (s.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 56) as u8
        })
        .collect()
}

fn name_seed(name: &[u8]) -> u64 {
    // FNV-1a, so each tensor's data differs and a mixed-up offset shows in a round trip.
    name.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| (h ^ b as u64).wrapping_mul(0x100_0000_01b3))
}

/// A GGUF string: u64 length, then the bytes (not necessarily UTF-8).
pub fn gguf_string(bytes: &[u8]) -> Vec<u8> {
    let mut out = (bytes.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(bytes);
    out
}

/// One metadata value as it is encoded: its type id and the bytes that follow the id.
#[derive(Clone, Debug, PartialEq)]
pub struct Val {
    pub ty: u32,
    pub payload: Vec<u8>,
}

impl Val {
    /// Any type id with any payload, for values the typed constructors refuse to write.
    pub fn raw(ty: u32, payload: Vec<u8>) -> Val {
        Val { ty, payload }
    }
    pub fn u8(v: u8) -> Val {
        Val::raw(vt::U8, vec![v])
    }
    pub fn i8(v: i8) -> Val {
        Val::raw(vt::I8, v.to_le_bytes().to_vec())
    }
    pub fn u16(v: u16) -> Val {
        Val::raw(vt::U16, v.to_le_bytes().to_vec())
    }
    pub fn i16(v: i16) -> Val {
        Val::raw(vt::I16, v.to_le_bytes().to_vec())
    }
    pub fn u32(v: u32) -> Val {
        Val::raw(vt::U32, v.to_le_bytes().to_vec())
    }
    pub fn i32(v: i32) -> Val {
        Val::raw(vt::I32, v.to_le_bytes().to_vec())
    }
    pub fn f32(v: f32) -> Val {
        Val::raw(vt::F32, v.to_le_bytes().to_vec())
    }
    pub fn bool(v: bool) -> Val {
        Val::raw(vt::BOOL, vec![v as u8])
    }
    /// A bool stored as any byte, including the invalid ones (2..=255).
    pub fn bool_byte(b: u8) -> Val {
        Val::raw(vt::BOOL, vec![b])
    }
    pub fn string(s: &str) -> Val {
        Val::raw(vt::STRING, gguf_string(s.as_bytes()))
    }
    /// A string value with arbitrary (possibly invalid UTF-8) bytes.
    pub fn string_bytes(b: &[u8]) -> Val {
        Val::raw(vt::STRING, gguf_string(b))
    }
    /// A string whose length field says `claimed` but which carries only `bytes`.
    pub fn string_claiming(claimed: u64, bytes: &[u8]) -> Val {
        let mut p = claimed.to_le_bytes().to_vec();
        p.extend_from_slice(bytes);
        Val::raw(vt::STRING, p)
    }
    pub fn u64(v: u64) -> Val {
        Val::raw(vt::U64, v.to_le_bytes().to_vec())
    }
    pub fn i64(v: i64) -> Val {
        Val::raw(vt::I64, v.to_le_bytes().to_vec())
    }
    pub fn f64(v: f64) -> Val {
        Val::raw(vt::F64, v.to_le_bytes().to_vec())
    }

    /// An array of `elems`, which must all have type `elem_ty`.
    pub fn array(elem_ty: u32, elems: &[Val]) -> Val {
        assert!(elems.iter().all(|e| e.ty == elem_ty), "array elements must all be of type {elem_ty}");
        let payload: Vec<u8> = elems.iter().flat_map(|e| e.payload.iter().copied()).collect();
        Val::array_claiming(elem_ty, elems.len() as u64, payload)
    }
    /// An array header claiming `count` elements of `elem_ty`, followed by `payload` as is.
    pub fn array_claiming(elem_ty: u32, count: u64, payload: Vec<u8>) -> Val {
        let mut p = elem_ty.to_le_bytes().to_vec();
        p.extend_from_slice(&count.to_le_bytes());
        p.extend(payload);
        Val::raw(vt::ARRAY, p)
    }
    pub fn u8_array(v: &[u8]) -> Val {
        Val::array(vt::U8, &v.iter().map(|&x| Val::u8(x)).collect::<Vec<_>>())
    }
    pub fn i8_array(v: &[i8]) -> Val {
        Val::array(vt::I8, &v.iter().map(|&x| Val::i8(x)).collect::<Vec<_>>())
    }
    pub fn i32_array(v: &[i32]) -> Val {
        Val::array(vt::I32, &v.iter().map(|&x| Val::i32(x)).collect::<Vec<_>>())
    }
    pub fn u32_array(v: &[u32]) -> Val {
        Val::array(vt::U32, &v.iter().map(|&x| Val::u32(x)).collect::<Vec<_>>())
    }
    pub fn f32_array(v: &[f32]) -> Val {
        Val::array(vt::F32, &v.iter().map(|&x| Val::f32(x)).collect::<Vec<_>>())
    }
    pub fn str_array(v: &[&str]) -> Val {
        Val::array(vt::STRING, &v.iter().map(|s| Val::string(s)).collect::<Vec<_>>())
    }
    /// `levels` arrays nested in one another (each of one element) around `[7u8]`.
    pub fn nested(levels: usize) -> Val {
        assert!(levels >= 1);
        let mut v = Val::u8_array(&[7]);
        for _ in 1..levels {
            v = Val::array(vt::ARRAY, &[v]);
        }
        v
    }
}

/// One tensor info plus the data the writer lays out for it.
#[derive(Clone, Debug)]
pub struct TensorSpec {
    pub name: Vec<u8>,
    /// Written instead of `dims.len()` when set.
    pub n_dims: Option<u32>,
    pub dims: Vec<u64>,
    pub ty: u32,
    /// Written instead of the offset the writer lays the data out at, when set.
    pub offset: Option<u64>,
    /// Bytes placed in the data section; the writer's own size when built with [`TensorSpec::new`].
    pub data: Vec<u8>,
}

impl TensorSpec {
    /// A tensor of a known type and valid shape, filled with seeded bytes.
    pub fn new(name: &str, dims: &[u64], ty: u32) -> TensorSpec {
        let len = tensor_len(ty, dims) as usize;
        TensorSpec::with_data(name, dims, ty, seeded_bytes(name_seed(name.as_bytes()), len))
    }
    /// A tensor with any shape and type whose data is `data` (of any length).
    pub fn with_data(name: &str, dims: &[u64], ty: u32, data: Vec<u8>) -> TensorSpec {
        TensorSpec { name: name.as_bytes().to_vec(), n_dims: None, dims: dims.to_vec(), ty, offset: None, data }
    }
    /// An F32 tensor of seeded finite values in [-1, 1), for weights whose values do not matter.
    pub fn f32_seeded(name: &str, dims: &[u64]) -> TensorSpec {
        let n = dims.iter().product::<u64>() as usize;
        let bytes = seeded_bytes(name_seed(name.as_bytes()), 2 * n);
        let values: Vec<f32> = bytes.chunks_exact(2).map(|c| u16::from_le_bytes([c[0], c[1]]) as f32 / 32768.0 - 1.0).collect();
        TensorSpec::f32(name, dims, &values)
    }
    /// An F32 tensor holding `values` (ggml order: `dims[0]` is the row length).
    pub fn f32(name: &str, dims: &[u64], values: &[f32]) -> TensorSpec {
        assert_eq!(dims.iter().product::<u64>(), values.len() as u64, "{name}: shape and value count differ");
        TensorSpec::with_data(name, dims, ggml::F32, values.iter().flat_map(|v| v.to_le_bytes()).collect())
    }
}

/// One metadata entry: a key and value, or raw bytes standing for a whole (malformed) pair.
#[derive(Clone, Debug)]
pub enum KvEntry {
    /// The key as raw bytes, so a test can write empty or non-UTF-8 keys.
    Pair(Vec<u8>, Val),
    /// Written as is and counted as one pair.
    Raw(Vec<u8>),
}

/// Builds a GGUF file; the defaults give a valid version 3 file.
#[derive(Clone, Debug)]
pub struct GgufWriter {
    pub magic: [u8; 4],
    pub version: u32,
    /// Written instead of the number of tensor infos, when set.
    pub n_tensors: Option<u64>,
    /// Written instead of the number of key/value pairs, when set.
    pub n_kv: Option<u64>,
    /// The alignment the data section is laid out with (independent of any `general.alignment`).
    pub alignment: u64,
    pub kvs: Vec<KvEntry>,
    pub tensors: Vec<TensorSpec>,
    /// Bytes appended after the data section.
    pub trailing: Vec<u8>,
}

impl Default for GgufWriter {
    fn default() -> Self {
        GgufWriter {
            magic: MAGIC,
            version: VERSION,
            n_tensors: None,
            n_kv: None,
            alignment: DEFAULT_ALIGNMENT,
            kvs: Vec::new(),
            tensors: Vec::new(),
            trailing: Vec::new(),
        }
    }
}

impl GgufWriter {
    pub fn new() -> Self {
        Self::default()
    }
    pub fn version(mut self, v: u32) -> Self {
        self.version = v;
        self
    }
    pub fn magic(mut self, m: [u8; 4]) -> Self {
        self.magic = m;
        self
    }
    pub fn n_tensors(mut self, n: u64) -> Self {
        self.n_tensors = Some(n);
        self
    }
    pub fn n_kv(mut self, n: u64) -> Self {
        self.n_kv = Some(n);
        self
    }
    pub fn kv(self, key: &str, v: Val) -> Self {
        self.kv_raw_key(key.as_bytes(), v)
    }
    pub fn kv_raw_key(mut self, key: &[u8], v: Val) -> Self {
        self.kvs.push(KvEntry::Pair(key.to_vec(), v));
        self
    }
    /// Bytes standing for one whole key/value pair (e.g. a key whose length runs past the end).
    pub fn kv_raw(mut self, bytes: Vec<u8>) -> Self {
        self.kvs.push(KvEntry::Raw(bytes));
        self
    }
    /// Writes `general.alignment` as a u32 and, when it is a power of two, lays data out with it
    /// (write huge alignments with `kv(KEY_ALIGNMENT, ..)` to keep the file small).
    pub fn alignment_kv(mut self, a: u32) -> Self {
        if a.is_power_of_two() {
            self.alignment = a as u64;
        }
        self.kv(KEY_ALIGNMENT, Val::u32(a))
    }
    pub fn tensor(self, name: &str, dims: &[u64], ty: u32) -> Self {
        self.tensor_spec(TensorSpec::new(name, dims, ty))
    }
    pub fn tensor_spec(mut self, t: TensorSpec) -> Self {
        self.tensors.push(t);
        self
    }
    pub fn trailing(mut self, bytes: &[u8]) -> Self {
        self.trailing.extend_from_slice(bytes);
        self
    }
    /// Puts a string value of `len` bytes first in the metadata, so the header outgrows a
    /// ranged reader's first read and the parser has to ask for more.
    pub fn filler(mut self, len: usize) -> Self {
        self.kvs.insert(0, KvEntry::Pair(KEY_FILLER.as_bytes().to_vec(), Val::string(&"x".repeat(len))));
        // An overridden count keeps its relation to the pairs present (huge counts stay huge).
        if let Some(n) = self.n_kv.as_mut() {
            *n = n.saturating_add(1);
        }
        self
    }

    /// Offsets (relative to the data section) the writer lays each tensor's data out at.
    pub fn layout_offsets(&self) -> Vec<u64> {
        let mut at = 0u64;
        self.tensors
            .iter()
            .map(|t| {
                let off = at.next_multiple_of(self.alignment);
                at = off + t.data.len() as u64;
                off
            })
            .collect()
    }

    /// Byte length of everything before the data section's padding: header, metadata, tensor infos.
    pub fn header_len(&self) -> u64 {
        self.header_bytes().len() as u64
    }

    /// Absolute offset of the data section (the header padded to the layout alignment).
    pub fn data_offset(&self) -> u64 {
        self.header_len().next_multiple_of(self.alignment)
    }

    fn header_bytes(&self) -> Vec<u8> {
        let mut out = Vec::new();
        out.extend_from_slice(&self.magic);
        out.extend_from_slice(&self.version.to_le_bytes());
        out.extend_from_slice(&self.n_tensors.unwrap_or(self.tensors.len() as u64).to_le_bytes());
        out.extend_from_slice(&self.n_kv.unwrap_or(self.kvs.len() as u64).to_le_bytes());
        for kv in &self.kvs {
            match kv {
                KvEntry::Pair(key, v) => {
                    out.extend(gguf_string(key));
                    out.extend_from_slice(&v.ty.to_le_bytes());
                    out.extend_from_slice(&v.payload);
                }
                KvEntry::Raw(bytes) => out.extend_from_slice(bytes),
            }
        }
        for (t, off) in self.tensors.iter().zip(self.layout_offsets()) {
            out.extend(gguf_string(&t.name));
            out.extend_from_slice(&t.n_dims.unwrap_or(t.dims.len() as u32).to_le_bytes());
            for d in &t.dims {
                out.extend_from_slice(&d.to_le_bytes());
            }
            out.extend_from_slice(&t.ty.to_le_bytes());
            out.extend_from_slice(&t.offset.unwrap_or(off).to_le_bytes());
        }
        out
    }

    /// The file's bytes. With no tensors the file ends after the metadata; otherwise the header
    /// is padded to the alignment and the data section ends with the last tensor's last byte.
    pub fn finish(&self) -> Vec<u8> {
        let mut out = self.header_bytes();
        if !self.tensors.is_empty() {
            out.resize(out.len().next_multiple_of(self.alignment as usize), 0);
            let base = out.len();
            for (t, off) in self.tensors.iter().zip(self.layout_offsets()) {
                out.resize(base + off as usize, 0);
                out.extend_from_slice(&t.data);
            }
        }
        out.extend_from_slice(&self.trailing);
        out
    }
}

//! GGUF model files (versions 2 and 3): validated header, typed metadata, lazy tensor data.

mod error;
mod parse;
mod source;
mod value;

use std::collections::HashMap;

pub use error::{GgufError, Result};
#[cfg(not(target_arch = "wasm32"))]
pub use source::MmapSource;
pub use source::{ByteSource, SliceSource};
pub use value::{Array, Value, ValueType};

use crate::quant::QuantType;
use parse::{parse_header, Parse};

pub const KEY_ALIGNMENT: &str = "general.alignment";
pub const DEFAULT_ALIGNMENT: u64 = 32;
/// Larger alignments are refused: nothing real uses them and they only pad hostile files.
pub const MAX_ALIGNMENT: u64 = 1 << 16;
/// ggml tensors have at most four dimensions.
pub const MAX_DIMS: usize = 4;
/// Arrays of arrays are legal but rare; deeper nesting is refused before it can exhaust the stack.
pub const MAX_ARRAY_DEPTH: usize = 8;
/// First read of a header from a ranged source; doubled until the header fits.
const FIRST_HEADER_READ: u64 = 1 << 20;
/// A header (metadata + tensor infos) larger than this is refused when read in ranges, so a
/// hostile remote file cannot make the browser buffer gigabytes before anything is checked.
pub const MAX_HEADER_BYTES: u64 = 256 << 20;

/// Metadata key/value pairs with typed, checked accessors.
#[derive(Clone, Debug, Default)]
pub struct Metadata {
    kv: HashMap<String, Value>,
    order: Vec<String>,
}

impl Metadata {
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.kv.get(key)
    }

    /// Keys in file order.
    pub fn keys(&self) -> impl Iterator<Item = &str> {
        self.order.iter().map(|s| s.as_str())
    }

    fn require(&self, key: &str) -> Result<&Value> {
        self.get(key).ok_or_else(|| GgufError::MissingKey(key.to_string()))
    }

    fn wrong(key: &str, expected: &'static str, v: &Value) -> GgufError {
        GgufError::WrongType { key: key.to_string(), expected, got: v.type_name() }
    }

    /// An integer key of any integer type whose value fits u32.
    pub fn opt_u32(&self, key: &str) -> Result<Option<u32>> {
        let Some(v) = self.get(key) else { return Ok(None) };
        let n = v.as_u64().ok_or_else(|| Self::wrong(key, "unsigned integer", v))?;
        u32::try_from(n).map(Some).map_err(|_| GgufError::InvalidValue { key: key.to_string(), reason: format!("{n} does not fit u32") })
    }

    pub fn u32(&self, key: &str) -> Result<u32> {
        self.opt_u32(key)?.ok_or_else(|| GgufError::MissingKey(key.to_string()))
    }

    pub fn opt_f32(&self, key: &str) -> Result<Option<f32>> {
        let Some(v) = self.get(key) else { return Ok(None) };
        v.as_f64().map(|f| Some(f as f32)).ok_or_else(|| Self::wrong(key, "float", v))
    }

    pub fn f32(&self, key: &str) -> Result<f32> {
        self.opt_f32(key)?.ok_or_else(|| GgufError::MissingKey(key.to_string()))
    }

    pub fn opt_bool(&self, key: &str) -> Result<Option<bool>> {
        let Some(v) = self.get(key) else { return Ok(None) };
        v.as_bool().map(Some).ok_or_else(|| Self::wrong(key, "bool", v))
    }

    pub fn opt_str(&self, key: &str) -> Result<Option<&str>> {
        let Some(v) = self.get(key) else { return Ok(None) };
        v.as_str().map(Some).ok_or_else(|| Self::wrong(key, "string", v))
    }

    pub fn str(&self, key: &str) -> Result<&str> {
        self.opt_str(key)?.ok_or_else(|| GgufError::MissingKey(key.to_string()))
    }

    pub fn opt_array(&self, key: &str) -> Result<Option<&Array>> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Array(a)) => Ok(Some(a)),
            Some(v) => Err(Self::wrong(key, "array", v)),
        }
    }

    pub fn str_array(&self, key: &str) -> Result<&[String]> {
        match self.require(key)? {
            Value::Array(Array::String(v)) => Ok(v),
            v => Err(Self::wrong(key, "array<string>", v)),
        }
    }

    pub fn opt_str_array(&self, key: &str) -> Result<Option<&[String]>> {
        if self.get(key).is_none() {
            return Ok(None);
        }
        self.str_array(key).map(Some)
    }

    pub fn opt_f32_array(&self, key: &str) -> Result<Option<&[f32]>> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Array(Array::F32(v))) => Ok(Some(v)),
            Some(v) => Err(Self::wrong(key, "array<f32>", v)),
        }
    }

    pub fn opt_i32_array(&self, key: &str) -> Result<Option<&[i32]>> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Array(Array::I32(v))) => Ok(Some(v)),
            Some(v) => Err(Self::wrong(key, "array<i32>", v)),
        }
    }

    /// Builds metadata directly (tests, synthetic models).
    pub fn from_pairs(pairs: impl IntoIterator<Item = (String, Value)>) -> Metadata {
        let mut m = Metadata::default();
        for (k, v) in pairs {
            if m.kv.insert(k.clone(), v).is_none() {
                m.order.push(k);
            }
        }
        m
    }
}

/// One tensor's description; `offset` is relative to the start of the data section.
#[derive(Clone, Debug, PartialEq)]
pub struct TensorInfo {
    pub name: String,
    /// ggml order: `dims[0]` is the row length (contiguous), `dims[1]` the number of rows.
    pub dims: Vec<u64>,
    pub ty: QuantType,
    pub offset: u64,
    pub n_elems: u64,
    pub n_bytes: u64,
}

impl TensorInfo {
    pub fn row_len(&self) -> u64 {
        self.dims[0]
    }
    pub fn n_rows(&self) -> u64 {
        self.n_elems / self.dims[0]
    }
}

/// A parsed GGUF file over a byte source; tensor data stays in the source until asked for.
pub struct GgufFile {
    pub version: u32,
    pub metadata: Metadata,
    pub tensors: Vec<TensorInfo>,
    pub alignment: u64,
    /// Absolute offset of the data section in the source.
    pub data_offset: u64,
    index: HashMap<String, usize>,
    source: Box<dyn ByteSource>,
}

impl std::fmt::Debug for GgufFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GgufFile").field("version", &self.version).field("tensors", &self.tensors.len()).field("data_offset", &self.data_offset).finish()
    }
}

impl GgufFile {
    /// Opens and validates a file on disk through a memory map.
    #[cfg(not(target_arch = "wasm32"))]
    pub fn open(path: impl AsRef<std::path::Path>) -> Result<GgufFile> {
        let source = MmapSource::open(path.as_ref())?;
        Self::from_slice_source(Box::new(source))
    }

    /// Parses an in-memory file (tests, small synthetic models).
    pub fn from_bytes(bytes: Vec<u8>) -> Result<GgufFile> {
        Self::from_slice_source(Box::new(SliceSource::new(bytes)))
    }

    fn from_slice_source(source: Box<dyn ByteSource>) -> Result<GgufFile> {
        let len = source.len();
        let slice = source.as_slice().expect("slice source");
        match parse_header(slice, len)? {
            Parse::Done(h) => Ok(Self::assemble(h, source)),
            // The whole file was handed in, so the parser cannot ask for more.
            Parse::NeedMore(_) => Err(GgufError::Truncated { what: "header", offset: len }),
        }
    }

    /// Parses a file from any byte source, reading the header in growing prefixes.
    pub async fn from_source(source: Box<dyn ByteSource>) -> Result<GgufFile> {
        if source.as_slice().is_some() {
            return Self::from_slice_source(source);
        }
        let len = source.len();
        let mut want = FIRST_HEADER_READ.min(len);
        loop {
            let mut buf = vec![0u8; want as usize];
            source.read_at(0, &mut buf).await?;
            match parse_header(&buf, len)? {
                Parse::Done(h) => return Ok(Self::assemble(h, source)),
                Parse::NeedMore(n) => {
                    if want >= len {
                        return Err(GgufError::Truncated { what: "header", offset: len });
                    }
                    if want >= MAX_HEADER_BYTES {
                        return Err(GgufError::HeaderTooLarge { limit: MAX_HEADER_BYTES });
                    }
                    want = n.max(want.saturating_mul(2)).min(len).min(MAX_HEADER_BYTES);
                }
            }
        }
    }

    fn assemble(h: parse::Header, source: Box<dyn ByteSource>) -> GgufFile {
        let index = h.tensors.iter().enumerate().map(|(i, t)| (t.name.clone(), i)).collect();
        GgufFile { version: h.version, metadata: h.metadata, tensors: h.tensors, alignment: h.alignment, data_offset: h.data_offset, index, source }
    }

    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.index.get(name).map(|&i| &self.tensors[i])
    }

    /// Replaces tensor `name` by consecutive row ranges of it, each a tensor of its own
    /// (`parts`: new name and row count, in order, covering every row): fused projections
    /// (phi3's `attn_qkv`) become the separate ones the forward pass reads, without a copy.
    pub fn split_rows(&mut self, name: &str, parts: &[(String, u64)]) -> Result<()> {
        let i = *self.index.get(name).ok_or_else(|| GgufError::MissingTensor(name.to_string()))?;
        let t = self.tensors[i].clone();
        let rows = t.n_rows();
        if t.dims.len() != 2 || parts.iter().map(|p| p.1).sum::<u64>() != rows || !t.n_bytes.is_multiple_of(rows) {
            return Err(GgufError::BadTensorData { tensor: name.to_string(), reason: format!("cannot split {rows} rows into {parts:?}") });
        }
        let row_bytes = t.n_bytes / rows;
        self.index.remove(name);
        let mut offset = t.offset;
        let mut views = Vec::with_capacity(parts.len());
        for (part, n) in parts {
            if self.index.contains_key(part.as_str()) {
                return Err(GgufError::DuplicateTensor(part.clone()));
            }
            views.push(TensorInfo { name: part.clone(), dims: vec![t.dims[0], *n], ty: t.ty, offset, n_elems: t.dims[0] * n, n_bytes: row_bytes * n });
            offset += row_bytes * n;
        }
        // The first view takes the fused tensor's slot; the rest go at the end.
        let mut views = views.into_iter();
        let first = views.next().expect("parts cover every row");
        self.index.insert(first.name.clone(), i);
        self.tensors[i] = first;
        for v in views {
            self.index.insert(v.name.clone(), self.tensors.len());
            self.tensors.push(v);
        }
        Ok(())
    }

    pub fn require_tensor(&self, name: &str) -> Result<&TensorInfo> {
        self.tensor(name).ok_or_else(|| GgufError::MissingTensor(name.to_string()))
    }

    pub fn source(&self) -> &dyn ByteSource {
        self.source.as_ref()
    }

    /// The tensor's bytes without copying, when the source is memory-mapped or in memory.
    pub fn tensor_bytes(&self, t: &TensorInfo) -> Option<&[u8]> {
        let s = self.source.as_slice()?;
        let start = (self.data_offset + t.offset) as usize;
        s.get(start..start + t.n_bytes as usize)
    }

    /// Reads a range of one tensor's bytes (relative to the tensor's start) into `buf`.
    /// A small tensor's values as f32, whatever its type (norm vectors, RoPE factors).
    pub async fn read_f32(&self, name: &str) -> Result<Vec<f32>> {
        let t = self.require_tensor(name)?;
        let mut buf = vec![0u8; t.n_bytes as usize];
        self.read_tensor_range(t, 0, &mut buf).await?;
        let mut v = vec![0f32; t.n_elems as usize];
        crate::quant::dequantize(t.ty, &buf, &mut v).map_err(|e| GgufError::BadTensorData { tensor: name.to_string(), reason: e.to_string() })?;
        Ok(v)
    }

    pub async fn read_tensor_range(&self, t: &TensorInfo, start: u64, buf: &mut [u8]) -> Result<()> {
        let end = start.saturating_add(buf.len() as u64);
        if end > t.n_bytes {
            return Err(GgufError::TensorOutOfBounds { tensor: t.name.clone(), start, end, len: t.n_bytes });
        }
        self.source.read_at(self.data_offset + t.offset + start, buf).await
    }
}

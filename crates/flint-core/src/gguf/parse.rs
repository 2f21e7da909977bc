//! The GGUF header parser: checked reads over a byte prefix of a file of known length.
//!
//! Every count and size read from the file is checked against the bytes that remain in
//! the *file* before anything is allocated from it. When the prefix handed in is shorter
//! than what a valid read needs, parsing stops with [`Parse::NeedMore`] so the caller can
//! fetch a longer prefix (the browser reads the header in ranges).

use std::collections::HashMap;

use super::error::GgufError;
use super::value::{Array, Value, ValueType};
use super::{Metadata, TensorInfo, MAX_ALIGNMENT, MAX_ARRAY_DEPTH, MAX_DIMS};
use crate::quant::QuantType;

pub(crate) enum Parse<T> {
    Done(T),
    /// The prefix ended before the header did; retry with at least this many bytes.
    NeedMore(u64),
}

pub(crate) struct Header {
    pub version: u32,
    pub metadata: Metadata,
    pub tensors: Vec<TensorInfo>,
    pub alignment: u64,
    pub data_offset: u64,
}

enum Stop {
    Err(GgufError),
    NeedMore(u64),
}

impl From<GgufError> for Stop {
    fn from(e: GgufError) -> Self {
        Stop::Err(e)
    }
}

type R<T> = Result<T, Stop>;

struct Cursor<'a> {
    buf: &'a [u8],
    pos: u64,
    file_len: u64,
}

impl<'a> Cursor<'a> {
    fn remaining(&self) -> u64 {
        self.file_len.saturating_sub(self.pos)
    }

    fn take(&mut self, n: u64, what: &'static str) -> R<&'a [u8]> {
        let end = self.pos.checked_add(n).ok_or(GgufError::Truncated { what, offset: self.pos })?;
        if end > self.file_len {
            return Err(GgufError::Truncated { what, offset: self.pos }.into());
        }
        if end > self.buf.len() as u64 {
            return Err(Stop::NeedMore(end));
        }
        let s = &self.buf[self.pos as usize..end as usize];
        self.pos = end;
        Ok(s)
    }

    fn array<const N: usize>(&mut self, what: &'static str) -> R<[u8; N]> {
        let s = self.take(N as u64, what)?;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }

    fn u8(&mut self, what: &'static str) -> R<u8> {
        Ok(self.array::<1>(what)?[0])
    }
    fn u32(&mut self, what: &'static str) -> R<u32> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }
    fn u64(&mut self, what: &'static str) -> R<u64> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    /// Checks that `count` items of at least `min_size` bytes each can fit in what remains.
    fn check_count(&self, what: &'static str, count: u64, min_size: u64) -> R<usize> {
        let remaining = self.remaining();
        let fits = count.checked_mul(min_size).is_some_and(|need| need <= remaining);
        if !fits {
            return Err(GgufError::CountTooLarge { what, count, remaining }.into());
        }
        usize::try_from(count).map_err(|_| GgufError::CountTooLarge { what, count, remaining }.into())
    }

    fn string(&mut self, what: &'static str) -> R<String> {
        let offset = self.pos;
        let len = self.u64(what)?;
        if len > self.remaining() {
            return Err(GgufError::StringTooLong { offset, len }.into());
        }
        let bytes = self.take(len, what)?;
        String::from_utf8(bytes.to_vec()).map_err(|_| GgufError::InvalidUtf8 { what, offset }.into())
    }

    fn value_type(&mut self) -> R<ValueType> {
        let offset = self.pos;
        let id = self.u32("value type")?;
        ValueType::from_id(id).ok_or(GgufError::BadValueType { id, offset }.into())
    }

    fn bool(&mut self) -> R<bool> {
        let offset = self.pos;
        match self.u8("bool")? {
            0 => Ok(false),
            1 => Ok(true),
            byte => Err(GgufError::BadBool { byte, offset }.into()),
        }
    }

    fn value(&mut self, ty: ValueType, depth: usize) -> R<Value> {
        const W: &str = "metadata value";
        Ok(match ty {
            ValueType::U8 => Value::U8(self.u8(W)?),
            ValueType::I8 => Value::I8(self.u8(W)? as i8),
            ValueType::U16 => Value::U16(u16::from_le_bytes(self.array(W)?)),
            ValueType::I16 => Value::I16(i16::from_le_bytes(self.array(W)?)),
            ValueType::U32 => Value::U32(self.u32(W)?),
            ValueType::I32 => Value::I32(i32::from_le_bytes(self.array(W)?)),
            ValueType::F32 => Value::F32(f32::from_le_bytes(self.array(W)?)),
            ValueType::Bool => Value::Bool(self.bool()?),
            ValueType::String => Value::String(self.string("string value")?),
            ValueType::U64 => Value::U64(self.u64(W)?),
            ValueType::I64 => Value::I64(i64::from_le_bytes(self.array(W)?)),
            ValueType::F64 => Value::F64(f64::from_le_bytes(self.array(W)?)),
            ValueType::Array => Value::Array(self.array_value(depth + 1)?),
        })
    }

    fn array_value(&mut self, depth: usize) -> R<Array> {
        if depth > MAX_ARRAY_DEPTH {
            return Err(GgufError::NestingTooDeep { max: MAX_ARRAY_DEPTH, offset: self.pos }.into());
        }
        let elem = self.value_type()?;
        let count = self.u64("array length")?;
        let n = self.check_count("array element", count, elem.min_encoded_size())?;
        macro_rules! collect {
            ($variant:ident, $read:expr) => {{
                let mut v = Vec::with_capacity(n);
                for _ in 0..n {
                    v.push($read);
                }
                Array::$variant(v)
            }};
        }
        const W: &str = "array element";
        Ok(match elem {
            ValueType::U8 => Array::U8(self.take(count, W)?.to_vec()),
            ValueType::I8 => Array::I8(self.take(count, W)?.iter().map(|&b| b as i8).collect()),
            ValueType::U16 => collect!(U16, u16::from_le_bytes(self.array(W)?)),
            ValueType::I16 => collect!(I16, i16::from_le_bytes(self.array(W)?)),
            ValueType::U32 => collect!(U32, self.u32(W)?),
            ValueType::I32 => collect!(I32, i32::from_le_bytes(self.array(W)?)),
            ValueType::F32 => collect!(F32, f32::from_le_bytes(self.array(W)?)),
            ValueType::Bool => collect!(Bool, self.bool()?),
            ValueType::String => collect!(String, self.string("array string")?),
            ValueType::U64 => collect!(U64, self.u64(W)?),
            ValueType::I64 => collect!(I64, i64::from_le_bytes(self.array(W)?)),
            ValueType::F64 => collect!(F64, f64::from_le_bytes(self.array(W)?)),
            ValueType::Array => collect!(Array, self.array_value(depth + 1)?),
        })
    }
}

/// Minimum encoded size of one key/value pair: key length, a one-byte key, type id, one byte.
const MIN_KV_SIZE: u64 = 8 + 1 + 4 + 1;
/// Minimum encoded size of one tensor info: name length, one-byte name, n_dims, one dim, type, offset.
const MIN_TENSOR_INFO_SIZE: u64 = 8 + 1 + 4 + 8 + 4 + 8;

pub(crate) fn parse_header(buf: &[u8], file_len: u64) -> Result<Parse<Header>, GgufError> {
    let mut c = Cursor { buf, pos: 0, file_len };
    match parse_inner(&mut c) {
        Ok(h) => Ok(Parse::Done(h)),
        Err(Stop::NeedMore(n)) => Ok(Parse::NeedMore(n)),
        Err(Stop::Err(e)) => Err(e),
    }
}

fn parse_inner(c: &mut Cursor) -> R<Header> {
    let magic: [u8; 4] = c.array("magic")?;
    if &magic != b"GGUF" {
        return Err(GgufError::BadMagic(magic).into());
    }
    let version = c.u32("version")?;
    if !(2..=3).contains(&version) {
        return Err(GgufError::UnsupportedVersion(version).into());
    }
    let n_tensors = c.u64("tensor count")?;
    let n_kv = c.u64("metadata count")?;
    let n_kv = c.check_count("metadata key/value", n_kv, MIN_KV_SIZE)?;
    // Tensor infos follow the metadata, so this bound is loose but already stops 2^63.
    c.check_count("tensor info", n_tensors, MIN_TENSOR_INFO_SIZE)?;

    let mut kv = HashMap::with_capacity(n_kv.min(1024));
    let mut order = Vec::with_capacity(n_kv.min(1024));
    for index in 0..n_kv as u64 {
        let key = c.string("metadata key")?;
        if key.is_empty() {
            return Err(GgufError::EmptyKey { index }.into());
        }
        let ty = c.value_type()?;
        let value = c.value(ty, 0)?;
        if kv.contains_key(&key) {
            return Err(GgufError::DuplicateKey(key).into());
        }
        order.push(key.clone());
        kv.insert(key, value);
    }
    let metadata = Metadata { kv, order };
    let alignment = match metadata.get(super::KEY_ALIGNMENT) {
        None => super::DEFAULT_ALIGNMENT,
        Some(Value::U32(a)) => *a as u64,
        Some(v) => return Err(GgufError::WrongType { key: super::KEY_ALIGNMENT.into(), expected: "u32", got: v.type_name() }.into()),
    };
    if alignment == 0 || !alignment.is_power_of_two() || alignment > MAX_ALIGNMENT {
        return Err(GgufError::BadAlignment(alignment).into());
    }

    let n_tensors = c.check_count("tensor info", n_tensors, MIN_TENSOR_INFO_SIZE)?;
    let mut tensors = Vec::with_capacity(n_tensors);
    let mut names = HashMap::with_capacity(n_tensors);
    for index in 0..n_tensors as u64 {
        let t = tensor_info(c, index, alignment)?;
        if names.insert(t.name.clone(), ()).is_some() {
            return Err(GgufError::DuplicateTensor(t.name).into());
        }
        tensors.push(t);
    }
    let data_offset = c.pos.div_ceil(alignment).checked_mul(alignment).ok_or(GgufError::Truncated { what: "tensor data", offset: c.pos })?;
    let data_len = c.file_len.saturating_sub(data_offset);
    check_tensor_ranges(&tensors, data_len)?;
    Ok(Header { version, metadata, tensors, alignment, data_offset })
}

fn tensor_info(c: &mut Cursor, index: u64, alignment: u64) -> R<TensorInfo> {
    let name = c.string("tensor name")?;
    if name.is_empty() {
        return Err(GgufError::EmptyTensorName { index }.into());
    }
    let n_dims = c.u32("tensor dimension count")?;
    if n_dims == 0 || n_dims as usize > MAX_DIMS {
        return Err(GgufError::BadDimCount { tensor: name, n_dims }.into());
    }
    let mut dims = Vec::with_capacity(n_dims as usize);
    for _ in 0..n_dims {
        let d = c.u64("tensor dimension")?;
        if d == 0 || d > i64::MAX as u64 {
            return Err(GgufError::BadDim { tensor: name, dim: d }.into());
        }
        dims.push(d);
    }
    let type_id = c.u32("tensor type")?;
    let offset = c.u64("tensor offset")?;
    let ty = QuantType::from_ggml_id(type_id).ok_or_else(|| GgufError::UnknownTensorType { tensor: name.clone(), id: type_id })?;
    let n_elems = dims
        .iter()
        .try_fold(1u64, |acc, &d| acc.checked_mul(d))
        .filter(|&n| n <= i64::MAX as u64)
        .ok_or_else(|| GgufError::SizeOverflow { tensor: name.clone() })?;
    let block = ty.block_elems();
    if dims[0] % block as u64 != 0 {
        return Err(GgufError::RowNotBlockAligned { tensor: name, row: dims[0], ty: ty.name(), block }.into());
    }
    let n_bytes = ty.bytes_for(n_elems).ok_or_else(|| GgufError::SizeOverflow { tensor: name.clone() })?;
    if offset % alignment != 0 {
        return Err(GgufError::TensorMisaligned { tensor: name, offset, alignment }.into());
    }
    Ok(TensorInfo { name, dims, ty, offset, n_elems, n_bytes })
}

fn check_tensor_ranges(tensors: &[TensorInfo], data_len: u64) -> Result<(), GgufError> {
    for t in tensors {
        let end = t.offset.checked_add(t.n_bytes).ok_or_else(|| GgufError::SizeOverflow { tensor: t.name.clone() })?;
        if end > data_len {
            return Err(GgufError::TensorOutOfBounds { tensor: t.name.clone(), start: t.offset, end, len: data_len });
        }
    }
    let mut by_offset: Vec<&TensorInfo> = tensors.iter().collect();
    by_offset.sort_by_key(|t| t.offset);
    for w in by_offset.windows(2) {
        if w[0].offset + w[0].n_bytes > w[1].offset {
            return Err(GgufError::TensorOverlap { a: w[0].name.clone(), b: w[1].name.clone() });
        }
    }
    Ok(())
}

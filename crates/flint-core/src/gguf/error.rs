//! Typed errors for reading GGUF files; every malformed-file case has its own variant.

use thiserror::Error;

#[derive(Debug, Error)]
pub enum GgufError {
    #[error("cannot read model file: {0}")]
    Io(String),
    #[error("not a GGUF file (magic {0:02x?}, expected \"GGUF\")")]
    BadMagic([u8; 4]),
    #[error("unsupported GGUF version {0} (supported: 2, 3)")]
    UnsupportedVersion(u32),
    #[error("file truncated while reading {what} at byte {offset}")]
    Truncated { what: &'static str, offset: u64 },
    #[error("{what} count {count} cannot fit in the {remaining} bytes that remain")]
    CountTooLarge { what: &'static str, count: u64, remaining: u64 },
    #[error("string of {len} bytes at byte {offset} runs past the end of the file")]
    StringTooLong { offset: u64, len: u64 },
    #[error("{what} at byte {offset} is not valid UTF-8")]
    InvalidUtf8 { what: &'static str, offset: u64 },
    #[error("unknown metadata value type {id} at byte {offset}")]
    BadValueType { id: u32, offset: u64 },
    #[error("invalid bool byte {byte} at byte {offset}")]
    BadBool { byte: u8, offset: u64 },
    #[error("arrays nested deeper than {max} levels at byte {offset}")]
    NestingTooDeep { max: usize, offset: u64 },
    #[error("metadata key #{index} is empty")]
    EmptyKey { index: u64 },
    #[error("duplicate metadata key {0:?}")]
    DuplicateKey(String),
    #[error("tensor #{index} has an empty name")]
    EmptyTensorName { index: u64 },
    #[error("duplicate tensor name {0:?}")]
    DuplicateTensor(String),
    #[error("general.alignment {0} is invalid (must be a power of two between 1 and {max})", max = super::MAX_ALIGNMENT)]
    BadAlignment(u64),
    #[error("metadata key {key:?} has type {got}, expected {expected}")]
    WrongType { key: String, expected: &'static str, got: String },
    #[error("metadata key {0:?} is missing")]
    MissingKey(String),
    #[error("metadata key {key:?}: {reason}")]
    InvalidValue { key: String, reason: String },
    #[error("tensor {tensor:?} has {n_dims} dimensions (supported: 1 to {max})", max = super::MAX_DIMS)]
    BadDimCount { tensor: String, n_dims: u32 },
    #[error("tensor {tensor:?} has invalid dimension {dim} (must be between 1 and 2^63-1)")]
    BadDim { tensor: String, dim: u64 },
    #[error("tensor {tensor:?}: element count or byte size overflows")]
    SizeOverflow { tensor: String },
    #[error("tensor {tensor:?} has unknown or unsupported type id {id}")]
    UnknownTensorType { tensor: String, id: u32 },
    #[error("tensor {tensor:?}: row length {row} is not a multiple of {ty}'s block of {block}")]
    RowNotBlockAligned { tensor: String, row: u64, ty: &'static str, block: usize },
    #[error("tensor {tensor:?}: data offset {offset} is not a multiple of the alignment {alignment}")]
    TensorMisaligned { tensor: String, offset: u64, alignment: u64 },
    #[error("tensor {tensor:?}: data [{start}, {end}) runs past the end of the data section ({len} bytes)")]
    TensorOutOfBounds { tensor: String, start: u64, end: u64, len: u64 },
    #[error("tensors {a:?} and {b:?} overlap in the data section")]
    TensorOverlap { a: String, b: String },
    #[error("the header is larger than {limit} bytes")]
    HeaderTooLarge { limit: u64 },
    #[error("tensor {0:?} not found")]
    MissingTensor(String),
    #[error("tensor {tensor:?}: {reason}")]
    BadTensorData { tensor: String, reason: String },
}

pub type Result<T, E = GgufError> = std::result::Result<T, E>;

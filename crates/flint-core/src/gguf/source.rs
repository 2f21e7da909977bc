//! Byte sources a GGUF file can be read from: a memory map natively, memory anywhere,
//! and (in the wasm crate) HTTP ranges or `Blob` slices, all behind one async `read_at`.

use futures::future::LocalBoxFuture;

use super::error::{GgufError, Result};

/// Random access to a file's bytes. `read_at` is async so the browser can fetch ranges.
pub trait ByteSource {
    fn len(&self) -> u64;
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Fills `buf` from `offset`; fails if the range runs past the end.
    fn read_at<'a>(&'a self, offset: u64, buf: &'a mut [u8]) -> LocalBoxFuture<'a, Result<()>>;
    /// The whole file as one slice, where the source has it (memory map, in-memory).
    fn as_slice(&self) -> Option<&[u8]> {
        None
    }
}

fn copy_range(data: &[u8], offset: u64, buf: &mut [u8]) -> Result<()> {
    let end = offset.checked_add(buf.len() as u64);
    match end {
        Some(end) if end <= data.len() as u64 => {
            buf.copy_from_slice(&data[offset as usize..end as usize]);
            Ok(())
        }
        _ => Err(GgufError::Truncated { what: "read", offset }),
    }
}

/// A file held in memory.
pub struct SliceSource {
    data: Vec<u8>,
}

impl SliceSource {
    pub fn new(data: Vec<u8>) -> Self {
        SliceSource { data }
    }
}

impl ByteSource for SliceSource {
    fn len(&self) -> u64 {
        self.data.len() as u64
    }
    fn read_at<'a>(&'a self, offset: u64, buf: &'a mut [u8]) -> LocalBoxFuture<'a, Result<()>> {
        Box::pin(async move { copy_range(&self.data, offset, buf) })
    }
    fn as_slice(&self) -> Option<&[u8]> {
        Some(&self.data)
    }
}

/// A file on disk, memory-mapped read-only.
#[cfg(not(target_arch = "wasm32"))]
pub struct MmapSource {
    map: memmap2::Mmap,
}

#[cfg(not(target_arch = "wasm32"))]
impl MmapSource {
    pub fn open(path: &std::path::Path) -> Result<Self> {
        let file = std::fs::File::open(path).map_err(|e| GgufError::Io(format!("{}: {e}", path.display())))?;
        // SAFETY: the map is read-only; a file truncated by another process while mapped
        // would fault, which is the documented hazard of memory-mapping model files.
        let map = unsafe { memmap2::Mmap::map(&file) }.map_err(|e| GgufError::Io(format!("{}: {e}", path.display())))?;
        Ok(MmapSource { map })
    }
}

#[cfg(not(target_arch = "wasm32"))]
impl ByteSource for MmapSource {
    fn len(&self) -> u64 {
        self.map.len() as u64
    }
    fn read_at<'a>(&'a self, offset: u64, buf: &'a mut [u8]) -> LocalBoxFuture<'a, Result<()>> {
        Box::pin(async move { copy_range(&self.map, offset, buf) })
    }
    fn as_slice(&self) -> Option<&[u8]> {
        Some(&self.map)
    }
}

//! Weight upload: tensors stream from the model file into GPU buffers in bounded chunks
//! (host memory never holds a second copy of the model), split by rows across several
//! buffers when larger than the device's storage binding limit.

use flint_core::gguf::{GgufFile, TensorInfo};
use flint_core::quant::{self, QuantType};

use crate::context::GpuContext;
use crate::error::{GpuError, Result};

/// Bytes copied per `write_buffer`; the queue is flushed every [`FLUSH_BYTES`] so staging
/// memory stays bounded too.
const CHUNK_BYTES: usize = 4 << 20;
const FLUSH_BYTES: usize = 64 << 20;

/// One buffer holding whole rows `row_offset..row_offset + rows` of a matrix.
pub struct WeightPart {
    pub buffer: wgpu::Buffer,
    pub rows: u32,
    pub row_offset: u32,
}

/// A quantized matrix on the GPU, raw GGUF blocks, in one or more row parts.
pub struct GpuMatrix {
    pub name: String,
    pub ty: QuantType,
    pub n_in: u32,
    pub n_rows: u32,
    pub parts: Vec<WeightPart>,
}

/// One buffer holding whole experts `expert_offset..expert_offset + experts` of a stack.
pub struct ExpertPart {
    pub buffer: wgpu::Buffer,
    pub experts: u32,
    pub expert_offset: u32,
}

/// A stack of expert matrices on the GPU (GGUF's 3-D `[n_in, n_rows, n_expert]` tensors:
/// expert e's rows are contiguous), split by whole experts like a matrix by rows.
pub struct GpuExperts {
    pub name: String,
    pub ty: QuantType,
    pub n_in: u32,
    /// Rows of each expert.
    pub n_rows: u32,
    pub n_expert: u32,
    pub parts: Vec<ExpertPart>,
}

/// Streams tensors to the device, counting bytes so the queue can be flushed periodically.
pub struct Uploader<'a> {
    ctx: &'a GpuContext,
    file: &'a GgufFile,
    max_binding: u64,
    pending: usize,
    pub uploaded: u64,
    scratch: Vec<u8>,
}

impl<'a> Uploader<'a> {
    /// `max_binding` caps each part (the device limit, or lower to exercise splitting).
    pub fn new(ctx: &'a GpuContext, file: &'a GgufFile, max_binding: u64) -> Self {
        Uploader { ctx, file, max_binding, pending: 0, uploaded: 0, scratch: Vec::new() }
    }

    /// Uploads a 2-D tensor as a matrix, split into parts of at most the binding limit.
    pub async fn matrix(&mut self, name: &str) -> Result<GpuMatrix> {
        let t = self.file.require_tensor(name).map_err(|e| GpuError::Unsupported { op: "upload", message: e.to_string() })?.clone();
        if t.dims.len() != 2 {
            return Err(GpuError::Unsupported { op: "upload", message: format!("{name} is not a matrix: {:?}", t.dims) });
        }
        let (n_in, n_rows) = (t.dims[0], t.dims[1]);
        let row_bytes = t.n_bytes / n_rows;
        let rows_per_part = (self.max_binding / row_bytes).min(n_rows);
        if rows_per_part == 0 {
            return Err(GpuError::Limit { what: "one weight row", need: row_bytes, limit: self.max_binding });
        }
        let mut parts = Vec::new();
        let mut row = 0;
        while row < n_rows {
            let rows = rows_per_part.min(n_rows - row);
            let label = if rows == n_rows { name.to_string() } else { format!("{name}[{}]", parts.len()) };
            let buffer = self.copy(&t, row * row_bytes, rows * row_bytes, &label).await?;
            parts.push(WeightPart { buffer, rows: rows as u32, row_offset: row as u32 });
            row += rows;
        }
        Ok(GpuMatrix { name: name.to_string(), ty: t.ty, n_in: n_in as u32, n_rows: n_rows as u32, parts })
    }

    /// Uploads a 3-D stack of expert matrices, split by whole experts into parts of at most
    /// the binding limit.
    pub async fn experts(&mut self, name: &str) -> Result<GpuExperts> {
        let t = self.file.require_tensor(name).map_err(|e| GpuError::Unsupported { op: "upload", message: e.to_string() })?.clone();
        if t.dims.len() != 3 {
            return Err(GpuError::Unsupported { op: "upload", message: format!("{name} is not a stack of matrices: {:?}", t.dims) });
        }
        let (n_in, n_rows, n_expert) = (t.dims[0], t.dims[1], t.dims[2]);
        let expert_bytes = t.n_bytes / n_expert;
        let per_part = (self.max_binding / expert_bytes).min(n_expert);
        if per_part == 0 {
            return Err(GpuError::Limit { what: "one expert's weights", need: expert_bytes, limit: self.max_binding });
        }
        let mut parts = Vec::new();
        let mut e = 0;
        while e < n_expert {
            let experts = per_part.min(n_expert - e);
            let label = if experts == n_expert { name.to_string() } else { format!("{name}[{}]", parts.len()) };
            let buffer = self.copy(&t, e * expert_bytes, experts * expert_bytes, &label).await?;
            parts.push(ExpertPart { buffer, experts: experts as u32, expert_offset: e as u32 });
            e += experts;
        }
        Ok(GpuExperts { name: name.to_string(), ty: t.ty, n_in: n_in as u32, n_rows: n_rows as u32, n_expert: n_expert as u32, parts })
    }

    /// Uploads a small tensor (norm weights, biases) dequantized to f32.
    pub async fn vector(&mut self, name: &str) -> Result<wgpu::Buffer> {
        let t = self.file.require_tensor(name).map_err(|e| GpuError::Unsupported { op: "upload", message: e.to_string() })?.clone();
        let mut raw = vec![0u8; t.n_bytes as usize];
        self.file
            .read_tensor_range(&t, 0, &mut raw)
            .await
            .map_err(|e| GpuError::Unsupported { op: "upload", message: e.to_string() })?;
        let mut v = vec![0f32; t.n_elems as usize];
        quant::dequantize(t.ty, &raw, &mut v).map_err(|e| GpuError::Unsupported { op: "upload", message: e.to_string() })?;
        crate::buffer::storage_init(self.ctx, name, bytemuck::cast_slice(&v))
    }

    /// Copies `len` bytes of tensor `t` from byte `start` into a new buffer, chunk by chunk.
    async fn copy(&mut self, t: &TensorInfo, start: u64, len: u64, label: &str) -> Result<wgpu::Buffer> {
        let buffer = crate::buffer::storage(self.ctx, label, len)?;
        let mut done = 0u64;
        while done < len {
            let n = (CHUNK_BYTES as u64).min(len - done) as usize;
            // write_buffer needs a multiple of 4 bytes: pad the last chunk with zeros.
            let padded = n.next_multiple_of(4);
            let src: &[u8] = match self.file.tensor_bytes(t) {
                Some(all) if padded == n => &all[(start + done) as usize..(start + done) as usize + n],
                _ => {
                    self.scratch.clear();
                    self.scratch.resize(padded, 0);
                    self.file
                        .read_tensor_range(t, start + done, &mut self.scratch[..n])
                        .await
                        .map_err(|e| GpuError::Unsupported { op: "upload", message: e.to_string() })?;
                    &self.scratch
                }
            };
            self.ctx.queue.write_buffer(&buffer, done, src);
            done += n as u64;
            self.pending += padded;
            self.uploaded += n as u64;
            if self.pending >= FLUSH_BYTES {
                self.flush()?;
            }
        }
        Ok(buffer)
    }

    /// Submits queued writes so their staging memory is released.
    pub fn flush(&mut self) -> Result<()> {
        self.ctx.queue.submit(std::iter::empty());
        self.ctx.poll_wait()?;
        self.pending = 0;
        self.ctx.check()
    }
}

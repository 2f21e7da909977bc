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

    /// The tensor `name`, which must have `n_dims` dimensions.
    fn tensor(&self, name: &str, n_dims: usize, what: &str) -> Result<TensorInfo> {
        let t = self.file.require_tensor(name).map_err(|e| GpuError::Unsupported { op: "upload", message: e.to_string() })?.clone();
        if t.dims.len() != n_dims {
            return Err(GpuError::Unsupported { op: "upload", message: format!("{name} is not {what}: {:?}", t.dims) });
        }
        Ok(t)
    }

    /// Uploads `t` as `n_units` equal units (rows, experts), whole units per buffer of at most
    /// the binding limit: (buffer, units, first unit) per part.
    async fn parts(&mut self, t: &TensorInfo, n_units: u64, unit: &'static str) -> Result<Vec<(wgpu::Buffer, u32, u32)>> {
        let unit_bytes = t.n_bytes / n_units;
        let per_part = (self.max_binding / unit_bytes).min(n_units);
        if per_part == 0 {
            return Err(GpuError::Limit { what: unit, need: unit_bytes, limit: self.max_binding });
        }
        let mut parts = Vec::new();
        let mut first = 0;
        while first < n_units {
            let n = per_part.min(n_units - first);
            let label = if n == n_units { t.name.clone() } else { format!("{}[{}]", t.name, parts.len()) };
            let buffer = self.copy(t, first * unit_bytes, n * unit_bytes, &label).await?;
            parts.push((buffer, n as u32, first as u32));
            first += n;
        }
        Ok(parts)
    }

    /// Uploads a 2-D tensor as a matrix, split by rows into parts of at most the binding limit.
    pub async fn matrix(&mut self, name: &str) -> Result<GpuMatrix> {
        let t = self.tensor(name, 2, "a matrix")?;
        let (n_in, n_rows) = (t.dims[0], t.dims[1]);
        let parts = self.parts(&t, n_rows, "one weight row").await?;
        let parts = parts.into_iter().map(|(buffer, rows, row_offset)| WeightPart { buffer, rows, row_offset }).collect();
        Ok(GpuMatrix { name: name.to_string(), ty: t.ty, n_in: n_in as u32, n_rows: n_rows as u32, parts })
    }

    /// Uploads a 3-D stack of expert matrices, split by whole experts into parts of at most
    /// the binding limit.
    pub async fn experts(&mut self, name: &str) -> Result<GpuExperts> {
        let t = self.tensor(name, 3, "a stack of matrices")?;
        let (n_in, n_rows, n_expert) = (t.dims[0], t.dims[1], t.dims[2]);
        let parts = self.parts(&t, n_expert, "one expert's weights").await?;
        let parts = parts.into_iter().map(|(buffer, experts, expert_offset)| ExpertPart { buffer, experts, expert_offset }).collect();
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

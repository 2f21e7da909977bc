//! Weight upload: tensors stream from the model file into GPU buffers in bounded chunks
//! (host memory never holds a second copy of the model), split by rows across several
//! buffers when larger than the device's storage binding limit, and laid out as the kernels
//! read them ([`layout`]).

use flint_core::gguf::{GgufFile, TensorInfo};
use flint_core::quant::{self, QuantType};

use crate::context::GpuContext;
use crate::error::{GpuError, Result};

/// How a weight format lies in GPU memory where that differs from the file.
///
/// Q4_0's 18-byte blocks, Q5_0's 22, Q8_0's 34 and Q6_K's 210-byte super-blocks are only
/// 2-aligned, so a kernel reading them from the file's layout loads two words and
/// funnel-shifts them for every word it needs (Q5_0: 7 loads per block; Q8_0: 9 and 8 shifts,
/// plus the scale; Q6_K: 20 loads per 32 weights). Each is a 2-byte f16 scale beside a 16-byte
/// multiple of the rest (Q5_0's 4-byte high bits aside). On the GPU each row instead holds
/// groups of [`GROUP`] blocks: their f16 scales in 16 bytes (zero-padded in a row's last,
/// shorter group), then each block's other bytes; Q5_0 puts each four blocks' high bits in 16
/// bytes before their quants. A full group is as long as in the file (Q4_0: 144 bytes, Q5_0:
/// 176, Q8_0: 272, Q6_K: 1,680), and every load is an aligned 16-byte vector (Q4_0 and Q5_0:
/// one of quants per block, beside the group's scales and high bits; Q8_0: two; Q6_K: six per
/// 32 weights). On a GPU that is full-width, coalesced transactions instead of
/// 2-byte-aligned word pairs; on CPU-type adapters, where each load with a computed address is
/// issued lane by lane, it is 3 loads per Q8_0 block instead of 10. Only a row's last, short
/// group is longer than in the file: its scales (and Q5_0's high bits) are padded to 16 bytes.
/// Q4_K and Q5_K (144 and 176 bytes) are 16-aligned as they are and are read as vectors in the
/// file's layout; every other format keeps the file's layout too.
pub mod layout {
    use flint_core::quant::QuantType;

    /// Blocks per group.
    pub const GROUP: usize = 8;
    /// Q5_0 blocks whose high bits share 16 bytes.
    const Q5_0_HIGH_GROUP: usize = 4;
    /// Bytes of a group's scales (8 f16), and of Q5_0's high bits for four blocks.
    const VEC: usize = 16;
    /// Bytes of one block's scale.
    const SCALE: usize = 2;
    /// Bytes of one Q5_0 block's high bits, after its scale.
    const Q5_0_HIGH: usize = 4;

    /// A regrouped format's block: its bytes, elements, and where its f16 scale lies; Q5_0's
    /// high bits (`high`) follow the scale.
    struct Block {
        bytes: usize,
        elems: usize,
        scale_at: usize,
        high: bool,
    }

    fn block(ty: QuantType) -> Option<Block> {
        let b = |bytes, elems, scale_at| Some(Block { bytes, elems, scale_at, high: false });
        match ty {
            QuantType::Q4_0 => b(18, 32, 0),
            QuantType::Q5_0 => Some(Block { bytes: 22, elems: 32, scale_at: 0, high: true }),
            QuantType::Q8_0 => b(34, 32, 0),
            QuantType::Q6K => b(210, 256, 208),
            _ => None,
        }
    }

    impl Block {
        /// Bytes of a group of `m` blocks on the GPU.
        fn group_bytes(&self, m: usize) -> usize {
            match self.high {
                true => VEC + m.div_ceil(Q5_0_HIGH_GROUP) * VEC + m * (self.bytes - SCALE - Q5_0_HIGH),
                false => VEC + m * (self.bytes - SCALE),
            }
        }
    }

    /// Whether `ty` is laid out differently on the GPU.
    pub fn repacked(ty: QuantType) -> bool {
        block(ty).is_some()
    }

    /// Whether kernels read `ty` as 16-byte vectors: the regrouped formats, and Q4_K and Q5_K,
    /// whose blocks are 16-aligned in the file's layout.
    pub fn vectors(ty: QuantType) -> bool {
        repacked(ty) || matches!(ty, QuantType::Q4K | QuantType::Q5K)
    }

    /// Bytes of one `n_in`-element row of `ty` on the GPU (None if `n_in` is not whole blocks).
    pub fn row_bytes(ty: QuantType, n_in: u64) -> Option<u64> {
        let Some(b) = block(ty) else {
            return ty.bytes_for(n_in);
        };
        if !n_in.is_multiple_of(b.elems as u64) {
            return None;
        }
        let blocks = n_in / b.elems as u64;
        let short = (blocks % GROUP as u64) as usize;
        Some(blocks / GROUP as u64 * b.group_bytes(GROUP) as u64 + if short > 0 { b.group_bytes(short) as u64 } else { 0 })
    }

    /// Appends whole rows `src` of `n_in` elements (file layout) to `dst` in GPU layout.
    /// `src` must hold whole rows.
    pub fn append_rows(ty: QuantType, n_in: usize, src: &[u8], dst: &mut Vec<u8>) {
        let Some(b) = block(ty) else {
            dst.extend_from_slice(src);
            return;
        };
        // 16 bytes of one field of each of `blocks`, zero-padded.
        let fields = |dst: &mut Vec<u8>, blocks: &[u8], at: usize, len: usize| {
            let start = dst.len();
            dst.resize(start + VEC, 0);
            for (i, block) in blocks.chunks_exact(b.bytes).enumerate() {
                dst[start + len * i..start + len * (i + 1)].copy_from_slice(&block[at..at + len]);
            }
        };
        for row in src.chunks_exact(n_in / b.elems * b.bytes) {
            for group in row.chunks(GROUP * b.bytes) {
                fields(dst, group, b.scale_at, SCALE);
                if b.high {
                    for four in group.chunks(Q5_0_HIGH_GROUP * b.bytes) {
                        fields(dst, four, SCALE, Q5_0_HIGH);
                        for block in four.chunks_exact(b.bytes) {
                            dst.extend_from_slice(&block[SCALE + Q5_0_HIGH..]);
                        }
                    }
                    continue;
                }
                for block in group.chunks_exact(b.bytes) {
                    dst.extend_from_slice(&block[..b.scale_at]);
                    dst.extend_from_slice(&block[b.scale_at + SCALE..]);
                }
            }
        }
    }

    /// Rows of `ty` (file layout, `n_in` elements each) in GPU layout.
    pub fn to_gpu(ty: QuantType, n_in: usize, src: &[u8]) -> Vec<u8> {
        let mut out = Vec::with_capacity(src.len() + src.len() / 8);
        append_rows(ty, n_in, src, &mut out);
        out
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        /// Two rows of `blocks` blocks of `ty` with distinct bytes, regrouped; checks every
        /// block's scale and other bytes (for Q5_0 its high bits and quants) where the shader
        /// reads them, and the short group's padding.
        fn check_regrouped(ty: QuantType, blocks: usize) {
            let b = block(ty).unwrap();
            let n_in = blocks * b.elems;
            let src: Vec<u8> = (0..2 * blocks * b.bytes).map(|i| (i * 7 + 3) as u8).collect();
            let out = to_gpu(ty, n_in, &src);
            let row = row_bytes(ty, n_in as u64).unwrap() as usize;
            assert_eq!(row % 16, 0, "rows stay 16-aligned");
            assert_eq!(out.len(), 2 * row);
            let full = b.group_bytes(GROUP);
            assert_eq!(full, GROUP * b.bytes, "a full group is as long as in the file");
            let short = blocks % GROUP;
            assert_eq!(row, blocks / GROUP * full + if short > 0 { b.group_bytes(short) } else { 0 });
            for r in 0..2 {
                for k in 0..blocks {
                    let file = &src[(r * blocks + k) * b.bytes..][..b.bytes];
                    let group = r * row + (k / GROUP) * full;
                    let i = k % GROUP;
                    assert_eq!(&out[group + SCALE * i..][..SCALE], &file[b.scale_at..][..SCALE], "scale of row {r} block {k}");
                    if b.high {
                        // Four blocks: 16 bytes of high bits, then 16 bytes of quants each.
                        let (n, at) = (Q5_0_HIGH_GROUP, i % Q5_0_HIGH_GROUP);
                        let four = group + VEC + (i / n) * (1 + n) * VEC;
                        assert_eq!(&out[four + Q5_0_HIGH * at..][..Q5_0_HIGH], &file[SCALE..][..Q5_0_HIGH], "high bits of row {r} block {k}");
                        assert_eq!(&out[four + VEC * (1 + at)..][..VEC], &file[SCALE + Q5_0_HIGH..], "quants of row {r} block {k}");
                        continue;
                    }
                    let at = group + VEC + (b.bytes - SCALE) * i;
                    assert_eq!(&out[at..][..b.scale_at], &file[..b.scale_at], "bytes before the scale, row {r} block {k}");
                    assert_eq!(
                        &out[at + b.scale_at..][..b.bytes - b.scale_at - SCALE],
                        &file[b.scale_at + SCALE..],
                        "bytes after the scale, row {r} block {k}"
                    );
                }
                if short > 0 {
                    let last = r * row + (blocks / GROUP) * full;
                    assert!(out[last + SCALE * short..last + VEC].iter().all(|&x| x == 0), "the short group's scale padding");
                    let n = Q5_0_HIGH_GROUP;
                    if b.high && !short.is_multiple_of(n) {
                        let four = last + VEC + (short / n) * (1 + n) * VEC;
                        assert!(out[four + Q5_0_HIGH * (short % n)..four + VEC].iter().all(|&x| x == 0), "the short group's high-bit padding");
                    }
                }
            }
            // Whole groups take the file's bytes.
            assert_eq!(row_bytes(ty, (GROUP * b.elems) as u64), ty.bytes_for((GROUP * b.elems) as u64));
            assert_eq!(row_bytes(ty, b.elems as u64 / 2), None);
        }

        #[test]
        fn q8_0_rows_keep_every_scale_and_quant_in_16_byte_groups() {
            // 20 blocks a row (n_in 640, gemma's): groups of 8, 8 and 4.
            check_regrouped(QuantType::Q8_0, 20);
            assert_eq!(row_bytes(QuantType::Q8_0, 640), Some(3 * 16 + 640));
        }

        #[test]
        fn q4_0_and_q5_0_rows_keep_every_scale_high_bit_and_quant_in_16_byte_groups() {
            // 28 blocks a row (n_in 896, qwen2.5-0.5b's): groups of 8, 8, 8 and 4; then a
            // short group of 7 (two fours, the second short) and of 1.
            for ty in [QuantType::Q4_0, QuantType::Q5_0] {
                for blocks in [28, 15, 9] {
                    check_regrouped(ty, blocks);
                }
            }
            assert_eq!(row_bytes(QuantType::Q5_0, 896), Some(3 * 176 + 16 + 16 + 4 * 16));
        }

        #[test]
        fn q6_k_rows_keep_every_scale_and_quant_in_16_byte_groups() {
            // 14 super-blocks a row (n_in 3584, Qwen2.5-7B's): groups of 8 and 6.
            check_regrouped(QuantType::Q6K, 14);
            assert_eq!(row_bytes(QuantType::Q6K, 3584), Some(2 * 16 + 14 * 208));
        }

        #[test]
        fn other_formats_keep_the_file_layout() {
            let src: Vec<u8> = (0..144).map(|i| i as u8).collect();
            assert_eq!(to_gpu(QuantType::Q4K, 256, &src), src);
            assert_eq!(row_bytes(QuantType::Q4K, 256), Some(144));
        }
    }
}

/// The format a stack of matrices of `formats` takes ([`Uploader::stack`]): their common
/// format, or Q8_0 where each is Q4_0, Q5_0 or Q8_0 and one is Q8_0: the others are recoded
/// to Q8_0 with the same values (`quant::exact_q8_0`), which costs 12 (Q5_0) or 16 (Q4_0) bytes
/// more per 32 weights and saves a dispatch. llama.cpp's k-quant mixes give such layers where
/// a row length is not whole 256-element blocks (Q5_0 Q and K beside a Q8_0 V).
pub fn stack_format(formats: &[QuantType]) -> Option<QuantType> {
    use QuantType::{Q4_0, Q5_0, Q8_0};
    let first = *formats.first()?;
    if formats.iter().all(|&f| f == first) {
        return Some(first);
    }
    (formats.iter().all(|f| [Q4_0, Q5_0, Q8_0].contains(f)) && formats.contains(&Q8_0)).then_some(Q8_0)
}

/// `len` bytes of tensor `t` from byte `start`, zero-padded to `padded` bytes: straight from
/// the mapped file where it is mapped and no padding is needed, else read into `scratch`.
async fn read_range<'s>(file: &'s GgufFile, scratch: &'s mut Vec<u8>, t: &TensorInfo, start: u64, len: usize, padded: usize) -> Result<&'s [u8]> {
    if let Some(all) = file.tensor_bytes(t).filter(|_| padded == len) {
        return Ok(&all[start as usize..start as usize + len]);
    }
    scratch.clear();
    scratch.resize(padded, 0);
    file.read_tensor_range(t, start, &mut scratch[..len]).await.map_err(|e| GpuError::Unsupported { op: "upload", message: e.to_string() })?;
    Ok(scratch)
}

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

/// A quantized matrix on the GPU, GGUF blocks in GPU layout ([`layout`]), in one or more row
/// parts.
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

    /// Uploads `t` as `n_units` equal units (rows, experts) of `unit_rows` rows, whole units
    /// per buffer of at most the binding limit, in GPU layout: (buffer, units, first unit) per
    /// part.
    async fn parts(&mut self, t: &TensorInfo, n_units: u64, unit_rows: u64, unit: &'static str) -> Result<Vec<(wgpu::Buffer, u32, u32)>> {
        let gpu_row = layout::row_bytes(t.ty, t.dims[0]).unwrap_or(u64::MAX);
        let unit_bytes = gpu_row.saturating_mul(unit_rows);
        let per_part = (self.max_binding / unit_bytes).min(n_units);
        if per_part == 0 {
            return Err(GpuError::Limit { what: unit, need: unit_bytes, limit: self.max_binding });
        }
        let mut parts = Vec::new();
        let mut first = 0;
        while first < n_units {
            let n = per_part.min(n_units - first);
            let label = if n == n_units { t.name.clone() } else { format!("{}[{}]", t.name, parts.len()) };
            let rows = (first * unit_rows, n * unit_rows);
            let buffer = crate::buffer::storage(self.ctx, &label, rows.1 * gpu_row)?;
            self.copy_rows(t, rows, t.ty, &buffer, 0).await?;
            parts.push((buffer, n as u32, first as u32));
            first += n;
        }
        Ok(parts)
    }

    /// Uploads a 2-D tensor as a matrix, split by rows into parts of at most the binding limit.
    pub async fn matrix(&mut self, name: &str) -> Result<GpuMatrix> {
        let t = self.tensor(name, 2, "a matrix")?;
        let (n_in, n_rows) = (t.dims[0], t.dims[1]);
        let parts = self.parts(&t, n_rows, 1, "one weight row").await?;
        let parts = parts.into_iter().map(|(buffer, rows, row_offset)| WeightPart { buffer, rows, row_offset }).collect();
        Ok(GpuMatrix { name: name.to_string(), ty: t.ty, n_in: n_in as u32, n_rows: n_rows as u32, parts })
    }

    /// The format and row length of the 2-D tensor `name`.
    pub fn format(&self, name: &str) -> Result<(QuantType, u64)> {
        let t = self.tensor(name, 2, "a matrix")?;
        Ok((t.ty, t.dims[0]))
    }

    /// Uploads 2-D tensors with the same row length as one matrix, their rows one after
    /// another in one buffer (`Output::Split` and `Output::Glu` of `ops::matmul` read such
    /// stacks), named `name`, in [`stack_format`]. None when the row lengths differ, the
    /// formats have no stack format, a tensor would start at a byte offset that is not a
    /// multiple of 4, or the stack would not fit one binding: the caller then uploads them
    /// apart.
    pub async fn stack(&mut self, name: &str, tensors: &[&str]) -> Result<Option<GpuMatrix>> {
        let ts = tensors.iter().map(|n| self.tensor(n, 2, "a matrix")).collect::<Result<Vec<_>>>()?;
        let Some(first) = ts.first() else { return Ok(None) };
        let n_in = first.dims[0];
        let Some(ty) = stack_format(&ts.iter().map(|t| t.ty).collect::<Vec<_>>()) else { return Ok(None) };
        if ts.iter().any(|t| t.dims[0] != n_in) {
            return Ok(None);
        }
        let gpu_row = layout::row_bytes(ty, n_in).unwrap_or(u64::MAX);
        let n_rows = ts.iter().map(|t| t.dims[1]).sum::<u64>();
        let bytes = gpu_row.saturating_mul(n_rows);
        // Each tensor starts where a buffer write may (a multiple of 4 bytes).
        let aligned = ts.iter().all(|t| (t.dims[1] * gpu_row).is_multiple_of(4));
        if !aligned || bytes > self.max_binding || n_rows > u32::MAX as u64 {
            return Ok(None);
        }
        let buffer = crate::buffer::storage(self.ctx, name, bytes)?;
        let mut at = 0;
        for t in &ts {
            self.copy_rows(t, (0, t.dims[1]), ty, &buffer, at * gpu_row).await?;
            at += t.dims[1];
        }
        let parts = vec![WeightPart { buffer, rows: n_rows as u32, row_offset: 0 }];
        Ok(Some(GpuMatrix { name: name.to_string(), ty, n_in: n_in as u32, n_rows: n_rows as u32, parts }))
    }

    /// Uploads a 3-D stack of expert matrices, split by whole experts into parts of at most
    /// the binding limit.
    pub async fn experts(&mut self, name: &str) -> Result<GpuExperts> {
        let t = self.tensor(name, 3, "a stack of matrices")?;
        let (n_in, n_rows, n_expert) = (t.dims[0], t.dims[1], t.dims[2]);
        let parts = self.parts(&t, n_expert, n_rows, "one expert's weights").await?;
        let parts = parts.into_iter().map(|(buffer, experts, expert_offset)| ExpertPart { buffer, experts, expert_offset }).collect();
        Ok(GpuExperts { name: name.to_string(), ty: t.ty, n_in: n_in as u32, n_rows: n_rows as u32, n_expert: n_expert as u32, parts })
    }

    /// Uploads a small tensor (norm weights, biases) dequantized to f32.
    pub async fn vector(&mut self, name: &str) -> Result<wgpu::Buffer> {
        self.vectors(name, &[name]).await
    }

    /// Uploads small tensors dequantized to f32, one after another in one buffer named
    /// `label` (the biases of a stack of matrices).
    pub async fn vectors(&mut self, label: &str, names: &[&str]) -> Result<wgpu::Buffer> {
        let upload = |e: String| GpuError::Unsupported { op: "upload", message: e };
        let mut v = Vec::new();
        for name in names {
            let t = self.file.require_tensor(name).map_err(|e| upload(e.to_string()))?.clone();
            let mut raw = vec![0u8; t.n_bytes as usize];
            self.file.read_tensor_range(&t, 0, &mut raw).await.map_err(|e| upload(e.to_string()))?;
            let at = v.len();
            v.resize(at + t.n_elems as usize, 0f32);
            quant::dequantize(t.ty, &raw, &mut v[at..]).map_err(|e| upload(e.to_string()))?;
        }
        crate::buffer::storage_init(self.ctx, label, bytemuck::cast_slice(&v))
    }

    /// Copies rows `first..first + n` of the 2-D or 3-D tensor `t` into `buffer` from byte
    /// `at` as format `ty` (its own, or a stack's: see [`stack_format`]) in GPU layout.
    async fn copy_rows(&mut self, t: &TensorInfo, rows: (u64, u64), ty: QuantType, buffer: &wgpu::Buffer, at: u64) -> Result<()> {
        let all_rows = t.dims[1..].iter().product::<u64>();
        let src_row = t.n_bytes / all_rows;
        if layout::repacked(ty) || ty != t.ty {
            let gpu_row = layout::row_bytes(ty, t.dims[0]).unwrap_or(u64::MAX);
            self.copy_repacked(t, rows, src_row, ty, gpu_row, buffer, at).await
        } else {
            self.copy(t, rows.0 * src_row, rows.1 * src_row, buffer, at).await
        }
    }

    /// Copies `len` bytes of tensor `t` from byte `start` into `buffer` from byte `at`, chunk
    /// by chunk.
    async fn copy(&mut self, t: &TensorInfo, start: u64, len: u64, buffer: &wgpu::Buffer, at: u64) -> Result<()> {
        let mut done = 0u64;
        while done < len {
            let n = (CHUNK_BYTES as u64).min(len - done) as usize;
            // write_buffer needs a multiple of 4 bytes: pad the last chunk with zeros.
            let padded = n.next_multiple_of(4);
            let src = read_range(self.file, &mut self.scratch, t, start + done, n, padded).await?;
            self.ctx.queue.write_buffer(buffer, at + done, src);
            done += n as u64;
            self.queued(padded, n)?;
        }
        Ok(())
    }

    /// Copies rows `first..first + n` of tensor `t` (`src_row` bytes each in the file) into
    /// `buffer` from byte `at` as format `ty` in its GPU layout (`gpu_row` bytes each), whole
    /// rows at a time; rows of another format than `ty` are recoded (Q4_0 and Q5_0 to Q8_0,
    /// see [`stack_format`]).
    #[allow(clippy::too_many_arguments)]
    async fn copy_repacked(
        &mut self,
        t: &TensorInfo,
        (first, n): (u64, u64),
        src_row: u64,
        ty: QuantType,
        gpu_row: u64,
        buffer: &wgpu::Buffer,
        at: u64,
    ) -> Result<()> {
        let per_write = (CHUNK_BYTES as u64 / src_row).max(1);
        let mut packed = Vec::new();
        let mut done = 0u64;
        while done < n {
            let rows = per_write.min(n - done);
            let (start, len) = ((first + done) * src_row, (rows * src_row) as usize);
            let src = read_range(self.file, &mut self.scratch, t, start, len, len).await?;
            let recoded;
            let src = match t.ty == ty {
                true => src,
                false => {
                    recoded = quant::exact_q8_0(t.ty, src)
                        .filter(|_| ty == QuantType::Q8_0)
                        .ok_or_else(|| GpuError::Unsupported { op: "upload", message: format!("{} cannot be recoded from {} to {ty}", t.name, t.ty) })?;
                    &recoded[..]
                }
            };
            packed.clear();
            layout::append_rows(ty, t.dims[0] as usize, src, &mut packed);
            self.ctx.queue.write_buffer(buffer, at + done * gpu_row, &packed);
            done += rows;
            self.queued(packed.len(), len)?;
        }
        Ok(())
    }

    /// Counts a queued write of `written` bytes (`read` of them from the file) and flushes the
    /// queue once [`FLUSH_BYTES`] are pending.
    fn queued(&mut self, written: usize, read: usize) -> Result<()> {
        self.pending += written;
        self.uploaded += read as u64;
        if self.pending >= FLUSH_BYTES {
            self.flush()?;
        }
        Ok(())
    }

    /// Submits queued writes so their staging memory is released.
    pub fn flush(&mut self) -> Result<()> {
        self.ctx.queue.submit(std::iter::empty());
        self.ctx.poll_wait()?;
        self.pending = 0;
        self.ctx.check()
    }
}

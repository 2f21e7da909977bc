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
/// Most blocks are only 2-, 4- or 8-aligned in the file (Q4_0 and IQ4_NL 18 bytes, Q4_1 20, Q5_0
/// 22, Q5_1 24, Q8_0 34; super-blocks: Q2_K 84, Q3_K 110, IQ4_XS 136, Q6_K 210), so a kernel
/// reading the file's layout loads two words and funnel-shifts them for every word it needs
/// (Q5_0: 7 loads per block; Q8_0: 9 and 8 shifts, plus the scale; Q6_K: 20 loads per 32
/// weights). Each block is a few small header fields (f16 scales and mins, packed sub-block
/// scales) beside a 16-byte multiple of quants (Q5_0's and Q5_1's 4-byte high bits aside). On
/// the GPU each row instead holds groups of [`GROUP`] blocks: each header field of the group's
/// blocks side by side, padded to 16 bytes, then each block's quants; Q5_0 and Q5_1 put each
/// four blocks' high bits in 16 bytes before their quants. A full group is as long as in the
/// file (Q4_0: 144 bytes, Q5_0: 176, Q8_0: 272, Q6_K: 1,680, ...), and every load is an
/// aligned 16-byte vector (a 32-weight block: one or two of quants, beside the group's header
/// vectors that its lanes share). On a GPU that is full-width, coalesced transactions instead
/// of 2-byte-aligned word pairs; on CPU-type adapters, where each load with a computed address
/// is issued lane by lane, it is 3 loads per Q8_0 block instead of 10. Only a row's last,
/// short group is longer than in the file: its header fields take a full group's vectors
/// (and its last four's high bits 16 bytes). Q4_K and Q5_K (144 and 176 bytes) are 16-aligned
/// as they are and are read as vectors in the file's layout; the float formats keep the file's
/// layout too.
pub mod layout {
    use flint_core::quant::QuantType;

    /// Blocks per group.
    pub const GROUP: usize = 8;
    /// Q5_0 and Q5_1 blocks whose high bits share 16 bytes.
    const HIGH_GROUP: usize = 4;
    /// The unit of alignment: bytes of one vector load.
    const VEC: usize = 16;
    /// Bytes of one block's high bits (Q5_0, Q5_1), right after its header fields.
    const HIGH: usize = 4;

    /// A regrouped format's block: its bytes and elements, its header fields (their lengths,
    /// consecutive from byte `head_at`), and whether 4 bytes of high bits follow them. The
    /// rest of the block, before and after those, is its quants.
    struct Block {
        bytes: usize,
        elems: usize,
        head_at: usize,
        heads: &'static [usize],
        high: bool,
    }

    fn block(ty: QuantType) -> Option<Block> {
        use QuantType::*;
        let b = |bytes, elems, head_at, heads| Some(Block { bytes, elems, head_at, heads, high: false });
        match ty {
            // d
            Q4_0 | IQ4NL => b(18, 32, 0, &[2]),
            // d and m together
            Q4_1 => b(20, 32, 0, &[4]),
            Q5_0 => Some(Block { high: true, ..b(22, 32, 0, &[2])? }),
            Q5_1 => Some(Block { high: true, ..b(24, 32, 0, &[4])? }),
            Q8_0 => b(34, 32, 0, &[2]),
            // d and dmin together, after scales[16] and qs[64]
            Q2K => b(84, 256, 80, &[4]),
            // scales[12], then d, after hmask[32] and qs[64]
            Q3K => b(110, 256, 96, &[12, 2]),
            // d, after ql[128], qh[64] and scales[16]
            Q6K => b(210, 256, 208, &[2]),
            // d, scales_h and scales_l together, before qs[128]
            IQ4XS => b(136, 256, 0, &[8]),
            _ => None,
        }
    }

    /// Bytes of a group's copies of a `len`-byte header field, [`GROUP`] of them padded to a
    /// whole vector; a short group's take as many, so that kernels find every field and the
    /// quants at the same place in every group.
    fn field_bytes(len: usize) -> usize {
        (GROUP * len).div_ceil(VEC) * VEC
    }

    impl Block {
        /// Bytes of the header fields and high bits.
        fn head_bytes(&self) -> usize {
            self.heads.iter().sum::<usize>() + if self.high { HIGH } else { 0 }
        }

        /// Bytes of a group of `m` blocks on the GPU.
        fn group_bytes(&self, m: usize) -> usize {
            let heads: usize = self.heads.iter().map(|&len| field_bytes(len)).sum();
            let high = if self.high { m.div_ceil(HIGH_GROUP) * VEC } else { 0 };
            heads + high + m * (self.bytes - self.head_bytes())
        }

        /// Appends each block's quants: the bytes around its header fields and high bits.
        fn quants(&self, blocks: &[u8], dst: &mut Vec<u8>) {
            for block in blocks.chunks_exact(self.bytes) {
                dst.extend_from_slice(&block[..self.head_at]);
                dst.extend_from_slice(&block[self.head_at + self.head_bytes()..]);
            }
        }
    }

    /// Whether `ty` is laid out differently on the GPU.
    pub fn repacked(ty: QuantType) -> bool {
        block(ty).is_some()
    }

    /// Vectors (16 bytes) in a full group of a regrouped format: where each group after a
    /// row's first starts, as the kernels find it (`GROUP_VEC4S`).
    pub fn group_vectors(ty: QuantType) -> Option<u32> {
        block(ty).map(|b| (b.group_bytes(GROUP) / VEC) as u32)
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
        // One field of each of `blocks`, side by side, zero-padded to `region` bytes.
        let field = |dst: &mut Vec<u8>, blocks: &[u8], at: usize, len: usize, region: usize| {
            let start = dst.len();
            dst.resize(start + region, 0);
            for (i, block) in blocks.chunks_exact(b.bytes).enumerate() {
                dst[start + len * i..start + len * (i + 1)].copy_from_slice(&block[at..at + len]);
            }
        };
        for row in src.chunks_exact(n_in / b.elems * b.bytes) {
            for group in row.chunks(GROUP * b.bytes) {
                let mut at = b.head_at;
                for &len in b.heads {
                    field(dst, group, at, len, field_bytes(len));
                    at += len;
                }
                if !b.high {
                    b.quants(group, dst);
                    continue;
                }
                for four in group.chunks(HIGH_GROUP * b.bytes) {
                    field(dst, four, at, HIGH, VEC);
                    b.quants(four, dst);
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
        /// block's header fields, high bits and quants where the shader reads them, and the
        /// short group's padding.
        fn check_regrouped(ty: QuantType, blocks: usize) {
            let b = block(ty).unwrap();
            let n_in = blocks * b.elems;
            let src: Vec<u8> = (0..2 * blocks * b.bytes).map(|i| (i * 7 + 3) as u8).collect();
            let out = to_gpu(ty, n_in, &src);
            let row = row_bytes(ty, n_in as u64).unwrap() as usize;
            assert_eq!(row % VEC, 0, "rows stay 16-aligned");
            assert_eq!(out.len(), 2 * row);
            let full = b.group_bytes(GROUP);
            assert_eq!(full, GROUP * b.bytes, "a full group is as long as in the file");
            assert_eq!(group_vectors(ty), Some((full / VEC) as u32), "the kernels' group stride");
            let short = blocks % GROUP;
            assert_eq!(row, blocks / GROUP * full + if short > 0 { b.group_bytes(short) } else { 0 });
            let heads: usize = b.heads.iter().map(|&len| field_bytes(len)).sum();
            let quants = b.bytes - b.head_bytes();
            for r in 0..2 {
                for k in 0..blocks {
                    let file = &src[(r * blocks + k) * b.bytes..][..b.bytes];
                    let group = r * row + (k / GROUP) * full;
                    let i = k % GROUP;
                    let (mut region, mut at) = (group, b.head_at);
                    for &len in b.heads {
                        assert_eq!(&out[region + len * i..][..len], &file[at..][..len], "{len}-byte field at {at} of row {r} block {k}");
                        region += field_bytes(len);
                        at += len;
                    }
                    let mut want = file[..b.head_at].to_vec();
                    want.extend_from_slice(&file[b.head_at + b.head_bytes()..]);
                    let got = if b.high {
                        // Four blocks: 16 bytes of high bits, then each block's quants.
                        let (n, j) = (HIGH_GROUP, i % HIGH_GROUP);
                        let four = region + (i / n) * (VEC + n * quants);
                        assert_eq!(&out[four + HIGH * j..][..HIGH], &file[at..][..HIGH], "high bits of row {r} block {k}");
                        &out[four + VEC + quants * j..][..quants]
                    } else {
                        &out[region + quants * i..][..quants]
                    };
                    assert_eq!(got, &want[..], "quants of row {r} block {k}");
                }
                if short > 0 {
                    let last = r * row + (blocks / GROUP) * full;
                    let mut region = last;
                    for &len in b.heads {
                        assert!(
                            out[region + len * short..region + field_bytes(len)].iter().all(|&x| x == 0),
                            "the short group's padding of a {len}-byte field"
                        );
                        region += field_bytes(len);
                    }
                    let n = HIGH_GROUP;
                    if b.high && !short.is_multiple_of(n) {
                        let four = region + (short / n) * (VEC + n * quants);
                        assert!(out[four + HIGH * (short % n)..four + VEC].iter().all(|&x| x == 0), "the short group's high-bit padding");
                    }
                    assert_eq!(row - (blocks / GROUP) * full, heads + short.div_ceil(n) * VEC * b.high as usize + short * quants);
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
        fn legacy_rows_keep_every_field_high_bit_and_quant_in_16_byte_groups() {
            // 28 blocks a row (n_in 896, qwen2.5-0.5b's): groups of 8, 8, 8 and 4; then a
            // short group of 7 (two fours, the second short), of 3 (d and m of Q4_1 and Q5_1
            // in a full group's two vectors) and of 1.
            use QuantType::*;
            for ty in [Q4_0, Q4_1, Q5_0, Q5_1, IQ4NL] {
                for blocks in [28, 15, 11, 9] {
                    check_regrouped(ty, blocks);
                }
            }
            assert_eq!(row_bytes(Q5_0, 896), Some(3 * 176 + 16 + 16 + 4 * 16));
            assert_eq!(row_bytes(Q5_1, 896), Some(3 * 192 + 32 + 16 + 4 * 16));
            assert_eq!(row_bytes(Q4_1, 11 * 32), Some(160 + 32 + 3 * 16));
        }

        #[test]
        fn k_rows_keep_every_field_and_quant_in_16_byte_groups() {
            // 14 super-blocks a row (n_in 3584, Qwen2.5-7B's): groups of 8 and 6; 11: a short
            // group of 3 (Q3_K's scales take a full group's 96 bytes); 9: of 1.
            use QuantType::*;
            for ty in [Q2K, Q3K, Q6K, IQ4XS] {
                for blocks in [14, 11, 9] {
                    check_regrouped(ty, blocks);
                }
            }
            assert_eq!(row_bytes(Q6K, 3584), Some(2 * 16 + 14 * 208));
            assert_eq!(row_bytes(Q3K, 11 * 256), Some(880 + 96 + 16 + 3 * 96));
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

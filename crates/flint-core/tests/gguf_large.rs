//! A GGUF file larger than 4 GiB (sparse on disk): a tensor whose data starts past byte 2³²
//! is read where it is, through the memory map and through ranged reads, so 7–8B files'
//! offsets are not cut to 32 bits anywhere in the reader.

#[path = "common/gguf_writer.rs"]
mod gguf_writer;

use std::io::{Seek, SeekFrom, Write};

use flint_core::gguf::GgufFile;
use futures::executor::block_on;
use gguf_writer::{ggml, GgufWriter, TensorSpec, Val};

#[test]
fn a_tensor_past_four_gib_is_read_where_it_is() {
    // 4 GiB + 4 KiB of f32, starting at 5 GiB into the data section.
    let elems = (1u64 << 30) + 1024;
    let at = 5u64 << 30;
    let big = TensorSpec { offset: Some(at), ..TensorSpec::with_data("big", &[elems], ggml::F32, Vec::new()) };
    let w =
        GgufWriter::new().kv("general.architecture", Val::string("llama")).tensor_spec(TensorSpec::f32("small", &[4], &[1.0, 2.0, 3.0, 4.0])).tensor_spec(big);
    let path = std::env::temp_dir().join(format!("flint-large-{}.gguf", std::process::id()));
    let mut f = std::fs::File::create(&path).unwrap();
    f.write_all(&w.finish()).unwrap();
    let start = w.data_offset() + at;
    let end = start + elems * 4;
    f.set_len(end).unwrap();
    // Marks at the tensor's first and last values and one past 2^32 + 2^31 within it.
    let marks = [(0u64, 1.5f32), (elems / 2, -7.0), (elems - 1, -2.25)];
    for (i, v) in marks {
        f.seek(SeekFrom::Start(start + i * 4)).unwrap();
        f.write_all(&v.to_le_bytes()).unwrap();
    }
    drop(f);
    let file = GgufFile::open(&path).unwrap();
    let t = file.require_tensor("big").unwrap().clone();
    assert_eq!((t.offset, t.n_bytes, t.n_elems), (at, elems * 4, elems));
    assert!(start > 1 << 32 && end > 1 << 33);
    for (i, v) in marks {
        let mut buf = [0u8; 4];
        block_on(file.read_tensor_range(&t, i * 4, &mut buf)).unwrap();
        assert_eq!(f32::from_le_bytes(buf), v, "ranged read of element {i}");
        if let Some(bytes) = file.tensor_bytes(&t) {
            let j = (i * 4) as usize;
            assert_eq!(f32::from_le_bytes(bytes[j..j + 4].try_into().unwrap()), v, "mapped element {i}");
        }
    }
    assert_eq!(block_on(file.read_f32("small")).unwrap(), vec![1.0, 2.0, 3.0, 4.0]);
    drop(file);
    std::fs::remove_file(&path).unwrap();
}

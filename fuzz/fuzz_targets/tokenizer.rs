//! Encode and decode of arbitrary bytes with real tokenizers (one SPM, byte-level BPEs with
//! several pre-tokenizers), built once from the vocabulary files of ../shared/golden: the
//! first input byte picks the tokenizer and the mode, the rest is the text (or the ids).
#![no_main]

use std::sync::OnceLock;

use flint_core::gguf::GgufFile;
use flint_core::tokenizer::Tokenizer;
use libfuzzer_sys::fuzz_target;

const VOCABS: &[&str] = &["llama-spm", "qwen2", "llama-bpe", "gpt-2", "deepseek-coder", "falcon"];

fn tokenizers() -> &'static [Tokenizer] {
    static T: OnceLock<Vec<Tokenizer>> = OnceLock::new();
    T.get_or_init(|| {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../shared/golden/llama-cpp-vocab");
        VOCABS
            .iter()
            .filter_map(|v| GgufFile::open(format!("{dir}/ggml-vocab-{v}.gguf")).ok())
            .map(|f| Tokenizer::from_metadata(&f.metadata).expect("a golden vocabulary"))
            .collect()
    })
}

// Built before the first input: with the sanitizers, building six vocabularies takes longer
// than the 1 s an input may take.
fuzz_target!(init: { tokenizers(); }, |data: &[u8]| {
    let Some((&pick, rest)) = data.split_first() else { return };
    let toks = tokenizers();
    assert!(!toks.is_empty(), "no vocabulary files found");
    let tok = &toks[pick as usize % toks.len()];
    match (pick as usize / toks.len()) % 3 {
        // Text: encode, with and without special-token parsing, then decode back.
        0 | 1 => {
            let text = String::from_utf8_lossy(rest);
            if let Ok(ids) = tok.encode(&text, pick & 1 == 1, pick % 3 == 0) {
                let _ = tok.decode(&ids, false);
                let _ = tok.decode(&ids, true);
            }
        }
        // Ids (any u32, in range or not): decode and the bytes of each.
        _ => {
            let ids: Vec<u32> = rest.chunks_exact(4).map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect();
            let _ = tok.decode(&ids, pick & 1 == 1);
            for &id in &ids {
                let _ = tok.token_bytes(id);
            }
        }
    }
});

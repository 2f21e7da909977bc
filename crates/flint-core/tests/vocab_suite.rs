//! llama.cpp's own tokenizer suite (../shared/golden/llama-cpp-vocab: its vocabulary-only
//! `ggml-vocab-*.gguf` files with `.inp` strings and `.out` ids, tokenized with no BOS and
//! special tokens not parsed): every string of each vocabulary Flint supports gives exactly
//! llama.cpp's ids, and decoding them gives the string back where the vocabulary can.

use flint_core::gguf::GgufFile;
use flint_core::tokenizer::Tokenizer;

const SUITE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../../shared/golden/llama-cpp-vocab");
const SEPARATOR: &str = "\n__ggml_vocab_test__\n";

/// (strings, expected ids) of one vocabulary's `.inp` / `.out` pair.
fn cases(name: &str) -> Vec<(String, Vec<u32>)> {
    let inp = std::fs::read_to_string(format!("{SUITE}/ggml-vocab-{name}.gguf.inp")).unwrap();
    let out = std::fs::read_to_string(format!("{SUITE}/ggml-vocab-{name}.gguf.out")).unwrap();
    let mut strings: Vec<&str> = inp.split(SEPARATOR).collect();
    // The file ends with a separator (without its last newline) after the last string.
    if let Some(last) = strings.last_mut() {
        *last = last.strip_suffix("\n__ggml_vocab_test__").unwrap_or(last);
        if last.is_empty() {
            strings.pop();
        }
    }
    let ids: Vec<Vec<u32>> = out.lines().map(|l| l.split_whitespace().map(|t| t.parse().unwrap()).collect()).collect();
    assert_eq!(strings.len(), ids.len(), "{name}: {} strings, {} id lines", strings.len(), ids.len());
    strings.into_iter().map(str::to_string).zip(ids).collect()
}

const VOCABS: [&str; 12] =
    ["llama-spm", "llama-bpe", "phi-3", "qwen2", "qwen35", "gpt-2", "deepseek-coder", "deepseek-llm", "falcon", "mpt", "refact", "starcoder"];

fn tokenizer(name: &str) -> Tokenizer {
    let file = GgufFile::open(format!("{SUITE}/ggml-vocab-{name}.gguf")).unwrap_or_else(|e| panic!("{name}: {e}"));
    Tokenizer::from_metadata(&file.metadata).unwrap_or_else(|e| panic!("{name}: {e}"))
}

#[test]
fn every_vocabulary_gives_llama_cpp_ids() {
    let mut failures = Vec::new();
    for name in VOCABS {
        let tok = tokenizer(name);
        let cases = cases(name);
        assert!(cases.len() >= 40, "{name}: {} strings", cases.len());
        for (text, want) in &cases {
            let got = tok.encode(text, false, false).unwrap();
            if got != *want {
                failures.push(format!("{name} {text:?}: got {got:?}, llama.cpp {want:?}"));
            }
        }
    }
    assert!(failures.is_empty(), "{} strings differ:\n{}", failures.len(), failures.join("\n"));
}

#[test]
fn decoding_gives_the_strings_back() {
    let mut failures = Vec::new();
    for name in VOCABS {
        let tok = tokenizer(name);
        for (text, ids) in cases(name) {
            let back = tok.detokenize(&ids, false).unwrap();
            if back != text {
                failures.push(format!("{name} {text:?}: decoded {back:?}"));
            }
        }
    }
    assert!(failures.is_empty(), "{} strings do not round-trip:\n{}", failures.len(), failures.join("\n"));
}

//! Every `tokenizer.ggml.pre` name Flint supports gives llama.cpp's ids: tests/data/pretok has,
//! for each name, strings that reach every branch of its regexes and the ids llama.cpp's
//! llama-tokenize gave for them with one of its vocabulary files (../shared/golden/
//! llama-cpp-vocab) carrying that name (tests/data/pretok/make.py). Unknown names stay errors.

use std::collections::BTreeMap;
use std::path::Path;

use flint_core::gguf::{GgufFile, Metadata, Value};
use flint_core::tokenizer::{Tokenizer, TokenizerError};

const VOCABS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../../shared/golden/llama-cpp-vocab");
const DATA: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/data/pretok");
const KEY_PRE: &str = "tokenizer.ggml.pre";

#[derive(serde::Deserialize)]
struct Case {
    pre: String,
    vocab: String,
    strings: Vec<String>,
    ids: Vec<Vec<u32>>,
}

fn cases() -> Vec<Case> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(DATA).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "json") {
            let case: Case = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
            assert_eq!(path.file_stem().unwrap().to_str(), Some(case.pre.as_str()));
            assert_eq!(case.strings.len(), case.ids.len(), "{}", case.pre);
            out.push(case);
        }
    }
    out.sort_by(|a, b| a.pre.cmp(&b.pre));
    out
}

/// `md` with `tokenizer.ggml.pre` set to `pre`.
fn with_pre(md: &Metadata, pre: &str) -> Metadata {
    let pairs = md.keys().filter(|&k| k != KEY_PRE).map(|k| (k.to_string(), md.get(k).unwrap().clone()));
    Metadata::from_pairs(pairs.chain([(KEY_PRE.to_string(), Value::String(pre.to_string()))]))
}

fn metadata(vocab: &str) -> Metadata {
    GgufFile::open(Path::new(VOCABS).join(vocab)).unwrap_or_else(|e| panic!("{vocab}: {e}")).metadata
}

/// The strings of `case` whose ids differ from llama.cpp's.
fn differences(md: &Metadata, case: &Case) -> Vec<String> {
    let tok = match Tokenizer::from_metadata(&with_pre(md, &case.pre)) {
        Ok(tok) => tok,
        Err(e) => return vec![format!("{}: {e}", case.pre)],
    };
    let mut out = Vec::new();
    for (text, want) in case.strings.iter().zip(&case.ids) {
        let got = tok.encode(text, false, false).unwrap();
        if got != *want {
            out.push(format!("{} {text:?}:\n  got      {got:?}\n  llama.cpp {want:?}", case.pre));
        }
    }
    out
}

#[test]
fn every_pre_tokenizer_gives_llama_cpp_ids() {
    let cases = cases();
    assert!(cases.len() >= 70, "{} names in {DATA}", cases.len());
    let mut by_vocab: BTreeMap<&str, Vec<&Case>> = BTreeMap::new();
    for case in &cases {
        assert!(case.strings.len() >= 20, "{}: {} strings", case.pre, case.strings.len());
        by_vocab.entry(case.vocab.as_str()).or_default().push(case);
    }
    let mut failures = Vec::new();
    for (vocab, cases) in by_vocab {
        let md = metadata(vocab);
        // Two workers: building a 150k-token tokenizer dominates.
        let half = cases.len().div_ceil(2);
        let found: Vec<Vec<String>> = std::thread::scope(|s| {
            let workers: Vec<_> =
                cases.chunks(half).map(|chunk| s.spawn(|| chunk.iter().flat_map(|case| differences(&md, case)).collect::<Vec<_>>())).collect();
            workers.into_iter().map(|w| w.join().unwrap()).collect()
        });
        failures.extend(found.into_iter().flatten());
    }
    assert!(failures.is_empty(), "{} strings differ:\n{}", failures.len(), failures.join("\n"));
}

/// Names whose ids agree on every string: llama.cpp gives them the same regexes and flags (or,
/// for minicpm5 and bailingmoe, regexes that split alike). Any two names not in one group give
/// different ids somewhere, so a name wired to another group's pre-tokenizer fails the test
/// above.
const SAME_IDS: &[&[&str]] = &[
    &["cohere2moe", "tiny_aya"],
    &["falcon-h1", "falcon3", "glm4", "glm5", "lfm2", "llama-bpe", "llama-v3", "llama3", "midm-2.0", "minicpm5", "pixtral"],
    &["a.x-4.0", "exaone4", "gigachat", "gpt-2", "granite-docling", "jais", "mellum", "mpt", "olmo", "phi-2", "trillion"],
    &["gpt-4o", "kanana2", "llama4", "minimax-m2", "talkie"],
    &["codeshell", "command-r", "exaone", "mellum2", "minerva-7b", "refact", "smollm", "starcoder"],
    &["bailingmoe", "bailingmoe2", "deepseek-r1-qwen", "f2llmv2", "grok-2", "hunyuan", "kormo", "llada-moe", "megrez", "qwen2", "solar-open", "stablelm2"],
    &["deepseek-v3", "hunyuan-dense", "hy_v4", "joyai-llm"],
    &["bloom", "gpt3-finnish", "poro-chat"],
    &["chatglm-bpe", "dbrx", "smaug-bpe"],
];

#[test]
fn the_strings_tell_the_pre_tokenizers_apart() {
    let cases = cases();
    let mut by_ids: BTreeMap<(&str, &Vec<Vec<u32>>), Vec<&str>> = BTreeMap::new();
    for case in &cases {
        by_ids.entry((case.vocab.as_str(), &case.ids)).or_default().push(&case.pre);
    }
    let mut got: Vec<Vec<&str>> = by_ids.into_values().filter(|names| names.len() > 1).collect();
    got.iter_mut().for_each(|names| names.sort_unstable());
    got.sort();
    let mut want: Vec<Vec<&str>> = SAME_IDS.iter().map(|names| names.to_vec()).collect();
    want.iter_mut().for_each(|names| names.sort_unstable());
    want.sort();
    assert_eq!(got, want);
}

#[test]
fn unknown_and_refused_names_are_errors() {
    let md = metadata("ggml-vocab-gpt-2.gguf");
    match Tokenizer::from_metadata(&with_pre(&md, "no-such-pre-tokenizer")) {
        Err(e @ TokenizerError::UnsupportedPre(_)) => {
            let msg = e.to_string();
            assert!(msg.contains("no-such-pre-tokenizer") && msg.contains("qwen2") && msg.contains("kimi-k2"), "{msg}");
        }
        other => panic!("a made-up name: {other:?}"),
    }
    for name in ["gemma4", "roberta-bpe", "jina-v2-es"] {
        match Tokenizer::from_metadata(&with_pre(&md, name)) {
            Err(e @ TokenizerError::RefusedPre { .. }) => assert!(e.to_string().contains(name), "{e}"),
            other => panic!("{name}: {other:?}"),
        }
    }
}

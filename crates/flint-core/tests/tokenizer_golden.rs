//! Tokenizer against llama.cpp's token ids on the golden prompts of both test models, plus
//! round-trip properties, a reference SPM merge loop, streaming detokenization and metadata
//! errors on tiny synthetic vocabularies.

#[path = "common/models.rs"]
mod models;

use std::collections::{BinaryHeap, HashMap};
use std::sync::OnceLock;
use std::time::Instant;

use flint_core::gguf::{Array, GgufError, GgufFile, Metadata, Value};
use flint_core::tokenizer::{StreamDecoder, Tokenizer, TokenizerError, VocabMismatch};
use proptest::prelude::*;
use serde_json::Value as Json;

fn shared() -> String {
    flint_core::testing::shared_dir().to_string_lossy().into_owned()
}
const GOLDEN_PROMPTS: usize = 7;
/// Release-build budget for building gemma's 262k-token tokenizer from metadata.
const MAX_BUILD_SECS: f64 = 10.0;
const PROPTEST_CASES: u32 = 128;
const SPM_SPACE: char = '\u{2581}';

struct Loaded {
    tok: Tokenizer,
    md: Metadata,
}

fn load(name: &str) -> Loaded {
    let path = models::model_path(name);
    let t0 = Instant::now();
    let file = GgufFile::open(&path).unwrap_or_else(|e| panic!("open {}: {e}", path.display()));
    let t1 = Instant::now();
    let tok = Tokenizer::from_metadata(&file.metadata).unwrap_or_else(|e| panic!("{name}: {e}"));
    let t2 = Instant::now();
    eprintln!("{name}: GGUF header {:.3}s, tokenizer build {:.3}s ({} tokens)", (t1 - t0).as_secs_f64(), (t2 - t1).as_secs_f64(), tok.vocab_size());
    if !cfg!(debug_assertions) {
        assert!((t2 - t1).as_secs_f64() < MAX_BUILD_SECS, "{name}: building the tokenizer took {:?}", t2 - t1);
    }
    Loaded { tok, md: file.metadata }
}

fn gemma() -> &'static Loaded {
    static G: OnceLock<Loaded> = OnceLock::new();
    G.get_or_init(|| load(models::GEMMA))
}

fn qwen() -> &'static Loaded {
    static Q: OnceLock<Loaded> = OnceLock::new();
    Q.get_or_init(|| load(models::QWEN))
}

fn read_json(path: &str) -> Json {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{path}: {e}"));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{path}: {e}"))
}

fn ids(v: &Json, key: &str) -> Vec<u32> {
    v[key].as_array().unwrap_or_else(|| panic!("{key} missing")).iter().map(|x| x.as_u64().unwrap() as u32).collect()
}

/// Prompt file each golden json was made from (checked against its "prompt" field).
fn prompt_file(model_dir: &str, index: usize) -> String {
    match (model_dir, index) {
        ("gemma", 6) => "p6g.txt".into(),
        ("qwen", 6) => "p6q.txt".into(),
        (_, 7) => "p7long.txt".into(),
        (_, i) => format!("p{i}.txt"),
    }
}

fn check_golden(model_dir: &str, tok: &Tokenizer) {
    for i in 1..=GOLDEN_PROMPTS {
        let golden = read_json(&format!("{}/golden/{model_dir}/{i}.json", shared()));
        let file = prompt_file(model_dir, i);
        let prompt = std::fs::read_to_string(format!("{}/golden/prompts/{file}", shared())).unwrap();
        assert_eq!(golden["prompt"].as_str().unwrap(), prompt, "{model_dir}/{i}.json was not made from {file}");
        assert_eq!(golden["add_bos"].as_bool().unwrap(), tok.add_bos_default(), "{model_dir}/{i}: add_bos");

        let t0 = Instant::now();
        let with_bos = tok.encode(&prompt, tok.add_bos_default(), true).unwrap();
        let dt = t0.elapsed();
        assert_eq!(with_bos, ids(&golden, "prompt_token_ids"), "{model_dir}/{i} ({file}) with BOS");
        let no_bos = tok.encode(&prompt, false, true).unwrap();
        assert_eq!(no_bos, ids(&golden, "prompt_token_ids_no_bos"), "{model_dir}/{i} ({file}) without BOS");
        assert_eq!(tok.decode(&no_bos, false).unwrap(), prompt, "{model_dir}/{i}: decode");
        eprintln!("{model_dir}/{i} ({file}): {} tokens match llama.cpp, encoded in {dt:?}", with_bos.len());
    }
}

#[test]
fn gemma_matches_llama_cpp_on_golden_prompts() {
    check_golden("gemma", &gemma().tok);
}

#[test]
fn qwen_matches_llama_cpp_on_golden_prompts() {
    check_golden("qwen", &qwen().tok);
}

#[test]
fn special_ids_and_end_of_generation() {
    let g = &gemma().tok;
    assert_eq!((g.bos_id(), g.eos_id(), g.vocab_size()), (Some(2), Some(1), 262_144));
    assert!(g.add_bos_default());
    let end_of_turn = g.encode("<end_of_turn>", false, true).unwrap();
    assert_eq!(end_of_turn.len(), 1);
    assert!(g.is_control(end_of_turn[0]) && g.is_eog(end_of_turn[0]) && g.is_eog(1));
    assert_eq!(g.token_text(end_of_turn[0]), Some("<end_of_turn>"));
    // Without parse_special the control token is plain text; user-defined tokens still split.
    assert!(g.encode("<end_of_turn>", false, false).unwrap().len() > 1);
    assert_eq!(g.encode("\n\n", false, false).unwrap(), g.encode("\n\n", false, true).unwrap());
    assert_eq!(g.token_bytes(2), b"<bos>".to_vec());
    assert_eq!(g.decode(&[2, 1], true).unwrap(), "");

    let q = &qwen().tok;
    assert!(!q.add_bos_default());
    let text_id = |t: &str| q.encode(t, false, true).unwrap()[0];
    let (im_end, endoftext, im_start) = (text_id("<|im_end|>"), text_id("<|endoftext|>"), text_id("<|im_start|>"));
    assert_eq!((im_end, endoftext, q.eos_id()), (151645, 151643, Some(151645)));
    assert!(q.is_eog(im_end) && q.is_eog(endoftext) && !q.is_eog(im_start));
    // llama.cpp also stops on the FIM pad / repo-name / file-separator tokens.
    for fim in ["<|fim_pad|>", "<|repo_name|>", "<|file_sep|>"] {
        assert!(q.is_eog(text_id(fim)), "{fim}");
    }
    // ... and on qwen's plain "</s>" (id 128247), which llama.cpp's EOG name list includes.
    let eog: Vec<&str> = q.eog_ids().iter().map(|&id| q.token_text(id).unwrap()).collect();
    assert_eq!(eog, ["</s>", "<|endoftext|>", "<|im_end|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>"]);
    assert!(q.is_control(128247));
    assert!(q.decode(&[u32::MAX], false).is_err());
    assert!(q.token_bytes(u32::MAX).is_empty());
}

/// Strings rich in what tokenizers get wrong: whitespace runs, markup, repeats, multi-byte.
fn tricky_text() -> impl Strategy<Value = String> {
    let piece = prop_oneof![
        4 => any::<char>().prop_map(String::from),
        2 => prop::sample::select(vec![" ", "  ", "\n", "\n\n", "\t", "\r\n", " \n ", "   "]).prop_map(String::from),
        2 => prop::sample::select(vec!["<", ">", "<b>", "</", "<|", "|>", "<|im_start|>", "<bos>", "'s", "'LL"]).prop_map(String::from),
        2 => prop::sample::select(vec!["a", "e", "-", "=", "0", "1", ".", "_", "aa", "ab"]).prop_map(String::from),
        1 => prop::sample::select(vec!["é", "日本", "🙂", "🦩", "👩\u{200d}💻", "\u{0301}", "ſ", "K"]).prop_map(String::from),
    ];
    prop::collection::vec(piece, 0..48).prop_map(|v| v.concat())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: PROPTEST_CASES, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn gemma_round_trips(s in tricky_text()) {
        let s: String = s.chars().filter(|&c| c != SPM_SPACE).collect();
        let tok = &gemma().tok;
        let ids = tok.encode(&s, false, false).unwrap();
        prop_assert_eq!(tok.decode(&ids, false).unwrap(), s);
    }

    #[test]
    fn qwen_round_trips(s in tricky_text()) {
        let tok = &qwen().tok;
        let ids = tok.encode(&s, false, false).unwrap();
        prop_assert_eq!(tok.decode(&ids, false).unwrap(), s);
    }

    #[test]
    fn gemma_equals_reference_spm_merge_loop(s in tricky_text()) {
        // Without user-defined tokens (newline/tab/space runs, markup) every fragment is the
        // whole text, so llama.cpp's SPM loop applies to it directly.
        let s: String = s.chars().filter(|&c| !matches!(c, '\n' | '\t' | '<' | SPM_SPACE)).collect();
        let s = collapse_spaces(&s);
        let g = gemma();
        let got = g.tok.encode(&s, false, false).unwrap();
        prop_assert_eq!(got, reference_spm(&g.md, &s.replace(' ', "\u{2581}")));
    }

    #[test]
    fn gemma_equals_reference_on_repetitive_text(s in prop::collection::vec(prop::sample::select(vec!["a", "aa", "-", "=", "0", "ab", "ba", ".", "▁", "x"]), 0..40)) {
        let s = s.concat();
        let g = gemma();
        let got = g.tok.encode(&s, false, false).unwrap();
        prop_assert_eq!(got, reference_spm(&g.md, &s));
    }
}

#[test]
fn gemma_equals_reference_on_runs_and_periodic_text() {
    // Runs and periodic strings are where equal-score candidate pairs overlap most.
    let g = gemma();
    let units = ["a", "-", "=", "0", "1", "9", ".", "*", "#", "x", "e", "▁", "ab", "aab", "▁a", "a▁", "01", "-=", "🙂", "日"];
    let mut checked = 0;
    for unit in units {
        for n in 1..=120 {
            let s = unit.repeat(n);
            assert_eq!(g.tok.encode(&s, false, false).unwrap(), reference_spm(&g.md, &s), "{unit:?} x {n}");
            checked += 1;
        }
    }
    assert_eq!(checked, units.len() * 120);
}

fn collapse_spaces(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if !(c == ' ' && out.ends_with(' ')) {
            out.push(c);
        }
    }
    out
}

/// llama.cpp's `llm_tokenizer_spm_session::tokenize`, written out independently of the crate:
/// merge the adjacent pair forming the highest-scoring token (ties: leftmost), repeat; symbols
/// that are not tokens fall back to `<0xNN>` byte tokens.
fn reference_spm(md: &Metadata, text: &str) -> Vec<u32> {
    static INDEX: OnceLock<(HashMap<String, u32>, Vec<f32>)> = OnceLock::new();
    let (index, scores) = INDEX.get_or_init(|| {
        let tokens = md.str_array("tokenizer.ggml.tokens").unwrap();
        let scores = md.opt_f32_array("tokenizer.ggml.scores").unwrap().unwrap().to_vec();
        (tokens.iter().enumerate().map(|(i, t)| (t.clone(), i as u32)).collect(), scores)
    });
    // Symbols as byte ranges [start, end) linked by prev/next; `None` end marks a merged-away one.
    let starts: Vec<usize> = text.char_indices().map(|(i, _)| i).collect();
    let n = starts.len();
    let mut end: Vec<usize> = (0..n).map(|i| starts.get(i + 1).copied().unwrap_or(text.len())).collect();
    let mut alive = vec![true; n];
    let mut next: Vec<Option<usize>> = (0..n).map(|i| (i + 1 < n).then_some(i + 1)).collect();
    let mut prev: Vec<Option<usize>> = (0..n).map(|i| i.checked_sub(1)).collect();

    #[derive(PartialEq)]
    struct Bigram {
        score: f32,
        left: usize,
        right: usize,
        size: usize,
    }
    impl Eq for Bigram {}
    impl PartialOrd for Bigram {
        fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
            Some(self.cmp(o))
        }
    }
    impl Ord for Bigram {
        fn cmp(&self, o: &Self) -> std::cmp::Ordering {
            self.score.total_cmp(&o.score).then(o.left.cmp(&self.left))
        }
    }
    let try_add = |heap: &mut BinaryHeap<Bigram>, l: Option<usize>, r: Option<usize>, end: &[usize]| {
        let (Some(l), Some(r)) = (l, r) else { return };
        let piece = &text[starts[l]..end[r]];
        if let Some(&id) = index.get(piece) {
            heap.push(Bigram { score: scores[id as usize], left: l, right: r, size: piece.len() });
        }
    };
    let mut heap = BinaryHeap::new();
    for i in 1..n {
        try_add(&mut heap, Some(i - 1), Some(i), &end);
    }
    while let Some(b) = heap.pop() {
        if !alive[b.left] || !alive[b.right] || end[b.right] - starts[b.left] != b.size || next[b.left] != Some(b.right) {
            continue;
        }
        end[b.left] = end[b.right];
        alive[b.right] = false;
        next[b.left] = next[b.right];
        if let Some(nn) = next[b.right] {
            prev[nn] = Some(b.left);
        }
        try_add(&mut heap, prev[b.left], Some(b.left), &end);
        try_add(&mut heap, Some(b.left), next[b.left], &end);
    }
    let mut out = Vec::new();
    let mut i = if n == 0 { None } else { Some(0) };
    while let Some(s) = i {
        let piece = &text[starts[s]..end[s]];
        match index.get(piece) {
            Some(&id) => out.push(id),
            None => out.extend(piece.bytes().map(|b| index[&format!("<0x{b:02X}>")])),
        }
        i = next[s];
    }
    out
}

fn stream_all(tok: &Tokenizer, ids: &[u32]) -> (Vec<String>, String) {
    let mut dec = StreamDecoder::new();
    let mut chunks: Vec<String> = ids.iter().map(|&id| dec.push(tok, id)).collect();
    chunks.push(dec.finish());
    let total = chunks.concat();
    (chunks, total)
}

#[test]
fn stream_decoder_never_splits_a_character() {
    // U+1F9A9 (flamingo) is not in gemma's vocabulary: four byte-fallback tokens.
    let text = "a 🦩 and 🧌 then 👩\u{200d}💻 ok";
    for (name, tok) in [("gemma", &gemma().tok), ("qwen", &qwen().tok)] {
        let ids = tok.encode(text, false, false).unwrap();
        let (chunks, total) = stream_all(tok, &ids);
        for c in &chunks {
            assert!(!c.contains(char::REPLACEMENT_CHARACTER), "{name}: chunk {c:?}");
        }
        assert_eq!(total, tok.decode(&ids, false).unwrap(), "{name}");
        assert_eq!(total, text, "{name}");
    }
    let g = &gemma().tok;
    let flamingo = g.encode("🦩", false, false).unwrap();
    assert_eq!(flamingo.len(), 4, "expected byte fallback: {flamingo:?}");
    let pieces: Vec<Vec<u8>> = flamingo.iter().map(|&id| g.token_bytes(id)).collect();
    assert_eq!(pieces.concat(), "🦩".as_bytes());
    let mut dec = StreamDecoder::new();
    let out: Vec<String> = flamingo.iter().map(|&id| dec.push(g, id)).collect();
    assert_eq!(out, ["", "", "", "🦩"]);
    // A truncated character at the end is flushed as one replacement, exactly like decode().
    let mut dec = StreamDecoder::new();
    let partial: String = flamingo[..2].iter().map(|&id| dec.push(g, id)).collect();
    assert_eq!(partial + &dec.finish(), g.decode(&flamingo[..2], false).unwrap());
    // An invalid byte in the middle becomes U+FFFD at once, as in decode().
    let bad = [flamingo[0], g.encode("x", false, false).unwrap()[0]];
    let (_, total) = stream_all(g, &bad);
    assert_eq!(total, g.decode(&bad, false).unwrap());
    assert_eq!(total, "\u{FFFD}x");
}

#[test]
fn stream_decoder_can_skip_special_tokens() {
    let g = &gemma().tok;
    let ids = g.encode("<start_of_turn>user\nhi<end_of_turn>", true, true).unwrap();
    let mut dec = StreamDecoder::new().skip_special(true);
    let text: String = ids.iter().map(|&id| dec.push(g, id)).collect::<String>() + &dec.finish();
    assert_eq!(text, g.decode(&ids, true).unwrap());
    assert_eq!(text, "user\nhi");
    assert_eq!(g.decode(&ids, false).unwrap(), "<bos><start_of_turn>user\nhi<end_of_turn>");
    // Gemma's image marker is a user-defined token: a reply leaves it out, its HTML tags stay.
    let ids = g.encode("<table>a<start_of_image>b", false, true).unwrap();
    let mut dec = StreamDecoder::new().skip_special(true);
    let text: String = ids.iter().map(|&id| dec.push(g, id)).collect::<String>() + &dec.finish();
    assert_eq!(text, "<table>ab");
    let mut dec = StreamDecoder::new();
    let text: String = ids.iter().map(|&id| dec.push(g, id)).collect::<String>() + &dec.finish();
    assert_eq!(text, "<table>a<start_of_image>b");
}

// ---- tiny synthetic vocabularies ----

fn strs(v: &[&str]) -> Value {
    Value::Array(Array::String(v.iter().map(|s| s.to_string()).collect()))
}

fn md(pairs: Vec<(&str, Value)>) -> Metadata {
    Metadata::from_pairs(pairs.into_iter().map(|(k, v)| (k.to_string(), v)))
}

/// A five-piece SPM vocabulary with two byte tokens and a control and a user-defined token.
fn tiny_spm() -> Vec<(&'static str, Value)> {
    vec![
        ("tokenizer.ggml.model", Value::String("llama".into())),
        ("tokenizer.ggml.tokens", strs(&["<unk>", "<s>", "</s>", "▁", "a", "b", "▁a", "ab", "▁ab", "<0x0A>", "<0xC3>", "<br>"])),
        ("tokenizer.ggml.scores", Value::Array(Array::F32(vec![0.0, 0.0, 0.0, -1.0, -2.0, -3.0, -4.0, -5.0, -6.0, 0.0, 0.0, 0.0]))),
        ("tokenizer.ggml.token_type", Value::Array(Array::I32(vec![2, 3, 3, 1, 1, 1, 1, 1, 1, 6, 6, 4]))),
        ("tokenizer.ggml.add_space_prefix", Value::Bool(false)),
    ]
}

fn tiny_gpt2(pre: &str) -> Vec<(&'static str, Value)> {
    vec![
        ("tokenizer.ggml.model", Value::String("gpt2".into())),
        ("tokenizer.ggml.pre", Value::String(pre.into())),
        ("tokenizer.ggml.tokens", strs(&["a", "b", "Ġ", "ab", "Ġab", "<|end|>"])),
        ("tokenizer.ggml.merges", strs(&["a b", "Ġ ab"])),
        ("tokenizer.ggml.token_type", Value::Array(Array::I32(vec![1, 1, 1, 1, 1, 3]))),
    ]
}

fn build_err(pairs: Vec<(&str, Value)>) -> TokenizerError {
    Tokenizer::from_metadata(&md(pairs)).expect_err("metadata should be refused")
}

fn replace(mut pairs: Vec<(&'static str, Value)>, key: &'static str, v: Value) -> Vec<(&'static str, Value)> {
    pairs.retain(|(k, _)| *k != key);
    pairs.push((key, v));
    pairs
}

#[test]
fn tiny_spm_vocabulary_encodes_and_decodes() {
    let tok = Tokenizer::from_metadata(&md(tiny_spm())).unwrap();
    assert_eq!((tok.bos_id(), tok.eos_id()), (Some(1), Some(2)), "SPM defaults when the keys are absent");
    assert!(tok.add_bos_default(), "SPM adds BOS unless told otherwise");
    // ▁a (-4) merges before ab (-5), then ▁a + b forms ▁ab.
    assert_eq!(tok.encode(" ab", false, false).unwrap(), vec![8]);
    assert_eq!(tok.encode(" aa", false, false).unwrap(), vec![6, 4]);
    assert_eq!(tok.encode("ab\n", true, false).unwrap(), vec![1, 7, 9]);
    // é is not a piece and 0xA9 has no byte token, so it becomes <unk> (llama.cpp aborts here).
    assert_eq!(tok.encode("é", false, false).unwrap(), vec![0]);
    // User-defined tokens split even without parse_special; control tokens only with it.
    assert_eq!(tok.encode("a<br>b", false, false).unwrap(), vec![4, 11, 5]);
    assert_eq!(tok.encode("</s>", false, true).unwrap(), vec![2]);
    assert_eq!(tok.decode(&[1, 6, 5, 9, 11], false).unwrap(), "<s> ab\n<br>");
    assert_eq!(tok.decode(&[1, 6, 5, 9, 11], true).unwrap(), " ab\n<br>");
    assert!(tok.is_eog(2) && !tok.is_eog(1));

    let prefixed = Tokenizer::from_metadata(&md(replace(tiny_spm(), "tokenizer.ggml.add_space_prefix", Value::Bool(true)))).unwrap();
    assert_eq!(prefixed.encode("ab", false, false).unwrap(), vec![8]);
    assert_eq!(prefixed.encode("a</s>ab", false, true).unwrap(), vec![6, 2, 8]);
}

#[test]
fn tiny_gpt2_vocabulary_encodes_and_decodes() {
    for pre in ["qwen2", "llama-bpe", "gpt-2", "default"] {
        let tok = Tokenizer::from_metadata(&md(tiny_gpt2(pre))).unwrap();
        assert_eq!(tok.encode("ab ab", false, false).unwrap(), vec![3, 4], "{pre}");
        assert_eq!(tok.encode("ab<|end|>", false, true).unwrap(), vec![3, 5], "{pre}");
        assert_eq!(tok.decode(&[3, 4, 5], false).unwrap(), "ab ab<|end|>", "{pre}");
        assert!(tok.is_eog(5), "{pre}: <|end|> is an end-of-generation token");
        assert_eq!(tok.add_bos_default(), pre == "llama-bpe", "{pre}");
    }
}

#[test]
fn unknown_pre_tokenizer_is_refused() {
    match build_err(tiny_gpt2("nonsense-42")) {
        TokenizerError::UnsupportedPre(p) => assert_eq!(p, "nonsense-42"),
        e => panic!("wrong error: {e}"),
    }
}

#[test]
fn unknown_model_type_is_refused() {
    match build_err(replace(tiny_spm(), "tokenizer.ggml.model", Value::String("wordpiece-9000".into()))) {
        TokenizerError::UnsupportedModel(m) => assert_eq!(m, "wordpiece-9000"),
        e => panic!("wrong error: {e}"),
    }
}

#[test]
fn special_token_id_outside_vocabulary_is_refused() {
    for key in ["tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id", "tokenizer.ggml.padding_token_id", "tokenizer.ggml.eot_token_id"] {
        match build_err(replace(tiny_spm(), key, Value::U32(12))) {
            TokenizerError::SpecialTokenOutOfRange { key: k, id, vocab } => {
                assert_eq!((k.as_str(), id, vocab), (key, 12, 12))
            }
            e => panic!("{key}: wrong error: {e}"),
        }
    }
}

#[test]
fn scores_of_the_wrong_type_are_refused() {
    let err = build_err(replace(tiny_spm(), "tokenizer.ggml.scores", Value::Array(Array::I8(vec![0; 12]))));
    match err {
        TokenizerError::Gguf(GgufError::WrongType { key, got, .. }) => {
            assert_eq!((key.as_str(), got.as_str()), ("tokenizer.ggml.scores", "array<i8>"))
        }
        e => panic!("wrong error: {e}"),
    }
}

#[test]
fn malformed_vocabularies_are_refused() {
    let missing: Vec<_> = tiny_spm().into_iter().filter(|(k, _)| *k != "tokenizer.ggml.tokens").collect();
    assert!(matches!(build_err(missing), TokenizerError::Gguf(GgufError::MissingKey(k)) if k == "tokenizer.ggml.tokens"));
    let no_model: Vec<_> = tiny_spm().into_iter().filter(|(k, _)| *k != "tokenizer.ggml.model").collect();
    assert!(matches!(build_err(no_model), TokenizerError::Gguf(GgufError::MissingKey(_))));
    let short_scores = replace(tiny_spm(), "tokenizer.ggml.scores", Value::Array(Array::F32(vec![0.0; 11])));
    assert!(matches!(build_err(short_scores), TokenizerError::LengthMismatch { key: "tokenizer.ggml.scores", len: 11, vocab: 12 }));
    let long_types = replace(tiny_spm(), "tokenizer.ggml.token_type", Value::Array(Array::I32(vec![1; 13])));
    assert!(matches!(build_err(long_types), TokenizerError::LengthMismatch { key: "tokenizer.ggml.token_type", len: 13, .. }));
    let types_u8 = replace(tiny_spm(), "tokenizer.ggml.token_type", Value::Array(Array::U8(vec![1; 12])));
    assert!(matches!(build_err(types_u8), TokenizerError::Gguf(GgufError::WrongType { .. })));
    let tokens_u8 = replace(tiny_spm(), "tokenizer.ggml.tokens", Value::Array(Array::U8(vec![1; 12])));
    assert!(matches!(build_err(tokens_u8), TokenizerError::Gguf(GgufError::WrongType { .. })));
    let empty = replace(tiny_spm(), "tokenizer.ggml.tokens", strs(&[]));
    assert!(matches!(build_err(empty), TokenizerError::EmptyVocab | TokenizerError::LengthMismatch { .. }));
    let dup = replace(tiny_spm(), "tokenizer.ggml.tokens", strs(&["a", "b", "a", "c", "d", "e", "f", "g", "h", "i", "j", "k"]));
    assert!(matches!(build_err(dup), TokenizerError::DuplicateToken { first: 0, second: 2, .. }));
    let neg_bos = replace(tiny_spm(), "tokenizer.ggml.bos_token_id", Value::I32(-1));
    assert!(matches!(build_err(neg_bos), TokenizerError::Gguf(_)));
    let bool_add_bos = replace(tiny_spm(), "tokenizer.ggml.add_bos_token", Value::U8(1));
    assert!(matches!(build_err(bool_add_bos), TokenizerError::Gguf(GgufError::WrongType { .. })));
    let no_merges: Vec<_> = tiny_gpt2("qwen2").into_iter().filter(|(k, _)| *k != "tokenizer.ggml.merges").collect();
    assert!(matches!(build_err(no_merges), TokenizerError::Gguf(GgufError::MissingKey(_))));
    // No BOS anywhere: asking for one is an error, not a panic.
    let tok = Tokenizer::from_metadata(&md(tiny_gpt2("qwen2"))).unwrap();
    assert!(matches!(tok.encode("ab", true, false), Err(TokenizerError::NoBosToken)));
}

#[test]
fn draft_vocabularies_must_agree() {
    // A model drafts for itself; qwen's vocabulary is not gemma's.
    let (g, q) = (&gemma().tok, &qwen().tok);
    assert_eq!(g.draft_compatible(g), Ok(()));
    let e = g.draft_compatible(q).unwrap_err();
    assert_eq!(e, VocabMismatch::Size { ours: 262144, theirs: 151936, slack: 128 });
    // Tiny vocabularies: a few extra tokens are allowed, another text or BOS is not.
    let base = Tokenizer::from_metadata(&md(tiny_gpt2("default"))).unwrap();
    let with = |tokens: &[&str], extra: Vec<(&'static str, Value)>| {
        let mut pairs = tiny_gpt2("default");
        pairs.retain(|(k, _)| !["tokenizer.ggml.tokens", "tokenizer.ggml.token_type"].contains(k) && !extra.iter().any(|(e, _)| e == k));
        pairs.push(("tokenizer.ggml.tokens", strs(tokens)));
        pairs.push(("tokenizer.ggml.token_type", Value::Array(Array::I32(vec![1; tokens.len()]))));
        pairs.extend(extra);
        Tokenizer::from_metadata(&md(pairs)).unwrap()
    };
    assert_eq!(base.draft_compatible(&with(&["a", "b", "Ġ", "ab", "Ġab", "<|end|>", "x"], vec![])), Ok(()));
    let e = base.draft_compatible(&with(&["a", "b", "Ġ", "ba", "Ġab", "<|end|>"], vec![])).unwrap_err();
    assert!(matches!(e, VocabMismatch::Token { id: 3, .. }), "{e}");
    let e = base.draft_compatible(&with(&["a", "b", "Ġ", "ab", "Ġab", "<|end|>"], vec![("tokenizer.ggml.bos_token_id", Value::U32(0))])).unwrap_err();
    assert!(matches!(e, VocabMismatch::Specials { .. }), "{e}");
    let long: Vec<String> = (0..6 + 129).map(|i| ["a", "b", "Ġ", "ab", "Ġab", "<|end|>"].get(i).map_or(format!("t{i}"), |s| s.to_string())).collect();
    let long: Vec<&str> = long.iter().map(String::as_str).collect();
    assert!(matches!(base.draft_compatible(&with(&long, vec![])), Err(VocabMismatch::Size { slack: 128, .. })));
}

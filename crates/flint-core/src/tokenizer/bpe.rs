//! GPT-2 style byte-level BPE (`gpt2`) vocabularies as a `tokenizers` pipeline: the regex
//! pre-tokenizer chosen by `tokenizer.ggml.pre`, byte-to-character mapping, ranked merges.

use tokenizers::models::bpe::BPE;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::pre_tokenizers::PreTokenizerWrapper;
use tokenizers::SplitDelimiterBehavior;

use super::vocab::Vocab;
use super::TokenizerError;

/// A pre-tokenizer as llama.cpp defines it (llm_tokenizer_bpe): regexes applied in turn, each
/// splitting the pieces of the previous one, plus the flags llama.cpp ties to the same name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct PreSpec {
    pub name: &'static str,
    pub regexes: &'static [&'static str],
    /// A whole pre-token that is itself in the vocabulary is emitted without merging.
    pub ignore_merges: bool,
    /// Default for `add_bos_token` when the file does not say.
    pub add_bos: bool,
}

// Regexes exactly as llama.cpp's llama-vocab.cpp has them (its case-insensitive groups spelled
// out as `[sS]` etc., so Unicode case folding cannot widen them).
const RE_GPT2: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)";
const RE_LLAMA3: &str =
    r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const RE_QWEN2: &str =
    r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const RE_QWEN35: &str =
    r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const RE_DEFAULT_PUNCT: &str = r"[\p{P}\$\+<=>\^~\|]+";
const RE_FALCON_PUNCT: &str = r"[\p{P}\$\+<=>\^~\|`]+";
const RE_DIGIT: &str = r"\p{N}";
const RE_NEWLINE: &str = r"[\r\n]";
const RE_CJK: &str = r"[一-龥ࠀ-一가-퟿]+";
// DeepSeek LLM's letters: Latin, Greek, Cyrillic, Armenian, Georgian, Cherokee and the other
// cased scripts, as ranges (llama.cpp's list). The six code points written as `\x{...}` have
// singleton canonical decompositions: written as characters, any NFC pass over this file would
// turn them into others (U+1FDB into U+038A, U+212A KELVIN SIGN into K) and break the ranges.
const RE_DEEPSEEK_LLM_LETTERS: &str = r"\s?[A-Za-zµÀ-ÖØ-öø-ƺƼ-ƿǄ-ʓʕ-ʯͰ-ͳͶͷͻ-ͽͿΆΈ-ΊΌΎ-ΡΣ-ϵϷ-ҁҊ-ԯԱ-ՖႠ-ჅᎠ-Ᏽᏸ-ᏽᲐ-ᲺᲽ-Ჿᴀ-ᴫᵫ-ᵷᵹ-ᶚḀ-ἕἘ-Ἕἠ-ὅὈ-Ὅὐ-ὗὙὛὝὟ-\x{1F7D}ᾀ-ᾴᾶ-ᾼ\x{1FBE}ῂ-ῄῆ-ῌῐ-\x{1FD3}ῖ-\x{1FDB}ῠ-Ῥῲ-ῴῶ-ῼℂℇℊ-ℓℕℙ-ℝℤ\x{2126}ℨ\x{212A}-ℭℯ-ℴℹℼ-ℿⅅ-ⅉⅎↃↄⰀ-ⱻⱾ-ⳤⳫ-ⳮⳲⳳꙀ-ꙭꚀ-ꚛꜢ-ꝯꝱ-ꞇꞋ-ꞎꭰ-ꮿﬀ-ﬆﬓ-ﬗＡ-Ｚａ-ｚ𐐀-𐑏𐒰-𐓓𐓘-𐓻𐲀-𐲲𐳀-𐳲𑢠-𑣟𞤀-𞥃]+";
const RE_DEEPSEEK_LLM_PUNCT: &str = r"\s?[!-/:-~！-／：-～‘-‟　-。]+";
const RE_DIGITS: &str = r"\p{N}+";
const RE_THREE_DIGITS: &str = r"[0-9][0-9][0-9]";

const PRE_SPECS: &[(&[&str], PreSpec)] = &[
    (&["qwen2", "deepseek-r1-qwen"], PreSpec { name: "qwen2", regexes: &[RE_QWEN2], ignore_merges: false, add_bos: false }),
    (&["llama3", "llama-v3", "llama-bpe", "falcon3"], PreSpec { name: "llama3", regexes: &[RE_LLAMA3], ignore_merges: true, add_bos: true }),
    (&["qwen35"], PreSpec { name: "qwen35", regexes: &[RE_QWEN35], ignore_merges: false, add_bos: false }),
    (&["gpt-2", "phi-2", "mpt"], PreSpec { name: "gpt-2", regexes: &[RE_GPT2], ignore_merges: false, add_bos: false }),
    (&["starcoder", "refact"], PreSpec { name: "starcoder", regexes: &[RE_DIGIT, RE_GPT2], ignore_merges: false, add_bos: false }),
    (&["falcon"], PreSpec { name: "falcon", regexes: &[RE_FALCON_PUNCT, RE_GPT2, RE_THREE_DIGITS], ignore_merges: false, add_bos: false }),
    (
        &["deepseek-llm"],
        PreSpec {
            name: "deepseek-llm",
            regexes: &[RE_NEWLINE, RE_DEEPSEEK_LLM_LETTERS, RE_DEEPSEEK_LLM_PUNCT, r"\s+$", RE_CJK, RE_DIGITS],
            ignore_merges: false,
            add_bos: true,
        },
    ),
    (
        &["deepseek-coder"],
        PreSpec { name: "deepseek-coder", regexes: &[RE_NEWLINE, r"\s?\p{L}+", r"\s?\p{P}+", RE_CJK, RE_DIGIT], ignore_merges: false, add_bos: true },
    ),
    (&["default"], PreSpec { name: "default", regexes: &[RE_DEFAULT_PUNCT, RE_GPT2, RE_DIGITS, RE_THREE_DIGITS], ignore_merges: false, add_bos: false }),
];

/// Every `tokenizer.ggml.pre` name this module implements.
pub(crate) fn supported_pre_names() -> impl Iterator<Item = &'static str> {
    PRE_SPECS.iter().flat_map(|(names, _)| names.iter().copied())
}

pub(crate) fn pre_spec(name: &str) -> Option<PreSpec> {
    PRE_SPECS.iter().find(|(names, _)| names.contains(&name)).map(|(_, spec)| *spec)
}

/// GPT-2's printable stand-ins for bytes: printable Latin-1 maps to itself, the other 68
/// bytes to U+0100.. in byte order.
pub(crate) fn byte_to_char_table() -> [char; 256] {
    let mut table = ['\0'; 256];
    let mut next = 0x100u32;
    for b in 0..=255u8 {
        let printable = matches!(b, 0x21..=0x7E | 0xA1..=0xAC | 0xAE..=0xFF);
        let cp = if printable {
            b as u32
        } else {
            next += 1;
            next - 1
        };
        table[b as usize] = char::from_u32(cp).unwrap_or('\0');
    }
    table
}

/// Inverse of [`byte_to_char_table`]: the byte a byte-level character stands for.
pub(crate) struct ByteDecoder {
    /// Indexed by code point; all stand-ins are below U+0144.
    to_byte: Vec<Option<u8>>,
}

impl ByteDecoder {
    pub fn new() -> ByteDecoder {
        let table = byte_to_char_table();
        let max = table.iter().map(|&c| c as usize).max().unwrap_or(0);
        let mut to_byte = vec![None; max + 1];
        for (b, &c) in table.iter().enumerate() {
            to_byte[c as usize] = Some(b as u8);
        }
        ByteDecoder { to_byte }
    }

    /// Raw bytes of a byte-level token text; a character outside the alphabet (a malformed
    /// vocabulary) contributes its own UTF-8 bytes.
    pub fn decode(&self, text: &str, out: &mut Vec<u8>) {
        for c in text.chars() {
            match self.to_byte.get(c as usize).copied().flatten() {
                Some(b) => out.push(b),
                None => out.extend_from_slice(c.encode_utf8(&mut [0; 4]).as_bytes()),
            }
        }
    }
}

/// Merges as llama.cpp ranks them: the space after the first character separates the halves;
/// a repeated pair keeps its first rank. Pairs `tokenizers` cannot represent (a half or the
/// result missing from the vocabulary) are dropped and counted.
fn parse_merges(vocab: &Vocab) -> Vec<(String, String)> {
    let mut seen = std::collections::HashSet::new();
    let mut out = Vec::with_capacity(vocab.merges.len());
    let mut dropped = 0usize;
    for m in &vocab.merges {
        let first_len = m.chars().next().map_or(0, char::len_utf8);
        let Some(space) = m[first_len..].find(' ').map(|i| i + first_len) else {
            dropped += 1;
            continue;
        };
        let (l, r) = (&m[..space], &m[space + 1..]);
        let ok = vocab.text_to_id.contains_key(l) && vocab.text_to_id.contains_key(r) && vocab.text_to_id.contains_key(format!("{l}{r}").as_str());
        if !ok {
            dropped += 1;
            continue;
        }
        if seen.insert((l, r)) {
            out.push((l.to_string(), r.to_string()));
        }
    }
    if dropped > 0 {
        tracing::warn!("{dropped} of {} BPE merges are malformed or name tokens outside the vocabulary; ignored", vocab.merges.len());
    }
    out
}

/// The `tokenizers` pipeline for one raw-text fragment: regex splits, byte-level mapping, BPE.
pub(crate) fn build(vocab: &mut Vocab, pre: PreSpec) -> Result<tokenizers::Tokenizer, TokenizerError> {
    let merges = parse_merges(vocab);
    let text_to_id = std::mem::take(&mut vocab.text_to_id);
    let bpe = BPE::builder().vocab_and_merges(text_to_id, merges).ignore_merges(pre.ignore_merges).build().map_err(|e| TokenizerError::Build(e.to_string()))?;
    let mut steps: Vec<PreTokenizerWrapper> = Vec::with_capacity(pre.regexes.len() + 1);
    for re in pre.regexes {
        let split = Split::new(SplitPattern::Regex(re.to_string()), SplitDelimiterBehavior::Isolated, false)
            .map_err(|e| TokenizerError::Build(format!("pre-tokenizer {:?}: {e}", pre.name)))?;
        steps.push(split.into());
    }
    steps.push(ByteLevel::new(false, false, false).into());
    let mut tk = tokenizers::Tokenizer::new(bpe);
    tk.with_pre_tokenizer(Some(Sequence::new(steps)));
    Ok(tk)
}

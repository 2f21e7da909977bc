//! GPT-2 style byte-level BPE (`gpt2`) vocabularies as a `tokenizers` pipeline: the regexes of
//! the pre-tokenizer chosen by `tokenizer.ggml.pre` (see `pre.rs`), byte-to-character mapping,
//! ranked merges.

use tokenizers::models::bpe::BPE;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::pre_tokenizers::PreTokenizerWrapper;
use tokenizers::SplitDelimiterBehavior;

use super::pre::PreSpec;
use super::vocab::Vocab;
use super::TokenizerError;

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

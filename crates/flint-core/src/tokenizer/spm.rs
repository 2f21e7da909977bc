//! SentencePiece (`llama`) vocabularies as a `tokenizers` byte-fallback BPE.
//!
//! llama.cpp's SPM tokenizer starts from single characters and keeps merging the adjacent pair
//! whose concatenation is the vocabulary token with the highest score. A BPE whose merges are
//! every (left, right) split of every token, ranked by the merged token's score, performs the
//! same merges in the same order (the construction transformers uses for GGUF files).

use tokenizers::models::bpe::BPE;
use tokenizers::normalizers::replace::Replace;

use super::vocab::Vocab;
use super::TokenizerError;

/// SentencePiece's escaped space (U+2581).
pub(crate) const SPACE_MARK: &str = "\u{2581}";

/// Maps an f32 to a u32 whose ascending order is `f32::total_cmp`'s descending order.
fn descending(f: f32) -> u32 {
    let bits = f.to_bits();
    // Negative floats order inversely by bits: flip all but the sign, then bias the sign.
    let ascending = if bits >> 31 == 1 { !bits } else { bits | 1 << 31 };
    !ascending
}

/// Every split of every token into two vocabulary tokens, best first: merged token's score
/// descending, then token id; splits of one token by (left score, right score) descending,
/// then position.
pub(crate) fn merges_from_scores(vocab: &Vocab) -> Vec<(String, String)> {
    let score = |id: u32| descending(vocab.scores[id as usize]) as u128;
    // (sort key, left, right)
    let mut cands: Vec<(u128, u32, u32)> = Vec::new();
    for (id, text) in vocab.tokens.iter().enumerate() {
        let id = id as u32;
        for (cut, _) in text.char_indices().skip(1) {
            let (l, r) = text.split_at(cut);
            let Some(&left) = vocab.text_to_id.get(l) else { continue };
            let Some(&right) = vocab.text_to_id.get(r) else { continue };
            let key = score(id) << 96 | (id as u128) << 64 | score(left) << 32 | score(right);
            cands.push((key, left, right));
        }
    }
    // Stable: equal keys keep split-position order.
    cands.sort_by_key(|c| c.0);
    let text = |id: u32| vocab.tokens[id as usize].clone();
    cands.into_iter().map(|(_, l, r)| (text(l), text(r))).collect()
}

/// The `tokenizers` pipeline for one raw-text fragment: ' ' → '▁', then byte-fallback BPE.
/// Special tokens and the optional space prefix are handled by the caller, as llama.cpp does
/// them per fragment.
pub(crate) fn build(vocab: &mut Vocab) -> Result<tokenizers::Tokenizer, TokenizerError> {
    let merges = merges_from_scores(vocab);
    let text_to_id = std::mem::take(&mut vocab.text_to_id);
    let mut builder = BPE::builder().vocab_and_merges(text_to_id, merges).byte_fallback(true).fuse_unk(true);
    if let Some(unk) = vocab.unk {
        builder = builder.unk_token(vocab.tokens[unk as usize].clone());
    }
    let bpe = builder.build().map_err(|e| TokenizerError::Build(e.to_string()))?;
    let mut tk = tokenizers::Tokenizer::new(bpe);
    let escape = Replace::new(" ", SPACE_MARK).map_err(|e| TokenizerError::Build(e.to_string()))?;
    tk.with_normalizer(Some(escape)).map_err(|e| TokenizerError::Build(e.to_string()))?;
    Ok(tk)
}

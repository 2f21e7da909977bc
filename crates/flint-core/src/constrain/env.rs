//! Flint's tokenizer as llguidance's tokenizer environment: each token's bytes as the
//! vocabulary gives them ([`Tokenizer::token_bytes`]), control and unknown tokens as special
//! tokens (llguidance's `0xFF` marker then their text, so grammars name them as `<|im_end|>` and
//! no lexeme produces them), and Flint's own encoder for the text a grammar forces.

use std::sync::Arc;

use llguidance::toktrie::{TokRxInfo, TokTrie, TokenId, TokenizerEnv};

use crate::tokenizer::Tokenizer;

pub(crate) struct FlintEnv {
    tokenizer: Arc<Tokenizer>,
    trie: TokTrie,
}

impl FlintEnv {
    pub fn new(tokenizer: Arc<Tokenizer>) -> FlintEnv {
        let n = tokenizer.vocab_size() as u32;
        let special = |text: &[u8]| [&[TokTrie::SPECIAL_TOKEN_MARKER][..], text].concat();
        let words: Vec<Vec<u8>> = (0..n)
            .map(|id| {
                let bytes = tokenizer.token_bytes(id);
                if bytes.is_empty() {
                    // A token that prints nothing (unused) would advance no grammar and so fit
                    // everywhere: as a special token no grammar produces it.
                    special(format!("<[empty {id}]>").as_bytes())
                } else if tokenizer.is_hidden_when_skipping(id) {
                    special(&bytes)
                } else {
                    bytes
                }
            })
            .collect();
        // The grammar's end: the first end-of-generation token (the engine allows them all).
        let eos = tokenizer.eos_id().or_else(|| tokenizer.eog_ids().first().copied()).unwrap_or(0);
        let mut info = TokRxInfo::new(n, eos);
        info.tok_bos = tokenizer.bos_id();
        let trie = TokTrie::from(&info, &words);
        FlintEnv { tokenizer, trie }
    }
}

impl TokenizerEnv for FlintEnv {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    fn tokenize_bytes(&self, s: &[u8]) -> Vec<TokenId> {
        // Forced text is the grammar's own and valid UTF-8 in practice; invalid bytes can only
        // come from a byte-level grammar, where llguidance falls back to the trie's greedy split.
        match std::str::from_utf8(s) {
            // A piece of the reply: no space prefixed, as SPM vocabularies do at a text's start.
            Ok(text) => self.tokenizer.encode_piece(text).unwrap_or_else(|_| self.trie.greedy_tokenize(s)),
            Err(_) => self.trie.greedy_tokenize(s),
        }
    }
}

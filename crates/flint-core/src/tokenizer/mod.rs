//! Tokenizer built from `tokenizer.ggml.*` metadata on top of the `tokenizers` crate,
//! reproducing llama.cpp's token ids: SPM vocabularies (`llama`) become a byte-fallback BPE
//! ranked by piece scores, GPT-2 vocabularies (`gpt2`) a byte-level BPE behind the regex
//! pre-tokenizer named by `tokenizer.ggml.pre`. Special tokens are split out first, as
//! llama.cpp does, then each raw fragment goes through the `tokenizers` pipeline.

mod bpe;
mod pre;
mod special;
mod spm;
mod stream;
mod vocab;

use thiserror::Error;

use crate::gguf::{GgufError, Metadata};
use special::{Fragment, SpecialMatcher};
use vocab::{Attr, ModelKind, Vocab};

pub use stream::StreamDecoder;

#[derive(Debug, Error)]
pub enum TokenizerError {
    #[error("tokenizer metadata: {0}")]
    Gguf(#[from] GgufError),
    #[error("unsupported tokenizer.ggml.model {0:?} (supported: \"llama\", \"gpt2\")")]
    UnsupportedModel(String),
    #[error("unsupported tokenizer.ggml.pre {0:?} for a gpt2 vocabulary (supported: {list})", list = supported_pre_list())]
    UnsupportedPre(String),
    #[error("tokenizer.ggml.pre {name:?} is known to llama.cpp but not supported: {why}")]
    RefusedPre { name: String, why: &'static str },
    #[error("tokenizer.ggml.tokens is empty")]
    EmptyVocab,
    #[error("{key} has {len} entries but the vocabulary has {vocab} tokens")]
    LengthMismatch { key: &'static str, len: usize, vocab: usize },
    #[error("token {text:?} appears twice in the vocabulary (ids {first} and {second})")]
    DuplicateToken { text: String, first: u32, second: u32 },
    #[error("{key} = {id} is outside the vocabulary of {vocab} tokens")]
    SpecialTokenOutOfRange { key: String, id: u32, vocab: usize },
    #[error("a BOS token was requested but the vocabulary has none")]
    NoBosToken,
    #[error("token id {id} is outside the vocabulary of {vocab} tokens")]
    IdOutOfRange { id: u32, vocab: usize },
    #[error("cannot build the tokenizer: {0}")]
    Build(String),
    #[error("cannot encode text: {0}")]
    Encode(String),
}

fn supported_pre_list() -> String {
    pre::supported_pre_names().collect::<Vec<_>>().join(", ")
}

/// A vocabulary and its encoder; cheap to share (`Send + Sync`), immutable after building.
pub struct Tokenizer {
    kind: ModelKind,
    /// The `tokenizers` pipeline that encodes one raw-text fragment.
    inner: tokenizers::Tokenizer,
    /// A hand-written split that runs before `inner`'s regexes (some `gpt2` pre-tokenizers).
    pre_split: Option<pre::CustomSplit>,
    specials: SpecialMatcher,
    tokens: Vec<String>,
    attrs: Vec<Attr>,
    /// User-defined tokens that mark non-text input (see [`REPLY_MARKERS`]), sorted.
    markers: Vec<u32>,
    /// Bytes each token contributes to output, control tokens as their text (llama.cpp's
    /// token-to-piece cache with `special = true`).
    pieces: Vec<Box<[u8]>>,
    bos: Option<u32>,
    eos: Option<u32>,
    eog: Vec<u32>,
    add_bos: bool,
    add_space_prefix: bool,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("kind", &self.kind)
            .field("vocab_size", &self.tokens.len())
            .field("bos", &self.bos)
            .field("eos", &self.eos)
            .field("eog", &self.eog)
            .field("add_bos", &self.add_bos)
            .finish()
    }
}

const _: () = {
    const fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<Tokenizer>();
};

impl Tokenizer {
    /// Builds the tokenizer from a model file's metadata; every malformed case is an error.
    pub fn from_metadata(md: &Metadata) -> Result<Tokenizer, TokenizerError> {
        let mut vocab = Vocab::read(md)?;
        let specials = SpecialMatcher::new(&vocab);
        let pieces = token_pieces(&vocab);
        let markers = (0..vocab.tokens.len() as u32)
            .filter(|&id| vocab.attrs[id as usize].has(Attr::USER_DEFINED) && REPLY_MARKERS.contains(&vocab.tokens[id as usize].as_str()))
            .collect();
        let inner = match (vocab.kind, vocab.pre) {
            (ModelKind::Spm, _) => spm::build(&mut vocab)?,
            (ModelKind::Bpe, Some(pre)) => bpe::build(&mut vocab, pre)?,
            (ModelKind::Bpe, None) => return Err(TokenizerError::UnsupportedPre(String::new())),
        };
        Ok(Tokenizer {
            kind: vocab.kind,
            inner,
            pre_split: vocab.pre.and_then(|p| p.custom),
            specials,
            tokens: vocab.tokens,
            attrs: vocab.attrs,
            markers,
            pieces,
            bos: vocab.bos,
            eos: vocab.eos,
            eog: vocab.eog,
            add_bos: vocab.add_bos,
            add_space_prefix: vocab.add_space_prefix,
        })
    }

    /// Token ids for `text`, as llama.cpp's `llama_tokenize(text, add_special = add_bos,
    /// parse_special)` (EOS is never appended).
    pub fn encode(&self, text: &str, add_bos: bool, parse_special: bool) -> Result<Vec<u32>, TokenizerError> {
        let mut out = Vec::with_capacity(text.len() / 3 + 2);
        if add_bos {
            out.push(self.bos.ok_or(TokenizerError::NoBosToken)?);
        }
        // SPM prefixes a space to raw text at the start and after every special token.
        let mut after_special = true;
        for fragment in self.specials.partition(text, parse_special) {
            match fragment {
                Fragment::Token(id) => {
                    out.push(id);
                    after_special = true;
                }
                Fragment::Text(t) if self.add_space_prefix && after_special => {
                    self.encode_raw(&format!(" {t}"), &mut out)?;
                    after_special = false;
                }
                Fragment::Text(t) => {
                    self.encode_raw(t, &mut out)?;
                    after_special = false;
                }
            }
        }
        Ok(out)
    }

    /// Token ids for `text` as a piece inside a longer text: no BOS, special tokens not
    /// parsed, and no space prefixed (SPM vocabularies prefix one at a text's start).
    pub fn encode_piece(&self, text: &str) -> Result<Vec<u32>, TokenizerError> {
        let mut out = Vec::with_capacity(text.len() / 3 + 1);
        self.encode_raw(text, &mut out)?;
        Ok(out)
    }

    /// Appends the ids of one raw-text fragment (no special tokens in it).
    fn encode_raw(&self, text: &str, out: &mut Vec<u32>) -> Result<(), TokenizerError> {
        let encoding = match self.pre_split {
            None => self.inner.encode_fast(text, false),
            Some(split) => {
                let pieces = split.split(text);
                if pieces.is_empty() {
                    return Ok(());
                }
                // Pre-tokenized input: `inner`'s regexes then split each piece on its own.
                self.inner.encode_fast(pieces.as_slice(), false)
            }
        };
        let encoding = encoding.map_err(|e| TokenizerError::Encode(e.to_string()))?;
        out.extend_from_slice(encoding.get_ids());
        Ok(())
    }

    /// `tokenizer.ggml.add_bos_token`, or llama.cpp's default for the vocabulary type.
    pub fn add_bos_default(&self) -> bool {
        self.add_bos
    }

    /// The text of `ids`: the concatenated [`token_bytes`](Self::token_bytes), decoded as UTF-8
    /// with invalid sequences replaced. `skip_special` leaves out control and unknown tokens.
    pub fn decode(&self, ids: &[u32], skip_special: bool) -> Result<String, TokenizerError> {
        self.decode_bytes(ids, skip_special, false)
    }

    /// `decode`, optionally without one leading space of the first token's piece.
    fn decode_bytes(&self, ids: &[u32], skip_special: bool, lstrip_first: bool) -> Result<String, TokenizerError> {
        let mut bytes = Vec::with_capacity(ids.len() * 4);
        for (i, &id) in ids.iter().enumerate() {
            if id as usize >= self.tokens.len() {
                return Err(TokenizerError::IdOutOfRange { id, vocab: self.tokens.len() });
            }
            if skip_special && self.is_hidden_when_skipping(id) {
                continue;
            }
            let piece = self.piece(id);
            bytes.extend_from_slice(if i == 0 && lstrip_first { piece.strip_prefix(b" ").unwrap_or(piece) } else { piece });
        }
        Ok(String::from_utf8_lossy(&bytes).into_owned())
    }

    /// The text of a whole token sequence as llama.cpp's `llama_detokenize` gives it: with
    /// `unparse_special` false control tokens render as nothing, and an SPM vocabulary that
    /// prefixes a space when encoding (`add_space_prefix`) drops one leading space of the first
    /// token, so `detokenize(encode(text))` is `text`. Streams use [`decode`](Self::decode),
    /// which keeps every byte.
    pub fn detokenize(&self, ids: &[u32], unparse_special: bool) -> Result<String, TokenizerError> {
        self.decode_bytes(ids, !unparse_special, self.add_space_prefix)
    }

    /// Raw bytes this token contributes to output: `<0xNN>` → that byte, '▁' → ' ' (SPM),
    /// byte-level characters → their bytes (GPT-2), control and user-defined tokens → their
    /// text, unused tokens → nothing. Empty for ids outside the vocabulary.
    pub fn token_bytes(&self, id: u32) -> Vec<u8> {
        self.piece(id).to_vec()
    }

    pub(crate) fn piece(&self, id: u32) -> &[u8] {
        self.pieces.get(id as usize).map_or(&[], |p| p)
    }

    /// Control and unknown tokens, which llama.cpp renders only when asked to.
    pub(crate) fn is_hidden_when_skipping(&self, id: u32) -> bool {
        self.attrs.get(id as usize).is_some_and(|a| a.has(Attr::CONTROL.with(Attr::UNKNOWN)))
    }

    /// What a reply leaves out unless special tokens are asked for: control and unknown
    /// tokens, and the markers of non-text input some files store as user-defined tokens.
    pub(crate) fn is_hidden_in_replies(&self, id: u32) -> bool {
        self.is_hidden_when_skipping(id) || self.markers.binary_search(&id).is_ok()
    }

    pub fn vocab_size(&self) -> usize {
        self.tokens.len()
    }

    pub fn bos_id(&self) -> Option<u32> {
        self.bos
    }

    pub fn eos_id(&self) -> Option<u32> {
        self.eos
    }

    /// The token's text as stored in the vocabulary (`▁` and byte-level characters included).
    pub fn token_text(&self, id: u32) -> Option<&str> {
        self.tokens.get(id as usize).map(String::as_str)
    }

    pub fn is_control(&self, id: u32) -> bool {
        self.attrs.get(id as usize).is_some_and(|a| a.has(Attr::CONTROL))
    }

    /// End-of-generation ids, sorted: metadata EOS/EOT/EOM plus the tokens llama.cpp treats as
    /// EOG by their text (`<end_of_turn>`, `<|im_end|>`, `<|endoftext|>`, `<|eot_id|>`, ...)
    /// and the FIM pad/repo/file-separator tokens.
    pub fn eog_ids(&self) -> &[u32] {
        &self.eog
    }

    pub fn is_eog(&self, id: u32) -> bool {
        self.eog.binary_search(&id).is_ok()
    }

    /// Whether `draft`'s tokens may stand for this vocabulary's (a draft model for this
    /// one), as llama.cpp requires: sizes within [`DRAFT_VOCAB_SLACK`] of each other, the same
    /// text for every id below the smaller size, the same BOS and EOS ids and BOS use.
    /// Otherwise the first difference.
    pub fn draft_compatible(&self, draft: &Tokenizer) -> Result<(), VocabMismatch> {
        let (n, m) = (self.vocab_size(), draft.vocab_size());
        if n.abs_diff(m) > DRAFT_VOCAB_SLACK {
            return Err(VocabMismatch::Size { ours: n, theirs: m, slack: DRAFT_VOCAB_SLACK });
        }
        let specials = |t: &Tokenizer| (t.bos, t.eos, t.add_bos_default());
        if specials(self) != specials(draft) {
            return Err(VocabMismatch::Specials { ours: specials(self), theirs: specials(draft) });
        }
        match self.tokens.iter().zip(&draft.tokens).position(|(a, b)| a != b) {
            Some(id) => Err(VocabMismatch::Token { id: id as u32, ours: self.tokens[id].clone(), theirs: draft.tokens[id].clone() }),
            None => Ok(()),
        }
    }
}

/// How a draft model's vocabulary differs from its target's (the first difference).
#[derive(Clone, Debug, PartialEq, Eq, Error)]
pub enum VocabMismatch {
    #[error("the vocabularies have {ours} and {theirs} tokens (at most {slack} apart)")]
    Size { ours: usize, theirs: usize, slack: usize },
    /// (BOS, EOS, BOS added) of each.
    #[error("their special tokens differ (BOS {:?} and {:?}, EOS {:?} and {:?}, BOS added: {} and {})", ours.0, theirs.0, ours.1, theirs.1, ours.2, theirs.2)]
    Specials { ours: (Option<u32>, Option<u32>, bool), theirs: (Option<u32>, Option<u32>, bool) },
    #[error("token {id} is {ours:?} in one and {theirs:?} in the other")]
    Token { id: u32, ours: String, theirs: String },
}

/// Markers of image and audio input that Gemma 3 files store as user-defined tokens, though
/// the model's own tokenizer marks them special: a text reply shows them only with special
/// tokens asked for. (Other user-defined tokens, such as Gemma's HTML tags, are text.)
pub const REPLY_MARKERS: &[&str] = &["<start_of_image>", "<end_of_image>", "<image_soft_token>", "<start_of_audio>", "<end_of_audio>", "<audio_soft_token>"];

/// How far a draft model's vocabulary size may be from the target's (llama.cpp's limit).
pub const DRAFT_VOCAB_SLACK: usize = 128;

/// What each token prints (llama.cpp's `token_to_piece` with `special = true`).
fn token_pieces(vocab: &Vocab) -> Vec<Box<[u8]>> {
    let bytes = bpe::ByteDecoder::new();
    let raw = Attr::CONTROL.with(Attr::UNKNOWN).with(Attr::USER_DEFINED);
    vocab
        .tokens
        .iter()
        .zip(&vocab.attrs)
        .map(|(text, &attr)| {
            let mut out = Vec::new();
            if attr.has(raw) {
                out.extend_from_slice(text.as_bytes());
            } else if attr.has(Attr::NORMAL) {
                match vocab.kind {
                    ModelKind::Spm if text.contains(spm::SPACE_MARK) => out.extend_from_slice(text.replace(spm::SPACE_MARK, " ").as_bytes()),
                    ModelKind::Spm => out.extend_from_slice(text.as_bytes()),
                    ModelKind::Bpe => bytes.decode(text, &mut out),
                }
            } else if attr.has(Attr::BYTE) {
                match parse_byte_token(text) {
                    Some(b) => out.push(b),
                    None => out.extend_from_slice(text.as_bytes()),
                }
            }
            out.into_boxed_slice()
        })
        .collect()
}

/// `<0xNN>` → NN.
fn parse_byte_token(text: &str) -> Option<u8> {
    let hex = text.strip_prefix("<0x")?.strip_suffix('>')?;
    if hex.len() != 2 {
        return None;
    }
    u8::from_str_radix(hex, 16).ok()
}

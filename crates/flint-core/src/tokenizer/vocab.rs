//! Reads and validates `tokenizer.ggml.*` metadata: tokens, scores, token types, special ids,
//! and the fix-ups llama.cpp applies on load (control-looking tokens, end-of-generation set).

use tokenizers::models::bpe::Vocab as TextToId;

use super::pre::{self, PreSpec};
use super::TokenizerError;
use crate::gguf::{Array, GgufError, Metadata, Value};

pub(crate) const KEY_MODEL: &str = "tokenizer.ggml.model";
pub(crate) const KEY_PRE: &str = "tokenizer.ggml.pre";
pub(crate) const KEY_TOKENS: &str = "tokenizer.ggml.tokens";
pub(crate) const KEY_SCORES: &str = "tokenizer.ggml.scores";
pub(crate) const KEY_TOKEN_TYPE: &str = "tokenizer.ggml.token_type";
pub(crate) const KEY_MERGES: &str = "tokenizer.ggml.merges";
const KEY_ADD_BOS: &str = "tokenizer.ggml.add_bos_token";
const KEY_ADD_SPACE_PREFIX: &str = "tokenizer.ggml.add_space_prefix";
const KEY_BOS: &str = "tokenizer.ggml.bos_token_id";
const KEY_EOS: &str = "tokenizer.ggml.eos_token_id";
const KEY_EOT: &str = "tokenizer.ggml.eot_token_id";
const KEY_EOM: &str = "tokenizer.ggml.eom_token_id";
const KEY_UNK: &str = "tokenizer.ggml.unknown_token_id";
const KEY_FIM_PAD: &str = "tokenizer.ggml.fim_pad_token_id";
const KEY_FIM_REP: &str = "tokenizer.ggml.fim_rep_token_id";
const KEY_FIM_SEP: &str = "tokenizer.ggml.fim_sep_token_id";
const KEY_FIM_PRE: &str = "tokenizer.ggml.fim_pre_token_id";
const KEY_FIM_SUF: &str = "tokenizer.ggml.fim_suf_token_id";
const KEY_FIM_MID: &str = "tokenizer.ggml.fim_mid_token_id";

/// Every special-id key llama.cpp reads (GGUF spells "seperator"); each must lie in the vocabulary.
const SPECIAL_ID_KEYS: &[&str] = &[
    KEY_BOS,
    KEY_EOS,
    KEY_EOT,
    KEY_EOM,
    KEY_UNK,
    "tokenizer.ggml.seperator_token_id",
    "tokenizer.ggml.padding_token_id",
    "tokenizer.ggml.mask_token_id",
    KEY_FIM_PRE,
    KEY_FIM_SUF,
    KEY_FIM_MID,
    KEY_FIM_PAD,
    KEY_FIM_REP,
    KEY_FIM_SEP,
    "tokenizer.ggml.prefix_token_id",
    "tokenizer.ggml.suffix_token_id",
    "tokenizer.ggml.middle_token_id",
];

/// llama.cpp's defaults for SPM vocabularies that lack the keys (LLaMA 1/2 numbering).
const SPM_DEFAULT_BOS: u32 = 1;
const SPM_DEFAULT_EOS: u32 = 2;
const SPM_DEFAULT_UNK: u32 = 0;

// Token texts llama.cpp recognises on load (llama-vocab.cpp); a match is forced to control type.
const EOT_NAMES: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|end_of_text|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "<｜end▁of▁sentence｜>",
    "<end_of_utterance>",
];
const EOM_NAMES: &[&str] = &["<|eom_id|>"];
const FIM_PRE_NAMES: &[&str] = &["<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<｜fim▁begin｜>", "<PRE>", "▁<PRE>", "<|code_prefix|>", "<|prefix|>"];
const FIM_SUF_NAMES: &[&str] = &["<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<｜fim▁hole｜>", "<SUF>", "▁<SUF>", "<|code_suffix|>", "<|suffix|>"];
const FIM_MID_NAMES: &[&str] = &["<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<｜fim▁end｜>", "<MID>", "▁<MID>", "<|code_middle|>", "<|middle|>"];
const FIM_PAD_NAMES: &[&str] = &["<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"];
const FIM_REP_NAMES: &[&str] = &["<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"];
const FIM_SEP_NAMES: &[&str] = &["<|file_sep|>"];
const EOG_NAMES: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<|return|>",
    "<|call|>",
    "<|flush|>",
    "<|calls|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "</s>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "[EOS]",
    "<|end_of_text|>",
    "<end_of_utterance>",
    "<eos>",
    "<turn|>",
    "<|tool_response>",
    "<｜end▁of▁sentence｜>",
    "[e~[",
];
/// gpt-oss tokens llama.cpp always renders (forced to user-defined).
const ALWAYS_RENDERED_NAMES: &[&str] = &["<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"];

/// Which tokenizer family the vocabulary belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ModelKind {
    /// `llama`: SentencePiece pieces with scores and `<0xNN>` byte fallback.
    Spm,
    /// `gpt2`: byte-level BPE with ranked merges and a regex pre-tokenizer.
    Bpe,
}

/// Token attributes as llama.cpp keeps them: a bit set, because its load-time fix-ups add bits.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Attr(u16);

impl Attr {
    pub const UNDEFINED: Attr = Attr(0);
    pub const UNKNOWN: Attr = Attr(1 << 0);
    pub const UNUSED: Attr = Attr(1 << 1);
    pub const NORMAL: Attr = Attr(1 << 2);
    pub const CONTROL: Attr = Attr(1 << 3);
    pub const USER_DEFINED: Attr = Attr(1 << 4);
    pub const BYTE: Attr = Attr(1 << 5);

    /// `tokenizer.ggml.token_type` values (llama_token_type).
    fn from_type(t: i32) -> Attr {
        match t {
            1 => Attr::NORMAL,
            2 => Attr::UNKNOWN,
            3 => Attr::CONTROL,
            4 => Attr::USER_DEFINED,
            5 => Attr::UNUSED,
            6 => Attr::BYTE,
            _ => Attr::UNDEFINED,
        }
    }

    pub const fn has(self, other: Attr) -> bool {
        self.0 & other.0 != 0
    }

    pub const fn with(self, other: Attr) -> Attr {
        Attr(self.0 | other.0)
    }
}

/// Everything the tokenizer needs from the metadata, validated.
pub(crate) struct Vocab {
    pub kind: ModelKind,
    /// Pre-tokenizer of a `gpt2` vocabulary.
    pub pre: Option<PreSpec>,
    pub tokens: Vec<String>,
    /// Token text → id, in the form the `tokenizers` BPE model takes.
    pub text_to_id: TextToId,
    /// Zero where the file has no scores (llama.cpp does the same).
    pub scores: Vec<f32>,
    pub attrs: Vec<Attr>,
    /// `gpt2` merges, "left right" strings in rank order.
    pub merges: Vec<String>,
    pub bos: Option<u32>,
    pub eos: Option<u32>,
    pub unk: Option<u32>,
    /// Sorted, deduplicated end-of-generation ids.
    pub eog: Vec<u32>,
    pub add_bos: bool,
    pub add_space_prefix: bool,
}

impl Vocab {
    pub fn read(md: &Metadata) -> Result<Vocab, TokenizerError> {
        let model = md.str(KEY_MODEL)?;
        let kind = match model {
            "llama" => ModelKind::Spm,
            "gpt2" => ModelKind::Bpe,
            other => return Err(TokenizerError::UnsupportedModel(other.to_string())),
        };
        // llama.cpp ignores `pre` for SPM vocabularies; for BPE an absent one means "default".
        let pre = match kind {
            ModelKind::Spm => None,
            ModelKind::Bpe => {
                let name = md.opt_str(KEY_PRE)?.unwrap_or_else(|| {
                    tracing::warn!("{KEY_PRE} is missing; using the \"default\" pre-tokenizer as llama.cpp does");
                    "default"
                });
                match (pre::pre_spec(name), pre::refusal(name)) {
                    (Some(spec), _) => Some(spec),
                    (None, Some(why)) => return Err(TokenizerError::RefusedPre { name: name.to_string(), why }),
                    (None, None) => return Err(TokenizerError::UnsupportedPre(name.to_string())),
                }
            }
        };

        let mut tokens = md.str_array(KEY_TOKENS)?.to_vec();
        let n = tokens.len();
        if n == 0 {
            return Err(TokenizerError::EmptyVocab);
        }
        if u32::try_from(n).is_err() {
            return Err(TokenizerError::LengthMismatch { key: KEY_TOKENS, len: n, vocab: u32::MAX as usize });
        }
        let mut text_to_id = TextToId::with_capacity(n);
        for (i, t) in tokens.iter_mut().enumerate() {
            if t.is_empty() {
                // llama.cpp's placeholder: an empty token would match everywhere.
                *t = format!("[EMPTY_{i}]");
            }
            if let Some(first) = text_to_id.insert(t.clone(), i as u32) {
                return Err(TokenizerError::DuplicateToken { text: t.clone(), first, second: i as u32 });
            }
        }

        let scores = read_scores(md, n)?;
        let attrs = match md.opt_i32_array(KEY_TOKEN_TYPE)? {
            None => vec![Attr::NORMAL; n],
            Some(types) if types.len() != n => return Err(TokenizerError::LengthMismatch { key: KEY_TOKEN_TYPE, len: types.len(), vocab: n }),
            Some(types) => types.iter().map(|&t| Attr::from_type(t)).collect(),
        };
        let merges = match kind {
            ModelKind::Spm => Vec::new(),
            ModelKind::Bpe => md.str_array(KEY_MERGES)?.to_vec(),
        };

        let id = |key: &str| -> Result<Option<u32>, TokenizerError> {
            match md.opt_u32(key)? {
                Some(id) if id as usize >= n => Err(TokenizerError::SpecialTokenOutOfRange { key: key.to_string(), id, vocab: n }),
                other => Ok(other),
            }
        };
        for key in SPECIAL_ID_KEYS {
            id(key)?;
        }
        let spm_default = |d: u32| (kind == ModelKind::Spm && (d as usize) < n).then_some(d);
        let bos = id(KEY_BOS)?.or_else(|| spm_default(SPM_DEFAULT_BOS));
        let eos = id(KEY_EOS)?.or_else(|| spm_default(SPM_DEFAULT_EOS));
        let unk = id(KEY_UNK)?.or_else(|| spm_default(SPM_DEFAULT_UNK));

        let add_bos_default = match (kind, &pre) {
            (ModelKind::Spm, _) => true,
            (ModelKind::Bpe, Some(p)) => p.add_bos,
            (ModelKind::Bpe, None) => false,
        };
        let add_bos = md.opt_bool(KEY_ADD_BOS)?.unwrap_or(add_bos_default);
        let add_space_prefix = kind == ModelKind::Spm && md.opt_bool(KEY_ADD_SPACE_PREFIX)?.unwrap_or(true);

        let mut vocab = Vocab { kind, pre, tokens, text_to_id, scores, attrs, merges, bos, eos, unk, eog: Vec::new(), add_bos, add_space_prefix };
        let eot = id(KEY_EOT)?;
        let eom = id(KEY_EOM)?;
        let fim = [id(KEY_FIM_PAD)?, id(KEY_FIM_REP)?, id(KEY_FIM_SEP)?];
        vocab.detect_end_of_generation(eot, eom, fim, [id(KEY_FIM_PRE)?, id(KEY_FIM_SUF)?, id(KEY_FIM_MID)?]);
        Ok(vocab)
    }

    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    fn force_control(&mut self, id: u32) {
        let a = &mut self.attrs[id as usize];
        *a = a.with(Attr::CONTROL);
    }

    /// First token (by id) whose text is in `names`, made control as llama.cpp does.
    fn find_named(&mut self, names: &[&str]) -> Option<u32> {
        let id = names.iter().filter_map(|n| self.text_to_id.get(*n).copied()).min()?;
        self.force_control(id);
        Some(id)
    }

    /// llama.cpp's end-of-generation set: FIM pad/repo/sep, tokens named like an end of turn,
    /// EOS, EOT and EOM; with its two removals for harmony (`<|end|>`) and gemma4 (`</s>`).
    fn detect_end_of_generation(
        &mut self,
        eot: Option<u32>,
        eom: Option<u32>,
        [fim_pad, fim_rep, fim_sep]: [Option<u32>; 3],
        [fim_pre, fim_suf, fim_mid]: [Option<u32>; 3],
    ) {
        let eot = eot.or_else(|| self.find_named(EOT_NAMES));
        let eom = eom.or_else(|| self.find_named(EOM_NAMES));
        // FIM prefix/suffix/middle are not EOG, but llama.cpp makes them control all the same.
        for (id, names) in [(fim_pre, FIM_PRE_NAMES), (fim_suf, FIM_SUF_NAMES), (fim_mid, FIM_MID_NAMES)] {
            if id.is_none() {
                self.find_named(names);
            }
        }
        let fim_pad = fim_pad.or_else(|| self.find_named(FIM_PAD_NAMES));
        let fim_rep = fim_rep.or_else(|| self.find_named(FIM_REP_NAMES));
        let fim_sep = fim_sep.or_else(|| self.find_named(FIM_SEP_NAMES));

        let mut eog: Vec<u32> = [fim_pad, fim_rep, fim_sep].into_iter().flatten().collect();
        for name in EOG_NAMES {
            if let Some(&id) = self.text_to_id.get(*name) {
                eog.push(id);
                self.force_control(id);
            }
        }
        for name in ALWAYS_RENDERED_NAMES {
            if let Some(&id) = self.text_to_id.get(*name) {
                self.attrs[id as usize] = Attr::USER_DEFINED;
            }
        }
        eog.extend([self.eos, eot, eom].into_iter().flatten());
        eog.sort_unstable();
        eog.dedup();

        let has = |v: &Vocab, eog: &[u32], name: &str| eog.iter().copied().find(|&id| v.tokens[id as usize] == name);
        let (ret, call, calls, flush) =
            (has(self, &eog, "<|return|>"), has(self, &eog, "<|call|>"), has(self, &eog, "<|calls|>"), has(self, &eog, "<|flush|>"));
        if let Some(end) = has(self, &eog, "<|end|>") {
            let call = call.or(calls);
            if (ret.is_some() && call.is_some()) || (call.is_some() && flush.is_some()) {
                eog.retain(|&id| id != end);
                self.attrs[end as usize] = Attr::USER_DEFINED;
            }
        }
        if let (Some(_), Some(s)) = (has(self, &eog, "<|tool_response>"), has(self, &eog, "</s>")) {
            eog.retain(|&id| id != s);
            self.attrs[s as usize] = Attr::NORMAL;
        }
        self.eog = eog;
    }
}

/// Scores as f32 or i32 (llama.cpp accepts both); any other type is a `WrongType` error.
fn read_scores(md: &Metadata, n: usize) -> Result<Vec<f32>, TokenizerError> {
    let scores = match md.get(KEY_SCORES) {
        None => return Ok(vec![0.0; n]),
        Some(Value::Array(Array::F32(v))) => v.clone(),
        Some(Value::Array(Array::I32(v))) => v.iter().map(|&s| s as f32).collect(),
        Some(v) => return Err(GgufError::WrongType { key: KEY_SCORES.to_string(), expected: "array<f32>", got: v.type_name() }.into()),
    };
    if scores.len() != n {
        return Err(TokenizerError::LengthMismatch { key: KEY_SCORES, len: scores.len(), vocab: n });
    }
    Ok(scores)
}

//! Byte-level BPE pre-tokenizers by `tokenizer.ggml.pre` name, as llama.cpp's llama-vocab.cpp
//! defines them: the regexes each type applies in turn, its flags, and the two hand-written
//! splitters (Kimi-K2, digit groups) llama.cpp runs in place of a regex.

use std::sync::OnceLock;

use tokenizers::utils::SysRegex;

/// A pre-tokenizer as llama.cpp defines it (llm_tokenizer_bpe): an optional hand-written split,
/// then regexes applied in turn, each splitting the pieces of the previous one, plus the flags
/// llama.cpp ties to the same name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct PreSpec {
    pub name: &'static str,
    /// Runs before the regexes (in llama.cpp it stands where the first regex would).
    pub custom: Option<CustomSplit>,
    pub regexes: &'static [&'static str],
    /// A whole pre-token that is itself in the vocabulary is emitted without merging.
    pub ignore_merges: bool,
    /// Default for `add_bos_token` when the file does not say.
    pub add_bos: bool,
}

impl PreSpec {
    const fn new(name: &'static str, regexes: &'static [&'static str]) -> PreSpec {
        PreSpec { name, custom: None, regexes, ignore_merges: false, add_bos: false }
    }

    const fn ignore_merges(mut self) -> PreSpec {
        self.ignore_merges = true;
        self
    }

    const fn add_bos(mut self) -> PreSpec {
        self.add_bos = true;
        self
    }

    const fn custom(mut self, split: CustomSplit) -> PreSpec {
        self.custom = Some(split);
        self
    }
}

// Regexes as llama.cpp's llama-vocab.cpp has them, written as llama.cpp evaluates them: its
// case-insensitive groups spelled out (`[sS]`), and where it runs a regex on "collapsed" text
// (every non-ASCII letter one placeholder), `\p{Lu}`/`\p{Ll}`/... become `\p{L}`, since there
// they all match every letter. `(?=[\p{L}])[^a-z]` is written as the class `[\p{L}&&[^a-z]]`.
// Non-ASCII characters are written as `\x{...}` so no normalization of this file can change them.
const RE_GPT2: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)";
const RE_LLAMA3: &str =
    r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const RE_JAIS2: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s{512}(?!\S)|\s{256}(?!\S)|\s{128}(?!\S)|\s{64}(?!\S)|\s{32}(?!\S)|\s{16}(?!\S)|\s{8}(?!\S)|\s{4}(?!\S)|\s{1,2}(?!\S)|\s{1}";
const RE_QWEN2: &str =
    r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const RE_QWEN35: &str =
    r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const RE_UFAKZEKA: &str = r"[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const RE_SEED_CODER: &str =
    r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1}| ?[^\s\p{L}\p{N}\r\n]+|\s*[\r\n]+|\s+(?!\S)|\s+";
const RE_BAILINGMOE: &str = r"'(?:[sSdDmMtT]|[lL][lL]|[vV][eE]|[rR][eE])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+";
const RE_EXAONE_MOE: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?(?:\p{L}\p{M}*(?: \p{L}\p{M}*)*)+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]?|\s*[\r\n]|\s+(?!\S)|\s+";
const RE_MINICPM5: &str =
    r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}+| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const RE_TEKKEN: &str = r"[^\r\n\p{L}\p{N}]?[\p{L}&&[^a-z]]*[\p{L}&&[^A-Z]]+|[^\r\n\p{L}\p{N}]?[\p{L}&&[^a-z]]+[\p{L}&&[^A-Z]]*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const RE_GPT4O: &str = r"[^\r\n\p{L}\p{N}]?[\p{L}&&[^a-z]]*[\p{L}&&[^A-Z]]+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|[^\r\n\p{L}\p{N}]?[\p{L}&&[^a-z]]+[\p{L}&&[^A-Z]]*(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";
// Youtu's and Tiny Aya's cased-letter classes, collapsed: any run of letters and marks.
const RE_YOUTU_WORDS: &str =
    r"[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const RE_TINY_AYA_WORDS: &str =
    r"[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const RE_YOUTU_CJK: &str = r"[\x{AC00}-\x{D7A3}\x{3131}-\x{318E}]+|[\x{FF01}\x{2026}\x{201C}\x{201D}\x{2018}\x{2019}\x{2014}\x{FF1A}\x{FF1B}\x{FF0C}\x{3001}-\x{303F}\x{FE30}-\x{FE4F}]+|[\x{3105}-\x{312F}]+|[\x{4E00}-\x{9FA5}\x{3040}-\x{309F}\x{30A0}-\x{30FF}]+";
const RE_DEEPSEEK3_CJK: &str = r"[\x{4E00}-\x{9FA5}\x{3040}-\x{309F}\x{30A0}-\x{30FF}]+";
const RE_DEEPSEEK3_WORDS: &str =
    r##"[!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"##;
const RE_SPARK_WORDS: &str = r##"[!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+|[\r\n]|\s+(?!\S)|\s+"##;
// llama.cpp's source has U+8C48 where the upstream class starts at U+F900 (an NFC pass over
// its file), so this range runs from U+8C48 to U+FAFF.
const RE_AFMOE_CJK: &str = r"[\x{4E00}-\x{9FFF}\x{3400}-\x{4DBF}\x{8C48}-\x{FAFF}\x{3040}-\x{309F}\x{30A0}-\x{30FF}\x{FF65}-\x{FF9F}\x{2F00}-\x{2FDF}\x{0E40}-\x{0E7F}\x{0E80}-\x{0EFF}\x{1780}-\x{17FF}\x{1000}-\x{109F}\x{AA60}-\x{AA7F}\x{A9E0}-\x{A9FF}\x{AC00}-\x{D7AF}\x{1100}-\x{11FF}]+";
const RE_BLOOM: &str = r" ?[^(\s|.,!?\x{2026}\x{3002}\x{FF0C}\x{3001}\x{0964}\x{06D4}\x{060C})]+";
const RE_DEFAULT_PUNCT: &str = r"[\p{P}\$\+<=>\^~\|]+";
const RE_FALCON_PUNCT: &str = r"[\p{P}\$\+<=>\^~\|`]+";
const RE_DIGIT: &str = r"\p{N}";
const RE_DIGITS: &str = r"\p{N}+";
const RE_ONE_TO_THREE_DIGITS: &str = r"\p{N}{1,3}";
const RE_THREE_DIGITS: &str = r"[0-9][0-9][0-9]";
// Zero-width: splits a run of ASCII digits before each group of three counted from its end.
const RE_THOUSANDS: &str = r"(?=([0-9]{3})+(?![0-9]))";
const RE_NEWLINE: &str = r"[\r\n]";
const RE_LINES: &str = r"[^\n]+|[\n]+";
const RE_CJK: &str = r"[\x{4E00}-\x{9FA5}\x{0800}-\x{4E00}\x{AC00}-\x{D7FF}]+";
// DeepSeek LLM's letters: Latin, Greek, Cyrillic, Armenian, Georgian, Cherokee and the other
// cased scripts, as ranges (llama.cpp's list). The six code points written as `\x{...}` have
// singleton canonical decompositions: written as characters, any NFC pass over this file would
// turn them into others (U+1FDB into U+038A, U+212A KELVIN SIGN into K) and break the ranges.
const RE_DEEPSEEK_LLM_LETTERS: &str = r"\s?[A-Za-zµÀ-ÖØ-öø-ƺƼ-ƿǄ-ʓʕ-ʯͰ-ͳͶͷͻ-ͽͿΆΈ-ΊΌΎ-ΡΣ-ϵϷ-ҁҊ-ԯԱ-ՖႠ-ჅᎠ-Ᏽᏸ-ᏽᲐ-ᲺᲽ-Ჿᴀ-ᴫᵫ-ᵷᵹ-ᶚḀ-ἕἘ-Ἕἠ-ὅὈ-Ὅὐ-ὗὙὛὝὟ-\x{1F7D}ᾀ-ᾴᾶ-ᾼ\x{1FBE}ῂ-ῄῆ-ῌῐ-\x{1FD3}ῖ-\x{1FDB}ῠ-Ῥῲ-ῴῶ-ῼℂℇℊ-ℓℕℙ-ℝℤ\x{2126}ℨ\x{212A}-ℭℯ-ℴℹℼ-ℿⅅ-ⅉⅎↃↄⰀ-ⱻⱾ-ⳤⳫ-ⳮⳲⳳꙀ-ꙭꚀ-ꚛꜢ-ꝯꝱ-ꞇꞋ-ꞎꭰ-ꮿﬀ-ﬆﬓ-ﬗＡ-Ｚａ-ｚ𐐀-𐑏𐒰-𐓓𐓘-𐓻𐲀-𐲲𐳀-𐳲𑢠-𑣟𞤀-𞥃]+";
const RE_DEEPSEEK_LLM_PUNCT: &str = r"\s?[!-/:-~！-／：-～‘-‟　-。]+";
const RE_CHAMELEON_SENTINEL: &str = r"<sentinel:[0-9]+>";
const RE_CHAMELEON_IMAGE: &str = r"(IMGIMG)((A|B|C|D|E|F|G|H|I){1,4})Z";
const RE_CHAMELEON_SPACES: &str = r"([\t\n]|    |  )";
const RE_CHAMELEON_PUNCT: &str = r"[\p{P}!-/:-@\[-`{-~]";

const GPT2: &[&str] = &[RE_GPT2];
const STARCODER: &[&str] = &[RE_DIGIT, RE_GPT2];
const LLAMA3: &[&str] = &[RE_LLAMA3];
const QWEN2: &[&str] = &[RE_QWEN2];
const DEEPSEEK3: &[&str] = &[RE_ONE_TO_THREE_DIGITS, RE_DEEPSEEK3_CJK, RE_DEEPSEEK3_WORDS];
const GPT4O: &[&str] = &[RE_GPT4O];
const BLOOM: &[&str] = &[RE_BLOOM];

/// Every byte-level BPE pre-tokenizer llama.cpp accepts for causal models, by its names.
const PRE_SPECS: &[(&[&str], PreSpec)] = &[
    (&["default"], PreSpec::new("default", &[RE_DEFAULT_PUNCT, RE_GPT2, RE_DIGITS, RE_THREE_DIGITS])),
    (&["llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2"], PreSpec::new("llama3", LLAMA3).ignore_merges().add_bos()),
    (&["dbrx", "smaug-bpe"], PreSpec::new("dbrx", LLAMA3)),
    (&["chatglm-bpe"], PreSpec::new("chatglm-bpe", LLAMA3)),
    (&["glm4", "glm5"], PreSpec::new("glm4", LLAMA3).ignore_merges()),
    (&["jais-2"], PreSpec::new("jais-2", &[RE_JAIS2])),
    (&["qwen2", "deepseek-r1-qwen", "kormo", "f2llmv2", "stablelm2", "hunyuan", "solar-open", "megrez", "grok-2"], PreSpec::new("qwen2", QWEN2)),
    (&["qwen35"], PreSpec::new("qwen35", &[RE_QWEN35])),
    (&["ufakzeka"], PreSpec::new("ufakzeka", &[RE_UFAKZEKA])),
    (&["laguna"], PreSpec::new("laguna", &[RE_LINES, RE_QWEN2])),
    (&["seed-coder"], PreSpec::new("seed-coder", &[RE_SEED_CODER])),
    (&["bailingmoe", "bailingmoe2", "llada-moe"], PreSpec::new("bailingmoe", &[RE_BAILINGMOE])),
    (&["exaone-moe"], PreSpec::new("exaone-moe", &[RE_EXAONE_MOE])),
    (&["minicpm5"], PreSpec::new("minicpm5", &[RE_ONE_TO_THREE_DIGITS, RE_MINICPM5]).ignore_merges()),
    (&["gpt-2", "phi-2", "gigachat", "a.x-4.0", "mellum", "mpt", "olmo", "jais", "trillion", "granite-docling", "exaone4"], PreSpec::new("gpt-2", GPT2)),
    (&["starcoder", "refact", "command-r", "smollm", "codeshell", "exaone", "minerva-7b", "mellum2"], PreSpec::new("starcoder", STARCODER)),
    (&["falcon"], PreSpec::new("falcon", &[RE_FALCON_PUNCT, RE_GPT2, RE_THREE_DIGITS])),
    (&["deepseek-llm"], PreSpec::new("deepseek-llm", &[RE_NEWLINE, RE_DEEPSEEK_LLM_LETTERS, RE_DEEPSEEK_LLM_PUNCT, r"\s+$", RE_CJK, RE_DIGITS]).add_bos()),
    (&["deepseek-coder"], PreSpec::new("deepseek-coder", &[RE_NEWLINE, r"\s?\p{L}+", r"\s?\p{P}+", RE_CJK, RE_DIGIT]).add_bos()),
    (&["deepseek-v3", "hunyuan-dense", "joyai-llm", "hy_v4"], PreSpec::new("deepseek-v3", DEEPSEEK3)),
    (&["spark2_5"], PreSpec::new("spark2_5", &[RE_ONE_TO_THREE_DIGITS, RE_DEEPSEEK3_CJK, RE_SPARK_WORDS, RE_DIGIT])),
    (&["youtu"], PreSpec::new("youtu", &[RE_YOUTU_CJK, RE_YOUTU_WORDS]).ignore_merges()),
    (&["afmoe"], PreSpec::new("afmoe", &[RE_AFMOE_CJK, RE_DEEPSEEK3_WORDS]).custom(CustomSplit::DigitGroups)),
    (&["tekken"], PreSpec::new("tekken", &[RE_TEKKEN]).ignore_merges().add_bos()),
    (&["gpt-4o", "llama4", "kanana2", "talkie", "minimax-m2"], PreSpec::new("gpt-4o", GPT4O)),
    (&["tiny_aya", "cohere2moe"], PreSpec::new("tiny_aya", &[RE_TINY_AYA_WORDS]).custom(CustomSplit::DigitGroups)),
    (&["kimi-k2"], PreSpec::new("kimi-k2", &[]).custom(CustomSplit::KimiK2)),
    (&["superbpe"], PreSpec::new("superbpe", &[RE_DIGITS, RE_THOUSANDS])),
    (&["poro-chat", "bloom", "gpt3-finnish"], PreSpec::new("bloom", BLOOM)),
    (&["viking"], PreSpec::new("viking", &[RE_BLOOM, RE_DIGIT])),
    (
        &["chameleon"],
        PreSpec::new("chameleon", &[RE_CHAMELEON_SENTINEL, RE_CHAMELEON_IMAGE, RE_CHAMELEON_SPACES, RE_DIGIT, RE_CHAMELEON_PUNCT, RE_GPT2]).add_bos(),
    ),
];

/// Names llama.cpp accepts that Flint refuses, with why.
const REFUSED: &[(&[&str], &str)] = &[
    (&["gemma4", "sarvam-moe"], "its vocabulary is raw-UTF-8 BPE with spaces written as U+2581 and no byte-level mapping, which Flint does not implement"),
    (
        &[
            "jina-es",
            "jina-de",
            "jina-v2-es",
            "jina-v2-de",
            "jina-v1-en",
            "jina-v2-code",
            "jina-v5-nano",
            "roberta-bpe",
            "modern-bert",
            "whitespace",
            "granite-embed-multi-97m",
            "granite-embed-multi-311m",
        ],
        "it belongs to an encoder-only embedding model, which Flint does not run",
    ),
];

/// Every `tokenizer.ggml.pre` name this module implements.
pub(crate) fn supported_pre_names() -> impl Iterator<Item = &'static str> {
    PRE_SPECS.iter().flat_map(|(names, _)| names.iter().copied())
}

pub(crate) fn pre_spec(name: &str) -> Option<PreSpec> {
    PRE_SPECS.iter().find(|(names, _)| names.contains(&name)).map(|(_, spec)| *spec)
}

/// Why llama.cpp knows `name` but Flint refuses it; `None` for names neither knows.
pub(crate) fn refusal(name: &str) -> Option<&'static str> {
    REFUSED.iter().find(|(names, _)| names.contains(&name)).map(|(_, why)| *why)
}

/// llama.cpp's hand-written splitters (unicode.cpp), reproduced with their quirks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum CustomSplit {
    /// Kimi-K2's pattern: Han runs, cased-letter words with contractions (Han excluded), digit
    /// triples, punctuation runs, whitespace as the GPT-4o pattern splits it.
    KimiK2,
    /// Digit runs cut into groups of three from the right (AFMoE, Tiny Aya). As in llama.cpp,
    /// the text before a run is not cut off: it joins the run's first group.
    DigitGroups,
}

impl CustomSplit {
    /// The pieces of `text`, in order, none empty; their concatenation is `text`.
    pub fn split(self, text: &str) -> Vec<&str> {
        let chars = CharInfo::of(text);
        let ends = match self {
            CustomSplit::KimiK2 => kimi_k2_ends(&chars),
            CustomSplit::DigitGroups => digit_group_ends(&chars),
        };
        let mut pieces = Vec::with_capacity(ends.len());
        let mut start = 0;
        for end in ends {
            let (a, b) = (chars.byte_offset(start), chars.byte_offset(end));
            if b > a {
                pieces.push(&text[a..b]);
            }
            start = end;
        }
        pieces
    }
}

/// Each character of a text with the classes llama.cpp's splitters ask about.
struct CharInfo {
    chars: Vec<char>,
    /// Byte offset of each character, and the text's length last.
    offsets: Vec<usize>,
    letter: Vec<bool>,
    number: Vec<bool>,
}

impl CharInfo {
    fn of(text: &str) -> CharInfo {
        static LETTERS: OnceLock<SysRegex> = OnceLock::new();
        static NUMBERS: OnceLock<SysRegex> = OnceLock::new();
        let letters = LETTERS.get_or_init(|| SysRegex::new(r"\p{L}+").expect("valid regex"));
        let numbers = NUMBERS.get_or_init(|| SysRegex::new(r"\p{N}+").expect("valid regex"));
        let (chars, mut offsets): (Vec<char>, Vec<usize>) = text.char_indices().map(|(i, c)| (c, i)).unzip();
        offsets.push(text.len());
        let mark = |re: &SysRegex| {
            let mut flags = vec![false; chars.len()];
            for (a, b) in re.find_iter(text) {
                let (i, j) = (offsets.partition_point(|&o| o < a), offsets.partition_point(|&o| o < b));
                flags[i..j].iter_mut().for_each(|f| *f = true);
            }
            flags
        };
        let (letter, number) = (mark(letters), mark(numbers));
        CharInfo { chars, offsets, letter, number }
    }

    fn len(&self) -> usize {
        self.chars.len()
    }

    fn byte_offset(&self, pos: usize) -> usize {
        self.offsets[pos]
    }

    fn char(&self, pos: usize) -> Option<char> {
        self.chars.get(pos).copied()
    }

    fn is_letter(&self, pos: usize) -> bool {
        self.letter.get(pos).copied().unwrap_or(false)
    }

    fn is_number(&self, pos: usize) -> bool {
        self.number.get(pos).copied().unwrap_or(false)
    }

    fn is_space(&self, pos: usize) -> bool {
        self.char(pos).is_some_and(is_whitespace)
    }

    /// A letter that is not Han.
    fn is_word_letter(&self, pos: usize) -> bool {
        self.is_letter(pos) && !self.char(pos).is_some_and(is_han)
    }

    fn is_han(&self, pos: usize) -> bool {
        self.char(pos).is_some_and(is_han)
    }
}

/// Unicode White_Space, the set llama.cpp's `\s` stands for.
fn is_whitespace(c: char) -> bool {
    matches!(c, '\u{9}'..='\u{D}' | ' ' | '\u{85}' | '\u{A0}' | '\u{1680}' | '\u{2000}'..='\u{200A}' | '\u{2028}' | '\u{2029}' | '\u{202F}' | '\u{205F}' | '\u{3000}')
}

/// The CJK ideograph blocks llama.cpp's `unicode_cpt_is_han` lists.
fn is_han(c: char) -> bool {
    matches!(
        c as u32,
        0x4E00..=0x9FFF | 0x3400..=0x4DBF | 0x20000..=0x2A6DF | 0x2A700..=0x2B73F | 0x2B740..=0x2B81F | 0x2B820..=0x2CEAF | 0x2CEB0..=0x2EBEF | 0xF900..=0xFAFF | 0x2F800..=0x2FA1F
    )
}

/// Piece ends (character positions) of llama.cpp's Kimi-K2 splitter.
fn kimi_k2_ends(t: &CharInfo) -> Vec<usize> {
    let n = t.len();
    let mut ends = Vec::new();
    let is_newline = |pos: usize| matches!(t.char(pos), Some('\r' | '\n'));
    // May stand before a word: in the text and not a newline, letter or number.
    let is_lead = |pos: usize| pos < n && !(is_newline(pos) || t.is_letter(pos) || t.is_number(pos));
    let mut pos = 0;
    while pos < n {
        if t.is_han(pos) {
            while t.is_han(pos) {
                pos += 1;
            }
            ends.push(pos);
            continue;
        }
        if t.is_word_letter(pos) || (is_lead(pos) && t.is_word_letter(pos + 1)) {
            let start = pos;
            if is_lead(pos) {
                pos += 1;
            }
            while t.is_word_letter(pos) {
                pos += 1;
            }
            pos += contraction_len(t, pos);
            debug_assert!(pos > start);
            ends.push(pos);
            continue;
        }
        if t.is_number(pos) {
            let mut run = 0;
            while t.is_number(pos) {
                pos += 1;
                run += 1;
                if run == 3 {
                    ends.push(pos);
                    run = 0;
                }
            }
            ends.push(pos);
            continue;
        }
        // An optional space, then symbols and punctuation (not space, letter or number), then
        // newlines.
        let sym = if t.char(pos) == Some(' ') { pos + 1 } else { pos };
        let is_symbol = |p: usize| p < n && !(t.is_space(p) || t.is_letter(p) || t.is_number(p));
        if is_symbol(sym) {
            pos = sym;
            while is_symbol(pos) {
                pos += 1;
            }
            while is_newline(pos) {
                pos += 1;
            }
            ends.push(pos);
            continue;
        }
        let mut spaces = 0;
        let mut after_newline = None;
        while t.is_space(pos + spaces) {
            if is_newline(pos + spaces) {
                after_newline = Some(pos + spaces + 1);
            }
            spaces += 1;
        }
        pos = match after_newline {
            // Whitespace up to its last newline.
            Some(end) => end,
            // A run of whitespace followed by more text leaves its last one for the next word.
            None if spaces > 1 && pos + spaces < n => pos + spaces - 1,
            None if spaces > 0 => pos + spaces,
            None => pos + 1,
        };
        ends.push(pos);
    }
    ends
}

/// Length of a contraction (`'s`, `'T`, `'re`, `'LL`, ...) at `pos`, or 0.
fn contraction_len(t: &CharInfo, pos: usize) -> usize {
    if t.char(pos) != Some('\'') || pos + 1 >= t.len() {
        return 0;
    }
    let lower = |p: usize| t.char(p).map(|c| c.to_ascii_lowercase());
    match lower(pos + 1) {
        Some('s' | 't' | 'm' | 'd') => 2,
        c1 if pos + 2 < t.len() => match (c1, lower(pos + 2)) {
            (Some('r'), Some('e')) | (Some('v'), Some('e')) | (Some('l'), Some('l')) => 3,
            _ => 0,
        },
        _ => 0,
    }
}

/// Piece ends of llama.cpp's digit-group splitter: each run of numbers ends a piece after its
/// leading `len % 3` digits and after every three digits; what precedes a run joins its first
/// piece.
fn digit_group_ends(t: &CharInfo) -> Vec<usize> {
    let n = t.len();
    let mut ends = Vec::new();
    let mut pos = 0;
    while pos < n {
        if !t.is_number(pos) {
            pos += 1;
            continue;
        }
        let start = pos;
        while t.is_number(pos) {
            pos += 1;
        }
        let lead = (pos - start) % 3;
        if lead > 0 {
            ends.push(start + lead);
        }
        ends.extend((start + lead + 3..=pos).step_by(3));
    }
    if ends.last() != Some(&n) {
        ends.push(n);
    }
    ends
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_regex_compiles() {
        for (_, spec) in PRE_SPECS {
            for re in spec.regexes {
                assert!(SysRegex::new(re).is_ok(), "{}: {re}", spec.name);
            }
        }
    }

    #[test]
    fn names_are_unique() {
        let mut names: Vec<&str> = supported_pre_names().chain(REFUSED.iter().flat_map(|(n, _)| n.iter().copied())).collect();
        let n = names.len();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), n);
    }

    #[test]
    fn digit_groups_keep_llama_cpp_s_quirk() {
        assert_eq!(CustomSplit::DigitGroups.split("1234567"), ["1", "234", "567"]);
        assert_eq!(CustomSplit::DigitGroups.split("ab123456 cd"), ["ab123", "456", " cd"]);
        assert_eq!(CustomSplit::DigitGroups.split("x12y"), ["x12", "y"]);
        assert_eq!(CustomSplit::DigitGroups.split(""), Vec::<&str>::new());
    }

    #[test]
    fn kimi_k2_splits_han_words_digits_and_spaces() {
        assert_eq!(CustomSplit::KimiK2.split("中文English混合12345"), ["中文", "English", "混合", "123", "45"]);
        assert_eq!(CustomSplit::KimiK2.split("I'LL go  now!!\n\nx"), ["I'LL", " go", " ", " now", "!!\n\n", "x"]);
    }
}

#!/usr/bin/env python3
"""Makes the pre-tokenizer test data: for each `tokenizer.ggml.pre` name, a copy of one of
llama.cpp's vocabulary GGUFs (../shared/golden/llama-cpp-vocab) with the name set, tokenized by
llama.cpp's own llama-tokenize (no BOS, special tokens parsed only to separate the strings),
written as <name>.json: {"pre", "vocab", "strings", "ids"}. Run once; the output is committed.

    python3 tests/data/pretok/make.py [NAME...]
"""

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from gguf import GGUFReader, GGUFValueType, GGUFWriter

HERE = Path(__file__).resolve().parent
VOCAB_DIR = HERE.parents[2] / ".." / "shared" / "golden" / "llama-cpp-vocab"
LLAMA_BIN = Path.home() / ".cache/flint-peer/llama_cpp_python-0.3.36/vendor/llama.cpp/build/bin"
TOKENIZE = LLAMA_BIN / "llama-tokenize"

# Every causal-model name llama.cpp's llama-vocab.cpp accepts for a BPE vocabulary. All use
# llama-bpe's vocabulary (Llama 3): of the three byte-level ones in the golden set it tells the
# most pre-tokenizers apart (it has multi-digit, CJK and punctuation-plus-newline tokens that
# merge across the boundaries the regexes disagree on; qwen2's has single digits only).
NAMES = {
    "llama-bpe": [
        "llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2",
        "dbrx", "smaug-bpe", "jais-2", "chatglm-bpe", "glm4", "glm5",
        "gpt-2", "phi-2", "gigachat", "a.x-4.0", "mellum", "mpt", "olmo", "jais", "trillion",
        "granite-docling", "exaone4", "starcoder", "refact", "command-r", "smollm", "codeshell",
        "exaone", "minerva-7b", "mellum2", "falcon", "default",
        "qwen2", "deepseek-r1-qwen", "kormo", "f2llmv2", "stablelm2", "hunyuan", "solar-open",
        "megrez", "qwen35", "grok-2", "ufakzeka", "laguna", "seed-coder", "bailingmoe",
        "bailingmoe2", "llada-moe", "exaone-moe", "minicpm5", "deepseek-llm", "deepseek-coder",
        "deepseek-v3", "hunyuan-dense", "joyai-llm", "hy_v4", "spark2_5", "youtu", "afmoe",
        "tekken", "gpt-4o", "llama4", "kanana2", "talkie", "minimax-m2", "tiny_aya",
        "cohere2moe", "kimi-k2", "superbpe", "poro-chat", "bloom", "gpt3-finnish", "viking",
        "chameleon",
    ],
}

# Strings that reach every branch of the regexes: digits of many lengths, contractions in both
# cases, CJK, emoji, accents and combining marks, whitespace runs and newlines, punctuation
# runs, code, mixed case.
STRINGS = [
    "Hello world",
    " Hello World. HELLO, wORLD!",
    "1 12 123 1234 12345 123456 1234567 12345678 3.14159 1,000,000 -42",
    "abc123def 4567xyz 2024-01-01 v1.2.3 0x1F9A",
    "it's I'm we're they've she'll he'd don't IT'S I'M WE'RE THEY'VE SHE'LL HE'D It'S 'tis",
    "HelloWorld camelCase XMLHttpRequest iPhone McDonald's ÀBÇdéf ÉCOLE",
    "你好，世界！这是一个测试。中文English混合123测试",
    "こんにちは、カタカナ、漢字。ﾊﾝｶｸ",
    "안녕하세요 세계! ㄱㄴㄷ ㄅㄆ",
    "🦙🔥 ok 👍🏽 🇫🇷 ❤️ 👨‍👩‍👧",
    "café naïve résumé Ünïcödé São Paulo e\u0301 n\u0303",
    "Привет мир Ελληνικά Ωmega",
    "नमस्ते दुनिया। مرحبا بالعالم، ۔",
    "a  b   c\t\td\n\ne \n \n  f    \n",
    "   leading",
    "trailing   ",
    "\n\n\n",
    " \t \r\n x",
    "Wait... what?!?! (yes) [no] {maybe} <tag/> --- *** ### $$$ 100% @user #hash ~/path `x`",
    "def f(x):\n    return x**2 + 1  # comment\n\nif __name__ == '__main__':\n\tprint(f\"{f(3)}\")\n",
    "path/to/\nfile //\n\r\n comment",
    "Hello, world. Hi! How? 。，、… “quoted” ‘single’ — dash：；",
    "a\u00a0b\u3000c\u2003d",
    "ＡＢＣ１２３！ ①②③ ٣٤٥ ½ ²",
    "<sentinel:12> IMGIMGABCZ text\t\n    x  y",
    " ",
    "x" + " " * 20 + "y" + "\n" * 3,
    " 中文 我们 日本語 한국어",
    "we'llama they'rey I'dk O'Neil don'the it'sin they'rent we'veal",
    "end.\n\nNext;\n\n\nx //\n\ny",
    # Llama 3 tokens that its merges do not build: only `ignore_merges` emits them whole.
    "bir milyon tekrar merkez",
]

SEPARATORS = {"qwen2": "<|endoftext|>", "llama-bpe": "<|end_of_text|>", "gpt-2": "<|endoftext|>"}


def read_vocab(name):
    reader = GGUFReader(VOCAB_DIR / f"ggml-vocab-{name}.gguf")
    fields = []
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        sub = field.types[-1] if field.types[0] == GGUFValueType.ARRAY else None
        fields.append((key, field.contents(), field.types[0], sub))
    arch = reader.fields["general.architecture"].contents()
    tokens = reader.fields["tokenizer.ggml.tokens"].contents()
    return arch, fields, tokens


def write_vocab(path, arch, fields, pre):
    w = GGUFWriter(str(path), arch)
    for key, val, vtype, sub in fields:
        if key == "tokenizer.ggml.pre":
            val = pre
        w.add_key_value(key, val, vtype, sub)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def tokenize(gguf_path, text):
    """(ids, log) of llama-tokenize on `text`, BOS off, special tokens parsed."""
    with tempfile.NamedTemporaryFile("wb", suffix=".txt", delete=False) as f:
        f.write(text.encode("utf-8"))
        prompt = f.name
    env = dict(os.environ, LD_LIBRARY_PATH=str(LLAMA_BIN))
    cmd = [str(TOKENIZE), "-m", str(gguf_path), "-f", prompt, "--no-escape", "--ids", "--no-bos", "-v"]
    r = subprocess.run(cmd, capture_output=True, env=env)
    os.unlink(prompt)
    if r.returncode != 0:
        raise RuntimeError(r.stderr.decode(errors="replace") + r.stdout.decode(errors="replace"))
    lines = [l for l in r.stdout.decode().splitlines() if l.startswith("[")]
    return json.loads(lines[-1]), r.stderr.decode(errors="replace") + r.stdout.decode(errors="replace")


def make(vocab, arch, fields, tokens, name, tmp, check_each):
    path = Path(tmp) / f"{name}.gguf"
    write_vocab(path, arch, fields, name)
    sep_text = SEPARATORS[vocab]
    sep = tokens.index(sep_text)
    assert not any(sep_text in s for s in STRINGS)
    ids, log = tokenize(path, sep_text.join(STRINGS))
    # The loader prints every key it read: llama.cpp really saw this name.
    assert f"tokenizer.ggml.pre str              = {name}" in log, f"{name}: name not in the loader's log"
    groups, cur = [], []
    for i in ids:
        if i == sep:
            groups.append(cur)
            cur = []
        else:
            cur.append(i)
    groups.append(cur)
    assert len(groups) == len(STRINGS), f"{name}: {len(groups)} groups for {len(STRINGS)} strings"
    if check_each:
        # Separating by a special token gives what each string alone gives.
        for s, g in zip(STRINGS, groups):
            alone, _ = tokenize(path, s)
            assert alone == g, f"{name} {s!r}: alone {alone}, joined {g}"
    out = {"pre": name, "vocab": f"ggml-vocab-{vocab}.gguf", "strings": STRINGS, "ids": groups}
    (HERE / f"{name}.json").write_text(json.dumps(out, ensure_ascii=False, separators=(",", ":")) + "\n")
    path.unlink()


def main():
    only = set(sys.argv[1:])
    with tempfile.TemporaryDirectory() as tmp:
        for vocab, names in NAMES.items():
            names = [n for n in names if not only or n in only]
            if not names:
                continue
            arch, fields, tokens = read_vocab(vocab)
            # A name llama.cpp does not know must fail: the copy's name is what it reads.
            bogus = Path(tmp) / "bogus.gguf"
            write_vocab(bogus, arch, fields, "no-such-pre")
            # (Its "unknown pre-tokenizer type" message does not always reach the pipe before
            # it exits, so the exit status is the check.)
            try:
                tokenize(bogus, "x")
                raise SystemExit("llama-tokenize accepted an unknown pre-tokenizer name")
            except RuntimeError:
                pass
            for k, name in enumerate(names):
                make(vocab, arch, fields, tokens, name, tmp, check_each=(k == 0))
                print(f"{name} ({vocab})", flush=True)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Tiny random-weight models with RoPE *scaling*, and Hugging Face transformers reference outputs.

Makes, beside this script:

  yarn/      Qwen3ForCausalLM (GGUF arch `qwen3`): the shapes and tokenizer of
             shared/golden/families/qwen3 (3 layers, hidden 64, 4 / 2 heads x head_dim 32, QK-norm,
             FFN 192, vocab 2051, tied output) with YaRN: rope_type "yarn", factor 4,
             original_max_position_embeddings 64, max_position_embeddings 256.
  longrope/  Phi3ForCausalLM (GGUF arch `phi3`): the shapes and tokenizer of
             shared/golden/families/phi3 (3 layers, hidden 128, 4 / 2 heads x 32, fused qkv and
             gate_up, FFN 256, vocab 2004) with LongRoPE: rope_type "longrope", 16 long and 16 short
             factors, original_max_position_embeddings 64, max_position_embeddings 256.

Each holds `model.gguf` (llama.cpp's convert_hf_to_gguf.py --outtype f16 of the HF directory the
reference used; every weight was rounded to f16 first, so GGUF and reference hold the same
numbers), `hf/config.json` + `hf/generation_config.json` (the HF weights are not kept: rerun
this script to get them back, it is deterministic), `convert.log`, and per prompt n = 1..3
`<n>.json` + `<n>.last_logits.f32` in the format of shared/golden/families/<family>/ (see that
README), and `meta.json` (config, seed, init scales, versions, commands, margins, the GGUF's rope
keys and rope tensors, the HF inverse frequencies and attention factor next to llama.cpp's
formula, sensitivity to the scaling, conditioning, llama.cpp comparisons, file sizes and sha256).

Prompts (`prompts/`, relative paths in the JSON are relative to this directory): p4.txt as is,
and the first 476 characters of p5.txt and the first 631 of p7long.txt (whole sentences /
paragraphs), all from shared/golden/prompts. Each is 103..157 tokens long: longer than the
original context (64), so transformers (long factors when seq_len > original_max_position_embeddings)
and llama.cpp (long factors when n_ctx_seq > original context; n_ctx_seq >= 256 always) both use
the long LongRoPE factors; prompt + 32 generated tokens <= 189 <= 256.

Reference: transformers in float32, attn_implementation="eager", prompt ids from the HF tokenizer
(add_special_tokens=True; neither family adds a BOS), 32 greedy tokens by recomputing the whole
sequence at every step (no KV cache), argmax over the raw logits.

Run (about a minute on 2 cores; nothing is downloaded):

    python3 -m venv /work/venv-rope
    /work/venv-rope/bin/pip install torch transformers safetensors sentencepiece tokenizers numpy diskcache
    /work/venv-rope/bin/python tests/data/rope/make.py            # everything
    /work/venv-rope/bin/python tests/data/rope/make.py --dry      # reference + margins only, writes nothing

Environment: GOLDEN_DIR (default: the first of <repo>/shared/golden, <repo>/../shared/golden)
and LLAMA_CPP_DIR (default ~/.cache/flint-peer/llama_cpp_python-0.3.36/vendor/llama.cpp, the
vendored llama.cpp with convert_hf_to_gguf.py, gguf-py and build/bin/libllama.so; the vendored
llama-cpp-python's ctypes bindings two levels up are used for the llama.cpp comparison).

Made with Python 3.11.7, torch 2.15.0, transformers 5.25.0, tokenizers 0.23.3, sentencepiece
0.2.3, safetensors 0.8.0, numpy 2.4.6, gguf-py 0.19.0 (vendored), llama.cpp 0c1e570 (all recorded
in meta.json). The converter's BPE pre-tokenizer check is monkeypatched for the byte-level BPE
tokenizer (TextModel.get_vocab_base_pre -> "qwen2"), exactly as for shared/golden/families.
"""

import argparse
import hashlib
import json
import math
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

OUT = Path(__file__).resolve().parent
REPO = OUT.parents[2]
N_GEN = 32
N_CTX = 256
NEAR_TIE = 1e-2


def golden_dir() -> Path:
    if os.environ.get("GOLDEN_DIR"):
        return Path(os.environ["GOLDEN_DIR"])
    for cand in (REPO / "shared" / "golden", REPO.parent / "shared" / "golden"):
        if cand.is_dir():
            return cand
    sys.exit("golden dir not found; set GOLDEN_DIR")


def llama_cpp_dir() -> Path:
    return Path(
        os.environ.get(
            "LLAMA_CPP_DIR",
            os.path.expanduser("~/.cache/flint-peer/llama_cpp_python-0.3.36/vendor/llama.cpp"),
        )
    )


# ---------------------------------------------------------------------------------------------
# converter entry: `make.py _convert [--bpe-pre=NAME] <convert_hf_to_gguf.py args>`, run with
# cwd = LLAMA_CPP_DIR and PYTHONPATH = LLAMA_CPP_DIR/gguf-py.

def _convert(argv):
    bpe_pre = None
    if argv and argv[0].startswith("--bpe-pre="):
        bpe_pre = argv[0].split("=", 1)[1]
        argv = argv[1:]
    sys.path.insert(0, str(Path.cwd()))
    import convert_hf_to_gguf as conv
    from conversion.base import TextModel

    if bpe_pre is not None:
        TextModel.get_vocab_base_pre = lambda self, tokenizer: bpe_pre
    sys.argv = ["convert_hf_to_gguf.py"] + argv
    conv.main()


if __name__ == "__main__" and len(sys.argv) > 1 and sys.argv[1] == "_convert":
    _convert(sys.argv[2:])
    sys.exit(0)

# ---------------------------------------------------------------------------------------------

import numpy as np  # noqa: E402
import torch  # noqa: E402

torch.set_num_threads(1)

PROMPTS = [
    # (file under prompts/, source file in golden/prompts, number of leading characters or None)
    ("p4.txt", "p4.txt", None),
    ("p5_first476.txt", "p5.txt", 476),
    ("p7long_first631.txt", "p7long.txt", 631),
]

# long factors: 1 .. 8, increasing (convex); short factors: 1 .. 1.5, increasing.
LONG_FACTOR = [round(1.0 + 7.0 * (i / 15) ** 1.5, 4) for i in range(16)]
SHORT_FACTOR = [round(1.0 + 0.5 * i / 15, 4) for i in range(16)]

MODELS = {
    "yarn": {
        "architecture": "Qwen3ForCausalLM",
        "gguf_architecture": "qwen3",
        "golden_family": "qwen3",
        "bpe_pre": "qwen2",
        "seed": 20261313,
        "init": {"emb": 1.5, "lin": 3.0, "qk": 1.0, "head": 1.0, "norm": 0.2},
        "config": {
            "architectures": ["Qwen3ForCausalLM"],
            "attention_bias": False,
            "attention_dropout": 0.0,
            "bos_token_id": 2048,
            "eos_token_id": 2048,
            "pad_token_id": 2048,
            "head_dim": 32,
            "hidden_act": "silu",
            "hidden_size": 64,
            "initializer_range": 0.02,
            "intermediate_size": 192,
            "max_position_embeddings": 256,
            "max_window_layers": 28,
            "model_type": "qwen3",
            "num_attention_heads": 4,
            "num_hidden_layers": 3,
            "num_key_value_heads": 2,
            "rms_norm_eps": 1e-06,
            "rope_parameters": {
                "rope_type": "yarn",
                "rope_theta": 10000.0,
                "factor": 4.0,
                "original_max_position_embeddings": 64,
            },
            "sliding_window": None,
            "tie_word_embeddings": True,
            "use_cache": True,
            "use_sliding_window": False,
            "vocab_size": 2051,
        },
        "variants": {
            "no_scaling": {"rope_type": "default", "rope_theta": 10000.0},
            "yarn_attention_factor_1": {
                "rope_type": "yarn",
                "rope_theta": 10000.0,
                "factor": 4.0,
                "original_max_position_embeddings": 64,
                "attention_factor": 1.0,
            },
        },
        "notes": [
            "YaRN (rope_type yarn, factor 4, original context 64, beta_fast 32 / beta_slow 1 by default on both sides, truncate true): "
            "per-pair frequency = base^(-2i/d) * ((1 - m_i)/factor + m_i), m_i = 1 - clamp((i - low)/(high - low), 0, 1), "
            "low = max(0, floor(corr(32))), high = min(d-1, ceil(corr(1))), corr(r) = d*ln(n_orig/(2*pi*r))/(2*ln(base)); "
            "cos and sin (of q and k) multiplied by attention_factor = 1 + 0.1*ln(factor)",
            "rope_theta 10000 (the golden qwen3 family has 1e6): with base 1e4 more pairs rotate appreciably within 256 positions, so the interpolated pairs matter",
            "QK-norm before RoPE; head_dim 32 != hidden/heads 16; NEOX RoPE; tied output; no BOS",
            "the GGUF has no yarn_beta_fast/slow, yarn_ext_factor or yarn_attn_factor keys (the HF config has none); llama.cpp's defaults are 32 / 1 / 1.0 (ext_factor set to 1 for YaRN)",
        ],
    },
    "longrope": {
        "architecture": "Phi3ForCausalLM",
        "gguf_architecture": "phi3",
        "golden_family": "phi3",
        "bpe_pre": None,
        "seed": 20261306,
        "init": {"emb": 1.0, "lin": 3.0, "qk": 1.0, "head": 10.0, "norm": 0.2},
        "config": {
            "architectures": ["Phi3ForCausalLM"],
            "attention_dropout": 0.0,
            "bos_token_id": 1,
            "eos_token_id": 2000,
            "pad_token_id": 2000,
            "embd_pdrop": 0.0,
            "hidden_act": "silu",
            "hidden_size": 128,
            "initializer_range": 0.02,
            "intermediate_size": 256,
            "max_position_embeddings": 256,
            "original_max_position_embeddings": 64,
            "model_type": "phi3",
            "num_attention_heads": 4,
            "num_hidden_layers": 3,
            "num_key_value_heads": 2,
            "resid_pdrop": 0.0,
            "rms_norm_eps": 1e-05,
            "rope_parameters": {
                "rope_type": "longrope",
                "rope_theta": 10000.0,
                "partial_rotary_factor": 1.0,
                "long_factor": LONG_FACTOR,
                "short_factor": SHORT_FACTOR,
            },
            "sliding_window": None,
            "tie_word_embeddings": False,
            "use_cache": True,
            "vocab_size": 2004,
        },
        "variants": {
            "no_scaling": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 1.0},
            "short_factors_instead_of_long": {
                "rope_type": "longrope",
                "rope_theta": 10000.0,
                "partial_rotary_factor": 1.0,
                "long_factor": SHORT_FACTOR,
                "short_factor": SHORT_FACTOR,
            },
            "longrope_attention_factor_1": {
                "rope_type": "longrope",
                "rope_theta": 10000.0,
                "partial_rotary_factor": 1.0,
                "long_factor": LONG_FACTOR,
                "short_factor": SHORT_FACTOR,
                "attention_factor": 1.0,
            },
        },
        "notes": [
            "LongRoPE: per-pair frequency = base^(-2i/d) / f_i with f = long_factor when the sequence is longer than the original context (64), else short_factor; "
            "cos and sin (of q and k) multiplied by attention_factor = sqrt(1 + ln(s)/ln(64)), s = max_position_embeddings/original = 4 -> 1.1547 (GGUF phi3.rope.scaling.attn_factor)",
            "GGUF: rope_factors_long.weight / rope_factors_short.weight (F32, 16 values, stored once, used by every layer); phi3 GGUFs carry no rope.scaling.type key",
            "fused attn_qkv [q; k; v] = 128 + 64 + 64 rows, fused ffn_up [gate; up] = 2 x 256 rows, NEOX RoPE over all 32 dims, separate output.weight, no BOS",
        ],
    },
}


# ---------------------------------------------------------------------------------------------
# helpers

def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def nmse(a, b) -> float:
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    return float(((a - b) ** 2).sum() / ((b - b.mean()) ** 2).sum())


def write_json(path: Path, obj):
    path.write_text(json.dumps(obj, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")


def prompt_texts(golden: Path):
    out = []
    for name, src, n in PROMPTS:
        text = (golden / "prompts" / src).read_text(encoding="utf-8")
        if n is not None:
            text = text[:n]
        out.append((name, src, n, text))
    return out


def make_config(spec, rope_parameters=None):
    from transformers import AutoConfig

    cfg = json.loads(json.dumps(spec["config"]))
    if rope_parameters is not None:
        cfg["rope_parameters"] = json.loads(json.dumps(rope_parameters))
    model_type = cfg.pop("model_type")
    return AutoConfig.for_model(model_type, **cfg)


def init_weights(model, spec):
    """Normal weights with a fixed seed, Linear std = gain/sqrt(fan_in), norms 1 + N(0, s^2),
    every value rounded to f16 and back."""
    init = spec["init"]
    cfg = spec["config"]
    hd = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    nq = cfg["num_attention_heads"] * hd
    nk = cfg["num_key_value_heads"] * hd
    g = torch.Generator().manual_seed(spec["seed"])
    with torch.no_grad():
        for name, p in model.named_parameters():
            z = torch.randn(tuple(p.shape), generator=g, dtype=torch.float32)
            if name.endswith("norm.weight"):
                v = 1.0 + init["norm"] * z
            elif "embed_tokens" in name:
                v = init["emb"] * z
            else:
                fan_in = p.shape[1]
                if name == "lm_head.weight":
                    gain = torch.full((p.shape[0], 1), init["head"])
                elif name.endswith(("q_proj.weight", "k_proj.weight")):
                    gain = torch.full((p.shape[0], 1), init["qk"])
                elif name.endswith("qkv_proj.weight"):
                    gain = torch.full((p.shape[0], 1), init["lin"])
                    gain[: nq + nk] = init["qk"]
                else:
                    gain = torch.full((p.shape[0], 1), init["lin"])
                v = gain / math.sqrt(fan_in) * z
            p.copy_(v.half().float())


def greedy(model, ids, n=N_GEN):
    seq = list(ids)
    steps = []
    last = None
    for s in range(n):
        with torch.no_grad():
            logits = model(torch.tensor([seq]), use_cache=False).logits[0, -1].float()
        if s == 0:
            last = logits.clone()
        top = torch.topk(logits, 2)
        steps.append(
            {
                "id": int(top.indices[0]),
                "logit": float(top.values[0]),
                "second_id": int(top.indices[1]),
                "second_logit": float(top.values[1]),
            }
        )
        seq.append(int(top.indices[0]))
    return seq[len(ids):], steps, last


def last_logits(model, ids):
    with torch.no_grad():
        return model(torch.tensor([ids]), use_cache=False).logits[0, -1].double()


def first_divergence(a, b):
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None


def load_variant(spec, rope_parameters, state_dict):
    from transformers import AutoModelForCausalLM

    cfg = make_config(spec, rope_parameters)
    cfg._attn_implementation = "eager"
    m = AutoModelForCausalLM.from_config(cfg, attn_implementation="eager", dtype=torch.float32)
    m.load_state_dict(state_dict, strict=False)
    m.eval()
    return m


def rotary(model):
    return model.model.rotary_emb


def llama_cpp_formula(hf_cfg):
    """Per-pair rotation frequency (radians per position) and cos/sin multiplier as llama.cpp
    computes them from the GGUF (ggml-cpu ops.cpp rope_yarn / ggml_rope_cache_init,
    llama-context.cpp cparams), in float64."""
    rp = hf_cfg.rope_parameters
    d = getattr(hf_cfg, "head_dim", None) or hf_cfg.hidden_size // hf_cfg.num_attention_heads
    base = rp["rope_theta"]
    n_orig = rp["original_max_position_embeddings"]
    i = np.arange(d // 2, dtype=np.float64)
    theta = base ** (-2.0 * i / d)
    if rp["rope_type"] == "yarn":
        factor = rp["factor"]
        freq_scale = 1.0 / factor

        def corr(r):
            return d * math.log(n_orig / (r * 2 * math.pi)) / (2 * math.log(base))

        low = max(0.0, math.floor(corr(32.0)))
        high = min(d - 1.0, math.ceil(corr(1.0)))
        y = (i - low) / max(0.001, high - low)
        mix = 1.0 - np.clip(y, 0.0, 1.0)  # ext_factor = 1
        freq = theta * (freq_scale * (1 - mix) + mix)
        # cparams.yarn_attn_factor = get_mscale(factor) / (1 + 0.1 ln factor) * rope_attn_factor (1)
        # rope_yarn then multiplies by 1 + 0.1 ln(1/freq_scale)
        mscale = 1.0 + 0.1 * math.log(factor)
        return freq, mscale, {"corr_dims": [low, high], "freq_scale": freq_scale, "ext_factor": 1.0}
    if rp["rope_type"] == "longrope":
        s = hf_cfg.max_position_embeddings / n_orig
        attn = math.sqrt(1 + math.log(s) / math.log(n_orig)) if s > 1 else 1.0
        ff = np.array(rp["long_factor"], dtype=np.float32).astype(np.float64)
        return theta / ff, attn, {"freq_scale": 1.0, "ext_factor": 0.0, "rope_attn_factor": attn}
    raise ValueError(rp["rope_type"])


# ---------------------------------------------------------------------------------------------
# llama.cpp (information only)

class LlamaCpp:
    def __init__(self):
        lcd = llama_cpp_dir()
        os.environ.setdefault("LLAMA_CPP_LIB_PATH", str(lcd / "build" / "bin"))
        sys.path.insert(0, str(lcd.parent.parent))
        import llama_cpp.llama_cpp as L

        self.L = L
        self._log_cb = L.llama_log_callback(lambda level, text, user: None)
        L.llama_log_set(self._log_cb, None)
        L.llama_backend_init()

    def run(self, gguf_path: Path, texts, ref_ids, n_ctx=N_CTX):
        L = self.L
        mp = L.llama_model_default_params()
        mp.n_gpu_layers = 0
        model = L.llama_model_load_from_file(str(gguf_path).encode(), mp)
        assert model, gguf_path
        vocab = L.llama_model_get_vocab(model)
        n_vocab = L.llama_vocab_n_tokens(vocab)
        cp = L.llama_context_default_params()
        cp.n_ctx = n_ctx
        cp.n_batch = n_ctx
        cp.n_ubatch = n_ctx
        cp.n_seq_max = 1
        cp.n_threads = 1
        cp.n_threads_batch = 1
        cp.type_k = L.GGML_TYPE_F32
        cp.type_v = L.GGML_TYPE_F32
        cp.flash_attn_type = L.LLAMA_FLASH_ATTN_TYPE_DISABLED
        ctx = L.llama_init_from_model(model, cp)
        assert ctx
        n_ctx_seq = L.llama_n_ctx_seq(ctx)
        results = []
        for text, ids in zip(texts, ref_ids):
            raw = text.encode("utf-8")
            buf = (L.llama_token * (len(raw) + 16))()
            n = L.llama_tokenize(vocab, raw, len(raw), buf, len(buf), True, False)
            assert n >= 0
            lc_ids = [int(buf[k]) for k in range(n)]
            L.llama_memory_clear(L.llama_get_memory(ctx), True)
            arr = (L.llama_token * len(ids))(*ids)
            assert L.llama_decode(ctx, L.llama_batch_get_one(arr, len(ids))) == 0
            logits = np.ctypeslib.as_array(L.llama_get_logits_ith(ctx, -1), shape=(n_vocab,)).copy()
            gen = []
            cur = logits
            for _ in range(N_GEN):
                t = int(np.argmax(cur))
                gen.append(t)
                one = (L.llama_token * 1)(t)
                assert L.llama_decode(ctx, L.llama_batch_get_one(one, 1)) == 0
                cur = np.ctypeslib.as_array(L.llama_get_logits_ith(ctx, -1), shape=(n_vocab,)).copy()
            results.append({"token_ids": lc_ids, "last_logits": logits, "greedy": gen})
        L.llama_free(ctx)
        L.llama_model_free(model)
        return n_vocab, n_ctx_seq, results


def compare(ref, lc):
    """ref: dict with greedy ids, steps, last logits (np); lc: llama.cpp result."""
    a = lc["last_logits"].astype(np.float64)
    b = ref["last"].astype(np.float64)
    top10 = np.argsort(-b)[:10]
    div = first_divergence(lc["greedy"], ref["greedy"])
    prefix = N_GEN if div is None else div
    forgiven = None
    if div is not None:
        margins = [s["logit"] - s["second_logit"] for s in ref["steps"][: div + 1]]
        forgiven = bool(min(margins) < NEAR_TIE)
    return {
        "greedy_identical_prefix": prefix,
        "top10_max_abs_logit_diff": float(np.abs(a[top10] - b[top10]).max()),
        "max_abs_logit_diff": float(np.abs(a - b).max()),
        "normalized_mse_last_logits": nmse(a, b),
        "top1_same": bool(int(np.argmax(a)) == int(np.argmax(b))),
        "llama_cpp_greedy_token_ids": lc["greedy"],
        "divergence_forgiven_by_near_tie_rule": forgiven,
    }


# ---------------------------------------------------------------------------------------------

def versions(lcd: Path):
    import importlib.metadata as md

    v = {"python": platform.python_version()}
    for pkg in ("torch", "transformers", "tokenizers", "sentencepiece", "safetensors", "numpy"):
        try:
            v[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            v[pkg] = None
    gv = None
    pyproject = lcd / "gguf-py" / "pyproject.toml"
    if pyproject.exists():
        for line in pyproject.read_text().splitlines():
            if line.startswith("version"):
                gv = line.split("=", 1)[1].strip().strip('"')
                break
    v["gguf"] = f"{gv} (vendored gguf-py, $LLAMA_CPP_DIR/gguf-py)"
    try:
        v["llama_cpp_commit"] = subprocess.run(
            ["git", "-C", str(lcd), "log", "-1", "--format=%H %cI"], capture_output=True, text=True
        ).stdout.strip()
    except Exception:
        v["llama_cpp_commit"] = None
    return v


def convert(hf_dir: Path, outfile: Path, outtype: str, bpe_pre, log: Path | None):
    lcd = llama_cpp_dir()
    cmd = [sys.executable, str(Path(__file__).resolve()), "_convert"]
    if bpe_pre:
        cmd.append(f"--bpe-pre={bpe_pre}")
    cmd += [str(hf_dir), "--outtype", outtype, "--outfile", str(outfile)]
    env = {**os.environ, "PYTHONPATH": str(lcd / "gguf-py"), "OMP_NUM_THREADS": "1"}
    r = subprocess.run(cmd, cwd=lcd, env=env, capture_output=True, text=True)
    if log is not None:
        # drop the progress bar (its speeds differ between runs) so reruns are byte-identical
        text = "\n".join(l for l in (r.stdout + r.stderr).splitlines() if not l.startswith("Writing:") and l.strip())
        log.write_text(text + "\n", encoding="utf-8")
    if r.returncode != 0:
        sys.stderr.write(r.stdout + r.stderr)
        raise SystemExit(f"conversion failed: {hf_dir}")


def gguf_rope_info(path: Path):
    lcd = llama_cpp_dir()
    code = r"""
import json, sys
import numpy as np
from gguf import GGUFReader
r = GGUFReader(sys.argv[1])
keys = {}
for k, f in r.fields.items():
    if 'rope' in k or k.endswith('.context_length') or k == 'general.architecture':
        v = f.contents()
        keys[k] = v
tensors = {}
types = set()
for t in r.tensors:
    types.add(t.tensor_type.name)
    if 'rope' in t.name:
        tensors[t.name] = {"type": t.tensor_type.name, "shape": [int(x) for x in t.shape],
                           "values": [float(x) for x in np.asarray(t.data).reshape(-1)]}
print(json.dumps({"keys": keys, "tensors": tensors, "tensor_types": sorted(types),
                  "n_tensors": len(r.tensors)}))
"""
    env = {**os.environ, "PYTHONPATH": str(lcd / "gguf-py")}
    r = subprocess.run([sys.executable, "-c", code, str(path)], env=env, capture_output=True, text=True)
    if r.returncode != 0:
        sys.stderr.write(r.stderr)
        raise SystemExit("gguf read failed")
    return json.loads(r.stdout)


def build(name, spec, golden: Path, dry: bool, lcpp):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    print(f"== {name}", flush=True)
    out = OUT / name
    work = Path(tempfile.mkdtemp(prefix=f"flint-rope-{name}-"))
    hf = work / "hf"
    fam = golden / "families" / spec["golden_family"] / "hf"

    # 1. model with f16-exact random weights, saved as an HF directory (+ the golden tokenizer)
    torch.manual_seed(0)
    cfg = make_config(spec)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    init_weights(model, spec)
    n_params = sum(p.numel() for p in model.parameters())
    model.to(torch.float16).save_pretrained(hf)
    for f in ("tokenizer.json", "tokenizer_config.json", "tokenizer.model"):
        if (fam / f).exists():
            shutil.copy(fam / f, hf / f)
    del model

    # 2. reference
    tok = AutoTokenizer.from_pretrained(hf)
    model = AutoModelForCausalLM.from_pretrained(hf, dtype=torch.float32, attn_implementation="eager")
    model.eval()
    hf_cfg = model.config
    sd = model.state_dict()
    prompts = prompt_texts(golden)
    refs = []
    for idx, (pname, src, nchar, text) in enumerate(prompts, start=1):
        ids = tok(text, add_special_tokens=True)["input_ids"]
        assert 64 < len(ids) and len(ids) + N_GEN <= hf_cfg.max_position_embeddings, (name, pname, len(ids))
        gen, steps, last = greedy(model, ids)
        margins = [s["logit"] - s["second_logit"] for s in steps]
        refs.append(
            {
                "index": idx,
                "prompt": pname,
                "src": src,
                "nchar": nchar,
                "text": text,
                "ids": ids,
                "greedy": gen,
                "steps": steps,
                "last": last.numpy(),
                "margins": margins,
            }
        )
        print(
            f"  {pname}: {len(ids)} tokens, margin min {min(margins):.4f} median {float(np.median(margins)):.3f}, "
            f"distinct {len(set(gen))}/32, greedy {gen}",
            flush=True,
        )
    rot = rotary(model)
    hf_inv_freq = rot.inv_freq.detach().double().numpy()  # after the last forward: long set for longrope
    hf_attention_scaling = float(rot.attention_scaling)
    lc_freq, lc_mscale, lc_params = llama_cpp_formula(hf_cfg)

    # 3. sensitivity: the reference with the scaling (or part of it) removed
    sens = {}
    for vname, rp in spec["variants"].items():
        vm = load_variant(spec, rp, sd)
        maxd = 0.0
        first_changed = 0
        changed = 0
        divs = []
        for r in refs:
            vgen, _, vlast = greedy(vm, r["ids"])
            maxd = max(maxd, float(np.abs(vlast.numpy().astype(np.float64) - r["last"]).max()))
            d = first_divergence(vgen, r["greedy"])
            divs.append(d)
            changed += d is not None
            first_changed += d == 0
        sens[vname] = {
            "rope_parameters": rp,
            "max_abs_diff_last_logits": maxd,
            "prompts_first_token_changed": first_changed,
            "prompts_greedy_changed": changed,
            "first_divergence_step": divs,
        }
        print(f"  sensitivity {vname}: max|d| {maxd:.3f}, greedy changed {changed}/{len(refs)}, first div {divs}")
        del vm

    # 4. conditioning
    cond = {"nmse_definition": "sum (a-b)^2 / sum (b-mean b)^2 over the last-position logits (Flint's)"}
    m64 = load_variant(spec, spec["config"]["rope_parameters"], sd).double()
    cond["nmse_float64_vs_reference"] = [nmse(last_logits(m64, r["ids"]).numpy(), r["last"]) for r in refs]
    del m64
    hooks = []
    for mod in model.modules():
        if isinstance(mod, torch.nn.Linear):
            hooks.append(mod.register_forward_pre_hook(lambda m, a: (a[0].half().float(),)))
    cond["nmse_linear_inputs_rounded_to_f16"] = [nmse(last_logits(model, r["ids"]).numpy(), r["last"]) for r in refs]
    for h in hooks:
        h.remove()
    print(f"  conditioning {cond}")

    all_margins = [m for r in refs for m in r["margins"]]
    if dry:
        print(f"  margins: min {min(all_margins):.4f} median {float(np.median(all_margins)):.3f}, "
              f"< 1e-2: {sum(m < NEAR_TIE for m in all_margins)}")
        print(f"  hf inv_freq {hf_inv_freq.tolist()}\n  llama.cpp formula {lc_freq.tolist()}")
        print(f"  attention_scaling hf {hf_attention_scaling} llama.cpp {lc_mscale}")
        shutil.rmtree(work)
        return

    # 5. GGUF
    if out.exists():
        shutil.rmtree(out)
    (out / "hf").mkdir(parents=True)
    for f in ("config.json", "generation_config.json"):
        shutil.copy(hf / f, out / "hf" / f)
    convert(hf, out / "model.gguf", "f16", spec["bpe_pre"], out / "convert.log")
    ginfo = gguf_rope_info(out / "model.gguf")
    f32_gguf = work / "model-f32.gguf"
    convert(hf, f32_gguf, "f32", spec["bpe_pre"], None)

    # 6. llama.cpp (information only)
    lc_main = lc_f32 = None
    if lcpp is not None:
        texts = [r["text"] for r in refs]
        ids = [r["ids"] for r in refs]
        lc_main = lcpp.run(out / "model.gguf", texts, ids)
        lc_f32 = lcpp.run(f32_gguf, texts, ids)

    # 7. per-prompt files
    pdir = OUT / "prompts"
    pdir.mkdir(exist_ok=True)
    for r in refs:
        (pdir / r["prompt"]).write_text(r["text"], encoding="utf-8")
        (out / f"{r['index']}.last_logits.f32").write_bytes(r["last"].astype("<f4").tobytes())
        order = np.argsort(-r["last"], kind="stable")[:20]
        doc = {
            "model": name,
            "prompt_index": r["index"],
            "prompt_file": f"prompts/{r['prompt']}",
            "prompt_source": {
                "file": f"golden/prompts/{r['src']}",
                "chars": None if r["nchar"] is None else [0, r["nchar"]],
            },
            "prompt_truncated": False,
            "prompt_token_ids": r["ids"],
            "greedy_token_ids": r["greedy"],
            "greedy_steps_top2": r["steps"],
            "top_logits": [{"id": int(i), "logit": float(r["last"][i])} for i in order],
            "last_logits_file": f"{r['index']}.last_logits.f32",
            "n_vocab": int(r["last"].shape[0]),
            "reference": (
                f"Hugging Face transformers {hf_versions['transformers']} (torch {hf_versions['torch']}, float32, eager attention) "
                "built by make.py (weights f16-exact, identical to model.gguf); prompt ids are the HF tokenizer's; "
                "greedy by full recomputation at every step (no KV cache); every step's sequence is longer than the "
                "original context (64), so the scaled RoPE (long factors for longrope) is in force"
            ),
            "greedy_text": tok.decode(r["greedy"]),
            "greedy_text_16": tok.decode(r["greedy"][:16]),
            "top2_margin_min": float(min(r["margins"])),
            "top2_margin_median": float(np.median(r["margins"])),
        }
        if lc_main is not None:
            lcr = lc_main[2][r["index"] - 1]
            doc["llama_cpp_prompt_token_ids"] = lcr["token_ids"]
            doc["tokenizer_agrees_with_llama_cpp"] = lcr["token_ids"] == r["ids"]
            doc["agreement_with_llama_cpp_cpu"] = compare(r, lcr)
        write_json(out / f"{r['index']}.json", doc)

    def lc_summary(lc):
        if lc is None:
            return None
        n_vocab, n_ctx_seq, res = lc
        rows = []
        for r, lcr in zip(refs, res):
            c = compare(r, lcr)
            c.pop("llama_cpp_greedy_token_ids")
            rows.append({"prompt_index": r["index"], "tokenizer_agrees": lcr["token_ids"] == r["ids"], **c})
        return {"n_vocab": n_vocab, "n_ctx": N_CTX, "n_ctx_seq": n_ctx_seq, "prompts": rows}

    meta = {
        "family": name,
        "architecture": spec["architecture"],
        "gguf_architecture": spec["gguf_architecture"],
        "config": json.loads((out / "hf" / "config.json").read_text()),
        "dtype": "weights f16-exact (random normal, rounded to float16 and back); model.gguf stores them as F16 "
        "(1-D norm and rope-factor tensors as F32, same values); the reference computes in float32",
        "seed": spec["seed"],
        "init": spec["init"],
        "init_rule": "embeddings N(0, emb^2); Linear std = gain/sqrt(fan_in) with gain qk for q/k rows, head for lm_head, "
        "lin otherwise; RMSNorm weights 1 + N(0, norm^2); torch.Generator seeded with `seed`, parameters in "
        "named_parameters() order; then every weight rounded to float16",
        "n_params": n_params,
        "notes": spec["notes"],
        "tokenizer": f"the one of shared/golden/families/{spec['golden_family']} (tokenizer files copied from its hf/)",
        "tokenizer_pre_in_gguf": "qwen2 (get_vocab_base_pre monkeypatched)" if spec["bpe_pre"] else "default (SPM)",
        "vocab_size": spec["config"]["vocab_size"],
        "n_ctx": N_CTX,
        "n_ctx_note": "every prompt + 32 greedy tokens fits in 256 = max_position_embeddings; every prompt is longer than the original context 64",
        "prompts": [
            {
                "index": r["index"],
                "file": f"prompts/{r['prompt']}",
                "source": f"golden/prompts/{r['src']}",
                "chars": None if r["nchar"] is None else [0, r["nchar"]],
                "n_tokens": len(r["ids"]),
            }
            for r in refs
        ],
        "versions": {**hf_versions, **versions(llama_cpp_dir())},
        "commands": {
            "generate": "python tests/data/rope/make.py",
            "convert": f"python tests/data/rope/make.py _convert{' --bpe-pre=' + spec['bpe_pre'] if spec['bpe_pre'] else ''} "
            f"<hf dir> --outtype f16 --outfile tests/data/rope/{name}/model.gguf   (cwd $LLAMA_CPP_DIR, PYTHONPATH=$LLAMA_CPP_DIR/gguf-py)",
            "convert_equivalent": f"python convert_hf_to_gguf.py <hf dir> --outtype f16 --outfile model.gguf"
            + ("  [with TextModel.get_vocab_base_pre patched to return 'qwen2']" if spec["bpe_pre"] else ""),
        },
        "rope": {
            "hf_rope_type": hf_cfg.rope_parameters["rope_type"],
            "hf_rope_parameters": hf_cfg.rope_parameters,
            "hf_inv_freq_in_force": hf_inv_freq.tolist(),
            "hf_attention_scaling": hf_attention_scaling,
            "llama_cpp_formula_freq": lc_freq.tolist(),
            "llama_cpp_formula_mscale": lc_mscale,
            "llama_cpp_params": lc_params,
            "max_rel_diff_freq_hf_vs_llama_cpp_formula": float(np.max(np.abs(hf_inv_freq - lc_freq) / lc_freq)),
            "note": "hf_inv_freq_in_force: transformers' inv_freq (radians per position for each of the head_dim/2 pairs, "
            "NEOX layout: pair i rotates dims i and i + head_dim/2) after a forward over a sequence longer than 64; "
            "cos and sin are both multiplied by hf_attention_scaling. llama_cpp_formula_*: the same from llama.cpp's "
            "formulas (this script's float64 re-statement, see README.md)",
        },
        "gguf_rope_keys": ginfo["keys"],
        "gguf_rope_tensors": ginfo["tensors"],
        "gguf_tensor_types": ginfo["tensor_types"],
        "top2_margin_median": float(np.median(all_margins)),
        "top2_margin_min": float(min(all_margins)),
        "n_steps_near_tie_lt_1e-2": int(sum(m < NEAR_TIE for m in all_margins)),
        "greedy_distinct_tokens": [len(set(r["greedy"])) for r in refs],
        "llama_cpp_cpu": lc_summary(lc_main),
        "llama_cpp_cpu_f32_weights": lc_summary(lc_f32),
        "llama_cpp_settings": "vendored libllama through the vendored llama-cpp-python ctypes bindings, CPU, 1 thread, "
        "n_ctx 256 (n_seq_max 1), F32 KV cache, no flash attention; logits of the reference prompt ids, and its own "
        "32-token greedy run with its KV cache; llama_cpp_cpu_f32_weights: the same on an F32 conversion of the HF "
        "directory (not kept)",
        "sensitivity": sens,
        "conditioning": cond,
    }
    files = {}
    for p in sorted(out.rglob("*")):
        if p.is_file() and p.name != "meta.json":
            files[str(p.relative_to(out))] = {"bytes": p.stat().st_size, "sha256": sha256(p)}
    meta["files"] = files
    write_json(out / "meta.json", meta)
    shutil.rmtree(work)


hf_versions = {}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dry", action="store_true", help="reference, margins, sensitivity only; write nothing")
    ap.add_argument("--only", choices=sorted(MODELS), action="append")
    ap.add_argument("--no-llama-cpp", action="store_true", help="skip the llama.cpp comparison")
    args = ap.parse_args()

    import importlib.metadata as md

    for pkg in ("torch", "transformers"):
        hf_versions[pkg] = md.version(pkg)
    golden = golden_dir()
    lcpp = None if (args.dry or args.no_llama_cpp) else LlamaCpp()
    for name in args.only or MODELS:
        build(name, MODELS[name], golden, args.dry, lcpp)


if __name__ == "__main__":
    main()

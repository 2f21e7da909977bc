#!/usr/bin/env python3
"""Synthetic GGUF models for measuring speed where the real weights cannot travel.

A model's speed depends on its shapes and block formats, not on its weight values. This
script keeps a real GGUF's header (architecture, tokenizer, tensor names, shapes and types)
and replaces the weights with seeded random blocks whose scales keep activations finite:

  synth_gguf.py skeleton SRC OUT [--scale-to qwen2.5-7b]   header only (stdlib; small)
  synth_gguf.py fill SKELETON OUT [--seed N]                 header + random data (numpy)
  synth_gguf.py show FILE                                    tensor types and sizes

`--scale-to qwen2.5-7b` rewrites a qwen2 header to Qwen2.5-7B's shapes (28 layers, 3584 wide,
18944 feed-forward, 28 query and 4 key/value heads, untied output) in the block formats of
llama.cpp's Q4_K_M (Q4_K; Q6_K for attn_v, ffn_down and the output matrix). The output is a
benchmark model only: its text is noise.
"""
import struct
import sys
from pathlib import Path

# ggml type id -> (name, elements per block, bytes per block)
TYPES = {
    0: ("F32", 1, 4), 1: ("F16", 1, 2), 2: ("Q4_0", 32, 18), 3: ("Q4_1", 32, 20),
    6: ("Q5_0", 32, 22), 7: ("Q5_1", 32, 24), 8: ("Q8_0", 32, 34), 10: ("Q2_K", 256, 84),
    11: ("Q3_K", 256, 110), 12: ("Q4_K", 256, 144), 13: ("Q5_K", 256, 176), 14: ("Q6_K", 256, 210),
    20: ("IQ4_NL", 32, 18), 23: ("IQ4_XS", 256, 136), 30: ("BF16", 1, 2),
}
# The GGUF value reader and writer are the fuzz seeds' (fuzz/shrink_gguf.py): strings as bytes.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "fuzz"))
from shrink_gguf import STRING, Reader, put_value  # noqa: E402


def read_header(path):
    """(kvs: list of (key, type, value)), tensors: list of [name, dims, type], alignment)."""
    with open(path, "rb") as f:
        head = f.read(64 << 20)
    r = Reader(head)
    if head[:4] != b"GGUF":
        sys.exit(f"{path}: not a GGUF file")
    r.pos = 4
    version, n_tensors, n_kv = r.take("<I"), r.take("<Q"), r.take("<Q")
    assert version == 3, version
    kvs = []
    for _ in range(n_kv):
        key = r.string().decode()
        t = r.take("<I")
        kvs.append((key, t, r.value(t)))
    tensors = []
    for _ in range(n_tensors):
        name = r.string().decode()
        dims = [r.take("<Q") for _ in range(r.take("<I"))]
        t = r.take("<I")
        r.take("<Q")  # offset: recomputed on writing
        tensors.append([name, dims, t])
    align = next((v for k, _, v in kvs if k == "general.alignment"), 32)
    return kvs, tensors, align


def nbytes(dims, t):
    _, per_block, block_bytes = TYPES[t]
    n = 1
    for d in dims:
        n *= d
    assert n % per_block == 0, (dims, t)
    return n // per_block * block_bytes


def header_bytes(kvs, tensors, align):
    head = bytearray(b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(kvs)))
    for key, t, v in kvs:
        put_value(head, STRING, key.encode())
        head += struct.pack("<I", t)
        put_value(head, t, v)
    offset = 0
    for name, dims, t in tensors:
        put_value(head, STRING, name.encode())
        head += struct.pack(f"<I{len(dims)}QIQ", len(dims), *dims, t, offset)
        offset += -(-nbytes(dims, t) // align) * align
    return bytes(head + b"\0" * (-len(head) % align))


QWEN25_7B = {"embedding_length": 3584, "block_count": 28, "feed_forward_length": 18944,
             "attention.head_count": 28, "attention.head_count_kv": 4}


def scale_to_qwen25_7b(kvs, tensors):
    arch = next(v for k, _, v in kvs if k == "general.architecture").decode()
    assert arch == "qwen2", f"--scale-to qwen2.5-7b needs a qwen2 model, not {arch}"
    kvs = [(k, t, QWEN25_7B.get(k[len("qwen2."):], v) if k.startswith("qwen2.") else v) for k, t, v in kvs]
    vocab = next(d[1] for n, d, _ in tensors if n == "token_embd.weight")
    e, f, kv = 3584, 18944, 4 * 128
    shapes = {"attn_norm.weight": [e], "attn_q.weight": [e, e], "attn_q.bias": [e],
              "attn_k.weight": [e, kv], "attn_k.bias": [kv], "attn_v.weight": [e, kv], "attn_v.bias": [kv],
              "attn_output.weight": [e, e], "ffn_norm.weight": [e], "ffn_gate.weight": [e, f],
              "ffn_up.weight": [e, f], "ffn_down.weight": [f, e]}
    q4k, q6k = 12, 14
    kind = lambda n: 0 if len(shapes[n]) == 1 else q6k if n in ("attn_v.weight", "ffn_down.weight") else q4k
    out = [["token_embd.weight", [e, vocab], q4k], ["output_norm.weight", [e], 0], ["output.weight", [e, vocab], q6k]]
    for i in range(28):
        out += [[f"blk.{i}.{n}", dims, kind(n)] for n, dims in shapes.items()]
    return kvs, out


def fill(skeleton, out_path, seed):
    import numpy as np
    kvs, tensors, align = read_header(skeleton)
    rng = np.random.default_rng(seed)
    half = lambda x: np.frombuffer(np.float16(x).tobytes(), np.uint8)
    with open(out_path, "wb") as f:
        f.write(header_bytes(kvs, tensors, align))
        for name, dims, t in tensors:
            n = nbytes(dims, t)
            if t == 0:  # norms 1, biases 0: the residual stream stays well scaled
                data = np.full(n // 4, 0.0 if name.endswith(".bias") else 1.0, np.float32).view(np.uint8)
            elif t in (1, 30):
                vals = rng.standard_normal(n // 2, dtype=np.float32) * 0.02
                data = (vals.astype(np.float16).view(np.uint8) if t == 1
                        else (vals.view(np.uint32) >> 16).astype(np.uint16).view(np.uint8))
            else:
                tname, _, bb = TYPES[t]
                data = rng.integers(0, 256, n, dtype=np.uint8).reshape(-1, bb)
                # Each block's f16 scale(s) at the block formats' scale offsets, small enough
                # that a row's dot product stays near unit size.
                if tname in ("Q4_0", "Q5_0", "Q8_0"):
                    data[:, 0:2] = half(0.02 / (127 if tname == "Q8_0" else 8))
                elif tname in ("Q4_1", "Q5_1"):
                    data[:, 0:2] = half(0.02 / 8)
                    data[:, 2:4] = half(-0.01)
                elif tname in ("Q4_K", "Q5_K"):
                    data[:, 0:2] = half(0.02 / (15 * 63))
                    data[:, 2:4] = half(0.01 / 63)
                elif tname == "Q6_K":
                    data[:, 208:210] = half(0.02 / (32 * 127))
                elif tname == "Q2_K":
                    data[:, 80:82] = half(0.02 / (15 * 3))
                    data[:, 82:84] = half(0.01 / 15)
                elif tname == "Q3_K":
                    data[:, 108:110] = half(0.02 / (32 * 4))
                elif tname == "IQ4_NL":
                    data[:, 0:2] = half(0.02 / 127)
                elif tname == "IQ4_XS":
                    data[:, 0:2] = half(0.02 / (32 * 127))
                data = data.reshape(-1)
            f.write(data.tobytes())
            f.write(b"\0" * (-n % align))


def show(path):
    kvs, tensors, _ = read_header(path)
    total = {}
    for name, dims, t in tensors:
        total[TYPES[t][0]] = total.get(TYPES[t][0], 0) + nbytes(dims, t)
    arch = next(v for k, _, v in kvs if k == "general.architecture").decode()
    print(arch, {k: v for k, _, v in kvs if k.startswith(arch + ".")})
    for k, v in sorted(total.items()):
        print(f"  {k:5} {v / 2**20:9.1f} MiB")
    print(f"  all   {sum(total.values()) / 2**20:9.1f} MiB in {len(tensors)} tensors")


def main(argv):
    if len(argv) >= 3 and argv[0] == "skeleton":
        kvs, tensors, align = read_header(argv[1])
        if "--scale-to" in argv:
            assert argv[argv.index("--scale-to") + 1] == "qwen2.5-7b"
            kvs, tensors = scale_to_qwen25_7b(kvs, tensors)
        with open(argv[2], "wb") as f:
            f.write(header_bytes(kvs, tensors, align))
    elif len(argv) >= 3 and argv[0] == "fill":
        seed = int(argv[argv.index("--seed") + 1]) if "--seed" in argv else 0
        fill(argv[1], argv[2], seed)
    elif len(argv) == 2 and argv[0] == "show":
        show(argv[1])
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main(sys.argv[1:])

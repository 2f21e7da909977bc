#!/usr/bin/env python3
"""Writes the dequantization goldens of the formats /work/shared/golden/dequant lacks
(Q2_K, Q3_K, IQ4_NL, IQ4_XS) beside this script, in the same JSON shape: random but valid
blocks (random bytes, f16 scale fields set to small finite values), dequantized by
gguf-py. Run once; the output is committed and read by crates/flint-core/tests/quant_golden.rs.

    python3 tests/data/dequant/make.py   # needs numpy and gguf (0.19.0)
"""

import importlib.metadata
import json
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf.constants import GGML_QUANT_SIZES
from gguf.quants import dequantize

SEED = 20240938
OUT = Path(__file__).resolve().parent

# Byte offsets of each block's f16 scale fields (ggml-common.h).
SCALE_FIELDS = {
    T.Q2_K: (80, 82),  # scales[16], qs[64], d, dmin
    T.Q3_K: (108,),  # hmask[32], qs[64], scales[12], d
    T.IQ4_NL: (0,),  # d, qs[16]
    T.IQ4_XS: (0,),  # d, scales_h u16, scales_l[4], qs[128]
}


def blocks(rng, ty, n_blocks, extremes):
    """n_blocks random blocks of ty; with extremes, every payload byte is 0x00 or 0xff."""
    _, block_bytes = GGML_QUANT_SIZES[ty]
    if extremes:
        raw = rng.choice(np.array([0x00, 0xFF], dtype=np.uint8), size=(n_blocks, block_bytes))
    else:
        raw = rng.integers(0, 256, size=(n_blocks, block_bytes), dtype=np.uint8)
    for off in SCALE_FIELDS[ty]:
        scale = rng.uniform(-0.02, 0.02, size=n_blocks).astype(np.float16)
        raw[:, off : off + 2] = scale.view(np.uint8).reshape(n_blocks, 2)
    return raw


def case(ty, source, raw):
    values = dequantize(raw.reshape(-1), ty).astype(np.float32).reshape(-1)
    assert np.all(np.isfinite(values)), f"{ty.name}: non-finite values"
    return {
        "source": source,
        "n_bytes": int(raw.size),
        "n_values": int(values.size),
        "bytes_hex": raw.tobytes().hex(),
        "values_f32_bits": [int(v) for v in values.view(np.uint32)],
    }


def main():
    version = importlib.metadata.version("gguf")
    rng = np.random.default_rng(SEED)
    for ty in SCALE_FIELDS:
        block_elems, block_bytes = GGML_QUANT_SIZES[ty]
        # 256 values of random blocks, then 256 of extremes.
        n_blocks = 256 // block_elems
        doc = {
            "type": ty.name,
            "ggml_type_id": int(ty),
            "block_elems": block_elems,
            "block_bytes": block_bytes,
            "reference": f"gguf (Python package) {version}, gguf.quants.dequantize; bytes_hex are raw GGUF blocks, "
            "values_f32_bits the f32 bit patterns of the dequantized values, in order",
            "cases": [
                case(ty, "synthetic: random bytes with sane f16 scales", blocks(rng, ty, n_blocks, False)),
                case(ty, "synthetic: payload bytes 0x00 or 0xff with sane f16 scales", blocks(rng, ty, n_blocks, True)),
            ],
        }
        path = OUT / f"{ty.name}.json"
        path.write_text(json.dumps(doc) + "\n")
        print(f"{path.name}: {path.stat().st_size} bytes")


if __name__ == "__main__":
    main()

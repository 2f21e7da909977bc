#!/usr/bin/env python3
"""llama.cpp's greedy ids with a q8_0 KV cache on the golden prompts: the oracle for where a
q8_0 cache may leave the f32 reference (crates/flint/tests/kv_types.rs).

Eight bits per key flip some greedy choices whose margin is far above the near-tie bound
(qwen prompt 7, step 13: margin 0.35); llama.cpp's own q8_0 cache flips the same ones. This
records, per test model and golden prompt, the 16 greedy ids of llama-server (CPU, flash
attention on, -ctk q8_0 -ctv q8_0, which rotates keys and values as Flint does) for the prompt
ids of ../shared/golden/f32/<model>/<n>.json.

Run once (not at test time), with the peer built by ../shared/tools/build-llama-cpp.sh:
    python3 tests/data/kv/make.py --bin <llama.cpp build>/bin
Writes tests/data/kv/llama_q8_0.json.
"""
import argparse
import json
import os
import pathlib
import subprocess
import time
import urllib.request

HERE = pathlib.Path(__file__).resolve().parent
SHARED = HERE.parents[2].parent / "shared"
MODELS = {"qwen": "qwen2.5-coder-0.5b", "gemma": "gemma-3-270m"}
PORT = 8137


def post(body):
    req = urllib.request.Request(f"http://127.0.0.1:{PORT}/completion", json.dumps(body).encode(), {"Content-Type": "application/json"})
    return json.load(urllib.request.urlopen(req))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True, help="llama.cpp's build/bin (llama-server)")
    ap.add_argument("--models", default=os.path.expanduser("~/.cache/flint/models"))
    args = ap.parse_args()
    out = {"llama_cpp": "llama-server -c 2048 -fa on -ngl 0 -ctk q8_0 -ctv q8_0, greedy, 16 tokens", "models": {}}
    for golden, name in MODELS.items():
        env = dict(os.environ, LD_LIBRARY_PATH=args.bin)
        cmd = [f"{args.bin}/llama-server", "-m", f"{args.models}/{name}.gguf", "-c", "2048", "--port", str(PORT),
               "-fa", "on", "-ngl", "0", "-ctk", "q8_0", "-ctv", "q8_0"]
        server = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            for _ in range(120):
                try:
                    urllib.request.urlopen(f"http://127.0.0.1:{PORT}/health")
                    break
                except Exception:
                    time.sleep(0.5)
            ids = {}
            for i in range(1, 8):
                ref = json.load(open(SHARED / f"golden/f32/{golden}/{i}.json"))
                body = {"prompt": ref["prompt_token_ids"], "n_predict": 16, "temperature": 0, "cache_prompt": False,
                        "return_tokens": True, "ignore_eos": True}
                ids[str(i)] = post(body)["tokens"]
            out["models"][golden] = ids
        finally:
            server.terminate()
            server.wait()
    (HERE / "llama_q8_0.json").write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()

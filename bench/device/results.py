#!/usr/bin/env python3
"""The device run's records and its results.json (bench/device/run.sh).

  results.py tag TAG CMD < json-lines        one {"tag", "cmd", "report"} line per input line
  results.py batched TAG CMD < table         llama-batched-bench's table as tagged lines
  results.py assemble OUT_DIR COMMIT          writes OUT_DIR/results.json, prints its table
  results.py sweep OUT_DIR                    bench/device/tune.sh's table from OUT_DIR/tune.jsonl

Rows (issue 35): pp512 and tg128 of each model, c32 of qwen2.5-coder-0.5b (llama-batched-bench
S_TG against `flint bench --concurrency 32`'s steady decode), pp4096 and tg128@d8192 of
qwen2.5-coder-0.5b; the exact mode's and the no-subgroup rows carry `mode`. Flint's tg128 is
tag MODEL-tg (or MODE-tg): decode from a one-token prompt, as llama-bench's tg128 decodes from
an empty context. The pp512 and tg128
rows also carry llama.cpp with matrix cores (`matrix_peer_tok_s`, reported, not gated) where
the run measured it (tags MODEL-matrix).
"""
import json
import sys

MODELS = ["gemma-3-270m", "qwen2.5-coder-0.5b", "qwen2.5-7b-q4km"]


def tag(name, cmd):
    for line in sys.stdin:
        line = line.strip()
        if line.startswith("{"):
            print(json.dumps({"tag": name, "cmd": cmd, "report": json.loads(line)}))


def batched(name, cmd):
    """Markdown rows `| PP | TG | B | N_KV | T_PP s | S_PP t/s | T_TG s | S_TG t/s | ...`."""
    header = None
    for line in sys.stdin:
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if "S_TG t/s" in cells:
            header = cells
            continue
        if header and len(cells) == len(header) and cells[0].isdigit():
            row = dict(zip(header, cells))
            report = {"pp": int(row["PP"]), "tg": int(row["TG"]), "b": int(row["B"]), "s_tg": float(row["S_TG t/s"])}
            print(json.dumps({"tag": name, "cmd": cmd, "report": report}))


def records(path):
    try:
        with open(path) as f:
            return [json.loads(line) for line in f if line.strip()]
    except FileNotFoundError:
        return []


def assemble(out, commit):
    flint, peer = records(f"{out}/flint.jsonl"), records(f"{out}/llama.jsonl")

    def find(recs, name):
        return [r for r in recs if r["tag"] == name]

    def flint_value(name, pick):
        for r in find(flint, name):
            try:
                return round(pick(r["report"]), 2), r["cmd"]
            except (KeyError, IndexError, TypeError, StopIteration):
                pass
        return None, None

    def llama_value(name, n_prompt, n_gen):
        for r in find(peer, name):
            rep = r["report"]
            if rep.get("n_prompt") == n_prompt and rep.get("n_gen") == n_gen:
                return round(rep["avg_ts"], 2), r["cmd"]
        return None, None

    def steady(level):
        return lambda rep: next(c for c in rep["concurrency"] if c["concurrency"] == level)["steady_decode_tok_s"]["median"]

    prefill = lambda rep: rep["prefill_tok_s"]["median"]  # noqa: E731
    decode = lambda rep: rep["decode_tok_s"]["median"]  # noqa: E731
    rows = []

    def row(model, test, f, p, mode="default", matrix=(None, None)):
        (ft, fc), (pt, pc), (mt, mc) = f, p, matrix
        r = {"model": model, "test": test, "flint_tok_s": ft, "peer_tok_s": pt, "flint_cmd": fc, "peer_cmd": pc}
        if mode != "default":
            r["mode"] = mode
        if mt is not None:
            r["matrix_peer_tok_s"], r["matrix_peer_cmd"] = mt, mc
        rows.append(r)

    for m in MODELS:
        row(m, "pp512", flint_value(m, prefill), llama_value(m, 512, 0), matrix=llama_value(f"{m}-matrix", 512, 0))
        row(m, "tg128", flint_value(f"{m}-tg", decode), llama_value(m, 0, 128), matrix=llama_value(f"{m}-matrix", 0, 128))
    q = "qwen2.5-coder-0.5b"
    for level in (8, 32):
        s_tg = None, None
        for r in find(peer, "batched"):
            if r["report"]["b"] == level:
                s_tg = round(r["report"]["s_tg"], 2), r["cmd"]
        row(q, f"c{level}", flint_value("concurrency", steady(level)), s_tg)
    row(q, "pp4096", flint_value("pp4096", prefill), llama_value("pp4096", 4096, 0))
    row(q, "tg128@d8192", flint_value("d8192", decode), llama_value("d8192", 0, 128))
    for mode in ("exact", "no-subgroups"):
        row(q, "pp512", flint_value(mode, prefill), llama_value(q, 512, 0), mode)
        row(q, "tg128", flint_value(f"{mode}-tg", decode), llama_value(q, 0, 128), mode)
    devices = open(f"{out}/devices.txt").read() if _exists(f"{out}/devices.txt") else ""
    adapter = next((r["report"].get("adapter") for r in flint if r["report"].get("adapter")), None)
    driver = next((line.split(",")[1].strip() for line in devices.splitlines() if line.count(",") >= 4 and "driver" not in line), None)
    result = {
        "date": _today(),
        "commit": commit,
        "device": adapter,
        "driver": driver,
        "peer": "llama.cpp 0c1e570 Vulkan (../shared/tools/build-llama-cpp.sh, portable build)",
        "rows": rows,
    }
    # What each llama.cpp build found on the device (run.sh's "llama: ggml_vulkan: 0 = ..." lines).
    for line in devices.splitlines():
        build, _, found = line.partition(": ggml_vulkan: 0 = ")
        if found and build in ("llama", "llama-matrix"):
            result["peer_device" if build == "llama" else "matrix_peer_device"] = found.strip()
    if any("matrix_peer_tok_s" in r for r in rows):
        result["matrix_peer"] = "the same llama.cpp, its Vulkan shaders compiled by a glslc built from Debian 13's sources (bench/device/glslc.sh)"
    with open(f"{out}/results.json", "w") as f:
        json.dump(result, f, indent=1)
        f.write("\n")
    def ratio(a, b):
        return f"{a / b:.2f}x" if a and b else "-"

    print("| model | test | mode | Flint tok/s | llama.cpp tok/s | ratio | llama.cpp matrix cores | ratio |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        ft, pt, mt = r["flint_tok_s"], r["peer_tok_s"], r.get("matrix_peer_tok_s")
        print(f"| {r['model']} | {r['test']} | {r.get('mode', 'default')} | {ft} | {pt} | {ratio(ft, pt)} | {mt or '-'} | {ratio(ft, mt)} |")
    # Where Flint's overlapped decode steps spent their time (flint bench's "overlap"):
    # waiting near zero means the host bounds decode.
    print()
    print("| flint run | decode ms/token | submit ms | wait ms | other host ms |")
    print("|---|---|---|---|---|")
    for r in flint:
        o, tok_s = r["report"].get("overlap"), r["report"].get("decode_tok_s", {}).get("median")
        if o and tok_s:
            print(f"| {r['tag']} | {1e3 / tok_s:.3f} | {o['submit_ms_per_step']} | {o['wait_ms_per_step']} | {o['other_host_ms_per_step']} |")


def _exists(path):
    try:
        open(path).close()
        return True
    except OSError:
        return False


def sweep(out):
    """One row per setting, one column per model and test (ppN / tgN, @dN at a depth): the
    median tok/s and its ratio to the first setting's (the defaults)."""
    table, columns = {}, []
    for r in records(f"{out}/tune.jsonl"):
        rep = r["report"]
        model = rep.get("model", "?").rsplit("/", 1)[-1].removesuffix(".gguf")
        at = f"@d{rep['depth']}" if rep.get("depth") else ""
        cells = [(f"pp{rep['prompt_tokens']}{at}", rep["prefill_tok_s"]["median"])]
        if rep.get("gen_tokens", 0) > 1:
            cells.append((f"tg{rep['gen_tokens']}{at}", rep["decode_tok_s"]["median"]))
        for test, value in cells:
            col = f"{model} {test}"
            if col not in columns:
                columns.append(col)
            table.setdefault(r["tag"], {})[col] = value
    if not table:
        print("no records")
        return
    base = next(iter(table.values()))
    print("| setting | " + " | ".join(columns) + " |")
    print("|---" * (len(columns) + 1) + "|")
    for name, row in table.items():
        cells = []
        for col in columns:
            v, b = row.get(col), base.get(col)
            cells.append("" if v is None else f"{v:.1f}" + (f" ({v / b:.2f}x)" if b and name != next(iter(table)) else ""))
        print(f"| {name} | " + " | ".join(cells) + " |")


def _today():
    import datetime

    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")


if __name__ == "__main__":
    cmd, args = sys.argv[1], sys.argv[2:]
    {"tag": tag, "batched": batched, "assemble": assemble, "sweep": sweep}[cmd](*args)

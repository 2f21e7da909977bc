#!/usr/bin/env python3
"""BFCL report: every item of ../shared/golden/tools/bfcl.jsonl sent with tool_choice "required"
to an OpenAI-compatible server (flint serve, or llama-server --jinja), PARALLEL at a time.

For each reply: whether every call is valid (a listed function, arguments valid for its
parameters: the `jsonschema` package) and whether the calls match BFCL's answer (its
ground_truth: each call names an expected function and gives each argument one of its allowed
values, "" marking an argument that may be left out; strings compared as BFCL's checker does,
lower-cased without spaces and punctuation; numbers by value; parallel items as a set). The
irrelevance items' answer is no call, which `required` rules out: they count for validity only.

    python3 bench/bfcl.py --url http://127.0.0.1:8080 --parallel 8 --name flint > flint.json

Prints one JSON object: per category and in all, items, replies with calls, valid, matched,
and the seconds the run took.
"""

import argparse
import concurrent.futures
import json
import os
import re
import sys
import time
import urllib.request

import jsonschema

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_ITEMS = os.path.join(HERE, "..", "..", "shared", "golden", "tools", "bfcl.jsonl")


def ask(url, item, max_tokens, model):
    body = {
        "model": model,
        "messages": item["messages"],
        "tools": item["tools"],
        "tool_choice": "required",
        "temperature": 0,
        "seed": 1,
        "max_tokens": max_tokens,
    }
    req = urllib.request.Request(url + "/v1/chat/completions", json.dumps(body).encode(), {"content-type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=3600) as r:
            return json.loads(r.read())
    except urllib.error.HTTPError as e:
        return {"error": e.read().decode(errors="replace")}


def norm(s):
    return re.sub(r"[ ,./\-_*^]", "", s.lower())


def same(value, allowed):
    if isinstance(allowed, str) and isinstance(value, str):
        return norm(value) == norm(allowed)
    if isinstance(allowed, bool) or isinstance(value, bool):
        return value is allowed
    if isinstance(allowed, (int, float)) and isinstance(value, (int, float)):
        return float(value) == float(allowed)
    if isinstance(allowed, list) and isinstance(value, list):
        return len(value) == len(allowed) and all(same(v, a) for v, a in zip(value, allowed))
    if isinstance(allowed, dict) and isinstance(value, dict):
        return set(value) == set(allowed) and all(same(value[k], allowed[k]) for k in allowed)
    return value == allowed


def call_matches(name, args, answer):
    """One call against one ground-truth entry {function: {arg: [allowed values]}}."""
    (fname, params), = answer.items()
    if name != fname or not isinstance(args, dict):
        return False
    if any(k not in params for k in args):
        return False
    for k, allowed in params.items():
        if k not in args:
            if "" not in allowed:
                return False
        elif not any(same(args[k], a) for a in allowed if a != ""):
            return False
    return True


def calls_match(calls, truth):
    """Calls against the answers, each answer used once (parallel items in any order)."""
    if len(calls) != len(truth):
        return False
    left = list(truth)
    for name, args in calls:
        hit = next((i for i, t in enumerate(left) if call_matches(name, args, t)), None)
        if hit is None:
            return False
        left.pop(hit)
    return True


def judge(item, reply):
    out = {"id": item["id"], "category": item["category"], "calls": 0, "valid": False, "matched": False}
    msg = (reply.get("choices") or [{}])[0].get("message") or {}
    calls = msg.get("tool_calls") or []
    out["finish_reason"] = (reply.get("choices") or [{}])[0].get("finish_reason")
    out["calls"] = len(calls)
    if "error" in reply:
        out["error"] = reply["error"][:300]
        return out
    tools = {t["function"]["name"]: t["function"].get("parameters") or {"type": "object"} for t in item["tools"]}
    parsed = []
    valid = bool(calls)
    for c in calls:
        f = c.get("function", {})
        try:
            args = json.loads(f.get("arguments", ""))
        except ValueError:
            valid = False
            continue
        schema = tools.get(f.get("name"))
        if schema is None or not jsonschema.Draft202012Validator(schema).is_valid(args):
            valid = False
        parsed.append((f.get("name"), args))
    out["valid"] = valid
    if item["ground_truth"] is not None:
        out["matched"] = valid and calls_match(parsed, item["ground_truth"])
    if not valid:
        out["reply"] = msg
    return out


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--url", required=True)
    p.add_argument("--parallel", type=int, default=8)
    p.add_argument("--max-tokens", type=int, default=512)
    p.add_argument("--items", default=DEFAULT_ITEMS)
    p.add_argument("--model", default="model")
    p.add_argument("--name", default="")
    a = p.parse_args()
    items = [json.loads(l) for l in open(a.items) if l.strip()]
    t0 = time.time()
    with concurrent.futures.ThreadPoolExecutor(a.parallel) as pool:
        replies = list(pool.map(lambda i: ask(a.url, i, a.max_tokens, a.model), items))
    seconds = time.time() - t0
    results = [judge(i, r) for i, r in zip(items, replies)]
    by = {}
    for r in results:
        for key in (r["category"], "all"):
            s = by.setdefault(key, {"items": 0, "with_calls": 0, "valid": 0, "matched": 0, "scored": 0})
            s["items"] += 1
            s["with_calls"] += r["calls"] > 0
            s["valid"] += r["valid"]
            s["matched"] += r["matched"]
            s["scored"] += r["category"] != "irrelevance"
    report = {"name": a.name, "seconds": round(seconds, 1), "parallel": a.parallel, "summary": by,
              "invalid": [r for r in results if not r["valid"]], "results": results}
    json.dump(report, sys.stdout, indent=1)
    print()
    s = by["all"]
    print(f"{a.name}: {s['valid']}/{s['items']} valid, {s['matched']}/{s['scored']} match BFCL's answer, {seconds:.0f} s", file=sys.stderr)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Writes a small GGUF seed from a real GGUF file: its metadata only (no tensors), with the
vocabulary cut to the first N tokens plus the special tokens (ids remapped) and the merges
among them. Seeds of a few KB instead of a few MB keep libFuzzer at thousands of executions
a second on the metadata and tokenizer paths; the family models go into the corpus whole as
well, for the tensor-info reader and the configs.

usage: shrink_gguf.py IN.gguf OUT.gguf [N]"""
import struct
import sys

SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
STRING, ARRAY = 8, 9


class Reader:
    def __init__(self, data):
        self.data, self.pos = data, 0

    def take(self, fmt):
        (v,) = struct.unpack_from(fmt, self.data, self.pos)
        self.pos += struct.calcsize(fmt)
        return v

    def string(self):
        n = self.take("<Q")
        s = self.data[self.pos:self.pos + n]
        self.pos += n
        return s

    def value(self, t):
        if t == STRING:
            return self.string()
        if t == ARRAY:
            et, n = self.take("<I"), self.take("<Q")
            return (et, [self.value(et) for _ in range(n)])
        return self.take(SCALARS[t])


def put_value(out, t, v):
    if t == STRING:
        out += struct.pack("<Q", len(v)) + v
    elif t == ARRAY:
        et, items = v
        out += struct.pack("<IQ", et, len(items))
        for item in items:
            put_value(out, et, item)
    else:
        out += struct.pack(SCALARS[t], v)


def main():
    src, dst = sys.argv[1], sys.argv[2]
    keep_n = int(sys.argv[3]) if len(sys.argv) > 3 else 384
    r = Reader(open(src, "rb").read())
    assert r.take("<I") == 0x46554747, "not a GGUF file"
    version = r.take("<I")
    r.take("<Q")  # tensors: dropped
    kvs = []
    for _ in range(r.take("<Q")):
        key = r.string().decode()
        t = r.take("<I")
        kvs.append([key, t, r.value(t)])
    kv = {k: (t, v) for k, t, v in kvs}
    tokens = kv.get("tokenizer.ggml.tokens", (None, (STRING, [])))[1][1]
    n_vocab = len(tokens)
    special = {k: v for k, (t, v) in kv.items() if k.startswith("tokenizer.ggml.") and k.endswith("_token_id") and t in (4, 5)}
    keep = sorted(set(range(min(keep_n, n_vocab))) | {v for v in special.values() if 0 <= v < n_vocab})
    new_id = {old: i for i, old in enumerate(keep)}
    kept_text = {tokens[i] for i in keep}
    for item in kvs:
        key, t, v = item
        if t == ARRAY and key.startswith("tokenizer.ggml.") and len(v[1]) == n_vocab and n_vocab:
            item[2] = (v[0], [v[1][i] for i in keep])
        elif key == "tokenizer.ggml.merges":
            def kept(m):
                parts = m.split(b" ", 1)
                return len(parts) == 2 and parts[0] in kept_text and parts[1] in kept_text and parts[0] + parts[1] in kept_text
            item[2] = (v[0], [m for m in v[1] if kept(m)])
        elif key in special and special[key] in new_id:
            item[2] = new_id[special[key]]
        elif key.endswith(".vocab_size") and t in (4, 5, 10, 11) and n_vocab:
            item[2] = len(keep)
    out = bytearray(struct.pack("<IIQQ", 0x46554747, version, 0, len(kvs)))
    for key, t, v in kvs:
        put_value(out, STRING, key.encode())
        out += struct.pack("<I", t)
        put_value(out, t, v)
    open(dst, "wb").write(out)


if __name__ == "__main__":
    main()

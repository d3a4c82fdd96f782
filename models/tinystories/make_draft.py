#!/usr/bin/env python3
"""Makes stories260K's draft: a llama2.c checkpoint of its own, cut from the target.

usage: make_draft.py TARGET OUT [--layers 0,1,3,4] [--seq-len 256]

The draft keeps the target's embedding, its final norm and the transformer layers named by
--layers (in that order), and a shorter context. Its weights are its own file, with its own KV
cache when it drafts, and its greedy agreement with the target lies well inside (0.2, 0.9)
(models/README.md gives the measured figures). Standard library only: the output is the same bytes
on every machine, so a test can make it again and compare.
"""
import argparse
import struct
import sys

HEADER = struct.Struct("<7i")  # dim, hidden_dim, layers, heads, kv_heads, vocab (< 0: unshared), seq_len
F32 = 4


def split(blob, dim, hidden, layers, heads, kv_heads, vocab, seq_len):
    """The checkpoint's tensors as (name, per-layer size or None, bytes), in file order."""
    kv_dim = dim * kv_heads // heads
    head = dim // heads
    per_layer = [("rms_att", dim), ("wq", dim * dim), ("wk", dim * kv_dim), ("wv", dim * kv_dim),
                 ("wo", dim * dim), ("rms_ffn", dim), ("w1", hidden * dim), ("w2", dim * hidden),
                 ("w3", hidden * dim)]
    out, at = [], HEADER.size

    def take(name, count, layer_size=None):
        nonlocal at
        out.append((name, layer_size, blob[at:at + count * F32]))
        at += count * F32

    take("embedding", abs(vocab) * dim)
    for name, size in per_layer:
        take(name, layers * size, size)
    take("rms_final", dim)
    take("freq_cis_real", seq_len * head // 2)
    take("freq_cis_imag", seq_len * head // 2)
    if vocab < 0:
        take("classifier", -vocab * dim)
    if at != len(blob):
        sys.exit(f"make_draft: {len(blob)} bytes, the header's shapes give {at}")
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("target")
    ap.add_argument("out")
    ap.add_argument("--layers", default="0,1,3,4", help="the target's layers to keep, in order")
    ap.add_argument("--seq-len", type=int, default=256, help="the draft's context (at most the target's)")
    args = ap.parse_args()
    blob = open(args.target, "rb").read()
    dim, hidden, layers, heads, kv_heads, vocab, seq_len = HEADER.unpack_from(blob)
    keep = [int(x) for x in args.layers.split(",")]
    if not keep or any(not 0 <= i < layers for i in keep):
        sys.exit(f"make_draft: --layers must name layers in [0, {layers - 1}]")
    if not 0 < args.seq_len <= seq_len:
        sys.exit(f"make_draft: --seq-len must be in [1, {seq_len}]")
    head = dim // heads
    parts = [HEADER.pack(dim, hidden, len(keep), heads, kv_heads, vocab, args.seq_len)]
    for name, layer_size, data in split(blob, dim, hidden, layers, heads, kv_heads, vocab, seq_len):
        if layer_size is not None:
            step = layer_size * F32
            parts += [data[i * step:(i + 1) * step] for i in keep]
        elif name.startswith("freq_cis"):
            parts.append(data[:args.seq_len * head // 2 * F32])  # [seq_len, head_size / 2]
        else:
            parts.append(data)
    with open(args.out, "wb") as f:
        f.write(b"".join(parts))


if __name__ == "__main__":
    main()

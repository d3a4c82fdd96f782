#!/usr/bin/env python3
"""Rewrites a GGUF file with its matrices in another type, with the `gguf` package (llama.cpp's).

  convert_gguf.py IN.gguf OUT.gguf --type f32|f16|bf16|q8_0|q4_0

Every metadata key is copied; 1-D tensors (norms, biases) stay as they are; 2-D tensors are
dequantized by gguf.quants and requantized to --type. Used to make the F32 and Q8_0 versions of
SmolLM2-135M-Instruct for the parity tests and the decode benchmark, and the BF16 one for
self-speculation (into the model cache, never into the repository).
"""
import argparse
import sys

import numpy as np
import gguf

TYPES = {"f32": gguf.GGMLQuantizationType.F32, "f16": gguf.GGMLQuantizationType.F16,
         "bf16": gguf.GGMLQuantizationType.BF16, "q8_0": gguf.GGMLQuantizationType.Q8_0,
         "q4_0": gguf.GGMLQuantizationType.Q4_0}
FILE_TYPE = {"f32": 0, "f16": 1, "bf16": 32, "q8_0": 7, "q4_0": 2}  # llama_ftype


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("src")
    ap.add_argument("dst")
    ap.add_argument("--type", choices=sorted(TYPES), required=True)
    a = ap.parse_args()
    r = gguf.GGUFReader(a.src)
    arch = r.fields["general.architecture"].contents()
    w = gguf.GGUFWriter(a.dst, arch)
    for key, f in r.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        value = f.contents()
        if key == "general.file_type":
            value = FILE_TYPE[a.type]
        vtype = f.types[0]
        sub = f.types[1] if vtype == gguf.GGUFValueType.ARRAY else None
        w.add_key_value(key, value, vtype, sub_type=sub)
    qt = TYPES[a.type]
    for i, t in enumerate(r.tensors):
        shape = [int(d) for d in reversed(t.shape)]  # numpy order
        if len(shape) == 1:
            w.add_tensor(t.name, np.asarray(t.data), raw_shape=t.data.shape, raw_dtype=t.tensor_type)
            continue
        f32 = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32).reshape(shape)
        data = f32 if qt == gguf.GGMLQuantizationType.F32 else gguf.quants.quantize(f32, qt)
        w.add_tensor(t.name, data, raw_shape=data.shape if qt == gguf.GGMLQuantizationType.F32 else None,
                     raw_dtype=qt)
        if (i + 1) % 64 == 0:
            print("[convert_gguf] %d/%d tensors" % (i + 1, len(r.tensors)), file=sys.stderr)
    print("[convert_gguf] writing %s" % a.dst, file=sys.stderr)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""HF transformers `generate` on the same random weights as bench/gpu_bench (GPU machine only).

  python3 bench/hf_generate_bench.py /tmp/llama-3-8b --batch 1 32

Loads the HF directory written by `specula make-model` in bf16 on cuda:0 and times greedy
generation of 128 tokens after 32 prompt tokens per sequence (the same workload as
BM_GpuGenerate), printing one JSON line per batch size with generated tokens/s.
"""
import argparse
import json
import time


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model", help="HF model directory (config.json + model.safetensors)")
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 32])
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--prompt-tokens", type=int, default=32)
    args = ap.parse_args()

    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(args.model, torch_dtype=torch.bfloat16).to("cuda:0").eval()
    for b in args.batch:
        ids = torch.tensor([[1 + (i * 131 + t * 17) % 1000 for t in range(args.prompt_tokens)] for i in range(b)],
                           device="cuda:0")
        kwargs = dict(max_new_tokens=args.new_tokens, min_new_tokens=args.new_tokens, do_sample=False,
                      pad_token_id=0, attention_mask=torch.ones_like(ids))
        with torch.inference_mode():
            model.generate(ids, **{**kwargs, "max_new_tokens": 8, "min_new_tokens": 8})  # warm-up
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            out = model.generate(ids, **kwargs)
            torch.cuda.synchronize()
            dt = time.perf_counter() - t0
        generated = (out.shape[1] - ids.shape[1]) * b
        print(json.dumps({"impl": "hf_transformers", "batch": b, "generated": generated, "seconds": round(dt, 3),
                          "tok_per_s": round(generated / dt, 1)}), flush=True)


if __name__ == "__main__":
    main()

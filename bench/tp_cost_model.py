#!/usr/bin/env python3
"""A cost model of tensor-parallel decoding on GPUs (Specula's sharding: two all-reduces per layer,
a vocab-parallel classifier with a logits all-gather), for the llama-3-8b shape on H100s.

Per token and GPU at batch B: read 1/TP of the layer weights and of the classifier (the embedding
is only gathered by row), then 2 all-reduces per layer of B x dim bf16 values and one all-gather
of B x vocab f32 logits. A collective costs its latency plus its bytes over the link (NCCL's ring
moves 2(TP-1)/TP of the buffer per GPU for an all-reduce, (TP-1)/TP for an all-gather).

The constants are datasheet figures and typical NCCL small-message latencies, not measurements:
no multi-GPU machine has been lent to this project yet. Once one is, measure and replace them.

usage: bench/tp_cost_model.py [--batch 1] [--hbm-tbs 3.35] [--hbm-efficiency 0.8]
"""
import argparse

SHAPE = dict(dim=4096, hidden=14336, layers=32, heads=32, kv_heads=8, head_dim=128, vocab=128256)  # llama-3-8b
LINKS = {  # per-direction bandwidth a GPU can drive in a collective, and a collective's latency
    "NVLink 4 (H100 SXM, NVSwitch)": (450e9, 8e-6),
    "PCIe 5.0 x16 (H100 PCIe)": (50e9, 25e-6),
}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--hbm-tbs", type=float, default=3.35, help="HBM3 bandwidth of one H100 SXM, TB/s")
    ap.add_argument("--hbm-efficiency", type=float, default=0.8, help="share of it a decode step achieves")
    a = ap.parse_args()
    s, B = SHAPE, a.batch
    bf16 = 2
    layer = (s["dim"] * (s["heads"] + 2 * s["kv_heads"]) * s["head_dim"] + s["heads"] * s["head_dim"] * s["dim"] +
             3 * s["dim"] * s["hidden"]) * bf16
    classifier = s["vocab"] * s["dim"] * bf16
    weights = s["layers"] * layer + classifier
    allreduce_bytes = B * s["dim"] * bf16
    print(f"llama-3-8b, batch {B}: {weights / 1e9:.2f} GB of weights read per token (layers + classifier)")
    print(f"all-reduce: {allreduce_bytes} bytes per all-reduce, 2 per layer = {2 * allreduce_bytes} bytes per layer "
          f"per token ({2 * s['layers']} all-reduces per token)\n")
    hbm = a.hbm_tbs * 1e12 * a.hbm_efficiency
    for link, (bw, lat) in LINKS.items():
        print(f"{link}: {bw / 1e9:.0f} GB/s, {lat * 1e6:.0f} us per collective")
        print("| TP | weights per GPU (ms) | all-reduces (ms) | logits all-gather (ms) | token latency (ms) | vs TP=1 |")
        print("|---|---|---|---|---|---|")
        base = None
        for tp in (1, 2, 4, 8):
            t_w = weights / tp / hbm
            if tp == 1:
                t_ar = t_ag = 0.0
            else:
                t_ar = 2 * s["layers"] * (lat + 2 * (tp - 1) / tp * allreduce_bytes / bw)
                t_ag = lat + (tp - 1) / tp * B * s["vocab"] * 4 / bw
            total = t_w + t_ar + t_ag
            base = base or total
            print(f"| {tp} | {t_w * 1e3:.2f} | {t_ar * 1e3:.2f} | {t_ag * 1e3:.3f} | {total * 1e3:.2f} | "
                  f"{base / total:.2f}x |")
        print()


if __name__ == "__main__":
    main()

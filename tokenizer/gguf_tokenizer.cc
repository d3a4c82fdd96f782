// The tokenizer embedded in a GGUF file (llama.cpp's tokenizer.ggml.* keys), built on the BPE core
// that tokenizer.json uses (tokenizer/bpe.h):
//  - "gpt2": byte-level BPE with tokenizer.ggml.merges, split as tokenizer.ggml.pre says;
//  - "llama": sentencepiece with tokenizer.ggml.scores: "▁" for spaces, the adjacent pair whose
//    merged piece scores best merges first (llama.cpp's SPM tokenizer), byte fallback <0xXX>.
// Control, unknown and user-defined tokens (tokenizer.ggml.token_type 3, 2 and 4) are matched whole
// in the text before BPE, as HF matches added tokens. The facts about each `pre` type and the
// defaults come from llama.cpp's src/llama-vocab.cpp. Every count and index in the file is checked,
// and an error names the file and the key.
#include <limits>
#include <unordered_map>

#include "absl/strings/str_cat.h"
#include "core/gguf.h"
#include "core/status_macros.h"
#include "tokenizer/bpe.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"

namespace specula {
namespace {

// tokenizer.ggml.token_type values (gguf-py's TokenType).
constexpr int64_t kNormal = 1;
constexpr int64_t kUnknown = 2;
constexpr int64_t kControl = 3;
constexpr int64_t kUserDefined = 4;
constexpr int64_t kByte = 6;

const char kSpaceMark[] = "\xE2\x96\x81";  // U+2581 "▁"

// Control tokens that end a turn, found by their text as llama.cpp does (its end-of-generation
// set), so that a chat stops on <|im_end|> even where tokenizer.ggml.eos_token_id names another.
constexpr const char* kEndOfTurnTexts[] = {"<|im_end|>",      "<|eot_id|>",      "<|eom_id|>",
                                           "<|endoftext|>",   "<|end_of_text|>", "<end_of_turn>"};

BpeStep Split(SplitPattern pattern) {
  BpeStep s;
  s.type = "Split";
  s.pattern = pattern;
  return s;
}

BpeStep ByteLevel(bool use_regex) {
  BpeStep s;
  s.type = "ByteLevel";
  s.flag = use_regex;
  return s;
}

BpeStep Normalizer(std::string type, std::string a, std::string b) {
  BpeStep s;
  s.type = std::move(type);
  s.a = std::move(a);
  s.b = std::move(b);
  return s;
}

BpeStep Digits() {
  BpeStep s;
  s.type = "Digits";
  return s;
}

constexpr const char* kSupportedPre = "default, gpt2, gpt-2, smollm, llama-bpe, llama3, llama-v3, qwen2, deepseek-r1-qwen";

// The pre-tokenizer steps of a gpt2 vocabulary's `pre` type: llama.cpp's regex list for it, in the
// HF steps that split the same way. False when the type is not one of kSupportedPre.
bool PreTokenizer(std::string_view pre, BpeModel* m, bool* add_bos) {
  *add_bos = false;
  if (pre == "default") {
    // llama.cpp's fallback for files without a type: punctuation runs, GPT-2's regex, digit runs,
    // then groups of three digits, each splitting what the one before left.
    m->pre_tokenizers = {Split(SplitPattern::kPunctuation), Split(SplitPattern::kGpt2), Split(SplitPattern::kNumbers),
                         Split(SplitPattern::kThreeDigits), ByteLevel(false)};
  } else if (pre == "gpt2" || pre == "gpt-2") {
    m->pre_tokenizers = {ByteLevel(true)};
  } else if (pre == "smollm") {
    // \p{N} one by one, then GPT-2's regex: HF's Digits(individual_digits) + ByteLevel(use_regex).
    m->pre_tokenizers = {Digits(), ByteLevel(true)};
  } else if (pre == "llama-bpe" || pre == "llama3" || pre == "llama-v3") {
    m->pre_tokenizers = {Split(SplitPattern::kLlama3), ByteLevel(false)};
    m->ignore_merges = true;  // as Llama 3's tokenizer.json
    *add_bos = true;
  } else if (pre == "qwen2" || pre == "deepseek-r1-qwen") {
    m->pre_tokenizers = {Split(SplitPattern::kQwen2), ByteLevel(false)};
  } else {
    return false;
  }
  return true;
}

class Loader {
 public:
  explicit Loader(const GgufFile& f) : f_(f) {}

  absl::StatusOr<std::unique_ptr<Tokenizer>> Load() {
    ASSIGN_OR_RETURN(std::string_view model, f_.GetString("tokenizer.ggml.model"));
    const bool spm = model == "llama";
    if (!spm && model != "gpt2") {
      return Bad("tokenizer.ggml.model", absl::StrCat("'", std::string(model), "' is not supported (gpt2 or llama)"));
    }
    RETURN_IF_ERROR(ReadTokens(spm));
    if (spm) {
      RETURN_IF_ERROR(SentencepieceMerges());
    } else {
      RETURN_IF_ERROR(RankedMerges());
    }
    bool add_bos = spm;  // llama.cpp's default: sentencepiece vocabularies get BOS
    if (!spm) {
      std::string_view pre = "default";  // llama.cpp's choice (with a warning) when the key is absent
      if (f_.Find("tokenizer.ggml.pre") != nullptr) {
        ASSIGN_OR_RETURN(pre, f_.GetString("tokenizer.ggml.pre"));
      }
      if (!PreTokenizer(pre, &m_, &add_bos)) {
        return Bad("tokenizer.ggml.pre", absl::StrCat("'", std::string(pre), "' is not supported (", kSupportedPre, ")"));
      }
    }
    // llama.cpp's defaults for sentencepiece files without the keys: <unk> 0, <s> 1, </s> 2.
    ASSIGN_OR_RETURN(m_.bos_id, TokenIdKey("tokenizer.ggml.bos_token_id", spm ? 1 : -1));
    ASSIGN_OR_RETURN(const TokenId eos, TokenIdKey("tokenizer.ggml.eos_token_id", spm ? 2 : -1));
    ASSIGN_OR_RETURN(const TokenId eot, TokenIdKey("tokenizer.ggml.eot_token_id", -1));
    ASSIGN_OR_RETURN(const TokenId eom, TokenIdKey("tokenizer.ggml.eom_token_id", -1));
    ASSIGN_OR_RETURN(const TokenId unk, TokenIdKey("tokenizer.ggml.unknown_token_id", spm ? 0 : -1));
    // Byte-level BPE drops a byte its vocabulary lacks (SmolLM2 has no 0xFF) rather than write <unk>,
    // as llama.cpp and transformers' conversion do.
    m_.unk_id = spm ? unk : -1;
    for (TokenId id : {eos, eot, eom}) AddEos(id);
    for (size_t i = 0; i < m_.pieces.size(); ++i) {
      if (types_[i] != kControl) continue;
      for (const char* text : kEndOfTurnTexts) {
        if (m_.pieces[i] == text) AddEos(static_cast<TokenId>(i));
      }
    }
    if (f_.Find("tokenizer.ggml.add_bos_token") != nullptr) {
      ASSIGN_OR_RETURN(const int64_t v, f_.GetInt("tokenizer.ggml.add_bos_token"));
      add_bos = v != 0;
      if (add_bos && m_.bos_id < 0) {
        return Bad("tokenizer.ggml.add_bos_token", "is true, but tokenizer.ggml.bos_token_id is not set");
      }
    }
    m_.add_bos_default = add_bos && m_.bos_id >= 0;
    return MakeBpeTokenizer(std::move(m_));
  }

 private:
  // absl::StrCat here takes no std::string_view (Debian's Abseil): views become strings first.
  absl::Status Bad(const std::string& key, const std::string& what) const {
    return absl::InvalidArgumentError(absl::StrCat(f_.path(), ": GGUF ", key, " ", what));
  }

  // tokens, token_type and scores: one entry per token each.
  absl::Status ReadTokens(bool spm) {
    ASSIGN_OR_RETURN(const std::vector<std::string_view>* tokens, f_.GetStringArray("tokenizer.ggml.tokens"));
    const size_t n = tokens->size();
    if (n == 0) return Bad("tokenizer.ggml.tokens", "is empty");
    if (n > static_cast<size_t>(std::numeric_limits<TokenId>::max())) {
      return Bad("tokenizer.ggml.tokens", absl::StrCat("has ", n, " tokens, more than token ids can number"));
    }
    auto length_mismatch = [&](const std::string& key, size_t got) {
      return Bad(key, absl::StrCat("has ", got, " entries, but tokenizer.ggml.tokens has ", n));
    };
    types_.assign(n, kNormal);
    if (f_.Find("tokenizer.ggml.token_type") != nullptr) {
      ASSIGN_OR_RETURN(types_, f_.GetIntArray("tokenizer.ggml.token_type"));
      if (types_.size() != n) return length_mismatch("tokenizer.ggml.token_type", types_.size());
      for (size_t i = 0; i < n; ++i) {
        if (types_[i] < kNormal || types_[i] > kByte) {
          return Bad(absl::StrCat("tokenizer.ggml.token_type[", i, "]"),
                     absl::StrCat("is ", types_[i], " (1 normal, 2 unknown, 3 control, 4 user-defined, 5 unused, 6 byte)"));
        }
      }
    }
    if (f_.Find("tokenizer.ggml.scores") != nullptr) {
      ASSIGN_OR_RETURN(scores_, f_.GetFloatArray("tokenizer.ggml.scores"));
      if (scores_.size() != n) return length_mismatch("tokenizer.ggml.scores", scores_.size());
      for (size_t i = 0; i < n; ++i) {
        if (scores_[i] != scores_[i]) return Bad(absl::StrCat("tokenizer.ggml.scores[", i, "]"), "is NaN");
      }
    } else if (spm) {
      return Bad("tokenizer.ggml.scores", "is missing (a llama vocabulary merges by score)");
    }
    m_.pieces.reserve(n);
    m_.kinds.reserve(n);
    for (size_t i = 0; i < n; ++i) {
      const std::string_view piece = (*tokens)[i];
      // llama.cpp refuses these too: an id per text, or matching would depend on which came first.
      if (auto [it, fresh] = ids_.emplace(std::string(piece), static_cast<TokenId>(i)); !fresh && !piece.empty()) {
        return Bad(absl::StrCat("tokenizer.ggml.tokens[", i, "]"),
                   absl::StrCat("'", std::string(piece), "' repeats tokenizer.ggml.tokens[", it->second, "]"));
      }
      m_.pieces.emplace_back(piece);
      m_.kinds.push_back(types_[i] == kControl || types_[i] == kUnknown ? BpeTokenKind::kSpecial
                         : types_[i] == kUserDefined                   ? BpeTokenKind::kAdded
                                                                       : BpeTokenKind::kNormal);
    }
    return absl::OkStatus();
  }

  // tokenizer.ggml.merges: "left right" in rank order; both sides and their concatenation must be
  // tokens (HF tokenizers refuses such merges too).
  absl::Status RankedMerges() {
    ASSIGN_OR_RETURN(const std::vector<std::string_view>* merges, f_.GetStringArray("tokenizer.ggml.merges"));
    m_.merges.reserve(merges->size());
    for (size_t r = 0; r < merges->size(); ++r) {
      const std::string_view text = (*merges)[r];
      const std::string key = absl::StrCat("tokenizer.ggml.merges[", r, "]");
      const size_t sp = text.find(' ', 1);  // as llama.cpp: a left side may not be empty
      if (sp == std::string_view::npos) return Bad(key, absl::StrCat("'", std::string(text), "' is not 'left right'"));
      const std::string_view left = text.substr(0, sp);
      const std::string_view right = text.substr(sp + 1);
      BpeMerge mg;
      mg.cost = static_cast<double>(r);
      for (auto [piece, dst] : {std::pair{std::string(left), &mg.left}, {std::string(right), &mg.right},
                                {absl::StrCat(std::string(left), std::string(right)), &mg.merged}}) {
        auto it = ids_.find(piece);
        if (it == ids_.end()) {
          return Bad(key, absl::StrCat("'", std::string(text), "' names '", piece, "', which is not in tokenizer.ggml.tokens"));
        }
        *dst = it->second;
      }
      m_.merges.push_back(mg);
    }
    return absl::OkStatus();
  }

  // Sentencepiece: every split of a piece into two tokens is a merge that costs minus the piece's
  // score, so the best-scoring pair merges first and ties go to the leftmost (llama.cpp's SPM
  // tokenizer; HF's sentencepiece converters derive merges the same way). Spaces become "▁".
  // Unlike llama.cpp, a character that is not itself a piece never merges; sentencepiece
  // vocabularies hold the characters of their pieces, so this does not differ in practice.
  absl::Status SentencepieceMerges() {
    for (size_t t = 0; t < m_.pieces.size(); ++t) {
      // Control, unknown, unused and byte pieces are never made from text.
      if (types_[t] != kNormal && types_[t] != kUserDefined) continue;
      const std::string& piece = m_.pieces[t];
      for (size_t k = piece.empty() ? 0 : Utf8Len(piece, 0); k < piece.size(); k += Utf8Len(piece, k)) {
        auto l = ids_.find(piece.substr(0, k));
        auto r = ids_.find(piece.substr(k));
        if (l == ids_.end() || r == ids_.end()) continue;
        BpeMerge mg;
        mg.left = l->second;
        mg.right = r->second;
        mg.merged = static_cast<TokenId>(t);
        mg.cost = -static_cast<double>(scores_[t]);
        m_.merges.push_back(mg);
      }
    }
    bool add_space_prefix = true;  // llama.cpp's default for sentencepiece
    if (f_.Find("tokenizer.ggml.add_space_prefix") != nullptr) {
      ASSIGN_OR_RETURN(const int64_t v, f_.GetInt("tokenizer.ggml.add_space_prefix"));
      add_space_prefix = v != 0;
    }
    if (add_space_prefix) m_.normalizers.push_back(Normalizer("Prepend", kSpaceMark, ""));
    m_.normalizers.push_back(Normalizer("Replace", " ", kSpaceMark));
    m_.byte_fallback = true;
    return absl::OkStatus();
  }

  // The id under `key`, `fallback` when absent (-1, or a default outside the vocabulary: none).
  absl::StatusOr<TokenId> TokenIdKey(const std::string& key, TokenId fallback) const {
    const int64_t n = static_cast<int64_t>(m_.pieces.size());
    if (f_.Find(key) == nullptr) return fallback < n ? fallback : -1;
    ASSIGN_OR_RETURN(const int64_t id, f_.GetInt(key));
    if (id < 0 || id >= n) {
      return Bad(key, absl::StrCat("is ", id, ", outside the ", n, " tokens of tokenizer.ggml.tokens"));
    }
    return static_cast<TokenId>(id);
  }

  void AddEos(TokenId id) {
    if (id < 0) return;
    for (TokenId e : m_.eos_ids) {
      if (e == id) return;
    }
    m_.eos_ids.push_back(id);
  }

  const GgufFile& f_;
  BpeModel m_;
  std::unordered_map<std::string, TokenId> ids_;  // token text -> id
  std::vector<int64_t> types_;                    // [vocab] tokenizer.ggml.token_type
  std::vector<float> scores_;                     // [vocab] tokenizer.ggml.scores, when present
};

}  // namespace

absl::StatusOr<std::unique_ptr<Tokenizer>> LoadGgufTokenizer(const std::string& gguf_path) {
  ASSIGN_OR_RETURN(GgufFile f, GgufFile::Open(gguf_path));
  return Loader(f).Load();
}

}  // namespace specula

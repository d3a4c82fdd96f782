// The BPE core (tokenizer/bpe.h) and HF tokenizer.json with a BPE model, in two forms:
//  - byte-level (Llama 3, Qwen2, SmolLM, GPT-2): pre-tokenizer splits, bytes mapped to printable
//    code points, merges by rank;
//  - sentencepiece-style (Llama 2): "▁" for spaces, merges on characters, byte fallback <0xXX>.
// The GGUF loader (gguf_tokenizer.cc) builds the same core from the file's tokenizer.ggml.* keys.
#include <unicode/normalizer2.h>
#include <unicode/unistr.h>

#include <algorithm>
#include <bitset>
#include <queue>
#include <type_traits>
#include <unordered_map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "core/mapped_file.h"
#include "core/status_macros.h"
#include "nlohmann/json.hpp"
#include "tokenizer/bpe.h"
#include "tokenizer/pretokenize.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"

namespace specula {
namespace {

using json = nlohmann::json;
const std::string kSpaceMark = "\xE2\x96\x81";  // U+2581 "▁"

// Pieces are looked up by string_view, without a copy per character.
struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
using PieceIds = std::unordered_map<std::string, TokenId, StringHash, std::equal_to<>>;

uint64_t PairKey(TokenId left, TokenId right) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
}

// The byte of a "<0xXX>" piece, or -1.
int ByteFallbackValue(const std::string& piece) {
  if (piece.size() != 6 || piece.compare(0, 3, "<0x") != 0 || piece[5] != '>') return -1;
  int v = 0;
  for (int k = 3; k < 5; ++k) {
    const char ch = piece[k];
    const int d = ch >= '0' && ch <= '9' ? ch - '0' : ch >= 'A' && ch <= 'F' ? ch - 'A' + 10
                                                    : ch >= 'a' && ch <= 'f' ? ch - 'a' + 10 : -1;
    if (d < 0) return -1;
    v = v * 16 + d;
  }
  return v;
}

class BpeTokenizer final : public Tokenizer {
 public:
  explicit BpeTokenizer(BpeModel m) : m_(std::move(m)) {
    bos_id_ = m_.bos_id;
    eos_ids_ = m_.eos_ids;
    add_bos_default_ = m_.add_bos_default;
    for (size_t i = 0; i < m_.pieces.size(); ++i) {
      ids_.emplace(m_.pieces[i], static_cast<TokenId>(i));
      if (m_.kinds[i] != BpeTokenKind::kNormal && !m_.pieces[i].empty()) {
        added_.push_back(static_cast<TokenId>(i));
        added_first_byte_[static_cast<uint8_t>(m_.pieces[i][0])] = true;
      }
    }
    // Longest first, so that the first hit at a position is the longest one.
    std::stable_sort(added_.begin(), added_.end(),
                     [&](TokenId a, TokenId b) { return m_.pieces[a].size() > m_.pieces[b].size(); });
    for (const BpeMerge& mg : m_.merges) merges_.emplace(PairKey(mg.left, mg.right), std::make_pair(mg.cost, mg.merged));
    m_.merges.clear();
    m_.merges.shrink_to_fit();
    for (const BpeStep& s : m_.pre_tokenizers) byte_level_ |= s.type == "ByteLevel";
    if (byte_level_) {
      byte_to_unicode_ = ByteToUnicode();
      for (int b = 0; b < 256; ++b) unicode_to_byte_[byte_to_unicode_[b]] = static_cast<uint8_t>(b);
    } else {
      // Sentencepiece-style: the "▁" prefix added on encode is stripped again on decode.
      for (const BpeStep& s : m_.normalizers) strip_leading_space_ |= s.type == "Prepend";
      for (const BpeStep& s : m_.pre_tokenizers) strip_leading_space_ |= s.type == "Metaspace" && s.prefix;
    }
    byte_value_.assign(m_.pieces.size(), -1);
    std::fill(std::begin(byte_token_), std::end(byte_token_), -1);
    for (size_t i = 0; i < m_.pieces.size(); ++i) {
      const int b = ByteFallbackValue(m_.pieces[i]);
      if (b < 0) continue;
      if (!byte_level_) byte_value_[i] = static_cast<int16_t>(b);
      if (byte_token_[b] < 0) byte_token_[b] = static_cast<TokenId>(i);
    }
  }

  int32_t vocab_size() const override { return static_cast<int32_t>(m_.pieces.size()); }

  std::vector<TokenId> Encode(std::string_view text, bool add_bos) const override {
    std::vector<TokenId> out;
    if (add_bos && bos_id_ >= 0) out.push_back(bos_id_);
    // Added tokens are matched first, longest at the leftmost position; the rest is tokenized.
    size_t i = 0, plain = 0;
    while (i < text.size()) {
      TokenId hit = -1;
      if (added_first_byte_[static_cast<uint8_t>(text[i])]) {
        for (TokenId a : added_) {
          if (text.compare(i, m_.pieces[a].size(), m_.pieces[a]) == 0) {
            hit = a;
            break;
          }
        }
      }
      if (hit < 0) {
        ++i;
        continue;
      }
      EncodeSegment(text.substr(plain, i - plain), &out);
      out.push_back(hit);
      i += m_.pieces[hit].size();
      plain = i;
    }
    EncodeSegment(text.substr(plain), &out);
    return out;
  }

  std::string DecodeToken(TokenId prev, TokenId id) const override {
    std::string out = TokenBytes(id);
    if (byte_level_ || id < 0 || id >= vocab_size() || m_.kinds[id] != BpeTokenKind::kNormal || byte_value_[id] >= 0) {
      return out;
    }
    // Encode prepends "▁" to the text and to each stretch after an added token.
    const bool at_start = prev < 0 || (prev < vocab_size() && m_.kinds[prev] != BpeTokenKind::kNormal);
    if (strip_leading_space_ && at_start && !out.empty() && out[0] == ' ') out.erase(0, 1);
    return out;
  }

  std::string TokenBytes(TokenId id) const override {
    if (id < 0 || id >= vocab_size()) return "";
    const std::string& piece = m_.pieces[id];
    if (m_.kinds[id] == BpeTokenKind::kSpecial) return "";
    if (m_.kinds[id] == BpeTokenKind::kAdded) return piece;  // matched literally on encode
    if (byte_level_) {
      std::string out;
      for (size_t i = 0; i < piece.size();) {
        const size_t len = Utf8Len(piece, i);
        auto it = unicode_to_byte_.find(piece.substr(i, len));
        if (it != unicode_to_byte_.end()) {
          out += static_cast<char>(it->second);
        } else {
          out += piece.substr(i, len);
        }
        i += len;
      }
      return out;
    }
    if (byte_value_[id] >= 0) return std::string(1, static_cast<char>(byte_value_[id]));
    return absl::StrReplaceAll(piece, {{kSpaceMark, " "}});
  }

  VocabKind vocab_kind() const override {
    if (byte_level_) return VocabKind::kByteLevel;
    for (int16_t b : byte_value_) {
      if (b >= 0) return VocabKind::kByteFallback;
    }
    return VocabKind::kRaw;
  }

 private:
  void EncodeSegment(std::string_view seg, std::vector<TokenId>* out) const {
    if (seg.empty()) return;
    std::string s(seg);
    for (const BpeStep& n : m_.normalizers) {
      if (n.type == "Prepend") s = n.a + s;
      if (n.type == "Replace") s = absl::StrReplaceAll(s, {{n.a, n.b}});
      if (n.type == "NFC" || n.type == "NFKC") s = Normalize(s, n.type == "NFKC");
    }
    std::vector<std::string> words{s};
    for (const BpeStep& p : m_.pre_tokenizers) {
      std::vector<std::string> next;
      for (const std::string& w : words) {
        if (p.type == "Split") {
          for (auto& x : SplitWithPattern(w, p.pattern)) next.push_back(std::move(x));
        } else if (p.type == "Digits") {
          for (auto& x : SplitDigits(w)) next.push_back(std::move(x));
        } else if (p.type == "ByteLevel") {
          std::string src = (p.prefix && !w.empty() && w[0] != ' ') ? " " + w : w;
          std::vector<std::string> parts{src};
          if (p.flag) parts = SplitWithPattern(src, SplitPattern::kGpt2);
          for (const std::string& part : parts) {
            std::string mapped;
            for (unsigned char ch : part) mapped += byte_to_unicode_[ch];
            next.push_back(std::move(mapped));
          }
        } else if (p.type == "Metaspace") {
          std::string m = absl::StrReplaceAll(w, {{" ", p.a}});
          if (p.prefix && m.rfind(p.a, 0) != 0) m = p.a + m;
          if (!p.flag) {
            next.push_back(std::move(m));
            continue;
          }
          size_t start = 0;  // split before every replacement mark
          for (size_t k = p.a.size(); k <= m.size(); ++k) {
            if (k == m.size() || m.compare(k, p.a.size(), p.a) == 0) {
              next.push_back(m.substr(start, k - start));
              start = k;
            }
          }
        }
      }
      words = std::move(next);
    }
    for (const std::string& w : words) Bpe(w, out);
  }

  std::string Normalize(const std::string& s, bool nfkc) const {
    UErrorCode err = U_ZERO_ERROR;
    const icu::Normalizer2* n =
        nfkc ? icu::Normalizer2::getNFKCInstance(err) : icu::Normalizer2::getNFCInstance(err);
    if (U_FAILURE(err)) return s;
    icu::UnicodeString u = icu::UnicodeString::fromUTF8(s);
    icu::UnicodeString r = n->normalize(u, err);
    if (U_FAILURE(err)) return s;
    std::string out;
    r.toUTF8String(out);
    // ICU replaces invalid UTF-8 with U+FFFD; keep the original bytes then.
    return out.find("\xEF\xBF\xBD") != std::string::npos && s.find("\xEF\xBF\xBD") == std::string::npos ? s : out;
  }

  // Merges the characters of `word` pair by pair, cheapest merge first, with a priority queue
  // over a linked list of symbols (as HF tokenizers and llama.cpp do): O(n log n), so a long
  // sentencepiece text (one word) stays fast.
  void Bpe(std::string_view word, std::vector<TokenId>* out) const {
    if (word.empty()) return;
    if (m_.ignore_merges) {
      if (auto it = ids_.find(word); it != ids_.end()) {
        out->push_back(it->second);
        return;
      }
    }
    struct Symbol {
      uint32_t start, len;  // bytes of `word`; len 0 once merged into its left neighbour
      TokenId id;           // -1: not in the vocabulary (never merges)
      int32_t prev, next;   // neighbours, -1 at the ends
    };
    std::vector<Symbol> syms;
    for (size_t i = 0; i < word.size();) {
      const size_t len = Utf8Len(word, i);
      auto it = ids_.find(word.substr(i, len));
      const int32_t k = static_cast<int32_t>(syms.size());
      syms.push_back({static_cast<uint32_t>(i), static_cast<uint32_t>(len), it == ids_.end() ? -1 : it->second,
                      k - 1, k + 1});
      i += len;
    }
    syms.back().next = -1;
    struct Candidate {
      double cost;
      int32_t left, right;
      uint32_t left_len, right_len;  // a candidate is stale once either side has changed
      TokenId merged;
    };
    auto later = [](const Candidate& a, const Candidate& b) {
      return a.cost != b.cost ? a.cost > b.cost : a.left > b.left;
    };
    std::priority_queue<Candidate, std::vector<Candidate>, decltype(later)> queue(later);
    auto consider = [&](int32_t l) {
      if (l < 0 || syms[l].next < 0) return;
      const Symbol& a = syms[l];
      const Symbol& b = syms[a.next];
      if (a.id < 0 || b.id < 0) return;
      auto it = merges_.find(PairKey(a.id, b.id));
      if (it != merges_.end()) queue.push({it->second.first, l, a.next, a.len, b.len, it->second.second});
    };
    for (int32_t i = 0; i + 1 < static_cast<int32_t>(syms.size()); ++i) consider(i);
    while (!queue.empty()) {
      const Candidate c = queue.top();
      queue.pop();
      Symbol& l = syms[c.left];
      Symbol& r = syms[c.right];
      if (l.len != c.left_len || l.next != c.right || r.len != c.right_len) continue;
      l.len += r.len;
      l.id = c.merged;
      r.len = 0;
      l.next = r.next;
      if (r.next >= 0) syms[r.next].prev = c.left;
      consider(l.prev);
      consider(c.left);
    }
    for (int32_t i = 0; i >= 0; i = syms[i].next) {
      const Symbol& s = syms[i];
      if (s.id >= 0) {
        out->push_back(s.id);
      } else if (m_.byte_fallback) {
        for (size_t k = s.start; k < s.start + s.len; ++k) {
          const TokenId b = byte_token_[static_cast<uint8_t>(word[k])];
          if (b >= 0) {
            out->push_back(b);
          } else if (m_.unk_id >= 0) {
            out->push_back(m_.unk_id);
          }
        }
      } else if (m_.unk_id >= 0) {
        out->push_back(m_.unk_id);
      }
    }
  }

  BpeModel m_;  // merges moved into merges_
  PieceIds ids_;
  std::unordered_map<uint64_t, std::pair<double, TokenId>> merges_;  // (left, right) -> (cost, merged)
  std::vector<TokenId> added_;  // matched in the text, longest first
  std::bitset<256> added_first_byte_;
  std::vector<std::string> byte_to_unicode_;
  std::unordered_map<std::string, uint8_t> unicode_to_byte_;
  std::vector<int16_t> byte_value_;  // [vocab] sentencepiece-style "<0xXX>" pieces: the byte, else -1
  TokenId byte_token_[256];          // the "<0xXX>" token of each byte, or -1
  bool byte_level_ = false;
  bool strip_leading_space_ = false;
};

absl::Status Unsupported(const std::string& path, const std::string& field, const std::string& what) {
  return absl::InvalidArgumentError(
      absl::StrCat(path, ": field '", field, "': unsupported tokenizer type '", what, "'"));
}

// Optional fields by type, as nlohmann's value() reads them but without its exception on another
// type: absent or null gives `fallback`; another type is an error naming the field.
template <typename T>
absl::StatusOr<T> OptionalField(const json& j, const char* key, T fallback, const std::string& path,
                           const std::string& parent) {
  auto it = j.find(key);  // end() for a non-object too
  if (it == j.end() || it->is_null()) return fallback;
  const bool ok = std::is_same_v<T, bool> ? it->is_boolean() : it->is_string();
  if (!ok) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": field '", parent.empty() ? "" : parent + ".", key,
                                                   "' must be ", std::is_same_v<T, bool> ? "true or false" : "a string"));
  }
  return it->get<T>();
}

// Flattens a normalizer or pre_tokenizer object (Sequence or single) into steps.
absl::Status ParseSteps(const json& j, const std::string& path, const std::string& field,
                        std::vector<BpeStep>* out) {
  if (j.is_null()) return absl::OkStatus();
  if (!j.is_object() || !j.contains("type") || !j["type"].is_string()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": field '", field, "' has no type"));
  }
  const std::string type = j["type"];
  if (type == "Sequence") {
    const char* list = j.contains("normalizers") ? "normalizers" : "pretokenizers";
    if (!j.contains(list) || !j[list].is_array()) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": field '", field, ".", list, "' missing"));
    }
    for (size_t i = 0; i < j[list].size(); ++i) {
      RETURN_IF_ERROR(ParseSteps(j[list][i], path, absl::StrCat(field, ".", list, "[", i, "]"), out));
    }
    return absl::OkStatus();
  }
  BpeStep s;
  s.type = type;
  if (type == "Prepend") {
    ASSIGN_OR_RETURN(s.a, OptionalField<std::string>(j, "prepend", "", path, field));
  } else if (type == "Replace") {
    const json& pat = j.value("pattern", json::object());
    if (!pat.contains("String")) return Unsupported(path, field + ".pattern", "Regex replace");
    ASSIGN_OR_RETURN(s.a, OptionalField<std::string>(pat, "String", "", path, field + ".pattern"));
    ASSIGN_OR_RETURN(s.b, OptionalField<std::string>(j, "content", "", path, field));
  } else if (type == "NFC" || type == "NFKC") {
  } else if (type == "ByteLevel") {
    ASSIGN_OR_RETURN(s.flag, OptionalField(j, "use_regex", true, path, field));
    ASSIGN_OR_RETURN(s.prefix, OptionalField(j, "add_prefix_space", false, path, field));
  } else if (type == "Split") {
    const json& pat = j.value("pattern", json::object());
    if (!pat.contains("Regex") || !pat["Regex"].is_string() || !ParseSplitPattern(pat["Regex"].get<std::string>(), &s.pattern)) {
      return Unsupported(path, field + ".pattern", pat.dump());
    }
    ASSIGN_OR_RETURN(const std::string behavior, OptionalField<std::string>(j, "behavior", "Isolated", path, field));
    ASSIGN_OR_RETURN(const bool invert, OptionalField(j, "invert", false, path, field));
    if (behavior != "Isolated" || invert) return Unsupported(path, field + ".behavior", behavior);
  } else if (type == "Digits") {
    ASSIGN_OR_RETURN(const bool individual, OptionalField(j, "individual_digits", false, path, field));
    if (!individual) return Unsupported(path, field, "Digits (grouped)");
  } else if (type == "Metaspace") {
    ASSIGN_OR_RETURN(s.a, OptionalField(j, "replacement", kSpaceMark, path, field));
    ASSIGN_OR_RETURN(s.flag, OptionalField(j, "split", true, path, field));
    ASSIGN_OR_RETURN(const std::string scheme, OptionalField<std::string>(j, "prepend_scheme", "always", path, field));
    ASSIGN_OR_RETURN(const bool add_prefix_space, OptionalField(j, "add_prefix_space", true, path, field));
    s.prefix = scheme != "never" && add_prefix_space;
  } else {
    return Unsupported(path, field, type);
  }
  out->push_back(std::move(s));
  return absl::OkStatus();
}

std::string TokenContent(const json& j) {
  if (j.is_string()) return j.get<std::string>();
  if (j.is_object() && j.contains("content") && j["content"].is_string()) return j["content"];
  return "";
}

// The model section's shape: an object of type BPE with a vocabulary and no subword affixes.
absl::Status CheckBpeModel(const json& model, const std::string& path) {
  if (!model.is_object()) return absl::InvalidArgumentError(absl::StrCat(path, ": field 'model' must be an object"));
  ASSIGN_OR_RETURN(const std::string type, OptionalField<std::string>(model, "type", "", path, "model"));
  if (type != "BPE") return Unsupported(path, "model.type", type.empty() ? "(missing)" : type);
  if (!model.contains("vocab") || !model["vocab"].is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": field 'model.vocab' is missing"));
  }
  if (!model.value("continuing_subword_prefix", json()).is_null() ||
      !model.value("end_of_word_suffix", json()).is_null()) {
    return Unsupported(path, "model.continuing_subword_prefix", "BPE with subword affixes");
  }
  return absl::OkStatus();
}

// Puts `piece` at `id`. Every id below the largest must be used, so ids past the number of entries
// (model.vocab's and added_tokens' together) leave a gap: refused before the tables grow to them.
absl::Status PutPiece(const std::string& piece, int64_t id, int64_t entries, const std::string& path, BpeModel* t,
                      PieceIds* ids) {
  if (id < 0 || id > 10'000'000 || id >= entries) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": token '", piece, "' has id ", id, ", but model.vocab and ",
                                                   "added_tokens hold ", entries, " entries (ids must be dense)"));
  }
  if (static_cast<size_t>(id) >= t->pieces.size()) {
    t->pieces.resize(id + 1);
    t->kinds.resize(id + 1, BpeTokenKind::kNormal);
  }
  t->pieces[id] = piece;
  ids->emplace(piece, static_cast<TokenId>(id));
  return absl::OkStatus();
}

absl::Status ReadVocab(const json& vocab, int64_t entries, const std::string& path, BpeModel* t, PieceIds* ids) {
  for (auto& [piece, id] : vocab.items()) {
    if (!id.is_number_integer()) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": field 'model.vocab' entry '", piece, "' needs an integer id"));
    }
    RETURN_IF_ERROR(PutPiece(piece, id.get<int64_t>(), entries, path, t, ids));
  }
  return absl::OkStatus();
}

// The merges by rank, each an "a b" string or an [a, b] pair.
absl::Status ReadMerges(const json& model, const PieceIds& ids, const std::string& path, BpeModel* t) {
  const json& merges = model.value("merges", json::array());
  if (!merges.is_array()) return absl::InvalidArgumentError(absl::StrCat(path, ": field 'model.merges' must be a list"));
  for (size_t r = 0; r < merges.size(); ++r) {
    std::string a, b;
    if (merges[r].is_string()) {
      const std::string m = merges[r];
      const size_t sp = m.find(' ');
      if (sp == std::string::npos) {
        return absl::InvalidArgumentError(absl::StrCat(path, ": field 'model.merges[", r, "]' is not 'a b'"));
      }
      a = m.substr(0, sp);
      b = m.substr(sp + 1);
    } else if (merges[r].is_array() && merges[r].size() == 2 && merges[r][0].is_string() && merges[r][1].is_string()) {
      a = merges[r][0];
      b = merges[r][1];
    } else {
      return absl::InvalidArgumentError(absl::StrCat(path, ": field 'model.merges[", r, "]' is malformed"));
    }
    // As HF tokenizers: both sides and the result must be in the vocabulary.
    BpeMerge mg;
    mg.cost = static_cast<double>(r);
    for (auto [piece, dst] : {std::pair{a, &mg.left}, {b, &mg.right}, {a + b, &mg.merged}}) {
      auto it = ids.find(piece);
      if (it == ids.end()) {
        return absl::InvalidArgumentError(absl::StrCat(path, ": field 'model.merges[", r, "]' names '", piece,
                                                       "', which is not in model.vocab"));
      }
      *dst = it->second;
    }
    t->merges.push_back(mg);
  }
  return absl::OkStatus();
}

absl::Status ReadAddedTokens(const json& added_tokens, int64_t entries, const std::string& path, BpeModel* t,
                             PieceIds* ids) {
  for (const auto& a : added_tokens) {
    if (!a.contains("id") || !a["id"].is_number_integer() || TokenContent(a).empty()) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": field 'added_tokens' has a bad entry"));
    }
    RETURN_IF_ERROR(PutPiece(TokenContent(a), a["id"].get<int64_t>(), entries, path, t, ids));
    ASSIGN_OR_RETURN(const bool special, OptionalField(a, "special", false, path, "added_tokens[]"));
    t->kinds[a["id"].get<int64_t>()] = special ? BpeTokenKind::kSpecial : BpeTokenKind::kAdded;
  }
  return absl::OkStatus();
}

// BOS/EOS: tokenizer_config.json beside tokenizer.json, else the post_processor template.
absl::Status ReadBosEos(const json& post, const std::string& path, const PieceIds& ids, BpeModel* t) {
  if (post.is_object() && post.value("type", json()) == "TemplateProcessing" && post.contains("single") &&
      post["single"].is_array() && !post["single"].empty() && post["single"][0].contains("SpecialToken")) {
    const json& special = post["single"][0]["SpecialToken"];
    const std::string bos = special.is_object() ? TokenContent(special.value("id", json())) : "";
    if (auto it = ids.find(bos); it != ids.end()) {
      t->bos_id = it->second;
      t->add_bos_default = true;
    }
  }
  const std::string dir = path.substr(0, path.find_last_of('/') == std::string::npos ? 0 : path.find_last_of('/') + 1);
  if (auto cfg_text = ReadTextFile(dir + "tokenizer_config.json"); cfg_text.ok()) {
    json cfg = json::parse(*cfg_text, nullptr, false);
    if (cfg.is_discarded() || !cfg.is_object()) {
      return absl::InvalidArgumentError(absl::StrCat(dir, "tokenizer_config.json: not a valid JSON object"));
    }
    if (const std::string bos = TokenContent(cfg.value("bos_token", json())); !bos.empty()) {
      auto it = ids.find(bos);
      if (it == ids.end()) {
        return absl::InvalidArgumentError(absl::StrCat(dir, "tokenizer_config.json: field 'bos_token' '", bos, "' is not in the vocabulary"));
      }
      t->bos_id = it->second;
    }
    if (const std::string eos = TokenContent(cfg.value("eos_token", json())); !eos.empty()) {
      auto it = ids.find(eos);
      if (it == ids.end()) {
        return absl::InvalidArgumentError(absl::StrCat(dir, "tokenizer_config.json: field 'eos_token' '", eos, "' is not in the vocabulary"));
      }
      t->eos_ids = {it->second};
    }
    if (cfg.contains("add_bos_token") && cfg["add_bos_token"].is_boolean()) {
      t->add_bos_default = cfg["add_bos_token"].get<bool>() && t->bos_id >= 0;
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Tokenizer>> LoadJson(const std::string& path) {
  ASSIGN_OR_RETURN(std::string text, ReadTextFile(path));
  json j = json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": not a valid JSON object"));
  }
  BpeModel t;
  PieceIds ids;
  const json& model = j.value("model", json::object());
  RETURN_IF_ERROR(CheckBpeModel(model, path));
  const json& added_tokens = j.value("added_tokens", json::array());
  if (!added_tokens.is_array()) return absl::InvalidArgumentError(absl::StrCat(path, ": field 'added_tokens' must be a list"));
  const int64_t entries = static_cast<int64_t>(model["vocab"].size() + added_tokens.size());  // bounds the ids
  RETURN_IF_ERROR(ReadVocab(model["vocab"], entries, path, &t, &ids));
  RETURN_IF_ERROR(ReadMerges(model, ids, path, &t));
  ASSIGN_OR_RETURN(t.byte_fallback, OptionalField(model, "byte_fallback", false, path, "model"));
  ASSIGN_OR_RETURN(t.ignore_merges, OptionalField(model, "ignore_merges", false, path, "model"));
  // The model's unk_token is one of model.vocab's pieces: looked up before the added tokens join ids.
  if (const std::string unk = TokenContent(model.value("unk_token", json())); !unk.empty()) {
    if (auto it = ids.find(unk); it != ids.end()) t.unk_id = it->second;
  }
  RETURN_IF_ERROR(ReadAddedTokens(added_tokens, entries, path, &t, &ids));
  for (size_t i = 0; i < t.pieces.size(); ++i) {
    if (t.pieces[i].empty()) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": token id ", i, " is missing from the vocabulary"));
    }
  }
  RETURN_IF_ERROR(ParseSteps(j.value("normalizer", json()), path, "normalizer", &t.normalizers));
  RETURN_IF_ERROR(ParseSteps(j.value("pre_tokenizer", json()), path, "pre_tokenizer", &t.pre_tokenizers));
  RETURN_IF_ERROR(ReadBosEos(j.value("post_processor", json()), path, ids, &t));
  return MakeBpeTokenizer(std::move(t));
}

}  // namespace

std::unique_ptr<Tokenizer> MakeBpeTokenizer(BpeModel model) {
  return std::make_unique<BpeTokenizer>(std::move(model));
}

absl::StatusOr<std::unique_ptr<Tokenizer>> LoadHfTokenizer(const std::string& path) {
  return LoadJson(path);
}

}  // namespace specula

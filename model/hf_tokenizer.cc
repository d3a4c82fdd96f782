// HF tokenizer.json with a BPE model, in two forms:
//  - byte-level (Llama 3, Qwen2, SmolLM, GPT-2): pre-tokenizer splits, bytes mapped to printable
//    code points, merges by rank;
//  - sentencepiece-style (Llama 2): "▁" for spaces, merges on characters, byte fallback <0xXX>.
#include <unicode/normalizer2.h>
#include <unicode/unistr.h>

#include <unordered_map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "core/mapped_file.h"
#include "core/status_macros.h"
#include "model/pretokenize.h"
#include "model/tokenizer.h"
#include "nlohmann/json.hpp"

namespace specula {
namespace {

using json = nlohmann::json;
const std::string kSpaceMark = "\xE2\x96\x81";  // U+2581 "▁"

struct Step {  // one normalizer or pre-tokenizer step
  std::string type;
  std::string a, b;       // Prepend: a; Replace: a -> b; Metaspace: a = replacement
  SplitPattern pattern{};
  bool flag = false;      // ByteLevel: use_regex; Metaspace: split; Digits: individual
  bool prefix = false;    // ByteLevel: add_prefix_space; Metaspace: prepend
};

class HfTokenizer final : public Tokenizer {
 public:
  static absl::StatusOr<std::unique_ptr<Tokenizer>> Load(const std::string& path);

  int32_t vocab_size() const override { return static_cast<int32_t>(pieces_.size()); }

  std::vector<TokenId> Encode(std::string_view text, bool add_bos) const override {
    std::vector<TokenId> out;
    if (add_bos && bos_id_ >= 0) out.push_back(bos_id_);
    // Added tokens are matched first, longest at the leftmost position; the rest is tokenized.
    size_t i = 0, plain = 0;
    while (i < text.size()) {
      const AddedToken* hit = nullptr;
      for (const auto& a : added_) {
        if (text.compare(i, a.content.size(), a.content) == 0 &&
            (hit == nullptr || a.content.size() > hit->content.size())) {
          hit = &a;
        }
      }
      if (hit == nullptr) {
        ++i;
        continue;
      }
      EncodeSegment(text.substr(plain, i - plain), &out);
      out.push_back(hit->id);
      i += hit->content.size();
      plain = i;
    }
    EncodeSegment(text.substr(plain), &out);
    return out;
  }

  std::string DecodeToken(TokenId prev, TokenId id) const override {
    if (id < 0 || id >= vocab_size() || special_[id]) return "";
    const std::string& piece = pieces_[id];
    if (byte_level_) {
      std::string out;
      for (size_t i = 0; i < piece.size();) {
        const size_t len = Utf8Len(piece, i);
        auto it = unicode_to_byte_.find(piece.substr(i, len));
        if (it != unicode_to_byte_.end()) {
          out += static_cast<char>(it->second);
        } else {
          out += piece.substr(i, len);  // an added token's literal text
        }
        i += len;
      }
      return out;
    }
    if (piece.size() == 6 && piece.rfind("<0x", 0) == 0 && piece[5] == '>') {
      return std::string(1, static_cast<char>(std::stoi(piece.substr(3, 2), nullptr, 16)));
    }
    std::string out = absl::StrReplaceAll(piece, {{kSpaceMark, " "}});
    const bool at_start = prev < 0 || (prev < vocab_size() && special_[prev]);
    if (strip_leading_space_ && at_start && !out.empty() && out[0] == ' ') out.erase(0, 1);
    return out;
  }

 private:
  struct AddedToken {
    std::string content;
    TokenId id;
  };

  void EncodeSegment(std::string_view seg, std::vector<TokenId>* out) const {
    if (seg.empty()) return;
    std::string s(seg);
    for (const Step& n : normalizers_) {
      if (n.type == "Prepend") s = n.a + s;
      if (n.type == "Replace") s = absl::StrReplaceAll(s, {{n.a, n.b}});
      if (n.type == "NFC" || n.type == "NFKC") s = Normalize(s, n.type == "NFKC");
    }
    std::vector<std::string> words{s};
    for (const Step& p : pre_tokenizers_) {
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

  void Bpe(const std::string& word, std::vector<TokenId>* out) const {
    if (word.empty()) return;
    if (ignore_merges_) {
      if (auto it = ids_.find(word); it != ids_.end()) {
        out->push_back(it->second);
        return;
      }
    }
    std::vector<std::string> syms;
    for (size_t i = 0; i < word.size();) {
      const size_t len = Utf8Len(word, i);
      syms.push_back(word.substr(i, len));
      i += len;
    }
    std::string key;
    while (syms.size() > 1) {
      int32_t best_rank = INT32_MAX;
      size_t best = 0;
      for (size_t i = 0; i + 1 < syms.size(); ++i) {
        key = syms[i];
        key += '\x01';
        key += syms[i + 1];
        auto it = merge_rank_.find(key);
        if (it != merge_rank_.end() && it->second < best_rank) {
          best_rank = it->second;
          best = i;
        }
      }
      if (best_rank == INT32_MAX) break;
      syms[best] += syms[best + 1];
      syms.erase(syms.begin() + static_cast<ptrdiff_t>(best) + 1);
    }
    for (const std::string& s : syms) {
      if (auto it = ids_.find(s); it != ids_.end()) {
        out->push_back(it->second);
      } else if (byte_fallback_) {
        for (unsigned char ch : s) {
          char buf[8];
          std::snprintf(buf, sizeof(buf), "<0x%02X>", ch);
          auto b = ids_.find(buf);
          if (b != ids_.end()) {
            out->push_back(b->second);
          } else if (unk_id_ >= 0) {
            out->push_back(unk_id_);
          }
        }
      } else if (unk_id_ >= 0) {
        out->push_back(unk_id_);
      }
    }
  }

  std::vector<std::string> pieces_;  // [vocab] token text as stored in tokenizer.json
  std::vector<bool> special_;        // [vocab]
  std::unordered_map<std::string, TokenId> ids_;
  std::unordered_map<std::string, int32_t> merge_rank_;  // "a\x01b" -> rank
  std::vector<AddedToken> added_;
  std::vector<Step> normalizers_, pre_tokenizers_;
  std::vector<std::string> byte_to_unicode_;
  std::unordered_map<std::string, uint8_t> unicode_to_byte_;
  bool byte_level_ = false;
  bool byte_fallback_ = false;
  bool ignore_merges_ = false;
  bool strip_leading_space_ = false;
  TokenId unk_id_ = -1;

};

absl::Status Unsupported(const std::string& path, const std::string& field, const std::string& what) {
  return absl::InvalidArgumentError(
      absl::StrCat(path, ": field '", field, "': unsupported tokenizer type '", what, "'"));
}

// Flattens a normalizer or pre_tokenizer object (Sequence or single) into steps.
absl::Status ParseSteps(const json& j, const std::string& path, const std::string& field,
                        std::vector<Step>* out) {
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
  Step s;
  s.type = type;
  if (type == "Prepend") {
    s.a = j.value("prepend", "");
  } else if (type == "Replace") {
    const json& pat = j.value("pattern", json::object());
    if (!pat.contains("String")) return Unsupported(path, field + ".pattern", "Regex replace");
    s.a = pat["String"].get<std::string>();
    s.b = j.value("content", "");
  } else if (type == "NFC" || type == "NFKC") {
  } else if (type == "ByteLevel") {
    s.flag = j.value("use_regex", true);
    s.prefix = j.value("add_prefix_space", false);
  } else if (type == "Split") {
    const json& pat = j.value("pattern", json::object());
    if (!pat.contains("Regex") || !ParseSplitPattern(pat["Regex"].get<std::string>(), &s.pattern)) {
      return Unsupported(path, field + ".pattern", pat.dump());
    }
    if (j.value("behavior", "Isolated") != "Isolated" || j.value("invert", false)) {
      return Unsupported(path, field + ".behavior", j.value("behavior", ""));
    }
  } else if (type == "Digits") {
    if (!j.value("individual_digits", false)) return Unsupported(path, field, "Digits (grouped)");
  } else if (type == "Metaspace") {
    s.a = j.value("replacement", kSpaceMark);
    s.flag = j.value("split", true);
    s.prefix = j.value("prepend_scheme", "always") != "never" && j.value("add_prefix_space", true);
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

absl::StatusOr<std::unique_ptr<Tokenizer>> HfTokenizer::Load(const std::string& path) {
  ASSIGN_OR_RETURN(std::string text, ReadTextFile(path));
  json j = json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": not a valid JSON object"));
  }
  auto t = std::make_unique<HfTokenizer>();
  const json& model = j.value("model", json::object());
  const std::string type = model.value("type", "");
  if (type != "BPE") return Unsupported(path, "model.type", type.empty() ? "(missing)" : type);
  if (!model.contains("vocab") || !model["vocab"].is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": field 'model.vocab' is missing"));
  }
  if (!model.value("continuing_subword_prefix", json()).is_null() ||
      !model.value("end_of_word_suffix", json()).is_null()) {
    return Unsupported(path, "model.continuing_subword_prefix", "BPE with subword affixes");
  }
  auto put = [&](const std::string& piece, int64_t id) -> absl::Status {
    if (id < 0 || id > 10'000'000) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": token '", piece, "' has id ", id));
    }
    if (static_cast<size_t>(id) >= t->pieces_.size()) {
      t->pieces_.resize(id + 1);
      t->special_.resize(id + 1, false);
    }
    t->pieces_[id] = piece;
    t->ids_.emplace(piece, static_cast<TokenId>(id));
    return absl::OkStatus();
  };
  for (auto& [piece, id] : model["vocab"].items()) {
    if (!id.is_number_integer()) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": field 'model.vocab' entry '", piece, "' needs an integer id"));
    }
    RETURN_IF_ERROR(put(piece, id.get<int64_t>()));
  }
  const json& merges = model.value("merges", json::array());
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
    } else if (merges[r].is_array() && merges[r].size() == 2) {
      a = merges[r][0];
      b = merges[r][1];
    } else {
      return absl::InvalidArgumentError(absl::StrCat(path, ": field 'model.merges[", r, "]' is malformed"));
    }
    t->merge_rank_.emplace(a + '\x01' + b, static_cast<int32_t>(r));
  }
  t->byte_fallback_ = model.value("byte_fallback", false);
  t->ignore_merges_ = model.value("ignore_merges", false);
  if (const std::string unk = TokenContent(model.value("unk_token", json())); !unk.empty()) {
    if (auto it = t->ids_.find(unk); it != t->ids_.end()) t->unk_id_ = it->second;
  }
  for (const auto& a : j.value("added_tokens", json::array())) {
    if (!a.contains("id") || !a["id"].is_number_integer() || TokenContent(a).empty()) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": field 'added_tokens' has a bad entry"));
    }
    RETURN_IF_ERROR(put(TokenContent(a), a["id"].get<int64_t>()));
    t->added_.push_back({TokenContent(a), a["id"].get<TokenId>()});
    t->special_[a["id"].get<int64_t>()] = a.value("special", false);
  }
  for (size_t i = 0; i < t->pieces_.size(); ++i) {
    if (t->pieces_[i].empty()) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": token id ", i, " is missing from the vocabulary"));
    }
  }
  RETURN_IF_ERROR(ParseSteps(j.value("normalizer", json()), path, "normalizer", &t->normalizers_));
  RETURN_IF_ERROR(ParseSteps(j.value("pre_tokenizer", json()), path, "pre_tokenizer", &t->pre_tokenizers_));
  for (const Step& s : t->pre_tokenizers_) t->byte_level_ |= s.type == "ByteLevel";
  if (t->byte_level_) {
    t->byte_to_unicode_ = ByteToUnicode();
    for (int b = 0; b < 256; ++b) t->unicode_to_byte_[t->byte_to_unicode_[b]] = static_cast<uint8_t>(b);
  } else {
    // Sentencepiece-style: the prefix "▁" added on encode is stripped again on decode.
    for (const Step& s : t->normalizers_) t->strip_leading_space_ |= s.type == "Prepend";
    for (const Step& s : t->pre_tokenizers_) t->strip_leading_space_ |= s.type == "Metaspace" && s.prefix;
  }

  // BOS/EOS: tokenizer_config.json beside tokenizer.json, else the post_processor template.
  t->add_bos_default_ = false;
  const json& post = j.value("post_processor", json());
  if (post.is_object() && post.value("type", "") == "TemplateProcessing" && post.contains("single") &&
      post["single"].is_array() && !post["single"].empty() && post["single"][0].contains("SpecialToken")) {
    const std::string bos = post["single"][0]["SpecialToken"].value("id", "");
    if (auto it = t->ids_.find(bos); it != t->ids_.end()) {
      t->bos_id_ = it->second;
      t->add_bos_default_ = true;
    }
  }
  const std::string dir = path.substr(0, path.find_last_of('/') == std::string::npos ? 0 : path.find_last_of('/') + 1);
  if (auto cfg_text = ReadTextFile(dir + "tokenizer_config.json"); cfg_text.ok()) {
    json cfg = json::parse(*cfg_text, nullptr, false);
    if (cfg.is_discarded() || !cfg.is_object()) {
      return absl::InvalidArgumentError(absl::StrCat(dir, "tokenizer_config.json: not a valid JSON object"));
    }
    if (const std::string bos = TokenContent(cfg.value("bos_token", json())); !bos.empty()) {
      auto it = t->ids_.find(bos);
      if (it == t->ids_.end()) {
        return absl::InvalidArgumentError(absl::StrCat(dir, "tokenizer_config.json: field 'bos_token' '", bos, "' is not in the vocabulary"));
      }
      t->bos_id_ = it->second;
    }
    if (const std::string eos = TokenContent(cfg.value("eos_token", json())); !eos.empty()) {
      auto it = t->ids_.find(eos);
      if (it == t->ids_.end()) {
        return absl::InvalidArgumentError(absl::StrCat(dir, "tokenizer_config.json: field 'eos_token' '", eos, "' is not in the vocabulary"));
      }
      t->eos_ids_ = {it->second};
    }
    if (cfg.contains("add_bos_token") && cfg["add_bos_token"].is_boolean()) {
      t->add_bos_default_ = cfg["add_bos_token"].get<bool>() && t->bos_id_ >= 0;
    }
  }
  return std::unique_ptr<Tokenizer>(std::move(t));
}

}  // namespace

absl::StatusOr<std::unique_ptr<Tokenizer>> LoadHfTokenizer(const std::string& path) {
  return HfTokenizer::Load(path);
}

}  // namespace specula

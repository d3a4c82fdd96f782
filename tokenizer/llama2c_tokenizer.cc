// The llama2.c tokenizer: sentencepiece-style BPE driven by piece scores, with a dummy-prefix
// space and byte fallback (<0x00>..<0xFF> at ids 3..258).
#include <sys/stat.h>

#include <cstring>
#include <fstream>
#include <queue>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "core/mapped_file.h"
#include "core/status_macros.h"
#include "tokenizer/tokenizer.h"

namespace specula {

std::string Tokenizer::Decode(absl::Span<const TokenId> ids) const {
  std::string out;
  TokenId prev = -1;
  for (TokenId id : ids) {
    out += DecodeToken(prev, id);
    prev = id;
  }
  return out;
}

namespace {

constexpr TokenId kBos = 1;
constexpr TokenId kEos = 2;
constexpr TokenId kFirstByteToken = 3;

class Llama2cTokenizer final : public Tokenizer {
 public:
  Llama2cTokenizer(std::vector<std::string> pieces, std::vector<float> scores)
      : pieces_(std::move(pieces)), scores_(std::move(scores)) {
    bos_id_ = kBos;
    eos_ids_ = {kEos};
    // Keys are views of pieces_, whose strings stay in place once moved in. A flat map reserved
    // once: the node map's 32,000 allocations took ~2 ms of a 40 ms `generate --max-tokens 1`.
    ids_.reserve(pieces_.size());
    for (size_t i = 0; i < pieces_.size(); ++i) ids_.emplace(pieces_[i], static_cast<TokenId>(i));
    byte_tokens_ = pieces_.size() >= 259 && pieces_[kFirstByteToken] == "<0x00>";
  }

  int32_t vocab_size() const override { return static_cast<int32_t>(pieces_.size()); }

  std::vector<TokenId> Encode(std::string_view text, bool add_bos) const override {
    std::vector<TokenId> out;
    if (add_bos) out.push_back(kBos);
    std::vector<TokenId> syms;
    if (!text.empty()) {
      auto space = ids_.find(" ");
      if (space != ids_.end()) syms.push_back(space->second);  // sentencepiece's dummy prefix
    }
    // One symbol per UTF-8 code point (a lead byte and up to 3 continuation bytes); unknown ones
    // fall back to one token per byte. The grouping is run.c's, whatever the first byte: Utf8Len
    // (tokenizer/utf8.h) would split invalid sequences differently.
    for (size_t i = 0; i < text.size();) {
      size_t j = i + 1;
      while (j < text.size() && j - i < 4 && (static_cast<uint8_t>(text[j]) & 0xC0) == 0x80) ++j;
      auto it = ids_.find(text.substr(i, j - i));
      if (it != ids_.end()) {
        syms.push_back(it->second);
      } else {
        for (size_t b = i; b < j; ++b) syms.push_back(ByteToken(static_cast<uint8_t>(text[b])));
      }
      i = j;
    }
    // Merge the adjacent pair whose merged piece scores best (the leftmost of equal scores, and
    // above -1e30) until none is in the vocabulary. A priority queue over a linked list of the
    // symbols, as llama.cpp's SPM tokenizer: O(n log n), where rescanning every pair for each merge
    // took seconds for a few KB of text.
    const int32_t n = static_cast<int32_t>(syms.size());
    std::vector<int32_t> prev(n), next(n);  // [n] the live neighbours, -1 at the ends
    std::vector<uint32_t> version(n, 0);    // [n] bumped when a symbol merges: its queued pairs are stale
    for (int32_t i = 0; i < n; ++i) {
      prev[i] = i - 1;
      next[i] = i + 1 < n ? i + 1 : -1;
    }
    struct Candidate {
      float score;
      int32_t left, right;
      uint32_t left_version, right_version;
      TokenId merged;
    };
    auto later = [](const Candidate& a, const Candidate& b) {
      return a.score != b.score ? a.score < b.score : a.left > b.left;
    };
    std::priority_queue<Candidate, std::vector<Candidate>, decltype(later)> queue(later);
    std::string merged;
    auto consider = [&](int32_t l) {
      const int32_t r = l < 0 ? -1 : next[l];
      if (r < 0) return;
      merged = pieces_[syms[l]];
      merged += pieces_[syms[r]];
      auto it = ids_.find(merged);
      if (it != ids_.end() && scores_[it->second] > -1e30f) {
        queue.push({scores_[it->second], l, r, version[l], version[r], it->second});
      }
    };
    for (int32_t i = 0; i + 1 < n; ++i) consider(i);
    while (!queue.empty()) {
      const Candidate c = queue.top();
      queue.pop();
      if (version[c.left] != c.left_version || version[c.right] != c.right_version || next[c.left] != c.right) continue;
      syms[c.left] = c.merged;
      ++version[c.left];
      ++version[c.right];
      next[c.left] = next[c.right];
      if (next[c.left] >= 0) prev[next[c.left]] = c.left;
      consider(prev[c.left]);
      consider(c.left);
    }
    for (int32_t i = n > 0 ? 0 : -1; i >= 0; i = next[i]) out.push_back(syms[i]);
    return out;
  }

  std::string DecodeToken(TokenId prev, TokenId id) const override {
    std::string out = TokenBytes(id);
    const bool byte = byte_tokens_ && id >= kFirstByteToken && id < kFirstByteToken + 256;
    // The dummy-prefix space is dropped at the start of the text.
    if (!byte && (prev == kBos || prev == -1) && !out.empty() && out[0] == ' ') out.erase(0, 1);
    return out;
  }

  std::string TokenBytes(TokenId id) const override {
    if (id < 0 || id >= vocab_size() || id == kBos || id == kEos || id == 0) return "";
    if (byte_tokens_ && id >= kFirstByteToken && id < kFirstByteToken + 256) {
      return std::string(1, static_cast<char>(id - kFirstByteToken));
    }
    return pieces_[id];
  }

  VocabKind vocab_kind() const override { return byte_tokens_ ? VocabKind::kByteFallback : VocabKind::kRaw; }

 private:
  TokenId ByteToken(uint8_t b) const {
    return byte_tokens_ ? kFirstByteToken + b : 0;  // 0 is <unk>
  }

  std::vector<std::string> pieces_;
  std::vector<float> scores_;
  absl::flat_hash_map<std::string_view, TokenId> ids_;  // the first id of each piece
  bool byte_tokens_ = false;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Tokenizer>> LoadLlama2cTokenizer(const std::string& path,
                                                                int32_t vocab_size) {
  ASSIGN_OR_RETURN(MappedFile f, MappedFile::Open(path));
  auto bad = [&](const std::string& why) {
    return absl::DataLossError(absl::StrCat(path, ": bad llama2.c tokenizer: ", why));
  };
  if (vocab_size < 3) {  // the fixed ids: <unk> 0, <s> 1 (prepended as BOS) and </s> 2
    return bad(absl::StrCat("the model's vocab_size ", vocab_size, " cannot hold <unk>, <s> and </s> (ids 0 to 2)"));
  }
  size_t off = 0;
  auto read = [&](void* dst, size_t n) {
    if (off + n > f.size()) return false;
    std::memcpy(dst, f.data() + off, n);
    off += n;
    return true;
  };
  int32_t max_len = 0;
  if (!read(&max_len, 4)) return bad("file is shorter than its 4-byte header");
  if (max_len <= 0 || max_len > 4096) return bad(absl::StrCat("max_token_length ", max_len));
  // Each token takes at least 8 bytes (score and length): a vocab_size the file cannot hold is
  // refused before its tables are allocated.
  if (static_cast<uint64_t>(vocab_size) > (f.size() - 4) / 8) {
    return bad(absl::StrCat("truncated: its ", f.size(), " bytes cannot hold the model's ", vocab_size,
                            " tokens (does the tokenizer match the model?)"));
  }
  std::vector<std::string> pieces(vocab_size);
  std::vector<float> scores(vocab_size);
  for (int32_t i = 0; i < vocab_size; ++i) {
    int32_t len = 0;
    if (!read(&scores[i], 4) || !read(&len, 4)) {
      return bad(absl::StrCat("truncated at token ", i, " of ", vocab_size,
                              " (does the tokenizer match the model?)"));
    }
    if (len < 0 || len > max_len) {
      return bad(absl::StrCat("token ", i, " has length ", len, " (max_token_length ", max_len, ")"));
    }
    pieces[i].resize(len);
    if (!read(pieces[i].data(), len)) return bad(absl::StrCat("truncated in token ", i));
  }
  if (off != f.size()) {
    return bad(absl::StrCat(f.size() - off, " bytes left after ", vocab_size,
                            " tokens: the tokenizer does not match the model's vocab_size"));
  }
  return std::unique_ptr<Tokenizer>(new Llama2cTokenizer(std::move(pieces), std::move(scores)));
}

absl::StatusOr<std::unique_ptr<Tokenizer>> LoadTokenizer(const std::string& path,
                                                         int32_t vocab_size) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) {
    return absl::NotFoundError(absl::StrCat(path, ": no such tokenizer file or directory"));
  }
  if (S_ISDIR(st.st_mode)) return LoadHfTokenizer(path + "/tokenizer.json");
  if (path.size() >= 5 && path.substr(path.size() - 5) == ".json") return LoadHfTokenizer(path);
  if (path.size() >= 5 && path.substr(path.size() - 5) == ".gguf") return LoadGgufTokenizer(path);
  // A GGUF file by another name: its first bytes are the magic "GGUF".
  char magic[4] = {};
  if (std::ifstream in(path, std::ios::binary); in.read(magic, sizeof(magic)) && std::memcmp(magic, "GGUF", 4) == 0) {
    return LoadGgufTokenizer(path);
  }
  return LoadLlama2cTokenizer(path, vocab_size);
}

}  // namespace specula

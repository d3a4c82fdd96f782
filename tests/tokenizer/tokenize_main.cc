// Encodes texts with a Specula tokenizer, for the comparisons against HF tokenizers in
// tests/tokenizer/python/test_gguf_tokenizer.py.
//
//   tokenize_main TOKENIZER_PATH < texts.jsonl > ids.jsonl
//
// TOKENIZER_PATH is anything LoadTokenizer takes (a .gguf file, a tokenizer.json). Each input line
// is a JSON string; each output line is {"ids": [...], "round_trip": bool}: the ids without BOS, and
// whether decoding them gives the text back.
#include <iostream>
#include <string>

#include "nlohmann/json.hpp"
#include "tokenizer/tokenizer.h"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::cerr << "usage: tokenize_main TOKENIZER_PATH < texts.jsonl\n";
    return 2;
  }
  auto tok = specula::LoadTokenizer(argv[1], /*vocab_size=*/0);
  if (!tok.ok()) {
    std::cerr << tok.status().message() << "\n";
    return 1;
  }
  std::string line;
  for (int n = 1; std::getline(std::cin, line); ++n) {
    const nlohmann::json text = nlohmann::json::parse(line, nullptr, false);
    if (!text.is_string()) {
      std::cerr << "stdin line " << n << ": not a JSON string\n";
      return 2;
    }
    const std::string s = text.get<std::string>();
    const std::vector<specula::TokenId> ids = (*tok)->Encode(s, /*add_bos=*/false);
    std::cout << nlohmann::json{{"ids", ids}, {"round_trip", (*tok)->Decode(ids) == s}}.dump() << "\n";
  }
  return 0;
}

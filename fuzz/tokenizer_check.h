// What the tokenizer targets do with a tokenizer their input produced: encode `text` with and
// without BOS (every id must be inside the vocabulary), decode it, and decode the first 300 ids one
// by one, -1 and vocab_size included.
#pragma once

#include <vector>

#include "tokenizer/tokenizer.h"

namespace specula::fuzz {

inline void ExerciseTokenizer(const Tokenizer& t, const char* text) {
  for (bool bos : {false, true}) {
    const std::vector<TokenId> ids = t.Encode(text, bos);
    for (TokenId id : ids) {
      if (id < 0 || id >= t.vocab_size()) __builtin_trap();  // Encode made an id outside the vocabulary
    }
    (void)t.Decode(ids);
  }
}

inline void DecodeEachToken(const Tokenizer& t) {
  for (TokenId id = -1; id <= t.vocab_size() && id < 300; ++id) (void)t.DecodeToken(id - 1, id);
}

}  // namespace specula::fuzz

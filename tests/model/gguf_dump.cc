// gguf_dump FILE OUTDIR [NAME...]: writes each named tensor (all when none is named) dequantized by
// core/quant.h to OUTDIR/NAME.f32, for tests/model/python/test_gguf_dequant.py to compare with the
// gguf package bit for bit.
#include <cstdio>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "core/gguf.h"

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: gguf_dump FILE OUTDIR [NAME...]\n");
    return 2;
  }
  auto f = specula::GgufFile::Open(argv[1]);
  if (!f.ok()) {
    std::fprintf(stderr, "%s\n", std::string(f.status().message()).c_str());
    return 1;
  }
  const std::set<std::string> names(argv + 3, argv + argc);
  for (const specula::GgufTensor& t : f->tensors()) {
    if (!names.empty() && names.count(t.name) == 0) continue;
    std::vector<float> out(static_cast<size_t>(t.num_elements()));  // [num_elements]
    specula::DequantizeRow(t.type, t.data, t.num_elements(), out.data());
    std::ofstream(std::string(argv[2]) + "/" + t.name + ".f32", std::ios::binary)
        .write(reinterpret_cast<const char*>(out.data()), static_cast<std::streamsize>(out.size() * 4));
    std::printf("%s %s\n", t.name.c_str(), specula::QuantTypeName(t.type));
  }
  return 0;
}

// Experiment specs (experiments/spec.cc ParseSpec): textproto parsing of experiment.proto with
// file:line:column errors (the Locator walks the parser's location tree and the text), every
// field's validation, the files a spec names (resolved against experiments/specs/, so the example
// specs' relative paths and their prompts.jsonl are found), then the sweep's points and run.json's
// JSON of an accepted spec.
#include <cstddef>
#include <cstdint>
#include <string>

#include "experiments/spec.h"
#include "fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string path = specula::fuzz::SourcePath("experiments/specs/fuzz.textproto");
  const std::string text(reinterpret_cast<const char*>(data), size);
  auto spec = specula::experiments::ParseSpec(path, text);
  if (!spec.ok()) return 0;
  for (const specula::experiments::Point& p : specula::experiments::ExpandSweep(spec->spec)) {
    (void)p.Json();
    (void)p.Label();
  }
  (void)specula::experiments::SpecJson(spec->spec);
  return 0;
}

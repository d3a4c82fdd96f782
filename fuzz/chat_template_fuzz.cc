// Chat templates (chat/chat_template*.cc): the input is a Jinja template, parsed (lexer, parser,
// the supported subset) and rendered with a fixed small conversation, with and without the
// generation prompt. When the input holds a NUL byte, the template is what comes before it and
// what follows is a JSON object of variables rendered through RenderJson (messages with tool
// calls, tools, documents, ...).
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "chat/chat_template.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string input(reinterpret_cast<const char*>(data), size);
  const size_t nul = input.find('\0');
  const std::string source = input.substr(0, nul);
  auto t = specula::ChatTemplate::Parse(source);
  if (!t.ok()) return 0;
  t->set_fixed_time(1700000000);  // strftime_now() without the clock
  if (nul != std::string::npos) {
    (void)t->RenderJson(input.substr(nul + 1));
    return 0;
  }
  static const std::vector<specula::ChatMessage> messages = {
      {"system", "You are helpful."}, {"user", "Hi <b>there</b> {{ x }} été"}, {"assistant", "Hello!"}, {"user", "2+2?"}};
  for (bool gen : {false, true}) (void)t->Render(messages, gen, "<s>", "</s>", {{"date_string", "26 Jul 2024"}});
  return 0;
}

#include "serving/model_bundle.h"

#include <malloc.h>

#include <cstdio>
#include <regex>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"

namespace specula {

ModelBundle::~ModelBundle() {
  if (owner == nullptr) return;
  owner.reset();
  // The weights and KV pool of a replaced model: freed pages go back to the system now, so that the
  // process's size after a reload is that of a fresh one on the new model.
  malloc_trim(0);
  std::fprintf(stderr, "[specula] freed %s (version %s)\n", source.c_str(), version.c_str());
}

void SetChat(absl::StatusOr<ChatSource> chat, ModelBundle* bundle) {
  bundle->chat_template.reset();
  if (chat.ok()) {
    absl::StatusOr<ChatTemplate> t = ChatTemplate::Parse(chat->template_text);
    if (t.ok()) {
      bundle->chat_template = *std::move(t);
    } else {
      chat = absl::InvalidArgumentError(absl::StrCat(chat->origin, ": ", t.status().message()));
      std::fprintf(stderr, "[specula] chat disabled: %s\n", std::string(chat.status().message()).c_str());
    }
  }
  bundle->chat_source = std::move(chat);
}

absl::Status CheckChatVocabulary(const ModelBundle& b, const std::string& field) {
  if (!b.chat_template.has_value() || !b.chat_source.ok()) return absl::OkStatus();
  const ChatSource& src = *b.chat_source;
  const std::vector<ChatMessage> probe = {{"system", "s"}, {"user", "u"}, {"assistant", "a"}, {"user", "v"}};
  absl::StatusOr<std::string> text = b.chat_template->Render(probe, true, src.bos_token, src.eos_token);
  if (!text.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": ", src.origin, " does not render a conversation: ",
                                                   text.status().message()));
  }
  std::set<std::string> markers;
  static const std::regex kMarker(R"(<\|[^<>|\s]{1,64}\|>)");
  for (auto it = std::sregex_iterator(text->begin(), text->end(), kMarker); it != std::sregex_iterator(); ++it) {
    markers.insert(it->str());
  }
  for (const std::string& s : {src.bos_token, src.eos_token}) {
    if (!s.empty() && text->find(s) != std::string::npos) markers.insert(s);
  }
  for (const std::string& m : markers) {
    const std::vector<TokenId> ids = b.tokenizer->Encode(m, /*add_bos=*/false);
    if (ids.size() != 1) {
      return absl::InvalidArgumentError(absl::StrCat(field, ": ", src.origin, " prints '", m, "', which ", b.source,
                                                     "'s vocabulary splits into ", ids.size(),
                                                     " tokens: the template is for another vocabulary"));
    }
  }
  return absl::OkStatus();
}

}  // namespace specula

// Chat templates: values as Python sees them. Printing (str, repr, float repr), transformers'
// tojson (json.dumps with ensure_ascii=False, insertion order), and the str functions behind the
// filters and methods (strip, split, replace, case mapping with ICU's full mappings, as CPython's
// str methods use the full Unicode mappings too).
#include <unicode/uchar.h>
#include <unicode/ustring.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "chat/chat_template_internal.h"
#include "core/status_macros.h"
#include "tokenizer/utf8.h"

namespace specula::jinja {

Value Value::Undefined(std::string why) {
  Value v;
  v.s = std::move(why);
  return v;
}
Value Value::None() {
  Value v;
  v.kind = Kind::kNone;
  return v;
}
Value Value::Bool(bool b) {
  Value v;
  v.kind = Kind::kBool;
  v.b = b;
  return v;
}
Value Value::Int(int64_t i) {
  Value v;
  v.kind = Kind::kInt;
  v.i = i;
  return v;
}
Value Value::Float(double f) {
  Value v;
  v.kind = Kind::kFloat;
  v.f = f;
  return v;
}
Value Value::Str(std::string s) {
  Value v;
  v.kind = Kind::kString;
  v.s = std::move(s);
  return v;
}
Value Value::MakeList(List items, Seq seq) {
  Value v;
  v.kind = Kind::kList;
  v.seq = seq;
  for (const Value& x : items) v.depth = std::max(v.depth, x.depth);
  v.depth = std::min(255, v.depth + 1);
  v.list = std::make_shared<const List>(std::move(items));
  return v;
}
Value Value::MakeDict(Dict items) {
  Value v;
  v.kind = Kind::kDict;
  for (const auto& [k, x] : items) v.depth = std::max(v.depth, x.depth);
  v.depth = std::min(255, v.depth + 1);
  v.dict = std::make_shared<const Dict>(std::move(items));
  return v;
}
Value Value::Callable(std::string name, std::shared_ptr<const Value> self) {
  Value v;
  v.kind = Kind::kCallable;
  v.s = std::move(name);
  v.self = std::move(self);
  return v;
}
const Value* Find(const Dict& d, std::string_view key) {
  for (const auto& [k, v] : d) {
    if (k == key) return &v;
  }
  return nullptr;
}

namespace {

void Put(char32_t cp, std::string* out) {
  if (cp >= 0xDC80 && cp <= 0xDCFF) {
    *out += static_cast<char>(cp - 0xDC00);  // an escaped invalid byte
  } else {
    AppendUtf8(cp, out);
  }
}

// ICU full case mapping of a whole string (Python's upper()/lower() use the same full mappings).
enum class Case { kUpper, kLower, kTitleFirst };
std::u32string MapCase(std::u32string_view s, Case mode) {
  std::u16string in;
  for (char32_t cp : s) {
    if (cp >= 0x10000) {
      in += static_cast<char16_t>(0xD800 + ((cp - 0x10000) >> 10));
      in += static_cast<char16_t>(0xDC00 + ((cp - 0x10000) & 0x3FF));
    } else {
      in += static_cast<char16_t>(cp);
    }
  }
  std::u16string out(in.size() * 3 + 4, u'\0');
  for (int attempt = 0; attempt < 2; ++attempt) {
    UErrorCode err = U_ZERO_ERROR;
    const auto* src = reinterpret_cast<const UChar*>(in.data());
    auto* dst = reinterpret_cast<UChar*>(out.data());
    const auto cap = static_cast<int32_t>(out.size());
    const auto len = static_cast<int32_t>(in.size());
    int32_t n = mode == Case::kUpper   ? u_strToUpper(dst, cap, src, len, "", &err)
                : mode == Case::kLower ? u_strToLower(dst, cap, src, len, "", &err)
                                       : u_strToTitle(dst, cap, src, len, nullptr, "", &err);
    if (err == U_BUFFER_OVERFLOW_ERROR) {
      out.assign(n, u'\0');
      continue;
    }
    out.resize(U_SUCCESS(err) ? n : 0);
    break;
  }
  std::u32string result;
  for (size_t k = 0; k < out.size(); ++k) {
    char32_t c = out[k];
    if (c >= 0xD800 && c < 0xDC00 && k + 1 < out.size() && out[k + 1] >= 0xDC00 && out[k + 1] < 0xE000) {
      c = 0x10000 + ((c - 0xD800) << 10) + (out[++k] - 0xDC00);
    }
    result += c;
  }
  return result;
}

// Python's float repr: the shortest round-trip digits, fixed notation for 1e-4 <= |x| < 1e16.
std::string FloatRepr(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  char buf[64];
  const auto r = std::to_chars(buf, buf + sizeof(buf), d, std::chars_format::scientific);
  std::string_view sci(buf, r.ptr - buf);
  std::string sign;
  if (sci[0] == '-') {
    sign = "-";
    sci.remove_prefix(1);
  }
  const size_t e_pos = sci.find('e');
  std::string digits;
  for (char c : sci.substr(0, e_pos)) {
    if (c != '.') digits += c;
  }
  const int exp = std::atoi(std::string(sci.substr(e_pos + 1)).c_str());
  const int decpt = exp + 1;
  const int n = static_cast<int>(digits.size());
  if (decpt > -4 && decpt <= 16) {
    if (decpt <= 0) return sign + "0." + std::string(-decpt, '0') + digits;
    if (decpt >= n) return sign + digits + std::string(decpt - n, '0') + ".0";
    return sign + digits.substr(0, decpt) + "." + digits.substr(decpt);
  }
  std::string out = sign + digits.substr(0, 1);
  if (n > 1) out += "." + digits.substr(1);
  const int e = decpt - 1;
  absl::StrAppend(&out, "e", e < 0 ? "-" : "+", std::abs(e) < 10 ? "0" : "", std::abs(e));
  return out;
}

std::string StrRepr(std::string_view s) {
  const std::u32string cps = Decode(s);
  const bool has_single = cps.find(U'\'') != std::u32string::npos;
  const bool has_double = cps.find(U'"') != std::u32string::npos;
  const char32_t quote = has_single && !has_double ? U'"' : U'\'';
  std::string out(1, static_cast<char>(quote));
  for (char32_t c : cps) {
    if (c == quote || c == U'\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c == U'\t') {
      out += "\\t";
    } else if (c == U'\n') {
      out += "\\n";
    } else if (c == U'\r') {
      out += "\\r";
    } else if (c < 0x20 || c == 0x7F) {
      absl::StrAppend(&out, "\\x", absl::Hex(c, absl::kZeroPad2));
    } else if (c < 0x7F) {
      out += static_cast<char>(c);
    } else {
      const int8_t t = u_charType(static_cast<UChar32>(c));
      const bool printable = t != U_CONTROL_CHAR && t != U_FORMAT_CHAR && t != U_SURROGATE &&
                             t != U_PRIVATE_USE_CHAR && t != U_UNASSIGNED &&
                             t != U_LINE_SEPARATOR && t != U_PARAGRAPH_SEPARATOR &&
                             t != U_SPACE_SEPARATOR;
      if (printable) {
        Put(c, &out);
      } else if (c <= 0xFF) {
        absl::StrAppend(&out, "\\x", absl::Hex(c, absl::kZeroPad2));
      } else if (c <= 0xFFFF) {
        absl::StrAppend(&out, "\\u", absl::Hex(c, absl::kZeroPad4));
      } else {
        absl::StrAppend(&out, "\\U", absl::Hex(c, absl::kZeroPad8));
      }
    }
  }
  out += static_cast<char>(quote);
  return out;
}

std::string JsonString(std::string_view s, bool ensure_ascii) {
  std::string out = "\"";
  for (char32_t c : Decode(s)) {
    switch (c) {
      case U'"': out += "\\\""; break;
      case U'\\': out += "\\\\"; break;
      case U'\n': out += "\\n"; break;
      case U'\r': out += "\\r"; break;
      case U'\t': out += "\\t"; break;
      case U'\b': out += "\\b"; break;
      case U'\f': out += "\\f"; break;
      default:
        if (c < 0x20 || (ensure_ascii && c >= 0x7F)) {
          if (c >= 0x10000) {
            absl::StrAppend(&out, "\\u", absl::Hex(0xD800 + ((c - 0x10000) >> 10), absl::kZeroPad4),
                            "\\u", absl::Hex(0xDC00 + ((c - 0x10000) & 0x3FF), absl::kZeroPad4));
          } else {
            absl::StrAppend(&out, "\\u", absl::Hex(c, absl::kZeroPad4));
          }
        } else {
          Put(c, &out);
        }
    }
  }
  return out + "\"";
}

}  // namespace

// ---- Python's str ---------------------------------------------------------------------------

// Code points; an invalid byte b becomes U+DC00+b (Python's surrogateescape) so nothing is lost.
std::u32string Decode(std::string_view s) {
  std::u32string out;
  for (size_t k = 0, n; k < s.size(); k += n) {
    const int32_t cp = DecodeUtf8(s, k, &n);
    out += static_cast<char32_t>(cp >= 0 ? cp : 0xDC00 + static_cast<unsigned char>(s[k]));
  }
  return out;
}

std::string Encode(std::u32string_view s) {
  std::string out;
  for (char32_t cp : s) Put(cp, &out);
  return out;
}

// Python's str.isspace().
bool IsSpace(char32_t c) {
  return c == ' ' || (c >= 9 && c <= 13) || (c >= 0x1C && c <= 0x1F) || c == 0x85 || c == 0xA0 ||
         c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 ||
         c == 0x202F || c == 0x205F || c == 0x3000;
}

std::string Upper(std::string_view s) { return Encode(MapCase(Decode(s), Case::kUpper)); }

std::string Lower(std::string_view s) { return Encode(MapCase(Decode(s), Case::kLower)); }

// Python's str.capitalize(): the first character title-cased, the rest lower-cased.
std::string Capitalize(std::string_view s) {
  const std::u32string cps = Decode(s);
  if (cps.empty()) return "";
  return Encode(MapCase(cps.substr(0, 1), Case::kTitleFirst)) +
         Encode(MapCase(std::u32string_view(cps).substr(1), Case::kLower));
}

// Python's str.title(): title-case after an uncased character, lower-case after a cased one.
std::string PyTitle(std::string_view s) {
  std::string out;
  bool prev_cased = false;
  for (char32_t c : Decode(s)) {
    const std::u32string one(1, c);
    out += Encode(MapCase(one, prev_cased ? Case::kLower : Case::kTitleFirst));
    prev_cased = u_hasBinaryProperty(static_cast<UChar32>(c), UCHAR_CASED);
  }
  return out;
}

// jinja2's title filter: each word after [-\s({[<] gets an upper-case first letter.
std::string JinjaTitle(std::string_view s) {
  std::string out;
  bool word_start = true;
  for (char32_t c : Decode(s)) {
    const bool sep = IsSpace(c) || c == '-' || c == '(' || c == '{' || c == '[' || c == '<';
    out += Encode(MapCase(std::u32string(1, c), word_start ? Case::kUpper : Case::kLower));
    word_start = sep;
  }
  return out;
}

// Python's islower()/isupper(): some cased character, and none of the other case.
bool IsCase(std::string_view s, bool lower) {
  bool cased = false;
  for (char32_t c : Decode(s)) {
    const auto u = static_cast<UChar32>(c);
    const bool is_lower = u_isULowercase(u);
    const bool is_upper = u_isUUppercase(u) || u_istitle(u);
    if (lower ? is_upper : (is_lower || u_istitle(u))) return false;
    if (lower ? is_lower : u_isUUppercase(u)) cased = true;
  }
  return cased;
}

std::string Strip(std::string_view s, const Value* chars, bool left, bool right) {
  const std::u32string cps = Decode(s);
  const bool whitespace = chars == nullptr || !chars->Is(Value::Kind::kString);
  const std::u32string set = whitespace ? U"" : Decode(chars->s);  // strip('') strips nothing
  auto strip = [&](char32_t c) { return whitespace ? IsSpace(c) : set.find(c) != std::u32string::npos; };
  size_t b = 0, e = cps.size();
  while (left && b < e && strip(cps[b])) ++b;
  while (right && e > b && strip(cps[e - 1])) --e;
  return Encode(std::u32string_view(cps).substr(b, e - b));
}

List Split(std::string_view s, const Value& sep, int64_t maxsplit) {
  List out;
  if (maxsplit < 0) maxsplit = INT64_MAX;
  if (!sep.Is(Value::Kind::kString)) {  // runs of whitespace, no empty pieces
    const std::u32string cps = Decode(s);
    size_t i = 0;
    for (; maxsplit > 0; --maxsplit) {
      while (i < cps.size() && IsSpace(cps[i])) ++i;
      if (i == cps.size()) break;
      const size_t j = i;
      while (i < cps.size() && !IsSpace(cps[i])) ++i;
      out.push_back(Value::Str(Encode(std::u32string_view(cps).substr(j, i - j))));
    }
    while (i < cps.size() && IsSpace(cps[i])) ++i;
    if (i < cps.size()) out.push_back(Value::Str(Encode(std::u32string_view(cps).substr(i))));
    return out;
  }
  size_t start = 0;
  for (; maxsplit > 0; --maxsplit) {
    const size_t at = s.find(sep.s, start);
    if (at == std::string_view::npos) break;
    out.push_back(Value::Str(std::string(s.substr(start, at - start))));
    start = at + sep.s.size();
  }
  out.push_back(Value::Str(std::string(s.substr(start))));
  return out;
}

std::string Replace(std::string_view s, std::string_view old, std::string_view with, int64_t count) {
  if (count < 0) count = INT64_MAX;
  std::string out;
  if (old.empty()) {  // Python inserts `with` around every character
    const std::u32string cps = Decode(s);
    for (size_t k = 0; k <= cps.size(); ++k) {
      if (count-- > 0) out.append(with.data(), with.size());
      if (k < cps.size()) Put(cps[k], &out);
    }
    return out;
  }
  size_t start = 0;
  for (; count > 0; --count) {
    const size_t at = s.find(old, start);
    if (at == std::string_view::npos) break;
    absl::StrAppend(&out, std::string(s.substr(start, at - start)), std::string(with));
    start = at + old.size();
  }
  out.append(s.data() + start, s.size() - start);
  return out;
}

// ---- Printing and JSON ----------------------------------------------------------------------

absl::Status ToJson(const Value& v, const JsonStyle& st, int level, std::string* out) {
  switch (v.kind) {
    case Value::Kind::kNone: *out += "null"; return absl::OkStatus();
    case Value::Kind::kBool: *out += v.b ? "true" : "false"; return absl::OkStatus();
    case Value::Kind::kInt: absl::StrAppend(out, v.i); return absl::OkStatus();
    case Value::Kind::kFloat:
      *out += std::isnan(v.f) ? "NaN" : std::isinf(v.f) ? (v.f > 0 ? "Infinity" : "-Infinity") : FloatRepr(v.f);
      return absl::OkStatus();
    case Value::Kind::kString: *out += JsonString(v.s, st.ensure_ascii); return absl::OkStatus();
    case Value::Kind::kList: case Value::Kind::kDict: {
      if (v.Is(Value::Kind::kList) && v.seq == Value::Seq::kGenerator) break;
      const bool is_list = v.Is(Value::Kind::kList);
      if (is_list ? v.list->empty() : v.dict->empty()) {
        *out += is_list ? "[]" : "{}";
        return absl::OkStatus();
      }
      std::string newline;
      if (st.indent) {
        newline = "\n";
        for (int k = 0; k <= level; ++k) newline += *st.indent;
      }
      *out += is_list ? "[" : "{";
      *out += newline;
      const std::string sep = st.item_sep + newline;
      if (is_list) {
        for (size_t k = 0; k < v.list->size(); ++k) {
          if (k > 0) *out += sep;
          RETURN_IF_ERROR(ToJson((*v.list)[k], st, level + 1, out));
        }
      } else {
        std::vector<const std::pair<std::string, Value>*> items;
        for (const auto& kv : *v.dict) items.push_back(&kv);
        if (st.sort_keys) {
          std::stable_sort(items.begin(), items.end(), [](auto* a, auto* b) { return a->first < b->first; });
        }
        for (size_t k = 0; k < items.size(); ++k) {
          if (k > 0) *out += sep;
          absl::StrAppend(out, JsonString(items[k]->first, st.ensure_ascii), st.key_sep);
          RETURN_IF_ERROR(ToJson(items[k]->second, st, level + 1, out));
        }
      }
      if (st.indent) {
        *out += "\n";
        for (int k = 0; k < level; ++k) *out += *st.indent;
      }
      *out += is_list ? "]" : "}";
      return absl::OkStatus();
    }
    default: break;
  }
  return TypeError(absl::StrCat("Object of type ", TypeName(v), " is not JSON serializable"));
}

std::string Repr(const Value& v) {
  switch (v.kind) {
    case Value::Kind::kUndefined: return "Undefined";
    case Value::Kind::kString: return StrRepr(v.s);
    case Value::Kind::kList: {
      if (v.seq == Value::Seq::kGenerator) return "<generator object>";
      std::string out = v.seq == Value::Seq::kTuple ? "(" : "[";
      for (size_t k = 0; k < v.list->size(); ++k) absl::StrAppend(&out, k ? ", " : "", Repr((*v.list)[k]));
      if (v.seq == Value::Seq::kTuple && v.list->size() == 1) out += ",";
      return out + (v.seq == Value::Seq::kTuple ? ")" : "]");
    }
    case Value::Kind::kDict: case Value::Kind::kNamespace: {
      const Dict& d = v.Is(Value::Kind::kDict) ? *v.dict : *v.ns;
      std::string out = v.Is(Value::Kind::kNamespace) ? "<Namespace {" : "{";
      for (size_t k = 0; k < d.size(); ++k) {
        absl::StrAppend(&out, k ? ", " : "", StrRepr(d[k].first), ": ", Repr(d[k].second));
      }
      return out + (v.Is(Value::Kind::kNamespace) ? "}>" : "}");
    }
    case Value::Kind::kCallable: return absl::StrCat("<function ", v.s, ">");
    default: {
      auto s = ToStr(v);
      return s.ok() ? *s : "?";
    }
  }
}

absl::StatusOr<std::string> ToStr(const Value& v) {
  switch (v.kind) {
    case Value::Kind::kUndefined: return std::string();
    case Value::Kind::kNone: return std::string("None");
    case Value::Kind::kBool: return std::string(v.b ? "True" : "False");
    case Value::Kind::kInt: return absl::StrCat(v.i);
    case Value::Kind::kFloat: return FloatRepr(v.f);
    case Value::Kind::kString: return v.s;
    case Value::Kind::kList:
      if (v.seq == Value::Seq::kGenerator) {
        return TypeError("unsupported: printing a generator (jinja2 prints its address); add |list");
      }
      return Repr(v);
    case Value::Kind::kCallable:
      return TypeError(absl::StrCat("unsupported: printing the function '", v.s, "'"));
    default: return Repr(v);
  }
}

}  // namespace specula::jinja

// Chat templates: the jinja2 filters and tests of the supported subset, and the methods of str
// and dict that chat templates call (`content.strip()`, `tool.items()`). Each follows the jinja2
// 3.1 / CPython function of the same name, including which arguments it takes and what it does
// with undefined values.
#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "chat/chat_template_internal.h"
#include "core/status_macros.h"

namespace specula::jinja {
namespace {

// Positional-or-keyword parameters, as a Python signature binds them.
class Params {
 public:
  Params(std::string_view what, const List& args, const Kwargs& kwargs,
         std::initializer_list<std::string_view> names)
      : what_(what), args_(args), kwargs_(kwargs), names_(names) {}

  absl::Status Check() const {
    if (args_.size() > names_.size()) {
      return TypeError(absl::StrCat(what_, " takes at most ", names_.size(), " arguments, got ", args_.size()));
    }
    for (const auto& [k, unused] : kwargs_) {
      if (std::find(names_.begin(), names_.end(), k) == names_.end()) {
        return TypeError(absl::StrCat(what_, " got an unexpected keyword argument '", k, "'"));
      }
    }
    return absl::OkStatus();
  }
  const Value* Get(size_t pos) const {
    if (pos < args_.size()) return &args_[pos];
    for (const auto& [k, v] : kwargs_) {
      if (k == names_[pos]) return &v;
    }
    return nullptr;
  }
  Value Or(size_t pos, Value dflt) const {
    const Value* v = Get(pos);
    return v ? *v : dflt;
  }

 private:
  std::string what_;
  const List& args_;
  const Kwargs& kwargs_;
  std::vector<std::string_view> names_;
};

// One call of a filter or method: its name and arguments, and what its errors call it.
struct Call {
  const std::string& name;
  std::string what;  // "filter 'join'", "str.split()"
  const List& args;
  const Kwargs& kwargs;

  // The arguments bound to the parameters `names`, or the error for ones that do not fit.
  absl::StatusOr<Params> Bind(std::initializer_list<std::string_view> names) const {
    Params p(what, args, kwargs, names);
    RETURN_IF_ERROR(p.Check());
    return p;
  }
};

absl::StatusOr<int64_t> Len(const Value& v) {
  if (v.Is(Value::Kind::kUndefined)) return 0;
  if (v.Is(Value::Kind::kString)) return static_cast<int64_t>(Decode(v.s).size());
  if (v.Is(Value::Kind::kList) && v.seq != Value::Seq::kGenerator) return static_cast<int64_t>(v.list->size());
  if (v.Is(Value::Kind::kDict)) return static_cast<int64_t>(v.dict->size());
  return TypeError(absl::StrCat("object of type '", TypeName(v), "' has no len()"));
}

// Python's float(str): surrounding whitespace allowed, as are inf and nan.
std::optional<double> ParseFloat(std::string_view s) {
  const std::string t = Strip(s, nullptr, true, true);
  if (t.empty()) return std::nullopt;
  std::string clean;
  for (char c : t) {
    if (c != '_') clean += c;
  }
  char* end = nullptr;
  const double d = std::strtod(clean.c_str(), &end);
  if (end != clean.c_str() + clean.size() || clean.find_first_of("xXpP") != std::string::npos) return std::nullopt;
  return d;
}

// ---- Filters and tests ----------------------------------------------------------------------

absl::StatusOr<Value> IntFilter(const Value& v, const Call& c) {
  ASSIGN_OR_RETURN(Params p, c.Bind({"default", "base"}));
  const Value dflt = p.Or(0, Value::Int(0));
  if (v.Is(Value::Kind::kUndefined)) return UndefinedError(v);
  if (v.Is(Value::Kind::kBool) || v.Is(Value::Kind::kInt)) return Value::Int(v.Is(Value::Kind::kBool) ? v.b : v.i);
  double d;
  if (v.Is(Value::Kind::kFloat)) {
    d = v.f;
  } else if (v.Is(Value::Kind::kString)) {
    const Value base = p.Or(1, Value::Int(10));
    const std::string t = Strip(v.s, nullptr, true, true);
    std::string clean;
    for (char c : t) {
      if (c != '_') clean += c;
    }
    char* end = nullptr;
    errno = 0;
    const long long i = std::strtoll(clean.c_str(), &end, static_cast<int>(base.i));
    if (!clean.empty() && end == clean.c_str() + clean.size() && errno == 0 &&
        clean.find_first_of(" \t") == std::string::npos) {
      return Value::Int(i);
    }
    const auto f = ParseFloat(v.s);
    if (!f) return dflt;
    d = *f;
  } else {
    return dflt;
  }
  if (std::isnan(d) || std::isinf(d)) return TypeError("cannot convert float NaN or infinity to integer");
  if (std::fabs(d) >= 9.2e18) return TypeError("integer overflow (the result does not fit in 64 bits)");
  return Value::Int(static_cast<int64_t>(d));
}

absl::StatusOr<Value> FloatFilter(const Value& v, const Call& c) {
  ASSIGN_OR_RETURN(Params p, c.Bind({"default"}));
  if (v.Is(Value::Kind::kUndefined)) return UndefinedError(v);
  if (v.IsNumber()) return Value::Float(v.Is(Value::Kind::kFloat) ? v.f : v.Is(Value::Kind::kBool) ? v.b : v.i);
  if (v.Is(Value::Kind::kString)) {
    if (auto f = ParseFloat(v.s)) return Value::Float(*f);
  }
  return p.Or(0, Value::Float(0));
}

absl::StatusOr<Value> ToJsonFilter(const Value& v, const Call& c) {
  ASSIGN_OR_RETURN(Params p, c.Bind({"ensure_ascii", "indent", "separators", "sort_keys"}));
  JsonStyle st;
  st.ensure_ascii = Truthy(p.Or(0, Value::Bool(false)));
  const Value indent = p.Or(1, Value::None());
  if (indent.Is(Value::Kind::kString)) {
    st.indent = indent.s;
  } else if (indent.Is(Value::Kind::kInt) || indent.Is(Value::Kind::kBool)) {
    st.indent = std::string(std::max<int64_t>(0, indent.Is(Value::Kind::kBool) ? indent.b : indent.i), ' ');
  } else if (!indent.Is(Value::Kind::kNone)) {
    return TypeError("tojson: indent must be an int or a string");
  }
  if (st.indent) st.item_sep.assign(1, ',');  // (assign(): GCC 12 warns falsely on = ",")
  const Value seps = p.Or(2, Value::None());
  if (!seps.Is(Value::Kind::kNone)) {
    if (!seps.IsSeq() || seps.list->size() != 2 || !(*seps.list)[0].Is(Value::Kind::kString) ||
        !(*seps.list)[1].Is(Value::Kind::kString)) {
      return TypeError("tojson: separators must be a pair of strings");
    }
    st.item_sep = (*seps.list)[0].s;
    st.key_sep = (*seps.list)[1].s;
  }
  st.sort_keys = Truthy(p.Or(3, Value::Bool(false)));
  std::string out;
  RETURN_IF_ERROR(ToJson(v, st, 0, &out));
  return Value::Str(std::move(out));
}

absl::StatusOr<Value> DefaultFilter(const Value& v, const Call& c) {
  ASSIGN_OR_RETURN(Params p, c.Bind({"default_value", "boolean"}));
  const bool use = v.Is(Value::Kind::kUndefined) || (Truthy(p.Or(1, Value::Bool(false))) && !Truthy(v));
  return use ? p.Or(0, Value::Str("")) : v;
}

// `a.b.c` on each item, as jinja2's attribute getter does (item lookup, then attribute).
absl::StatusOr<Value> GetPath(const Value& item, const std::string& path) {
  Value cur = item;
  size_t start = 0;
  while (true) {
    const size_t dot = path.find('.', start);
    const std::string part = path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    Value key = Value::Str(part);
    if (!part.empty() && std::all_of(part.begin(), part.end(), [](char c) { return std::isdigit(static_cast<unsigned char>(c)); })) {
      key = Value::Int(std::atoll(part.c_str()));
    }
    ASSIGN_OR_RETURN(cur, GetItem(cur, key));
    if (dot == std::string::npos) return cur;
    start = dot + 1;
  }
}

absl::StatusOr<Value> JoinFilter(const Value& v, const Call& c) {
  ASSIGN_OR_RETURN(Params p, c.Bind({"d", "attribute"}));
  ASSIGN_OR_RETURN(std::string sep, ToStr(p.Or(0, Value::Str(""))));
  const Value attr = p.Or(1, Value::None());
  ASSIGN_OR_RETURN(List items, Iterate(v));
  std::string out;
  for (size_t k = 0; k < items.size(); ++k) {
    Value item = items[k];
    if (!attr.Is(Value::Kind::kNone)) {
      ASSIGN_OR_RETURN(std::string path, ToStr(attr));
      ASSIGN_OR_RETURN(item, GetPath(item, path));
    }
    ASSIGN_OR_RETURN(std::string s, ToStr(item));
    absl::StrAppend(&out, k ? sep : "", s);
  }
  return Value::Str(std::move(out));
}

absl::StatusOr<Value> ReplaceFilter(const Value& v, const Call& c) {
  ASSIGN_OR_RETURN(Params p, c.Bind({"old", "new", "count"}));
  if (!p.Get(0) || !p.Get(1)) return TypeError("filter 'replace' needs the old and new strings");
  ASSIGN_OR_RETURN(std::string s, ToStr(v));
  ASSIGN_OR_RETURN(std::string old_s, ToStr(*p.Get(0)));
  ASSIGN_OR_RETURN(std::string new_s, ToStr(*p.Get(1)));
  const Value count = p.Or(2, Value::None());
  return Value::Str(Replace(s, old_s, new_s, count.Is(Value::Kind::kInt) ? count.i : -1));
}

absl::StatusOr<Value> TrimFilter(const Value& v, const Call& c) {
  ASSIGN_OR_RETURN(Params p, c.Bind({"chars"}));
  ASSIGN_OR_RETURN(std::string s, ToStr(v));
  return Value::Str(Strip(s, p.Get(0), true, true));
}

// select / reject / selectattr / rejectattr: the items whose test (or truth) is `keep`.
absl::StatusOr<Value> SelectFilter(const Value& seq, const Call& c) {
  if (!c.kwargs.empty()) return TypeError(absl::StrCat(c.what, " takes no keyword arguments"));
  const List& args = c.args;
  const bool with_attr = c.name == "selectattr" || c.name == "rejectattr";
  const bool keep = c.name == "select" || c.name == "selectattr";
  if (with_attr && (args.empty() || !args[0].Is(Value::Kind::kString))) {
    return TypeError("selectattr/rejectattr need an attribute name");
  }
  const size_t t = with_attr ? 1 : 0;
  std::string test;
  if (args.size() > t) {
    if (!args[t].Is(Value::Kind::kString)) return TypeError("the test name must be a string");
    test = args[t].s;
    if (!KnownTest(test)) return TypeError(absl::StrCat("unsupported test '", test, "'"));
  }
  const List test_args(args.begin() + std::min(args.size(), t + 1), args.end());
  ASSIGN_OR_RETURN(List items, Iterate(seq));
  List out;
  for (const Value& item : items) {
    Value subject = item;
    if (with_attr) {
      ASSIGN_OR_RETURN(subject, GetPath(item, args[0].s));
    }
    bool pass;
    if (test.empty()) {
      pass = Truthy(subject);
    } else {
      ASSIGN_OR_RETURN(pass, ApplyTest(test, subject, test_args));
    }
    if (pass == keep) out.push_back(item);
  }
  return Value::MakeList(std::move(out), Value::Seq::kGenerator);  // jinja2 returns a generator
}

// map(attribute='a.b', default=d) or map('filter', args...): a generator, empty for a false input.
absl::StatusOr<Value> MapFilter(const Value& v, const Call& c) {
  const List& args = c.args;
  List out;
  const Value* attr = nullptr;
  const Value* dflt = nullptr;
  for (const auto& [k, x] : c.kwargs) {
    if (k == "attribute") attr = &x;
    if (k == "default") dflt = &x;
  }
  if (!Truthy(v)) return Value::MakeList({}, Value::Seq::kGenerator);
  ASSIGN_OR_RETURN(List items, Iterate(v));
  if (attr != nullptr) {
    if (!args.empty() || c.kwargs.size() != (dflt ? 2u : 1u)) {
      return TypeError("filter 'map' takes attribute= and default= only");
    }
    ASSIGN_OR_RETURN(std::string path, ToStr(*attr));
    for (const Value& item : items) {
      ASSIGN_OR_RETURN(Value x, GetPath(item, path));
      out.push_back(dflt && x.Is(Value::Kind::kUndefined) ? *dflt : x);
    }
  } else {
    if (args.empty() || !args[0].Is(Value::Kind::kString)) {
      return TypeError("filter 'map' needs a filter name or attribute=");
    }
    if (!KnownFilter(args[0].s)) return TypeError(absl::StrCat("unsupported filter '", args[0].s, "'"));
    const List rest(args.begin() + 1, args.end());
    for (const Value& item : items) {
      ASSIGN_OR_RETURN(Value x, ApplyFilter(args[0].s, item, rest, c.kwargs));
      out.push_back(std::move(x));
    }
  }
  return Value::MakeList(std::move(out), Value::Seq::kGenerator);
}

// The filters from here to kFilters take no arguments (ApplyFilter checks).

absl::StatusOr<Value> LengthFilter(const Value& v, const Call&) {
  ASSIGN_OR_RETURN(int64_t n, Len(v));
  return Value::Int(n);
}

absl::StatusOr<Value> FirstLastFilter(const Value& v, const Call& c) {
  if (c.name == "last" && v.Is(Value::Kind::kList) && v.seq == Value::Seq::kGenerator) {
    return TypeError("'generator' object is not reversible");
  }
  ASSIGN_OR_RETURN(List items, Iterate(v));
  if (items.empty()) return Value::Undefined(absl::StrCat("No ", c.name, " item, sequence was empty."));
  return c.name == "first" ? items.front() : items.back();
}

absl::StatusOr<Value> ItemsFilter(const Value& v, const Call&) {
  if (v.Is(Value::Kind::kUndefined)) return Value::MakeList({}, Value::Seq::kGenerator);
  if (!v.Is(Value::Kind::kDict)) return TypeError("Can only get item pairs from a mapping.");
  List pairs;
  for (const auto& [k, x] : *v.dict) pairs.push_back(Value::MakeList({Value::Str(k), x}, Value::Seq::kTuple));
  return Value::MakeList(std::move(pairs), Value::Seq::kGenerator);
}

// A string reversed; else a reverse iterator (a list for a generator).
absl::StatusOr<Value> ReverseFilter(const Value& v, const Call&) {
  if (v.Is(Value::Kind::kString)) {
    std::u32string cps = Decode(v.s);
    std::reverse(cps.begin(), cps.end());
    return Value::Str(Encode(cps));
  }
  auto items = Iterate(v);
  if (!items.ok()) return TypeError("argument must be iterable");
  std::reverse(items->begin(), items->end());
  const bool was_generator = v.Is(Value::Kind::kList) && v.seq == Value::Seq::kGenerator;
  return Value::MakeList(std::move(*items), was_generator ? Value::Seq::kList : Value::Seq::kGenerator);
}

absl::StatusOr<Value> ListFilter(const Value& v, const Call&) {
  ASSIGN_OR_RETURN(List items, Iterate(v));
  return Value::MakeList(std::move(items));
}

// upper, lower, capitalize, title and string: str(v), recased (string leaves it as it is).
absl::StatusOr<Value> StringFilter(const Value& v, const Call& c) {
  ASSIGN_OR_RETURN(std::string s, ToStr(v));
  if (c.name == "upper") return Value::Str(Upper(s));
  if (c.name == "lower") return Value::Str(Lower(s));
  if (c.name == "capitalize") return Value::Str(Capitalize(s));
  if (c.name == "title") return Value::Str(JinjaTitle(s));
  return Value::Str(s);
}

struct Filter {
  const char* name;
  absl::StatusOr<Value> (*apply)(const Value& v, const Call& c);
  bool takes_args;
};

// Every supported filter: what the parser accepts, and what ApplyFilter calls.
const Filter kFilters[] = {
    {"trim", TrimFilter, true},          {"length", LengthFilter, false},
    {"count", LengthFilter, false},      {"upper", StringFilter, false},
    {"lower", StringFilter, false},      {"capitalize", StringFilter, false},
    {"title", StringFilter, false},      {"string", StringFilter, false},
    {"int", IntFilter, true},            {"float", FloatFilter, true},
    {"tojson", ToJsonFilter, true},      {"default", DefaultFilter, true},
    {"d", DefaultFilter, true},          {"first", FirstLastFilter, false},
    {"last", FirstLastFilter, false},    {"join", JoinFilter, true},
    {"replace", ReplaceFilter, true},    {"items", ItemsFilter, false},
    {"list", ListFilter, false},         {"select", SelectFilter, true},
    {"reject", SelectFilter, true},      {"selectattr", SelectFilter, true},
    {"rejectattr", SelectFilter, true},  {"map", MapFilter, true},
    {"reverse", ReverseFilter, false}};

const Filter* FindFilter(std::string_view name) {
  for (const Filter& f : kFilters) {
    if (name == f.name) return &f;
  }
  return nullptr;
}

const char* const kTests[] = {
    "defined", "undefined", "none", "boolean", "true", "false", "integer", "float", "number",
    "string", "mapping", "iterable", "sequence", "callable", "odd", "even", "divisibleby", "eq",
    "equalto", "==", "ne", "!=", "lt", "lessthan", "<", "le", "<=", "gt", "greaterthan", ">",
    "ge", ">=", "in", "sameas", "lower", "upper"};

}  // namespace

bool KnownFilter(std::string_view name) { return FindFilter(name) != nullptr; }

bool KnownTest(std::string_view name) {
  return std::find(std::begin(kTests), std::end(kTests), name) != std::end(kTests);
}

absl::StatusOr<Value> ApplyFilter(const std::string& name, const Value& v, const List& args,
                                  const Kwargs& kwargs) {
  const Filter* filter = FindFilter(name);
  if (filter == nullptr) return TypeError(absl::StrCat("unsupported filter '", name, "'"));
  const Call c{name, absl::StrCat("filter '", name, "'"), args, kwargs};
  if (!filter->takes_args && (!args.empty() || !kwargs.empty())) {
    return TypeError(absl::StrCat(c.what, " takes no arguments"));
  }
  return filter->apply(v, c);
}

absl::StatusOr<bool> ApplyTest(const std::string& name, const Value& v, const List& args) {
  static const char* const kOneArg[] = {"divisibleby", "eq", "equalto", "==", "ne", "!=", "lt",
                                        "lessthan", "<", "le", "<=", "gt", "greaterthan", ">",
                                        "ge", ">=", "in", "sameas"};
  const bool one = std::find(std::begin(kOneArg), std::end(kOneArg), name) != std::end(kOneArg);
  if (args.size() != (one ? 1u : 0u)) {
    return TypeError(absl::StrCat("test '", name, "' takes ", one ? "one argument" : "no arguments"));
  }
  using K = Value::Kind;
  if (name == "defined") return !v.Is(K::kUndefined);
  if (name == "undefined") return v.Is(K::kUndefined);
  if (name == "none") return v.Is(K::kNone);
  if (name == "boolean") return v.Is(K::kBool);
  if (name == "true" || name == "false") return v.Is(K::kBool) && v.b == (name == "true");
  if (name == "integer") return v.Is(K::kInt);
  if (name == "float") return v.Is(K::kFloat);
  if (name == "number") return v.IsNumber();
  if (name == "string") return v.Is(K::kString);
  if (name == "mapping") return v.Is(K::kDict);
  if (name == "callable") return v.Is(K::kCallable);
  if (name == "iterable") return v.Is(K::kUndefined) || v.Is(K::kString) || v.Is(K::kList) || v.Is(K::kDict);
  if (name == "sequence") {
    return v.Is(K::kUndefined) || v.Is(K::kString) || v.Is(K::kDict) ||
           (v.Is(K::kList) && v.seq != Value::Seq::kGenerator);
  }
  if (name == "odd" || name == "even" || name == "divisibleby") {
    ASSIGN_OR_RETURN(Value r, Arithmetic("%", v, name == "divisibleby" ? args[0] : Value::Int(2)));
    return Equal(r, Value::Int(name == "odd" ? 1 : 0));
  }
  if (name == "lower" || name == "upper") {
    ASSIGN_OR_RETURN(std::string s, ToStr(v));
    return IsCase(s, name == "lower");
  }
  const Value& other = args[0];
  if (name == "eq" || name == "equalto" || name == "==") return Equal(v, other);
  if (name == "ne" || name == "!=") return !Equal(v, other);
  if (name == "lt" || name == "lessthan" || name == "<") return Less(v, other);
  if (name == "gt" || name == "greaterthan" || name == ">") return Less(other, v);
  if (name == "le" || name == "<=" || name == "ge" || name == ">=") {
    const bool le = name == "le" || name == "<=";
    ASSIGN_OR_RETURN(bool less, le ? Less(v, other) : Less(other, v));
    return less || Equal(v, other);
  }
  if (name == "in") return Contains(other, v);
  if (name == "sameas") {  // Python's `is`: singletons, small ints, the same container
    if (v.kind != other.kind) return false;
    switch (v.kind) {
      case K::kNone: case K::kUndefined: return v.Is(K::kNone);
      case K::kBool: return v.b == other.b;
      case K::kInt: return v.i == other.i && v.i >= -5 && v.i <= 256;
      case K::kList: return v.list == other.list;
      case K::kDict: return v.dict == other.dict;
      case K::kNamespace: return v.ns == other.ns;
      default: return false;
    }
  }
  return TypeError(absl::StrCat("unsupported test '", name, "'"));
}

// ---- Methods --------------------------------------------------------------------------------

namespace {

absl::StatusOr<Value> DictMethod(const Dict& d, const Call& c) {
  if (c.name == "items" || c.name == "keys" || c.name == "values") {
    ASSIGN_OR_RETURN(Params p, c.Bind({}));
    List out;
    for (const auto& [k, v] : d) {
      out.push_back(c.name == "keys" ? Value::Str(k)
                    : c.name == "values" ? v
                                         : Value::MakeList({Value::Str(k), v}, Value::Seq::kTuple));
    }
    return Value::MakeList(std::move(out));
  }
  if (c.name == "get") {
    ASSIGN_OR_RETURN(Params p, c.Bind({"key", "default"}));
    if (!p.Get(0)) return TypeError("dict.get() needs a key");
    const Value* v = p.Get(0)->Is(Value::Kind::kString) ? Find(d, p.Get(0)->s) : nullptr;
    return v ? *v : p.Or(1, Value::None());
  }
  return TypeError(absl::StrCat("unsupported: ", c.what, " (the sandbox does not modify objects)"));
}

// Python's error for an argument that must be a str; an absent one (null) passes.
absl::Status StrArg(const Call& c, const Value* v) {
  if (v && !v->Is(Value::Kind::kString)) {
    return TypeError(absl::StrCat(c.what, ": argument must be str, not ", TypeName(*v)));
  }
  return absl::OkStatus();
}

// str.startswith() and str.endswith(): a prefix (suffix) or a tuple of them.
absl::StatusOr<Value> StartsOrEndsWith(const std::string& s, const Call& c) {
  ASSIGN_OR_RETURN(Params p, c.Bind({"prefix"}));
  if (!p.Get(0)) return TypeError(absl::StrCat(c.what, " takes one argument"));
  List options = p.Get(0)->Is(Value::Kind::kList) && p.Get(0)->seq == Value::Seq::kTuple
                     ? *p.Get(0)->list : List{*p.Get(0)};
  for (const Value& o : options) {
    if (!o.Is(Value::Kind::kString)) {
      return TypeError(absl::StrCat(c.what, ": argument must be str or a tuple of str, not ", TypeName(o)));
    }
    const bool hit = c.name == "startswith" ? s.compare(0, o.s.size(), o.s) == 0
                                            : s.size() >= o.s.size() && s.compare(s.size() - o.s.size(), o.s.size(), o.s) == 0;
    if (hit) return Value::Bool(true);
  }
  return Value::Bool(false);
}

absl::StatusOr<Value> StrJoin(const std::string& s, const Call& c) {
  ASSIGN_OR_RETURN(Params p, c.Bind({"iterable"}));
  if (!p.Get(0)) return TypeError("str.join() takes one argument");
  ASSIGN_OR_RETURN(List items, Iterate(*p.Get(0)));
  std::string out;
  for (size_t k = 0; k < items.size(); ++k) {
    if (!items[k].Is(Value::Kind::kString)) {
      return TypeError(absl::StrCat("sequence item ", k, ": expected str instance, ", TypeName(items[k]), " found"));
    }
    absl::StrAppend(&out, k ? s : "", items[k].s);
  }
  return Value::Str(std::move(out));
}

absl::StatusOr<Value> StrMethod(const std::string& s, const Call& c) {
  const std::string& name = c.name;
  if (name == "strip" || name == "lstrip" || name == "rstrip") {
    ASSIGN_OR_RETURN(Params p, c.Bind({"chars"}));
    const Value* chars = p.Get(0);
    if (chars && chars->Is(Value::Kind::kNone)) chars = nullptr;
    RETURN_IF_ERROR(StrArg(c, chars));
    return Value::Str(Strip(s, chars, name != "rstrip", name != "lstrip"));
  }
  if (name == "upper" || name == "lower" || name == "title" || name == "capitalize") {
    ASSIGN_OR_RETURN(Params p, c.Bind({}));
    return Value::Str(name == "upper" ? Upper(s) : name == "lower" ? Lower(s)
                      : name == "title" ? PyTitle(s) : Capitalize(s));
  }
  if (name == "startswith" || name == "endswith") return StartsOrEndsWith(s, c);
  if (name == "split") {
    ASSIGN_OR_RETURN(Params p, c.Bind({"sep", "maxsplit"}));
    const Value sep = p.Or(0, Value::None());
    if (!sep.Is(Value::Kind::kNone)) RETURN_IF_ERROR(StrArg(c, &sep));
    if (sep.Is(Value::Kind::kString) && sep.s.empty()) return TypeError("empty separator");
    const Value maxsplit = p.Or(1, Value::Int(-1));
    if (!maxsplit.Is(Value::Kind::kInt)) return TypeError("split: maxsplit must be an int");
    return Value::MakeList(Split(s, sep, maxsplit.i));
  }
  if (name == "replace") {
    ASSIGN_OR_RETURN(Params p, c.Bind({"old", "new", "count"}));
    if (!p.Get(0) || !p.Get(1)) return TypeError("str.replace() needs the old and new strings");
    RETURN_IF_ERROR(StrArg(c, p.Get(0)));
    RETURN_IF_ERROR(StrArg(c, p.Get(1)));
    const Value count = p.Or(2, Value::Int(-1));
    if (!count.Is(Value::Kind::kInt)) return TypeError("str.replace(): count must be an int");
    return Value::Str(Replace(s, p.Get(0)->s, p.Get(1)->s, count.i));
  }
  if (name == "join") return StrJoin(s, c);
  return TypeError(absl::StrCat("unsupported string method '", name, "'"));
}

}  // namespace

absl::StatusOr<Value> CallMethod(const Value& self, const std::string& name, const List& args,
                                 const Kwargs& kwargs) {
  const Call c{name, absl::StrCat(TypeName(self), ".", name, "()"), args, kwargs};
  if (self.Is(Value::Kind::kDict)) return DictMethod(*self.dict, c);
  if (!self.Is(Value::Kind::kString)) return TypeError(absl::StrCat("unsupported method ", c.what));
  return StrMethod(self.s, c);
}

}  // namespace specula::jinja

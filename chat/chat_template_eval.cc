// Chat templates: the renderer (statements, expressions, scopes, globals) and Python's semantics
// for the core operations on values (truth, equality, ordering, arithmetic, attribute and item
// access). Undefined values follow jinja2's default Undefined: they print as '', are false and
// iterate as empty, and using them any other way is an error.
#include <algorithm>
#include <cmath>
#include <unordered_map>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "chat/chat_template_internal.h"
#include "core/status_macros.h"

namespace specula::jinja {

// ---- Core operations ------------------------------------------------------------------------

namespace {

absl::Status TypeError(const std::string& msg) { return absl::InvalidArgumentError(msg); }

int64_t AsInt(const Value& v) { return v.Is(Value::Kind::kBool) ? v.b : v.i; }
double AsFloat(const Value& v) { return v.Is(Value::Kind::kFloat) ? v.f : static_cast<double>(AsInt(v)); }
bool IsIntLike(const Value& v) { return v.Is(Value::Kind::kInt) || v.Is(Value::Kind::kBool); }

const char* const kDictMethods[] = {"items", "keys", "values", "get", "clear", "copy", "pop",
                                    "popitem", "setdefault", "update", "fromkeys"};
const char* const kStrMethods[] = {
    "strip", "lstrip", "rstrip", "startswith", "endswith", "split", "rsplit", "upper", "lower",
    "title", "capitalize", "replace", "join", "find", "rfind", "index", "count", "format",
    "splitlines", "isdigit", "isalpha", "isspace", "islower", "isupper", "center", "ljust",
    "rjust", "zfill", "encode", "partition", "casefold", "swapcase", "removeprefix", "removesuffix"};
const char* const kListMethods[] = {"append", "extend", "insert", "pop", "remove", "index", "count",
                                    "sort", "reverse", "copy", "clear"};

template <size_t N>
bool In(const char* const (&names)[N], std::string_view name) {
  for (const char* n : names) {
    if (name == n) return true;
  }
  return false;
}

}  // namespace

absl::Status UndefinedError(const Value& v) { return absl::InvalidArgumentError(v.s); }

bool Truthy(const Value& v) {
  switch (v.kind) {
    case Value::Kind::kUndefined: case Value::Kind::kNone: return false;
    case Value::Kind::kBool: return v.b;
    case Value::Kind::kInt: return v.i != 0;
    case Value::Kind::kFloat: return v.f != 0;
    case Value::Kind::kString: return !v.s.empty();
    case Value::Kind::kList: return v.seq == Value::Seq::kGenerator || !v.list->empty();
    case Value::Kind::kDict: return !v.dict->empty();
    default: return true;
  }
}

std::string TypeName(const Value& v) {
  switch (v.kind) {
    case Value::Kind::kUndefined: return "Undefined";
    case Value::Kind::kNone: return "NoneType";
    case Value::Kind::kBool: return "bool";
    case Value::Kind::kInt: return "int";
    case Value::Kind::kFloat: return "float";
    case Value::Kind::kString: return "str";
    case Value::Kind::kList:
      return v.seq == Value::Seq::kTuple ? "tuple" : v.seq == Value::Seq::kGenerator ? "generator" : "list";
    case Value::Kind::kDict: return "dict";
    case Value::Kind::kNamespace: return "Namespace";
    case Value::Kind::kCallable: return "function";
  }
  return "object";
}

bool Equal(const Value& a, const Value& b) {
  if (a.IsNumber() && b.IsNumber()) {
    if (IsIntLike(a) && IsIntLike(b)) return AsInt(a) == AsInt(b);
    return AsFloat(a) == AsFloat(b);
  }
  if (a.kind != b.kind) return false;
  switch (a.kind) {
    case Value::Kind::kUndefined: case Value::Kind::kNone: return true;
    case Value::Kind::kString: return a.s == b.s;
    case Value::Kind::kList: {
      if (a.seq != b.seq) return false;
      if (a.seq == Value::Seq::kGenerator) return a.list == b.list;
      if (a.list->size() != b.list->size()) return false;
      for (size_t k = 0; k < a.list->size(); ++k) {
        if (!Equal((*a.list)[k], (*b.list)[k])) return false;
      }
      return true;
    }
    case Value::Kind::kDict: {
      if (a.dict->size() != b.dict->size()) return false;
      for (const auto& [key, value] : *a.dict) {
        const Value* other = Find(*b.dict, key);
        if (other == nullptr || !Equal(value, *other)) return false;
      }
      return true;
    }
    case Value::Kind::kNamespace: return a.ns == b.ns;
    case Value::Kind::kCallable: return a.s == b.s && a.self == b.self;
    default: return false;
  }
}

absl::StatusOr<List> Iterate(const Value& v) {
  switch (v.kind) {
    case Value::Kind::kUndefined: return List{};
    case Value::Kind::kList: return *v.list;
    case Value::Kind::kDict: {
      List keys;
      for (const auto& [k, unused] : *v.dict) keys.push_back(Value::Str(k));
      return keys;
    }
    case Value::Kind::kString: {
      List chars;
      for (char32_t cp : Decode(v.s)) chars.push_back(Value::Str(Encode(std::u32string(1, cp))));
      return chars;
    }
    default: return TypeError(absl::StrCat("'", TypeName(v), "' object is not iterable"));
  }
}

absl::StatusOr<bool> Less(const Value& a, const Value& b) {
  if (a.Is(Value::Kind::kUndefined)) return UndefinedError(a);
  if (b.Is(Value::Kind::kUndefined)) return UndefinedError(b);
  if (a.IsNumber() && b.IsNumber()) {
    if (IsIntLike(a) && IsIntLike(b)) return AsInt(a) < AsInt(b);
    return AsFloat(a) < AsFloat(b);
  }
  if (a.Is(Value::Kind::kString) && b.Is(Value::Kind::kString)) return a.s < b.s;  // UTF-8 order is code point order
  if (a.Is(Value::Kind::kList) && b.Is(Value::Kind::kList) && a.seq == b.seq &&
      a.seq != Value::Seq::kGenerator) {
    const List& x = *a.list;
    const List& y = *b.list;
    for (size_t k = 0; k < x.size() && k < y.size(); ++k) {
      if (Equal(x[k], y[k])) continue;
      return Less(x[k], y[k]);
    }
    return x.size() < y.size();
  }
  return TypeError(absl::StrCat("'<' not supported between instances of '", TypeName(a), "' and '",
                                TypeName(b), "'"));
}

absl::StatusOr<bool> Contains(const Value& c, const Value& item) {
  switch (c.kind) {
    case Value::Kind::kUndefined: return false;
    case Value::Kind::kString:
      if (!item.Is(Value::Kind::kString)) {
        return TypeError(absl::StrCat("'in <string>' requires string as left operand, not ", TypeName(item)));
      }
      return absl::StrContains(c.s, item.s);
    case Value::Kind::kDict: return item.Is(Value::Kind::kString) && Find(*c.dict, item.s) != nullptr;
    case Value::Kind::kList:
      for (const Value& v : *c.list) {
        if (Equal(v, item)) return true;
      }
      return false;
    default: return TypeError(absl::StrCat("argument of type '", TypeName(c), "' is not iterable"));
  }
}

namespace {

// CPython's float floor division and modulo (float_divmod).
void FloatDivMod(double x, double y, double* div, double* mod) {
  double m = std::fmod(x, y);
  double d = (x - m) / y;
  if (m != 0) {
    if ((y < 0) != (m < 0)) {
      m += y;
      d -= 1.0;
    }
  } else {
    m = std::copysign(0.0, y);
  }
  double floordiv;
  if (d != 0) {
    floordiv = std::floor(d);
    if (d - floordiv > 0.5) floordiv += 1.0;
  } else {
    floordiv = std::copysign(0.0, x / y);
  }
  *div = floordiv;
  *mod = m;
}

absl::StatusOr<Value> Repeat(const Value& seq, int64_t n) {
  const size_t size = seq.Is(Value::Kind::kString) ? seq.s.size() : seq.list->size();
  if (n > 0 && size > 0 && static_cast<uint64_t>(n) > (seq.Is(Value::Kind::kString) ? kMaxBytes : kMaxItems) / size) {
    return TypeError("repetition result too large");
  }
  if (seq.Is(Value::Kind::kString)) {
    std::string out;
    for (int64_t k = 0; k < n; ++k) out += seq.s;
    return Value::Str(std::move(out));
  }
  List out;
  for (int64_t k = 0; k < n; ++k) out.insert(out.end(), seq.list->begin(), seq.list->end());
  return Value::MakeList(std::move(out), seq.seq);
}

}  // namespace

absl::StatusOr<Value> Arithmetic(const std::string& op, const Value& a, const Value& b) {
  if (a.Is(Value::Kind::kUndefined)) return UndefinedError(a);
  if (b.Is(Value::Kind::kUndefined)) return UndefinedError(b);
  auto unsupported = [&]() {
    return TypeError(absl::StrCat("unsupported operand type(s) for ", op, ": '", TypeName(a),
                                  "' and '", TypeName(b), "'"));
  };
  const auto overflow = TypeError("integer overflow (the result does not fit in 64 bits)");
  if (a.IsNumber() && b.IsNumber()) {
    const bool ints = IsIntLike(a) && IsIntLike(b);
    const int64_t x = AsInt(a), y = AsInt(b);
    const double fx = AsFloat(a), fy = AsFloat(b);
    int64_t r;
    if (op == "+") {
      if (!ints) return Value::Float(fx + fy);
      if (__builtin_add_overflow(x, y, &r)) return overflow;
      return Value::Int(r);
    }
    if (op == "-") {
      if (!ints) return Value::Float(fx - fy);
      if (__builtin_sub_overflow(x, y, &r)) return overflow;
      return Value::Int(r);
    }
    if (op == "*") {
      if (!ints) return Value::Float(fx * fy);
      if (__builtin_mul_overflow(x, y, &r)) return overflow;
      return Value::Int(r);
    }
    if (op == "/") {
      if (fy == 0) return TypeError("division by zero");
      return Value::Float(fx / fy);
    }
    if (op == "//" || op == "%") {
      if (ints) {
        if (y == 0) return TypeError("integer division or modulo by zero");
        if (x == INT64_MIN && y == -1) return overflow;
        int64_t q = x / y, m = x % y;
        if (m != 0 && ((m < 0) != (y < 0))) {
          q -= 1;
          m += y;
        }
        return Value::Int(op == "//" ? q : m);
      }
      if (fy == 0) return TypeError("float division by zero");
      double d, m;
      FloatDivMod(fx, fy, &d, &m);
      return Value::Float(op == "//" ? d : m);
    }
    if (op == "**") {
      if (ints && y >= 0) {
        int64_t result = 1, base = x;
        for (int64_t e = y; e > 0; e >>= 1) {
          if ((e & 1) && __builtin_mul_overflow(result, base, &result)) return overflow;
          if (e > 1 && __builtin_mul_overflow(base, base, &base)) return overflow;
        }
        return Value::Int(result);
      }
      if (fx == 0 && fy < 0) return TypeError("0.0 cannot be raised to a negative power");
      return Value::Float(std::pow(fx, fy));
    }
    return unsupported();
  }
  const bool seq_a = a.Is(Value::Kind::kString) || (a.IsSeq() && a.seq != Value::Seq::kGenerator);
  if (op == "+" && a.Is(Value::Kind::kString) && b.Is(Value::Kind::kString)) {
    if (a.s.size() + b.s.size() > kMaxBytes) return TypeError("string longer than 16 MiB");
    return Value::Str(a.s + b.s);
  }
  if (op == "+" && a.IsSeq() && b.IsSeq() && a.seq == b.seq && a.seq != Value::Seq::kGenerator) {
    if (a.list->size() + b.list->size() > kMaxItems) return TypeError("list longer than 100000 items");
    List out = *a.list;
    out.insert(out.end(), b.list->begin(), b.list->end());
    return Value::MakeList(std::move(out), a.seq);
  }
  if (op == "+" && seq_a) {
    return TypeError(absl::StrCat("can only concatenate ", TypeName(a), " (not \"", TypeName(b),
                                  "\") to ", TypeName(a)));
  }
  if (op == "*" && seq_a && IsIntLike(b)) return Repeat(a, AsInt(b));
  if (op == "*" && IsIntLike(a) && (b.Is(Value::Kind::kString) || (b.IsSeq() && b.seq != Value::Seq::kGenerator))) {
    return Repeat(b, AsInt(a));
  }
  if (op == "%" && a.Is(Value::Kind::kString)) return TypeError("unsupported: printf-style '%' formatting");
  return unsupported();
}

absl::StatusOr<Value> GetAttr(const Value& obj, const std::string& name) {
  auto missing = [&]() {
    return Value::Undefined(absl::StrCat("'", TypeName(obj), " object' has no attribute '", name, "'"));
  };
  switch (obj.kind) {
    case Value::Kind::kUndefined: return UndefinedError(obj);
    case Value::Kind::kDict: {
      // Python attribute lookup first (methods), then the key, as jinja2's getattr does.
      if (In(kDictMethods, name)) return Value::Callable(name, std::make_shared<Value>(obj));
      const Value* v = Find(*obj.dict, name);
      return v ? *v : missing();
    }
    case Value::Kind::kNamespace: {
      const Value* v = Find(*obj.ns, name);
      return v ? *v : missing();
    }
    case Value::Kind::kString:
      if (In(kStrMethods, name)) return Value::Callable(name, std::make_shared<Value>(obj));
      return missing();
    case Value::Kind::kList:
      if (obj.seq != Value::Seq::kGenerator && In(kListMethods, name)) {
        return Value::Callable(name, std::make_shared<Value>(obj));
      }
      return missing();
    default: return missing();
  }
}

absl::StatusOr<Value> GetItem(const Value& obj, const Value& key) {
  if (obj.Is(Value::Kind::kUndefined)) return UndefinedError(obj);
  // Subscription first, then attribute lookup for string keys; a failure is undefined, not an error.
  if (obj.Is(Value::Kind::kDict) && key.Is(Value::Kind::kString)) {
    if (const Value* v = Find(*obj.dict, key.s)) return *v;
  }
  if ((obj.Is(Value::Kind::kString) || (obj.IsSeq() && obj.seq != Value::Seq::kGenerator)) &&
      IsIntLike(key)) {
    const std::u32string cps = obj.Is(Value::Kind::kString) ? Decode(obj.s) : U"";
    const int64_t n = obj.Is(Value::Kind::kString) ? static_cast<int64_t>(cps.size())
                                                   : static_cast<int64_t>(obj.list->size());
    int64_t k = AsInt(key);
    if (k < 0) k += n;
    if (k >= 0 && k < n) {
      return obj.Is(Value::Kind::kString) ? Value::Str(Encode(cps.substr(k, 1))) : (*obj.list)[k];
    }
    return Value::Undefined(absl::StrCat(TypeName(obj), " object has no element ", AsInt(key)));
  }
  if (key.Is(Value::Kind::kString)) return GetAttr(obj, key.s);
  return Value::Undefined(absl::StrCat("'", TypeName(obj), " object' has no element ", Repr(key)));
}

absl::StatusOr<Value> Slice(const Value& obj, const Value& start, const Value& stop,
                            const Value& step) {
  if (obj.Is(Value::Kind::kUndefined)) return UndefinedError(obj);
  for (const Value* v : {&start, &stop, &step}) {
    if (!v->Is(Value::Kind::kNone) && !IsIntLike(*v)) {
      return TypeError("slice indices must be integers or None");
    }
  }
  const bool is_str = obj.Is(Value::Kind::kString);
  if (!is_str && !(obj.IsSeq() && obj.seq != Value::Seq::kGenerator)) {
    return Value::Undefined(absl::StrCat("'", TypeName(obj), " object' cannot be sliced"));
  }
  const std::u32string cps = is_str ? Decode(obj.s) : U"";  // Python indexes str by code point
  const int64_t n = is_str ? static_cast<int64_t>(cps.size()) : static_cast<int64_t>(obj.list->size());
  const int64_t st = step.Is(Value::Kind::kNone) ? 1 : AsInt(step);
  if (st == 0) return TypeError("slice step cannot be zero");
  // Python's slice.indices().
  auto clamp = [&](const Value& v, int64_t dflt) {
    if (v.Is(Value::Kind::kNone)) return dflt;
    int64_t k = AsInt(v);
    if (k < 0) k = std::max<int64_t>(k + n, st < 0 ? -1 : 0);
    return std::min<int64_t>(k, st < 0 ? n - 1 : n);
  };
  const int64_t lo = clamp(start, st < 0 ? n - 1 : 0);
  const int64_t hi = clamp(stop, st < 0 ? -1 : n);
  std::u32string s;
  List items;
  for (int64_t k = lo; st > 0 ? k < hi : k > hi; k += st) {
    if (is_str) {
      s += cps[k];
    } else {
      items.push_back((*obj.list)[k]);
    }
  }
  return is_str ? Value::Str(Encode(s)) : Value::MakeList(std::move(items), obj.seq);
}

// ---- Renderer -------------------------------------------------------------------------------

namespace {

constexpr int64_t kMaxSteps = 1'000'000;  // statements and loop iterations per render (~1 s)
constexpr int64_t kMaxRange = 100'000;     // jinja2's sandbox limit on range()

absl::Status LineError(int line, std::string_view msg) {
  return absl::InvalidArgumentError(absl::StrCat("chat template line ", line, ": ", std::string(msg)));
}

// Adds the line to an error from a builtin; errors from nested nodes already have one.
absl::Status AtLine(int line, const absl::Status& st) {
  if (absl::StartsWith(st.message(), "chat template line ")) return st;
  return LineError(line, std::string(st.message()));
}

class Renderer {
 public:
  Renderer(const Dict& vars, const RenderOptions& options) : options_(options) {
    scopes_.emplace_back();
    for (const auto& [k, v] : vars) scopes_.back()[k] = v;
  }

  enum class Flow { kNext, kBreak, kContinue };

  absl::StatusOr<Flow> Exec(const Body& body, std::string* out) {
    for (const auto& s : body) {
      if (++steps_ > kMaxSteps) return LineError(s->line, "template exceeds the step limit");
      ASSIGN_OR_RETURN(Flow flow, ExecStmt(*s, out));
      if (out->size() > kMaxBytes) return LineError(s->line, "the rendering exceeds 16 MiB");
      if (flow != Flow::kNext) return flow;
    }
    return Flow::kNext;
  }

 private:
  using Scope = std::unordered_map<std::string, Value>;

  absl::StatusOr<Flow> ExecStmt(const Stmt& s, std::string* out) {
    switch (s.kind) {
      case Stmt::Kind::kText:
        out->append(s.text);
        return Flow::kNext;
      case Stmt::Kind::kPrint: {
        ASSIGN_OR_RETURN(Value v, Eval(*s.expr));
        auto text = ToStr(v);
        if (!text.ok()) return AtLine(s.line, text.status());
        out->append(*text);
        return Flow::kNext;
      }
      case Stmt::Kind::kIf:
        for (const auto& [test, body] : s.branches) {
          bool take = true;
          if (test) {
            ASSIGN_OR_RETURN(Value v, Eval(*test));
            take = Truthy(v);
          }
          if (take) return Exec(body, out);
        }
        return Flow::kNext;
      case Stmt::Kind::kFor: return ExecFor(s, out);
      case Stmt::Kind::kSet: {
        ASSIGN_OR_RETURN(Value v, Eval(*s.expr));
        if (!s.attr.empty()) {
          Value target = Lookup(s.targets[0]);
          if (!target.Is(Value::Kind::kNamespace)) {
            return LineError(s.line, "cannot assign attribute on non-namespace object");
          }
          // A namespace holding a namespace could hold itself: a cycle to print forever.
          if (HoldsNamespace(v)) return LineError(s.line, "unsupported: a namespace inside a namespace");
          for (auto& [k, old] : *target.ns) {
            if (k == s.attr) {
              old = std::move(v);
              return Flow::kNext;
            }
          }
          target.ns->emplace_back(s.attr, std::move(v));
          return Flow::kNext;
        }
        RETURN_IF_ERROR(Bind(s.targets, v, s.line));
        return Flow::kNext;
      }
      case Stmt::Kind::kSetBlock: {
        std::string text;
        ASSIGN_OR_RETURN(Flow flow, Exec(s.body, &text));
        scopes_.back()[s.targets[0]] = Value::Str(std::move(text));
        return flow;
      }
      case Stmt::Kind::kBreak: return Flow::kBreak;
      case Stmt::Kind::kContinue: return Flow::kContinue;
      case Stmt::Kind::kGeneration: return Exec(s.body, out);
    }
    return Flow::kNext;
  }

  // Assigns `v` to one name, or unpacks it into several (`for k, v in ...`, `set a, b = ...`).
  absl::Status Bind(const std::vector<std::string>& names, const Value& v, int line) {
    if (names.size() == 1) {
      scopes_.back()[names[0]] = v;
      return absl::OkStatus();
    }
    auto items = Iterate(v);
    if (!items.ok()) return AtLine(line, items.status());
    if (items->size() != names.size()) {
      return LineError(line, absl::StrCat(items->size() > names.size() ? "too many" : "not enough",
                                          " values to unpack (expected ", names.size(), ", got ",
                                          items->size(), ")"));
    }
    for (size_t k = 0; k < names.size(); ++k) scopes_.back()[names[k]] = (*items)[k];
    return absl::OkStatus();
  }

  absl::StatusOr<Flow> ExecFor(const Stmt& s, std::string* out) {
    ASSIGN_OR_RETURN(Value seq, Eval(*s.expr));
    auto all = Iterate(seq);
    if (!all.ok()) return AtLine(s.line, all.status());
    List items;
    for (Value& item : *all) {  // `for x in xs if cond`: the loop sees only the kept items
      if (s.cond) {
        scopes_.emplace_back();
        absl::Status bound = Bind(s.targets, item, s.line);
        auto keep = bound.ok() ? Eval(*s.cond) : absl::StatusOr<Value>(bound);
        scopes_.pop_back();
        if (!keep.ok()) return keep.status();
        if (!Truthy(*keep)) continue;
      }
      items.push_back(std::move(item));
    }
    const int64_t n = static_cast<int64_t>(items.size());
    // Each iteration gets a fresh scope: a `set` in the body is not seen by the next iteration
    // nor after the loop (hence namespace()).
    for (int64_t k = 0; k < n; ++k) {
      if (++steps_ > kMaxSteps) return LineError(s.line, "template exceeds the step limit");
      Dict loop = {{"index", Value::Int(k + 1)},      {"index0", Value::Int(k)},
                   {"revindex", Value::Int(n - k)},   {"revindex0", Value::Int(n - k - 1)},
                   {"first", Value::Bool(k == 0)},    {"last", Value::Bool(k == n - 1)},
                   {"length", Value::Int(n)},         {"depth", Value::Int(1)},
                   {"depth0", Value::Int(0)},
                   {"cycle", Value::Callable("loop.cycle", std::make_shared<Value>(Value::Int(k)))}};
      if (k > 0) loop.emplace_back("previtem", items[k - 1]);
      if (k + 1 < n) loop.emplace_back("nextitem", items[k + 1]);
      scopes_.emplace_back();
      scopes_.back()["loop"] = Value::MakeDict(std::move(loop));
      absl::Status bound = Bind(s.targets, items[k], s.line);
      auto flow = bound.ok() ? Exec(s.body, out) : absl::StatusOr<Flow>(bound);
      scopes_.pop_back();
      if (!flow.ok()) return flow.status();
      if (*flow == Flow::kBreak) break;
    }
    if (n == 0 && !s.else_body.empty()) {
      scopes_.emplace_back();
      auto flow = Exec(s.else_body, out);
      scopes_.pop_back();
      if (!flow.ok()) return flow.status();
    }
    return Flow::kNext;
  }

  Value Lookup(const std::string& name) const {
    for (auto it = scopes_.rbegin(); it != scopes_.rend(); ++it) {
      auto found = it->find(name);
      if (found != it->end()) return found->second;
    }
    static const char* const kGlobals[] = {"range", "namespace", "dict", "raise_exception",
                                           "strftime_now"};
    if (In(kGlobals, name)) return Value::Callable(name);
    return Value::Undefined(absl::StrCat("'", name, "' is undefined"));
  }

  absl::Status EvalArgs(const std::vector<Arg>& args, List* positional, Kwargs* kwargs) {
    for (const Arg& a : args) {
      ASSIGN_OR_RETURN(Value v, Eval(*a.value));
      if (a.name.empty()) {
        positional->push_back(std::move(v));
      } else {
        kwargs->emplace_back(a.name, std::move(v));
      }
    }
    return absl::OkStatus();
  }

  absl::StatusOr<Value> Eval(const Expr& e) {
    switch (e.kind) {
      case Expr::Kind::kLiteral: return e.value;
      case Expr::Kind::kName: return Lookup(e.name);
      case Expr::Kind::kList: case Expr::Kind::kTuple: {
        List items;
        for (const auto& op : e.operands) {
          ASSIGN_OR_RETURN(Value v, Eval(*op));
          items.push_back(std::move(v));
        }
        return Nested(e, Value::MakeList(std::move(items), e.kind == Expr::Kind::kTuple
                                                              ? Value::Seq::kTuple : Value::Seq::kList));
      }
      case Expr::Kind::kDict: {
        Dict d;
        for (size_t k = 0; k < e.operands.size(); k += 2) {
          ASSIGN_OR_RETURN(Value key, Eval(*e.operands[k]));
          ASSIGN_OR_RETURN(Value value, Eval(*e.operands[k + 1]));
          if (!key.Is(Value::Kind::kString)) return LineError(e.line, "unsupported dict key: keys must be strings");
          bool replaced = false;
          for (auto& [k2, v2] : d) {
            if (k2 == key.s) {
              v2 = value;
              replaced = true;
            }
          }
          if (!replaced) d.emplace_back(key.s, std::move(value));
        }
        return Nested(e, Value::MakeDict(std::move(d)));
      }
      case Expr::Kind::kAttr: {
        ASSIGN_OR_RETURN(Value obj, Eval(*e.operands[0]));
        auto v = GetAttr(obj, e.name);
        return v.ok() ? v : AtLine(e.line, v.status());
      }
      case Expr::Kind::kItem: {
        ASSIGN_OR_RETURN(Value obj, Eval(*e.operands[0]));
        ASSIGN_OR_RETURN(Value key, Eval(*e.operands[1]));
        auto v = GetItem(obj, key);
        return v.ok() ? v : AtLine(e.line, v.status());
      }
      case Expr::Kind::kSlice: {
        ASSIGN_OR_RETURN(Value obj, Eval(*e.operands[0]));
        Value bounds[3] = {Value::None(), Value::None(), Value::None()};
        for (int k = 0; k < 3; ++k) {
          if (e.operands[k + 1]) {
            ASSIGN_OR_RETURN(bounds[k], Eval(*e.operands[k + 1]));
          }
        }
        auto v = Slice(obj, bounds[0], bounds[1], bounds[2]);
        return v.ok() ? v : AtLine(e.line, v.status());
      }
      case Expr::Kind::kCall: return EvalCall(e);
      case Expr::Kind::kFilter: {
        ASSIGN_OR_RETURN(Value v, Eval(*e.operands[0]));
        List args;
        Kwargs kwargs;
        RETURN_IF_ERROR(EvalArgs(e.args, &args, &kwargs));
        auto r = ApplyFilter(e.name, v, args, kwargs);
        return r.ok() ? r : AtLine(e.line, r.status());
      }
      case Expr::Kind::kTest: {
        ASSIGN_OR_RETURN(Value v, Eval(*e.operands[0]));
        List args;
        Kwargs kwargs;
        RETURN_IF_ERROR(EvalArgs(e.args, &args, &kwargs));
        if (!kwargs.empty()) return LineError(e.line, "unsupported keyword arguments to a test");
        auto r = ApplyTest(e.name, v, args);
        if (!r.ok()) return AtLine(e.line, r.status());
        return Value::Bool(*r != e.negated);
      }
      case Expr::Kind::kNeg: case Expr::Kind::kPos: {
        ASSIGN_OR_RETURN(Value v, Eval(*e.operands[0]));
        if (v.Is(Value::Kind::kUndefined)) return AtLine(e.line, UndefinedError(v));
        const bool neg = e.kind == Expr::Kind::kNeg;
        if (v.Is(Value::Kind::kFloat)) return Value::Float(neg ? -v.f : v.f);
        if (IsIntLike(v)) {
          if (neg && AsInt(v) == INT64_MIN) return LineError(e.line, "integer overflow");
          return Value::Int(neg ? -AsInt(v) : AsInt(v));
        }
        return LineError(e.line, absl::StrCat("bad operand type for unary ", neg ? "-" : "+", ": '",
                                              TypeName(v), "'"));
      }
      case Expr::Kind::kNot: {
        ASSIGN_OR_RETURN(Value v, Eval(*e.operands[0]));
        return Value::Bool(!Truthy(v));
      }
      case Expr::Kind::kAnd: case Expr::Kind::kOr: {  // Python's: the deciding operand itself
        ASSIGN_OR_RETURN(Value a, Eval(*e.operands[0]));
        if (Truthy(a) == (e.kind == Expr::Kind::kOr)) return a;
        return Eval(*e.operands[1]);
      }
      case Expr::Kind::kBinary: {
        ASSIGN_OR_RETURN(Value a, Eval(*e.operands[0]));
        ASSIGN_OR_RETURN(Value b, Eval(*e.operands[1]));
        auto r = Arithmetic(e.name, a, b);
        return r.ok() ? r : AtLine(e.line, r.status());
      }
      case Expr::Kind::kCompare: {
        ASSIGN_OR_RETURN(Value left, Eval(*e.operands[0]));
        for (size_t k = 0; k < e.ops.size(); ++k) {
          ASSIGN_OR_RETURN(Value right, Eval(*e.operands[k + 1]));
          auto r = Compare(e.ops[k], left, right);
          if (!r.ok()) return AtLine(e.line, r.status());
          if (!*r) return Value::Bool(false);
          left = std::move(right);
        }
        return Value::Bool(true);
      }
      case Expr::Kind::kCond: {
        ASSIGN_OR_RETURN(Value cond, Eval(*e.operands[1]));
        if (Truthy(cond)) return Eval(*e.operands[0]);
        if (e.operands[2]) return Eval(*e.operands[2]);
        return Value::Undefined(absl::StrCat("the inline if-expression on line ", e.line,
                                             " evaluated to false and no else section was defined."));
      }
      case Expr::Kind::kConcat: {
        std::string s;
        for (const auto& op : e.operands) {
          ASSIGN_OR_RETURN(Value v, Eval(*op));
          auto text = ToStr(v);
          if (!text.ok()) return AtLine(e.line, text.status());
          s += *text;
          if (s.size() > kMaxBytes) return LineError(e.line, "string longer than 16 MiB");
        }
        return Value::Str(std::move(s));
      }
    }
    return Value::None();
  }

  // A list or dict built by the template: bounded nesting keeps printing and comparing it (all
  // recursive) within the stack.
  static absl::StatusOr<Value> Nested(const Expr& e, Value v) {
    if (v.depth > kMaxNesting) return LineError(e.line, "values nested more than 100 levels deep");
    return v;
  }

  static bool HoldsNamespace(const Value& v) {
    if (v.Is(Value::Kind::kNamespace)) return true;
    if (v.Is(Value::Kind::kList)) {
      for (const Value& x : *v.list) {
        if (HoldsNamespace(x)) return true;
      }
    }
    if (v.Is(Value::Kind::kDict)) {
      for (const auto& [k, x] : *v.dict) {
        if (HoldsNamespace(x)) return true;
      }
    }
    return false;
  }

  static absl::StatusOr<bool> Compare(const std::string& op, const Value& a, const Value& b) {
    if (op == "==") return Equal(a, b);
    if (op == "!=") return !Equal(a, b);
    if (op == "<") return Less(a, b);
    if (op == ">") return Less(b, a);
    if (op == "<=" || op == ">=") {
      ASSIGN_OR_RETURN(bool less, op == "<=" ? Less(a, b) : Less(b, a));
      return less || Equal(a, b);
    }
    ASSIGN_OR_RETURN(bool in, Contains(b, a));
    return op == "in" ? in : !in;
  }

  absl::StatusOr<Value> EvalCall(const Expr& e) {
    ASSIGN_OR_RETURN(Value callee, Eval(*e.operands[0]));
    List args;
    Kwargs kwargs;
    RETURN_IF_ERROR(EvalArgs(e.args, &args, &kwargs));
    if (callee.Is(Value::Kind::kUndefined)) return AtLine(e.line, UndefinedError(callee));
    if (!callee.Is(Value::Kind::kCallable)) {
      return LineError(e.line, absl::StrCat("'", TypeName(callee), "' object is not callable"));
    }
    auto r = callee.self ? CallBound(callee, args, kwargs) : CallGlobal(callee.s, args, kwargs);
    return r.ok() ? r : AtLine(e.line, r.status());
  }

  absl::StatusOr<Value> CallBound(const Value& callee, const List& args, const Kwargs& kwargs) {
    if (callee.s == "loop.cycle") {
      if (args.empty()) return TypeError("no items for cycling given");
      return args[callee.self->i % static_cast<int64_t>(args.size())];
    }
    return CallMethod(*callee.self, callee.s, args, kwargs);
  }

  absl::StatusOr<Value> CallGlobal(const std::string& name, const List& args, const Kwargs& kwargs) {
    if (name == "raise_exception") {
      std::string msg;
      if (!args.empty()) {
        ASSIGN_OR_RETURN(msg, ToStr(args[0]));
      }
      return TypeError(absl::StrCat("raise_exception: ", msg));
    }
    if (name == "namespace" || name == "dict") {
      Dict d;
      if (args.size() > 1) return TypeError(absl::StrCat(name, "() takes at most 1 positional argument"));
      if (!args.empty()) {
        if (!args[0].Is(Value::Kind::kDict)) return TypeError(absl::StrCat("unsupported ", name, "() argument"));
        d = *args[0].dict;
      }
      for (const auto& [k, v] : kwargs) {
        bool replaced = false;
        for (auto& [k2, v2] : d) {
          if (k2 == k) v2 = v, replaced = true;
        }
        if (!replaced) d.emplace_back(k, v);
      }
      if (name == "dict") {
        Value v = Value::MakeDict(std::move(d));
        if (v.depth > kMaxNesting) return TypeError("values nested more than 100 levels deep");
        return v;
      }
      for (const auto& [k, v] : d) {
        if (HoldsNamespace(v)) return TypeError("unsupported: a namespace inside a namespace");
      }
      Value ns;
      ns.kind = Value::Kind::kNamespace;
      ns.ns = std::make_shared<Dict>(std::move(d));
      return ns;
    }
    if (name == "range") {
      if (args.empty() || args.size() > 3 || !kwargs.empty()) return TypeError("range expects 1 to 3 integers");
      for (const Value& a : args) {
        if (!IsIntLike(a)) return TypeError(absl::StrCat("'", TypeName(a), "' object cannot be interpreted as an integer"));
      }
      const int64_t start = args.size() > 1 ? AsInt(args[0]) : 0;
      const int64_t stop = args.size() > 1 ? AsInt(args[1]) : AsInt(args[0]);
      const int64_t step = args.size() > 2 ? AsInt(args[2]) : 1;
      if (step == 0) return TypeError("range() arg 3 must not be zero");
      const double count = std::ceil((static_cast<double>(stop) - start) / step);
      if (count > kMaxRange) return TypeError("Range too big. The sandbox blocks ranges larger than MAX_RANGE (100000).");
      List items;
      for (int64_t k = start; step > 0 ? k < stop : k > stop; k += step) items.push_back(Value::Int(k));
      return Value::MakeList(std::move(items));
    }
    if (name == "strftime_now") {
      if (args.size() != 1 || !args[0].Is(Value::Kind::kString)) return TypeError("strftime_now expects a format string");
      std::tm tm{};
      const std::time_t now = options_.fixed_time.value_or(std::time(nullptr));
      if (options_.fixed_time) {
        gmtime_r(&now, &tm);
      } else {
        localtime_r(&now, &tm);
      }
      std::string buf(256 + 8 * args[0].s.size(), '\0');
      const size_t n = std::strftime(buf.data(), buf.size(), args[0].s.c_str(), &tm);
      buf.resize(n);
      return Value::Str(std::move(buf));
    }
    return TypeError(absl::StrCat("'", name, "' is not callable"));
  }

  RenderOptions options_;
  std::vector<Scope> scopes_;
  int64_t steps_ = 0;
};

}  // namespace

absl::StatusOr<std::string> RenderTemplate(const Template& t, const Dict& variables,
                                           const RenderOptions& options) {
  Renderer r(variables, options);
  std::string out;
  ASSIGN_OR_RETURN(Renderer::Flow flow, r.Exec(t.body, &out));
  (void)flow;
  return out;
}

}  // namespace specula::jinja

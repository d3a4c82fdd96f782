// Chat templates: the renderer (statements, expressions, scopes, globals). The operations on
// values it applies are Python's, in chat_template_ops.cc.
#include <algorithm>
#include <cmath>
#include <unordered_map>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "chat/chat_template_internal.h"
#include "core/status_macros.h"

namespace specula::jinja {
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
    if (std::find(std::begin(kGlobals), std::end(kGlobals), name) != std::end(kGlobals)) {
      return Value::Callable(name);
    }
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
      case Expr::Kind::kList: case Expr::Kind::kTuple: return EvalList(e);
      case Expr::Kind::kDict: return EvalDict(e);
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
      case Expr::Kind::kSlice: return EvalSlice(e);
      case Expr::Kind::kCall: return EvalCall(e);
      case Expr::Kind::kFilter: return EvalFilter(e);
      case Expr::Kind::kTest: return EvalTest(e);
      case Expr::Kind::kNeg: case Expr::Kind::kPos: return EvalUnary(e);
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
      case Expr::Kind::kCompare: return EvalCompare(e);
      case Expr::Kind::kCond: return EvalCond(e);
      case Expr::Kind::kConcat: return EvalConcat(e);
    }
    return Value::None();
  }

  absl::StatusOr<Value> EvalList(const Expr& e) {
    List items;
    for (const auto& op : e.operands) {
      ASSIGN_OR_RETURN(Value v, Eval(*op));
      items.push_back(std::move(v));
    }
    return Nested(e, Value::MakeList(std::move(items), e.kind == Expr::Kind::kTuple
                                                          ? Value::Seq::kTuple : Value::Seq::kList));
  }

  // A dict display: a repeated key keeps its first place and takes the last value, as in Python.
  absl::StatusOr<Value> EvalDict(const Expr& e) {
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

  absl::StatusOr<Value> EvalSlice(const Expr& e) {
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

  absl::StatusOr<Value> EvalFilter(const Expr& e) {
    ASSIGN_OR_RETURN(Value v, Eval(*e.operands[0]));
    List args;
    Kwargs kwargs;
    RETURN_IF_ERROR(EvalArgs(e.args, &args, &kwargs));
    auto r = ApplyFilter(e.name, v, args, kwargs);
    return r.ok() ? r : AtLine(e.line, r.status());
  }

  absl::StatusOr<Value> EvalTest(const Expr& e) {
    ASSIGN_OR_RETURN(Value v, Eval(*e.operands[0]));
    List args;
    Kwargs kwargs;
    RETURN_IF_ERROR(EvalArgs(e.args, &args, &kwargs));
    if (!kwargs.empty()) return LineError(e.line, "unsupported keyword arguments to a test");
    auto r = ApplyTest(e.name, v, args);
    if (!r.ok()) return AtLine(e.line, r.status());
    return Value::Bool(*r != e.negated);
  }

  absl::StatusOr<Value> EvalUnary(const Expr& e) {
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

  // A chain `a < b < c` is `a < b and b < c`, each operand evaluated once, stopping at the first
  // false comparison.
  absl::StatusOr<Value> EvalCompare(const Expr& e) {
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

  absl::StatusOr<Value> EvalCond(const Expr& e) {
    ASSIGN_OR_RETURN(Value cond, Eval(*e.operands[1]));
    if (Truthy(cond)) return Eval(*e.operands[0]);
    if (e.operands[2]) return Eval(*e.operands[2]);
    return Value::Undefined(absl::StrCat("the inline if-expression on line ", e.line,
                                         " evaluated to false and no else section was defined."));
  }

  absl::StatusOr<Value> EvalConcat(const Expr& e) {
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

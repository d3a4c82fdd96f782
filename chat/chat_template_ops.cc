// Chat templates: Python's semantics for the core operations on values (truth, equality,
// ordering, arithmetic, attribute and item access). Undefined values follow jinja2's default
// Undefined: they print as '', are false and iterate as empty, and using them any other way is an
// error.
#include <algorithm>
#include <cmath>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "chat/chat_template_internal.h"

namespace specula::jinja {
namespace {

double AsFloat(const Value& v) { return v.Is(Value::Kind::kFloat) ? v.f : static_cast<double>(AsInt(v)); }

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

absl::Status Unsupported(const std::string& op, const Value& a, const Value& b) {
  return TypeError(absl::StrCat("unsupported operand type(s) for ", op, ": '", TypeName(a), "' and '",
                                TypeName(b), "'"));
}

// + - * / // % ** on two numbers; an int result beyond 64 bits is an error (Python's ints grow).
absl::StatusOr<Value> NumberArithmetic(const std::string& op, const Value& a, const Value& b) {
  const auto overflow = TypeError("integer overflow (the result does not fit in 64 bits)");
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
  return Unsupported(op, a, b);
}

// The operators on anything but two numbers: + concatenates and * repeats strings, lists and
// tuples; other operands get Python's error.
absl::StatusOr<Value> SequenceArithmetic(const std::string& op, const Value& a, const Value& b) {
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
  return Unsupported(op, a, b);
}

}  // namespace

absl::StatusOr<Value> Arithmetic(const std::string& op, const Value& a, const Value& b) {
  if (a.Is(Value::Kind::kUndefined)) return UndefinedError(a);
  if (b.Is(Value::Kind::kUndefined)) return UndefinedError(b);
  if (a.IsNumber() && b.IsNumber()) return NumberArithmetic(op, a, b);
  return SequenceArithmetic(op, a, b);
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

}  // namespace specula::jinja

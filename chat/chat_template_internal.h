// Internals of the chat template engine (chat/chat_template.h), shared by its parts:
//   chat_template_lexer.cc     source -> tokens (whitespace control, trim_blocks, lstrip_blocks)
//   chat_template.cc           tokens -> syntax tree; ChatTemplate::Parse
//   chat_template_vars.cc      the variables (messages, tools, JSON) as values; Render, RenderJson
//   chat_template_eval.cc      the renderer
//   chat_template_ops.cc       the core operations on values
//   chat_template_values.cc    printing values, tojson, Python's str functions
//   chat_template_builtins.cc  filters, tests, str and dict methods
// Semantics follow Python jinja2 as transformers configures it; "Python" below means what CPython
// does for the same operation.
#pragma once

#include <cstdint>
#include <ctime>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace specula::jinja {

struct Value;
using List = std::vector<Value>;
using Dict = std::vector<std::pair<std::string, Value>>;  // insertion order, like a Python dict

// A template value. Lists and dicts are immutable once built (the sandbox forbids mutation), so
// they are shared; namespaces are the one mutable object and are shared on purpose.
struct Value {
  enum class Kind { kUndefined, kNone, kBool, kInt, kFloat, kString, kList, kDict, kNamespace,
                    kCallable };
  // What a kList stands for in Python: it changes printing, equality and a few errors.
  enum class Seq { kList, kTuple, kGenerator };

  Kind kind = Kind::kUndefined;
  Seq seq = Seq::kList;
  uint8_t depth = 0;  // list/dict nesting (kList, kDict), capped at 255
  bool b = false;
  int64_t i = 0;
  double f = 0;
  std::string s;  // kString: UTF-8 text; kUndefined: why it is undefined; kCallable: its name
  std::shared_ptr<const List> list;
  std::shared_ptr<const Dict> dict;
  std::shared_ptr<Dict> ns;            // kNamespace
  std::shared_ptr<const Value> self;   // kCallable: the object of a bound method, if any

  static Value Undefined(std::string why);
  static Value None();
  static Value Bool(bool v);
  static Value Int(int64_t v);
  static Value Float(double v);
  static Value Str(std::string v);
  static Value MakeList(List items, Seq seq = Seq::kList);
  static Value MakeDict(Dict items);
  static Value Callable(std::string name, std::shared_ptr<const Value> self = nullptr);

  bool Is(Kind k) const { return kind == k; }
  bool IsNumber() const { return kind == Kind::kBool || kind == Kind::kInt || kind == Kind::kFloat; }
  bool IsSeq() const { return kind == Kind::kList; }
};

const Value* Find(const Dict& d, std::string_view key);

// Bounds that keep a hostile template (or tool JSON) from exhausting the stack or memory; real
// chat templates are far below them.
inline constexpr int kMaxNesting = 100;              // blocks, expressions, list/dict values
inline constexpr size_t kMaxBytes = size_t{16} << 20;  // the output, and any one string
inline constexpr size_t kMaxItems = 100'000;         // any one list

// ---- Syntax tree ----------------------------------------------------------------------------

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;
struct Arg {
  std::string name;  // empty for a positional argument
  ExprPtr value;
};

struct Expr {
  enum class Kind {
    kLiteral,  // value
    kName,     // name
    kList, kTuple,  // operands: the items
    kDict,     // operands: key0, value0, key1, value1, ...
    kAttr,     // operands[0].name
    kItem,     // operands[0][operands[1]]
    kSlice,    // operands[0][operands[1]:operands[2]:operands[3]] (null: omitted)
    kCall,     // operands[0](args)
    kFilter,   // operands[0] | name(args)
    kTest,     // operands[0] is [not] name(args)
    kNeg, kPos, kNot,  // operands[0]
    kAnd, kOr,  // operands[0], operands[1]
    kBinary,   // operands[0] name operands[1]; name is + - * / // % **
    kCompare,  // operands[0] ops[0] operands[1] ops[1] ...; ops are == != < > <= >= in notin
    kCond,     // operands[0] if operands[1] else operands[2] (null: no else)
    kConcat,   // operands joined with ~
  };
  Kind kind;
  int line = 0;
  Value value;
  std::string name;
  std::vector<ExprPtr> operands;
  std::vector<Arg> args;
  std::vector<std::string> ops;
  bool negated = false;  // kTest
};

struct Stmt;
using Body = std::vector<std::unique_ptr<Stmt>>;

struct Stmt {
  enum class Kind {
    kText,        // text
    kPrint,       // {{ expr }}
    kIf,          // branches; a null test is the else branch
    kFor,         // for targets in expr [if cond] body [else else_body]
    kSet,         // set targets = expr, or set targets[0].attr = expr
    kSetBlock,    // set targets[0] %} body {% endset
    kBreak, kContinue,
    kGeneration,  // transformers' {% generation %} body {% endgeneration %}: just the body
  };
  Kind kind;
  int line = 0;
  std::string text;
  ExprPtr expr;
  std::vector<std::string> targets;
  std::string attr;
  ExprPtr cond;
  std::vector<std::pair<ExprPtr, Body>> branches;
  Body body;
  Body else_body;
};

struct Template {
  Body body;
};

// ---- Lexer, parser and renderer -------------------------------------------------------------

struct Token {
  enum class Kind { kText, kBlockBegin, kBlockEnd, kVarBegin, kVarEnd, kName, kString, kInt,
                    kFloat, kOp, kEof };
  Kind kind;
  std::string text;  // kText, kName, kString (unescaped), kOp
  int line = 0;
  int64_t i = 0;
  double f = 0;
};

// The tokens of a template: text and tags, with trim_blocks / lstrip_blocks applied to the text.
absl::StatusOr<std::vector<Token>> Lex(std::string_view source);

absl::StatusOr<std::shared_ptr<const Template>> ParseTemplate(std::string_view source);

struct RenderOptions {
  std::optional<std::time_t> fixed_time;  // what strftime_now() formats (UTC); else local now
};
absl::StatusOr<std::string> RenderTemplate(const Template& t, const Dict& variables,
                                           const RenderOptions& options);

// ---- Core operations (chat_template_ops.cc) -------------------------------------------------

// Python semantics of the basic operations. Errors are plain messages (the renderer adds the line).
// A bool is an int to Python: it indexes, repeats and counts as one.
inline bool IsIntLike(const Value& v) { return v.Is(Value::Kind::kInt) || v.Is(Value::Kind::kBool); }
inline int64_t AsInt(const Value& v) { return v.Is(Value::Kind::kBool) ? v.b : v.i; }  // int-like v
// Python's TypeError, as the templates' errors name it.
inline absl::Status TypeError(const std::string& msg) { return absl::InvalidArgumentError(msg); }
bool Truthy(const Value& v);
std::string TypeName(const Value& v);
bool Equal(const Value& a, const Value& b);
absl::StatusOr<List> Iterate(const Value& v);        // for x in v
absl::StatusOr<bool> Less(const Value& a, const Value& b);  // a < b
absl::StatusOr<bool> Contains(const Value& container, const Value& item);  // item in container
absl::StatusOr<Value> Arithmetic(const std::string& op, const Value& a, const Value& b);
absl::StatusOr<Value> GetAttr(const Value& obj, const std::string& name);  // obj.name
absl::StatusOr<Value> GetItem(const Value& obj, const Value& key);        // obj[key]
absl::StatusOr<Value> Slice(const Value& obj, const Value& start, const Value& stop,
                            const Value& step);
absl::Status UndefinedError(const Value& v);  // the error for using `v` where a value is needed

// ---- Python's str and JSON (chat_template_values.cc) ----------------------------------------

// Code points of UTF-8 text; an invalid byte b is U+DC00+b (Python's surrogateescape), so
// Encode(Decode(s)) == s for any bytes.
std::u32string Decode(std::string_view s);
std::string Encode(std::u32string_view s);
bool IsSpace(char32_t c);  // str.isspace()
std::string Upper(std::string_view s);       // str.upper()
std::string Lower(std::string_view s);       // str.lower()
std::string Capitalize(std::string_view s);  // str.capitalize()
std::string PyTitle(std::string_view s);     // str.title()
std::string JinjaTitle(std::string_view s);  // jinja2's title filter (words split at [-\s({[<])
bool IsCase(std::string_view s, bool lower);  // str.islower() / str.isupper()
// str.strip(chars) (also lstrip/rstrip); `chars` null or not a string: whitespace.
std::string Strip(std::string_view s, const Value* chars, bool left, bool right);
List Split(std::string_view s, const Value& sep, int64_t maxsplit);  // str.split(); sep None: whitespace
std::string Replace(std::string_view s, std::string_view old, std::string_view with, int64_t count);

absl::StatusOr<std::string> ToStr(const Value& v);  // str(v): what {{ v }} prints
std::string Repr(const Value& v);                   // repr(v), as inside a printed list

// json.dumps(v, indent=..., separators=..., sort_keys=..., ensure_ascii=...).
struct JsonStyle {
  std::optional<std::string> indent;  // none: one line
  std::string item_sep = ", ";
  std::string key_sep = ": ";
  bool sort_keys = false;
  bool ensure_ascii = false;
};
absl::Status ToJson(const Value& v, const JsonStyle& style, int level, std::string* out);

// ---- Filters, tests and methods (chat_template_builtins.cc) ---------------------------------

// `Known*` is what the parser accepts.
bool KnownFilter(std::string_view name);
bool KnownTest(std::string_view name);
using Kwargs = std::vector<std::pair<std::string, Value>>;
absl::StatusOr<Value> ApplyFilter(const std::string& name, const Value& v, const List& args,
                                  const Kwargs& kwargs);
absl::StatusOr<bool> ApplyTest(const std::string& name, const Value& v, const List& args);
absl::StatusOr<Value> CallMethod(const Value& self, const std::string& name, const List& args,
                                 const Kwargs& kwargs);

}  // namespace specula::jinja

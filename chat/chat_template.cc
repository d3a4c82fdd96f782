// Chat templates: the parser and ChatTemplate::Parse. The parser follows jinja2's grammar and
// operator precedence (parser.py) for the statements and expressions of the supported subset; a
// filter, test or tag outside it is an error here, before anything is rendered.
#include "chat/chat_template.h"

#include <algorithm>
#include <cstdint>
#include <initializer_list>

#include "absl/strings/str_cat.h"
#include "chat/chat_template_internal.h"
#include "core/status_macros.h"

namespace specula {
namespace jinja {
namespace {

absl::Status SyntaxError(int line, std::string_view msg) {
  return absl::InvalidArgumentError(absl::StrCat("chat template line ", line, ": ", std::string(msg)));
}

// ---- Parser ---------------------------------------------------------------------------------

ExprPtr MakeExpr(Expr::Kind kind, int line) {
  auto e = std::make_unique<Expr>();
  e->kind = kind;
  e->line = line;
  return e;
}

ExprPtr MakeExpr(Expr::Kind kind, int line, ExprPtr a, ExprPtr b = nullptr) {
  auto e = MakeExpr(kind, line);
  e->operands.push_back(std::move(a));
  if (b) e->operands.push_back(std::move(b));
  return e;
}

class Parser {
 public:
  explicit Parser(std::vector<Token> tokens) : toks_(std::move(tokens)) {}

  absl::StatusOr<Body> ParseAll() {
    std::string end;
    ASSIGN_OR_RETURN(Body body, ParseBody({}, "", 0, &end));
    return body;
  }

 private:
  using Kind = Token::Kind;
  const Token& Cur() const { return toks_[pos_]; }
  const Token& Peek() const { return toks_[std::min(pos_ + 1, toks_.size() - 1)]; }
  void Next() {
    if (pos_ + 1 < toks_.size()) ++pos_;
  }
  bool IsName(std::string_view n) const { return Cur().kind == Kind::kName && Cur().text == n; }
  bool IsOp(std::string_view op) const { return Cur().kind == Kind::kOp && Cur().text == op; }

  static std::string Describe(const Token& t) {
    switch (t.kind) {
      case Kind::kBlockEnd: return "'%}'";
      case Kind::kVarEnd: return "'}}'";
      case Kind::kEof: return "end of template";
      case Kind::kString: return "string literal";
      case Kind::kInt: case Kind::kFloat: return "number";
      case Kind::kText: return "text";
      case Kind::kBlockBegin: return "'{%'";
      case Kind::kVarBegin: return "'{{'";
      default: return absl::StrCat("'", t.text, "'");
    }
  }
  absl::Status Unexpected() const {
    return SyntaxError(Cur().line, absl::StrCat("unexpected ", Describe(Cur())));
  }
  absl::Status ExpectOp(std::string_view op) {
    if (!IsOp(op)) {
      return SyntaxError(Cur().line, absl::StrCat("expected '", std::string(op), "', got ", Describe(Cur())));
    }
    Next();
    return absl::OkStatus();
  }
  absl::Status ExpectBlockEnd() {
    if (Cur().kind != Kind::kBlockEnd) {
      return SyntaxError(Cur().line, absl::StrCat("expected '%}', got ", Describe(Cur())));
    }
    Next();
    return absl::OkStatus();
  }
  absl::StatusOr<std::string> ExpectName() {
    if (Cur().kind != Kind::kName) {
      return SyntaxError(Cur().line, absl::StrCat("expected a name, got ", Describe(Cur())));
    }
    std::string n = Cur().text;
    Next();
    return n;
  }

  // Statements up to one of `ends` ({% endfor %}, ...); *end gets the tag found, and the parser
  // stands after its name. `opener` and `open_line` describe the block, for errors.
  absl::StatusOr<Body> ParseBody(std::initializer_list<std::string_view> ends,
                                 std::string_view opener, int open_line, std::string* end) {
    Body body;
    while (true) {
      const Token& t = Cur();
      if (t.kind == Kind::kEof) {
        if (ends.size() == 0) return body;
        return SyntaxError(open_line, absl::StrCat("'{% ", std::string(opener), " %}' is never closed (expected '{% end",
                                                   std::string(opener), " %}')"));
      }
      if (t.kind == Kind::kText) {
        auto s = std::make_unique<Stmt>();
        s->kind = Stmt::Kind::kText;
        s->line = t.line;
        s->text = t.text;
        body.push_back(std::move(s));
        Next();
      } else if (t.kind == Kind::kVarBegin) {
        auto s = std::make_unique<Stmt>();
        s->kind = Stmt::Kind::kPrint;
        s->line = t.line;
        Next();
        ASSIGN_OR_RETURN(s->expr, ParseTuple(true));
        if (Cur().kind != Kind::kVarEnd) {
          return SyntaxError(Cur().line, absl::StrCat("expected '}}', got ", Describe(Cur())));
        }
        Next();
        body.push_back(std::move(s));
      } else if (t.kind == Kind::kBlockBegin) {
        Next();
        const int line = Cur().line;
        ASSIGN_OR_RETURN(std::string name, ExpectName());
        for (std::string_view e : ends) {
          if (name == e) {
            *end = name;
            return body;
          }
        }
        ASSIGN_OR_RETURN(auto stmt, ParseStatement(name, line));
        body.push_back(std::move(stmt));
      } else {
        return Unexpected();
      }
    }
  }

  // The statement that the tag `name` opens (its name read), up to and including its last '%}'.
  absl::StatusOr<std::unique_ptr<Stmt>> ParseStatement(const std::string& name, int line) {
    const Nest nest(&depth_);
    if (nest.TooDeep()) return TooDeep();
    auto s = std::make_unique<Stmt>();
    s->line = line;
    if (name == "if") {
      RETURN_IF_ERROR(ParseIf(s.get()));
    } else if (name == "for") {
      RETURN_IF_ERROR(ParseFor(s.get()));
    } else if (name == "set") {
      RETURN_IF_ERROR(ParseSet(s.get()));
    } else if (name == "break" || name == "continue") {
      if (loop_depth_ == 0) return SyntaxError(line, absl::StrCat("'", name, "' outside a for loop"));
      s->kind = name == "break" ? Stmt::Kind::kBreak : Stmt::Kind::kContinue;
    } else if (name == "generation") {
      s->kind = Stmt::Kind::kGeneration;
      RETURN_IF_ERROR(ExpectBlockEnd());
      std::string end;
      ASSIGN_OR_RETURN(s->body, ParseBody({"endgeneration"}, "generation", line, &end));
    } else {
      return UnknownTag(name, line);
    }
    RETURN_IF_ERROR(ExpectBlockEnd());
    return s;
  }

  // `if`, any `elif`s, an optional `else`, `endif`: a branch each, the else branch's test null.
  absl::Status ParseIf(Stmt* s) {
    s->kind = Stmt::Kind::kIf;
    std::string tag = "if";
    std::string end;
    while (true) {
      ExprPtr test;
      if (tag != "else") {
        ASSIGN_OR_RETURN(test, ParseTuple(false));
      }
      RETURN_IF_ERROR(ExpectBlockEnd());
      Body body;
      if (tag == "else") {
        ASSIGN_OR_RETURN(body, ParseBody({"endif"}, "if", s->line, &end));
      } else {
        ASSIGN_OR_RETURN(body, ParseBody({"elif", "else", "endif"}, "if", s->line, &end));
      }
      s->branches.emplace_back(std::move(test), std::move(body));
      if (end == "endif") return absl::OkStatus();
      tag = end;
    }
  }

  // `for targets in expr [if cond]`, the body, an optional `else` body, `endfor`.
  absl::Status ParseFor(Stmt* s) {
    s->kind = Stmt::Kind::kFor;
    ASSIGN_OR_RETURN(s->targets, ParseTargets());
    if (!IsName("in")) return SyntaxError(Cur().line, "expected 'in' in for loop");
    Next();
    ASSIGN_OR_RETURN(s->expr, ParseTuple(false));
    if (IsName("if")) {
      Next();
      ASSIGN_OR_RETURN(s->cond, ParseExpression(true));
    }
    if (IsName("recursive")) return SyntaxError(Cur().line, "unsupported recursive for loop");
    RETURN_IF_ERROR(ExpectBlockEnd());
    std::string end;
    ++loop_depth_;
    ASSIGN_OR_RETURN(s->body, ParseBody({"endfor", "else"}, "for", s->line, &end));
    --loop_depth_;
    if (end == "else") {
      RETURN_IF_ERROR(ExpectBlockEnd());
      ASSIGN_OR_RETURN(s->else_body, ParseBody({"endfor"}, "for", s->line, &end));
    }
    return absl::OkStatus();
  }

  // `set a = expr`, `set a, b = expr`, `set ns.attr = expr`, or the block `set a` ... `endset`.
  absl::Status ParseSet(Stmt* s) {
    ASSIGN_OR_RETURN(std::string target, ExpectName());
    s->targets.push_back(target);
    if (IsOp(".")) {
      Next();
      ASSIGN_OR_RETURN(s->attr, ExpectName());
    } else {
      while (IsOp(",")) {
        Next();
        ASSIGN_OR_RETURN(std::string more, ExpectName());
        s->targets.push_back(more);
      }
    }
    if (IsOp("=")) {
      Next();
      s->kind = Stmt::Kind::kSet;
      ASSIGN_OR_RETURN(s->expr, ParseTuple(true));
    } else if (Cur().kind == Kind::kBlockEnd && s->targets.size() == 1 && s->attr.empty()) {
      s->kind = Stmt::Kind::kSetBlock;
      Next();
      std::string end;
      ASSIGN_OR_RETURN(s->body, ParseBody({"endset"}, "set", s->line, &end));
    } else if (IsOp("|")) {
      return SyntaxError(Cur().line, "unsupported filtered block set");
    } else {
      return SyntaxError(Cur().line, absl::StrCat("expected '=' in set, got ", Describe(Cur())));
    }
    return absl::OkStatus();
  }

  // The error for a tag outside the subset: jinja2's own tags are unsupported, a stray end, elif
  // or else is unexpected, anything else unknown.
  static absl::Status UnknownTag(const std::string& name, int line) {
    static const char* const kJinjaTags[] = {"macro", "call", "filter", "block", "extends",
                                             "include", "import", "from", "with", "autoescape",
                                             "do", "print", "trans", "pluralize", "raw"};
    for (const char* tag : kJinjaTags) {
      if (name == tag) return SyntaxError(line, absl::StrCat("unsupported tag '", name, "'"));
    }
    if (name.rfind("end", 0) == 0 || name == "elif" || name == "else") {
      return SyntaxError(line, absl::StrCat("unexpected '{% ", name, " %}'"));
    }
    return SyntaxError(line, absl::StrCat("unknown tag '", name, "'"));
  }

  // for-loop targets: `x`, `k, v` or `(k, v)`.
  absl::StatusOr<std::vector<std::string>> ParseTargets() {
    const bool paren = IsOp("(");
    if (paren) Next();
    std::vector<std::string> names;
    ASSIGN_OR_RETURN(std::string first, ExpectName());
    names.push_back(first);
    while (IsOp(",")) {
      Next();
      if (IsName("in") || IsOp(")")) break;
      ASSIGN_OR_RETURN(std::string more, ExpectName());
      names.push_back(more);
    }
    if (paren) RETURN_IF_ERROR(ExpectOp(")"));
    return names;
  }

  bool AtTupleEnd() const {
    return Cur().kind == Kind::kVarEnd || Cur().kind == Kind::kBlockEnd || IsOp(")") ||
           Cur().kind == Kind::kEof;
  }

  // `a`, or `a, b, ...` as a tuple (jinja2's parse_tuple).
  absl::StatusOr<ExprPtr> ParseTuple(bool with_condexpr) {
    const int line = Cur().line;
    std::vector<ExprPtr> items;
    bool is_tuple = false;
    while (true) {
      if (!items.empty()) {
        if (!IsOp(",")) break;
        Next();
        is_tuple = true;
        if (AtTupleEnd()) break;
      }
      ASSIGN_OR_RETURN(auto e, ParseExpression(with_condexpr));
      items.push_back(std::move(e));
    }
    if (!is_tuple) return std::move(items[0]);
    auto t = MakeExpr(Expr::Kind::kTuple, line);
    t->operands = std::move(items);
    return t;
  }

  absl::StatusOr<ExprPtr> ParseExpression(bool with_condexpr) {
    const Nest nest(&depth_);
    if (nest.TooDeep()) return TooDeep();
    if (!with_condexpr) return ParseOr();
    ASSIGN_OR_RETURN(auto expr, ParseOr());
    while (IsName("if")) {
      const int line = Cur().line;
      Next();
      ASSIGN_OR_RETURN(auto cond, ParseOr());
      ExprPtr otherwise;
      if (IsName("else")) {
        Next();
        ASSIGN_OR_RETURN(otherwise, ParseExpression(true));
      }
      auto c = MakeExpr(Expr::Kind::kCond, line, std::move(expr), std::move(cond));
      c->operands.push_back(std::move(otherwise));
      expr = std::move(c);
    }
    return expr;
  }

  absl::StatusOr<ExprPtr> ParseOr() {
    ASSIGN_OR_RETURN(auto left, ParseAnd());
    while (IsName("or")) {
      const int line = Cur().line;
      Next();
      ASSIGN_OR_RETURN(auto right, ParseAnd());
      left = MakeExpr(Expr::Kind::kOr, line, std::move(left), std::move(right));
    }
    return left;
  }

  absl::StatusOr<ExprPtr> ParseAnd() {
    ASSIGN_OR_RETURN(auto left, ParseNot());
    while (IsName("and")) {
      const int line = Cur().line;
      Next();
      ASSIGN_OR_RETURN(auto right, ParseNot());
      left = MakeExpr(Expr::Kind::kAnd, line, std::move(left), std::move(right));
    }
    return left;
  }

  absl::StatusOr<ExprPtr> ParseNot() {
    const Nest nest(&depth_);
    if (nest.TooDeep()) return TooDeep();
    if (IsName("not")) {
      const int line = Cur().line;
      Next();
      ASSIGN_OR_RETURN(auto operand, ParseNot());
      return MakeExpr(Expr::Kind::kNot, line, std::move(operand));
    }
    return ParseCompare();
  }

  absl::StatusOr<ExprPtr> ParseCompare() {
    const int line = Cur().line;
    ASSIGN_OR_RETURN(auto first, ParseMath1());
    ExprPtr cmp;
    while (true) {
      std::string op;
      if (Cur().kind == Kind::kOp && (Cur().text == "==" || Cur().text == "!=" || Cur().text == "<" ||
                                      Cur().text == ">" || Cur().text == "<=" || Cur().text == ">=")) {
        op = Cur().text;
        Next();
      } else if (IsName("in")) {
        op = "in";
        Next();
      } else if (IsName("not") && Peek().kind == Kind::kName && Peek().text == "in") {
        op = "notin";
        Next();
        Next();
      } else {
        break;
      }
      if (!cmp) cmp = MakeExpr(Expr::Kind::kCompare, line, std::move(first));
      ASSIGN_OR_RETURN(auto operand, ParseMath1());
      cmp->operands.push_back(std::move(operand));
      cmp->ops.push_back(op);
    }
    return cmp ? std::move(cmp) : std::move(first);
  }

  absl::StatusOr<ExprPtr> ParseBinaryLevel(std::initializer_list<std::string_view> ops,
                                           absl::StatusOr<ExprPtr> (Parser::*next)()) {
    ASSIGN_OR_RETURN(auto left, (this->*next)());
    while (Cur().kind == Kind::kOp) {
      std::string op;
      for (std::string_view o : ops) {
        if (Cur().text == o) op = std::string(o);
      }
      if (op.empty()) break;
      const int line = Cur().line;
      Next();
      ASSIGN_OR_RETURN(auto right, (this->*next)());
      left = MakeExpr(Expr::Kind::kBinary, line, std::move(left), std::move(right));
      left->name = op;
    }
    return left;
  }
  absl::StatusOr<ExprPtr> ParseMath1() { return ParseBinaryLevel({"+", "-"}, &Parser::ParseConcat); }
  absl::StatusOr<ExprPtr> ParseMath2() {
    return ParseBinaryLevel({"*", "/", "//", "%"}, &Parser::ParsePow);
  }
  absl::StatusOr<ExprPtr> ParsePow() { return ParseBinaryLevel({"**"}, &Parser::ParseUnaryFiltered); }
  absl::StatusOr<ExprPtr> ParseUnaryFiltered() { return ParseUnary(true); }

  absl::StatusOr<ExprPtr> ParseConcat() {
    const int line = Cur().line;
    ASSIGN_OR_RETURN(auto first, ParseMath2());
    if (!IsOp("~")) return first;
    auto c = MakeExpr(Expr::Kind::kConcat, line, std::move(first));
    while (IsOp("~")) {
      Next();
      ASSIGN_OR_RETURN(auto more, ParseMath2());
      c->operands.push_back(std::move(more));
    }
    return c;
  }

  absl::StatusOr<ExprPtr> ParseUnary(bool with_filter) {
    const Nest nest(&depth_);
    if (nest.TooDeep()) return TooDeep();
    const int line = Cur().line;
    ExprPtr node;
    if (IsOp("-") || IsOp("+")) {
      const bool neg = IsOp("-");
      Next();
      ASSIGN_OR_RETURN(auto operand, ParseUnary(false));
      node = MakeExpr(neg ? Expr::Kind::kNeg : Expr::Kind::kPos, line, std::move(operand));
    } else {
      ASSIGN_OR_RETURN(node, ParsePrimary());
    }
    ASSIGN_OR_RETURN(node, ParsePostfix(std::move(node)));
    if (with_filter) {
      ASSIGN_OR_RETURN(node, ParseFilterExpr(std::move(node)));
    }
    return node;
  }

  absl::StatusOr<ExprPtr> ParsePrimary() {
    const Token& t = Cur();
    const int line = t.line;
    auto literal = [&](Value v) {
      auto e = MakeExpr(Expr::Kind::kLiteral, line);
      e->value = std::move(v);
      return e;
    };
    switch (t.kind) {
      case Kind::kName: {
        ExprPtr e;
        if (t.text == "true" || t.text == "True") {
          e = literal(Value::Bool(true));
        } else if (t.text == "false" || t.text == "False") {
          e = literal(Value::Bool(false));
        } else if (t.text == "none" || t.text == "None") {
          e = literal(Value::None());
        } else {
          e = MakeExpr(Expr::Kind::kName, line);
          e->name = t.text;
        }
        Next();
        return e;
      }
      case Kind::kString: {
        std::string s;
        while (Cur().kind == Kind::kString) {  // adjacent literals concatenate
          s += Cur().text;
          Next();
        }
        return literal(Value::Str(std::move(s)));
      }
      case Kind::kInt: {
        auto e = literal(Value::Int(t.i));
        Next();
        return e;
      }
      case Kind::kFloat: {
        auto e = literal(Value::Float(t.f));
        Next();
        return e;
      }
      case Kind::kOp:
        if (t.text == "(") {
          Next();
          if (IsOp(")")) {
            Next();
            return MakeExpr(Expr::Kind::kTuple, line);
          }
          ASSIGN_OR_RETURN(auto e, ParseTuple(true));
          RETURN_IF_ERROR(ExpectOp(")"));
          return e;
        }
        if (t.text == "[" || t.text == "{") {
          const bool is_dict = t.text == "{";
          const std::string close = is_dict ? "}" : "]";
          auto e = MakeExpr(is_dict ? Expr::Kind::kDict : Expr::Kind::kList, line);
          Next();
          while (!IsOp(close)) {
            if (!e->operands.empty()) RETURN_IF_ERROR(ExpectOp(","));
            if (IsOp(close)) break;
            ASSIGN_OR_RETURN(auto item, ParseExpression(true));
            e->operands.push_back(std::move(item));
            if (is_dict) {
              RETURN_IF_ERROR(ExpectOp(":"));
              ASSIGN_OR_RETURN(auto value, ParseExpression(true));
              e->operands.push_back(std::move(value));
            }
          }
          Next();
          return e;
        }
        return Unexpected();
      default:
        return Unexpected();
    }
  }

  absl::StatusOr<ExprPtr> ParsePostfix(ExprPtr node) {
    while (true) {
      const int line = Cur().line;
      if (IsOp(".")) {
        Next();
        if (Cur().kind == Kind::kName) {
          node = MakeExpr(Expr::Kind::kAttr, line, std::move(node));
          node->name = Cur().text;
        } else if (Cur().kind == Kind::kInt) {
          auto index = MakeExpr(Expr::Kind::kLiteral, line);
          index->value = Value::Int(Cur().i);
          node = MakeExpr(Expr::Kind::kItem, line, std::move(node), std::move(index));
        } else {
          return SyntaxError(line, absl::StrCat("expected an attribute name after '.', got ",
                                                Describe(Cur())));
        }
        Next();
      } else if (IsOp("[")) {
        Next();
        ASSIGN_OR_RETURN(node, ParseSubscript(std::move(node), line));
      } else if (IsOp("(")) {
        ASSIGN_OR_RETURN(node, ParseCall(std::move(node)));
      } else {
        return node;
      }
    }
  }

  // After '[': an index `x[i]` or a slice `x[a:b:c]`.
  absl::StatusOr<ExprPtr> ParseSubscript(ExprPtr node, int line) {
    ExprPtr parts[3];
    int part = 0;
    bool is_slice = false;
    while (true) {
      if (!IsOp(":") && !IsOp("]")) {
        ASSIGN_OR_RETURN(parts[part], ParseExpression(true));
      }
      if (IsOp(":") && part < 2) {
        is_slice = true;
        ++part;
        Next();
        continue;
      }
      break;
    }
    if (IsOp(",")) return SyntaxError(Cur().line, "unsupported tuple subscript");
    RETURN_IF_ERROR(ExpectOp("]"));
    if (!is_slice) {
      if (!parts[0]) return SyntaxError(line, "empty subscript");
      return MakeExpr(Expr::Kind::kItem, line, std::move(node), std::move(parts[0]));
    }
    auto s = MakeExpr(Expr::Kind::kSlice, line, std::move(node));
    for (auto& p : parts) s->operands.push_back(std::move(p));
    return s;
  }

  // After the callee, at '(': positional and keyword arguments.
  absl::Status ParseArgs(std::vector<Arg>* args) {
    RETURN_IF_ERROR(ExpectOp("("));
    bool seen_kwarg = false;
    while (!IsOp(")")) {
      if (!args->empty()) {
        RETURN_IF_ERROR(ExpectOp(","));
        if (IsOp(")")) break;
      }
      if (IsOp("*") || IsOp("**")) return SyntaxError(Cur().line, "unsupported *args / **kwargs");
      Arg arg;
      if (Cur().kind == Kind::kName && Peek().kind == Kind::kOp && Peek().text == "=") {
        arg.name = Cur().text;
        Next();
        Next();
        seen_kwarg = true;
      } else if (seen_kwarg) {
        return SyntaxError(Cur().line, "positional argument after a keyword argument");
      }
      ASSIGN_OR_RETURN(arg.value, ParseExpression(true));
      args->push_back(std::move(arg));
    }
    Next();
    return absl::OkStatus();
  }

  absl::StatusOr<ExprPtr> ParseCall(ExprPtr callee) {
    auto call = MakeExpr(Expr::Kind::kCall, Cur().line, std::move(callee));
    RETURN_IF_ERROR(ParseArgs(&call->args));
    return call;
  }

  absl::StatusOr<std::string> ParseDottedName() {
    ASSIGN_OR_RETURN(std::string name, ExpectName());
    while (IsOp(".")) {
      Next();
      ASSIGN_OR_RETURN(std::string more, ExpectName());
      absl::StrAppend(&name, ".", more);
    }
    return name;
  }

  // Filters (`| f(args)`), tests (`is [not] t args`) and calls after a unary expression.
  absl::StatusOr<ExprPtr> ParseFilterExpr(ExprPtr node) {
    while (true) {
      const int line = Cur().line;
      if (IsOp("|")) {
        Next();
        ASSIGN_OR_RETURN(std::string name, ParseDottedName());
        if (!KnownFilter(name)) return SyntaxError(line, absl::StrCat("unsupported filter '", name, "'"));
        node = MakeExpr(Expr::Kind::kFilter, line, std::move(node));
        node->name = name;
        if (IsOp("(")) RETURN_IF_ERROR(ParseArgs(&node->args));
      } else if (IsName("is")) {
        Next();
        const bool negated = IsName("not");
        if (negated) Next();
        ASSIGN_OR_RETURN(std::string name, ParseDottedName());
        if (!KnownTest(name)) return SyntaxError(line, absl::StrCat("unsupported test '", name, "'"));
        node = MakeExpr(Expr::Kind::kTest, line, std::move(node));
        node->name = name;
        node->negated = negated;
        const Kind k = Cur().kind;
        if (IsOp("(")) {
          RETURN_IF_ERROR(ParseArgs(&node->args));
        } else if ((k == Kind::kName || k == Kind::kString || k == Kind::kInt ||
                    k == Kind::kFloat || IsOp("[") || IsOp("{")) &&
                   !IsName("else") && !IsName("or") && !IsName("and")) {
          // `x is divisibleby 3`: one argument without parentheses, as jinja2 parses it.
          if (IsName("is")) return SyntaxError(Cur().line, "cannot chain tests with 'is'");
          Arg arg;
          ASSIGN_OR_RETURN(arg.value, ParsePrimary());
          ASSIGN_OR_RETURN(arg.value, ParsePostfix(std::move(arg.value)));
          node->args.push_back(std::move(arg));
        }
      } else if (IsOp("(")) {
        ASSIGN_OR_RETURN(node, ParseCall(std::move(node)));
      } else {
        return node;
      }
    }
  }

  // Counts nesting while alive; past kMaxNesting the parse fails instead of the stack.
  class Nest {
   public:
    explicit Nest(int* depth) : depth_(depth) { ++*depth_; }
    ~Nest() { --*depth_; }
    bool TooDeep() const { return *depth_ > kMaxNesting; }

   private:
    int* depth_;
  };
  absl::Status TooDeep() const { return SyntaxError(Cur().line, "nested more than 100 levels deep"); }

  std::vector<Token> toks_;
  size_t pos_ = 0;
  int loop_depth_ = 0;
  int depth_ = 0;
};

}  // namespace

absl::StatusOr<std::shared_ptr<const Template>> ParseTemplate(std::string_view source) {
  ASSIGN_OR_RETURN(std::vector<Token> tokens, Lex(source));
  Parser parser(std::move(tokens));
  auto t = std::make_shared<Template>();
  ASSIGN_OR_RETURN(t->body, parser.ParseAll());
  return std::shared_ptr<const Template>(std::move(t));
}

}  // namespace jinja

absl::StatusOr<ChatTemplate> ChatTemplate::Parse(std::string_view source) {
  ChatTemplate t;
  ASSIGN_OR_RETURN(t.template_, jinja::ParseTemplate(source));
  return t;
}

}  // namespace specula

#include "engine/jinja_parser.h"

#include <initializer_list>

#include "engine/jinja_lexer.h"

namespace pagellm::engine::jinja {
namespace {

std::string describe(const Token& t) {
  switch (t.type) {
    case TokenType::Text:
      return "text";
    case TokenType::VarBegin:
      return "'{{'";
    case TokenType::VarEnd:
      return "'}}'";
    case TokenType::BlockBegin:
      return "'{%'";
    case TokenType::BlockEnd:
      return "'%}'";
    case TokenType::End:
      return "end of template";
    case TokenType::String:
      return "string literal";
    default:
      return "'" + t.value + "'";
  }
}

class Parser {
 public:
  explicit Parser(std::vector<Token> tokens) : tokens_(std::move(tokens)) {}

  Body parse() {
    Body body = parse_body({}, "", 0);
    return body;
  }

 private:
  // --- token helpers -------------------------------------------------------------------
  const Token& cur() const { return tokens_[pos_]; }
  const Token& look(size_t ahead = 1) const {
    return tokens_[std::min(pos_ + ahead, tokens_.size() - 1)];
  }
  Token next() { return tokens_[pos_ < tokens_.size() - 1 ? pos_++ : pos_]; }
  bool is_name(const char* v) const { return cur().type == TokenType::Name && cur().value == v; }
  bool is_op(const char* v) const { return cur().type == TokenType::Op && cur().value == v; }
  bool skip_name(const char* v) {
    if (!is_name(v)) return false;
    ++pos_;
    return true;
  }
  bool skip_op(const char* v) {
    if (!is_op(v)) return false;
    ++pos_;
    return true;
  }
  [[noreturn]] void unexpected(const std::string& expected) const {
    fail("syntax error: expected " + expected + ", got " + describe(cur()), cur().line);
  }
  void expect_op(const char* v) {
    if (!skip_op(v)) unexpected(std::string("'") + v + "'");
  }
  std::string expect_name() {
    if (cur().type != TokenType::Name) unexpected("a name");
    return next().value;
  }
  void expect_block_end() {
    if (cur().type != TokenType::BlockEnd) unexpected("'%}'");
    ++pos_;
  }

  // --- statements ----------------------------------------------------------------------
  // Parses until a `{% NAME %}` with NAME in `ends`; leaves the position at NAME.
  Body parse_body(std::initializer_list<const char*> ends, const char* block, int block_line) {
    Body body;
    while (true) {
      const Token& t = cur();
      switch (t.type) {
        case TokenType::Text:
          body.push_back(std::make_unique<TextStmt>(t.value, t.line));
          ++pos_;
          break;
        case TokenType::VarBegin: {
          ++pos_;
          const int line = cur().line;
          ExprPtr expr = parse_tuple(true);
          if (cur().type != TokenType::VarEnd) unexpected("'}}'");
          ++pos_;
          body.push_back(std::make_unique<OutputStmt>(std::move(expr), line));
          break;
        }
        case TokenType::BlockBegin: {
          ++pos_;
          if (cur().type == TokenType::Name) {
            for (const char* end : ends) {
              if (cur().value == end) return body;
            }
          }
          if (StmtPtr stmt = parse_statement()) body.push_back(std::move(stmt));
          break;
        }
        case TokenType::End:
          if (ends.size() == 0) return body;
          fail(std::string("unexpected end of template: '") + block + "' opened at line " +
                   std::to_string(block_line) + " is never closed",
               t.line);
        default:
          unexpected("text or a tag");
      }
    }
  }

  // Consumes `{% NAME %}` closing tags; the `{%` was consumed by parse_body.
  void end_tag() {
    ++pos_;
    expect_block_end();
  }

  StmtPtr parse_statement() {
    if (cur().type != TokenType::Name) unexpected("a tag name");
    const std::string name = cur().value;
    const int line = cur().line;
    ++pos_;
    if (name == "if") return parse_if(line);
    if (name == "for") return parse_for(line);
    if (name == "set") return parse_set(line);
    if (name == "macro") return parse_macro(line);
    if (name == "filter") return parse_filter_block(line);
    if (name == "with") return parse_with(line);
    if (name == "break" || name == "continue") {
      if (loop_depth_ == 0) fail("'" + name + "' outside of a loop", line);
      expect_block_end();
      return std::make_unique<Stmt>(name == "break" ? Stmt::Kind::Break : Stmt::Kind::Continue,
                                    line);
    }
    if (name == "generation") {
      // transformers' {% generation %} marks assistant text; rendering keeps the body.
      expect_block_end();
      Body body = parse_body({"endgeneration"}, "generation", line);
      end_tag();
      auto with = std::make_unique<WithStmt>(line);
      with->body = std::move(body);
      return with;
    }
    static const char* const kUnsupported[] = {"include", "extends", "block",      "import", "from",
                                               "call",    "do",      "autoescape", "trans"};
    for (const char* tag : kUnsupported) {
      if (name == tag) fail("unsupported tag '" + name + "'", line);
    }
    if (name.rfind("end", 0) == 0 || name == "elif" || name == "else") {
      fail("unexpected tag '" + name + "'", line);
    }
    fail("unknown tag '" + name + "'", line);
  }

  StmtPtr parse_if(int line) {
    auto stmt = std::make_unique<IfStmt>(line);
    while (true) {
      ExprPtr test = parse_tuple(false);
      expect_block_end();
      Body body = parse_body({"elif", "else", "endif"}, "if", line);
      stmt->branches.emplace_back(std::move(test), std::move(body));
      const std::string tag = next().value;
      if (tag == "elif") continue;
      if (tag == "else") {
        expect_block_end();
        stmt->else_body = parse_body({"endif"}, "if", line);
        end_tag();
      } else {
        expect_block_end();
      }
      return stmt;
    }
  }

  StmtPtr parse_for(int line) {
    auto stmt = std::make_unique<ForStmt>(line);
    stmt->target = parse_target(false, "in");
    if (!skip_name("in")) unexpected("'in'");
    stmt->iter = parse_tuple(false, "recursive");
    if (skip_name("if")) stmt->condition = parse_expression(true);
    if (is_name("recursive")) fail("unsupported recursive for loop", line);
    expect_block_end();
    ++loop_depth_;
    stmt->body = parse_body({"endfor", "else"}, "for", line);
    --loop_depth_;
    if (next().value == "else") {
      expect_block_end();
      stmt->else_body = parse_body({"endfor"}, "for", line);
      end_tag();
    } else {
      expect_block_end();
    }
    return stmt;
  }

  StmtPtr parse_set(int line) {
    Target target = parse_target(true, nullptr);
    if (skip_op("=")) {
      auto stmt = std::make_unique<SetStmt>(line);
      stmt->target = std::move(target);
      stmt->value = parse_tuple(true);
      expect_block_end();
      return stmt;
    }
    auto stmt = std::make_unique<SetBlockStmt>(line);
    stmt->target = std::move(target);
    while (skip_op("|"))
      stmt->filters.push_back(parse_filter(nullptr));
    expect_block_end();
    stmt->body = parse_body({"endset"}, "set", line);
    end_tag();
    return stmt;
  }

  StmtPtr parse_macro(int line) {
    auto stmt = std::make_unique<MacroStmt>(line);
    stmt->name = expect_name();
    expect_op("(");
    while (!skip_op(")")) {
      if (!stmt->params.empty()) expect_op(",");
      if (skip_op(")")) break;
      std::string param = expect_name();
      ExprPtr default_value;
      if (skip_op("=")) default_value = parse_expression(true);
      stmt->params.emplace_back(std::move(param), std::move(default_value));
    }
    expect_block_end();
    const int saved_depth = loop_depth_;
    loop_depth_ = 0;
    stmt->body = parse_body({"endmacro"}, "macro", line);
    loop_depth_ = saved_depth;
    end_tag();
    return stmt;
  }

  StmtPtr parse_filter_block(int line) {
    auto stmt = std::make_unique<FilterBlockStmt>(line);
    do {
      stmt->filters.push_back(parse_filter(nullptr));
    } while (skip_op("|"));
    expect_block_end();
    stmt->body = parse_body({"endfilter"}, "filter", line);
    end_tag();
    return stmt;
  }

  StmtPtr parse_with(int line) {
    auto stmt = std::make_unique<WithStmt>(line);
    while (cur().type != TokenType::BlockEnd) {
      if (!stmt->assignments.empty()) expect_op(",");
      Target target = parse_target(false, nullptr);
      expect_op("=");
      stmt->assignments.emplace_back(std::move(target), parse_expression(true));
    }
    expect_block_end();
    stmt->body = parse_body({"endwith"}, "with", line);
    end_tag();
    return stmt;
  }

  Target parse_name_target() {
    Target t;
    t.line = cur().line;
    t.name = expect_name();
    return t;
  }

  // `name`, `a, b` / `(a, b)`, or (for set) `ns.attr`.
  Target parse_target(bool allow_namespace, const char* end_name) {
    const int line = cur().line;
    if (allow_namespace && cur().type == TokenType::Name && look().type == TokenType::Op &&
        look().value == ".") {
      Target t;
      t.kind = Target::Kind::NamespaceAttr;
      t.line = line;
      t.name = next().value;
      ++pos_;
      t.attr = expect_name();
      return t;
    }
    Target tuple;
    tuple.kind = Target::Kind::Tuple;
    tuple.line = line;
    bool trailing_comma = false;
    while (true) {
      if (skip_op("(")) {
        Target inner = parse_target(false, nullptr);
        expect_op(")");
        tuple.items.push_back(std::move(inner));
      } else {
        tuple.items.push_back(parse_name_target());
      }
      trailing_comma = skip_op(",");
      if (!trailing_comma) break;
      if (cur().type != TokenType::Name && !is_op("(")) break;
      if (end_name != nullptr && is_name(end_name)) break;
    }
    if (tuple.items.size() == 1 && !trailing_comma) return std::move(tuple.items[0]);
    return tuple;
  }

  // --- expressions ---------------------------------------------------------------------
  bool at_tuple_end(const char* extra_end) const {
    const Token& t = cur();
    if (t.type == TokenType::VarEnd || t.type == TokenType::BlockEnd || t.type == TokenType::End) {
      return true;
    }
    if (t.type == TokenType::Op && (t.value == ")" || t.value == "]" || t.value == "}"))
      return true;
    return extra_end != nullptr && t.type == TokenType::Name && t.value == extra_end;
  }

  // A comma-separated expression list: one item is itself, more make a tuple.
  ExprPtr parse_tuple(bool with_condexpr, const char* extra_end = nullptr,
                      bool explicit_parens = false) {
    const int line = cur().line;
    auto tuple = std::make_unique<ListExpr>(Expr::Kind::Tuple, line);
    bool is_tuple = false;
    while (true) {
      if (!tuple->items.empty()) {
        if (!skip_op(",")) break;
        is_tuple = true;
      }
      if (at_tuple_end(extra_end)) break;
      tuple->items.push_back(parse_expression(with_condexpr));
    }
    if (!is_tuple) {
      if (!tuple->items.empty()) return std::move(tuple->items[0]);
      if (!explicit_parens) unexpected("an expression");
    }
    return tuple;
  }

  ExprPtr parse_expression(bool with_condexpr) {
    return with_condexpr ? parse_condexpr() : parse_or();
  }

  ExprPtr parse_condexpr() {
    ExprPtr expr = parse_or();
    while (is_name("if")) {
      auto cond = std::make_unique<CondExpr>(cur().line);
      ++pos_;
      cond->test = parse_or();
      if (skip_name("else")) cond->else_expr = parse_condexpr();
      cond->then_expr = std::move(expr);
      expr = std::move(cond);
    }
    return expr;
  }

  ExprPtr parse_or() {
    ExprPtr left = parse_and();
    while (is_name("or")) {
      const int line = next().line;
      left = std::make_unique<BinaryExpr>(BinaryOp::Or, std::move(left), parse_and(), line);
    }
    return left;
  }

  ExprPtr parse_and() {
    ExprPtr left = parse_not();
    while (is_name("and")) {
      const int line = next().line;
      left = std::make_unique<BinaryExpr>(BinaryOp::And, std::move(left), parse_not(), line);
    }
    return left;
  }

  ExprPtr parse_not() {
    if (is_name("not")) {
      const int line = next().line;
      return std::make_unique<UnaryExpr>(UnaryOp::Not, parse_not(), line);
    }
    return parse_compare();
  }

  ExprPtr parse_compare() {
    const int line = cur().line;
    ExprPtr first = parse_math1();
    std::unique_ptr<CompareExpr> cmp;
    while (true) {
      CompareOp op;
      const Token& t = cur();
      if (t.type == TokenType::Op && t.value == "==")
        op = CompareOp::Eq;
      else if (t.type == TokenType::Op && t.value == "!=")
        op = CompareOp::Ne;
      else if (t.type == TokenType::Op && t.value == "<")
        op = CompareOp::Lt;
      else if (t.type == TokenType::Op && t.value == "<=")
        op = CompareOp::Le;
      else if (t.type == TokenType::Op && t.value == ">")
        op = CompareOp::Gt;
      else if (t.type == TokenType::Op && t.value == ">=")
        op = CompareOp::Ge;
      else if (is_name("in"))
        op = CompareOp::In;
      else if (is_name("not") && look().type == TokenType::Name && look().value == "in") {
        op = CompareOp::NotIn;
        ++pos_;
      } else {
        break;
      }
      ++pos_;
      if (!cmp) cmp = std::make_unique<CompareExpr>(std::move(first), line);
      cmp->rest.emplace_back(op, parse_math1());
    }
    if (cmp) return cmp;
    return first;
  }

  ExprPtr parse_math1() {
    ExprPtr left = parse_concat();
    while (is_op("+") || is_op("-")) {
      const Token t = next();
      left = std::make_unique<BinaryExpr>(t.value == "+" ? BinaryOp::Add : BinaryOp::Sub,
                                          std::move(left), parse_concat(), t.line);
    }
    return left;
  }

  ExprPtr parse_concat() {
    const int line = cur().line;
    ExprPtr first = parse_math2();
    if (!is_op("~")) return first;
    auto concat = std::make_unique<ConcatExpr>(line);
    concat->parts.push_back(std::move(first));
    while (skip_op("~"))
      concat->parts.push_back(parse_math2());
    return concat;
  }

  ExprPtr parse_math2() {
    ExprPtr left = parse_pow();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      const Token t = next();
      const BinaryOp op = t.value == "*"    ? BinaryOp::Mul
                          : t.value == "/"  ? BinaryOp::Div
                          : t.value == "//" ? BinaryOp::FloorDiv
                                            : BinaryOp::Mod;
      left = std::make_unique<BinaryExpr>(op, std::move(left), parse_pow(), t.line);
    }
    return left;
  }

  ExprPtr parse_pow() {
    ExprPtr left = parse_unary(true);
    while (is_op("**")) {
      const int line = next().line;
      left = std::make_unique<BinaryExpr>(BinaryOp::Pow, std::move(left), parse_unary(true), line);
    }
    return left;
  }

  ExprPtr parse_unary(bool with_filter) {
    const int line = cur().line;
    ExprPtr node;
    if (skip_op("-")) {
      node = std::make_unique<UnaryExpr>(UnaryOp::Neg, parse_unary(false), line);
    } else if (skip_op("+")) {
      node = std::make_unique<UnaryExpr>(UnaryOp::Pos, parse_unary(false), line);
    } else {
      node = parse_primary();
    }
    node = parse_postfix(std::move(node));
    if (with_filter) node = parse_filter_expr(std::move(node));
    return node;
  }

  ExprPtr parse_primary() {
    const Token& t = cur();
    const int line = t.line;
    switch (t.type) {
      case TokenType::Name: {
        const std::string name = next().value;
        if (name == "true" || name == "True")
          return std::make_unique<LiteralExpr>(Value(true), line);
        if (name == "false" || name == "False") {
          return std::make_unique<LiteralExpr>(Value(false), line);
        }
        if (name == "none" || name == "None") {
          return std::make_unique<LiteralExpr>(Value::none(), line);
        }
        return std::make_unique<NameExpr>(name, line);
      }
      case TokenType::String: {
        std::string s = next().value;
        while (cur().type == TokenType::String)
          s += next().value;
        return std::make_unique<LiteralExpr>(Value(std::move(s)), line);
      }
      case TokenType::Int:
        return std::make_unique<LiteralExpr>(Value(next().int_value), line);
      case TokenType::Float:
        return std::make_unique<LiteralExpr>(Value(next().float_value), line);
      default:
        break;
    }
    if (skip_op("(")) {
      ExprPtr inner = parse_tuple(true, nullptr, true);
      expect_op(")");
      return inner;
    }
    if (skip_op("[")) {
      auto list = std::make_unique<ListExpr>(Expr::Kind::List, line);
      while (!is_op("]")) {
        if (!list->items.empty()) expect_op(",");
        if (is_op("]")) break;
        list->items.push_back(parse_expression(true));
      }
      expect_op("]");
      return list;
    }
    if (skip_op("{")) {
      auto dict = std::make_unique<DictExpr>(line);
      while (!is_op("}")) {
        if (!dict->items.empty()) expect_op(",");
        if (is_op("}")) break;
        ExprPtr key = parse_expression(true);
        expect_op(":");
        dict->items.emplace_back(std::move(key), parse_expression(true));
      }
      expect_op("}");
      return dict;
    }
    unexpected("an expression");
  }

  ExprPtr parse_postfix(ExprPtr node) {
    while (true) {
      if (is_op(".")) {
        const int line = next().line;
        if (cur().type == TokenType::Int) {
          auto index = std::make_unique<LiteralExpr>(Value(next().int_value), line);
          node = std::make_unique<ItemExpr>(std::move(node), std::move(index), line);
        } else {
          node = std::make_unique<AttrExpr>(std::move(node), expect_name(), line);
        }
      } else if (is_op("[")) {
        node = parse_subscript(std::move(node));
      } else if (is_op("(")) {
        node = parse_call(std::move(node));
      } else {
        return node;
      }
    }
  }

  ExprPtr parse_subscript(ExprPtr node) {
    const int line = next().line;  // '['
    ExprPtr first;
    if (!is_op(":")) first = parse_expression(true);
    if (!is_op(":")) {
      if (is_op(",")) fail("unsupported tuple subscript", line);
      expect_op("]");
      return std::make_unique<ItemExpr>(std::move(node), std::move(first), line);
    }
    auto slice = std::make_unique<SliceExpr>(line);
    slice->object = std::move(node);
    slice->start = std::move(first);
    expect_op(":");
    if (!is_op("]") && !is_op(":")) slice->stop = parse_expression(true);
    if (skip_op(":") && !is_op("]")) slice->step = parse_expression(true);
    expect_op("]");
    return slice;
  }

  void parse_call_args(Arguments& args) {
    expect_op("(");
    bool first = true;
    while (!skip_op(")")) {
      if (!first) {
        expect_op(",");
        if (skip_op(")")) break;
      }
      first = false;
      if (is_op("*") || is_op("**")) fail("unsupported *args or **kwargs in call", cur().line);
      if (cur().type == TokenType::Name && look().type == TokenType::Op && look().value == "=") {
        std::string key = next().value;
        ++pos_;
        args.named.emplace_back(std::move(key), parse_expression(true));
      } else {
        if (!args.named.empty()) {
          fail("syntax error: positional argument after keyword argument", cur().line);
        }
        args.positional.push_back(parse_expression(true));
      }
    }
  }

  ExprPtr parse_call(ExprPtr callee) {
    auto call = std::make_unique<CallExpr>(std::move(callee), cur().line);
    parse_call_args(call->args);
    return call;
  }

  ExprPtr parse_filter_expr(ExprPtr node) {
    while (true) {
      if (skip_op("|")) {
        auto filter = parse_filter(std::move(node));
        node = std::move(filter);
      } else if (is_name("is")) {
        node = parse_test(std::move(node));
      } else if (is_op("(")) {
        node = parse_call(std::move(node));
      } else {
        return node;
      }
    }
  }

  std::unique_ptr<FilterExpr> parse_filter(ExprPtr input) {
    auto filter = std::make_unique<FilterExpr>(cur().line);
    filter->input = std::move(input);
    filter->name = expect_name();
    while (skip_op("."))
      filter->name += "." + expect_name();
    filter->fn = find_filter(filter->name);
    if (filter->fn == nullptr) fail("unsupported filter '" + filter->name + "'", filter->line);
    if (is_op("(")) parse_call_args(filter->args);
    return filter;
  }

  ExprPtr parse_test(ExprPtr input) {
    auto test = std::make_unique<TestExpr>(next().line);  // 'is'
    test->input = std::move(input);
    test->negated = skip_name("not");
    test->name = expect_name();
    while (skip_op("."))
      test->name += "." + expect_name();
    test->fn = find_test(test->name);
    if (test->fn == nullptr) fail("unsupported test '" + test->name + "'", test->line);
    const Token& t = cur();
    if (is_op("(")) {
      parse_call_args(test->args);
    } else if ((t.type == TokenType::Name || t.type == TokenType::String ||
                t.type == TokenType::Int || t.type == TokenType::Float || is_op("[") ||
                is_op("{")) &&
               !is_name("else") && !is_name("or") && !is_name("and")) {
      if (is_name("is")) fail("syntax error: tests cannot be chained with 'is'", t.line);
      test->args.positional.push_back(parse_postfix(parse_primary()));
    }
    return test;
  }

  std::vector<Token> tokens_;
  size_t pos_ = 0;
  int loop_depth_ = 0;
};

}  // namespace

Body parse_template(const std::string& source) {
  return Parser(tokenize(source)).parse();
}

}  // namespace pagellm::engine::jinja

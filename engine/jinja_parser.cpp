#include "engine/jinja_parser.h"

#include <initializer_list>

#include "engine/jinja_expr_parser.h"
#include "engine/jinja_token_stream.h"

namespace pagellm::engine::jinja {
namespace {

// Statements: text, `{{ expr }}` and the `{% tag %}` blocks; expressions are delegated.
class Parser : protected TokenCursor {
 public:
  explicit Parser(TokenStream& stream) : TokenCursor(stream), expr_(stream) {}

  Body parse() { return parse_body({}, "", 0); }

 private:
  ExprPtr parse_tuple(bool with_condexpr, const char* extra_end = nullptr) {
    return expr_.parse_tuple(with_condexpr, extra_end);
  }
  ExprPtr parse_expression(bool with_condexpr) { return expr_.parse_expression(with_condexpr); }
  std::unique_ptr<FilterExpr> parse_filter(ExprPtr input) {
    return expr_.parse_filter(std::move(input));
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
          advance();
          break;
        case TokenType::VarBegin: {
          advance();
          const int line = cur().line;
          ExprPtr expr = parse_tuple(true);
          if (cur().type != TokenType::VarEnd) unexpected("'}}'");
          advance();
          body.push_back(std::make_unique<OutputStmt>(std::move(expr), line));
          break;
        }
        case TokenType::BlockBegin: {
          advance();
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
    advance();
    expect_block_end();
  }

  StmtPtr parse_statement() {
    if (cur().type != TokenType::Name) unexpected("a tag name");
    const std::string name = cur().value;
    const int line = cur().line;
    advance();
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
      advance();
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

  ExpressionParser expr_;
  int loop_depth_ = 0;
};

}  // namespace

Body parse_template(const std::string& source) {
  TokenStream stream{tokenize(source), 0};
  return Parser(stream).parse();
}

}  // namespace pagellm::engine::jinja

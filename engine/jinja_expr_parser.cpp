// Expression parsing; see jinja_expr_parser.h for the precedence ladder.
#include "engine/jinja_expr_parser.h"

namespace pagellm::engine::jinja {

bool ExpressionParser::at_tuple_end(const char* extra_end) const {
  const Token& t = cur();
  if (t.type == TokenType::VarEnd || t.type == TokenType::BlockEnd || t.type == TokenType::End) {
    return true;
  }
  if (t.type == TokenType::Op && (t.value == ")" || t.value == "]" || t.value == "}")) return true;
  return extra_end != nullptr && t.type == TokenType::Name && t.value == extra_end;
}

ExprPtr ExpressionParser::parse_tuple(bool with_condexpr, const char* extra_end,
                                      bool explicit_parens) {
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

ExprPtr ExpressionParser::parse_expression(bool with_condexpr) {
  return with_condexpr ? parse_condexpr() : parse_or();
}

ExprPtr ExpressionParser::parse_condexpr() {
  ExprPtr expr = parse_or();
  while (is_name("if")) {
    auto cond = std::make_unique<CondExpr>(cur().line);
    advance();
    cond->test = parse_or();
    if (skip_name("else")) cond->else_expr = parse_condexpr();
    cond->then_expr = std::move(expr);
    expr = std::move(cond);
  }
  return expr;
}

ExprPtr ExpressionParser::parse_or() {
  ExprPtr left = parse_and();
  while (is_name("or")) {
    const int line = next().line;
    left = std::make_unique<BinaryExpr>(BinaryOp::Or, std::move(left), parse_and(), line);
  }
  return left;
}

ExprPtr ExpressionParser::parse_and() {
  ExprPtr left = parse_not();
  while (is_name("and")) {
    const int line = next().line;
    left = std::make_unique<BinaryExpr>(BinaryOp::And, std::move(left), parse_not(), line);
  }
  return left;
}

ExprPtr ExpressionParser::parse_not() {
  if (is_name("not")) {
    const int line = next().line;
    return std::make_unique<UnaryExpr>(UnaryOp::Not, parse_not(), line);
  }
  return parse_compare();
}

ExprPtr ExpressionParser::parse_compare() {
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
      advance();
    } else {
      break;
    }
    advance();
    if (!cmp) cmp = std::make_unique<CompareExpr>(std::move(first), line);
    cmp->rest.emplace_back(op, parse_math1());
  }
  if (cmp) return cmp;
  return first;
}

ExprPtr ExpressionParser::parse_math1() {
  ExprPtr left = parse_concat();
  while (is_op("+") || is_op("-")) {
    const Token t = next();
    left = std::make_unique<BinaryExpr>(t.value == "+" ? BinaryOp::Add : BinaryOp::Sub,
                                        std::move(left), parse_concat(), t.line);
  }
  return left;
}

ExprPtr ExpressionParser::parse_concat() {
  const int line = cur().line;
  ExprPtr first = parse_math2();
  if (!is_op("~")) return first;
  auto concat = std::make_unique<ConcatExpr>(line);
  concat->parts.push_back(std::move(first));
  while (skip_op("~"))
    concat->parts.push_back(parse_math2());
  return concat;
}

ExprPtr ExpressionParser::parse_math2() {
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

ExprPtr ExpressionParser::parse_pow() {
  ExprPtr left = parse_unary(true);
  while (is_op("**")) {
    const int line = next().line;
    left = std::make_unique<BinaryExpr>(BinaryOp::Pow, std::move(left), parse_unary(true), line);
  }
  return left;
}

ExprPtr ExpressionParser::parse_unary(bool with_filter) {
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

ExprPtr ExpressionParser::parse_primary() {
  const Token& t = cur();
  const int line = t.line;
  switch (t.type) {
    case TokenType::Name: {
      const std::string name = next().value;
      if (name == "true" || name == "True") return std::make_unique<LiteralExpr>(Value(true), line);
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

ExprPtr ExpressionParser::parse_postfix(ExprPtr node) {
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

ExprPtr ExpressionParser::parse_subscript(ExprPtr node) {
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

void ExpressionParser::parse_call_args(Arguments& args) {
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
      advance();
      args.named.emplace_back(std::move(key), parse_expression(true));
    } else {
      if (!args.named.empty()) {
        fail("syntax error: positional argument after keyword argument", cur().line);
      }
      args.positional.push_back(parse_expression(true));
    }
  }
}

ExprPtr ExpressionParser::parse_call(ExprPtr callee) {
  auto call = std::make_unique<CallExpr>(std::move(callee), cur().line);
  parse_call_args(call->args);
  return call;
}

ExprPtr ExpressionParser::parse_filter_expr(ExprPtr node) {
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

std::unique_ptr<FilterExpr> ExpressionParser::parse_filter(ExprPtr input) {
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

ExprPtr ExpressionParser::parse_test(ExprPtr input) {
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
              t.type == TokenType::Int || t.type == TokenType::Float || is_op("[") || is_op("{")) &&
             !is_name("else") && !is_name("or") && !is_name("and")) {
    if (is_name("is")) fail("syntax error: tests cannot be chained with 'is'", t.line);
    test->args.positional.push_back(parse_postfix(parse_primary()));
  }
  return test;
}

}  // namespace pagellm::engine::jinja

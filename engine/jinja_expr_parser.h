#pragma once
// Expressions, with jinja2's grammar and precedence (lowest first): conditional
// `a if c else b`, or, and, not, comparisons and `in`, + -, ~, * / // %, **, unary - +,
// then primaries with attribute, subscript, call, `|filter` and `is test` postfixes.

#include "engine/jinja_ast.h"
#include "engine/jinja_token_stream.h"

namespace pagellm::engine::jinja {

class ExpressionParser : protected TokenCursor {
 public:
  explicit ExpressionParser(TokenStream& stream) : TokenCursor(stream) {}

  // A comma-separated expression list: one item is itself, more make a tuple. Stops
  // before a tag end, a closing bracket, or the name `extra_end`.
  ExprPtr parse_tuple(bool with_condexpr, const char* extra_end = nullptr,
                      bool explicit_parens = false);
  ExprPtr parse_expression(bool with_condexpr);
  // `name(args)` after a `|`; `input` is null for filter blocks.
  std::unique_ptr<FilterExpr> parse_filter(ExprPtr input);

 private:
  bool at_tuple_end(const char* extra_end) const;
  ExprPtr parse_condexpr();
  ExprPtr parse_or();
  ExprPtr parse_and();
  ExprPtr parse_not();
  ExprPtr parse_compare();
  ExprPtr parse_math1();
  ExprPtr parse_concat();
  ExprPtr parse_math2();
  ExprPtr parse_pow();
  ExprPtr parse_unary(bool with_filter);
  ExprPtr parse_primary();
  ExprPtr parse_postfix(ExprPtr node);
  ExprPtr parse_subscript(ExprPtr node);
  void parse_call_args(Arguments& args);
  ExprPtr parse_call(ExprPtr callee);
  ExprPtr parse_filter_expr(ExprPtr node);
  ExprPtr parse_test(ExprPtr input);
};

}  // namespace pagellm::engine::jinja

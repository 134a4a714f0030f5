#pragma once
// The syntax tree of a parsed template. Filters and tests are resolved to functions at
// parse time, so a template naming an unsupported one fails when it is loaded.

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "engine/jinja_value.h"

namespace pagellm::engine::jinja {

using FilterFn = Value (*)(const Value& input, CallArgs& args);
using TestFn = bool (*)(const Value& input, CallArgs& args);

struct Expr {
  enum class Kind {
    Literal,
    Name,
    List,
    Tuple,
    Dict,
    Attr,
    Item,
    Slice,
    Call,
    Filter,
    Test,
    Unary,
    Binary,
    Compare,
    Cond,
    Concat
  };
  Expr(Kind k, int l) : kind(k), line(l) {}
  virtual ~Expr() = default;
  Kind kind;
  int line;
};
using ExprPtr = std::unique_ptr<Expr>;

struct Arguments {
  std::vector<ExprPtr> positional;
  std::vector<std::pair<std::string, ExprPtr>> named;
};

struct LiteralExpr : Expr {
  LiteralExpr(Value v, int l) : Expr(Kind::Literal, l), value(std::move(v)) {}
  Value value;
};
struct NameExpr : Expr {
  NameExpr(std::string n, int l) : Expr(Kind::Name, l), name(std::move(n)) {}
  std::string name;
};
struct ListExpr : Expr {  // Kind::List or Kind::Tuple
  using Expr::Expr;
  std::vector<ExprPtr> items;
};
struct DictExpr : Expr {
  explicit DictExpr(int l) : Expr(Kind::Dict, l) {}
  std::vector<std::pair<ExprPtr, ExprPtr>> items;
};
struct AttrExpr : Expr {
  AttrExpr(ExprPtr o, std::string n, int l)
      : Expr(Kind::Attr, l), object(std::move(o)), name(std::move(n)) {}
  ExprPtr object;
  std::string name;
};
struct ItemExpr : Expr {
  ItemExpr(ExprPtr o, ExprPtr i, int l)
      : Expr(Kind::Item, l), object(std::move(o)), index(std::move(i)) {}
  ExprPtr object;
  ExprPtr index;
};
struct SliceExpr : Expr {
  explicit SliceExpr(int l) : Expr(Kind::Slice, l) {}
  ExprPtr object;
  ExprPtr start, stop, step;  // each may be null
};
struct CallExpr : Expr {
  CallExpr(ExprPtr c, int l) : Expr(Kind::Call, l), callee(std::move(c)) {}
  ExprPtr callee;
  Arguments args;
};
struct FilterExpr : Expr {
  explicit FilterExpr(int l) : Expr(Kind::Filter, l) {}
  ExprPtr input;  // null in `{% filter %}` blocks and block sets, where the body is the input
  std::string name;
  FilterFn fn = nullptr;
  Arguments args;
};
struct TestExpr : Expr {
  explicit TestExpr(int l) : Expr(Kind::Test, l) {}
  ExprPtr input;
  std::string name;
  TestFn fn = nullptr;
  Arguments args;
  bool negated = false;
};

enum class UnaryOp { Neg, Pos, Not };
struct UnaryExpr : Expr {
  UnaryExpr(UnaryOp o, ExprPtr e, int l) : Expr(Kind::Unary, l), op(o), operand(std::move(e)) {}
  UnaryOp op;
  ExprPtr operand;
};

enum class BinaryOp { Add, Sub, Mul, Div, FloorDiv, Mod, Pow, And, Or };
struct BinaryExpr : Expr {
  BinaryExpr(BinaryOp o, ExprPtr a, ExprPtr b, int l)
      : Expr(Kind::Binary, l), op(o), left(std::move(a)), right(std::move(b)) {}
  BinaryOp op;
  ExprPtr left, right;
};

enum class CompareOp { Eq, Ne, Lt, Le, Gt, Ge, In, NotIn };
struct CompareExpr : Expr {
  CompareExpr(ExprPtr f, int l) : Expr(Kind::Compare, l), first(std::move(f)) {}
  ExprPtr first;
  std::vector<std::pair<CompareOp, ExprPtr>> rest;  // chained: a < b < c
};
struct CondExpr : Expr {
  explicit CondExpr(int l) : Expr(Kind::Cond, l) {}
  ExprPtr test, then_expr, else_expr;  // else_expr may be null (gives Undefined)
};
struct ConcatExpr : Expr {
  explicit ConcatExpr(int l) : Expr(Kind::Concat, l) {}
  std::vector<ExprPtr> parts;
};

// Left-hand side of set/for: a name, `ns.attr`, or a tuple of targets.
struct Target {
  enum class Kind { Name, NamespaceAttr, Tuple };
  Kind kind = Kind::Name;
  std::string name;
  std::string attr;
  std::vector<Target> items;
  int line = 0;
};

struct Stmt {
  enum class Kind {
    Text,
    Output,
    If,
    For,
    Set,
    SetBlock,
    Macro,
    Break,
    Continue,
    FilterBlock,
    With
  };
  Stmt(Kind k, int l) : kind(k), line(l) {}
  virtual ~Stmt() = default;
  Kind kind;
  int line;
};
using StmtPtr = std::unique_ptr<Stmt>;
using Body = std::vector<StmtPtr>;

struct TextStmt : Stmt {
  TextStmt(std::string t, int l) : Stmt(Kind::Text, l), text(std::move(t)) {}
  std::string text;
};
struct OutputStmt : Stmt {
  OutputStmt(ExprPtr e, int l) : Stmt(Kind::Output, l), expr(std::move(e)) {}
  ExprPtr expr;
};
struct IfStmt : Stmt {
  explicit IfStmt(int l) : Stmt(Kind::If, l) {}
  std::vector<std::pair<ExprPtr, Body>> branches;
  Body else_body;
};
struct ForStmt : Stmt {
  explicit ForStmt(int l) : Stmt(Kind::For, l) {}
  Target target;
  ExprPtr iter;
  ExprPtr condition;  // `for x in xs if cond`, may be null
  Body body;
  Body else_body;
};
struct SetStmt : Stmt {
  explicit SetStmt(int l) : Stmt(Kind::Set, l) {}
  Target target;
  ExprPtr value;
};
struct SetBlockStmt : Stmt {
  explicit SetBlockStmt(int l) : Stmt(Kind::SetBlock, l) {}
  Target target;
  std::vector<std::unique_ptr<FilterExpr>> filters;
  Body body;
};
struct MacroStmt : Stmt {
  explicit MacroStmt(int l) : Stmt(Kind::Macro, l) {}
  std::string name;
  std::vector<std::pair<std::string, ExprPtr>> params;  // default may be null
  Body body;
};
struct FilterBlockStmt : Stmt {
  explicit FilterBlockStmt(int l) : Stmt(Kind::FilterBlock, l) {}
  std::vector<std::unique_ptr<FilterExpr>> filters;
  Body body;
};
struct WithStmt : Stmt {
  explicit WithStmt(int l) : Stmt(Kind::With, l) {}
  std::vector<std::pair<Target, ExprPtr>> assignments;
  Body body;
};

// Registries of the supported filters and tests (jinja_filters.cpp); nullptr if unknown.
FilterFn find_filter(const std::string& name);
TestFn find_test(const std::string& name);

}  // namespace pagellm::engine::jinja

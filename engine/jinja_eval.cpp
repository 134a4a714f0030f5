#include "engine/jinja_eval.h"

#include <cmath>
#include <limits>
#include <unordered_map>

#include "engine/jinja_builtins.h"

namespace pagellm::engine::jinja {
namespace {

struct Scope {
  std::unordered_map<std::string, Value> vars;
  std::shared_ptr<Scope> parent;

  const Value* find(const std::string& name) const {
    for (const Scope* s = this; s != nullptr; s = s->parent.get()) {
      auto it = s->vars.find(name);
      if (it != s->vars.end()) return &it->second;
    }
    return nullptr;
  }
};
using ScopePtr = std::shared_ptr<Scope>;

ScopePtr child_of(const ScopePtr& parent) {
  auto scope = std::make_shared<Scope>();
  scope->parent = parent;
  return scope;
}

[[noreturn]] void fail_operands(const char* op, const Value& a, const Value& b, int line) {
  if (a.is_undefined()) fail_undefined(a, line);
  if (b.is_undefined()) fail_undefined(b, line);
  fail(std::string("unsupported operand type(s) for ") + op + ": '" + a.type_name() + "' and '" +
           b.type_name() + "'",
       line);
}

// Python's integers do not overflow; these do, so a result past int64 is an error
// rather than a wrapped (undefined in C++) value.
[[noreturn]] void fail_overflow(int line) {
  fail("integer overflow: the result does not fit in 64 bits", line);
}
int64_t checked_add(int64_t a, int64_t b, int line) {
  int64_t r;
  if (__builtin_add_overflow(a, b, &r)) fail_overflow(line);
  return r;
}
int64_t checked_sub(int64_t a, int64_t b, int line) {
  int64_t r;
  if (__builtin_sub_overflow(a, b, &r)) fail_overflow(line);
  return r;
}
int64_t checked_mul(int64_t a, int64_t b, int line) {
  int64_t r;
  if (__builtin_mul_overflow(a, b, &r)) fail_overflow(line);
  return r;
}
// a ** b for b >= 0, by squaring.
int64_t checked_pow(int64_t a, int64_t b, int line) {
  int64_t r = 1;
  while (b > 0) {
    if (b & 1) r = checked_mul(r, a, line);
    b >>= 1;
    if (b > 0) a = checked_mul(a, a, line);
  }
  return r;
}

// A repetition's result is capped: a template has no business building more, and a
// huge count would otherwise take the server's memory.
constexpr int64_t kMaxRepeatElements = int64_t{1} << 26;

Value repeat(const Value& seq, int64_t times, int line) {
  const int64_t unit = seq.is_string() ? static_cast<int64_t>(seq.as_string().size())
                                       : static_cast<int64_t>(seq.as_list().size());
  if (times > 0 && unit > 0 && times > kMaxRepeatElements / unit)
    fail("repetition too large: " + std::to_string(times) + " times", line);
  if (seq.is_string()) {
    std::string out;
    for (int64_t i = 0; i < times; ++i)
      out += seq.as_string();
    return out;
  }
  ValueList out;
  for (int64_t i = 0; i < times; ++i)
    out.insert(out.end(), seq.as_list().begin(), seq.as_list().end());
  return seq.kind() == Value::Kind::Tuple ? Value::tuple(std::move(out))
                                          : Value::list(std::move(out));
}

Value arithmetic(BinaryOp op, const Value& a, const Value& b, int line) {
  const bool numbers = a.is_number() && b.is_number();
  const bool floats = numbers && (a.is_float() || b.is_float());
  switch (op) {
    case BinaryOp::Add:
      if (numbers)
        return floats ? Value(a.as_double() + b.as_double())
                      : Value(checked_add(a.as_int(), b.as_int(), line));
      if (a.is_string() && b.is_string()) return a.as_string() + b.as_string();
      if (a.is_sequence() && a.kind() == b.kind()) {
        ValueList out = a.as_list();
        out.insert(out.end(), b.as_list().begin(), b.as_list().end());
        return a.kind() == Value::Kind::Tuple ? Value::tuple(std::move(out))
                                              : Value::list(std::move(out));
      }
      if (a.is_string() && !b.is_undefined()) {
        fail("can only concatenate str (not \"" + b.type_name() + "\") to str", line);
      }
      fail_operands("+", a, b, line);
    case BinaryOp::Sub:
      if (numbers)
        return floats ? Value(a.as_double() - b.as_double())
                      : Value(checked_sub(a.as_int(), b.as_int(), line));
      fail_operands("-", a, b, line);
    case BinaryOp::Mul:
      if (numbers)
        return floats ? Value(a.as_double() * b.as_double())
                      : Value(checked_mul(a.as_int(), b.as_int(), line));
      if ((a.is_string() || a.is_sequence()) && (b.is_int() || b.is_bool()))
        return repeat(a, b.as_int(), line);
      if ((b.is_string() || b.is_sequence()) && (a.is_int() || a.is_bool()))
        return repeat(b, a.as_int(), line);
      fail_operands("*", a, b, line);
    case BinaryOp::Div:
      if (numbers) {
        if (b.as_double() == 0) fail("division by zero", line);
        return a.as_double() / b.as_double();
      }
      fail_operands("/", a, b, line);
    case BinaryOp::FloorDiv:
    case BinaryOp::Mod:
      if (numbers) {
        if (b.as_double() == 0)
          fail(op == BinaryOp::Mod ? "modulo by zero" : "division by zero", line);
        if (floats) {
          // CPython's float divmod: fmod, then the sign of the divisor.
          const double x = a.as_double(), y = b.as_double();
          double mod = std::fmod(x, y);
          double div = (x - mod) / y;
          if (mod != 0) {
            if ((y < 0) != (mod < 0)) {
              mod += y;
              div -= 1.0;
            }
          } else {
            mod = std::copysign(0.0, y);
          }
          double floor_div;
          if (div != 0) {
            floor_div = std::floor(div);
            if (div - floor_div > 0.5) floor_div += 1.0;
          } else {
            floor_div = std::copysign(0.0, x / y);
          }
          return op == BinaryOp::FloorDiv ? Value(floor_div) : Value(mod);
        }
        const int64_t x = a.as_int(), y = b.as_int();
        if (x == std::numeric_limits<int64_t>::min() && y == -1) {
          if (op == BinaryOp::Mod) return Value(int64_t{0});
          fail_overflow(line);
        }
        int64_t q = x / y;
        if ((x % y != 0) && ((x < 0) != (y < 0))) --q;  // Python floors toward -inf
        return op == BinaryOp::FloorDiv ? Value(q) : Value(x - q * y);
      }
      if (op == BinaryOp::Mod && a.is_string())
        fail("unsupported string formatting with '%'", line);
      fail_operands(op == BinaryOp::Mod ? "%" : "//", a, b, line);
    case BinaryOp::Pow:
      if (numbers) {
        if (!floats && b.as_int() >= 0) return checked_pow(a.as_int(), b.as_int(), line);
        return std::pow(a.as_double(), b.as_double());
      }
      fail_operands("**", a, b, line);
    default:
      fail("internal error: bad arithmetic operator", line);
  }
}

bool contains(const Value& container, const Value& item, int line) {
  switch (container.kind()) {
    case Value::Kind::String:
      if (!item.is_string()) {
        if (item.is_undefined()) fail_undefined(item, line);
        fail("'in <string>' requires string as left operand, not " + item.type_name(), line);
      }
      return container.as_string().find(item.as_string()) != std::string::npos;
    case Value::Kind::Dict:
      return item.is_string() && container.as_dict().find(item.as_string()) != nullptr;
    case Value::Kind::Undefined:
      return false;
    case Value::Kind::List:
    case Value::Kind::Tuple:
      for (const Value& v : container.as_list()) {
        if (values_equal(v, item)) return true;
      }
      return false;
    default:
      fail("argument of type '" + container.type_name() + "' is not iterable", line);
  }
}

bool compare(CompareOp op, const Value& a, const Value& b, int line) {
  switch (op) {
    case CompareOp::Eq:
      return values_equal(a, b);
    case CompareOp::Ne:
      return !values_equal(a, b);
    case CompareOp::In:
      return contains(b, a, line);
    case CompareOp::NotIn:
      return !contains(b, a, line);
    default:
      break;
  }
  if (a.is_undefined()) fail_undefined(a, line);
  if (b.is_undefined()) fail_undefined(b, line);
  switch (op) {
    case CompareOp::Lt:
      return value_less(a, b, line);
    case CompareOp::Le:
      return !value_less(b, a, line);
    case CompareOp::Gt:
      return value_less(b, a, line);
    default:
      return !value_less(a, b, line);
  }
}

class Renderer {
 public:
  enum class Flow { Normal, Break, Continue };

  Flow exec_body(const Body& body, std::string& out, const ScopePtr& scope) {
    for (const StmtPtr& stmt : body) {
      const Flow flow = exec(*stmt, out, scope);
      if (flow != Flow::Normal) return flow;
    }
    return Flow::Normal;
  }

 private:
  Flow exec(const Stmt& stmt, std::string& out, const ScopePtr& scope) {
    switch (stmt.kind) {
      case Stmt::Kind::Text:
        out += static_cast<const TextStmt&>(stmt).text;
        return Flow::Normal;
      case Stmt::Kind::Output: {
        const Value v = eval(*static_cast<const OutputStmt&>(stmt).expr, scope);
        if (v.is_string())
          out += v.as_string();
        else
          out += to_str(v);
        return Flow::Normal;
      }
      case Stmt::Kind::If: {
        const auto& s = static_cast<const IfStmt&>(stmt);
        for (const auto& [test, body] : s.branches) {
          if (eval(*test, scope).truthy()) return exec_body(body, out, scope);
        }
        return exec_body(s.else_body, out, scope);
      }
      case Stmt::Kind::For:
        return exec_for(static_cast<const ForStmt&>(stmt), out, scope);
      case Stmt::Kind::Set: {
        const auto& s = static_cast<const SetStmt&>(stmt);
        assign(s.target, eval(*s.value, scope), *scope);
        return Flow::Normal;
      }
      case Stmt::Kind::SetBlock: {
        const auto& s = static_cast<const SetBlockStmt&>(stmt);
        assign(s.target, render_block(s.body, s.filters, scope), *scope);
        return Flow::Normal;
      }
      case Stmt::Kind::Macro:
        define_macro(static_cast<const MacroStmt&>(stmt), scope);
        return Flow::Normal;
      case Stmt::Kind::Break:
        return Flow::Break;
      case Stmt::Kind::Continue:
        return Flow::Continue;
      case Stmt::Kind::FilterBlock: {
        const auto& s = static_cast<const FilterBlockStmt&>(stmt);
        out += to_str(render_block(s.body, s.filters, scope));
        return Flow::Normal;
      }
      case Stmt::Kind::With: {
        const auto& s = static_cast<const WithStmt&>(stmt);
        ScopePtr inner = child_of(scope);
        for (const auto& [target, expr] : s.assignments)
          assign(target, eval(*expr, scope), *inner);
        return exec_body(s.body, out, inner);
      }
    }
    return Flow::Normal;
  }

  Value render_block(const Body& body, const std::vector<std::unique_ptr<FilterExpr>>& filters,
                     const ScopePtr& scope) {
    std::string text;
    exec_body(body, text, child_of(scope));  // its own scope, as jinja2's inner frame
    Value v(std::move(text));
    for (const auto& filter : filters)
      v = apply_filter(*filter, v, scope);
    return v;
  }

  Flow exec_for(const ForStmt& s, std::string& out, const ScopePtr& scope) {
    ValueList items = iterate(eval(*s.iter, scope), s.line);
    if (s.condition) {
      ValueList kept;
      for (Value& item : items) {
        ScopePtr probe = child_of(scope);
        assign(s.target, item, *probe);
        if (eval(*s.condition, probe).truthy()) kept.push_back(std::move(item));
      }
      items = std::move(kept);
    }
    if (items.empty()) return exec_body(s.else_body, out, scope);
    auto state = std::make_shared<LoopState>();
    state->items = std::make_shared<const ValueList>(std::move(items));
    const ValueList& list = *state->items;
    const Value loop = Value::loop(state);
    for (size_t i = 0; i < list.size(); ++i) {
      state->index0 = i;
      ScopePtr inner = child_of(scope);
      inner->vars.emplace("loop", loop);
      assign(s.target, list[i], *inner);
      if (exec_body(s.body, out, inner) == Flow::Break) break;
    }
    return Flow::Normal;
  }

  void assign(const Target& target, Value value, Scope& scope) {
    switch (target.kind) {
      case Target::Kind::Name:
        scope.vars[target.name] = std::move(value);
        return;
      case Target::Kind::NamespaceAttr: {
        const Value* ns = scope.find(target.name);
        if (ns == nullptr || !ns->is_namespace()) {
          fail("cannot assign attribute '" + target.attr + "' on non-namespace object '" +
                   target.name + "'",
               target.line);
        }
        ns->mutable_namespace().set(target.attr, std::move(value));
        return;
      }
      case Target::Kind::Tuple: {
        const ValueList items = iterate(value, target.line);
        if (items.size() != target.items.size()) {
          fail(items.size() > target.items.size() ? "too many values to unpack"
                                                  : "not enough values to unpack",
               target.line);
        }
        for (size_t i = 0; i < items.size(); ++i)
          assign(target.items[i], items[i], scope);
        return;
      }
    }
  }

  void define_macro(const MacroStmt& m, const ScopePtr& scope) {
    // A weak reference: the macro lives in the scope it captures.
    std::weak_ptr<Scope> weak = scope;
    Renderer* self = this;
    scope->vars[m.name] = Value::callable(m.name, [self, &m, weak](CallArgs& a) -> Value {
      ScopePtr defining = weak.lock();
      if (!defining) fail("macro '" + m.name + "' called outside its scope", a.line);
      // Counted before the defaults are evaluated: a default can call the macro too.
      if (self->macro_depth_ >= kMaxMacroDepth) {
        fail("maximum recursion depth exceeded in macro '" + m.name + "'", a.line);
      }
      ++self->macro_depth_;
      struct Leave {
        int& depth;
        ~Leave() { --depth; }
      } leave{self->macro_depth_};
      if (a.positional.size() > m.params.size()) {
        fail("macro '" + m.name + "' takes not more than " + std::to_string(m.params.size()) +
                 " argument(s)",
             a.line);
      }
      ScopePtr local = child_of(defining);
      for (size_t i = 0; i < m.params.size(); ++i) {
        const auto& [name, default_expr] = m.params[i];
        if (i < a.positional.size()) {
          local->vars[name] = a.positional[i];
          continue;
        }
        const Value* named = nullptr;
        for (const auto& [k, v] : a.named) {
          if (k == name) named = &v;
        }
        if (named != nullptr)
          local->vars[name] = *named;
        else if (default_expr)
          local->vars[name] = self->eval(*default_expr, local);
        else
          local->vars[name] = Value::undefined("parameter '" + name + "' was not provided");
      }
      for (const auto& [k, v] : a.named) {
        bool known = false;
        for (const auto& param : m.params)
          known = known || param.first == k;
        if (!known) fail("macro '" + m.name + "' takes no keyword argument '" + k + "'", a.line);
      }
      std::string text;
      self->exec_body(m.body, text, local);
      return text;
    });
  }

  // Macros nested deeper than this are an error, as jinja2's RecursionError (which comes
  // between 150 and 200 levels of a one-line macro), rather than a stack overflow: each
  // level takes about 2 KB of stack here.
  static constexpr int kMaxMacroDepth = 256;
  int macro_depth_ = 0;

  Value lookup(const NameExpr& e, const ScopePtr& scope) {
    if (const Value* v = scope->find(e.name)) return *v;
    Value global = builtin_global(e.name);
    if (!global.is_undefined()) return global;
    return Value::undefined("'" + e.name + "' is undefined");
  }

  CallArgs eval_args(const Arguments& args, const ScopePtr& scope, int line) {
    CallArgs out;
    out.line = line;
    out.positional.reserve(args.positional.size());
    for (const ExprPtr& e : args.positional)
      out.positional.push_back(eval(*e, scope));
    for (const auto& [k, e] : args.named)
      out.named.emplace_back(k, eval(*e, scope));
    return out;
  }

  Value apply_filter(const FilterExpr& f, const Value& input, const ScopePtr& scope) {
    CallArgs args = eval_args(f.args, scope, f.line);
    return f.fn(input, args);
  }

  Value eval_call(const CallExpr& e, const ScopePtr& scope) {
    Value callee = eval(*e.callee, scope);
    if (callee.is_undefined()) {
      if (e.callee->kind == Expr::Kind::Name) {
        fail("unsupported function or undefined name '" +
                 static_cast<const NameExpr&>(*e.callee).name + "'",
             e.line);
      }
      if (e.callee->kind == Expr::Kind::Attr) {
        const auto& attr = static_cast<const AttrExpr&>(*e.callee);
        const Value object = eval(*attr.object, scope);
        fail("unsupported method '" + attr.name + "' of " + object.type_name(), e.line);
      }
    }
    CallArgs args = eval_args(e.args, scope, e.line);
    return call_value(callee, args, e.line);
  }

 public:
  Value eval(const Expr& expr, const ScopePtr& scope) {
    switch (expr.kind) {
      case Expr::Kind::Literal:
        return static_cast<const LiteralExpr&>(expr).value;
      case Expr::Kind::Name:
        return lookup(static_cast<const NameExpr&>(expr), scope);
      case Expr::Kind::List:
      case Expr::Kind::Tuple: {
        const auto& e = static_cast<const ListExpr&>(expr);
        ValueList items;
        items.reserve(e.items.size());
        for (const ExprPtr& item : e.items)
          items.push_back(eval(*item, scope));
        return expr.kind == Expr::Kind::List ? Value::list(std::move(items))
                                             : Value::tuple(std::move(items));
      }
      case Expr::Kind::Dict: {
        Dict dict;
        for (const auto& [k, v] : static_cast<const DictExpr&>(expr).items) {
          const Value key = eval(*k, scope);
          if (!key.is_string()) fail("unsupported dict key of type " + key.type_name(), k->line);
          dict.set(key.as_string(), eval(*v, scope));
        }
        return Value::dict(std::move(dict));
      }
      case Expr::Kind::Attr: {
        const auto& e = static_cast<const AttrExpr&>(expr);
        return get_attr(eval(*e.object, scope), e.name, e.line);
      }
      case Expr::Kind::Item: {
        const auto& e = static_cast<const ItemExpr&>(expr);
        return get_item(eval(*e.object, scope), eval(*e.index, scope), e.line);
      }
      case Expr::Kind::Slice: {
        const auto& e = static_cast<const SliceExpr&>(expr);
        auto opt = [&](const ExprPtr& p) { return p ? eval(*p, scope) : Value::none(); };
        return get_slice(eval(*e.object, scope), opt(e.start), opt(e.stop), opt(e.step), e.line);
      }
      case Expr::Kind::Call:
        return eval_call(static_cast<const CallExpr&>(expr), scope);
      case Expr::Kind::Filter: {
        const auto& e = static_cast<const FilterExpr&>(expr);
        return apply_filter(e, eval(*e.input, scope), scope);
      }
      case Expr::Kind::Test: {
        const auto& e = static_cast<const TestExpr&>(expr);
        const Value input = eval(*e.input, scope);
        CallArgs args = eval_args(e.args, scope, e.line);
        return e.fn(input, args) != e.negated;
      }
      case Expr::Kind::Unary: {
        const auto& e = static_cast<const UnaryExpr&>(expr);
        const Value v = eval(*e.operand, scope);
        if (e.op == UnaryOp::Not) return !v.truthy();
        if (v.is_undefined()) fail_undefined(v, e.line);
        if (!v.is_number())
          fail("bad operand type for unary " + std::string(e.op == UnaryOp::Neg ? "-" : "+") +
                   ": '" + v.type_name() + "'",
               e.line);
        if (e.op == UnaryOp::Pos) return v.is_bool() ? Value(v.as_int()) : v;
        return v.is_float() ? Value(-v.as_double()) : Value(checked_sub(0, v.as_int(), e.line));
      }
      case Expr::Kind::Binary: {
        const auto& e = static_cast<const BinaryExpr&>(expr);
        if (e.op == BinaryOp::And || e.op == BinaryOp::Or) {
          Value left = eval(*e.left, scope);
          if (left.truthy() == (e.op == BinaryOp::Or)) return left;
          return eval(*e.right, scope);
        }
        return arithmetic(e.op, eval(*e.left, scope), eval(*e.right, scope), e.line);
      }
      case Expr::Kind::Compare: {
        const auto& e = static_cast<const CompareExpr&>(expr);
        Value left = eval(*e.first, scope);
        for (const auto& [op, rhs] : e.rest) {
          Value right = eval(*rhs, scope);
          if (!compare(op, left, right, e.line)) return false;
          left = std::move(right);
        }
        return true;
      }
      case Expr::Kind::Cond: {
        const auto& e = static_cast<const CondExpr&>(expr);
        if (eval(*e.test, scope).truthy()) return eval(*e.then_expr, scope);
        if (e.else_expr) return eval(*e.else_expr, scope);
        return Value::undefined(
            "the inline if-expression evaluated to false and no else section was defined");
      }
      case Expr::Kind::Concat: {
        std::string out;
        for (const ExprPtr& part : static_cast<const ConcatExpr&>(expr).parts)
          out += to_str(eval(*part, scope));
        return out;
      }
    }
    fail("internal error: unknown expression", expr.line);
  }
};

}  // namespace

std::string render(const Body& body, std::vector<std::pair<std::string, Value>> variables) {
  auto top = std::make_shared<Scope>();
  for (auto& [name, value] : variables)
    top->vars[name] = std::move(value);
  Renderer renderer;
  std::string out;
  renderer.exec_body(body, out, top);
  return out;
}

}  // namespace pagellm::engine::jinja

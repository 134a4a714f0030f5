#pragma once
// Values of the Jinja subset, with Python semantics where templates can observe them:
// truthiness, equality (1 == 1.0 == True), str() and repr() printing, json.dumps.

#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

namespace pagellm::engine::jinja {

class Value;
using ValueList = std::vector<Value>;

// An insertion-ordered dict with string keys (what JSON and templates produce).
struct Dict {
  std::vector<std::pair<std::string, Value>> entries;

  const Value* find(std::string_view key) const;
  void set(std::string key, Value value);
};

struct CallArgs;
using NativeFunction = std::function<Value(CallArgs&)>;

struct Callable {
  std::string name;
  NativeFunction fn;
};

// The `loop` variable of a for loop; attributes are computed on access.
struct LoopState {
  std::shared_ptr<const ValueList> items;
  size_t index0 = 0;
};

class Value {
 public:
  enum class Kind : uint8_t {
    Undefined,
    None,
    Bool,
    Int,
    Float,
    String,
    List,
    Tuple,
    Dict,
    Namespace,
    Callable,
    Loop
  };

  Value() : kind_(Kind::Undefined) {}
  static Value undefined(std::string hint = {}) {
    return Value(Kind::Undefined, std::make_shared<const std::string>(std::move(hint)));
  }
  static Value none() { return Value(Kind::None, std::monostate{}); }
  Value(bool b) : kind_(Kind::Bool), data_(b) {}
  Value(int v) : kind_(Kind::Int), data_(int64_t{v}) {}
  Value(int64_t v) : kind_(Kind::Int), data_(v) {}
  Value(double v) : kind_(Kind::Float), data_(v) {}
  Value(std::string s)
      : kind_(Kind::String), data_(std::make_shared<const std::string>(std::move(s))) {}
  Value(const char* s) : Value(std::string(s)) {}
  Value(std::string_view s) : Value(std::string(s)) {}
  static Value list(ValueList items);
  static Value tuple(ValueList items);
  static Value dict(Dict dict);
  static Value namespace_object(Dict attributes);
  static Value callable(std::string name, NativeFunction fn);
  static Value loop(std::shared_ptr<LoopState> state);

  Kind kind() const { return kind_; }
  bool is_undefined() const { return kind_ == Kind::Undefined; }
  bool is_none() const { return kind_ == Kind::None; }
  bool is_bool() const { return kind_ == Kind::Bool; }
  bool is_int() const { return kind_ == Kind::Int; }
  bool is_float() const { return kind_ == Kind::Float; }
  bool is_number() const {
    return kind_ == Kind::Int || kind_ == Kind::Float || kind_ == Kind::Bool;
  }
  bool is_string() const { return kind_ == Kind::String; }
  bool is_sequence() const { return kind_ == Kind::List || kind_ == Kind::Tuple; }
  bool is_dict() const { return kind_ == Kind::Dict; }
  bool is_namespace() const { return kind_ == Kind::Namespace; }
  bool is_callable() const { return kind_ == Kind::Callable; }
  bool is_loop() const { return kind_ == Kind::Loop; }

  bool as_bool() const { return std::get<bool>(data_); }
  int64_t as_int() const;    // Bool and Int
  double as_double() const;  // Bool, Int and Float
  const std::string& as_string() const { return *std::get<SharedString>(data_); }
  const ValueList& as_list() const { return *std::get<std::shared_ptr<const ValueList>>(data_); }
  const Dict& as_dict() const { return *std::get<std::shared_ptr<Dict>>(data_); }
  Dict& mutable_namespace() const { return *std::get<std::shared_ptr<Dict>>(data_); }
  const Callable& as_callable() const { return *std::get<std::shared_ptr<Callable>>(data_); }
  const LoopState& as_loop() const { return *std::get<std::shared_ptr<LoopState>>(data_); }
  // Why an Undefined is undefined, as jinja2 words it ("'x' is undefined").
  const std::string& undefined_hint() const;

  bool truthy() const;
  // Python type names, for error messages ("str", "int", "dict", ...).
  std::string type_name() const;

 private:
  // Strings are shared: templates pass message contents around by value a lot.
  using SharedString = std::shared_ptr<const std::string>;
  using Data = std::variant<std::monostate, bool, int64_t, double, SharedString,
                            std::shared_ptr<const ValueList>, std::shared_ptr<Dict>,
                            std::shared_ptr<Callable>, std::shared_ptr<LoopState>>;
  template <typename T>
  Value(Kind kind, T data) : kind_(kind), data_(std::move(data)) {}

  Kind kind_;
  Data data_;
};

struct CallArgs {
  ValueList positional;
  std::vector<std::pair<std::string, Value>> named;
  int line = 0;

  // Takes positional argument `index` or keyword `name`; Undefined when neither was given.
  Value get(size_t index, std::string_view name) const;
  bool has(size_t index, std::string_view name) const;
  // Fails when arguments remain beyond `max_positional` or outside `names`.
  void expect_at_most(const char* what, size_t max_positional,
                      std::initializer_list<std::string_view> names) const;
};

bool values_equal(const Value& a, const Value& b);
// Python's `<` for numbers, strings and sequences; throws for other pairs.
bool value_less(const Value& a, const Value& b, int line);

// str(value) as jinja2 prints it: Undefined -> "", None -> "None", True -> "True", floats
// as Python repr, containers as Python repr.
std::string to_str(const Value& value);
std::string to_repr(const Value& value);
std::string python_float_repr(double value);
// The arguments of json.dumps: indent (negative: None), separators, sort_keys, ensure_ascii.
struct JsonStyle {
  int indent = -1;
  std::string item_separator = ", ";  // "," with an indent
  std::string key_separator = ": ";
  bool sort_keys = false;
  bool ensure_ascii = false;
};
std::string to_json(const Value& value, const JsonStyle& style, int line);

Value from_json(const nlohmann::json& json);
Value from_json(const nlohmann::ordered_json& json);

// Formats "MESSAGE at line N" and throws ChatTemplateError.
[[noreturn]] void fail(const std::string& message, int line);

}  // namespace pagellm::engine::jinja

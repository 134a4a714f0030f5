#include "engine/jinja_value.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>

#include "engine/chat_template_error.h"
#include "engine/jinja_unicode.h"
#include "engine/utf8.h"

namespace pagellm::engine::jinja {

void fail(const std::string& message, int line) {
  if (line > 0) throw ChatTemplateError(message + " at line " + std::to_string(line));
  throw ChatTemplateError(message);
}

const Value* Dict::find(std::string_view key) const {
  for (const auto& [k, v] : entries) {
    if (k == key) return &v;
  }
  return nullptr;
}

void Dict::set(std::string key, Value value) {
  for (auto& [k, v] : entries) {
    if (k == key) {
      v = std::move(value);
      return;
    }
  }
  entries.emplace_back(std::move(key), std::move(value));
}

Value Value::list(ValueList items) {
  return Value(Kind::List, std::shared_ptr<const ValueList>(
                               std::make_shared<const ValueList>(std::move(items))));
}
Value Value::tuple(ValueList items) {
  return Value(Kind::Tuple, std::shared_ptr<const ValueList>(
                                std::make_shared<const ValueList>(std::move(items))));
}
Value Value::dict(Dict dict) {
  return Value(Kind::Dict, std::make_shared<Dict>(std::move(dict)));
}
Value Value::namespace_object(Dict attributes) {
  return Value(Kind::Namespace, std::make_shared<Dict>(std::move(attributes)));
}
Value Value::callable(std::string name, NativeFunction fn) {
  return Value(Kind::Callable,
               std::make_shared<Callable>(Callable{std::move(name), std::move(fn)}));
}
Value Value::loop(std::shared_ptr<LoopState> state) {
  return Value(Kind::Loop, std::move(state));
}

const std::string& Value::undefined_hint() const {
  static const std::string kNoHint;
  const auto* hint = std::get_if<SharedString>(&data_);
  return hint != nullptr ? **hint : kNoHint;
}

int64_t Value::as_int() const {
  if (kind_ == Kind::Bool) return std::get<bool>(data_) ? 1 : 0;
  return std::get<int64_t>(data_);
}

double Value::as_double() const {
  if (kind_ == Kind::Float) return std::get<double>(data_);
  return static_cast<double>(as_int());
}

bool Value::truthy() const {
  switch (kind_) {
    case Kind::Undefined:
    case Kind::None:
      return false;
    case Kind::Bool:
      return as_bool();
    case Kind::Int:
      return as_int() != 0;
    case Kind::Float:
      return as_double() != 0.0;
    case Kind::String:
      return !as_string().empty();
    case Kind::List:
    case Kind::Tuple:
      return !as_list().empty();
    case Kind::Dict:
      return !as_dict().entries.empty();
    default:
      return true;
  }
}

std::string Value::type_name() const {
  switch (kind_) {
    case Kind::Undefined:
      return "Undefined";
    case Kind::None:
      return "NoneType";
    case Kind::Bool:
      return "bool";
    case Kind::Int:
      return "int";
    case Kind::Float:
      return "float";
    case Kind::String:
      return "str";
    case Kind::List:
      return "list";
    case Kind::Tuple:
      return "tuple";
    case Kind::Dict:
      return "dict";
    case Kind::Namespace:
      return "Namespace";
    case Kind::Callable:
      return "function";
    case Kind::Loop:
      return "LoopContext";
  }
  return "object";
}

Value CallArgs::get(size_t index, std::string_view name) const {
  if (index < positional.size()) return positional[index];
  for (const auto& [k, v] : named) {
    if (k == name) return v;
  }
  return Value::undefined();
}

bool CallArgs::has(size_t index, std::string_view name) const {
  if (index < positional.size()) return true;
  return std::any_of(named.begin(), named.end(), [&](const auto& kv) { return kv.first == name; });
}

void CallArgs::expect_at_most(const char* what, size_t max_positional,
                              std::initializer_list<std::string_view> names) const {
  if (positional.size() > max_positional) {
    fail(std::string(what) + " takes at most " + std::to_string(max_positional) +
             " positional argument(s), got " + std::to_string(positional.size()),
         line);
  }
  for (const auto& [k, v] : named) {
    if (std::find(names.begin(), names.end(), k) == names.end()) {
      fail(std::string(what) + " got an unexpected keyword argument '" + k + "'", line);
    }
  }
}

bool values_equal(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) return a.as_double() == b.as_double();
    return a.as_int() == b.as_int();
  }
  if (a.kind() != b.kind()) return false;
  switch (a.kind()) {
    case Value::Kind::Undefined:
    case Value::Kind::None:
      return true;
    case Value::Kind::String:
      return a.as_string() == b.as_string();
    case Value::Kind::List:
    case Value::Kind::Tuple: {
      const auto& x = a.as_list();
      const auto& y = b.as_list();
      if (x.size() != y.size()) return false;
      for (size_t i = 0; i < x.size(); ++i) {
        if (!values_equal(x[i], y[i])) return false;
      }
      return true;
    }
    case Value::Kind::Dict: {
      const auto& x = a.as_dict().entries;
      const auto& y = b.as_dict();
      if (x.size() != y.entries.size()) return false;
      for (const auto& [k, v] : x) {
        const Value* other = y.find(k);
        if (other == nullptr || !values_equal(v, *other)) return false;
      }
      return true;
    }
    case Value::Kind::Namespace:
      return &a.mutable_namespace() == &b.mutable_namespace();
    case Value::Kind::Callable:
      return &a.as_callable() == &b.as_callable();
    case Value::Kind::Loop:
      return &a.as_loop() == &b.as_loop();
    default:
      return false;
  }
}

bool value_less(const Value& a, const Value& b, int line) {
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) return a.as_double() < b.as_double();
    return a.as_int() < b.as_int();
  }
  if (a.is_string() && b.is_string()) return a.as_string() < b.as_string();
  if (a.kind() == b.kind() && a.is_sequence()) {
    const auto& x = a.as_list();
    const auto& y = b.as_list();
    for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
      if (!values_equal(x[i], y[i])) return value_less(x[i], y[i], line);
    }
    return x.size() < y.size();
  }
  fail("'<' not supported between instances of '" + a.type_name() + "' and '" + b.type_name() + "'",
       line);
}

std::string python_float_repr(double value) {
  if (std::isnan(value)) return "nan";
  if (std::isinf(value)) return value > 0 ? "inf" : "-inf";
  if (value == 0) return std::signbit(value) ? "-0.0" : "0.0";
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof(buf), value, std::chars_format::scientific);
  std::string sci(buf, res.ptr);
  // sci is "[-]d[.ddd]e[+-]XX": split into sign, digits and decimal exponent.
  std::string sign;
  size_t pos = 0;
  if (sci[0] == '-') {
    sign = "-";
    pos = 1;
  }
  const size_t e_pos = sci.find('e');
  std::string digits;
  for (size_t i = pos; i < e_pos; ++i) {
    if (sci[i] != '.') digits.push_back(sci[i]);
  }
  const int exponent = std::stoi(sci.substr(e_pos + 1));
  const int decpt = exponent + 1;  // value = 0.DIGITS * 10^decpt
  std::string out = sign;
  if (decpt > -4 && decpt <= 16) {
    if (decpt <= 0) {
      out += "0." + std::string(static_cast<size_t>(-decpt), '0') + digits;
    } else if (static_cast<size_t>(decpt) >= digits.size()) {
      out += digits + std::string(static_cast<size_t>(decpt) - digits.size(), '0') + ".0";
    } else {
      out += digits.substr(0, static_cast<size_t>(decpt)) + "." +
             digits.substr(static_cast<size_t>(decpt));
    }
    return out;
  }
  out += digits.substr(0, 1);
  if (digits.size() > 1) out += "." + digits.substr(1);
  char exp_buf[16];
  std::snprintf(exp_buf, sizeof(exp_buf), "e%c%02d", exponent < 0 ? '-' : '+', std::abs(exponent));
  return out + exp_buf;
}

namespace {

void append_hex(std::string& out, const char* prefix, uint32_t c, int width) {
  char buf[16];
  std::snprintf(buf, sizeof(buf), "%s%0*x", prefix, width, c);
  out += buf;
}

void append_string_repr(std::string& out, const std::string& s) {
  const bool has_single = s.find('\'') != std::string::npos;
  const bool has_double = s.find('"') != std::string::npos;
  const char quote = (has_single && !has_double) ? '"' : '\'';
  out.push_back(quote);
  for (char32_t c : utf8_decode(s)) {
    if (c == static_cast<char32_t>(quote) || c == '\\') {
      out.push_back('\\');
      out.push_back(static_cast<char>(c));
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c < 0x20 || c == 0x7F) {
      append_hex(out, "\\x", c, 2);
    } else if (c < 0x80 || is_python_printable(c)) {
      utf8_append(out, c);
    } else if (c < 0x100) {
      append_hex(out, "\\x", c, 2);
    } else if (c < 0x10000) {
      append_hex(out, "\\u", c, 4);
    } else {
      append_hex(out, "\\U", c, 8);
    }
  }
  out.push_back(quote);
}

void append_repr(std::string& out, const Value& v);

void append_str(std::string& out, const Value& v) {
  switch (v.kind()) {
    case Value::Kind::Undefined:
      return;
    case Value::Kind::None:
      out += "None";
      return;
    case Value::Kind::Bool:
      out += v.as_bool() ? "True" : "False";
      return;
    case Value::Kind::Int:
      out += std::to_string(v.as_int());
      return;
    case Value::Kind::Float:
      out += python_float_repr(v.as_double());
      return;
    case Value::Kind::String:
      out += v.as_string();
      return;
    case Value::Kind::List:
    case Value::Kind::Tuple: {
      const bool tuple = v.kind() == Value::Kind::Tuple;
      out.push_back(tuple ? '(' : '[');
      const auto& items = v.as_list();
      for (size_t i = 0; i < items.size(); ++i) {
        if (i > 0) out += ", ";
        append_repr(out, items[i]);
      }
      if (tuple && items.size() == 1) out.push_back(',');
      out.push_back(tuple ? ')' : ']');
      return;
    }
    case Value::Kind::Dict:
    case Value::Kind::Namespace: {
      const bool ns = v.is_namespace();
      if (ns) out += "<Namespace ";
      out.push_back('{');
      const auto& entries = ns ? v.mutable_namespace().entries : v.as_dict().entries;
      for (size_t i = 0; i < entries.size(); ++i) {
        if (i > 0) out += ", ";
        append_string_repr(out, entries[i].first);
        out += ": ";
        append_repr(out, entries[i].second);
      }
      out.push_back('}');
      if (ns) out.push_back('>');
      return;
    }
    case Value::Kind::Callable:
      out += "<function " + v.as_callable().name + ">";
      return;
    case Value::Kind::Loop:
      out += "<LoopContext " + std::to_string(v.as_loop().index0 + 1) + "/" +
             std::to_string(v.as_loop().items->size()) + ">";
      return;
  }
}

void append_repr(std::string& out, const Value& v) {
  if (v.is_string()) {
    append_string_repr(out, v.as_string());
  } else if (v.is_undefined()) {
    out += "Undefined";
  } else {
    append_str(out, v);
  }
}

void append_json_string(std::string& out, const std::string& s, bool ensure_ascii) {
  out.push_back('"');
  for (size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    if (ensure_ascii && static_cast<unsigned char>(c) >= 0x80) {
      // \uXXXX, a surrogate pair past the BMP, as Python's json writes it.
      const char32_t cp = utf8::next_codepoint(s, i);
      --i;
      if (cp > 0xFFFF) {
        append_hex(out, "\\u", 0xD800 + ((cp - 0x10000) >> 10), 4);
        append_hex(out, "\\u", 0xDC00 + ((cp - 0x10000) & 0x3FF), 4);
      } else {
        append_hex(out, "\\u", cp, 4);
      }
      continue;
    }
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      default:
        // Control characters; with ensure_ascii DEL too (Python keeps U+0020..U+007E).
        if (static_cast<unsigned char>(c) < 0x20 || (ensure_ascii && c == '\x7f')) {
          append_hex(out, "\\u", static_cast<unsigned char>(c), 4);
        } else {
          out.push_back(c);
        }
    }
  }
  out.push_back('"');
}

void append_json(std::string& out, const Value& v, const JsonStyle& style, int depth, int line) {
  const int indent = style.indent;
  auto newline = [&](int level) {
    out.push_back('\n');
    out.append(static_cast<size_t>(indent * level), ' ');
  };
  const std::string& item_sep = style.item_separator;
  switch (v.kind()) {
    case Value::Kind::None:
      out += "null";
      return;
    case Value::Kind::Bool:
      out += v.as_bool() ? "true" : "false";
      return;
    case Value::Kind::Int:
      out += std::to_string(v.as_int());
      return;
    case Value::Kind::Float: {
      const double d = v.as_double();
      if (std::isnan(d))
        out += "NaN";
      else if (std::isinf(d))
        out += d > 0 ? "Infinity" : "-Infinity";
      else
        out += python_float_repr(d);
      return;
    }
    case Value::Kind::String:
      append_json_string(out, v.as_string(), style.ensure_ascii);
      return;
    case Value::Kind::List:
    case Value::Kind::Tuple: {
      const auto& items = v.as_list();
      if (items.empty()) {
        out += "[]";
        return;
      }
      out.push_back('[');
      for (size_t i = 0; i < items.size(); ++i) {
        if (i > 0) out += item_sep;
        if (indent >= 0) newline(depth + 1);
        append_json(out, items[i], style, depth + 1, line);
      }
      if (indent >= 0) newline(depth);
      out.push_back(']');
      return;
    }
    case Value::Kind::Dict: {
      std::vector<const std::pair<std::string, Value>*> entries;
      for (const auto& entry : v.as_dict().entries)
        entries.push_back(&entry);
      if (entries.empty()) {
        out += "{}";
        return;
      }
      if (style.sort_keys) {
        std::stable_sort(entries.begin(), entries.end(),
                         [](const auto* a, const auto* b) { return a->first < b->first; });
      }
      out.push_back('{');
      for (size_t i = 0; i < entries.size(); ++i) {
        if (i > 0) out += item_sep;
        if (indent >= 0) newline(depth + 1);
        append_json_string(out, entries[i]->first, style.ensure_ascii);
        out += style.key_separator;
        append_json(out, entries[i]->second, style, depth + 1, line);
      }
      if (indent >= 0) newline(depth);
      out.push_back('}');
      return;
    }
    default:
      fail("Object of type " + v.type_name() + " is not JSON serializable", line);
  }
}

template <typename Json>
Value convert_json(const Json& json) {
  switch (json.type()) {
    case nlohmann::json::value_t::null:
      return Value::none();
    case nlohmann::json::value_t::boolean:
      return Value(json.template get<bool>());
    case nlohmann::json::value_t::number_integer:
      return Value(json.template get<int64_t>());
    case nlohmann::json::value_t::number_unsigned: {
      const auto n = json.template get<uint64_t>();
      if (n > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
        fail("integer overflow: " + std::to_string(n) + " does not fit in 64 bits", 0);
      return Value(static_cast<int64_t>(n));
    }
    case nlohmann::json::value_t::number_float:
      return Value(json.template get<double>());
    case nlohmann::json::value_t::string:
      return Value(json.template get_ref<const std::string&>());
    case nlohmann::json::value_t::array: {
      ValueList items;
      items.reserve(json.size());
      for (const auto& item : json)
        items.push_back(convert_json(item));
      return Value::list(std::move(items));
    }
    case nlohmann::json::value_t::object: {
      Dict dict;
      dict.entries.reserve(json.size());
      for (auto it = json.begin(); it != json.end(); ++it) {
        dict.entries.emplace_back(it.key(), convert_json(it.value()));
      }
      return Value::dict(std::move(dict));
    }
    default:
      throw ChatTemplateError("unsupported JSON value of type " + std::string(json.type_name()));
  }
}

}  // namespace

std::string to_str(const Value& value) {
  if (value.is_string()) return value.as_string();
  std::string out;
  append_str(out, value);
  return out;
}

std::string to_repr(const Value& value) {
  std::string out;
  append_repr(out, value);
  return out;
}

std::string to_json(const Value& value, const JsonStyle& style, int line) {
  std::string out;
  append_json(out, value, style, 0, line);
  return out;
}

Value from_json(const nlohmann::json& json) {
  return convert_json(json);
}
Value from_json(const nlohmann::ordered_json& json) {
  return convert_json(json);
}

}  // namespace pagellm::engine::jinja

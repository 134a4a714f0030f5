#include "engine/jinja_builtins.h"

#include <algorithm>
#include <ctime>
#include <optional>

#include "engine/chat_template_error.h"
#include "engine/jinja_unicode.h"

namespace pagellm::engine::jinja {
namespace {

bool is_ascii(const std::string& s) {
  return std::all_of(s.begin(), s.end(),
                     [](char c) { return static_cast<unsigned char>(c) < 0x80; });
}

std::string require_string(const Value& v, const char* what, int line) {
  if (!v.is_string())
    fail(std::string(what) + " expects a string argument, got " + v.type_name(), line);
  return v.as_string();
}

// Python normalizes a possibly negative index against `size`.
int64_t normalize_index(int64_t index, int64_t size) {
  return index < 0 ? index + size : index;
}

std::string u32_slice(const std::u32string& s, size_t begin, size_t end) {
  return utf8_encode(std::u32string_view(s).substr(begin, end - begin));
}

// A slice bound as Python takes it: an int (or bool), or None or absent for none.
std::optional<int64_t> slice_index(const Value& v, const std::string& what, int line) {
  if (v.is_undefined() || v.is_none()) return std::nullopt;
  if (!v.is_int() && !v.is_bool()) fail(what + "slice indices must be integers or None", line);
  return v.as_int();
}

// maxsplit as Python takes it: an int (or bool), None or absent for no limit.
int64_t maxsplit_of(const Value& v, int line) {
  if (v.is_undefined() || v.is_none()) return -1;
  if (!v.is_int() && !v.is_bool())
    fail("'" + v.type_name() + "' object cannot be interpreted as an integer", line);
  return v.as_int();
}

Value py_split(const std::string& s, const Value& sep, const Value& maxsplit_value, int line) {
  int64_t maxsplit = maxsplit_of(maxsplit_value, line);
  ValueList parts;
  if (sep.is_undefined() || sep.is_none()) {
    const std::u32string u = utf8_decode(s);
    size_t i = 0;
    while (true) {
      while (i < u.size() && is_python_space(u[i]))
        ++i;
      if (i >= u.size()) break;
      if (maxsplit == 0) {
        parts.emplace_back(u32_slice(u, i, u.size()));  // Python keeps the rest as it is
        break;
      }
      size_t j = i;
      while (j < u.size() && !is_python_space(u[j]))
        ++j;
      parts.emplace_back(u32_slice(u, i, j));
      if (maxsplit > 0) --maxsplit;
      i = j;
    }
    return Value::list(std::move(parts));
  }
  const std::string separator = require_string(sep, "split", line);
  if (separator.empty()) fail("split: empty separator", line);
  size_t start = 0;
  while (maxsplit != 0) {
    const size_t found = s.find(separator, start);
    if (found == std::string::npos) break;
    parts.emplace_back(s.substr(start, found - start));
    start = found + separator.size();
    if (maxsplit > 0) --maxsplit;
  }
  parts.emplace_back(s.substr(start));
  return Value::list(std::move(parts));
}

Value py_rsplit(const std::string& s, const Value& sep, const Value& maxsplit_value, int line) {
  int64_t maxsplit = maxsplit_of(maxsplit_value, line);
  if (maxsplit < 0) return py_split(s, sep, maxsplit_value, line);
  if (sep.is_undefined() || sep.is_none()) {
    // Runs of whitespace from the right; what is left past maxsplit keeps its left side.
    const std::u32string u = utf8_decode(s);
    ValueList parts;
    size_t j = u.size();
    while (true) {
      while (j > 0 && is_python_space(u[j - 1]))
        --j;
      if (j == 0) break;
      if (maxsplit == 0) {
        parts.emplace_back(u32_slice(u, 0, j));
        break;
      }
      size_t i = j;
      while (i > 0 && !is_python_space(u[i - 1]))
        --i;
      parts.emplace_back(u32_slice(u, i, j));
      --maxsplit;
      j = i;
    }
    std::reverse(parts.begin(), parts.end());
    return Value::list(std::move(parts));
  }
  const std::string separator = require_string(sep, "rsplit", line);
  if (separator.empty()) fail("rsplit: empty separator", line);
  ValueList parts;
  size_t end = s.size();
  while (maxsplit > 0) {
    if (end < separator.size()) break;
    const size_t found = s.rfind(separator, end - separator.size());
    if (found == std::string::npos) break;
    parts.emplace_back(s.substr(found + separator.size(), end - found - separator.size()));
    end = found;
    --maxsplit;
  }
  parts.emplace_back(s.substr(0, end));
  std::reverse(parts.begin(), parts.end());
  return Value::list(std::move(parts));
}

std::string py_replace(const std::string& s, const std::string& old, const std::string& repl,
                       int64_t count) {
  std::string out;
  if (old.empty()) {
    const std::u32string u = utf8_decode(s);
    for (size_t i = 0; i <= u.size(); ++i) {
      if (count < 0 || static_cast<int64_t>(i) < count) out += repl;
      if (i < u.size()) utf8_append(out, u[i]);
    }
    return out;
  }
  size_t start = 0;
  while (count != 0) {
    const size_t found = s.find(old, start);
    if (found == std::string::npos) break;
    out.append(s, start, found - start);
    out += repl;
    start = found + old.size();
    if (count > 0) --count;
  }
  out.append(s, start, std::string::npos);
  return out;
}

bool affix_match(const std::string& s, const Value& affix, bool prefix, int line) {
  auto one = [&](const Value& a) {
    const std::string x = require_string(a, prefix ? "startswith" : "endswith", line);
    if (x.size() > s.size()) return false;
    return prefix ? s.compare(0, x.size(), x) == 0
                  : s.compare(s.size() - x.size(), x.size(), x) == 0;
  };
  if (affix.is_sequence()) {
    const auto& items = affix.as_list();
    return std::any_of(items.begin(), items.end(), one);
  }
  return one(affix);
}

template <typename Pred>
bool all_chars(const std::string& s, Pred pred) {
  if (s.empty()) return false;
  const std::u32string u = utf8_decode(s);
  return std::all_of(u.begin(), u.end(), pred);
}

Value string_method(const std::string& s, const std::string& name, CallArgs& a) {
  const int line = a.line;
  if (name == "startswith" || name == "endswith") {
    return affix_match(s, a.get(0, "prefix"), name == "startswith", line);
  }
  if (name == "strip") return py_strip(s, a.get(0, "chars"), true, true);
  if (name == "lstrip") return py_strip(s, a.get(0, "chars"), true, false);
  if (name == "rstrip") return py_strip(s, a.get(0, "chars"), false, true);
  if (name == "split") return py_split(s, a.get(0, "sep"), a.get(1, "maxsplit"), line);
  if (name == "rsplit") return py_rsplit(s, a.get(0, "sep"), a.get(1, "maxsplit"), line);
  if (name == "splitlines") {
    // Python's line boundaries: \n, \r, \r\n, \v, \f, \x1c-\x1e, \x85, U+2028, U+2029.
    const auto boundary = [](char32_t c) {
      return c == U'\n' || c == U'\r' || c == U'\v' || c == U'\f' || (c >= 0x1C && c <= 0x1E) ||
             c == 0x85 || c == 0x2028 || c == 0x2029;
    };
    const bool keepends = a.get(0, "keepends").truthy();
    const std::u32string u = utf8_decode(s);
    ValueList lines;
    size_t start = 0;
    for (size_t i = 0; i < u.size(); ++i) {
      if (boundary(u[i])) {
        const size_t line_end = i;
        if (u[i] == U'\r' && i + 1 < u.size() && u[i + 1] == U'\n') ++i;
        lines.emplace_back(u32_slice(u, start, keepends ? i + 1 : line_end));
        start = i + 1;
      }
    }
    if (start < u.size()) lines.emplace_back(u32_slice(u, start, u.size()));
    return Value::list(std::move(lines));
  }
  if (name == "replace") {
    const Value count = a.get(2, "count");
    return py_replace(s, require_string(a.get(0, "old"), "replace", line),
                      require_string(a.get(1, "new"), "replace", line),
                      count.is_number() ? count.as_int() : -1);
  }
  if (name == "upper") return str_upper(s);
  if (name == "lower") return str_lower(s);
  if (name == "title") return str_title(s);
  if (name == "capitalize") return str_capitalize(s);
  if (name == "find" || name == "rfind" || name == "index" || name == "rindex") {
    const std::u32string u = utf8_decode(s);
    const std::u32string sub = utf8_decode(require_string(a.get(0, "sub"), name.c_str(), line));
    // Within s[start:end], as Python's slice bounds (negative from the end, clamped).
    const auto size = static_cast<int64_t>(u.size());
    const auto given_start = slice_index(a.get(1, "start"), name + ": ", line);
    const auto given_end = slice_index(a.get(2, "end"), name + ": ", line);
    const auto bound = [&](std::optional<int64_t> v, int64_t fallback) {
      return v ? std::clamp(normalize_index(*v, size), int64_t{0}, size) : fallback;
    };
    const int64_t start = bound(given_start, 0), end = bound(given_end, size);
    const bool past_end = given_start && normalize_index(*given_start, size) > size;
    size_t at = std::u32string::npos;
    if (!past_end && end - start >= static_cast<int64_t>(sub.size())) {
      const std::u32string_view window = std::u32string_view(u).substr(
          static_cast<size_t>(start), static_cast<size_t>(end - start));
      at = name[0] == 'r' ? window.rfind(sub) : window.find(sub);
    }
    if (at == std::u32string::npos) {
      if (name.find("index") != std::string::npos) fail("substring not found", line);
      return -1;
    }
    return start + static_cast<int64_t>(at);
  }
  if (name == "count") {
    const std::string sub = require_string(a.get(0, "sub"), "count", line);
    if (sub.empty()) return static_cast<int64_t>(utf8_length(s) + 1);
    int64_t n = 0;
    for (size_t at = s.find(sub); at != std::string::npos; at = s.find(sub, at + sub.size()))
      ++n;
    return n;
  }
  if (name == "join") {
    std::string out;
    bool first = true;
    for (const Value& item : iterate(a.get(0, "iterable"), line)) {
      if (!first) out += s;
      first = false;
      out += require_string(item, "join", line);
    }
    return out;
  }
  if (name == "removeprefix" || name == "removesuffix") {
    const std::string affix = require_string(a.get(0, "affix"), name.c_str(), line);
    if (affix_match(s, Value(affix), name == "removeprefix", line)) {
      return name == "removeprefix" ? s.substr(affix.size()) : s.substr(0, s.size() - affix.size());
    }
    return s;
  }
  if (name == "isdigit") return all_chars(s, is_digit);
  if (name == "isalpha") return all_chars(s, is_alpha);
  if (name == "isalnum") return all_chars(s, [](char32_t c) { return is_alpha(c) || is_digit(c); });
  if (name == "isspace") return all_chars(s, is_python_space);
  if (name == "islower" || name == "isupper") {
    // As Python: no code point of the other case or titlecase, and one of this case.
    const bool want_lower = name == "islower";
    bool any = false;
    for (char32_t c : utf8_decode(s)) {
      if (is_titlecase(c) || (want_lower ? is_uppercase(c) : is_lowercase(c))) return false;
      any = any || (want_lower ? is_lowercase(c) : is_uppercase(c));
    }
    return any;
  }
  fail("unsupported method '" + name + "' of str", line);
}

const char* const kStringMethods[] = {
    "startswith", "endswith", "strip",   "lstrip",  "rstrip",  "split",        "rsplit",
    "splitlines", "replace",  "upper",   "lower",   "title",   "capitalize",   "find",
    "rfind",      "index",    "rindex",  "count",   "join",    "removeprefix", "removesuffix",
    "isdigit",    "isalpha",  "isalnum", "isspace", "islower", "isupper"};

bool is_string_method(const std::string& name) {
  return std::find(std::begin(kStringMethods), std::end(kStringMethods), name) !=
         std::end(kStringMethods);
}

Value dict_method(const Value& obj, const std::string& name, CallArgs& a) {
  const Dict& d = obj.as_dict();
  if (name == "items") {
    ValueList items;
    for (const auto& [k, v] : d.entries)
      items.push_back(Value::tuple({Value(k), v}));
    return Value::list(std::move(items));
  }
  if (name == "keys") {
    ValueList keys;
    for (const auto& [k, v] : d.entries)
      keys.emplace_back(k);
    return Value::list(std::move(keys));
  }
  if (name == "values") {
    ValueList values;
    for (const auto& [k, v] : d.entries)
      values.push_back(v);
    return Value::list(std::move(values));
  }
  // get
  const Value key = a.get(0, "key");
  const Value* found = key.is_string() ? d.find(key.as_string()) : nullptr;
  if (found != nullptr) return *found;
  return a.has(1, "default") ? a.get(1, "default") : Value::none();
}

Value list_method(const Value& obj, const std::string& name, CallArgs& a) {
  const ValueList& items = obj.as_list();
  const Value x = a.get(0, "value");
  if (name == "count") {
    return static_cast<int64_t>(std::count_if(items.begin(), items.end(),
                                              [&](const Value& v) { return values_equal(v, x); }));
  }
  for (size_t i = 0; i < items.size(); ++i) {
    if (values_equal(items[i], x)) return static_cast<int64_t>(i);
  }
  fail(to_repr(x) + " is not in list", a.line);
}

Value bound_method(const Value& obj, const std::string& name) {
  return Value::callable(name, [obj, name](CallArgs& a) -> Value {
    if (obj.is_string()) return string_method(obj.as_string(), name, a);
    if (obj.is_dict()) return dict_method(obj, name, a);
    return list_method(obj, name, a);
  });
}

Value loop_attr(const LoopState& loop, const std::string& name, int line) {
  const auto n = static_cast<int64_t>(loop.items->size());
  const auto i = static_cast<int64_t>(loop.index0);
  if (name == "index") return i + 1;
  if (name == "index0") return i;
  if (name == "revindex") return n - i;
  if (name == "revindex0") return n - i - 1;
  if (name == "first") return i == 0;
  if (name == "last") return i == n - 1;
  if (name == "length") return n;
  if (name == "depth") return 1;
  if (name == "depth0") return 0;
  if (name == "previtem") {
    return i > 0 ? (*loop.items)[loop.index0 - 1] : Value::undefined("there is no previous item");
  }
  if (name == "nextitem") {
    return i + 1 < n ? (*loop.items)[loop.index0 + 1] : Value::undefined("there is no next item");
  }
  if (name == "cycle") {
    return Value::callable("cycle", [i](CallArgs& a) -> Value {
      if (a.positional.empty()) fail("no items for cycling given", a.line);
      return a.positional[static_cast<size_t>(i) % a.positional.size()];
    });
  }
  fail("unsupported loop attribute 'loop." + name + "'", line);
}

std::string object_name(const Value& v) {
  return "'" + v.type_name() + " object'";
}

Value missing_attr(const Value& obj, const std::string& name) {
  return Value::undefined(object_name(obj) + " has no attribute '" + name + "'");
}

}  // namespace

void fail_undefined(const Value& value, int line) {
  const std::string& hint = value.undefined_hint();
  fail(hint.empty() ? std::string("undefined value used") : hint, line);
}

std::string py_strip(const std::string& s, const Value& chars, bool left, bool right) {
  std::u32string set;
  const bool whitespace = chars.is_undefined() || chars.is_none();
  if (!whitespace) set = utf8_decode(chars.is_string() ? chars.as_string() : to_str(chars));
  auto strip_char = [&](char32_t c) {
    return whitespace ? is_python_space(c) : set.find(c) != std::u32string::npos;
  };
  if (is_ascii(s)) {
    size_t b = 0, e = s.size();
    if (left)
      while (b < e && strip_char(static_cast<unsigned char>(s[b])))
        ++b;
    if (right)
      while (e > b && strip_char(static_cast<unsigned char>(s[e - 1])))
        --e;
    return s.substr(b, e - b);
  }
  const std::u32string u = utf8_decode(s);
  size_t b = 0, e = u.size();
  if (left)
    while (b < e && strip_char(u[b]))
      ++b;
  if (right)
    while (e > b && strip_char(u[e - 1]))
      --e;
  return u32_slice(u, b, e);
}

Value get_attr(const Value& obj, const std::string& name, int line) {
  switch (obj.kind()) {
    case Value::Kind::Undefined:
      fail_undefined(obj, line);
    case Value::Kind::String:
      if (is_string_method(name)) return bound_method(obj, name);
      return missing_attr(obj, name);
    case Value::Kind::Dict: {
      if (name == "items" || name == "keys" || name == "values" || name == "get") {
        return bound_method(obj, name);
      }
      if (const Value* v = obj.as_dict().find(name)) return *v;
      return missing_attr(obj, name);
    }
    case Value::Kind::List:
    case Value::Kind::Tuple:
      if (name == "index" || name == "count") return bound_method(obj, name);
      return missing_attr(obj, name);
    case Value::Kind::Namespace:
      if (const Value* v = obj.mutable_namespace().find(name)) return *v;
      return missing_attr(obj, name);
    case Value::Kind::Loop:
      return loop_attr(obj.as_loop(), name, line);
    default:
      return missing_attr(obj, name);
  }
}

Value get_item(const Value& obj, const Value& key, int line) {
  if (obj.is_undefined()) fail_undefined(obj, line);
  if (obj.is_dict() || obj.is_namespace()) {
    if (key.is_string()) {
      const Dict& d = obj.is_dict() ? obj.as_dict() : obj.mutable_namespace();
      if (const Value* v = d.find(key.as_string())) return *v;
      return get_attr(obj, key.as_string(), line);
    }
    return Value::undefined(object_name(obj) + " has no element " + to_repr(key));
  }
  if ((obj.is_sequence() || obj.is_string()) && (key.is_int() || key.is_bool())) {
    if (obj.is_sequence()) {
      const ValueList& items = obj.as_list();
      const int64_t i = normalize_index(key.as_int(), static_cast<int64_t>(items.size()));
      if (i < 0 || i >= static_cast<int64_t>(items.size())) {
        return Value::undefined(object_name(obj) + " has no element " + to_repr(key));
      }
      return items[static_cast<size_t>(i)];
    }
    const std::u32string u = utf8_decode(obj.as_string());
    const int64_t i = normalize_index(key.as_int(), static_cast<int64_t>(u.size()));
    if (i < 0 || i >= static_cast<int64_t>(u.size())) {
      return Value::undefined(object_name(obj) + " has no element " + to_repr(key));
    }
    return utf8_encode(std::u32string(1, u[static_cast<size_t>(i)]));
  }
  if (key.is_string()) return get_attr(obj, key.as_string(), line);
  return Value::undefined(object_name(obj) + " has no element " + to_repr(key));
}

Value get_slice(const Value& obj, const Value& start_v, const Value& stop_v, const Value& step_v,
                int line) {
  if (obj.is_undefined()) fail_undefined(obj, line);
  auto as_opt = [&](const Value& v) { return slice_index(v, "", line); };
  const int64_t step = as_opt(step_v).value_or(1);
  if (step == 0) fail("slice step cannot be zero", line);
  std::u32string chars;
  int64_t size = 0;
  if (obj.is_string()) {
    chars = utf8_decode(obj.as_string());
    size = static_cast<int64_t>(chars.size());
  } else if (obj.is_sequence()) {
    size = static_cast<int64_t>(obj.as_list().size());
  } else {
    fail("'" + obj.type_name() + "' object is not subscriptable", line);
  }
  // Python's slice.indices(): clamp to the valid range for the step's direction.
  auto clamp = [&](std::optional<int64_t> v, int64_t dflt) {
    if (!v) return dflt;
    int64_t x = *v < 0 ? *v + size : *v;
    if (step > 0) return std::clamp<int64_t>(x, 0, size);
    return std::clamp<int64_t>(x, -1, size - 1);
  };
  const int64_t start = clamp(as_opt(start_v), step > 0 ? 0 : size - 1);
  const int64_t stop = clamp(as_opt(stop_v), step > 0 ? size : -1);
  std::vector<size_t> picked;
  for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step)
    picked.push_back(static_cast<size_t>(i));
  if (obj.is_string()) {
    std::u32string out;
    for (size_t i : picked)
      out.push_back(chars[i]);
    return utf8_encode(out);
  }
  ValueList out;
  for (size_t i : picked)
    out.push_back(obj.as_list()[i]);
  return obj.kind() == Value::Kind::Tuple ? Value::tuple(std::move(out))
                                          : Value::list(std::move(out));
}

ValueList iterate(const Value& value, int line) {
  switch (value.kind()) {
    case Value::Kind::Undefined:
      return {};
    case Value::Kind::List:
    case Value::Kind::Tuple:
      return value.as_list();
    case Value::Kind::Dict: {
      ValueList keys;
      for (const auto& [k, v] : value.as_dict().entries)
        keys.emplace_back(k);
      return keys;
    }
    case Value::Kind::String: {
      ValueList chars;
      for (char32_t c : utf8_decode(value.as_string()))
        chars.emplace_back(utf8_encode(std::u32string(1, c)));
      return chars;
    }
    default:
      fail("'" + value.type_name() + "' object is not iterable", line);
  }
}

int64_t length_of(const Value& value, int line) {
  switch (value.kind()) {
    case Value::Kind::Undefined:
      return 0;
    case Value::Kind::String:
      return static_cast<int64_t>(utf8_length(value.as_string()));
    case Value::Kind::List:
    case Value::Kind::Tuple:
      return static_cast<int64_t>(value.as_list().size());
    case Value::Kind::Dict:
      return static_cast<int64_t>(value.as_dict().entries.size());
    default:
      fail("object of type '" + value.type_name() + "' has no len()", line);
  }
}

Value call_value(const Value& callee, CallArgs& args, int line) {
  if (callee.is_callable()) {
    args.line = line;
    return callee.as_callable().fn(args);
  }
  if (callee.is_undefined()) fail_undefined(callee, line);
  fail("'" + callee.type_name() + "' object is not callable", line);
}

namespace {

Value global_range(CallArgs& a) {
  a.expect_at_most("range", 3, {});
  for (const Value& v : a.positional) {
    if (!v.is_int() && !v.is_bool()) fail("range() expects integer arguments", a.line);
  }
  int64_t start = 0, stop = 0, step = 1;
  if (a.positional.size() == 1) {
    stop = a.positional[0].as_int();
  } else if (a.positional.size() >= 2) {
    start = a.positional[0].as_int();
    stop = a.positional[1].as_int();
    if (a.positional.size() == 3) step = a.positional[2].as_int();
  } else {
    fail("range expected at least 1 argument, got 0", a.line);
  }
  if (step == 0) fail("range() arg 3 must not be zero", a.line);
  ValueList out;
  for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
    if (out.size() >= 100000) fail("range too big", a.line);  // the sandbox's MAX_RANGE
    out.emplace_back(i);
  }
  return Value::list(std::move(out));
}

}  // namespace

Value builtin_global(const std::string& name) {
  if (name == "range") return Value::callable(name, global_range);
  if (name == "namespace") {
    return Value::callable(name, [](CallArgs& a) {
      // namespace() accepts any keyword names.
      Dict d;
      if (!a.positional.empty() && a.positional[0].is_dict()) d = a.positional[0].as_dict();
      for (auto& [k, v] : a.named)
        d.set(k, v);
      return Value::namespace_object(std::move(d));
    });
  }
  if (name == "dict") {
    return Value::callable(name, [](CallArgs& a) {
      Dict d;
      if (!a.positional.empty() && a.positional[0].is_dict()) d = a.positional[0].as_dict();
      for (auto& [k, v] : a.named)
        d.set(k, v);
      return Value::dict(std::move(d));
    });
  }
  if (name == "raise_exception") {
    return Value::callable(
        name, [](CallArgs& a) -> Value { throw ChatTemplateError(to_str(a.get(0, "message"))); });
  }
  if (name == "strftime_now") {
    return Value::callable(name, [](CallArgs& a) -> Value {
      const Value fmt = a.get(0, "format");
      if (!fmt.is_string()) fail("strftime_now expects a format string", a.line);
      const std::time_t now = std::time(nullptr);
      std::tm local{};
      localtime_r(&now, &local);
      char buf[256];
      const size_t n = std::strftime(buf, sizeof(buf), fmt.as_string().c_str(), &local);
      return std::string(buf, n);
    });
  }
  return Value::undefined();
}

}  // namespace pagellm::engine::jinja

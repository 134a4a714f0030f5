// The filters and tests of the Jinja subset, with jinja2's argument names and defaults.

#include <utf8proc.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <optional>

#include "engine/jinja_ast.h"
#include "engine/jinja_builtins.h"
#include "engine/jinja_unicode.h"
#include "engine/utf8.h"

namespace pagellm::engine::jinja {
namespace {

// transformers' tojson: json.dumps(x, ensure_ascii=False, indent=None, separators=None,
// sort_keys=False), in that order (not jinja2's own tojson, which HTML-escapes).
Value filter_tojson(const Value& v, CallArgs& a) {
  a.expect_at_most("tojson", 4, {"ensure_ascii", "indent", "separators", "sort_keys"});
  JsonStyle style;
  style.ensure_ascii = a.get(0, "ensure_ascii").truthy();
  const Value indent = a.get(1, "indent");
  if (!indent.is_undefined() && !indent.is_none()) {
    if (!(indent.is_int() || indent.is_bool()) || indent.as_int() > 1024)
      fail("tojson: unsupported indent " + to_repr(indent), a.line);
    style.indent = static_cast<int>(std::max<int64_t>(indent.as_int(), 0));  // negative: 0
    style.item_separator = ",";
  }
  const Value separators = a.get(2, "separators");
  if (!separators.is_undefined() && !separators.is_none()) {
    const bool pair = separators.is_sequence() && separators.as_list().size() == 2 &&
                      separators.as_list()[0].is_string() && separators.as_list()[1].is_string();
    if (!pair) fail("tojson: separators must be an (item, key) pair of strings", a.line);
    style.item_separator = separators.as_list()[0].as_string();
    style.key_separator = separators.as_list()[1].as_string();
  }
  style.sort_keys = a.get(3, "sort_keys").truthy();
  return to_json(v, style, a.line);
}

Value filter_trim(const Value& v, CallArgs& a) {
  a.expect_at_most("trim", 1, {"chars"});
  return py_strip(to_str(v), a.get(0, "chars"), true, true);
}

Value filter_length(const Value& v, CallArgs& a) {
  return length_of(v, a.line);
}
Value filter_string(const Value& v, CallArgs&) {
  return to_str(v);
}
Value filter_safe(const Value& v, CallArgs&) {
  return v;
}
Value filter_lower(const Value& v, CallArgs&) {
  return str_lower(to_str(v));
}
Value filter_upper(const Value& v, CallArgs&) {
  return str_upper(to_str(v));
}

Value filter_capitalize(const Value& v, CallArgs& a) {
  CallArgs none;
  none.line = a.line;
  return call_value(get_attr(Value(to_str(v)), "capitalize", a.line), none, a.line);
}

// jinja2's title: each word's first character uppercased and the rest lowercased (as
// Python's str.upper() and lower() do), words split at whitespace, '-' and brackets.
Value filter_title(const Value& v, CallArgs&) {
  const std::u32string text = utf8_decode(to_str(v));
  const auto separator = [](char32_t c) {
    return is_python_space(c) || c == '-' || c == '(' || c == '{' || c == '[' || c == '<';
  };
  const std::u32string_view view = text;
  std::string out;
  for (size_t i = 0; i < text.size();) {
    const bool run_of_separators = separator(text[i]);
    size_t end = i + 1;
    while (end < text.size() && separator(text[end]) == run_of_separators)
      ++end;
    out += str_upper(view.substr(i, 1));
    out += str_lower(view.substr(i + 1, end - i - 1));
    i = end;
  }
  return out;
}

Value filter_default(const Value& v, CallArgs& a) {
  a.expect_at_most("default", 2, {"default_value", "boolean"});
  const bool boolean = a.get(1, "boolean").truthy();
  if (v.is_undefined() || (boolean && !v.truthy())) {
    return a.has(0, "default_value") ? a.get(0, "default_value") : Value("");
  }
  return v;
}

Value attribute_of(const Value& item, const Value& attribute, int line) {
  if (attribute.is_int()) return get_item(item, attribute, line);
  Value current = item;
  const std::string path = to_str(attribute);
  size_t start = 0;
  while (true) {
    const size_t dot = path.find('.', start);
    const std::string part = path.substr(start, dot - start);
    const bool numeric = !part.empty() && std::all_of(part.begin(), part.end(), ::isdigit);
    current = numeric ? get_item(current, Value(static_cast<int64_t>(std::stoll(part))), line)
                      : get_item(current, Value(part), line);
    if (dot == std::string::npos) return current;
    if (current.is_undefined()) return current;
    start = dot + 1;
  }
}

Value filter_join(const Value& v, CallArgs& a) {
  a.expect_at_most("join", 2, {"d", "attribute"});
  const Value sep = a.get(0, "d");
  const Value attribute = a.get(1, "attribute");
  std::string out;
  bool first = true;
  for (const Value& item : iterate(v, a.line)) {
    if (!first && !sep.is_undefined()) out += to_str(sep);
    first = false;
    out += to_str(attribute.is_undefined() ? item : attribute_of(item, attribute, a.line));
  }
  return out;
}

Value filter_first(const Value& v, CallArgs& a) {
  ValueList items = iterate(v, a.line);
  return items.empty() ? Value::undefined("No first item, sequence was empty.") : items.front();
}

Value filter_last(const Value& v, CallArgs& a) {
  ValueList items = iterate(v, a.line);
  return items.empty() ? Value::undefined("No last item, sequence was empty.") : items.back();
}

Value filter_list(const Value& v, CallArgs& a) {
  return Value::list(iterate(v, a.line));
}

Value filter_items(const Value& v, CallArgs& a) {
  if (v.is_undefined()) return Value::list({});
  if (!v.is_dict()) fail("items filter expects a mapping, got " + v.type_name(), a.line);
  CallArgs none;
  return call_value(get_attr(v, "items", a.line), none, a.line);
}

Value filter_reverse(const Value& v, CallArgs& a) {
  if (v.is_string()) {
    std::u32string u = utf8_decode(v.as_string());
    std::reverse(u.begin(), u.end());
    return utf8_encode(u);
  }
  ValueList items = iterate(v, a.line);
  std::reverse(items.begin(), items.end());
  return Value::list(std::move(items));
}

Value filter_replace(const Value& v, CallArgs& a) {
  a.expect_at_most("replace", 3, {"old", "new", "count"});
  CallArgs args;
  args.positional = {Value(to_str(a.get(0, "old"))), Value(to_str(a.get(1, "new")))};
  const Value count = a.get(2, "count");
  if (count.is_int()) args.positional.push_back(count);
  return call_value(get_attr(Value(to_str(v)), "replace", a.line), args, a.line);
}

// jinja2's do_indent, which splits with str.splitlines() after appending a newline.
Value filter_indent(const Value& v, CallArgs& a) {
  a.expect_at_most("indent", 3, {"width", "first", "blank"});
  const Value width = a.get(0, "width");
  const std::string pad = width.is_string() ? width.as_string()
                          : width.is_int()  ? std::string(static_cast<size_t>(width.as_int()), ' ')
                                            : std::string(4, ' ');
  const Value text = Value(to_str(v) + "\n");
  CallArgs none;
  const ValueList lines = call_value(get_attr(text, "splitlines", a.line), none, a.line).as_list();
  std::string out;
  for (size_t i = 0; i < lines.size(); ++i) {
    const std::string& line = lines[i].as_string();
    if (i > 0) out += '\n';
    if (i > 0 && (a.get(2, "blank").truthy() || !line.empty())) out += pad;
    out += line;
  }
  if (a.get(1, "first").truthy()) out = pad + out;
  return out;
}

// Python's numeric literals in int() and float(): an optional sign, digits with single
// underscores between them (no hexadecimal), surrounding whitespace; float() also takes
// a fraction, an exponent, inf, infinity and nan. Returns the text without underscores,
// or nothing when Python would refuse it.
std::optional<std::string> python_number_text(const std::string& text, bool allow_float) {
  // Python strips Unicode White_Space (not U+001C..U+001F, which str.strip takes) and
  // reads every decimal digit (Nd) as its ASCII digit: digits come in runs from 0 to 9.
  std::string s;
  {
    std::u32string u = utf8_decode(text);
    size_t begin = 0, end = u.size();
    while (begin < end && utf8::is_whitespace(u[begin]))
      ++begin;
    while (end > begin && utf8::is_whitespace(u[end - 1]))
      --end;
    for (size_t k = begin; k < end; ++k) {
      char32_t c = u[k];
      if (c >= 0x80 &&
          utf8proc_category(static_cast<utf8proc_int32_t>(c)) == UTF8PROC_CATEGORY_ND) {
        char32_t zero = c;
        while (zero > 0 && c - zero < 9 &&
               utf8proc_category(static_cast<utf8proc_int32_t>(zero - 1)) == UTF8PROC_CATEGORY_ND)
          --zero;
        c = U'0' + (c - zero);
      }
      utf8_append(s, c);
    }
  }
  std::string out;
  size_t i = 0;
  if (i < s.size() && (s[i] == '+' || s[i] == '-')) out += s[i++];
  if (allow_float) {
    std::string word;
    for (size_t j = i; j < s.size(); ++j)
      word += static_cast<char>(std::tolower(static_cast<unsigned char>(s[j])));
    if (word == "inf" || word == "infinity" || word == "nan") return out + word;
  }
  // Digits, each underscore between two digits; `any` says whether one was read.
  auto digits = [&](bool& any) {
    any = false;
    while (i < s.size()) {
      if (std::isdigit(static_cast<unsigned char>(s[i]))) {
        out += s[i++];
        any = true;
      } else if (s[i] == '_' && any && i + 1 < s.size() &&
                 std::isdigit(static_cast<unsigned char>(s[i + 1]))) {
        ++i;
      } else {
        break;
      }
    }
  };
  bool whole = false, fraction = false;
  digits(whole);
  if (allow_float && i < s.size() && s[i] == '.') {
    out += s[i++];
    digits(fraction);
  }
  if (!whole && !fraction) return std::nullopt;
  if (allow_float && i < s.size() && (s[i] == 'e' || s[i] == 'E')) {
    out += s[i++];
    if (i < s.size() && (s[i] == '+' || s[i] == '-')) out += s[i++];
    bool exponent = false;
    digits(exponent);
    if (!exponent) return std::nullopt;
  }
  if (i != s.size()) return std::nullopt;
  return out;
}

std::optional<double> python_float(const std::string& text) {
  const auto number = python_number_text(text, true);
  if (!number) return std::nullopt;
  return std::strtod(number->c_str(), nullptr);  // past the range: +-inf, as Python
}

// int(x) of a float: truncated; past 64 bits an error (Python's integers have no end).
Value float_to_int(double d, const Value& dflt, int line) {
  if (std::isnan(d)) return dflt;  // ValueError, which jinja2 turns into the default
  if (std::isinf(d)) fail("cannot convert float infinity to integer", line);
  if (!(d > -9223372036854775808.0 && d < 9223372036854775808.0) && d != -9223372036854775808.0)
    fail("integer overflow: " + python_float_repr(d) + " does not fit in 64 bits", line);
  return static_cast<int64_t>(d);
}

// jinja2's do_int: int(x), else int(float(x)) ("42.23"|int is 42), else the default.
Value filter_int(const Value& v, CallArgs& a) {
  const Value dflt = a.has(0, "default") ? a.get(0, "default") : Value(0);
  if (v.is_int() || v.is_bool()) return v.as_int();
  if (v.is_float()) return float_to_int(v.as_double(), dflt, a.line);
  if (v.is_string()) {
    if (const auto whole = python_number_text(v.as_string(), false)) {
      errno = 0;
      const long long n = std::strtoll(whole->c_str(), nullptr, 10);
      if (errno == ERANGE) fail("integer overflow: " + *whole + " does not fit in 64 bits", a.line);
      return static_cast<int64_t>(n);
    }
    if (const auto d = python_float(v.as_string())) return float_to_int(*d, dflt, a.line);
  }
  return dflt;
}

Value filter_float(const Value& v, CallArgs& a) {
  const Value dflt = a.has(0, "default") ? a.get(0, "default") : Value(0.0);
  if (v.is_number()) return v.as_double();
  if (v.is_string()) {
    if (const auto d = python_float(v.as_string())) return *d;
  }
  return dflt;
}

Value filter_abs(const Value& v, CallArgs& a) {
  if (v.is_float()) return std::fabs(v.as_double());
  if (v.is_int() || v.is_bool()) return static_cast<int64_t>(std::llabs(v.as_int()));
  fail("bad operand type for abs(): '" + v.type_name() + "'", a.line);
}

Value filter_round(const Value& v, CallArgs& a) {
  a.expect_at_most("round", 2, {"precision", "method"});
  const Value p = a.get(0, "precision");
  const int64_t precision = p.is_int() ? p.as_int() : 0;
  const std::string method = a.has(1, "method") ? to_str(a.get(1, "method")) : "common";
  if (!v.is_number()) fail("round filter expects a number", a.line);
  const double scale = std::pow(10.0, static_cast<double>(precision));
  if (method == "common") {
    // Python's round(): an int stays an int (rounded to 10^-precision, half to even,
    // when the precision is negative); a float is rounded from its exact binary value
    // (2.675 is below 2.675, so 2.67), as printf's %.*f does, ties to even.
    if (!v.is_float()) {
      if (precision >= 0) return v.as_int();
      if (precision < -18) return int64_t{0};  // 10^19 is past every int64
      const double q = std::nearbyint(static_cast<double>(v.as_int()) * scale);
      return static_cast<int64_t>(q / scale);
    }
    const double x = v.as_double();
    if (precision >= 0 && precision <= 300 && std::isfinite(x)) {
      // Cut short, the text loses only fraction digits of a value of over 90 integer
      // digits, which is a whole number already.
      char text[400];
      std::snprintf(text, sizeof text, "%.*f", static_cast<int>(precision), x);
      return std::strtod(text, nullptr);
    }
    return std::nearbyint(x * scale) / scale;
  }
  const double x = v.as_double() * scale;
  if (method == "ceil") return std::ceil(x) / scale;
  if (method == "floor") return std::floor(x) / scale;
  fail("round: method must be common, ceil or floor", a.line);
}

// Sort key comparison honouring case_sensitive=False like jinja2's sort/unique/min/max.
Value sort_key(const Value& item, const Value& attribute, bool case_sensitive, int line) {
  Value key =
      attribute.is_undefined() || attribute.is_none() ? item : attribute_of(item, attribute, line);
  if (!case_sensitive && key.is_string()) return str_lower(key.as_string());
  return key;
}

Value filter_sort(const Value& v, CallArgs& a) {
  a.expect_at_most("sort", 3, {"reverse", "case_sensitive", "attribute"});
  const bool reverse = a.get(0, "reverse").truthy();
  const bool cs = a.get(1, "case_sensitive").truthy();
  const Value attribute = a.get(2, "attribute");
  ValueList items = iterate(v, a.line);
  std::vector<std::pair<Value, Value>> keyed;
  for (Value& item : items)
    keyed.emplace_back(sort_key(item, attribute, cs, a.line), item);
  std::stable_sort(keyed.begin(), keyed.end(), [&](const auto& x, const auto& y) {
    return reverse ? value_less(y.first, x.first, a.line) : value_less(x.first, y.first, a.line);
  });
  ValueList out;
  for (auto& [k, item] : keyed)
    out.push_back(item);
  return Value::list(std::move(out));
}

Value filter_dictsort(const Value& v, CallArgs& a) {
  a.expect_at_most("dictsort", 3, {"case_sensitive", "by", "reverse"});
  if (!v.is_dict()) fail("dictsort filter expects a mapping", a.line);
  const bool cs = a.get(0, "case_sensitive").truthy();
  const bool by_value = a.has(1, "by") && to_str(a.get(1, "by")) == "value";
  CallArgs args;
  args.positional = {Value(a.get(2, "reverse").truthy()), Value(cs),
                     Value(int64_t{by_value ? 1 : 0})};
  return filter_sort(filter_items(v, a), args);
}

Value filter_unique(const Value& v, CallArgs& a) {
  a.expect_at_most("unique", 2, {"case_sensitive", "attribute"});
  const bool cs = a.get(0, "case_sensitive").truthy();
  const Value attribute = a.get(1, "attribute");
  ValueList seen, out;
  for (const Value& item : iterate(v, a.line)) {
    const Value key = sort_key(item, attribute, cs, a.line);
    if (std::none_of(seen.begin(), seen.end(),
                     [&](const Value& s) { return values_equal(s, key); })) {
      seen.push_back(key);
      out.push_back(item);
    }
  }
  return Value::list(std::move(out));
}

Value min_max(const Value& v, CallArgs& a, bool want_max) {
  a.expect_at_most(want_max ? "max" : "min", 2, {"case_sensitive", "attribute"});
  const bool cs = a.get(0, "case_sensitive").truthy();
  const Value attribute = a.get(1, "attribute");
  ValueList items = iterate(v, a.line);
  if (items.empty()) return Value::undefined("No aggregated item, sequence was empty.");
  size_t best = 0;
  for (size_t i = 1; i < items.size(); ++i) {
    const Value k = sort_key(items[i], attribute, cs, a.line);
    const Value b = sort_key(items[best], attribute, cs, a.line);
    if (want_max ? value_less(b, k, a.line) : value_less(k, b, a.line)) best = i;
  }
  return items[best];
}
Value filter_max(const Value& v, CallArgs& a) {
  return min_max(v, a, true);
}
Value filter_min(const Value& v, CallArgs& a) {
  return min_max(v, a, false);
}

Value add_values(const Value& x, const Value& y, int line) {
  if (x.is_number() && y.is_number()) {
    if (x.is_float() || y.is_float()) return x.as_double() + y.as_double();
    return x.as_int() + y.as_int();
  }
  fail("unsupported operand type(s) for +: '" + x.type_name() + "' and '" + y.type_name() + "'",
       line);
}

Value filter_sum(const Value& v, CallArgs& a) {
  a.expect_at_most("sum", 2, {"attribute", "start"});
  const Value attribute = a.get(0, "attribute");
  Value total = a.has(1, "start") ? a.get(1, "start") : Value(0);
  for (const Value& item : iterate(v, a.line)) {
    total = add_values(
        total, attribute.is_undefined() ? item : attribute_of(item, attribute, a.line), a.line);
  }
  return total;
}

// jinja2's attr() reads Python attributes only: a dict's keys are not attributes.
Value filter_attr(const Value& v, CallArgs& a) {
  const std::string name = to_str(a.get(0, "name"));
  if (v.is_dict() && name != "items" && name != "keys" && name != "values" && name != "get") {
    return Value::undefined("'dict object' has no attribute '" + name + "'");
  }
  return get_attr(v, name, a.line);
}

Value filter_escape(const Value& v, CallArgs&) {
  std::string out;
  for (char c : to_str(v)) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&#34;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out.push_back(c);
    }
  }
  return out;
}

// Arguments after the first `skip` positional ones, for a filter or test applied per item.
CallArgs rest_args(const CallArgs& a, size_t skip) {
  CallArgs rest;
  rest.line = a.line;
  if (a.positional.size() > skip)
    rest.positional.assign(a.positional.begin() + skip, a.positional.end());
  return rest;
}

Value filter_map(const Value& v, CallArgs& a) {
  ValueList out;
  auto named = [&](std::string_view key) {
    for (const auto& [k, x] : a.named) {
      if (k == key) return x;
    }
    return Value::undefined();
  };
  const Value attribute = named("attribute");
  if (!attribute.is_undefined()) {
    const Value dflt = named("default");
    for (const Value& item : iterate(v, a.line)) {
      Value x = attribute_of(item, attribute, a.line);
      out.push_back(x.is_undefined() && !dflt.is_undefined() ? dflt : x);
    }
    return Value::list(std::move(out));
  }
  if (a.positional.empty()) fail("map requires a filter name or attribute=", a.line);
  const std::string name = to_str(a.positional[0]);
  const FilterFn fn = find_filter(name);
  if (fn == nullptr) fail("unsupported filter '" + name + "'", a.line);
  for (const Value& item : iterate(v, a.line)) {
    CallArgs rest = rest_args(a, 1);
    rest.named = a.named;
    out.push_back(fn(item, rest));
  }
  return Value::list(std::move(out));
}

// select/reject/selectattr/rejectattr share one loop.
Value select_items(const Value& v, CallArgs& a, bool by_attribute, bool keep_matching) {
  const size_t test_pos = by_attribute ? 1 : 0;
  TestFn test = nullptr;
  if (a.positional.size() > test_pos) {
    const std::string name = to_str(a.positional[test_pos]);
    test = find_test(name);
    if (test == nullptr) fail("unsupported test '" + name + "'", a.line);
  }
  ValueList out;
  for (const Value& item : iterate(v, a.line)) {
    const Value subject = by_attribute ? attribute_of(item, a.get(0, "attribute"), a.line) : item;
    CallArgs rest = rest_args(a, test_pos + 1);
    const bool match = test ? test(subject, rest) : subject.truthy();
    if (match == keep_matching) out.push_back(item);
  }
  return Value::list(std::move(out));
}
Value filter_select(const Value& v, CallArgs& a) {
  return select_items(v, a, false, true);
}
Value filter_reject(const Value& v, CallArgs& a) {
  return select_items(v, a, false, false);
}
Value filter_selectattr(const Value& v, CallArgs& a) {
  return select_items(v, a, true, true);
}
Value filter_rejectattr(const Value& v, CallArgs& a) {
  return select_items(v, a, true, false);
}

const std::map<std::string, FilterFn>& filters() {
  static const std::map<std::string, FilterFn> table = {
      {"abs", filter_abs},           {"attr", filter_attr},       {"capitalize", filter_capitalize},
      {"count", filter_length},      {"d", filter_default},       {"default", filter_default},
      {"dictsort", filter_dictsort}, {"e", filter_escape},        {"escape", filter_escape},
      {"first", filter_first},       {"float", filter_float},     {"indent", filter_indent},
      {"int", filter_int},           {"items", filter_items},     {"join", filter_join},
      {"last", filter_last},         {"length", filter_length},   {"list", filter_list},
      {"lower", filter_lower},       {"map", filter_map},         {"max", filter_max},
      {"min", filter_min},           {"reject", filter_reject},   {"rejectattr", filter_rejectattr},
      {"replace", filter_replace},   {"reverse", filter_reverse}, {"round", filter_round},
      {"safe", filter_safe},         {"select", filter_select},   {"selectattr", filter_selectattr},
      {"sort", filter_sort},         {"string", filter_string},   {"sum", filter_sum},
      {"title", filter_title},       {"tojson", filter_tojson},   {"trim", filter_trim},
      {"unique", filter_unique},     {"upper", filter_upper},
  };
  return table;
}

// --- tests -------------------------------------------------------------------------------

bool compare_arg(const Value& v, CallArgs& a, CompareOp op) {
  const Value other = a.get(0, "other");
  switch (op) {
    case CompareOp::Eq:
      return values_equal(v, other);
    case CompareOp::Ne:
      return !values_equal(v, other);
    case CompareOp::Lt:
      return value_less(v, other, a.line);
    case CompareOp::Le:
      return !value_less(other, v, a.line);
    case CompareOp::Gt:
      return value_less(other, v, a.line);
    default:
      return !value_less(v, other, a.line);
  }
}

bool test_in(const Value& v, CallArgs& a) {
  const Value seq = a.get(0, "seq");
  if (seq.is_string()) {
    return v.is_string() && seq.as_string().find(v.as_string()) != std::string::npos;
  }
  if (seq.is_dict()) return v.is_string() && seq.as_dict().find(v.as_string()) != nullptr;
  for (const Value& item : iterate(seq, a.line)) {
    if (values_equal(item, v)) return true;
  }
  return false;
}

bool test_sameas(const Value& v, CallArgs& a) {
  const Value other = a.get(0, "other");
  if (v.kind() != other.kind()) return false;
  if (v.is_none() || v.is_undefined() || v.is_bool() || v.is_int()) return values_equal(v, other);
  return false;  // distinct objects; the templates in use compare only singletons
}

bool has_case(const Value& v, bool upper) {
  if (!v.is_string()) return false;
  CallArgs none;
  return get_attr(v, upper ? "isupper" : "islower", 0).as_callable().fn(none).truthy();
}

const std::map<std::string, TestFn>& tests() {
  using A = CallArgs&;
  static const std::map<std::string, TestFn> table = {
      {"defined", [](const Value& v, A) { return !v.is_undefined(); }},
      {"undefined", [](const Value& v, A) { return v.is_undefined(); }},
      {"none", [](const Value& v, A) { return v.is_none(); }},
      {"boolean", [](const Value& v, A) { return v.is_bool(); }},
      {"true", [](const Value& v, A) { return v.is_bool() && v.as_bool(); }},
      {"false", [](const Value& v, A) { return v.is_bool() && !v.as_bool(); }},
      {"integer", [](const Value& v, A) { return v.is_int(); }},
      {"float", [](const Value& v, A) { return v.is_float(); }},
      {"number", [](const Value& v, A) { return v.is_number(); }},
      {"string", [](const Value& v, A) { return v.is_string(); }},
      {"mapping", [](const Value& v, A) { return v.is_dict(); }},
      {"iterable",
       [](const Value& v, A) {
         return v.is_sequence() || v.is_dict() || v.is_string() || v.is_undefined();
       }},
      {"sequence",
       [](const Value& v, A) { return v.is_sequence() || v.is_dict() || v.is_string(); }},
      {"callable", [](const Value& v, A) { return v.is_callable(); }},
      {"odd",
       [](const Value& v, A a) {
         if (!v.is_int() && !v.is_bool()) fail("odd test expects an integer", a.line);
         return v.as_int() % 2 != 0;
       }},
      {"even",
       [](const Value& v, A a) {
         if (!v.is_int() && !v.is_bool()) fail("even test expects an integer", a.line);
         return v.as_int() % 2 == 0;
       }},
      {"divisibleby",
       [](const Value& v, A a) {
         const Value n = a.get(0, "num");
         if (!v.is_int() || !n.is_int() || n.as_int() == 0)
           fail("divisibleby expects integers", a.line);
         return v.as_int() % n.as_int() == 0;
       }},
      {"eq", [](const Value& v, A a) { return compare_arg(v, a, CompareOp::Eq); }},
      {"equalto", [](const Value& v, A a) { return compare_arg(v, a, CompareOp::Eq); }},
      {"==", [](const Value& v, A a) { return compare_arg(v, a, CompareOp::Eq); }},
      {"ne", [](const Value& v, A a) { return compare_arg(v, a, CompareOp::Ne); }},
      {"!=", [](const Value& v, A a) { return compare_arg(v, a, CompareOp::Ne); }},
      {"lt", [](const Value& v, A a) { return compare_arg(v, a, CompareOp::Lt); }},
      {"lessthan", [](const Value& v, A a) { return compare_arg(v, a, CompareOp::Lt); }},
      {"<", [](const Value& v, A a) { return compare_arg(v, a, CompareOp::Lt); }},
      {"le", [](const Value& v, A a) { return compare_arg(v, a, CompareOp::Le); }},
      {"<=", [](const Value& v, A a) { return compare_arg(v, a, CompareOp::Le); }},
      {"gt", [](const Value& v, A a) { return compare_arg(v, a, CompareOp::Gt); }},
      {"greaterthan", [](const Value& v, A a) { return compare_arg(v, a, CompareOp::Gt); }},
      {">", [](const Value& v, A a) { return compare_arg(v, a, CompareOp::Gt); }},
      {"ge", [](const Value& v, A a) { return compare_arg(v, a, CompareOp::Ge); }},
      {">=", [](const Value& v, A a) { return compare_arg(v, a, CompareOp::Ge); }},
      {"in", test_in},
      {"sameas", test_sameas},
      {"lower", [](const Value& v, A) { return has_case(v, false); }},
      {"upper", [](const Value& v, A) { return has_case(v, true); }},
  };
  return table;
}

}  // namespace

FilterFn find_filter(const std::string& name) {
  auto it = filters().find(name);
  return it == filters().end() ? nullptr : it->second;
}

TestFn find_test(const std::string& name) {
  auto it = tests().find(name);
  return it == tests().end() ? nullptr : it->second;
}

}  // namespace pagellm::engine::jinja

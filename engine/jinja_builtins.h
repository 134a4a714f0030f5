#pragma once
// Attribute and item access, Python string/dict/list methods, iteration and the global
// functions (range, namespace, dict, raise_exception, strftime_now) of the Jinja subset.

#include <string>

#include "engine/jinja_value.h"

namespace pagellm::engine::jinja {

// `obj.name`: a method first, then a key (jinja2's getattr order). Missing -> Undefined.
Value get_attr(const Value& obj, const std::string& name, int line);
// `obj[key]`: a key or index first, then a method. Missing or out of range -> Undefined.
Value get_item(const Value& obj, const Value& key, int line);
// `obj[start:stop:step]` on lists, tuples and strings (by code point).
Value get_slice(const Value& obj, const Value& start, const Value& stop, const Value& step,
                int line);
// The items a for loop or filter sees: list items, dict keys, string characters;
// Undefined is empty.
ValueList iterate(const Value& value, int line);
// Python len().
int64_t length_of(const Value& value, int line);
Value call_value(const Value& callee, CallArgs& args, int line);
// A built-in global function (range, namespace, ...), or Undefined when `name` is none.
Value builtin_global(const std::string& name);
// Throws the UndefinedError jinja2 raises when an Undefined is used as a value.
[[noreturn]] void fail_undefined(const Value& value, int line);

// Python str methods used by filters too.
std::string py_strip(const std::string& s, const Value& chars, bool left, bool right);

}  // namespace pagellm::engine::jinja

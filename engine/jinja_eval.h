#pragma once
// Renders a parsed template: statements write to one output string, expressions follow
// Python semantics (see jinja_value.h). Scoping follows jinja2: a for-loop iteration and
// a macro call get their own scope; if-blocks do not.

#include <string>
#include <utility>
#include <vector>

#include "engine/jinja_ast.h"

namespace pagellm::engine::jinja {

// `variables` are the template's top-level names; built-in globals sit below them.
std::string render(const Body& body, std::vector<std::pair<std::string, Value>> variables);

}  // namespace pagellm::engine::jinja

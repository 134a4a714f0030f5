#pragma once
// Parses template source into a statement list, following jinja2's grammar and operator
// precedence. Throws ChatTemplateError naming the construct and line on anything
// malformed or outside the supported subset.

#include <string>

#include "engine/jinja_ast.h"

namespace pagellm::engine::jinja {

Body parse_template(const std::string& source);

}  // namespace pagellm::engine::jinja

#pragma once
// The one error type of chat-template parsing and rendering. Messages name the construct
// and the template line, e.g. "unsupported filter 'wordwrap' at line 3".

#include <stdexcept>
#include <string>

namespace pagellm::engine {

class ChatTemplateError : public std::runtime_error {
 public:
  explicit ChatTemplateError(const std::string& what) : std::runtime_error(what) {}
};

}  // namespace pagellm::engine

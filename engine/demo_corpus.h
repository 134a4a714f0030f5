#pragma once
// A few pages of plain English prose, built into the binary: the text the demo
// tokenizer learns its merges from.

#include <string_view>

namespace pagellm::engine {

std::string_view demo_corpus();

}  // namespace pagellm::engine

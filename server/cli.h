#pragma once
// The `pagellm` command line: one function per subcommand. Each takes the arguments
// after the subcommand name and returns the process exit code.

#include <span>
#include <string_view>

namespace pagellm::cli {

using Args = std::span<const std::string_view>;

int run(Args args);  // dispatches on args[0], the subcommand

int run_tokenize(Args args);
int run_render_chat(Args args);
int run_demo_model(Args args);
int run_serve(Args args);
int run_bench(Args args);  // linked into the executable from bench/, not this library

}  // namespace pagellm::cli

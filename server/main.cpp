#include <string_view>
#include <vector>

#include "server/cli.h"

int main(int argc, char** argv) {
  std::vector<std::string_view> args(argv + 1, argv + argc);
  return pagellm::cli::run(args);
}

#include <cstdio>

#include "server/cli.h"

namespace pagellm::cli {

int run_tokenize(Args) {
  std::fprintf(stderr, "pagellm: 'tokenize' is not built yet in this version\n");
  return 3;
}

}  // namespace pagellm::cli

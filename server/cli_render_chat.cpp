#include <cstdio>

#include "server/cli.h"

namespace pagellm::cli {

int run_render_chat(Args) {
  std::fprintf(stderr, "pagellm: 'render-chat' is not built yet in this version\n");
  return 3;
}

}  // namespace pagellm::cli

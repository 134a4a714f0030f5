#include "server/cli.h"

#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <cstdio>
#include <memory>
#include <string>

namespace pagellm::cli {
namespace {

constexpr int kExitUsage = 2;
constexpr int kExitNotBuilt = 3;

struct Subcommand {
  std::string_view name;
  std::string_view synopsis;
  int (*run)(Args);  // nullptr: not part of this build yet
};

constexpr Subcommand kSubcommands[] = {
    {"serve",
     "serve  [--model DIR] [--config FILE] [--host 127.0.0.1] [--port 8000]\n"
     "               [--backend auto|cpu|cuda] [--num-kv-blocks N | --kv-cache-bytes B]\n"
     "               [--max-num-seqs N] [--max-num-batched-tokens N] [--api-key KEY]\n"
     "               [--served-model-name NAME] [--log-level info]",
     run_serve},
    {"demo-model", "demo-model DIR [--preset tiny|small|bench]", run_demo_model},
    {"tokenize", "tokenize --model DIR [--decode] [--add-special-tokens]   (JSON lines in/out)",
     run_tokenize},
    {"render-chat", "render-chat --model DIR [--chat-template FILE]           (JSON lines in/out)",
     run_render_chat},
    {"bench",
     "bench  --url URL [--concurrency N] [--num-requests N] [--request-rate R]\n"
     "               [--input-len L] [--output-len L] [--shared-prefix-len P] [--json FILE]",
     run_bench},
};

void print_usage(std::FILE* out) {
  std::fprintf(out, "pagellm: an LLM serving daemon with a paged KV cache\n\nusage:\n");
  for (const Subcommand& sub : kSubcommands) {
    std::fprintf(out, "  pagellm %.*s\n", static_cast<int>(sub.synopsis.size()),
                 sub.synopsis.data());
  }
  std::fprintf(out, "\n  pagellm --help | --version\n");
}

}  // namespace

int run(Args args) {
  // The log goes to stderr: stdout is the commands' output (serve's bound address, the
  // JSON lines of tokenize and render-chat, bench's table).
  spdlog::set_default_logger(std::make_shared<spdlog::logger>(
      "pagellm", std::make_shared<spdlog::sinks::stderr_color_sink_mt>()));
  if (args.empty()) {
    print_usage(stderr);
    return kExitUsage;
  }
  const std::string_view name = args[0];
  if (name == "--help" || name == "-h" || name == "help") {
    print_usage(stdout);
    return 0;
  }
  if (name == "--version") {
    std::printf("pagellm %s\n", PAGELLM_VERSION);
    return 0;
  }
  for (const Subcommand& sub : kSubcommands) {
    if (sub.name != name) continue;
    if (sub.run == nullptr) {
      std::fprintf(stderr, "pagellm: '%.*s' is not built yet in this version\n",
                   static_cast<int>(name.size()), name.data());
      return kExitNotBuilt;
    }
    return sub.run(args.subspan(1));
  }
  std::fprintf(stderr, "pagellm: unknown command '%.*s'\n\n", static_cast<int>(name.size()),
               name.data());
  print_usage(stderr);
  return kExitUsage;
}

}  // namespace pagellm::cli

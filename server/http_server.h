#pragma once
// The OpenAI-compatible HTTP server: routes, SSE streaming, auth, access log and
// graceful shutdown, over one Engine. The only file that includes cpp-httplib is
// http_server.cpp; this header stays light.

#include <cstddef>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>

#include "scheduler/sampling_params.h"
#include "server/reasoning_parser.h"
#include "server/tool_call_parser.h"

namespace pagellm::engine {
class Engine;
class Tokenizer;
}  // namespace pagellm::engine

namespace pagellm::server {

struct HttpServerOptions {
  std::string host = "127.0.0.1";
  int port = 8000;      // 0: any free port (bind() returns it)
  std::string api_key;  // empty: no authentication
  std::string served_model_name;
  std::filesystem::path model_dir;
  std::optional<std::filesystem::path> chat_template;  // overrides the model's
  // What requests that leave a sampling parameter out get (see GenerationDefaults).
  scheduler::SamplingParams sampling_defaults;
  // How replies' tool calls are read, and thinking models' reasoning given apart
  // (tool_call_parser.h, reasoning_parser.h); unset: as the chat template teaches.
  std::optional<ToolCallFormat> tool_call_format;
  std::optional<ReasoningFormat> reasoning_format;
  size_t max_body_bytes = size_t(32) << 20;
  // Threads for connections (each open one holds a thread: see HttpThreadPool): started
  // at once, and at most.
  int threads = 128;
  int max_threads = 1024;
};

class HttpServer {
 public:
  // Loads the tokenizer config and chat template of the model (a model without a
  // template still serves /v1/completions).
  HttpServer(engine::Engine& engine, std::shared_ptr<const engine::Tokenizer> tokenizer,
             HttpServerOptions options);
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Binds the listening socket and returns the port. Throws std::runtime_error.
  int bind();
  // Serves until shutdown(); returns once every in-flight request has been answered.
  // False when the server could not serve at all.
  bool serve();
  // From any thread: stop accepting, refuse new generations with 503 and let the
  // requests in flight finish. serve() returns when they have.
  void shutdown();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace pagellm::server

#include "server/http_server.h"

#include <httplib.h>
#include <netdb.h>
#include <poll.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <random>
#include <string_view>
#include <thread>

#include "engine/chat_template.h"
#include "engine/engine.h"
#include "engine/incremental_detokenizer.h"
#include "engine/tokenizer.h"
#include "server/dashboard.h"
#include "server/http_thread_pool.h"
#include "server/metrics.h"
#include "server/openai_protocol.h"
#include "server/reasoning_parser.h"
#include "server/tool_call_parser.h"

namespace pagellm::server {
namespace {

using Clock = std::chrono::steady_clock;
using scheduler::AddStatus;
using scheduler::FinishReason;

constexpr const char* kJson = "application/json";

// cpp-httplib's queue of accepted connections, on a pool that grows when every thread
// is held by an open connection.
class TaskQueue : public httplib::TaskQueue {
 public:
  TaskQueue(size_t threads, size_t max_threads) : pool_(threads, max_threads) {}
  void enqueue(std::function<void()> job) override { pool_.enqueue(std::move(job)); }
  void shutdown() override { pool_.shutdown(); }

 private:
  HttpThreadPool pool_;
};

// One line per request, written when the last holder lets go: at the end of the
// handler, or when a stream has been written out.
struct AccessLog {
  std::string id;
  std::string method;
  std::string path;
  int status = 0;
  int64_t tokens_in = 0;
  int64_t tokens_out = 0;
  double ttft = -1;  // seconds; < 0: none
  Clock::time_point start = Clock::now();

  ~AccessLog() {
    const double total = std::chrono::duration<double>(Clock::now() - start).count();
    if (ttft >= 0) {
      spdlog::info("{} {} {} {} in={} out={} ttft={:.3f}s total={:.3f}s", id, method, path, status,
                   tokens_in, tokens_out, ttft, total);
    } else {
      spdlog::info("{} {} {} {} in={} out={} total={:.3f}s", id, method, path, status, tokens_in,
                   tokens_out, total);
    }
  }
};

std::string random_hex(size_t n) {
  thread_local std::mt19937_64 rng(std::random_device{}());
  static const char* digits = "0123456789abcdef";
  std::string out(n, '0');
  for (char& c : out)
    c = digits[rng() & 15];
  return out;
}

// Compares without an early exit, so the time taken does not tell how much matched.
bool constant_time_equal(const std::string& a, const std::string& b) {
  unsigned diff = a.size() == b.size() ? 0u : 1u;
  const size_t n = std::max(a.size(), b.size());
  for (size_t i = 0; i < n; ++i) {
    const unsigned char x = a.empty() ? 0 : a[i % a.size()];
    const unsigned char y = b.empty() ? 0 : b[i % b.size()];
    diff |= x ^ y;
  }
  return diff == 0;
}

int64_t unix_now() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

bool equals_ignoring_case(std::string_view a, std::string_view b) {
  const auto lower = [](char c) { return c >= 'A' && c <= 'Z' ? static_cast<char>(c + 32) : c; };
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(),
                                            [&](char x, char y) { return lower(x) == lower(y); });
}

// The methods each route answers, for the 405 of a known path asked with another.
struct RouteMethods {
  std::string_view path;  // a trailing '/' matches every path below it
  std::string_view allow;
};
constexpr RouteMethods kRouteMethods[] = {
    {"/health", "GET, HEAD"},    {"/metrics", "GET, HEAD"},   {"/dashboard", "GET, HEAD"},
    {"/v1/stats", "GET, HEAD"},  {"/v1/models", "GET, HEAD"}, {"/v1/models/", "GET, HEAD"},
    {"/tokenize", "POST"},       {"/detokenize", "POST"},     {"/v1/chat/completions", "POST"},
    {"/v1/completions", "POST"},
};

// The Allow header of `path`, or empty for a path no route serves.
std::string_view allowed_methods(std::string_view path) {
  for (const RouteMethods& r : kRouteMethods) {
    const bool matches = r.path.back() == '/' ? path.size() > r.path.size() &&
                                                    path.substr(0, r.path.size()) == r.path
                                              : path == r.path;
    if (matches) return r.allow;
  }
  return {};
}

const char* finish_name(FinishReason r) {
  return r == FinishReason::kLength ? "length" : "stop";
}

// The socket of the connection `req` arrived on. cpp-httplib 0.11 does not hand it to
// handlers, so it is found by the peer address, unique among the server's connections;
// -1 when not found. Cached per worker thread, as keep-alive requests reuse a connection.
int connection_socket(const httplib::Request& req) {
  thread_local int cached = -1;
  auto matches = [&](int fd) {
    sockaddr_storage addr{};
    socklen_t len = sizeof addr;
    if (getpeername(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) return false;
    char host[NI_MAXHOST], port[NI_MAXSERV];
    if (getnameinfo(reinterpret_cast<sockaddr*>(&addr), len, host, sizeof host, port, sizeof port,
                    NI_NUMERICHOST | NI_NUMERICSERV) != 0) {
      return false;
    }
    return req.remote_addr == host && std::to_string(req.remote_port) == port;
  };
  if (cached >= 0 && matches(cached)) return cached;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/fd", ec)) {
    const std::string name = entry.path().filename().string();
    if (name.empty() || name.find_first_not_of("0123456789") != std::string::npos) continue;
    const int fd = std::stoi(name);
    if (matches(fd)) return cached = fd;
  }
  return -1;
}

// Whether the client is still there: a peer that has closed reads as end of file.
// Unknown sockets count as connected.
bool client_connected(int fd) {
  if (fd < 0) return true;
  char c;
  const ssize_t n = recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
  if (n >= 0) return n > 0;
  return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR;
}

// Reads and drops what the peer sends, until it closes or pauses for 200 ms,
// `max_bytes` have come, or `max_time` has passed.
void drain(int fd, size_t max_bytes, std::chrono::milliseconds max_time) {
  const auto deadline = Clock::now() + max_time;
  char buf[65536];
  for (size_t total = 0; total < max_bytes;) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) return;
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, static_cast<int>(std::min<int64_t>(left, 200))) <= 0) return;
    const ssize_t n = recv(fd, buf, sizeof buf, 0);
    if (n <= 0) return;
    total += static_cast<size_t>(n);
  }
}

// One choice of a request: its stream and what has been gathered so far.
struct Choice {
  int32_t index = 0;
  int32_t prompt_index = 0;
  int64_t prompt_tokens = 0;
  std::shared_ptr<engine::RequestStream> stream;
  bool done = false;
  CharacterCounter logprob_chars;  // characters of the tokens whose logprobs went out
  // A chat reply that starts inside a thinking model's reasoning (its prompt left <think>
  // open). Streamed, the parsers of its reasoning and its tool calls, when they apply.
  bool starts_in_reasoning = false;
  std::optional<ReasoningStream> reasoning_stream;
  std::optional<ToolCallStream> tool_call_stream;
  // What has been gathered (engine::merge_chunk): the end (usage, reason, times) and when
  // each token was sampled, for inter-token latency.
  engine::GenerationChunk final;
};

}  // namespace

struct HttpServer::Impl {
  engine::Engine& engine;
  std::shared_ptr<const engine::Tokenizer> tokenizer;
  HttpServerOptions options;
  int listen_socket = -1;  // set while binding
  std::optional<engine::ChatTemplate> chat_template;
  std::string chat_template_error;
  // How the served model writes tool calls (kNone: replies stay text).
  ToolCallFormat tool_call_format = ToolCallFormat::kNone;
  // Whether thinking models' reasoning is given apart from their answer.
  ReasoningFormat reasoning_format = ReasoningFormat::kNone;
  // The chat template fails on tool call arguments as objects, and takes them as text.
  bool tool_arguments_as_text = false;
  // The tokenizer makes <think> or </think> a special token, which text would leave out.
  bool think_tags_special = false;
  engine::ChatRenderOptions render_defaults;
  ServerMetrics metrics;
  httplib::Server http;
  std::atomic<bool> draining{false};
  std::atomic<bool> listen_ended{false};
  int64_t created = unix_now();
  // Each token's own bytes, for logprobs (its const token_bytes only).
  engine::IncrementalDetokenizer token_pieces;

  Impl(engine::Engine& e, std::shared_ptr<const engine::Tokenizer> t, HttpServerOptions o)
      : engine(e), tokenizer(std::move(t)), options(std::move(o)), token_pieces(*tokenizer) {
    render_defaults = engine::chat_render_options(engine::load_tokenizer_config(options.model_dir));
    try {
      chat_template = engine::load_chat_template(options.model_dir, options.chat_template);
    } catch (const std::exception& err) {
      if (options.chat_template) throw;  // asked for explicitly: a startup error
      chat_template_error = err.what();
      spdlog::warn("no chat template: /v1/chat/completions will answer 400 ({})", err.what());
    }
    if (chat_template && !chat_template_takes_argument_objects(*chat_template, render_defaults)) {
      tool_arguments_as_text = true;
      spdlog::info(
          "the chat template fails on tool call arguments as objects: they reach it as JSON "
          "text");
    }
    choose_tool_call_format();
    choose_reasoning_format();
    routes();
  }

  void choose_reasoning_format() {
    for (const char* tag : {"<think>", "</think>"}) {
      const std::optional<engine::TokenId> id = tokenizer->token_to_id(tag);
      if (id && tokenizer->is_special(*id)) think_tags_special = true;
    }
    if (options.reasoning_format) {
      reasoning_format = *options.reasoning_format;
      return;
    }
    if (chat_template) reasoning_format = reasoning_format_of_template(chat_template->source());
    if (reasoning_format != ReasoningFormat::kNone) {
      spdlog::info(
          "the chat template knows <think>: a reply's reasoning is given apart as 'reasoning' "
          "(--reasoning-parser none leaves it in the content)");
    }
  }

  bool parses_reasoning(const CompletionRequest& r) const {
    return r.chat && reasoning_format != ReasoningFormat::kNone;
  }

  void choose_tool_call_format() {
    if (options.tool_call_format) {
      tool_call_format = *options.tool_call_format;
      return;
    }
    if (chat_template) tool_call_format = tool_call_format_of_template(chat_template->source());
    if (tool_call_format != ToolCallFormat::kNone) {
      spdlog::info(
          "tool calls in replies to requests with tools are read as {}, as the chat template "
          "teaches (--tool-call-parser none leaves them in the text)",
          tool_call_format_name(tool_call_format));
    }
  }

  // Whether the reply's tool calls are taken out of its text.
  bool parses_tool_calls(const CompletionRequest& r) const {
    return r.chat && r.tool_calls_allowed && tool_call_format != ToolCallFormat::kNone;
  }

  // The calls as the reply gives them, numbered from `first` within the choice; with
  // parallel_tool_calls false, the first call only. Mistral's templates refuse, in the
  // next turn, a call id other than 9 letters and digits.
  std::vector<ToolCallResult> tool_call_results(const CompletionRequest& r,
                                                std::vector<ParsedToolCall> calls,
                                                int32_t first) const {
    std::vector<ToolCallResult> out;
    for (ParsedToolCall& c : calls) {
      if (!r.parallel_tool_calls && first > 0) break;
      std::string id =
          tool_call_format == ToolCallFormat::kMistral ? random_hex(9) : "call_" + random_hex(24);
      out.push_back({first++, std::move(id), std::move(c.name), std::move(c.arguments)});
    }
    return out;
  }

  // A reply that ended on its own with tool calls ends for them, as OpenAI's do.
  static std::string finish_reason_of(FinishReason reason, bool called) {
    if (called && reason == FinishReason::kStop) return "tool_calls";
    return finish_name(reason);
  }

  int32_t max_model_len() const { return engine.config().scheduler.max_model_len; }

  // Where a request without max_tokens stops: the context window, or the whole KV pool
  // when that is smaller (a sliding window needs only a window's worth of blocks).
  int32_t default_length_limit() const {
    const int64_t pool_tokens = engine.kv_plan().capacity_tokens;
    if (engine.model_config().sliding_window > 0 || pool_tokens >= max_model_len()) {
      return max_model_len();
    }
    return static_cast<int32_t>(pool_tokens);
  }

  ModelInfo model_info() const {
    ModelInfo info;
    info.id = options.served_model_name;
    info.created = created;
    info.max_model_len = max_model_len();
    info.kv_cache_blocks = engine.kv_plan().num_blocks;
    info.kv_cache_tokens = engine.kv_plan().capacity_tokens;
    return info;
  }

  void send_error(httplib::Response& res, const ApiError& error) {
    res.status = error.status;
    res.set_content(error_body(error), kJson);
  }

  void check_auth(const httplib::Request& req) {
    if (options.api_key.empty()) return;
    std::string key;
    const std::string auth = req.get_header_value("Authorization");
    // "Bearer KEY", the scheme's name in any case (RFC 9110).
    constexpr std::string_view kScheme = "bearer ";
    if (equals_ignoring_case(std::string_view(auth).substr(0, kScheme.size()), kScheme)) {
      key = auth.substr(kScheme.size());
    } else if (req.has_header("X-Api-Key")) {
      key = req.get_header_value("X-Api-Key");
    }
    if (!constant_time_equal(key, options.api_key)) {
      throw ApiException(error_for_status(401, "invalid or missing API key"));
    }
  }

  using Handler = std::function<void(const httplib::Request&, httplib::Response&,
                                     const std::shared_ptr<AccessLog>&)>;

  // Every route goes through here once: request id, auth, and any exception turned
  // into an OpenAI error, so that one bad request never stops the server.
  httplib::Server::Handler wrap(bool authenticated, const char* id_prefix, Handler handler) {
    return [this, authenticated, id_prefix, handler](const httplib::Request& req,
                                                     httplib::Response& res) {
      auto log = std::make_shared<AccessLog>();
      log->id = id_prefix + random_hex(24);
      log->method = req.method;
      log->path = req.path;
      res.set_header("X-Request-Id", log->id);
      try {
        if (authenticated) check_auth(req);
        handler(req, res, log);
      } catch (const ApiException& e) {
        send_error(res, e.error());
      } catch (const std::exception& e) {
        spdlog::error("{} {} {}: {}", log->id, req.method, req.path, e.what());
        send_error(res, error_for_status(500, "internal server error"));
      } catch (...) {
        spdlog::error("{} {} {}: unknown exception", log->id, req.method, req.path);
        send_error(res, error_for_status(500, "internal server error"));
      }
      if (res.status == -1) res.status = 200;
      if (res.status >= 400) ++metrics.http_errors;
      log->status = res.status;
    };
  }

  // Why a request's body is not taken (before it is read), if it is not: compressed, or
  // without a Content-Length (httplib reads a POST without one to the end of the
  // connection, with no limit).
  static std::optional<ApiError> body_refusal(const httplib::Request& req) {
    for (size_t i = 0; i < req.get_header_value_count("Content-Encoding"); ++i) {
      const std::string encoding = req.get_header_value("Content-Encoding", i);
      if (!encoding.empty() && !equals_ignoring_case(encoding, "identity")) {
        return error_for_status(415, "request bodies with Content-Encoding '" + encoding +
                                         "' are not accepted: send the body uncompressed");
      }
    }
    if (req.has_header("Transfer-Encoding")) {
      return error_for_status(
          411, "request bodies must come with a Content-Length, not Transfer-Encoding '" +
                   req.get_header_value("Transfer-Encoding") + "'");
    }
    if ((req.method == "POST" || req.method == "PUT" || req.method == "PATCH") &&
        !req.has_header("Content-Length")) {
      return error_for_status(411, "request bodies must come with a Content-Length");
    }
    return std::nullopt;
  }

  // Fills `res` with the refusal, counts and logs it; its request id.
  std::string refuse(const httplib::Request& req, httplib::Response& res, const ApiError& error) {
    const std::string id = "req-" + random_hex(24);
    send_error(res, error);
    res.set_header("X-Request-Id", id);
    ++metrics.http_errors;
    spdlog::info("{} {} {} {}", id, req.method, req.path, res.status);
    return id;
  }

  void routes() {
    http.Get("/health", wrap(false, "req-", [this](auto&, auto& res, auto&) {
               const bool ok = engine.alive() && !draining;
               res.status = ok ? 200 : 503;
               res.set_content(ok ? R"({"status":"ok"})" : R"({"status":"unavailable"})", kJson);
             }));
    http.Get("/metrics", wrap(false, "req-", [this](auto&, auto& res, auto&) {
               res.set_content(render_metrics(engine.stats(), metrics, options.served_model_name),
                               "text/plain; version=0.0.4");
             }));
    // The page holds no data; it asks /v1/stats, with the key when one is set.
    http.Get("/dashboard", wrap(false, "req-", [](auto&, auto& res, auto&) {
               res.set_content(dashboard_html(), "text/html; charset=utf-8");
             }));
    http.Get("/v1/stats", wrap(true, "req-", [this](auto&, auto& res, auto&) {
               res.set_content(stats_json(engine.stats()), kJson);
             }));
    http.Get("/v1/models", wrap(true, "req-", [this](auto&, auto& res, auto&) {
               res.set_content(models_response(model_info()), kJson);
             }));
    http.Get(R"(/v1/models/(.+))", wrap(true, "req-", [this](auto& req, auto& res, auto&) {
               if (req.matches[1] != options.served_model_name) {
                 ApiError e = error_for_status(
                     404, "the model '" + std::string(req.matches[1]) + "' does not exist");
                 e.code = "model_not_found";
                 throw ApiException(e);
               }
               res.set_content(model_response(model_info()), kJson);
             }));
    http.Post("/tokenize", wrap(true, "req-", [this](auto& req, auto& res, auto&) {
                const TokenizeRequest r = parse_tokenize_request(req.body);
                require_model(r.model);
                const std::string text =
                    r.prompt
                        ? *r.prompt
                        : render_chat_prompt(require_template(), render_defaults, r.messages_json,
                                             r.add_generation_prompt, r.template_variables_json,
                                             tool_arguments_as_text);
                res.set_content(tokenize_response(tokenizer->encode(text, r.add_special_tokens),
                                                  max_model_len()),
                                kJson);
              }));
    http.Post("/detokenize", wrap(true, "req-", [this](auto& req, auto& res, auto&) {
                const DetokenizeRequest r = parse_detokenize_request(req.body);
                require_model(r.model);
                const std::vector<int32_t>& ids = r.tokens;
                for (int32_t id : ids) {
                  if (id >= static_cast<int32_t>(tokenizer->vocab_size())) {
                    throw ApiException(invalid_request(
                        "token id " + std::to_string(id) + " is outside the vocabulary", "tokens"));
                  }
                }
                res.set_content(detokenize_response(tokenizer->decode(ids)), kJson);
              }));
    http.Post("/v1/chat/completions",
              wrap(true, "chatcmpl-", [this](auto& req, auto& res, auto& log) {
                generate(parse_chat_request(req.body, options.sampling_defaults), req, res, log);
              }));
    http.Post("/v1/completions", wrap(true, "cmpl-", [this](auto& req, auto& res, auto& log) {
                generate(parse_completion_request(req.body, options.sampling_defaults), req, res,
                         log);
              }));

    // Before any body is read. httplib holds a body to its limit only by its
    // Content-Length: a chunked body, or a compressed one (which it would inflate), could
    // grow without bound, so neither is taken; clients send JSON plainly, with a length.
    http.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
      const std::optional<ApiError> refusal = body_refusal(req);
      if (!refusal) return httplib::Server::HandlerResponse::Unhandled;
      const std::string id = refuse(req, res, *refusal);
      // The body is not taken, so the connection must end with this answer: were it kept
      // open, the body would be read as the next request, and httplib keeps connections
      // open unless the request says otherwise. So the answer is written here, the
      // sending side shut, and what the client still sends read and dropped (up to a
      // limit of time and bytes) so that closing does not reset the connection before the
      // client has read the answer. httplib's own write of the response then fails, and
      // its next read finds the end of the connection.
      const int fd = connection_socket(req);
      if (fd < 0) {
        spdlog::warn("{}: the connection's socket was not found; it stays open", id);
        return httplib::Server::HandlerResponse::Handled;
      }
      const std::string out =
          "HTTP/1.1 " + std::to_string(res.status) + " " +
          (res.status == 411 ? "Length Required" : "Unsupported Media Type") +
          "\r\nContent-Type: " + kJson + "\r\nContent-Length: " + std::to_string(res.body.size()) +
          "\r\nConnection: close\r\nX-Request-Id: " + id + "\r\n\r\n" + res.body;
      for (size_t sent = 0; sent < out.size();) {
        const ssize_t n = send(fd, out.data() + sent, out.size() - sent, MSG_NOSIGNAL);
        if (n <= 0) break;
        sent += static_cast<size_t>(n);
      }
      ::shutdown(fd, SHUT_WR);
      drain(fd, 2 * options.max_body_bytes, std::chrono::seconds(5));
      ::shutdown(fd, SHUT_RD);
      return httplib::Server::HandlerResponse::Handled;
    });
    // A client that asks before sending its body gets the refusal instead of 100 Continue,
    // and so never sends it.
    http.set_expect_100_continue_handler(
        [this](const httplib::Request& req, httplib::Response& res) {
          const std::optional<ApiError> refusal = body_refusal(req);
          if (!refusal) return 100;
          refuse(req, res, *refusal);
          res.set_header("Connection", "close");
          // httplib writes this answer as it is, without the length it gives others.
          res.set_header("Content-Length", std::to_string(res.body.size()));
          return res.status;
        });

    // Unknown routes and httplib's own refusals (413) get an OpenAI-shaped body too; a
    // known path asked with the wrong method is a 405 that names the right one.
    http.set_error_handler(httplib::Server::HandlerWithResponse([this](const httplib::Request& req,
                                                                       httplib::Response& res) {
      if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
      const std::string_view allow = res.status == 404 ? allowed_methods(req.path) : "";
      if (!allow.empty()) {
        res.status = 405;
        res.set_header("Allow", std::string(allow));
      }
      const std::string message =
          res.status == 405   ? req.path + " takes " + std::string(allow) + ", not " + req.method
          : res.status == 404 ? "no route " + req.method + " " + req.path
          : res.status == 413 ? "the request body is over the limit of " +
                                    std::to_string(options.max_body_bytes) + " bytes"
                              : "the request was refused (HTTP " + std::to_string(res.status) + ")";
      res.set_content(error_body(error_for_status(res.status, message)), kJson);
      ++metrics.http_errors;
      const std::string id = "req-" + random_hex(24);
      res.set_header("X-Request-Id", id);
      spdlog::info("{} {} {} {}", id, req.method, req.path, res.status);
      return httplib::Server::HandlerResponse::Handled;
    }));
    http.set_exception_handler(
        [this](const httplib::Request&, httplib::Response& res, std::exception_ptr) {
          send_error(res, error_for_status(500, "internal server error"));
        });
    http.set_payload_max_length(options.max_body_bytes);
    // Load generators and SDKs reuse connections for many requests.
    http.set_keep_alive_max_count(1000);
    // Streamed tokens are small writes: without TCP_NODELAY, Nagle's algorithm holds
    // them back behind the delayed ACK of a kept-alive connection (about 40 ms).
    http.set_tcp_nodelay(true);
    // The listening socket, to widen its backlog after bind (see HttpServer::bind).
    http.set_socket_options([this](int sock) {
      int yes = 1;
      setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
      listen_socket = sock;
    });
    const auto max_threads = static_cast<size_t>(std::max(options.max_threads, 1));
    const auto threads = std::min(static_cast<size_t>(std::max(options.threads, 1)), max_threads);
    http.new_task_queue = [threads, max_threads] { return new TaskQueue(threads, max_threads); };
  }

  const engine::ChatTemplate& require_template() const {
    if (!chat_template) {
      throw ApiException(invalid_request("this model has no chat template: " + chat_template_error +
                                             " (start the server with --chat-template FILE)",
                                         "messages"));
    }
    return *chat_template;
  }

  // Token ids of every prompt of the request; for chat, the rendered prompt in `rendered`.
  std::vector<std::vector<int32_t>> prompt_tokens(const CompletionRequest& r,
                                                  std::string& rendered) const {
    std::vector<std::vector<int32_t>> prompts;
    if (r.chat) {
      const std::string text = render_chat_prompt(
          require_template(), render_defaults, r.messages_json, r.add_generation_prompt,
          r.template_variables_json, tool_arguments_as_text);
      // The template writes the special tokens (BOS) itself.
      prompts.push_back(tokenizer->encode(text, r.add_special_tokens.value_or(false)));
      rendered = text;
    } else {
      for (const PromptInput& p : r.prompts) {
        prompts.push_back(p.text ? tokenizer->encode(*p.text, r.add_special_tokens.value_or(true))
                                 : p.tokens);
      }
    }
    for (const auto& p : prompts) {
      if (p.empty()) throw ApiException(invalid_request("the prompt is empty", "prompt"));
    }
    return prompts;
  }

  // 404 for a model this server does not serve; no name asks for none in particular.
  void require_model(const std::string& name) const {
    if (name.empty() || name == options.served_model_name) return;
    ApiError e = error_for_status(404, "the model '" + name + "' does not exist");
    e.param = "model";
    e.code = "model_not_found";
    throw ApiException(e);
  }

  ApiError submit_error(const engine::SubmitAllResult& result,
                        const std::string& max_tokens_param) const {
    switch (result.status) {
      case AddStatus::kQueueFull:
        if (draining) return error_for_status(503, result.message);
        return error_for_status(429, result.message);
      case AddStatus::kTooLong:
        return invalid_request(result.message, max_tokens_param);
      case AddStatus::kNeverFits:
      case AddStatus::kInvalid:
      default:
        if (!engine.alive()) return error_for_status(503, "the engine is not running");
        return invalid_request(result.message, result.param.empty() ? "prompt" : result.param);
    }
  }

  void abort_all(const std::vector<Choice>& choices) {
    for (const Choice& c : choices) {
      if (c.stream && !c.done) engine.abort(c.stream->id());
    }
  }

  void generate(const CompletionRequest& r, const httplib::Request& req, httplib::Response& res,
                const std::shared_ptr<AccessLog>& log) {
    require_model(r.model);
    if (r.priority != 0 &&
        engine.config().scheduler.policy != scheduler::SchedulingPolicy::kPriority) {
      // vLLM refuses it too: first come, first served has no use for it.
      throw ApiException(invalid_request(
          "'priority' needs the server to run with --scheduling-policy priority", "priority"));
    }
    if (draining) throw ApiException(error_for_status(503, "the server is shutting down"));
    std::string rendered;
    const auto prompts = prompt_tokens(r, rendered);
    const bool starts_in_reasoning =
        parses_reasoning(r) && reply_starts_in_reasoning(reasoning_format, rendered);
    // A prompt that fills the context is at fault whatever max_tokens asks for; checked
    // before anything is submitted.
    for (const auto& prompt : prompts) {
      if (static_cast<int64_t>(prompt.size()) >= max_model_len()) {
        throw ApiException(invalid_request(
            "this model's maximum context length is " + std::to_string(max_model_len()) +
                " tokens, and the prompt has " + std::to_string(prompt.size()) +
                ": no room is left for the completion",
            r.chat ? "messages" : "prompt"));
      }
    }

    // Every choice of every prompt, queued together: all, or none.
    std::vector<engine::GenerationRequest> sequences;
    std::vector<Choice> choices;
    for (size_t p = 0; p < prompts.size(); ++p) {
      for (int32_t i = 0; i < r.params.n; ++i) {
        engine::GenerationRequest g;
        g.prompt = prompts[p];
        g.params = r.params;
        g.params.n = 1;
        const int32_t index = static_cast<int32_t>(p) * r.params.n + i;
        if (r.params.seed) g.params.seed = *r.params.seed + static_cast<uint64_t>(i);
        if (!r.max_tokens_set) {
          // Unset: as much as the context window leaves (at least 1, so that a prompt
          // over the KV pool gets the engine's message with both numbers).
          g.params.max_tokens =
              std::max<int32_t>(1, default_length_limit() - static_cast<int32_t>(g.prompt.size()));
          check_min_tokens(g.params);  // more than the context leaves: never met
        }
        g.priority = r.priority;
        g.skip_special_tokens = r.skip_special_tokens;
        // Mistral's [TOOL_CALLS] is a special token, and so is <tool_call> in some
        // tokenizers: the text must keep them, as vLLM has it.
        if (parses_tool_calls(r) && tool_call_format != ToolCallFormat::kLlama3Json) {
          g.skip_special_tokens = false;
        }
        if (parses_reasoning(r) && think_tags_special) g.skip_special_tokens = false;
        sequences.push_back(std::move(g));
        Choice c;
        c.index = index;
        c.starts_in_reasoning = starts_in_reasoning;
        if (r.stream && parses_reasoning(r)) c.reasoning_stream.emplace(starts_in_reasoning);
        if (r.stream && parses_tool_calls(r)) c.tool_call_stream.emplace(tool_call_format);
        c.prompt_index = static_cast<int32_t>(p);
        c.prompt_tokens = static_cast<int64_t>(prompts[p].size());
        choices.push_back(std::move(c));
      }
    }
    engine::SubmitAllResult submitted = engine.submit_all(std::move(sequences));
    if (!submitted.ok()) {
      const ApiError e = submit_error(submitted, r.max_tokens_param);
      if (e.status == 429) res.set_header("Retry-After", "1");
      throw ApiException(e);
    }
    for (size_t i = 0; i < choices.size(); ++i)
      choices[i].stream = std::move(submitted.streams[i]);
    for (const auto& p : prompts)
      log->tokens_in += static_cast<int64_t>(p.size());

    ResponseMeta meta{log->id, unix_now(), options.served_model_name};
    const int socket = connection_socket(req);
    if (socket < 0) spdlog::debug("{}: connection socket not found", log->id);
    if (r.stream) {
      stream_response(r, meta, std::move(choices), socket, req.version == "HTTP/1.0", res, log);
    } else {
      whole_response(r, meta, choices, socket, res, log);
    }
  }

  std::vector<TokenLogprobEntry> logprob_entries(const std::vector<engine::SampledToken>& tokens) {
    std::vector<TokenLogprobEntry> out;
    out.reserve(tokens.size());
    for (const engine::SampledToken& t : tokens) {
      TokenLogprobEntry e;
      e.token = token_text(t.token);
      e.logprob = t.logprob;
      for (const engine::TokenLogprob& top : t.top)
        e.top.emplace_back(token_text(top.token), top.logprob);
      out.push_back(std::move(e));
    }
    return out;
  }

  std::string token_text(int32_t id) const { return token_pieces.token_bytes(id); }

  // Usage over all choices: each prompt counted once, every completion counted.
  UsageResult usage_of(const std::vector<Choice>& choices) const {
    UsageResult u;
    std::vector<bool> seen;
    for (const Choice& c : choices) {
      u.completion_tokens += c.final.usage.completion_tokens;
      if (static_cast<size_t>(c.prompt_index) >= seen.size()) seen.resize(c.prompt_index + 1);
      if (!seen[c.prompt_index]) {
        seen[c.prompt_index] = true;
        u.prompt_tokens += c.final.usage.prompt_tokens;
        u.cached_tokens += c.final.usage.cached_prompt_tokens;
      }
    }
    return u;
  }

  // Records a finished choice; returns the error for the client when it did not end
  // normally (engine failure or shutdown).
  std::optional<ApiError> record_end(Choice& c, const std::shared_ptr<AccessLog>& log) {
    const engine::GenerationChunk& f = c.final;
    // Every choice counts in the histograms, as it does in the request counters; the
    // access log gives the first choice's time to first token.
    if (f.times.first_token > 0 && f.times.arrival > 0) {
      const double ttft = f.times.first_token - f.times.arrival;
      metrics.time_to_first_token.observe(ttft);
      if (log->ttft < 0) log->ttft = ttft;
    }
    if (f.times.finished > 0 && f.times.arrival > 0) {
      metrics.e2e_latency.observe(f.times.finished - f.times.arrival);
    }
    if (f.times.first_scheduled > 0 && f.times.arrival > 0) {
      metrics.queue_time.observe(f.times.first_scheduled - f.times.arrival);
    }
    for (size_t i = 1; i < f.token_times.size(); ++i) {
      metrics.inter_token_latency.observe(f.token_times[i] - f.token_times[i - 1]);
    }
    if (f.finished && f.error.empty()) {
      metrics.request_prompt_tokens.observe(f.usage.prompt_tokens);
      metrics.request_generation_tokens.observe(f.usage.completion_tokens);
    }
    if (f.usage.completion_tokens > 1 && f.times.last_token > f.times.first_token) {
      metrics.time_per_output_token.observe((f.times.last_token - f.times.first_token) /
                                            (f.usage.completion_tokens - 1));
    }
    if (!f.error.empty()) {
      // The engine's own failures stay in the log; a refusal at admission (the
      // scheduler's message, written for clients) is passed on.
      if (f.error.rfind("internal error", 0) == 0) {
        spdlog::error("{}: request failed in the engine: {}", log->id, f.error);
        return error_for_status(500, "the request failed inside the engine");
      }
      return error_for_status(503, f.error);
    }
    if (f.finish_reason == FinishReason::kAbort) {
      ++metrics.requests_abort;
      return error_for_status(503, "the request was cancelled: the server is shutting down");
    }
    ++(f.finish_reason == FinishReason::kLength ? metrics.requests_length : metrics.requests_stop);
    return std::nullopt;
  }

  void whole_response(const CompletionRequest& r, const ResponseMeta& meta,
                      std::vector<Choice>& choices, int socket, httplib::Response& res,
                      const std::shared_ptr<AccessLog>& log) {
    std::vector<ChoiceResult> results;
    std::optional<ApiError> failure;
    auto checked = Clock::now();
    for (Choice& c : choices) {
      while (!c.final.finished) {
        if (auto chunk = c.stream->next(std::chrono::milliseconds(50))) {
          engine::merge_chunk(c.final, std::move(*chunk));
        }
        if (c.final.finished || Clock::now() - checked < std::chrono::milliseconds(50)) continue;
        checked = Clock::now();
        if (!client_connected(socket)) {
          client_gone(choices, log);
          // Nobody reads it; the access log shows why (nginx's "client closed request").
          send_error(res, error_for_status(499, "the client closed the connection"));
          return;
        }
      }
      c.done = true;
      if (auto e = record_end(c, log); e && !failure) failure = e;
      ChoiceResult out;
      out.index = c.index;
      out.text = c.final.text;
      out.finish_reason = finish_name(c.final.finish_reason);
      if (parses_reasoning(r)) {
        ReasoningDelta split = split_reasoning(c.starts_in_reasoning, c.final.text);
        // A reply of reasoning only has no content, as in vLLM.
        out.null_content = split.content.empty() && !split.reasoning.empty();
        out.text = std::move(split.content);
        if (r.include_reasoning) out.reasoning = std::move(split.reasoning);
      }
      if (parses_tool_calls(r)) {
        ParsedToolCalls parsed = parse_tool_calls(tool_call_format, out.text);
        out.null_content = !parsed.content || (parsed.content->empty() && out.null_content);
        out.text = parsed.content.value_or("");
        out.tool_calls = tool_call_results(r, std::move(parsed.calls), 0);
        out.finish_reason = finish_reason_of(c.final.finish_reason, !out.tool_calls.empty());
      }
      out.has_logprobs = r.params.logprobs;
      if (r.params.logprobs) out.logprobs = logprob_entries(c.final.tokens);
      results.push_back(std::move(out));
    }
    if (failure) throw ApiException(*failure);
    const UsageResult usage = usage_of(choices);
    log->tokens_out = usage.completion_tokens;
    res.set_content(completion_response(r.chat, meta, results, usage), kJson);
  }

  void client_gone(std::vector<Choice>& choices, const std::shared_ptr<AccessLog>& log) {
    abort_all(choices);
    // Each choice counts with the end the engine gives it, as the engine's own stats do:
    // one that ended before the abort reached the engine keeps its reason. The engine
    // takes aborts at the start of its next step; one that never answers counts as aborted.
    const auto deadline = Clock::now() + std::chrono::seconds(5);
    for (Choice& c : choices) {
      if (c.done) continue;
      engine::merge_chunk(c.final, c.stream->collect(deadline));
      c.done = true;
      if (c.final.finished) {
        record_end(c, log);  // the client is gone: an error for it has no reader
      } else {
        ++metrics.requests_abort;
      }
    }
    log->tokens_out = usage_of(choices).completion_tokens;  // made for it, sent or not
    log->status = 499;
    spdlog::info("{}: the client went away; request aborted", log->id);
  }

  void stream_response(const CompletionRequest& r, const ResponseMeta& meta,
                       std::vector<Choice> choices, int socket, bool http10, httplib::Response& res,
                       const std::shared_ptr<AccessLog>& log) {
    auto state = std::make_shared<std::vector<Choice>>(std::move(choices));
    res.set_header("Cache-Control", "no-cache");
    auto provider = [this, r, meta, state, socket, log](size_t, httplib::DataSink& sink) {
      // The whole stream is written in this one call: httplib stops calling a
      // provider once the server is stopping, and a graceful shutdown must let
      // streams in flight finish.
      // Exceptions here would escape httplib's handler guard and end the process.
      try {
        if (!write_stream(r, meta, *state, socket, sink, log)) {
          client_gone(*state, log);
          return false;
        }
      } catch (const std::exception& e) {
        spdlog::error("{}: stream failed: {}", log->id, e.what());
        abort_all(*state);
        return false;
      }
      sink.done();
      return true;
    };
    // HTTP/1.0 has no chunked encoding: the stream then ends with the connection.
    if (http10) {
      res.set_content_provider("text/event-stream", std::move(provider));
    } else {
      res.set_chunked_content_provider("text/event-stream", std::move(provider));
    }
  }

  static bool send_event(httplib::DataSink& sink, const std::string& payload) {
    const std::string event = "data: " + payload + "\n\n";
    return sink.write(event.data(), event.size());
  }

  // Writes SSE events until every choice has finished; false when the client is gone.
  bool write_stream(const CompletionRequest& r, const ResponseMeta& meta,
                    std::vector<Choice>& choices, int socket, httplib::DataSink& sink,
                    const std::shared_ptr<AccessLog>& log) {
    // With continuous usage stats, a choice's usage so far goes with each of its chunks.
    UsageResult so_far;
    auto usage_for = [&](const Choice& c) -> const UsageResult* {
      if (!r.continuous_usage) return nullptr;
      so_far.prompt_tokens = c.prompt_tokens;
      so_far.completion_tokens = c.final.finished
                                     ? c.final.usage.completion_tokens
                                     : static_cast<int64_t>(c.final.token_times.size());
      return &so_far;
    };
    if (r.chat) {
      for (Choice& c : choices) {
        ChoiceResult role;
        role.index = c.index;
        if (!send_event(sink, stream_chunk(true, meta, role, true, usage_for(c)))) return false;
      }
    }
    std::optional<ApiError> failure;
    size_t remaining = choices.size();
    auto idle_since = Clock::now();
    const auto wait = std::chrono::milliseconds(choices.size() == 1 ? 50 : 2);
    while (remaining > 0) {
      bool any = false;
      for (Choice& c : choices) {
        if (c.done) continue;
        auto chunk = c.stream->next(wait);
        if (!chunk) continue;
        any = true;
        ChoiceResult out;
        out.index = c.index;
        out.text = chunk->text;
        if (c.reasoning_stream) {
          ReasoningDelta split = c.reasoning_stream->feed(out.text);
          if (chunk->finished) split.append(c.reasoning_stream->finish());
          out.text = std::move(split.content);
          if (r.include_reasoning) out.reasoning = std::move(split.reasoning);
        }
        if (c.tool_call_stream) {
          const auto before = static_cast<int32_t>(c.tool_call_stream->calls());
          ToolCallDelta delta = c.tool_call_stream->feed(out.text);
          if (chunk->finished) delta.append(c.tool_call_stream->finish());
          out.text = std::move(delta.content);
          out.tool_calls = tool_call_results(r, std::move(delta.calls), before);
        }
        out.has_logprobs = r.params.logprobs;
        if (r.params.logprobs) {
          out.logprobs = logprob_entries(chunk->tokens);
          out.text_offset = c.logprob_chars;
          for (const TokenLogprobEntry& e : out.logprobs)
            c.logprob_chars.add(e.token);
        }
        // The text and tokens went out above; the times and the end are gathered.
        chunk->text.clear();
        chunk->tokens.clear();
        engine::merge_chunk(c.final, std::move(*chunk));
        if (chunk->finished) {
          c.done = true;
          --remaining;
          if (auto e = record_end(c, log)) {
            if (!failure) failure = e;
            continue;
          }
        }
        if (!out.text.empty() || !out.logprobs.empty() || !out.tool_calls.empty() ||
            !out.reasoning.empty()) {
          if (!send_event(sink, stream_chunk(r.chat, meta, out, false, usage_for(c)))) return false;
        }
        if (chunk->finished) {
          ChoiceResult end;
          end.index = c.index;
          end.finish_reason = finish_reason_of(
              chunk->finish_reason, c.tool_call_stream && c.tool_call_stream->calls() > 0);
          if (!send_event(sink, stream_chunk(r.chat, meta, end, false, usage_for(c)))) return false;
        }
      }
      if (any) {
        idle_since = Clock::now();
      } else if (!client_connected(socket)) {
        return false;  // gone while the request waits in the queue
      } else if (Clock::now() - idle_since > std::chrono::seconds(15)) {
        // A comment line, which SSE clients skip, so that proxies keep the connection.
        if (!sink.write(": keep-alive\n\n", 14)) return false;
        idle_since = Clock::now();
      }
    }
    const UsageResult usage = usage_of(choices);
    log->tokens_out = usage.completion_tokens;
    if (failure) {
      if (!send_event(sink, error_body(*failure))) return false;
    } else if (r.include_usage) {
      if (!send_event(sink, stream_usage_chunk(r.chat, meta, usage))) return false;
    }
    return send_event(sink, "[DONE]");
  }
};

HttpServer::HttpServer(engine::Engine& engine, std::shared_ptr<const engine::Tokenizer> tokenizer,
                       HttpServerOptions options)
    : impl_(std::make_unique<Impl>(engine, std::move(tokenizer), std::move(options))) {}

HttpServer::~HttpServer() = default;

int HttpServer::bind() {
  Impl& s = *impl_;
  int port = s.options.port;
  if (port == 0) {
    port = s.http.bind_to_any_port(s.options.host);
    if (port < 0) throw std::runtime_error("cannot bind to " + s.options.host + " (any port)");
  } else if (!s.http.bind_to_port(s.options.host, port)) {
    throw std::runtime_error("cannot bind to " + s.options.host + ":" + std::to_string(port) +
                             " (in use, or not an address of this machine)");
  }
  // cpp-httplib (as Debian builds it) listens with a backlog of 5: a burst of clients
  // connecting at once overflows it, and connections the kernel drops then fail on their
  // first read. listen() again on the bound socket only changes the backlog.
  if (s.listen_socket >= 0) ::listen(s.listen_socket, 1024);
  return port;
}

bool HttpServer::serve() {
  const bool listened = impl_->draining || impl_->http.listen_after_bind();
  impl_->listen_ended = true;
  return listened || impl_->draining;
}

void HttpServer::shutdown() {
  impl_->draining = true;
  // httplib's stop() does nothing until the listener has begun: a signal that came while
  // the model loaded would leave it listening for good. Wait for it to begin (or end).
  while (!impl_->http.is_running() && !impl_->listen_ended)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  impl_->http.stop();
}

}  // namespace pagellm::server

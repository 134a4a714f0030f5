// `pagellm serve`: loads a model, starts the engine and the OpenAI-compatible HTTP server,
// and shuts down gracefully on SIGINT/SIGTERM.

#include <signal.h>
#include <spdlog/spdlog.h>
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>

#include "engine/backend.h"
#include "engine/demo_model.h"
#include "engine/engine.h"
#include "engine/kv_cache_memory.h"
#include "engine/llama_model.h"
#include "engine/tokenizer.h"
#include "server/cli.h"
#include "server/cli_args.h"
#include "server/http_server.h"
#include "server/reasoning_parser.h"
#include "server/tool_call_parser.h"

namespace pagellm::cli {
namespace {

constexpr const char* kUsage =
    "usage: pagellm serve [options]\n"
    "\n"
    "Serves a model over an OpenAI-compatible HTTP API: /v1/chat/completions,\n"
    "/v1/completions, /v1/models, /tokenize, /detokenize, /v1/stats, /health,\n"
    "/metrics (Prometheus) and /dashboard (the KV block pool, live). The bound\n"
    "address is printed on stdout; the log (one line per request) goes to stderr.\n"
    "\n"
    "  --model DIR                 Hugging Face model folder (default: the demo model,\n"
    "                              written to models/demo on first use)\n"
    "  --config FILE               JSON file whose keys are these options without the\n"
    "                              leading dashes (see configs/default.json); flags\n"
    "                              given on the command line override it\n"
    "  --host ADDR                 address to listen on (default 127.0.0.1)\n"
    "  --port N                    port (default 8000; 0 picks a free one)\n"
    "  --backend auto|cpu|cuda     compute backend (default auto: CUDA when this build\n"
    "                              has it and a GPU is present, else the CPU)\n"
    "  --cpu-matmul auto|amx|fma   CPU bf16 matmul (default auto: AMX where the CPU has\n"
    "                              it, faster for batches and prompts, unless\n"
    "                              --max-num-seqs is 1; fma: faster for a single\n"
    "                              sequence's decode)\n"
    "  --num-kv-blocks N           KV cache size in 16-token blocks, or\n"
    "  --kv-cache-bytes B          KV cache size in bytes (default on the CPU: 1 GiB, or\n"
    "                              less when max-num-seqs full contexts need less; on a\n"
    "                              GPU: --gpu-memory-utilization of its free memory)\n"
    "  --gpu-memory-utilization F  share of the GPU's free memory (after the weights)\n"
    "                              the KV cache may take (default 0.9)\n"
    "  --max-num-seqs N            sequences in one batch (default 256)\n"
    "  --max-num-batched-tokens N  tokens in one forward pass (default 2048)\n"
    "  --max-model-len N           context window (default: the model's)\n"
    "  --max-waiting N             queued sequences before 429 (default 4096)\n"
    "  --scheduling-policy P       fcfs (default: first come, first served) or priority\n"
    "                              (requests' 'priority' field, lower first)\n"
    "  --api-key KEY               require 'Authorization: Bearer KEY' or 'X-Api-Key: KEY'\n"
    "                              (default: $PAGELLM_API_KEY; /health, /metrics and\n"
    "                              /dashboard stay open)\n"
    "  --served-model-name NAME    the model id clients use (default: the folder name)\n"
    "  --chat-template FILE        Jinja chat template instead of the model's own\n"
    "  --generation-config G       auto (default): sampling parameters a request leaves\n"
    "                              out come from the model's generation_config.json, as\n"
    "                              in vLLM; none: OpenAI's defaults (temperature 1, ...)\n"
    "  --tool-call-parser P        how tool calls in replies to requests with tools are\n"
    "                              read into 'tool_calls': auto (default: the syntax the\n"
    "                              chat template teaches), hermes, llama3_json, mistral,\n"
    "                              or none (replies stay text)\n"
    "  --reasoning-parser P        how a thinking model's <think>...</think> is given\n"
    "                              apart as 'reasoning': auto (default: when the chat\n"
    "                              template knows <think>), qwen3, deepseek_r1 (replies\n"
    "                              start in their reasoning unless the prompt closed it),\n"
    "                              or none (it stays in the content)\n"
    "  --log-level LEVEL           trace, debug, info (default), warn, error\n"
    "  --shutdown-timeout S        seconds requests in flight get to finish after\n"
    "                              SIGINT/SIGTERM before they are aborted (default 30)\n";

const std::vector<std::string> kOptions = {"--model",
                                           "--config",
                                           "--host",
                                           "--port",
                                           "--backend",
                                           "--cpu-matmul",
                                           "--num-kv-blocks",
                                           "--kv-cache-bytes",
                                           "--gpu-memory-utilization",
                                           "--max-num-seqs",
                                           "--max-num-batched-tokens",
                                           "--max-model-len",
                                           "--max-waiting",
                                           "--scheduling-policy",
                                           "--api-key",
                                           "--served-model-name",
                                           "--chat-template",
                                           "--generation-config",
                                           "--tool-call-parser",
                                           "--reasoning-parser",
                                           "--log-level",
                                           "--shutdown-timeout"};

struct ServeOptions {
  std::string model;
  std::string host = "127.0.0.1";
  int port = 8000;
  std::string backend = "auto";
  std::string cpu_matmul = "auto";
  std::optional<int64_t> num_kv_blocks;
  std::optional<int64_t> kv_cache_bytes;
  double gpu_memory_utilization = 0.9;
  int32_t max_num_seqs = 256;
  int32_t max_num_batched_tokens = 2048;
  int32_t max_model_len = 0;
  int32_t max_waiting = 4096;
  std::string scheduling_policy = "fcfs";
  std::string api_key;
  std::string served_model_name;
  std::string chat_template;
  std::string generation_config = "auto";
  std::optional<server::ToolCallFormat> tool_call_format;  // unset: auto
  std::optional<server::ReasoningFormat> reasoning_format;
  std::string log_level = "info";
  double shutdown_timeout = 30;
};

// Config file values as option strings, keyed by flag name ("max_num_seqs" and
// "max-num-seqs" both name --max-num-seqs).
std::map<std::string, std::string> read_config(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw UsageError("cannot read the config file " + path);
  nlohmann::json config;
  try {
    config = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    throw UsageError("config file " + path + " is not valid JSON: " + e.what());
  }
  if (!config.is_object()) throw UsageError("config file " + path + " must hold a JSON object");
  std::map<std::string, std::string> values;
  std::map<std::string, std::string> keys;  // flag name -> the key that set it
  for (auto it = config.begin(); it != config.end(); ++it) {
    std::string name = "--" + it.key();
    std::replace(name.begin(), name.end(), '_', '-');
    if (std::find(kOptions.begin(), kOptions.end(), name) == kOptions.end() || name == "--config") {
      throw UsageError("config file " + path + ": unknown key '" + it.key() + "'");
    }
    if (auto [at, added] = keys.emplace(name, it.key()); !added) {
      throw UsageError("config file " + path + ": '" + at->second + "' and '" + it.key() +
                       "' set the same option");
    }
    if (it->is_null()) continue;
    if (it->is_string()) {
      values[name] = it->get<std::string>();
    } else if (it->is_number()) {
      // A whole number written as a float (4e6) is the integer.
      const double x = it->get<double>();
      const bool whole = it->is_number_float() && std::nearbyint(x) == x && std::fabs(x) < 9e18;
      values[name] = whole ? std::to_string(static_cast<int64_t>(x)) : it->dump();
    } else {
      throw UsageError("config file " + path + ": '" + it.key() + "' must be a string or number");
    }
  }
  return values;
}

ServeOptions parse_options(const ArgReader& reader) {
  std::map<std::string, std::string> values;
  if (auto config = reader.option("--config")) values = read_config(*config);
  // The two ways to size the KV pool are one option: a flag replaces the file's other.
  if (reader.option("--num-kv-blocks")) values.erase("--kv-cache-bytes");
  if (reader.option("--kv-cache-bytes")) values.erase("--num-kv-blocks");
  for (const std::string& name : kOptions) {
    if (auto v = reader.option(name)) values[name] = *v;
  }
  auto get = [&](const char* name) -> std::optional<std::string> {
    auto it = values.find(name);
    if (it == values.end()) return std::nullopt;
    return it->second;
  };
  // An empty value (an unset variable in a script) is not "unset": --model '' would
  // serve the random demo model.
  auto text = [&](const char* name) -> std::optional<std::string> {
    auto v = get(name);
    if (v && v->empty()) throw UsageError(std::string(name) + " must not be empty");
    return v;
  };
  constexpr int64_t kInt32Max = std::numeric_limits<int32_t>::max();
  ServeOptions o;
  if (auto v = text("--model")) o.model = *v;
  if (auto v = text("--host")) o.host = *v;
  if (auto v = get("--port")) o.port = static_cast<int>(integer_in("--port", *v, 0, 65535));
  if (auto v = get("--backend")) o.backend = *v;
  if (auto v = get("--cpu-matmul")) {
    if (!engine::known_cpu_matmul(*v)) {
      throw UsageError("--cpu-matmul must be auto, amx or fma, not '" + *v + "'");
    }
    o.cpu_matmul = *v;
  }
  if (auto v = get("--num-kv-blocks"))
    o.num_kv_blocks = integer_in("--num-kv-blocks", *v, 1, kInt32Max);
  if (auto v = get("--kv-cache-bytes")) {
    o.kv_cache_bytes = integer_in("--kv-cache-bytes", *v, 1, std::numeric_limits<int64_t>::max());
  }
  if (o.num_kv_blocks && o.kv_cache_bytes) {
    throw UsageError("give --num-kv-blocks or --kv-cache-bytes, not both");
  }
  if (auto v = get("--max-num-seqs")) {
    o.max_num_seqs = static_cast<int32_t>(integer_in("--max-num-seqs", *v, 1, 65536));
  }
  if (auto v = get("--max-num-batched-tokens")) {
    o.max_num_batched_tokens =
        static_cast<int32_t>(integer_in("--max-num-batched-tokens", *v, 1, kInt32Max));
  }
  if (auto v = get("--max-model-len")) {
    o.max_model_len = static_cast<int32_t>(integer_in("--max-model-len", *v, 0, kInt32Max));
  }
  if (auto v = get("--max-waiting")) {
    o.max_waiting = static_cast<int32_t>(integer_in("--max-waiting", *v, 1, kInt32Max));
  }
  if (auto v = get("--scheduling-policy")) {
    if (*v != "fcfs" && *v != "priority") {
      throw UsageError("--scheduling-policy must be fcfs or priority, not '" + *v + "'");
    }
    o.scheduling_policy = *v;
  }
  if (auto v = get("--api-key")) {
    o.api_key = *v;
  } else if (const char* env = std::getenv("PAGELLM_API_KEY"); env != nullptr) {
    o.api_key = env;  // keeps the key out of the process list
  }
  if (auto v = text("--served-model-name")) o.served_model_name = *v;
  if (auto v = text("--chat-template")) o.chat_template = *v;
  if (auto v = get("--generation-config")) {
    if (*v != "auto" && *v != "none") {
      throw UsageError("--generation-config must be auto or none, not '" + *v + "'");
    }
    o.generation_config = *v;
  }
  if (auto v = get("--tool-call-parser"); v && *v != "auto") {
    o.tool_call_format = server::tool_call_format_named(*v);
    if (!o.tool_call_format) {
      throw UsageError(
          "--tool-call-parser must be auto, hermes, llama3_json, mistral or none, not '" + *v +
          "'");
    }
  }
  if (auto v = get("--reasoning-parser"); v && *v != "auto") {
    o.reasoning_format = server::reasoning_format_named(*v);
    if (!o.reasoning_format) {
      throw UsageError("--reasoning-parser must be auto, qwen3, deepseek_r1 or none, not '" + *v +
                       "'");
    }
  }
  if (auto v = get("--log-level")) o.log_level = *v;
  if (auto v = get("--shutdown-timeout")) {
    o.shutdown_timeout = static_cast<double>(integer_in("--shutdown-timeout", *v, 0, 24 * 3600));
  }
  if (auto v = get("--gpu-memory-utilization")) {
    const std::optional<double> f = whole_number(*v);
    if (!f || !(*f > 0 && *f <= 1)) {
      throw UsageError("--gpu-memory-utilization must be a number in (0, 1], not '" + *v + "'");
    }
    o.gpu_memory_utilization = *f;
  }
  if (o.backend != "auto" && o.backend != "cpu" && o.backend != "cuda") {
    throw UsageError("--backend must be auto, cpu or cuda, not '" + o.backend + "'");
  }
  if (o.backend == "cuda" && !engine::cuda_backend_built()) {
    throw UsageError("--backend cuda: this build has no CUDA support (build where nvcc is)");
  }
  const auto level = spdlog::level::from_str(o.log_level);
  if (level == spdlog::level::off && o.log_level != "off") {
    throw UsageError("--log-level must be trace, debug, info, warn, error or off, not '" +
                     o.log_level + "'");
  }
  return o;
}

// The demo model, written on first use, when no --model is given.
std::filesystem::path demo_model_dir() {
  const std::filesystem::path dir = "models/demo";
  if (!std::filesystem::exists(dir / "config.json")) {
    spdlog::info("no --model given: writing the demo model (preset small) to {}", dir.string());
    engine::write_demo_model(dir, engine::demo_model_preset("small"));
  }
  return dir;
}

int64_t default_kv_blocks(const engine::ModelConfig& model, const ServeOptions& o) {
  const int64_t context = o.max_model_len > 0 ? o.max_model_len : model.context_length();
  const int64_t needed =
      (int64_t(o.max_num_seqs) * context + paging::kBlockSize - 1) / paging::kBlockSize + 1;
  const int64_t budget =
      engine::kv_blocks_for_bytes(model, engine::default_kv_dtype(model), int64_t(1) << 30);
  return std::max<int64_t>(1, std::min(needed, budget));
}

// Waits for SIGINT/SIGTERM (blocked in every thread, taken here) or for `stopped`.
bool wait_for_signal(const std::atomic<bool>& stopped, std::chrono::milliseconds limit) {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (!stopped && std::chrono::steady_clock::now() < deadline) {
    timespec tick{0, 100'000'000};
    if (sigtimedwait(&set, nullptr, &tick) > 0) return true;
  }
  return false;
}

}  // namespace

int run_serve(Args args) {
  ServeOptions o;
  try {
    std::set<std::string> options(kOptions.begin(), kOptions.end());
    ArgReader reader(args, options, {});
    if (reader.help()) {
      std::fputs(kUsage, stdout);
      return 0;
    }
    if (!reader.positional().empty()) {
      throw UsageError("unexpected argument '" + reader.positional().front() + "'");
    }
    o = parse_options(reader);
  } catch (const UsageError& e) {
    std::fprintf(stderr, "pagellm serve: %s\n\n%s", e.what(), kUsage);
    return 2;
  }
  spdlog::set_level(spdlog::level::from_str(o.log_level));
  spdlog::set_pattern("%Y-%m-%d %H:%M:%S.%e %^%l%$ %v");

  // Signals go to the waiting loop below, not to whichever thread they hit; threads
  // started from here on inherit the mask.
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  // A client that hangs up shows as a failed write, not as a signal that ends us.
  std::signal(SIGPIPE, SIG_IGN);
  // Every connection takes a descriptor, and a soft limit of 1024 (a common default)
  // would refuse connections long before the HTTP threads run out: take the hard limit,
  // as vLLM does. (cpp-httplib waits on sockets with poll, which has no FD_SETSIZE.)
  if (rlimit files{}; getrlimit(RLIMIT_NOFILE, &files) == 0 && files.rlim_cur < files.rlim_max) {
    const rlim_t soft = files.rlim_cur;
    // An unlimited hard limit still stops at the kernel's nr_open (1048576 by default).
    files.rlim_cur = std::min<rlim_t>(files.rlim_max, rlim_t{1} << 20);
    if (files.rlim_cur > soft && setrlimit(RLIMIT_NOFILE, &files) == 0) {
      spdlog::debug("open file limit raised from {} to {}", soft, files.rlim_cur);
    }
  }

  std::unique_ptr<engine::Engine> engine;
  std::unique_ptr<server::HttpServer> http;
  int port = 0;
  try {
    const std::filesystem::path model_dir =
        o.model.empty() ? demo_model_dir() : std::filesystem::path(o.model);
    auto tokenizer =
        std::make_shared<const engine::Tokenizer>(engine::Tokenizer::from_dir(model_dir));
    engine::BackendOptions backend_options;
    backend_options.kind = o.backend;
    backend_options.cpu_matmul = o.cpu_matmul;
    backend_options.max_num_seqs = o.max_num_seqs;
    backend_options.max_num_batched_tokens = o.max_num_batched_tokens;
    backend_options.max_model_len = o.max_model_len;
    auto backend = engine::load_backend(model_dir, backend_options);
    spdlog::info("backend {}: {}", backend->name(), backend->device_description());
    engine::EngineConfig config;
    config.scheduler.max_num_seqs = o.max_num_seqs;
    config.scheduler.max_num_batched_tokens = o.max_num_batched_tokens;
    config.scheduler.max_model_len = o.max_model_len;
    config.scheduler.max_waiting = o.max_waiting;
    config.scheduler.policy = o.scheduling_policy == "priority"
                                  ? scheduler::SchedulingPolicy::kPriority
                                  : scheduler::SchedulingPolicy::kFcfs;
    const engine::ModelConfig& mc = backend->config();
    // Ids past the model's vocabulary are refused in every prompt that holds them: a
    // tokenizer from another model makes most requests fail, so say so at once.
    if (static_cast<int64_t>(tokenizer->vocab_size()) > mc.vocab_size) {
      spdlog::warn(
          "the tokenizer has {} tokens but the model's vocabulary {}: prompts holding the "
          "others are refused (is tokenizer.json this model's?)",
          tokenizer->vocab_size(), mc.vocab_size);
    }
    if (o.max_model_len > mc.context_length()) {
      throw std::runtime_error("--max-model-len " + std::to_string(o.max_model_len) +
                               " is over the model's context length (" +
                               std::to_string(mc.context_length()) +
                               (mc.context_length() == mc.max_position_embeddings
                                    ? ": max_position_embeddings)"
                                    : ": max_position_embeddings stretched by rope_scaling)"));
    }
    if (o.num_kv_blocks) {
      config.num_kv_blocks = *o.num_kv_blocks;
    } else if (o.kv_cache_bytes) {
      // Throws, naming the size of one block, when the budget holds none.
      config.num_kv_blocks =
          engine::plan_kv_pool(mc, engine::default_kv_dtype(mc), std::nullopt, *o.kv_cache_bytes)
              .num_blocks;
    } else if (auto budget = backend->kv_cache_budget(o.gpu_memory_utilization)) {
      const kernels::DType kv_dtype = engine::default_kv_dtype(mc);
      config.num_kv_blocks = engine::kv_blocks_for_bytes(mc, kv_dtype, *budget);
      if (config.num_kv_blocks <= 0) {
        throw std::runtime_error(fmt::format(
            "--gpu-memory-utilization {} leaves {} bytes of the GPU's free memory for the KV "
            "cache, which holds no KV block: one block takes {} bytes",
            o.gpu_memory_utilization, *budget,
            mc.kv_bytes_per_token(kv_dtype) * paging::kBlockSize));
      }
    } else {
      config.num_kv_blocks = default_kv_blocks(mc, o);
    }
    engine = std::make_unique<engine::Engine>(std::move(backend), tokenizer, config);
    spdlog::info("model {}: {}", model_dir.string(), engine->kv_plan().describe());
    spdlog::info("max_model_len {}, max_num_seqs {}, max_num_batched_tokens {}",
                 engine->config().scheduler.max_model_len, o.max_num_seqs,
                 o.max_num_batched_tokens);
    if (engine->kv_plan().capacity_tokens < engine->config().scheduler.max_model_len &&
        engine->model_config().sliding_window <= 0) {
      spdlog::warn(
          "the KV pool holds {} tokens, less than one full context of {}: longer "
          "requests are refused",
          engine->kv_plan().capacity_tokens, engine->config().scheduler.max_model_len);
    }

    server::HttpServerOptions http_options;
    http_options.host = o.host;
    http_options.port = o.port;
    http_options.api_key = o.api_key;
    http_options.model_dir = model_dir;
    std::filesystem::path folder = std::filesystem::absolute(model_dir).lexically_normal();
    if (folder.filename().empty()) folder = folder.parent_path();  // "DIR/"
    http_options.served_model_name =
        !o.served_model_name.empty() ? o.served_model_name : folder.filename().string();
    if (!o.chat_template.empty()) http_options.chat_template = o.chat_template;
    http_options.tool_call_format = o.tool_call_format;
    http_options.reasoning_format = o.reasoning_format;
    const engine::GenerationDefaults& defaults = engine->model_config().generation_defaults;
    if (o.generation_config == "auto" && !defaults.empty()) {
      scheduler::SamplingParams& p = http_options.sampling_defaults;
      if (defaults.temperature) p.temperature = static_cast<float>(*defaults.temperature);
      if (defaults.top_p) p.top_p = static_cast<float>(*defaults.top_p);
      if (defaults.top_k) {
        p.top_k = static_cast<int32_t>(
            std::clamp<int64_t>(*defaults.top_k, 0, std::numeric_limits<int32_t>::max()));
      }
      if (defaults.min_p) p.min_p = static_cast<float>(*defaults.min_p);
      if (defaults.repetition_penalty) {
        p.repetition_penalty = static_cast<float>(*defaults.repetition_penalty);
      }
      spdlog::info(
          "sampling defaults from generation_config.json: {} (--generation-config none "
          "leaves them out)",
          defaults.describe());
    }
    // Every request running or waiting holds a connection, and so a thread; beyond them,
    // room for /health, /metrics and idle kept-alive connections.
    http_options.threads = std::max(128, o.max_num_seqs + 64);
    http_options.max_threads =
        static_cast<int>(std::min<int64_t>(int64_t{o.max_num_seqs} + o.max_waiting + 256, 32768));
    http = std::make_unique<server::HttpServer>(*engine, tokenizer, http_options);
    port = http->bind();
    if (o.api_key.empty() && o.host != "127.0.0.1" && o.host != "localhost" && o.host != "::1") {
      spdlog::warn("listening on {} without --api-key: anyone who can reach it can use it", o.host);
    }
    spdlog::info("serving '{}'", http_options.served_model_name);
    // On stdout whatever the log level: scripts and tests read the bound port here.
    // An IPv6 address goes in brackets, so that the line is a URL a client can use.
    const bool ipv6 = o.host.find(':') != std::string::npos;
    std::printf("pagellm: listening on http://%s%s%s:%d\n", ipv6 ? "[" : "", o.host.c_str(),
                ipv6 ? "]" : "", port);
    std::fflush(stdout);
  } catch (const std::exception& e) {
    spdlog::error("pagellm serve: {}", e.what());
    return 1;
  }

  std::atomic<bool> stopped{false};
  std::atomic<bool> served{true};
  std::thread listener([&] {
    served = http->serve();
    stopped = true;
  });
  wait_for_signal(stopped, std::chrono::hours(24 * 365 * 100));
  if (!stopped) {
    spdlog::info("shutting down: waiting up to {} s for requests in flight", o.shutdown_timeout);
    http->shutdown();
    const auto limit = std::chrono::milliseconds(static_cast<int64_t>(o.shutdown_timeout * 1000));
    // A second signal, or the time limit, cuts the wait short.
    wait_for_signal(stopped, limit);
    if (!stopped) {
      // Idle kept-alive connections hold the listener too, until their read times out.
      const engine::EngineStats stats = engine->stats();
      if (stats.num_running + stats.num_waiting > 0) {
        spdlog::warn("aborting the requests still in flight");
      } else {
        spdlog::info("no request in flight; waiting for open connections to close");
      }
    }
  }
  engine->stop();  // aborts what is left, so that their handlers return
  if (!stopped) {
    // Idle connections close within their 5 s read timeout; a client that keeps sending
    // a byte at a time would hold its thread, and the exit, for good. A further signal
    // cuts this grace short too.
    wait_for_signal(stopped, std::chrono::seconds(6));
    if (!stopped) {
      spdlog::warn("connections still open after the shutdown timeout; exiting without them");
      spdlog::shutdown();
      std::fflush(stdout);
      std::fflush(stderr);
      std::_Exit(0);
    }
  }
  listener.join();
  if (!served) {
    spdlog::error("pagellm serve: the server stopped listening unexpectedly");
    return 1;
  }
  spdlog::info("stopped");
  return 0;
}

}  // namespace pagellm::cli

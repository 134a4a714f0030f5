#pragma once
// The load generator behind `pagellm bench`: builds a workload of prompts, sends it to an
// OpenAI-compatible server over real HTTP (streaming, so that every token is timed) in a
// closed loop (fixed concurrency) or an open loop (Poisson or gamma arrivals), and reduces
// the client-side timings and the server's /metrics into a report.
//
// The pure parts (arrivals, percentiles, SSE framing, prompts, metric parsing) are free
// functions so that they can be tested without a server.

#include <cstdint>
#include <limits>
#include <map>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace pagellm::bench {

// ---- workload ----

struct WorkloadOptions {
  int num_requests = 100;
  int input_len = 128;
  int output_len = 64;
  // Lengths are drawn uniformly from [len * (1 - ratio), len * (1 + ratio)].
  double range_ratio = 0.0;
  // Every prompt starts with the same `shared_prefix_len` tokens, then a suffix of its own.
  int shared_prefix_len = 0;
  // Prompt token ids are drawn from [kFirstPromptTokenId, vocab_size).
  int vocab_size = 500;
  uint64_t seed = 0;
  // When not empty: text prompts, taken in an order shuffled by `seed` (the whole file
  // once before any prompt repeats); lengths other than the output's do not apply.
  std::vector<std::string> dataset_prompts;
};

// Low ids are where tokenizers keep their special tokens; random prompts avoid them.
inline constexpr int kFirstPromptTokenId = 16;

struct BenchRequest {
  std::vector<int32_t> prompt_tokens;  // empty when the prompt is text
  std::string prompt_text;
  int input_len = 0;  // tokens; for text prompts, the server's count replaces it when known
  int output_len = 0;
};

// Throws std::invalid_argument for impossible options (for example a prefix longer than
// the shortest prompt).
std::vector<BenchRequest> build_requests(const WorkloadOptions& options);

// A seed of its own for each random stream of a run (prompts of the warm-up, arrival
// times) made from the run's seed, far from the small seeds people pass: the warm-up of a
// run with seed s must not send the prompts of the run with seed s + 1, which that run
// would then find in the server's prefix cache.
uint64_t stream_seed(uint64_t seed, uint64_t stream);

// The `count` warm-up requests sent before a run: the run's workload with prompts of their
// own. With a dataset those are the prompts the run leaves unused, unless it uses them all
// (see warmup_repeats_run_prompts).
WorkloadOptions warmup_workload(const WorkloadOptions& run, int count);

// Whether `count` warm-up requests must send prompts the run sends too, which the run then
// finds in the server's prefix cache: a dataset the run uses whole. (With fewer unused
// prompts than warm-up requests, the warm-up repeats its own.)
bool warmup_repeats_run_prompts(const WorkloadOptions& run, int count);

// The "prompt" field of every line of a JSONL file. Throws std::runtime_error naming the
// file and line when one cannot be read.
std::vector<std::string> read_dataset_prompts(const std::string& path);

// Seconds from the start at which each of `count` requests is sent. An infinite rate sends
// everything at once. Gaps are gamma distributed with shape `burstiness` and mean 1 / rate:
// burstiness 1 is a Poisson process, below 1 burstier, above 1 more even.
std::vector<double> arrival_times(int count, double request_rate, double burstiness, uint64_t seed);

// ---- statistics ----

// The p-th percentile (0..100) with linear interpolation between closest ranks, as numpy's
// default. 0 for an empty set.
double percentile(std::vector<double> values, double p);

struct LatencySummary {
  double mean = 0, median = 0, p90 = 0, p99 = 0, min = 0, max = 0, std_dev = 0;
  size_t count = 0;
};
LatencySummary summarize(const std::vector<double>& values);

// ---- Server-Sent Events ----

// Whether a streamed chunk carries output of the model, which TTFT and ITL time: text
// (completions), content, reasoning (a thinking model's, under vLLM's or DeepSeek's
// name) or tool calls (chat). A role-only chunk is not output.
bool chunk_has_output(const nlohmann::json& chunk);

// Splits a byte stream into events and returns the `data:` payload of each complete one
// (multi-line data joined with '\n'). Chunks may split anywhere, even inside "\r\n".
class SseParser {
 public:
  void feed(std::string_view bytes, std::vector<std::string>& events);

 private:
  std::string line_;
  std::string data_;
  bool has_data_ = false;
  bool last_was_cr_ = false;
  void end_line(std::vector<std::string>& events);
};

// ---- server metrics ----

// What the bench reads from a Prometheus /metrics page. Names are matched after their
// namespace (`pagellm:` or `vllm:`) and summed over label sets.
struct ServerMetricsSample {
  bool present = false;
  std::optional<double> kv_cache_usage;  // 0..1
  std::optional<double> kv_used_blocks;
  std::optional<double> prefix_cache_queries;
  std::optional<double> prefix_cache_hits;
  std::optional<double> preemptions;
  std::optional<double> requests_running;
  std::optional<double> requests_waiting;
};
ServerMetricsSample parse_prometheus_metrics(std::string_view text);

// ---- driver ----

enum class Endpoint { kCompletions, kChat };

struct BenchOptions {
  std::string url = "http://127.0.0.1:8000";
  std::string model;  // empty: the first of /v1/models
  Endpoint endpoint = Endpoint::kCompletions;
  std::string api_key;
  int concurrency = 0;  // 0: every request at once, up to 1024 in flight
  double request_rate = std::numeric_limits<double>::infinity();
  double burstiness = 1.0;
  int warmup = 0;
  double timeout_s = 600;
  bool progress = true;
  WorkloadOptions workload;
};

struct RequestResult {
  bool ok = false;
  int http_status = 0;
  std::string error;  // "HTTP 400: message" or the transport error
  int input_tokens = 0;
  int output_tokens = 0;
  double start_s = 0;  // from the start of the run
  double ttft_s = 0;
  double e2e_s = 0;
  std::vector<double> itl_s;  // gaps between streamed chunks after the first
};

struct BenchReport {
  std::string url, model, endpoint;
  int concurrency = 0;
  double request_rate = 0, burstiness = 1;
  int num_requests = 0, completed = 0, failed = 0;
  std::map<std::string, int> errors;  // error text -> count
  double duration_s = 0;
  long long total_input_tokens = 0, total_output_tokens = 0;
  double request_throughput = 0, output_throughput = 0, total_token_throughput = 0;
  LatencySummary ttft_ms, tpot_ms, itl_ms, e2e_ms;
  // From /metrics; absent when the server has none.
  bool server_metrics = false;
  std::optional<double> peak_kv_cache_usage;
  std::optional<double> prefix_cache_hit_rate;
  std::optional<double> preemptions;
  std::optional<double> kv_used_blocks_after;
  std::vector<RequestResult> requests;
};

// Runs the warmup, then the measured workload. Throws std::runtime_error when the server
// cannot be reached at all; failed requests are counted in the report instead.
BenchReport run_benchmark(const BenchOptions& options);

BenchReport make_report(const BenchOptions& options, const std::vector<RequestResult>& results,
                        double duration_s);
std::string format_report(const BenchReport& report);
std::string report_json(const BenchReport& report);

}  // namespace pagellm::bench

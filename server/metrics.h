#pragma once
// Prometheus metrics: counters the HTTP layer records, and the text exposition format
// of /metrics (names follow vLLM's, under the `pagellm:` prefix).

#include <array>
#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

namespace pagellm::engine {
struct EngineStats;
}

namespace pagellm::server {

// A Prometheus histogram over fixed bucket bounds (seconds). Thread-safe.
class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds);
  void observe(double value);
  // Appends the _bucket, _sum and _count lines of `name` with `labels` (`key="v"`).
  void render(std::string& out, const std::string& name, const std::string& labels) const;

 private:
  std::vector<double> bounds_;
  mutable std::mutex mutex_;
  std::vector<int64_t> counts_;  // per bucket, not cumulative
  double sum_ = 0;
  int64_t count_ = 0;
};

// What the HTTP layer counts, beside the engine's own statistics.
struct ServerMetrics {
  ServerMetrics();
  std::atomic<int64_t> requests_stop{0};    // finished with reason stop
  std::atomic<int64_t> requests_length{0};  // finished with reason length
  std::atomic<int64_t> requests_abort{0};   // client gone or shutdown
  std::atomic<int64_t> http_errors{0};      // answered with a 4xx or 5xx
  Histogram time_to_first_token;
  Histogram time_per_output_token;  // a request's mean gap between tokens
  Histogram queue_time;             // arrival to first scheduled
  Histogram e2e_latency;
  Histogram inter_token_latency;        // every gap between two tokens of a request
  Histogram request_prompt_tokens;      // prompt length of finished requests
  Histogram request_generation_tokens;  // output length of finished requests
};

std::string render_metrics(const engine::EngineStats& stats, const ServerMetrics& server,
                           const std::string& model_name);

// The engine and pool state as JSON, for /v1/stats, with `block_map`: one character a
// block ('.' free, 'c' cached-free, 'u' used by one sequence, 's' shared).
std::string stats_json(const engine::EngineStats& stats);

}  // namespace pagellm::server

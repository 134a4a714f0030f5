#include "server/metrics.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <tuple>

#include "engine/engine.h"

namespace pagellm::server {
namespace {

// The shortest text that reads back as the same double.
std::string number(double v) {
  char buf[64];
  for (int precision = 15; precision <= 17; ++precision) {
    std::snprintf(buf, sizeof buf, "%.*g", precision, v);
    if (std::strtod(buf, nullptr) == v) break;
  }
  return buf;
}

// A label value in the text format: backslash, double quote and newline escaped.
std::string escape_label_value(const std::string& v) {
  std::string out;
  out.reserve(v.size());
  for (char c : v) {
    if (c == '\\' || c == '"') {
      out += '\\';
      out += c;
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

void metric(std::string& out, const char* type, const std::string& name, const char* help,
            const std::string& labels, double value) {
  out += "# HELP " + name + " " + help + "\n# TYPE " + name + " " + type + "\n";
  out += name + "{" + labels + "} " + number(value) + "\n";
}

}  // namespace

Histogram::Histogram(std::vector<double> bounds)
    : bounds_(std::move(bounds)), counts_(bounds_.size() + 1, 0) {}

void Histogram::observe(double value) {
  const size_t bucket = std::lower_bound(bounds_.begin(), bounds_.end(), value) - bounds_.begin();
  std::lock_guard lock(mutex_);
  ++counts_[bucket];
  sum_ += value;
  ++count_;
}

void Histogram::render(std::string& out, const std::string& name, const std::string& labels) const {
  std::lock_guard lock(mutex_);
  int64_t cumulative = 0;
  for (size_t i = 0; i <= bounds_.size(); ++i) {
    cumulative += counts_[i];
    const std::string le = i < bounds_.size() ? number(bounds_[i]) : "+Inf";
    out += name + "_bucket{" + labels + ",le=\"" + le + "\"} " + std::to_string(cumulative) + "\n";
  }
  out += name + "_sum{" + labels + "} " + number(sum_) + "\n";
  out += name + "_count{" + labels + "} " + std::to_string(count_) + "\n";
}

ServerMetrics::ServerMetrics()
    : time_to_first_token({0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0,
                           2.5, 5.0, 7.5, 10.0}),
      time_per_output_token({0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3,
                             0.4, 0.5, 0.75, 1.0, 2.5}),
      queue_time({0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0}),
      e2e_latency(
          {0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0}),
      inter_token_latency({0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4,
                           0.5, 0.75, 1.0, 2.5}),
      request_prompt_tokens(
          {1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000, 100000}),
      request_generation_tokens(
          {1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000, 100000}) {}

std::string render_metrics(const engine::EngineStats& stats, const ServerMetrics& server,
                           const std::string& model_name) {
  std::string out;
  const std::string labels = "model_name=\"" + escape_label_value(model_name) + "\"";
  metric(out, "gauge", "pagellm:num_requests_running", "Requests in the running batch.", labels,
         stats.num_running);
  metric(out, "gauge", "pagellm:num_requests_waiting", "Requests waiting to be scheduled.", labels,
         stats.num_waiting);
  metric(out, "gauge", "pagellm:kv_cache_usage_perc", "Share of KV blocks in use (0 to 1).", labels,
         stats.kv.usage());
  metric(out, "gauge", "pagellm:kv_cache_total_blocks", "KV blocks in the pool.", labels,
         stats.kv.total_blocks);
  metric(out, "gauge", "pagellm:kv_cache_used_blocks", "KV blocks held by sequences.", labels,
         stats.kv.used_blocks);
  metric(out, "gauge", "pagellm:kv_cache_cached_free_blocks",
         "KV blocks held by nobody that keep a cached prefix (reclaimable).", labels,
         stats.kv.cached_free_blocks);
  metric(out, "gauge", "pagellm:kv_cache_free_blocks", "KV blocks holding nothing.", labels,
         stats.kv.free_blocks);
  metric(out, "gauge", "pagellm:cache_config_info", "The KV pool's configuration.",
         labels + ",block_size=\"" + std::to_string(paging::kBlockSize) + "\",num_blocks=\"" +
             std::to_string(stats.kv.total_blocks) + "\"",
         1);
  metric(out, "counter", "pagellm:prompt_tokens_total", "Prompt tokens of admitted requests.",
         labels, double(stats.scheduler.prompt_tokens));
  metric(out, "counter", "pagellm:generation_tokens_total", "Generated tokens.", labels,
         double(stats.scheduler.generation_tokens));
  metric(out, "counter", "pagellm:num_preemptions_total", "Sequences preempted.", labels,
         double(stats.scheduler.num_preemptions));
  metric(out, "counter", "pagellm:prefix_cache_queries_total",
         "Prompt tokens looked up in the prefix cache.", labels,
         double(stats.kv.prefix_query_tokens));
  metric(out, "counter", "pagellm:prefix_cache_hits_total",
         "Prompt tokens found in the prefix cache.", labels, double(stats.kv.prefix_hit_tokens));

  out +=
      "# HELP pagellm:request_success_total Finished requests (each choice of n) by finish "
      "reason.\n";
  out += "# TYPE pagellm:request_success_total counter\n";
  const std::pair<const char*, int64_t> reasons[] = {{"stop", server.requests_stop.load()},
                                                     {"length", server.requests_length.load()},
                                                     {"abort", server.requests_abort.load()}};
  for (const auto& [reason, count] : reasons) {
    out += "pagellm:request_success_total{" + labels + ",finished_reason=\"" + reason + "\"} " +
           std::to_string(count) + "\n";
  }
  metric(out, "counter", "pagellm:http_errors_total", "Requests answered with an error status.",
         labels, double(server.http_errors.load()));

  const std::tuple<const char*, const char*, const Histogram*> histograms[] = {
      {"time_to_first_token_seconds", "Time to first token.", &server.time_to_first_token},
      {"time_per_output_token_seconds", "Mean time between a request's tokens.",
       &server.time_per_output_token},
      {"request_queue_time_seconds", "Arrival to first scheduled.", &server.queue_time},
      {"e2e_request_latency_seconds", "Arrival to last token.", &server.e2e_latency},
      {"inter_token_latency_seconds", "Time between two tokens of a request.",
       &server.inter_token_latency},
      {"request_prompt_tokens", "Prompt tokens of finished requests.",
       &server.request_prompt_tokens},
      {"request_generation_tokens", "Generated tokens of finished requests.",
       &server.request_generation_tokens},
  };
  for (const auto& [suffix, help, histogram] : histograms) {
    const std::string name = std::string("pagellm:") + suffix;
    out += "# HELP " + name + " " + help + "\n# TYPE " + name + " histogram\n";
    histogram->render(out, name, labels);
  }
  return out;
}

std::string stats_json(const engine::EngineStats& s) {
  char buf[1024];
  std::snprintf(buf, sizeof buf,
                "{\"alive\":%s,\"num_requests_running\":%d,\"num_requests_waiting\":%d,"
                "\"kv_cache\":{\"total_blocks\":%d,\"used_blocks\":%d,\"cached_free_blocks\":%d,"
                "\"free_blocks\":%d,\"num_sequences\":%d,\"usage\":%s,\"prefix_query_tokens\":%lld,"
                "\"prefix_hit_tokens\":%lld,\"prefix_hit_rate\":%s},"
                "\"scheduler\":{\"steps\":%lld,\"num_preemptions\":%lld,\"prompt_tokens\":%lld,"
                "\"generation_tokens\":%lld},"
                "\"finished\":{\"stop\":%lld,\"length\":%lld,\"abort\":%lld,\"failed\":%lld}}",
                s.alive ? "true" : "false", s.num_running, s.num_waiting, s.kv.total_blocks,
                s.kv.used_blocks, s.kv.cached_free_blocks, s.kv.free_blocks, s.kv.num_sequences,
                number(s.kv.usage()).c_str(), static_cast<long long>(s.kv.prefix_query_tokens),
                static_cast<long long>(s.kv.prefix_hit_tokens),
                number(s.kv.prefix_hit_rate()).c_str(), static_cast<long long>(s.scheduler.steps),
                static_cast<long long>(s.scheduler.num_preemptions),
                static_cast<long long>(s.scheduler.prompt_tokens),
                static_cast<long long>(s.scheduler.generation_tokens),
                static_cast<long long>(s.finished_stop), static_cast<long long>(s.finished_length),
                static_cast<long long>(s.finished_abort), static_cast<long long>(s.failed));
  // The pool block by block ('.' free, 'c' cached-free, 'u' used, 's' shared): one byte a
  // block keeps it small enough to poll with 100,000 blocks.
  std::string out(buf);
  out.pop_back();
  out += ",\"block_map\":\"" + s.block_map + "\"}";
  return out;
}

}  // namespace pagellm::server

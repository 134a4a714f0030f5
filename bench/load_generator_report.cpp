// The report of `pagellm bench`: per-request results reduced to throughput and latency
// summaries, printed as a table and written as JSON.

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>

#include "bench/load_generator.h"

namespace pagellm::bench {

using nlohmann::json;

BenchReport make_report(const BenchOptions& o, const std::vector<RequestResult>& results,
                        double duration_s) {
  BenchReport r;
  r.url = o.url;
  r.model = o.model;
  r.endpoint = o.endpoint == Endpoint::kChat ? "chat" : "completions";
  r.concurrency = o.concurrency;
  r.request_rate = o.request_rate;
  r.burstiness = o.burstiness;
  r.num_requests = static_cast<int>(results.size());
  r.duration_s = duration_s;
  std::vector<double> ttft, tpot, itl, e2e;
  for (const RequestResult& q : results) {
    if (!q.ok) {
      ++r.failed;
      ++r.errors[q.error];
      continue;
    }
    ++r.completed;
    r.total_input_tokens += q.input_tokens;
    r.total_output_tokens += q.output_tokens;
    ttft.push_back(q.ttft_s * 1e3);
    e2e.push_back(q.e2e_s * 1e3);
    if (q.output_tokens > 1) tpot.push_back((q.e2e_s - q.ttft_s) * 1e3 / (q.output_tokens - 1));
    for (double gap : q.itl_s)
      itl.push_back(gap * 1e3);
  }
  if (duration_s > 0) {
    r.request_throughput = r.completed / duration_s;
    r.output_throughput = r.total_output_tokens / duration_s;
    r.total_token_throughput = (r.total_input_tokens + r.total_output_tokens) / duration_s;
  }
  r.ttft_ms = summarize(ttft);
  r.tpot_ms = summarize(tpot);
  r.itl_ms = summarize(itl);
  r.e2e_ms = summarize(e2e);
  r.requests = results;
  return r;
}

namespace {

void line(std::string& out, const char* label, const std::string& value) {
  char buf[128];
  std::snprintf(buf, sizeof buf, "%-40s %s\n", label, value.c_str());
  out += buf;
}

std::string fixed(double v, int digits = 2) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", digits, v);
  return buf;
}

void title(std::string& out, const std::string& text) {
  const int width = 50;
  const int pad = std::max(0, width - static_cast<int>(text.size()));
  out += std::string(pad / 2, '-') + text + std::string(pad - pad / 2, '-') + "\n";
}

void latency(std::string& out, const char* heading, const char* name, const LatencySummary& s) {
  title(out, heading);
  const std::pair<const char*, double> rows[] = {
      {"Mean", s.mean}, {"Median", s.median}, {"P90", s.p90}, {"P99", s.p99}};
  for (const auto& [label, value] : rows)
    line(out, (std::string(label) + " " + name + " (ms):").c_str(), fixed(value));
}

json summary_json(const LatencySummary& s) {
  return {{"mean", s.mean}, {"median", s.median}, {"p90", s.p90},     {"p99", s.p99},
          {"min", s.min},   {"max", s.max},       {"std", s.std_dev}, {"count", s.count}};
}

json optional_json(const std::optional<double>& v) {
  return v ? json(*v) : json(nullptr);
}

}  // namespace

std::string format_report(const BenchReport& r) {
  std::string out;
  out += "============ Serving Benchmark Result ============\n";
  line(out, "Successful requests:", std::to_string(r.completed));
  line(out, "Failed requests:", std::to_string(r.failed));
  line(out, "Maximum request concurrency:",
       r.concurrency > 0 ? std::to_string(r.concurrency) : "unlimited");
  line(out, "Request rate (req/s):", std::isinf(r.request_rate) ? "inf" : fixed(r.request_rate));
  line(out, "Benchmark duration (s):", fixed(r.duration_s));
  line(out, "Total input tokens:", std::to_string(r.total_input_tokens));
  line(out, "Total generated tokens:", std::to_string(r.total_output_tokens));
  line(out, "Request throughput (req/s):", fixed(r.request_throughput));
  line(out, "Output token throughput (tok/s):", fixed(r.output_throughput));
  line(out, "Total token throughput (tok/s):", fixed(r.total_token_throughput));
  latency(out, "Time to First Token", "TTFT", r.ttft_ms);
  latency(out, "Time per Output Token (excl. 1st token)", "TPOT", r.tpot_ms);
  latency(out, "Inter-token Latency", "ITL", r.itl_ms);
  latency(out, "End-to-end Latency", "E2EL", r.e2e_ms);
  title(out, "Server (/metrics)");
  if (!r.server_metrics) {
    out += "(no Prometheus /metrics at the server)\n";
  } else {
    const std::string na = "n/a";
    line(out, "Peak KV cache usage (%):",
         r.peak_kv_cache_usage ? fixed(*r.peak_kv_cache_usage * 100) : na);
    line(out, "Prefix cache hit rate (%):",
         r.prefix_cache_hit_rate ? fixed(*r.prefix_cache_hit_rate * 100) : na);
    line(out, "Preemptions:", r.preemptions ? fixed(*r.preemptions, 0) : na);
  }
  if (!r.errors.empty()) {
    title(out, "Errors");
    for (const auto& [error, count] : r.errors)
      out += std::to_string(count) + " x " + error + "\n";
  }
  out += "==================================================\n";
  return out;
}

std::string report_json(const BenchReport& r) {
  json j;
  j["url"] = r.url;
  j["model"] = r.model;
  j["endpoint"] = r.endpoint;
  j["max_concurrency"] = r.concurrency > 0 ? json(r.concurrency) : json(nullptr);
  j["request_rate"] = std::isinf(r.request_rate) ? json("inf") : json(r.request_rate);
  j["burstiness"] = r.burstiness;
  j["num_requests"] = r.num_requests;
  j["completed"] = r.completed;
  j["failed"] = r.failed;
  j["errors"] = r.errors;
  j["duration_s"] = r.duration_s;
  j["total_input_tokens"] = r.total_input_tokens;
  j["total_output_tokens"] = r.total_output_tokens;
  j["request_throughput"] = r.request_throughput;
  j["output_throughput"] = r.output_throughput;
  j["total_token_throughput"] = r.total_token_throughput;
  j["ttft_ms"] = summary_json(r.ttft_ms);
  j["tpot_ms"] = summary_json(r.tpot_ms);
  j["itl_ms"] = summary_json(r.itl_ms);
  j["e2el_ms"] = summary_json(r.e2e_ms);
  j["server"] = r.server_metrics
                    ? json{{"peak_kv_cache_usage", optional_json(r.peak_kv_cache_usage)},
                           {"prefix_cache_hit_rate", optional_json(r.prefix_cache_hit_rate)},
                           {"preemptions", optional_json(r.preemptions)},
                           {"kv_used_blocks_after", optional_json(r.kv_used_blocks_after)}}
                    : json(nullptr);
  json requests = json::array();
  for (const RequestResult& q : r.requests) {
    json e = {{"ok", q.ok},
              {"http_status", q.http_status},
              {"start_s", q.start_s},
              {"input_tokens", q.input_tokens},
              {"output_tokens", q.output_tokens},
              {"ttft_s", q.ttft_s},
              {"e2e_s", q.e2e_s},
              {"itl_s", q.itl_s}};
    if (!q.ok) e["error"] = q.error;
    requests.push_back(std::move(e));
  }
  j["requests"] = std::move(requests);
  return j.dump(2);
}

}  // namespace pagellm::bench

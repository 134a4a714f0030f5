// The Prometheus text of /metrics and the /v1/stats JSON.

#include "server/metrics.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "engine/engine.h"

namespace pagellm::server {
namespace {

bool has_line(const std::string& text, const std::string& line) {
  return text.find("\n" + line + "\n") != std::string::npos || text.rfind(line + "\n", 0) == 0;
}

engine::EngineStats sample_stats() {
  engine::EngineStats s;
  s.alive = true;
  s.num_running = 3;
  s.num_waiting = 2;
  s.kv.total_blocks = 100;
  s.kv.used_blocks = 25;
  s.kv.free_blocks = 75;
  s.scheduler.prompt_tokens = 1000;
  s.scheduler.generation_tokens = 500;
  s.scheduler.num_preemptions = 4;
  s.block_map = "uus.c";
  return s;
}

TEST(Metrics, GaugesAndCountersCarryTheEngineState) {
  ServerMetrics server;
  server.requests_stop = 7;
  const std::string text = render_metrics(sample_stats(), server, "demo");
  const std::string l = "{model_name=\"demo\"}";
  EXPECT_TRUE(has_line(text, "pagellm:num_requests_running" + l + " 3")) << text;
  EXPECT_TRUE(has_line(text, "pagellm:num_requests_waiting" + l + " 2"));
  EXPECT_TRUE(has_line(text, "pagellm:kv_cache_usage_perc" + l + " 0.25"));
  EXPECT_TRUE(has_line(text, "pagellm:prompt_tokens_total" + l + " 1000"));
  EXPECT_TRUE(has_line(text, "pagellm:generation_tokens_total" + l + " 500"));
  EXPECT_TRUE(has_line(text, "pagellm:num_preemptions_total" + l + " 4"));
  EXPECT_TRUE(has_line(
      text, "pagellm:request_success_total{model_name=\"demo\",finished_reason=\"stop\"} 7"));
  EXPECT_TRUE(has_line(text, "pagellm:kv_cache_free_blocks" + l + " 75"));
  EXPECT_TRUE(has_line(text, "pagellm:kv_cache_cached_free_blocks" + l + " 0"));
  EXPECT_TRUE(has_line(
      text,
      "pagellm:cache_config_info{model_name=\"demo\",block_size=\"16\",num_blocks=\"100\"} 1"));
  for (const char* histogram :
       {"time_to_first_token_seconds", "inter_token_latency_seconds", "e2e_request_latency_seconds",
        "request_queue_time_seconds", "request_prompt_tokens", "request_generation_tokens"}) {
    EXPECT_TRUE(has_line(text, std::string("# TYPE pagellm:") + histogram + " histogram"))
        << histogram;
  }
  EXPECT_TRUE(has_line(text, "# TYPE pagellm:num_requests_running gauge"));
  EXPECT_TRUE(has_line(text, "# TYPE pagellm:generation_tokens_total counter"));
}

// Label values escape backslash, double quote and newline, as the text format requires.
TEST(Metrics, ModelNameIsEscapedInLabels) {
  ServerMetrics server;
  const std::string text = render_metrics(sample_stats(), server, "a\\b\"c\nd");
  EXPECT_TRUE(has_line(text, "pagellm:num_requests_running{model_name=\"a\\\\b\\\"c\\nd\"} 3"))
      << text;
}

TEST(Metrics, HistogramBucketsAreCumulative) {
  Histogram h({0.1, 1.0});
  h.observe(0.05);
  h.observe(0.5);
  h.observe(0.5);
  h.observe(5.0);
  std::string text;
  h.render(text, "t", "m=\"x\"");
  EXPECT_EQ(text,
            "t_bucket{m=\"x\",le=\"0.1\"} 1\n"
            "t_bucket{m=\"x\",le=\"1\"} 3\n"
            "t_bucket{m=\"x\",le=\"+Inf\"} 4\n"
            "t_sum{m=\"x\"} 6.05\n"
            "t_count{m=\"x\"} 4\n");
}

TEST(Metrics, StatsJson) {
  const auto stats = nlohmann::json::parse(stats_json(sample_stats()));
  EXPECT_EQ(stats["alive"], true);
  EXPECT_EQ(stats["num_requests_running"], 3);
  EXPECT_EQ(stats["kv_cache"]["used_blocks"], 25);
  EXPECT_DOUBLE_EQ(stats["kv_cache"]["usage"].get<double>(), 0.25);
  EXPECT_EQ(stats["scheduler"]["num_preemptions"], 4);
  EXPECT_EQ(stats["block_map"], "uus.c");
}

}  // namespace
}  // namespace pagellm::server

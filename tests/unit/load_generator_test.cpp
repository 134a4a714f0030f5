// The pure parts of `pagellm bench`: workload construction, arrivals, percentiles, SSE
// framing and Prometheus parsing.

#include "bench/load_generator.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <stdexcept>

namespace pagellm::bench {
namespace {

TEST(BuildRequestsTest, PromptsHaveExactLengthsAndTokenIdsInRange) {
  WorkloadOptions o;
  o.num_requests = 20;
  o.input_len = 37;
  o.output_len = 5;
  o.vocab_size = 100;
  const auto requests = build_requests(o);
  ASSERT_EQ(requests.size(), 20u);
  for (const auto& r : requests) {
    EXPECT_EQ(r.prompt_tokens.size(), 37u);
    EXPECT_EQ(r.input_len, 37);
    EXPECT_EQ(r.output_len, 5);
    for (int32_t t : r.prompt_tokens) {
      EXPECT_GE(t, kFirstPromptTokenId);
      EXPECT_LT(t, 100);
    }
  }
}

TEST(BuildRequestsTest, SharedPrefixIsCommonAndSuffixesDiffer) {
  WorkloadOptions o;
  o.num_requests = 10;
  o.input_len = 48;
  o.shared_prefix_len = 32;
  const auto requests = build_requests(o);
  std::set<std::vector<int32_t>> suffixes;
  for (const auto& r : requests) {
    ASSERT_EQ(r.prompt_tokens.size(), 48u);
    EXPECT_TRUE(std::equal(r.prompt_tokens.begin(), r.prompt_tokens.begin() + 32,
                           requests[0].prompt_tokens.begin()));
    suffixes.emplace(r.prompt_tokens.begin() + 32, r.prompt_tokens.end());
  }
  EXPECT_EQ(suffixes.size(), 10u);
}

TEST(BuildRequestsTest, SameSeedSameWorkloadOtherSeedOther) {
  WorkloadOptions o;
  o.num_requests = 3;
  o.input_len = 16;
  auto a = build_requests(o), b = build_requests(o);
  EXPECT_EQ(a[2].prompt_tokens, b[2].prompt_tokens);
  o.seed = 7;
  EXPECT_NE(build_requests(o)[2].prompt_tokens, a[2].prompt_tokens);
}

// Runs with seeds 0, 1, 2, ... against one server: no run's warm-up may send a prompt of
// another run, or that run would find it in the prefix cache.
TEST(BuildRequestsTest, WarmupPromptsAreNoRunsPrompts) {
  WorkloadOptions o;
  o.num_requests = 64;
  o.input_len = 16;
  std::set<std::vector<int32_t>> runs;
  for (uint64_t seed = 0; seed < 32; ++seed) {
    o.seed = seed;
    for (const auto& r : build_requests(o))
      runs.insert(r.prompt_tokens);
  }
  for (uint64_t seed = 0; seed < 32; ++seed) {
    o.seed = seed;
    const WorkloadOptions w = warmup_workload(o, 16);
    EXPECT_EQ(w.num_requests, 16);
    EXPECT_EQ(w.input_len, o.input_len);
    for (const auto& r : build_requests(w))
      EXPECT_EQ(runs.count(r.prompt_tokens), 0u) << "warm-up of seed " << seed;
  }
}

std::vector<std::string> texts(const std::vector<BenchRequest>& requests) {
  std::vector<std::string> out;
  for (const auto& r : requests)
    out.push_back(r.prompt_text);
  return out;
}

// A dataset is taken in an order of the seed's; the warm-up sends the prompts the run
// leaves unused, and says when there are too few for that.
TEST(BuildRequestsTest, DatasetOrderFollowsTheSeedAndWarmupTakesUnusedPrompts) {
  WorkloadOptions o;
  for (int i = 0; i < 40; ++i)
    o.dataset_prompts.push_back("prompt " + std::to_string(i));
  o.num_requests = 30;
  o.seed = 1;
  const auto run = texts(build_requests(o));
  EXPECT_EQ(run, texts(build_requests(o)));
  EXPECT_EQ(std::set<std::string>(run.begin(), run.end()).size(), 30u);
  o.seed = 2;
  EXPECT_NE(run, texts(build_requests(o)));
  o.seed = 1;

  EXPECT_FALSE(warmup_repeats_run_prompts(o, 10));
  const auto warm = texts(build_requests(warmup_workload(o, 10)));
  ASSERT_EQ(warm.size(), 10u);
  EXPECT_EQ(std::set<std::string>(warm.begin(), warm.end()).size(), 10u);
  for (const std::string& p : warm)
    EXPECT_EQ(std::count(run.begin(), run.end(), p), 0) << p;

  // More warm-up requests than unused prompts: the warm-up repeats its own.
  EXPECT_FALSE(warmup_repeats_run_prompts(o, 11));
  for (const std::string& p : texts(build_requests(warmup_workload(o, 11))))
    EXPECT_EQ(std::count(run.begin(), run.end(), p), 0) << p;
  o.num_requests = 40;
  EXPECT_TRUE(warmup_repeats_run_prompts(o, 1));
  EXPECT_FALSE(warmup_repeats_run_prompts(o, 0));
  EXPECT_EQ(build_requests(warmup_workload(o, 3)).size(), 3u);
}

TEST(BuildRequestsTest, RangeRatioDrawsLengthsInTheRange) {
  WorkloadOptions o;
  o.num_requests = 200;
  o.input_len = 100;
  o.output_len = 10;
  o.range_ratio = 0.5;
  o.shared_prefix_len = 50;
  std::set<size_t> lengths;
  for (const auto& r : build_requests(o)) {
    EXPECT_GE(r.prompt_tokens.size(), 50u);
    EXPECT_LE(r.prompt_tokens.size(), 150u);
    EXPECT_EQ(r.prompt_tokens.size(), static_cast<size_t>(r.input_len));
    EXPECT_GE(r.output_len, 5);
    EXPECT_LE(r.output_len, 15);
    lengths.insert(r.prompt_tokens.size());
  }
  EXPECT_GT(lengths.size(), 20u);
}

TEST(BuildRequestsTest, PrefixLongerThanThePromptIsRejected) {
  WorkloadOptions o;
  o.input_len = 16;
  o.shared_prefix_len = 17;
  EXPECT_THROW(build_requests(o), std::invalid_argument);
}

TEST(BuildRequestsTest, DatasetPromptsAreUsedInTurn) {
  const auto path = std::filesystem::temp_directory_path() / "load_generator_test.jsonl";
  {
    std::ofstream out(path);
    out << R"({"prompt": "hello"})"
        << "\n\n"
        << R"({"prompt": "world", "other": 1})"
        << "\n";
  }
  WorkloadOptions o;
  o.dataset_prompts = read_dataset_prompts(path.string());
  EXPECT_EQ(o.dataset_prompts, (std::vector<std::string>{"hello", "world"}));
  o.num_requests = 3;
  const auto requests = build_requests(o);
  // Both prompts once before either repeats.
  EXPECT_NE(requests[0].prompt_text, requests[1].prompt_text);
  EXPECT_TRUE(requests[2].prompt_text == "hello" || requests[2].prompt_text == "world");
  EXPECT_TRUE(requests[0].prompt_tokens.empty());
  {
    std::ofstream out(path);
    out << R"({"text": "no prompt"})"
        << "\n";
  }
  EXPECT_THROW(read_dataset_prompts(path.string()), std::runtime_error);
  std::filesystem::remove(path);
}

TEST(ArrivalTimesTest, InfiniteRateSendsEverythingAtOnce) {
  for (double t : arrival_times(5, INFINITY, 1.0, 0))
    EXPECT_EQ(t, 0.0);
}

// Gamma gaps with shape k and mean 1/rate have variance 1 / (k rate^2): the coefficient of
// variation is 1 for Poisson and 1/sqrt(k) otherwise.
void expect_gap_statistics(double rate, double burstiness) {
  const int n = 20000;
  const auto times = arrival_times(n, rate, burstiness, 42);
  ASSERT_EQ(times.size(), static_cast<size_t>(n));
  EXPECT_EQ(times[0], 0.0);
  double sum = 0, sq = 0;
  for (int i = 1; i < n; ++i) {
    const double gap = times[i] - times[i - 1];
    ASSERT_GE(gap, 0.0);
    sum += gap;
    sq += gap * gap;
  }
  const double mean = sum / (n - 1);
  const double cv = std::sqrt(sq / (n - 1) - mean * mean) / mean;
  EXPECT_NEAR(mean, 1.0 / rate, 0.03 / rate);
  EXPECT_NEAR(cv, 1.0 / std::sqrt(burstiness), 0.05 / std::sqrt(burstiness));
}

TEST(ArrivalTimesTest, PoissonGapsHaveMeanOneOverRateAndUnitVariation) {
  expect_gap_statistics(10.0, 1.0);
}
TEST(ArrivalTimesTest, BurstinessChangesTheVariationNotTheMean) {
  expect_gap_statistics(4.0, 0.25);
  expect_gap_statistics(4.0, 4.0);
}

TEST(ArrivalTimesTest, SeededAndReproducible) {
  EXPECT_EQ(arrival_times(10, 5.0, 1.0, 3), arrival_times(10, 5.0, 1.0, 3));
  EXPECT_NE(arrival_times(10, 5.0, 1.0, 3), arrival_times(10, 5.0, 1.0, 4));
}

TEST(PercentileTest, InterpolatesLinearlyBetweenRanks) {
  const std::vector<double> v = {4, 1, 3, 2};  // sorted: 1 2 3 4
  EXPECT_DOUBLE_EQ(percentile(v, 0), 1);
  EXPECT_DOUBLE_EQ(percentile(v, 50), 2.5);
  EXPECT_DOUBLE_EQ(percentile(v, 90), 3.7);
  EXPECT_DOUBLE_EQ(percentile(v, 99), 3.97);
  EXPECT_DOUBLE_EQ(percentile(v, 100), 4);
  EXPECT_DOUBLE_EQ(percentile({7}, 99), 7);
  EXPECT_DOUBLE_EQ(percentile({}, 50), 0);
}

TEST(PercentileTest, SummaryOfOneToHundred) {
  std::vector<double> v;
  for (int i = 1; i <= 100; ++i)
    v.push_back(i);
  const LatencySummary s = summarize(v);
  EXPECT_DOUBLE_EQ(s.mean, 50.5);
  EXPECT_DOUBLE_EQ(s.median, 50.5);
  EXPECT_DOUBLE_EQ(s.p90, 90.1);
  EXPECT_DOUBLE_EQ(s.p99, 99.01);
  EXPECT_EQ(s.min, 1);
  EXPECT_EQ(s.max, 100);
  EXPECT_EQ(s.count, 100u);
}

std::vector<std::string> feed_in_pieces(const std::string& stream, size_t piece) {
  SseParser parser;
  std::vector<std::string> events;
  for (size_t i = 0; i < stream.size(); i += piece)
    parser.feed(std::string_view(stream).substr(i, piece), events);
  return events;
}

TEST(SseParserTest, EventsSurviveAnySplit) {
  const std::string stream =
      ": comment\n\ndata: {\"a\":1}\n\nevent: x\r\ndata: two\r\ndata: lines\r\n\r\n"
      "data:[DONE]\n\n"
      "data: unfinished";
  const std::vector<std::string> expected = {"{\"a\":1}", "two\nlines", "[DONE]"};
  for (size_t piece : {1, 2, 3, 5, 7, 1000})
    EXPECT_EQ(feed_in_pieces(stream, piece), expected) << "piece " << piece;
}

// A thinking model streams its reasoning first, and a tool call has no content: both are
// output the first token's time counts; the role-only first chunk is not.
TEST(ChunkHasOutputTest, ReasoningAndToolCallsAreOutput) {
  auto has = [](const char* chunk) { return chunk_has_output(nlohmann::json::parse(chunk)); };
  EXPECT_TRUE(has(R"({"choices": [{"text": "a"}]})"));
  EXPECT_TRUE(has(R"({"choices": [{"delta": {"content": "a"}}]})"));
  EXPECT_TRUE(has(R"({"choices": [{"delta": {"reasoning": "hm"}}]})"));
  EXPECT_TRUE(has(R"({"choices": [{"delta": {"reasoning_content": "hm"}}]})"));
  EXPECT_TRUE(has(R"({"choices": [{"delta": {"tool_calls": [{"index": 0}]}}]})"));
  EXPECT_FALSE(has(R"({"choices": [{"delta": {"role": "assistant", "content": ""}}]})"));
  EXPECT_FALSE(has(R"({"choices": [{"delta": {}, "finish_reason": "stop"}]})"));
  EXPECT_FALSE(has(R"({"choices": [], "usage": {"completion_tokens": 3}})"));
  EXPECT_FALSE(has(R"({"choices": [{"delta": {"content": null, "tool_calls": []}}]})"));
}

TEST(PrometheusParseTest, ReadsNamesAfterTheNamespaceSummedOverLabels) {
  const std::string text =
      "# HELP pagellm:kv_cache_usage_perc Share.\n"
      "# TYPE pagellm:kv_cache_usage_perc gauge\n"
      "pagellm:kv_cache_usage_perc{model_name=\"demo\"} 0.25\n"
      "pagellm:prefix_cache_queries_total{model_name=\"a,b}\"} 100\n"
      "pagellm:prefix_cache_hits_total{model_name=\"demo\"} 40 1700000000000\n"
      "vllm:num_preemptions_total{engine=\"0\"} 2\n"
      "vllm:num_preemptions_total{engine=\"1\"} 3\n"
      "pagellm:kv_cache_used_blocks 7\n";
  const ServerMetricsSample s = parse_prometheus_metrics(text);
  EXPECT_TRUE(s.present);
  EXPECT_DOUBLE_EQ(s.kv_cache_usage.value(), 0.25);
  EXPECT_DOUBLE_EQ(s.prefix_cache_queries.value(), 100);
  EXPECT_DOUBLE_EQ(s.prefix_cache_hits.value(), 40);
  EXPECT_DOUBLE_EQ(s.preemptions.value(), 5);
  EXPECT_DOUBLE_EQ(s.kv_used_blocks.value(), 7);
  EXPECT_FALSE(s.requests_running.has_value());
  // A share is averaged over its label sets (a data-parallel server's engines), not
  // summed past 100%.
  const ServerMetricsSample engines = parse_prometheus_metrics(
      "vllm:kv_cache_usage_perc{engine=\"0\"} 0.6\nvllm:kv_cache_usage_perc{engine=\"1\"} 0.8\n");
  EXPECT_DOUBLE_EQ(engines.kv_cache_usage.value(), 0.7);
  EXPECT_FALSE(parse_prometheus_metrics("<html>not metrics</html>").present);
}

TEST(ReportTest, CountsFailuresWithTheirErrorsAndComputesThroughput) {
  std::vector<RequestResult> results(3);
  results[0] = {true, 200, "", 10, 5, 0, 0.1, 0.5, {0.1, 0.1, 0.1, 0.1}};
  results[1] = {true, 200, "", 10, 5, 0, 0.3, 0.7, {0.1, 0.1, 0.1, 0.1}};
  results[2].error = "HTTP 400: too long";
  results[2].http_status = 400;
  BenchOptions o;
  const BenchReport r = make_report(o, results, 2.0);
  EXPECT_EQ(r.completed, 2);
  EXPECT_EQ(r.failed, 1);
  EXPECT_EQ(r.errors.at("HTTP 400: too long"), 1);
  EXPECT_EQ(r.total_output_tokens, 10);
  EXPECT_DOUBLE_EQ(r.output_throughput, 5.0);
  EXPECT_DOUBLE_EQ(r.total_token_throughput, 15.0);
  EXPECT_DOUBLE_EQ(r.ttft_ms.mean, 200.0);
  EXPECT_DOUBLE_EQ(r.tpot_ms.mean, 100.0);
  EXPECT_NEAR(r.itl_ms.median, 100.0, 1e-9);
  const std::string table = format_report(r);
  EXPECT_NE(table.find("Failed requests:                         1"), std::string::npos);
  EXPECT_NE(table.find("1 x HTTP 400: too long"), std::string::npos);
  EXPECT_NE(report_json(r).find("\"failed\": 1"), std::string::npos);
}

}  // namespace
}  // namespace pagellm::bench

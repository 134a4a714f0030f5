// The live /metrics page after real traffic, checked by Prometheus's own `promtool check
// metrics` (Debian package `prometheus`). Skipped where promtool is not installed.

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "support/server_process.h"

namespace pagellm {
namespace {

using nlohmann::json;

bool have_promtool() {
  return std::system("command -v promtool > /dev/null 2>&1") == 0;
}

TEST(MetricsPromtoolTest, LiveMetricsPassPromtoolAfterTraffic) {
  if (!have_promtool()) GTEST_SKIP() << "promtool not found (Debian package prometheus)";
  test::ServerProcess server({"--num-kv-blocks", "64"});
  ASSERT_GT(server.port(), 0) << server.log();
  auto client = server.client();
  // Traffic that fills every family: plain and streamed requests, a shared prefix, an error.
  const json plain = {{"prompt", "hello there"}, {"max_tokens", 4}};
  for (int i = 0; i < 3; ++i) {
    auto res = client.Post("/v1/completions", plain.dump(), "application/json");
    ASSERT_TRUE(res && res->status == 200);
  }
  json streamed = {{"prompt", std::vector<int>(40, 20)}, {"max_tokens", 5}, {"stream", true}};
  auto res = client.Post("/v1/completions", streamed.dump(), "application/json");
  ASSERT_TRUE(res && res->status == 200);
  const json too_long = {{"prompt", std::vector<int>(2000, 20)}, {"max_tokens", 4}};
  res = client.Post("/v1/completions", too_long.dump(), "application/json");
  ASSERT_TRUE(res && res->status == 400);

  res = client.Get("/metrics");
  ASSERT_TRUE(res && res->status == 200);
  const auto path = std::filesystem::temp_directory_path() /
                    ("pagellm_metrics_" + std::to_string(getpid()) + ".prom");
  {
    std::ofstream out(path);
    out << res->body;
  }
  std::string output;
  const int code = test::run_command("promtool check metrics < '" + path.string() + "'", output);
  std::filesystem::remove(path);
  // Exit 1 is a page that does not parse; 3 is lint findings, read below.
  ASSERT_TRUE(code == 0 || code == 3) << "exit " << code << "\n" << output;
  // Names carry the `pagellm:` namespace on purpose, as vLLM's carry `vllm:`; promtool's
  // lint flags every colon, and nothing else may be flagged.
  std::istringstream lines(output);
  int colon_findings = 0;
  for (std::string line; std::getline(lines, line);) {
    if (line.empty()) continue;
    if (line.find("metric names should not contain ':'") != std::string::npos) {
      EXPECT_EQ(line.rfind("pagellm:", 0), 0u) << line;
      ++colon_findings;
      continue;
    }
    ADD_FAILURE() << "promtool: " << line;
  }
  EXPECT_GT(colon_findings, 0) << "expected the namespaced families in:\n" << res->body;
}

}  // namespace
}  // namespace pagellm

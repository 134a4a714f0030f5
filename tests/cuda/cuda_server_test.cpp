// `pagellm serve --backend cuda` end to end over real HTTP on the tiny demo model: the
// start-up log names the GPU, completions (plain, streamed, sampled with a seed, many
// at once) finish with the tokens they asked for, and the KV pool drains to zero used
// blocks afterwards. Skipped without a GPU.

#include <gtest/gtest.h>
#include <httplib.h>

#include <chrono>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "support/cuda_test_util.h"
#include "support/server_process.h"

namespace pagellm {
namespace {

using json = nlohmann::json;
using test::metric;

json completion(httplib::Client& client, json body) {
  auto res = client.Post("/v1/completions", body.dump(), "application/json");
  if (!res) return json{{"error", "no response"}};
  EXPECT_EQ(res->status, 200) << res->body;
  return json::parse(res->body);
}

TEST(CudaServer, ServesCompletionsAndDrainsThePool) {
  PAGELLM_REQUIRE_GPU();
  test::ServerProcess server({"--backend", "cuda", "--num-kv-blocks", "256", "--max-num-seqs", "32",
                              "--served-model-name", "tiny"});
  ASSERT_GT(server.port(), 0) << server.log();
  EXPECT_NE(server.log().find("backend cuda"), std::string::npos) << server.log();
  httplib::Client client = server.client();

  // Greedy, twice: the same text.
  const json greedy = {{"model", "tiny"},
                       {"prompt", "The quick brown fox"},
                       {"max_tokens", 24},
                       {"temperature", 0},
                       {"ignore_eos", true}};
  const json a = completion(client, greedy);
  const json b = completion(client, greedy);
  ASSERT_TRUE(a.contains("choices")) << a.dump();
  EXPECT_EQ(a["usage"]["completion_tokens"], 24);
  EXPECT_EQ(a["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(a["choices"][0]["text"], b["choices"][0]["text"]);

  // Sampled on the device with a seed, twice: the same text.
  json seeded = greedy;
  seeded["temperature"] = 0.8;
  seeded["top_p"] = 0.9;
  seeded["seed"] = 7;
  EXPECT_EQ(completion(client, seeded)["choices"][0]["text"],
            completion(client, seeded)["choices"][0]["text"]);

  // Streamed: chunks then [DONE].
  json stream = greedy;
  stream["stream"] = true;
  auto res = client.Post("/v1/completions", stream.dump(), "application/json");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 200);
  EXPECT_NE(res->body.find("data: [DONE]"), std::string::npos) << res->body;

  // 24 at once (decode batches through several graph buckets).
  std::vector<std::thread> clients;
  std::vector<int> tokens(24, -1);
  for (int i = 0; i < 24; ++i) {
    clients.emplace_back([&, i] {
      httplib::Client c = server.client();
      json body = greedy;
      body["prompt"] = "Request number " + std::to_string(i) + " says";
      body["max_tokens"] = 8 + i;
      auto r = c.Post("/v1/completions", body.dump(), "application/json");
      if (r && r->status == 200) tokens[i] = json::parse(r->body)["usage"]["completion_tokens"];
    });
  }
  for (auto& t : clients)
    t.join();
  for (int i = 0; i < 24; ++i)
    EXPECT_EQ(tokens[i], 8 + i) << "request " << i;

  double used = -1;
  for (int attempt = 0; attempt < 50 && used != 0; ++attempt) {
    used = metric(client, "pagellm:kv_cache_used_blocks");
    if (used != 0) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_EQ(used, 0);
}

}  // namespace
}  // namespace pagellm

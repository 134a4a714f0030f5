// `pagellm serve` end to end: the real binary on a free port with the tiny demo model,
// real HTTP requests, every endpoint and the errors clients can cause.

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "engine/backend.h"
#include "engine/demo_model.h"
#include "kernels/cpu/kernels.h"
#include "support/server_process.h"
#include "support/sse_client.h"
#include "support/temp_model.h"
#include "support/test_data.h"

namespace pagellm {
namespace {

using nlohmann::json;
using namespace std::chrono_literals;
using test::metric;
using test::post_stream;
using test::Sse;

constexpr const char* kKey = "test-key";

// The shared test server with this file's defaults: a 64-block pool, and clients that
// carry the API key unless asked not to.
class ServerProcess : public test::ServerProcess {
 public:
  explicit ServerProcess(std::vector<std::string> extra,
                         const std::filesystem::path& model = test::tiny_demo_model())
      : test::ServerProcess(with_pool(std::move(extra)), model) {}
  httplib::Client client(bool with_key = true) const {
    return test::ServerProcess::client(with_key ? kKey : "");
  }

 private:
  static std::vector<std::string> with_pool(std::vector<std::string> extra) {
    extra.insert(extra.begin(), {"--num-kv-blocks", "64"});
    return extra;
  }
};

json post_json(httplib::Client& client, const std::string& path, const json& body,
               int expected_status = 200) {
  auto res = client.Post(path.c_str(), body.dump(), "application/json");
  EXPECT_TRUE(res) << "no response from " << path;
  if (!res) return json();
  EXPECT_EQ(res->status, expected_status) << path << ": " << res->body;
  return json::parse(res->body);
}

// The error answer of a bad request, checked for OpenAI's shape.
json expect_error(httplib::Client& client, const std::string& path, const std::string& body,
                  int status) {
  auto res = client.Post(path.c_str(), body, "application/json");
  EXPECT_TRUE(res);
  if (!res) return json();
  EXPECT_EQ(res->status, status) << body << " -> " << res->body;
  const json error = json::parse(res->body);
  EXPECT_TRUE(error.contains("error")) << res->body;
  for (const char* key : {"message", "type", "param", "code"}) {
    EXPECT_TRUE(error["error"].contains(key)) << res->body;
  }
  return error["error"];
}

json chat(const std::string& content, json extra = json::object()) {
  json body = {{"messages", {{{"role", "user"}, {"content", content}}}}};
  body.update(extra);
  return body;
}

std::string stream_text(const Sse& sse, bool chat_format, int index = 0) {
  std::string text;
  for (const json& e : sse.events) {
    for (const json& c : e["choices"]) {
      if (c["index"] != index) continue;
      if (chat_format) {
        if (c["delta"].contains("content")) text += c["delta"]["content"].get<std::string>();
      } else {
        text += c["text"].get<std::string>();
      }
    }
  }
  return text;
}

// Reads a metric's value from /metrics (the first line starting with `name`).
class Server : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    server_ = new ServerProcess({"--api-key", kKey, "--served-model-name", "tiny"});
  }
  static void TearDownTestSuite() {
    delete server_;
    server_ = nullptr;
  }
  void SetUp() override {
    ASSERT_GT(server_->port(), 0) << server_->log();
    client_ = std::make_unique<httplib::Client>(server_->client());
  }
  static inline ServerProcess* server_ = nullptr;
  std::unique_ptr<httplib::Client> client_;
};

// Streamed tokens are small writes; with Nagle's algorithm on, a kept-alive connection
// holds them back until the client's delayed ACK (at least 40 ms on Linux), on every
// request. The fastest of the requests on one connection shows whether the server turned
// it off; a busy machine (the tests run in parallel) can slow a few of them, so up to 30
// are sent until one is fast.
TEST_F(Server, StreamedTokensAreNotHeldBackOnAKeptAliveConnection) {
  httplib::Client client = server_->client();
  client.set_keep_alive(true);
  client.set_tcp_nodelay(true);  // the client's own half of the same delay
  const json body = {{"prompt", "Hello"}, {"max_tokens", 4}, {"stream", true}};
  double fastest = 1e9;
  for (int i = 0; i < 30 && fastest >= 0.025; ++i) {
    httplib::Request req;
    req.method = "POST";
    req.path = "/v1/completions";
    req.body = body.dump();
    req.set_header("Content-Type", "application/json");
    const auto start = std::chrono::steady_clock::now();
    double first = -1;
    req.content_receiver = [&](const char*, size_t, uint64_t, uint64_t) {
      if (first < 0) {
        first = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      }
      return true;
    };
    ASSERT_TRUE(client.send(req));
    if (i > 0) fastest = std::min(fastest, first);  // the first request opens the connection
  }
  EXPECT_LT(fastest, 0.025) << "first streamed bytes took " << fastest * 1000 << " ms";
}

// Many clients connecting at the same moment: the listen backlog must hold them all
// (a backlog of 5 drops connections, which then fail on their first read).
TEST_F(Server, AConnectionBurstIsServedWhole) {
  constexpr int kClients = 200;
  std::atomic<int> ok{0};
  std::atomic<int> ready{0};
  std::vector<std::thread> clients;
  for (int i = 0; i < kClients; ++i) {
    clients.emplace_back([&] {
      httplib::Client client = server_->client();
      ++ready;
      while (ready.load() < kClients)
        std::this_thread::yield();
      auto res = client.Get("/health");
      if (res && res->status == 200) ++ok;
    });
  }
  for (auto& t : clients)
    t.join();
  EXPECT_EQ(ok.load(), kClients);
}

TEST_F(Server, HealthModelsAndMetrics) {
  auto health = client_->Get("/health");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 200);
  EXPECT_FALSE(health->get_header_value("X-Request-Id").empty());

  auto models = client_->Get("/v1/models");
  ASSERT_TRUE(models);
  ASSERT_EQ(models->status, 200);
  const json m = json::parse(models->body);
  EXPECT_EQ(m["object"], "list");
  EXPECT_EQ(m["data"][0]["id"], "tiny");
  EXPECT_EQ(m["data"][0]["object"], "model");
  EXPECT_EQ(m["data"][0]["owned_by"], "pagellm");
  EXPECT_EQ(m["data"][0]["max_model_len"], 2048);
  EXPECT_EQ(m["data"][0]["kv_cache_blocks"], 64);

  auto one = client_->Get("/v1/models/tiny");
  ASSERT_TRUE(one);
  EXPECT_EQ(one->status, 200);
  EXPECT_EQ(json::parse(one->body)["id"], "tiny");
  EXPECT_EQ(client_->Get("/v1/models/other")->status, 404);

  auto stats = client_->Get("/v1/stats");
  ASSERT_TRUE(stats);
  EXPECT_EQ(stats->status, 200);
  EXPECT_EQ(json::parse(stats->body)["kv_cache"]["total_blocks"], 64) << stats->body;

  auto dashboard = server_->client(false).Get("/dashboard");
  ASSERT_TRUE(dashboard);
  EXPECT_EQ(dashboard->status, 200);
  EXPECT_NE(dashboard->body.find("/v1/stats"), std::string::npos);

  auto metrics = client_->Get("/metrics");
  ASSERT_TRUE(metrics);
  EXPECT_EQ(metrics->status, 200);
  for (const char* name : {"pagellm:num_requests_running", "pagellm:num_requests_waiting",
                           "pagellm:kv_cache_usage_perc", "pagellm:prompt_tokens_total",
                           "pagellm:generation_tokens_total", "pagellm:num_preemptions_total",
                           "pagellm:time_to_first_token_seconds_bucket",
                           "pagellm:e2e_request_latency_seconds_count"}) {
    EXPECT_NE(metrics->body.find(name), std::string::npos) << name;
  }
}

TEST_F(Server, TokenizeAndDetokenize) {
  const json t = post_json(*client_, "/tokenize", {{"prompt", "hello world"}});
  EXPECT_EQ(t["count"], t["tokens"].size());
  EXPECT_EQ(t["max_model_len"], 2048);
  // The BOS the model adds is a special token; decoding the rest gives the text back.
  json ids = t["tokens"];
  const json d = post_json(*client_, "/detokenize", {{"tokens", ids}});
  EXPECT_NE(d["prompt"].get<std::string>().find("hello world"), std::string::npos) << d;
  const json c = post_json(*client_, "/tokenize", chat("hi"));
  EXPECT_GT(c["count"].get<int>(), 1);
}

TEST_F(Server, ChatStreamingAndWholeGiveTheSameGreedyText) {
  const json body =
      chat("Tell me a story", {{"max_tokens", 12}, {"temperature", 0}, {"ignore_eos", true}});
  const json whole = post_json(*client_, "/v1/chat/completions", body);
  EXPECT_EQ(whole["object"], "chat.completion");
  EXPECT_EQ(whole["id"].get<std::string>().rfind("chatcmpl-", 0), 0u);
  EXPECT_EQ(whole["model"], "tiny");
  auto raw = client_->Post("/v1/chat/completions", body.dump(), "application/json");
  ASSERT_TRUE(raw);
  EXPECT_EQ(raw->get_header_value("X-Request-Id"), json::parse(raw->body)["id"]);
  EXPECT_EQ(whole["choices"][0]["message"]["role"], "assistant");
  EXPECT_EQ(whole["choices"][0]["finish_reason"], "length");
  const json& usage = whole["usage"];
  EXPECT_EQ(usage["completion_tokens"], 12);
  const json tokenized = post_json(*client_, "/tokenize", chat("Tell me a story"));
  EXPECT_EQ(usage["prompt_tokens"], tokenized["count"]);
  EXPECT_EQ(usage["total_tokens"], usage["prompt_tokens"].get<int>() + 12);
  EXPECT_TRUE(usage["prompt_tokens_details"].contains("cached_tokens"));

  json stream_body = body;
  stream_body["stream"] = true;
  stream_body["stream_options"] = {{"include_usage", true}};
  const Sse sse = post_stream(*client_, "/v1/chat/completions", stream_body);
  EXPECT_EQ(sse.status, 200);
  EXPECT_TRUE(sse.done);
  ASSERT_GE(sse.events.size(), 3u);
  EXPECT_EQ(sse.events.front()["object"], "chat.completion.chunk");
  EXPECT_EQ(sse.events.front()["choices"][0]["delta"]["role"], "assistant");
  EXPECT_EQ(stream_text(sse, true), whole["choices"][0]["message"]["content"]);
  const json& last_choice = sse.events[sse.events.size() - 2]["choices"][0];
  EXPECT_EQ(last_choice["finish_reason"], "length");
  const json& usage_chunk = sse.events.back();
  EXPECT_TRUE(usage_chunk["choices"].empty());
  EXPECT_EQ(usage_chunk["usage"]["completion_tokens"], 12);
  // The second identical prompt finds its full blocks in the prefix cache.
  EXPECT_GT(usage_chunk["usage"]["prompt_tokens_details"]["cached_tokens"].get<int>(), 0);
}

// stream_options.continuous_usage_stats (with include_usage), as in vLLM: each chunk of a
// choice carries that choice's usage so far; the last chunk still sums them all.
TEST_F(Server, ContinuousUsageStatsGiveEachChunkItsChoicesCountsSoFar) {
  const int64_t prompt_tokens = post_json(*client_, "/tokenize", chat("Count along"))["count"];
  json body =
      chat("Count along",
           {{"max_tokens", 9},
            {"n", 2},
            {"temperature", 1.0},
            {"seed", 3},
            {"ignore_eos", true},
            {"stream", true},
            {"stream_options", {{"include_usage", true}, {"continuous_usage_stats", true}}}});
  const Sse sse = post_stream(*client_, "/v1/chat/completions", body);
  ASSERT_TRUE(sse.done);
  ASSERT_GE(sse.events.size(), 5u);  // two role chunks, text, two ends, the sum
  std::map<int, int64_t> so_far;
  for (size_t i = 0; i + 1 < sse.events.size(); ++i) {
    const json& e = sse.events[i];
    ASSERT_EQ(e["choices"].size(), 1u) << e;
    ASSERT_TRUE(e.contains("usage")) << e;
    const int index = e["choices"][0]["index"];
    const int64_t n = e["usage"]["completion_tokens"];
    EXPECT_EQ(e["usage"]["prompt_tokens"], prompt_tokens) << e;
    EXPECT_EQ(e["usage"]["total_tokens"], prompt_tokens + n) << e;
    EXPECT_GE(n, so_far[index]) << e;
    if (i < 2) {
      EXPECT_EQ(n, 0) << e;  // the role chunks
    }
    if (!e["choices"][0]["finish_reason"].is_null()) {
      EXPECT_EQ(n, 9) << e;
    }
    so_far[index] = n;
  }
  EXPECT_EQ(so_far, (std::map<int, int64_t>{{0, 9}, {1, 9}}));
  EXPECT_TRUE(sse.events.back()["choices"].empty());
  EXPECT_EQ(sse.events.back()["usage"]["completion_tokens"], 18);
  EXPECT_EQ(sse.events.back()["usage"]["prompt_tokens"], prompt_tokens);

  // Without include_usage it asks for nothing.
  body["stream_options"] = {{"continuous_usage_stats", true}};
  const Sse plain = post_stream(*client_, "/v1/chat/completions", body);
  ASSERT_TRUE(plain.done);
  for (const json& e : plain.events)
    EXPECT_FALSE(e.contains("usage")) << e;

  // Completions, one choice with logprobs: each chunk's count is the tokens it and the
  // chunks before it carried.
  const Sse completion = post_stream(
      *client_, "/v1/completions",
      {{"prompt", "Once upon a time"},
       {"max_tokens", 30},
       {"logprobs", 0},
       {"ignore_eos", true},
       {"stream", true},
       {"stream_options", {{"include_usage", true}, {"continuous_usage_stats", true}}}});
  ASSERT_TRUE(completion.done);
  ASSERT_GE(completion.events.size(), 3u);
  int64_t tokens = 0;
  for (size_t i = 0; i + 1 < completion.events.size(); ++i) {
    const json& e = completion.events[i];
    const json& logprobs = e["choices"][0]["logprobs"];
    if (!logprobs.is_null()) tokens += static_cast<int64_t>(logprobs["tokens"].size());
    ASSERT_TRUE(e.contains("usage")) << e;
    EXPECT_EQ(e["usage"]["completion_tokens"], tokens) << e;
  }
  const json& end = completion.events[completion.events.size() - 2];
  EXPECT_EQ(end["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(end["usage"]["completion_tokens"], 30);
}

TEST_F(Server, CompletionsStreamingAndWholeGiveTheSameGreedyText) {
  const json body = {
      {"prompt", "Once upon a time"}, {"max_tokens", 10}, {"temperature", 0}, {"ignore_eos", true}};
  const json whole = post_json(*client_, "/v1/completions", body);
  EXPECT_EQ(whole["object"], "text_completion");
  EXPECT_EQ(whole["id"].get<std::string>().rfind("cmpl-", 0), 0u);
  json stream_body = body;
  stream_body["stream"] = true;
  const Sse sse = post_stream(*client_, "/v1/completions", stream_body);
  EXPECT_TRUE(sse.done);
  EXPECT_EQ(stream_text(sse, false), whole["choices"][0]["text"]);
  EXPECT_EQ(sse.events.back()["choices"][0]["finish_reason"], "length");

  // Token ids as the prompt give the same text as the string they encode.
  const json ids = post_json(*client_, "/tokenize", {{"prompt", "Once upon a time"}})["tokens"];
  json by_ids = body;
  by_ids["prompt"] = ids;
  EXPECT_EQ(post_json(*client_, "/v1/completions", by_ids)["choices"][0]["text"],
            whole["choices"][0]["text"]);
}

TEST_F(Server, SeveralChoicesAndSeeds) {
  const json body =
      chat("Pick a word",
           {{"max_tokens", 8}, {"n", 3}, {"seed", 7}, {"temperature", 1.0}, {"ignore_eos", true}});
  const double ttft_before = metric(*client_, "pagellm:time_to_first_token_seconds_count");
  const double e2e_before = metric(*client_, "pagellm:e2e_request_latency_seconds_count");
  const json a = post_json(*client_, "/v1/chat/completions", body);
  ASSERT_EQ(a["choices"].size(), 3u);
  // Each choice is a request in every histogram.
  EXPECT_EQ(metric(*client_, "pagellm:time_to_first_token_seconds_count") - ttft_before, 3);
  EXPECT_EQ(metric(*client_, "pagellm:e2e_request_latency_seconds_count") - e2e_before, 3);
  for (int i = 0; i < 3; ++i)
    EXPECT_EQ(a["choices"][i]["index"], i);
  EXPECT_EQ(a["usage"]["completion_tokens"], 24);
  // Same seed, same texts; the seed of choice i is seed + i.
  const json b = post_json(*client_, "/v1/chat/completions", body);
  json one = body;
  one["n"] = 1;
  one["seed"] = 8;
  const json c = post_json(*client_, "/v1/chat/completions", one);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(a["choices"][i]["message"]["content"], b["choices"][i]["message"]["content"]);
  }
  EXPECT_EQ(c["choices"][0]["message"]["content"], a["choices"][1]["message"]["content"]);

  // Streaming several choices: each index gets its own text and end.
  json stream_body = body;
  stream_body["stream"] = true;
  const Sse sse = post_stream(*client_, "/v1/chat/completions", stream_body);
  EXPECT_TRUE(sse.done);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(stream_text(sse, true, i), a["choices"][i]["message"]["content"]) << i;
  }
}

TEST_F(Server, ConcurrentRequestsGetTheTextTheyGetAlone) {
  const json body = {
      {"prompt", "In the morning"}, {"max_tokens", 40}, {"temperature", 0}, {"ignore_eos", true}};
  const json alone = post_json(*client_, "/v1/completions", body)["choices"][0]["text"];
  std::vector<json> texts(8);
  std::vector<std::thread> threads;
  for (size_t i = 0; i < texts.size(); ++i) {
    threads.emplace_back([&, i] {
      httplib::Client c = server_->client();
      auto res = c.Post("/v1/completions", body.dump(), "application/json");
      if (res && res->status == 200) texts[i] = json::parse(res->body)["choices"][0]["text"];
    });
  }
  for (auto& t : threads)
    t.join();
  for (const json& t : texts)
    EXPECT_EQ(t, alone);
}

TEST_F(Server, ChatWithoutMaxTokensFitsInASmallPool) {
  // The context is 2048 tokens but the pool only 1024: the default length follows the pool.
  const json r = post_json(*client_, "/v1/chat/completions", chat("hi", {{"ignore_eos", true}}));
  EXPECT_EQ(r["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(r["usage"]["total_tokens"], 1024);
}

TEST_F(Server, StopStringsEndTheText) {
  const json body = {
      {"prompt", "The"}, {"max_tokens", 30}, {"temperature", 0}, {"ignore_eos", true}};
  const std::string full = post_json(*client_, "/v1/completions", body)["choices"][0]["text"];
  ASSERT_GE(full.size(), 6u);
  const std::string stop = full.substr(full.size() / 2, 2);
  json with_stop = body;
  with_stop["stop"] = stop;
  const json r = post_json(*client_, "/v1/completions", with_stop);
  const std::string text = r["choices"][0]["text"];
  EXPECT_EQ(r["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(text, full.substr(0, full.find(stop)));

  // Streaming holds back what could be the start of a stop string: never sent.
  json stream_body = with_stop;
  stream_body["stream"] = true;
  const Sse sse = post_stream(*client_, "/v1/completions", stream_body);
  EXPECT_EQ(stream_text(sse, false), text);
  EXPECT_EQ(sse.events.back()["choices"][0]["finish_reason"], "stop");

  // Kept, when asked for.
  json keep = with_stop;
  keep["include_stop_str_in_output"] = true;
  EXPECT_EQ(post_json(*client_, "/v1/completions", keep)["choices"][0]["text"], text + stop);
  keep["stream"] = true;
  EXPECT_EQ(stream_text(post_stream(*client_, "/v1/completions", keep), false), text + stop);
}

TEST_F(Server, Logprobs) {
  const json r = post_json(
      *client_, "/v1/chat/completions",
      chat("hi",
           {{"max_tokens", 4}, {"logprobs", true}, {"top_logprobs", 3}, {"ignore_eos", true}}));
  const json& content = r["choices"][0]["logprobs"]["content"];
  ASSERT_EQ(content.size(), 4u);
  for (const json& t : content) {
    EXPECT_LE(t["logprob"].get<double>(), 0.0);
    EXPECT_EQ(t["top_logprobs"].size(), 3u);
    EXPECT_TRUE(t["bytes"].is_array());
  }
  const json c = post_json(*client_, "/v1/completions",
                           {{"prompt", "hi"},
                            {"max_tokens", 3},
                            {"logprobs", 2},
                            {"temperature", 0},
                            {"ignore_eos", true}});
  EXPECT_EQ(c["choices"][0]["logprobs"]["tokens"].size(), 3u);
  // Greedy: the chosen token is the likeliest, one of the two.
  EXPECT_EQ(c["choices"][0]["logprobs"]["top_logprobs"][0].size(), 2u);

  // Streamed, text_offset keeps counting across chunks: each offset is the previous one
  // plus the characters of the previous token.
  const Sse sse = post_stream(*client_, "/v1/completions",
                              {{"prompt", "hi"},
                               {"max_tokens", 8},
                               {"logprobs", 1},
                               {"ignore_eos", true},
                               {"stream", true}});
  std::vector<std::string> tokens;
  std::vector<int64_t> offsets;
  for (const json& e : sse.events) {
    const json& lp = e["choices"][0]["logprobs"];
    if (!lp.is_object()) continue;
    for (size_t i = 0; i < lp["tokens"].size(); ++i) {
      tokens.push_back(lp["tokens"][i].get<std::string>());
      offsets.push_back(lp["text_offset"][i].get<int64_t>());
    }
  }
  ASSERT_EQ(tokens.size(), 8u);
  EXPECT_EQ(offsets[0], 0);
  for (size_t i = 1; i < tokens.size(); ++i) {
    if (tokens[i - 1].rfind("bytes:", 0) == 0) {
      EXPECT_GE(offsets[i], offsets[i - 1]);
    } else {
      int64_t characters = 0;
      for (unsigned char ch : tokens[i - 1])
        characters += (ch & 0xC0) != 0x80 ? 1 : 0;
      EXPECT_EQ(offsets[i], offsets[i - 1] + characters) << i;
    }
  }
}

// A bias of 100 makes its token the choice; a token id outside the vocabulary is refused.
TEST_F(Server, LogitBiasSteersTheTokens) {
  const json r = post_json(*client_, "/v1/completions",
                           {{"prompt", {1, 2, 3}},
                            {"max_tokens", 3},
                            {"temperature", 0.7},
                            {"ignore_eos", true},
                            {"logit_bias", {{"300", 100}}}});
  auto res =
      client_->Post("/detokenize", json({{"tokens", {300, 300, 300}}}).dump(), "application/json");
  ASSERT_TRUE(res);
  EXPECT_EQ(r["choices"][0]["text"], json::parse(res->body)["prompt"]) << r;
  const json bad =
      expect_error(*client_, "/v1/completions",
                   json({{"prompt", {1, 2}}, {"logit_bias", {{"99999999", 1}}}}).dump(), 400);
  EXPECT_EQ(bad["param"], "logit_bias") << bad;
}

TEST_F(Server, BadRequestsGetOpenAIErrors) {
  const std::string chat_path = "/v1/chat/completions";
  EXPECT_EQ(expect_error(*client_, chat_path, "{not json", 400)["type"], "invalid_request_error");
  EXPECT_EQ(expect_error(*client_, chat_path, chat("x", {{"max_tokens", -1}}).dump(), 400)["param"],
            "max_tokens");
  expect_error(*client_, chat_path, chat("x", {{"temperature", 2.5}}).dump(), 400);
  expect_error(*client_, chat_path, chat("x", {{"top_p", 0}}).dump(), 400);
  expect_error(*client_, chat_path, chat("x", {{"n", 0}}).dump(), 400);
  expect_error(*client_, chat_path, chat("x", {{"n", 17}}).dump(), 400);
  expect_error(*client_, chat_path, chat("x", {{"logprobs", true}, {"top_logprobs", 21}}).dump(),
               400);
  expect_error(*client_, chat_path, chat("x", {{"max_tokens", "many"}}).dump(), 400);
  expect_error(*client_, chat_path, R"({"messages": []})", 400);
  expect_error(*client_, chat_path, R"({"messages": [{"role": "robot", "content": "x"}]})", 400);
  // A number past a double's range, and nesting 30,000 deep (which once overflowed the
  // stack on the chat path): 400, and the server answers on.
  expect_error(*client_, "/v1/completions", R"({"prompt": "a", "max_tokens": 1e400})", 400);
  const std::string deep(30000, '[');
  expect_error(*client_, chat_path,
               R"({"messages": [{"role": "user", "content": "hi", "x": )" + deep +
                   std::string(deep.size(), ']') + "}]}",
               400);
  expect_error(
      *client_, "/tokenize",
      R"({"messages": [{"role": "user", "content": "hi"}], "chat_template_kwargs": {"a": )" + deep +
          std::string(deep.size(), ']') + "}}",
      400);
  ASSERT_EQ(client_->Get("/health")->status, 200);
  const json model = expect_error(*client_, chat_path, chat("x", {{"model", "gpt-9"}}).dump(), 404);
  EXPECT_EQ(model["code"], "model_not_found");
  // A priority means nothing to first-come-first-served scheduling: refused, as vLLM
  // refuses it, rather than ignored; 0 is the default and fine.
  EXPECT_EQ(expect_error(*client_, chat_path, chat("x", {{"priority", 3}}).dump(), 400)["param"],
            "priority");
  EXPECT_EQ(
      post_json(*client_, chat_path, chat("x", {{"priority", 0}, {"max_tokens", 1}}))["choices"]
          .size(),
      1u);
  // The tokenizer's routes check the model too.
  EXPECT_EQ(expect_error(*client_, "/tokenize", json({{"prompt", "x"}, {"model", "gpt-9"}}).dump(),
                         404)["code"],
            "model_not_found");
  EXPECT_EQ(expect_error(*client_, "/detokenize",
                         json({{"tokens", {300}}, {"model", "gpt-9"}}).dump(), 404)["code"],
            "model_not_found");
  expect_error(*client_, "/v1/nothing", "{}", 404);

  // Over the context window: the message gives the length and the limit.
  const json too_long =
      expect_error(*client_, "/v1/completions",
                   json({{"prompt", std::vector<int>(2100, 5)}, {"max_tokens", 10}}).dump(), 400);
  EXPECT_NE(too_long["message"].get<std::string>().find("2048"), std::string::npos) << too_long;
  EXPECT_NE(too_long["message"].get<std::string>().find("2100"), std::string::npos) << too_long;
  EXPECT_EQ(too_long["param"], "prompt");
  // A prompt that fits, with too many tokens asked for: max_tokens is at fault.
  const json too_many =
      expect_error(*client_, "/v1/completions",
                   json({{"prompt", std::vector<int>(2000, 5)}, {"max_tokens", 100}}).dump(), 400);
  EXPECT_EQ(too_many["param"], "max_tokens") << too_many;
  EXPECT_NE(too_many["message"].get<std::string>().find("2100"), std::string::npos) << too_many;
  // Asked for as max_completion_tokens, the error names that field.
  const json too_many_completion =
      expect_error(*client_, chat_path, chat("x", {{"max_completion_tokens", 5000}}).dump(), 400);
  EXPECT_EQ(too_many_completion["param"], "max_completion_tokens") << too_many_completion;
  // A chat request without max_tokens: the messages alone are at fault.
  std::string words;
  for (int i = 0; i < 3000; ++i)
    words += " z";
  const json prompt_only = expect_error(*client_, chat_path, chat(words).dump(), 400);
  EXPECT_EQ(prompt_only["param"], "messages") << prompt_only;
  EXPECT_NE(prompt_only["message"].get<std::string>().find("no room is left for the completion"),
            std::string::npos)
      << prompt_only;
  // Within the window but over the whole KV pool (64 blocks of 16).
  const json never =
      expect_error(*client_, "/v1/completions",
                   json({{"prompt", std::vector<int>(1500, 5)}, {"max_tokens", 10}}).dump(), 400);
  EXPECT_NE(never["message"].get<std::string>().find("KV blocks"), std::string::npos) << never;
  expect_error(*client_, "/v1/completions", json({{"prompt", {1, 100000}}}).dump(), 400);

  // Over the body limit.
  const std::string huge = "{\"prompt\": \"" + std::string(33 << 20, 'a') + "\"}";
  auto res = client_->Post("/v1/completions", huge, "application/json");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 413);

  // And the server goes on.
  EXPECT_EQ(client_->Get("/health")->status, 200);
}

// A TCP connection to the server on localhost, or -1.
int connect_to(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

// Sends `request` as is on a new connection to `port` and reads until the server closes
// it (or 10 s pass), or unless `until_close`, until a response's headers and its
// Content-Length of body are in: the raw response, with a flag for the close.
struct RawExchange {
  std::string response;
  bool closed = false;
};
RawExchange raw_http(int port, const std::string& request, bool until_close = true) {
  RawExchange out;
  const int fd = connect_to(port);
  if (fd < 0) return out;
  timeval timeout{10, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof timeout);
  if (send(fd, request.data(), request.size(), MSG_NOSIGNAL) ==
      static_cast<ssize_t>(request.size())) {
    char buf[4096];
    ssize_t n = 1;
    auto whole = [&] {
      const size_t end = out.response.find("\r\n\r\n");
      const size_t at = out.response.find("Content-Length: ");
      return end != std::string::npos && at != std::string::npos && at < end &&
             out.response.size() >= end + 4 + std::stoul(out.response.substr(at + 16));
    };
    while ((until_close || !whole()) && (n = recv(fd, buf, sizeof buf, 0)) > 0)
      out.response.append(buf, static_cast<size_t>(n));
    out.closed = n == 0;
  }
  close(fd);
  return out;
}

// A compressed or chunked body could grow past the body limit as it is read (httplib
// checks only a Content-Length, and would inflate gzip): both are refused before the
// body is read, and the connection is closed.
TEST_F(Server, CompressedAndChunkedBodiesAreRefusedUnread) {
  const std::string head = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " +
                           std::string(kKey) + "\r\nContent-Type: application/json\r\n";
  // A body that never comes: the answer must not wait for it.
  RawExchange r = raw_http(server_->port(), head +
                                                "Content-Encoding: gzip\r\nContent-Length: "
                                                "1000000\r\n\r\n\x1f\x8b");
  EXPECT_EQ(r.response.rfind("HTTP/1.1 415", 0), 0u) << r.response;
  EXPECT_NE(r.response.find("Content-Encoding 'gzip'"), std::string::npos) << r.response;
  EXPECT_TRUE(r.closed);
  r = raw_http(server_->port(), head + "Transfer-Encoding: chunked\r\n\r\n100000\r\n{");
  EXPECT_EQ(r.response.rfind("HTTP/1.1 411", 0), 0u) << r.response;
  EXPECT_NE(r.response.find("invalid_request_error"), std::string::npos) << r.response;
  EXPECT_TRUE(r.closed);
  // A whole body of several MiB, sent before the client reads: the answer still comes
  // (what was sent is read and dropped, so closing does not reset the connection).
  r = raw_http(server_->port(),
               head + "Content-Encoding: gzip\r\nContent-Length: " + std::to_string(4 << 20) +
                   "\r\n\r\n" + std::string(4 << 20, 'x'));
  EXPECT_EQ(r.response.rfind("HTTP/1.1 415", 0), 0u) << r.response.substr(0, 200);
  // Asked first (Expect: 100-continue): the refusal instead of 100 Continue.
  r = raw_http(server_->port(),
               head +
                   "Content-Encoding: br\r\nContent-Length: 1000000\r\nExpect: "
                   "100-continue\r\n\r\n",
               /*until_close=*/false);
  EXPECT_EQ(r.response.rfind("HTTP/1.1 415", 0), 0u) << r.response;
  EXPECT_NE(r.response.find("Content-Length: "), std::string::npos) << r.response;
  // The encoding in a second header line counts too.
  r = raw_http(server_->port(), head +
                                    "Content-Encoding: identity\r\nContent-Encoding: "
                                    "gzip\r\nContent-Length: 2\r\n\r\n{}");
  EXPECT_EQ(r.response.rfind("HTTP/1.1 415", 0), 0u) << r.response;
  // No Content-Length at all: httplib would read to the end of the connection.
  r = raw_http(server_->port(), head + "\r\n" + R"({"prompt": "hi", "max_tokens": 1})");
  EXPECT_EQ(r.response.rfind("HTTP/1.1 411", 0), 0u) << r.response;
  EXPECT_TRUE(r.closed);
  // Identity is no encoding at all.
  const std::string body = R"({"prompt": "hi", "max_tokens": 1})";
  r = raw_http(server_->port(), head +
                                    "Content-Encoding: identity\r\nConnection: "
                                    "close\r\nContent-Length: " +
                                    std::to_string(body.size()) + "\r\n\r\n" + body);
  EXPECT_EQ(r.response.rfind("HTTP/1.1 200", 0), 0u) << r.response;
  EXPECT_EQ(client_->Get("/health")->status, 200);
}

// add_special_tokens: the BOS of a completion's prompt is the tokenizer's by default and
// can be left out; chat's template writes its own unless asked. min_tokens above what
// chat's context leaves can never be met.
TEST_F(Server, SpecialTokensOfThePromptAndMinTokensPastTheContext) {
  auto prompt_tokens = [&](const std::string& path, json body) {
    body["max_tokens"] = 1;
    return post_json(*client_, path, body)["usage"]["prompt_tokens"].get<int>();
  };
  const json completion = {{"prompt", "hi"}};
  json plain = completion;
  plain["add_special_tokens"] = false;
  EXPECT_EQ(prompt_tokens("/v1/completions", completion) - 1,
            prompt_tokens("/v1/completions", plain));
  json with = chat("hi");
  const int rendered = prompt_tokens("/v1/chat/completions", with);
  with["add_special_tokens"] = true;
  EXPECT_EQ(prompt_tokens("/v1/chat/completions", with), rendered + 1);
  json greedy_chat = chat("hi");
  greedy_chat["min_tokens"] = 5000;
  EXPECT_EQ(expect_error(*client_, "/v1/chat/completions", greedy_chat.dump(), 400)["param"],
            "min_tokens");
}

// HTTP/1.0 has no chunked encoding: a stream to such a client ends with the connection.
TEST_F(Server, AStreamToAnHttp10ClientIsNotChunked) {
  const std::string body = R"({"prompt": "hi", "max_tokens": 3, "stream": true})";
  const RawExchange r = raw_http(
      server_->port(),
      "POST /v1/completions HTTP/1.0\r\nHost: x\r\nAuthorization: Bearer " + std::string(kKey) +
          "\r\nContent-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) +
          "\r\n\r\n" + body);
  EXPECT_TRUE(r.closed);
  const size_t end = r.response.find("\r\n\r\n");
  ASSERT_NE(end, std::string::npos) << r.response;
  const std::string head = r.response.substr(0, end), events = r.response.substr(end + 4);
  EXPECT_EQ(head.find("Transfer-Encoding"), std::string::npos) << head;
  EXPECT_EQ(events.rfind("data: {", 0), 0u) << events;
  EXPECT_GE(events.size(), 14u);
  EXPECT_EQ(events.substr(events.size() - 14), "data: [DONE]\n\n") << events;
}

TEST_F(Server, AKnownPathWithTheWrongMethodIs405) {
  auto res = client_->Get("/v1/chat/completions");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 405);
  EXPECT_EQ(res->get_header_value("Allow"), "POST");
  const json error = json::parse(res->body)["error"];
  EXPECT_EQ(error["type"], "invalid_request_error");
  EXPECT_NE(error["message"].get<std::string>().find("takes POST, not GET"), std::string::npos)
      << error;
  res = client_->Post("/health", "{}", "application/json");
  EXPECT_EQ(res->status, 405);
  EXPECT_EQ(res->get_header_value("Allow"), "GET, HEAD");  // httplib answers HEAD with GET's route
  res = client_->Post("/v1/models/tiny", "{}", "application/json");
  EXPECT_EQ(res->status, 405);
  res = client_->Delete("/tokenize");
  EXPECT_EQ(res->status, 405);
  EXPECT_EQ(res->get_header_value("Allow"), "POST");
  // Paths no route serves stay 404, with either method.
  EXPECT_EQ(client_->Get("/v1/completion")->status, 404);
  EXPECT_EQ(client_->Post("/v1/modelsx", "{}", "application/json")->status, 404);
  EXPECT_EQ(client_->Get("/v1/models/")->status, 404);
}

TEST_F(Server, ApiKeyIsRequired) {
  httplib::Client anonymous = server_->client(false);
  auto res = anonymous.Get("/v1/models");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 401);
  EXPECT_EQ(json::parse(res->body)["error"]["type"], "authentication_error");
  res = anonymous.Post("/v1/completions", R"({"prompt": "x"})", "application/json");
  EXPECT_EQ(res->status, 401);
  EXPECT_EQ(anonymous.Get("/health")->status, 200);
  res = anonymous.Get("/v1/models", {{"Authorization", "Bearer wrong"}});
  EXPECT_EQ(res->status, 401);
  res = anonymous.Get("/v1/models", {{"X-Api-Key", kKey}});
  EXPECT_EQ(res->status, 200);
  // The scheme's name is case-insensitive (RFC 9110).
  for (const char* scheme : {"Bearer ", "bearer ", "BEARER "}) {
    res = anonymous.Get("/v1/models", {{"Authorization", std::string(scheme) + kKey}});
    EXPECT_EQ(res->status, 200) << scheme;
  }
  res = anonymous.Get("/v1/models", {{"Authorization", std::string("Basic ") + kKey}});
  EXPECT_EQ(res->status, 401);
}

TEST_F(Server, ClientThatHangsUpAbortsItsRequest) {
  const double aborted_before = metric(
      *client_, "pagellm:request_success_total{model_name=\"tiny\",finished_reason=\"abort\"}");
  const auto engine_aborts = [&] {
    return json::parse(client_->Get("/v1/stats")->body)["finished"]["abort"].get<int64_t>();
  };
  const int64_t engine_aborts_before = engine_aborts();
  // Three choices: each counts as an abort, in the metrics as in the engine's stats.
  const Sse sse = post_stream(*client_, "/v1/completions",
                              {{"prompt", "a long story"},
                               {"max_tokens", 1000},
                               {"n", 3},
                               {"ignore_eos", true},
                               {"stream", true}},
                              2);
  EXPECT_EQ(sse.events.size(), 2u);
  EXPECT_FALSE(sse.done);
  // The engine frees the blocks as soon as the server sees the connection gone. The server
  // counts a choice once the engine has ended it, and the engine's stats show each end
  // (blocks returned) before its stream does: the server's count comes last. Used blocks
  // alone would not do: the stats are drawn after each step, and the two events can come
  // out of the first step before it ends.
  double aborted = -1;
  for (auto deadline = std::chrono::steady_clock::now() + 20s;
       std::chrono::steady_clock::now() < deadline; std::this_thread::sleep_for(50ms)) {
    aborted = metric(
        *client_, "pagellm:request_success_total{model_name=\"tiny\",finished_reason=\"abort\"}");
    if (aborted >= aborted_before + 3) break;
  }
  EXPECT_EQ(aborted, aborted_before + 3);
  EXPECT_EQ(engine_aborts(), engine_aborts_before + 3);
  EXPECT_EQ(metric(*client_, "pagellm:kv_cache_used_blocks"), 0);
  EXPECT_EQ(metric(*client_, "pagellm:kv_cache_usage_perc"), 0);
}

// A client that hangs up after the engine has ended its choices, while the server is still
// writing them out, took nothing away from them: each counts with the end the engine gave
// it, in the metrics as in the engine's stats.
TEST(ServerProcess, AHangUpAfterTheEngineEndedTheChoicesCountsTheirOwnEnds) {
  test::ServerProcess server({"--num-kv-blocks", "1024", "--served-model-name", "tiny"});
  ASSERT_GT(server.port(), 0) << server.log();
  httplib::Client stats = server.client();
  const auto engine_stats = [&] {
    auto res = stats.Get("/v1/stats");
    return res ? json::parse(res->body) : json();
  };
  const auto engine_ended = [&](const char* reason) {
    return engine_stats()["finished"][reason].get<int64_t>();
  };
  const auto counted = [&](const std::string& reason) {
    return metric(stats, "pagellm:request_success_total{model_name=\"tiny\",finished_reason=\"" +
                             reason + "\"}");
  };
  // Sixteen choices of 200 tokens with twenty alternatives each: about 6 MB of events,
  // twice what the sockets take in (about 3 MB here: the server's send buffer grows to
  // 4 MB and a write waits while two thirds of it are queued), so the server's writer
  // waits on the client's small window while the engine goes on.
  httplib::Client client = server.client();
  client.set_socket_options([](socket_t sock) {
    const int bytes = 64 << 10;
    setsockopt(sock, SOL_SOCKET, SO_RCVBUF, &bytes, sizeof(bytes));
  });
  httplib::Request req;
  req.method = "POST";
  req.path = "/v1/chat/completions";
  req.body = chat("a long story", {{"max_tokens", 200},
                                   {"n", 16},
                                   {"ignore_eos", true},
                                   {"logprobs", true},
                                   {"top_logprobs", 20},
                                   {"stream", true}})
                 .dump();
  req.set_header("Content-Type", "application/json");
  // Reads at a quarter of the pace at which the engine makes events (about 2 KB a token),
  // at most 1.6 MB in all: the server's writer stays behind with full buffers but moves on
  // (a write that waits 5 s would end the stream, and a loaded machine can take longer than
  // that for the engine's part). Hangs up once the engine has ended all sixteen.
  bool ended_in_engine = false;
  size_t received = 0;
  const auto give_up = std::chrono::steady_clock::now() + 60s;
  req.content_receiver = [&](const char*, size_t n, uint64_t, uint64_t) {
    received += n;
    while (std::chrono::steady_clock::now() < give_up) {
      const json s = engine_stats();
      if (s.is_null()) return false;
      ended_in_engine = s["finished"]["length"] == 16;
      if (ended_in_engine) return false;
      if (received <= 500 * s["scheduler"]["generation_tokens"].get<size_t>()) return true;
      std::this_thread::sleep_for(10ms);
    }
    return false;
  };
  client.send(req);
  ASSERT_TRUE(ended_in_engine) << server.log();
  // The server had not written them all out: it saw the client go (the access log's line,
  // written once the response is done with, comes after the counts).
  const std::string access = "POST /v1/chat/completions 499 ";
  for (auto deadline = std::chrono::steady_clock::now() + 20s;
       std::chrono::steady_clock::now() < deadline; std::this_thread::sleep_for(20ms)) {
    if (server.log().find(access) != std::string::npos) break;
  }
  const std::string log = server.log();
  ASSERT_NE(log.find(access), std::string::npos) << log;
  EXPECT_NE(log.find("the client went away"), std::string::npos) << log;
  EXPECT_EQ(engine_ended("abort"), 0);
  EXPECT_EQ(counted("length"), 16);
  EXPECT_EQ(counted("abort"), 0);
  // The access log gives the tokens made for it, sent or not.
  EXPECT_NE(log.find(access + "in=20 out=3200 "), std::string::npos) << log;
}

TEST(ServerProcess, ConfigFileSetsOptionsAndFlagsOverrideIt) {
  const auto config = std::filesystem::temp_directory_path() /
                      ("pagellm_server_test_config_" + std::to_string(getpid()) + ".json");
  std::ofstream(config) << R"({"served_model_name": "from-config", "max-model-len": 512,
                               "log-level": "warn"})";
  ServerProcess server({"--config", config.string(), "--max-model-len", "256"});
  std::filesystem::remove(config);
  // A whole number written as a float is that integer.
  std::ofstream(config) << R"({"max-model-len": 5.12e2, "max_num_seqs": 8.0})";
  ServerProcess floats({"--config", config.string()});
  std::filesystem::remove(config);
  ASSERT_GT(floats.port(), 0) << floats.log();
  httplib::Client floats_client = floats.client(false);
  EXPECT_EQ(json::parse(floats_client.Get("/v1/models")->body)["data"][0]["max_model_len"], 512);
  // A boolean, a key set twice (in its two spellings), and a fraction for an integer are
  // refused.
  for (const char* bad :
       {R"({"served-model-name": true})", R"({"max_num_seqs": 4, "max-num-seqs": 5})",
        R"({"max-num-seqs": 4.5})"}) {
    std::ofstream(config) << bad;
    ServerProcess refused({"--config", config.string()});
    std::filesystem::remove(config);
    EXPECT_EQ(refused.port(), 0) << bad;
    EXPECT_EQ(refused.start_exit_code(), 2) << bad << refused.log();
  }
  // The two ways to size the KV pool are one option: a flag replaces the file's other one.
  std::ofstream(config) << R"({"num-kv-blocks": 100})";
  test::ServerProcess kv_by_flag({"--config", config.string(), "--kv-cache-bytes", "4000000"});
  std::filesystem::remove(config);
  ASSERT_GT(kv_by_flag.port(), 0) << kv_by_flag.log();
  httplib::Client kv_client = kv_by_flag.client();
  EXPECT_NE(json::parse(kv_client.Get("/v1/models")->body)["data"][0]["kv_cache_blocks"], 100);
  // A byte count past 2^31 - 1 blocks is refused with its flag, not wrapped round.
  test::ServerProcess oversized({"--kv-cache-bytes", "9223372036854775807"});
  EXPECT_EQ(oversized.port(), 0);
  EXPECT_NE(oversized.log().find("--kv-cache-bytes 9223372036854775807"), std::string::npos)
      << oversized.log();
  EXPECT_NE(oversized.log().find("at most 2147483647"), std::string::npos) << oversized.log();

  ASSERT_GT(server.port(), 0) << server.log();
  httplib::Client client = server.client(false);
  auto res = client.Get("/v1/models");
  ASSERT_TRUE(res);
  const json m = json::parse(res->body);
  EXPECT_EQ(m["data"][0]["id"], "from-config");
  EXPECT_EQ(m["data"][0]["max_model_len"], 256);
  // The config's log level: no access log lines at info.
  EXPECT_EQ(server.log().find("GET /v1/models"), std::string::npos) << server.log();
}

TEST(ServerProcess, PrioritySchedulingServesRequestsWithPriorities) {
  ServerProcess server({"--scheduling-policy", "priority"});
  ASSERT_GT(server.port(), 0) << server.log();
  httplib::Client client = server.client(false);
  for (int priority : {5, -3}) {
    const json body = {{"prompt", "Hello"}, {"max_tokens", 3}, {"priority", priority}};
    auto res = client.Post("/v1/completions", body.dump(), "application/json");
    ASSERT_TRUE(res);
    EXPECT_EQ(res->status, 200) << res->body;
    EXPECT_EQ(json::parse(res->body)["usage"]["completion_tokens"], 3);
  }
}

TEST_F(Server, ClientThatTimesOutOnAWholeResponseAbortsItsRequest) {
  const std::string aborted_metric =
      "pagellm:request_success_total{model_name=\"tiny\",finished_reason=\"abort\"}";
  const std::string length_metric =
      "pagellm:request_success_total{model_name=\"tiny\",finished_reason=\"length\"}";
  const double aborted_before = metric(*client_, aborted_metric);
  const double length_before = metric(*client_, length_metric);
  // Sixteen long choices that take turns in the 64-block pool: seconds of work.
  {
    httplib::Client impatient = server_->client();
    impatient.set_read_timeout(0, 300'000);
    auto res = impatient.Post("/v1/completions",
                              R"({"prompt": "x", "max_tokens": 1000, "n": 16, "ignore_eos": true})",
                              "application/json");
    EXPECT_FALSE(res);  // timed out
  }                     // the client closes its connection
  // Each choice ends once: cut off at its length before the client left, or aborted. The
  // server counts each once the engine has ended it (its blocks returned).
  double aborted = -1, ended = -1;
  for (auto deadline = std::chrono::steady_clock::now() + 20s;
       std::chrono::steady_clock::now() < deadline; std::this_thread::sleep_for(50ms)) {
    aborted = metric(*client_, aborted_metric);
    ended = aborted - aborted_before + metric(*client_, length_metric) - length_before;
    if (ended >= 16) break;
  }
  EXPECT_EQ(ended, 16);
  EXPECT_GT(aborted, aborted_before);
  EXPECT_EQ(metric(*client_, "pagellm:kv_cache_used_blocks"), 0);
}

// A tokenizer larger than the model's vocabulary (another model's) is said at start.
TEST(ServerProcess, ATokenizerPastTheVocabularyIsReportedAtStart) {
  const auto data = testing::shared_data_dir();
  if (!data) GTEST_SKIP() << "shared test data not found (set PAGELLM_TEST_DATA)";
  const auto dir = std::filesystem::temp_directory_path() /
                   ("pagellm_server_test_other_tokenizer_" + std::to_string(getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::copy(test::tiny_demo_model(), dir);
  std::filesystem::copy_file(*data / "tokenizers" / "qwen3" / "tokenizer.json",
                             dir / "tokenizer.json",
                             std::filesystem::copy_options::overwrite_existing);
  {
    ServerProcess server({}, dir);
    ASSERT_GT(server.port(), 0) << server.log();
    EXPECT_NE(server.log().find("the tokenizer has 151669 tokens but the model's vocabulary 512"),
              std::string::npos)
        << server.log();
  }
  std::filesystem::remove_all(dir);
}

TEST(ServerProcess, ModelWithoutChatTemplateAndTemplateFromAFile) {
  // A copy of the tiny model whose tokenizer_config.json has no chat template.
  const auto dir = std::filesystem::temp_directory_path() /
                   ("pagellm_server_test_plain_" + std::to_string(getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::copy(test::tiny_demo_model(), dir);
  json config = json::parse(test::read_text_file(dir / "tokenizer_config.json"));
  config.erase("chat_template");
  std::ofstream(dir / "tokenizer_config.json") << config.dump();
  const auto template_file = dir / "plain.jinja";
  std::ofstream(template_file) << "{% for m in messages %}{{ m.content }}|{% endfor %}";
  {
    ServerProcess server({}, dir);
    ASSERT_GT(server.port(), 0) << server.log();
    httplib::Client client = server.client(false);
    const json error = expect_error(client, "/v1/chat/completions", chat("hi").dump(), 400);
    EXPECT_NE(error["message"].get<std::string>().find("chat template"), std::string::npos);
    post_json(client, "/v1/completions", {{"prompt", "hi"}, {"max_tokens", 2}});
  }
  {
    ServerProcess server({"--chat-template", template_file.string()}, dir);
    ASSERT_GT(server.port(), 0) << server.log();
    httplib::Client client = server.client(false);
    const json rendered = post_json(client, "/tokenize", chat("hi"));
    const json plain =
        post_json(client, "/tokenize", {{"prompt", "hi|"}, {"add_special_tokens", false}});
    EXPECT_EQ(rendered["tokens"], plain["tokens"]);
    post_json(client, "/v1/chat/completions", chat("hi", {{"max_tokens", 2}}));
  }
  std::filesystem::remove_all(dir);
}

// /tokenize renders messages as chat does, tools and chat_template_kwargs included, so
// its count is the chat request's prompt_tokens; an assistant turn of tool calls without
// content renders as empty text.
TEST(ServerProcess, TokenizeRendersMessagesAsChatDoes) {
  const auto template_file = std::filesystem::temp_directory_path() /
                             ("pagellm_server_test_tools_" + std::to_string(getpid()) + ".jinja");
  std::ofstream(template_file)
      << "{% for m in messages %}{{ m.role }}:{{ m.content }}{% if 'x' in m.content %}!"
         "{% endif %}|{% endfor %}{% if tools %}{{ tools | tojson }}{% endif %}"
         "{% if flag %}flag{% endif %}";
  ServerProcess server({"--chat-template", template_file.string()});
  std::filesystem::remove(template_file);
  ASSERT_GT(server.port(), 0) << server.log();
  httplib::Client client = server.client(false);
  const json messages = json::parse(R"([
      {"role": "user", "content": "what is the weather"},
      {"role": "assistant", "content": null,
       "tool_calls": [{"id": "c1", "type": "function",
                       "function": {"name": "weather", "arguments": "{}"}}]},
      {"role": "assistant"},
      {"role": "tool", "tool_call_id": "c1", "content": "sunny"}])");
  const json tools =
      json::parse(R"([{"type": "function", "function": {"name": "weather", "parameters": {}}}])");
  const json kwargs = {{"flag", true}};
  const json tokenized =
      post_json(client, "/tokenize",
                {{"messages", messages}, {"tools", tools}, {"chat_template_kwargs", kwargs}});
  const json chat = post_json(client, "/v1/chat/completions",
                              {{"messages", messages},
                               {"tools", tools},
                               {"chat_template_kwargs", kwargs},
                               {"max_tokens", 1}});
  EXPECT_EQ(tokenized["count"], chat["usage"]["prompt_tokens"]) << tokenized.dump();
  const json text = post_json(client, "/detokenize", {{"tokens", tokenized["tokens"]}});
  const std::string prompt = text["prompt"];
  EXPECT_NE(prompt.find("assistant:|assistant:|tool:sunny|"), std::string::npos) << prompt;
  EXPECT_NE(prompt.find("\"weather\""), std::string::npos) << prompt;
  EXPECT_EQ(prompt.substr(prompt.size() - 4), "flag") << prompt;
}

// With a generation_config.json that sets temperature 0, requests without a temperature
// are greedy (the same text every time); --generation-config none leaves that out.
TEST(ServerProcess, GenerationConfigSetsSamplingDefaults) {
  const auto dir = std::filesystem::temp_directory_path() /
                   ("pagellm_server_test_gencfg_" + std::to_string(getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::copy(test::tiny_demo_model(), dir);
  json gen = json::parse(test::read_text_file(dir / "generation_config.json"));
  gen["temperature"] = 0.0;
  gen["top_p"] = 0.9;
  std::ofstream(dir / "generation_config.json") << gen.dump();
  const json body = {{"prompt", "hello"}, {"max_tokens", 24}, {"ignore_eos", true}};
  {
    ServerProcess server({}, dir);
    ASSERT_GT(server.port(), 0) << server.log();
    EXPECT_NE(server.log().find("sampling defaults from generation_config.json: temperature 0, "
                                "top_p 0.9"),
              std::string::npos)
        << server.log();
    httplib::Client client = server.client(false);
    const json a = post_json(client, "/v1/completions", body);
    const json b = post_json(client, "/v1/completions", body);
    EXPECT_EQ(a["choices"][0]["text"], b["choices"][0]["text"]);
  }
  {
    ServerProcess server({"--generation-config", "none"}, dir);
    ASSERT_GT(server.port(), 0) << server.log();
    EXPECT_EQ(server.log().find("sampling defaults"), std::string::npos) << server.log();
    // Temperature 1 over a random model: 24 tokens drawn twice do not all agree.
    httplib::Client client = server.client(false);
    const json a = post_json(client, "/v1/completions", body);
    const json b = post_json(client, "/v1/completions", body);
    EXPECT_NE(a["choices"][0]["text"], b["choices"][0]["text"]);
  }
  std::filesystem::remove_all(dir);
}

// Waits until the server's gauge `name` reaches 1 or more.
void wait_for_one(httplib::Client& probe, const std::string& name) {
  for (auto deadline = std::chrono::steady_clock::now() + 10s;
       std::chrono::steady_clock::now() < deadline; std::this_thread::sleep_for(5ms)) {
    if (metric(probe, name) >= 1) return;
  }
  ADD_FAILURE() << name << " stayed at 0";
}

// Waits until the server runs a request.
void wait_until_running(httplib::Client& probe) {
  wait_for_one(probe, "pagellm:num_requests_running");
}

TEST(ServerProcess, FullQueueAnswers429WithRetryAfter) {
  // One sequence runs at a time and one may wait.
  ServerProcess server({"--max-num-seqs", "1", "--max-waiting", "1"});
  ASSERT_GT(server.port(), 0) << server.log();
  httplib::Client probe = server.client(false);
  std::thread running([&] {
    httplib::Client c = server.client(false);
    c.Post("/v1/completions", R"({"prompt": "x", "max_tokens": 1000, "ignore_eos": true})",
           "application/json");
  });
  wait_until_running(probe);
  std::thread waiting([&] {
    httplib::Client c = server.client(false);
    c.Post("/v1/completions", R"({"prompt": "y", "max_tokens": 2})", "application/json");
  });
  wait_for_one(probe, "pagellm:num_requests_waiting");
  ASSERT_EQ(metric(probe, "pagellm:num_requests_waiting"), 1);
  auto res =
      probe.Post("/v1/completions", R"({"prompt": "z", "max_tokens": 2})", "application/json");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 429) << res->body;
  EXPECT_EQ(res->get_header_value("Retry-After"), "1");
  EXPECT_EQ(json::parse(res->body)["error"]["type"], "rate_limit_error");
  server.stop(SIGKILL, 10s);
  running.join();
  waiting.join();
}

// A request whose choices (prompts times n) outnumber the waiting queue can never be
// queued: 400 at once, even on an idle server, and nothing of it reaches the engine.
TEST(ServerProcess, MoreChoicesThanTheQueueHoldsAre400) {
  ServerProcess server({"--max-waiting", "3"});
  ASSERT_GT(server.port(), 0) << server.log();
  httplib::Client client = server.client(false);
  auto res = client.Post("/v1/completions", R"({"prompt": "hi", "max_tokens": 2, "n": 4})",
                         "application/json");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 400) << res->body;
  EXPECT_EQ(json::parse(res->body)["error"]["param"], "n") << res->body;
  EXPECT_EQ(res->get_header_value("Retry-After"), "");
  res = client.Post("/v1/completions", R"({"prompt": ["a", "b"], "max_tokens": 2, "n": 2})",
                    "application/json");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 400) << res->body;
  const json three =
      post_json(client, "/v1/completions", {{"prompt", "hi"}, {"max_tokens", 2}, {"n", 3}});
  EXPECT_EQ(three["choices"].size(), 3u) << three.dump();
  const json stats = json::parse(client.Get("/v1/stats")->body);
  EXPECT_EQ(stats["finished"]["abort"], 0) << stats.dump();
  EXPECT_EQ(stats["finished"]["length"], 3) << stats.dump();
}

// A signal that comes while the model loads, before the listener runs, still ends the
// server: stopping a listener that had not begun did nothing, and the process waited in
// accept() for good, deaf to more signals. Signals at several points of the start.
TEST(ServerProcess, ASignalWhileTheModelLoadsEndsTheServer) {
  const std::string model = test::tiny_demo_model().string();
  int hung = 0;
  for (int i = 0; i < 24; ++i) {
    const pid_t pid = fork();
    if (pid == 0) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      const int null = open("/dev/null", O_WRONLY);
      dup2(null, 1);
      dup2(null, 2);
      execl(PAGELLM_BINARY, PAGELLM_BINARY, "serve", "--model", model.c_str(), "--port", "0",
            "--shutdown-timeout", "1", static_cast<char*>(nullptr));
      _exit(127);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5 * i));
    kill(pid, SIGTERM);
    bool ended = false;
    for (auto deadline = std::chrono::steady_clock::now() + 10s;
         !ended && std::chrono::steady_clock::now() < deadline; std::this_thread::sleep_for(10ms)) {
      ended = waitpid(pid, nullptr, WNOHANG) == pid;
    }
    if (!ended) {
      ++hung;
      kill(pid, SIGKILL);
      waitpid(pid, nullptr, 0);
    }
  }
  EXPECT_EQ(hung, 0) << hung << " of 24 servers signalled while starting did not exit";
}

TEST(ServerProcess, SigtermLetsRequestsInFlightFinishAndExitsZero) {
  ServerProcess server({});
  ASSERT_GT(server.port(), 0) << server.log();
  httplib::Client client = server.client(false);
  Sse sse;
  // Eight choices of 400 tokens, two at a time in the pool: still running at the signal.
  std::thread request([&] {
    sse = post_stream(
        client, "/v1/completions",
        {{"prompt", "x"}, {"max_tokens", 400}, {"n", 8}, {"ignore_eos", true}, {"stream", true}});
  });
  httplib::Client probe = server.client(false);
  wait_until_running(probe);
  EXPECT_EQ(server.stop(SIGTERM, 30s), 0) << server.log();
  request.join();
  EXPECT_TRUE(sse.done);
  int finished = 0;
  for (const json& e : sse.events) {
    if (!e.contains("choices")) continue;
    for (const json& c : e["choices"]) {
      if (c["finish_reason"] == "length") ++finished;
    }
  }
  EXPECT_EQ(finished, 8);
}

TEST(ServerProcess, ShutdownTimeoutAbortsWhatIsLeft) {
  ServerProcess server({"--shutdown-timeout", "0"});
  ASSERT_GT(server.port(), 0) << server.log();
  httplib::Client client = server.client(false);
  int status = 0;
  std::thread request([&] {
    auto res = client.Post("/v1/completions",
                           R"({"prompt": "x", "max_tokens": 1000, "n": 16, "ignore_eos": true})",
                           "application/json");
    status = res ? res->status : -1;
  });
  httplib::Client probe = server.client(false);
  wait_until_running(probe);
  EXPECT_EQ(server.stop(SIGINT, 20s), 0) << server.log();
  request.join();
  EXPECT_EQ(status, 503);
}

// Connections hold a thread each while they are open: when every one the server started
// is held by an idle client, /health still answers (the pool grows), rather than waiting
// for those clients' reads to time out (5 s).
TEST(ServerProcess, IdleConnectionsDoNotStarveHealth) {
  ServerProcess server({"--max-num-seqs", "1"});  // 128 threads to begin with
  ASSERT_GT(server.port(), 0) << server.log();
  std::vector<int> idle;
  for (int i = 0; i < 160; ++i) {
    idle.push_back(connect_to(server.port()));
    ASSERT_GE(idle.back(), 0);
  }
  std::this_thread::sleep_for(200ms);  // accepted, each waiting for a request
  httplib::Client client = server.client(false);
  client.set_read_timeout(3, 0);
  const auto res = client.Get("/health");
  for (int fd : idle)
    close(fd);
  ASSERT_TRUE(res) << httplib::to_string(res.error());
  EXPECT_EQ(res->status, 200);
}

// Each connection takes a descriptor: the server raises its soft limit on open files to
// the hard one (commonly 1024 against 524288), so that it can hold as many connections
// as it has threads for.
TEST(ServerProcess, RaisesItsOpenFileLimitToTheHardLimit) {
  rlimit mine{};
  ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &mine), 0);
  if (mine.rlim_max <= 256) GTEST_SKIP() << "hard limit " << mine.rlim_max;
  rlimit lowered = mine;
  lowered.rlim_cur = 256;  // the server inherits it
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &lowered), 0);
  ServerProcess server({});
  setrlimit(RLIMIT_NOFILE, &mine);
  ASSERT_GT(server.port(), 0) << server.log();
  std::ifstream limits("/proc/" + std::to_string(server.pid()) + "/limits");
  std::string line, soft, hard;
  while (std::getline(limits, line)) {
    if (line.rfind("Max open files", 0) != 0) continue;
    std::istringstream fields(line.substr(std::string("Max open files").size()));
    fields >> soft >> hard;
  }
  EXPECT_EQ(soft, hard);
  EXPECT_NE(soft, "256");
}

// A client that holds a kept-alive connection open without a request keeps the
// listener's thread until its read times out; the log says so, and does not claim to
// abort requests when none is in flight.
TEST(ServerProcess, AnIdleConnectionAtShutdownIsNotARequestAborted) {
  ServerProcess server({"--shutdown-timeout", "0"});
  ASSERT_GT(server.port(), 0) << server.log();
  const int idle = connect_to(server.port());
  ASSERT_GE(idle, 0);
  std::this_thread::sleep_for(100ms);  // accepted, waiting for a request
  EXPECT_EQ(server.stop(SIGTERM, 30s), 0) << server.log();
  close(idle);
  const std::string log = server.log();
  EXPECT_EQ(log.find("aborting the requests still in flight"), std::string::npos) << log;
  EXPECT_NE(log.find("no request in flight"), std::string::npos) << log;
}

// A client that sends a request a byte at a time, each within the read timeout, would
// hold a connection thread, and with it the exit, for as long as it likes: past the
// shutdown timeout and a grace for idle connections to close, the server exits without it.
TEST(ServerProcess, ATricklingClientDoesNotHoldTheExitForever) {
  ServerProcess server({"--shutdown-timeout", "0"});
  ASSERT_GT(server.port(), 0) << server.log();
  const int fd = connect_to(server.port());
  ASSERT_GE(fd, 0);
  std::atomic<bool> done{false};
  std::thread trickle([&] {
    const std::string request = "GET /health HTTP/1.1\r\nHost: x\r\nX-Slow: ";
    for (size_t i = 0; !done; ++i) {
      const char c = i < request.size() ? request[i] : 'a';
      if (send(fd, &c, 1, MSG_NOSIGNAL) != 1) break;
      std::this_thread::sleep_for(500ms);
    }
  });
  std::this_thread::sleep_for(1s);
  const auto start = std::chrono::steady_clock::now();
  const int code = server.stop(SIGTERM, 30s);
  const double took =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  done = true;
  trickle.join();
  close(fd);
  EXPECT_EQ(code, 0) << server.log();
  EXPECT_LT(took, 20) << server.log();
  EXPECT_NE(server.log().find("exiting without them"), std::string::npos) << server.log();
}

// stdout carries the bound address alone, for scripts; the log goes to stderr.
TEST(ServeCli, TheLogGoesToStderrAndTheAddressToStdout) {
  const auto dir = std::filesystem::temp_directory_path() /
                   ("pagellm_serve_streams_" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  const std::string out = (dir / "out").string(), err = (dir / "err").string();
  const pid_t pid = fork();
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    dup2(open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644), 1);
    dup2(open(err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644), 2);
    const std::string model = test::tiny_demo_model().string();
    execl(PAGELLM_BINARY, PAGELLM_BINARY, "serve", "--model", model.c_str(), "--port", "0",
          static_cast<char*>(nullptr));
    _exit(127);
  }
  const std::regex listening(R"(^pagellm: listening on http://127\.0\.0\.1:(\d+)\n$)");
  std::smatch m;
  std::string text;
  for (auto deadline = std::chrono::steady_clock::now() + 30s;
       std::chrono::steady_clock::now() < deadline && !std::regex_search(text, m, listening);
       std::this_thread::sleep_for(20ms)) {
    text = test::read_text_file(out);
  }
  ASSERT_TRUE(std::regex_search(text, m, listening)) << text << test::read_text_file(err);
  httplib::Client client("127.0.0.1", std::stoi(m[1]));
  EXPECT_EQ(client.Get("/health")->status, 200);
  kill(pid, SIGKILL);
  waitpid(pid, nullptr, 0);
  EXPECT_TRUE(std::regex_match(test::read_text_file(out), listening)) << test::read_text_file(out);
  const std::string log = test::read_text_file(err);
  EXPECT_NE(log.find("serving '"), std::string::npos) << log;
  std::filesystem::remove_all(dir);
}

TEST(ServeCli, HelpListsTheOptionsAndBadValuesAreRefused) {
  const std::string out =
      std::filesystem::temp_directory_path() / ("pagellm_serve_help_" + std::to_string(getpid()));
  const std::string command = std::string("'") + PAGELLM_BINARY + "' serve --help > '" + out + "'";
  ASSERT_EQ(std::system(command.c_str()), 0);
  const std::string help = test::read_text_file(out);
  std::filesystem::remove(out);
  for (const char* flag : {"--model",
                           "--config",
                           "--host",
                           "--port",
                           "--num-kv-blocks",
                           "--kv-cache-bytes",
                           "--max-num-seqs",
                           "--max-num-batched-tokens",
                           "--max-model-len",
                           "--max-waiting",
                           "--api-key",
                           "--served-model-name",
                           "--chat-template",
                           "--generation-config",
                           "--tool-call-parser",
                           "--reasoning-parser",
                           "--log-level",
                           "--shutdown-timeout",
                           "--backend",
                           "--scheduling-policy",
                           "--gpu-memory-utilization",
                           "--cpu-matmul"}) {
    EXPECT_NE(help.find(flag), std::string::npos) << flag;
  }
  for (const char* args :
       {"--backend tpu", "--port x", "--config /nonexistent.json",
        "--num-kv-blocks 4 --kv-cache-bytes 100000", "--scheduling-policy lifo",
        "--gpu-memory-utilization 1.5", "--gpu-memory-utilization x", "--generation-config vllm",
        "--tool-call-parser qwen", "--reasoning-parser o1", "--max-waiting 0", "--cpu-matmul avx",
        // An empty value (an unset variable in a script) is not "unset":
        // --model '' served the random demo model.
        "--model ''", "--host ''", "--served-model-name ''", "--chat-template ''"}) {
    // Bounded: a server that took the options would serve on.
    const std::string bad =
        std::string("timeout 60 '") + PAGELLM_BINARY + "' serve " + args + " 2>/dev/null";
    const int status = std::system(bad.c_str());
    EXPECT_EQ(WEXITSTATUS(status), 2) << args;
  }
}

// `pagellm serve --port 0 --model MODEL ARGS` run to its exit, for the options that end it
// at start: its exit status and what it printed.
std::pair<int, std::string> serve_until_exit(
    const std::string& args, const std::filesystem::path& model = test::tiny_demo_model()) {
  const std::string log =
      std::filesystem::temp_directory_path() / ("pagellm_serve_exit_" + std::to_string(getpid()));
  const std::string command = std::string("'") + PAGELLM_BINARY + "' serve --port 0 --model '" +
                              model.string() + "' " + args + " > '" + log + "' 2>&1";
  const int status = std::system(command.c_str());
  std::string text = test::read_text_file(log);
  std::filesystem::remove(log);
  return {WEXITSTATUS(status), std::move(text)};
}

// The address line is a URL a client can use: an IPv6 host in brackets.
TEST(ServeCli, AnIpv6HostIsPrintedInBrackets) {
  const std::string out =
      std::filesystem::temp_directory_path() / ("pagellm_serve_ipv6_" + std::to_string(getpid()));
  const pid_t pid = fork();
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    dup2(open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644), 1);
    dup2(open("/dev/null", O_WRONLY), 2);
    execl(PAGELLM_BINARY, PAGELLM_BINARY, "serve", "--model", test::tiny_demo_model().c_str(),
          "--port", "0", "--host", "::1", static_cast<char*>(nullptr));
    _exit(127);
  }
  std::string text;
  int status = 0;
  bool exited = false;
  for (auto deadline = std::chrono::steady_clock::now() + 30s;
       std::chrono::steady_clock::now() < deadline && text.find('\n') == std::string::npos;
       std::this_thread::sleep_for(20ms)) {
    text = test::read_text_file(out);
    if (waitpid(pid, &status, WNOHANG) == pid) {
      exited = true;
      break;
    }
  }
  if (!exited) {
    kill(pid, SIGKILL);
    waitpid(pid, nullptr, 0);
  }
  std::filesystem::remove(out);
  if (exited && text.find("listening") == std::string::npos) {
    GTEST_SKIP() << "no IPv6 loopback here";
  }
  const std::regex url(R"(listening on http://\[::1\]:(\d+)\n)");
  std::smatch m;
  ASSERT_TRUE(std::regex_search(text, m, url)) << text;
  EXPECT_GT(std::stoi(m[1]), 0);
}

// The start-up log counts full-context sequences in --max-model-len, and a KV budget too
// small for one block is refused with the size of a block.
TEST(ServeCli, KvPoolLogUsesTheServedContextAndTinyBudgetsAreRefused) {
  {
    ServerProcess server({"--max-model-len", "64"});
    ASSERT_GT(server.port(), 0) << server.log();
    // 64 blocks of 16 tokens: 16 sequences of 64 tokens.
    EXPECT_NE(server.log().find("16.0 sequences of the full 64-token context"), std::string::npos)
        << server.log();
  }
  const auto [status, text] = serve_until_exit("--kv-cache-bytes 100");
  EXPECT_EQ(status, 1) << text;
  EXPECT_NE(text.find("--kv-cache-bytes 100 holds no KV block"), std::string::npos) << text;
}

// --cpu-matmul chooses the CPU matmul the start-up log names (auto: AMX where the machine
// has it, unless one sequence runs at a time); amx on a machine without AMX is a start-up
// error that says so.
TEST(ServeCli, CpuMatmulIsChosenAndNamedInTheLog) {
  {
    ServerProcess server({"--backend", "cpu", "--cpu-matmul", "fma"});
    ASSERT_GT(server.port(), 0) << server.log();
    EXPECT_NE(server.log().find("fma matmul"), std::string::npos) << server.log();
  }
  {
    // One sequence at a time: auto takes the path that decodes one row faster.
    ServerProcess server({"--backend", "cpu", "--max-num-seqs", "1"});
    ASSERT_GT(server.port(), 0) << server.log();
    EXPECT_NE(server.log().find("fma matmul"), std::string::npos) << server.log();
  }
  {
    ServerProcess server({"--backend", "cpu"});
    ASSERT_GT(server.port(), 0) << server.log();
    const char* expected = kernels::cpu::amx_matmul_available() ? "AMX matmul" : "fma matmul";
    EXPECT_NE(server.log().find(expected), std::string::npos) << server.log();
  }
  if (kernels::cpu::amx_matmul_available()) {
    ServerProcess server({"--backend", "cpu", "--cpu-matmul", "amx"});
    ASSERT_GT(server.port(), 0) << server.log();
    EXPECT_NE(server.log().find("AMX matmul"), std::string::npos) << server.log();
    return;
  }
  const auto [status, text] = serve_until_exit("--backend cpu --cpu-matmul amx");
  EXPECT_EQ(status, 1) << text;
  EXPECT_NE(text.find("has no AMX"), std::string::npos) << text;
}

// --backend cuda where it cannot run: a usage error in a build without CUDA, a start-up
// error naming the reason in one without a usable GPU.
TEST(ServeCli, CudaBackendWithoutAGpuIsRefusedWithTheReason) {
  if (engine::cuda_device_available()) GTEST_SKIP() << "a GPU is present";
  const testing::TempDemoModel model("pagellm_serve_cuda", engine::demo_model_preset("tiny"));
  const auto [status, text] = serve_until_exit("--backend cuda", model.path());
  if (engine::cuda_backend_built()) {
    EXPECT_EQ(status, 1) << text;
    EXPECT_NE(text.find("no usable CUDA device"), std::string::npos) << text;
  } else {
    EXPECT_EQ(status, 2) << text;
    EXPECT_NE(text.find("no CUDA support"), std::string::npos) << text;
  }
}

}  // namespace
}  // namespace pagellm

// `pagellm bench` end to end: the real binary against the real `pagellm serve` with the
// tiny demo model, checked through the JSON report.

#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "support/server_process.h"

namespace pagellm {
namespace {

using nlohmann::json;
using namespace std::chrono_literals;

struct BenchRun {
  int exit_code = -1;
  std::string output;
  json report;
};

// `pagellm bench` against `server` (anything with a url()) with `flags`.
template <class Server>
BenchRun run_bench(const Server& server, const std::string& flags) {
  const auto path = std::filesystem::temp_directory_path() /
                    ("pagellm_bench_test_" + std::to_string(getpid()) + ".json");
  BenchRun run;
  run.exit_code = test::run_command(std::string(PAGELLM_BINARY) + " bench --url " + server.url() +
                                        " --no-progress --json '" + path.string() + "' " + flags,
                                    run.output);
  run.report = json::parse(test::read_text_file(path), nullptr, false);
  std::filesystem::remove(path);
  return run;
}

// Blocks return to the pool in the step that finishes a request, which may come just
// after the client has its last byte.
int kv_used_blocks_when_idle(const test::ServerProcess& server) {
  auto client = server.client();
  int used = -1;
  for (auto deadline = std::chrono::steady_clock::now() + 5s;
       std::chrono::steady_clock::now() < deadline; std::this_thread::sleep_for(20ms)) {
    auto res = client.Get("/v1/stats");
    if (!res || res->status != 200) continue;
    used = json::parse(res->body)["kv_cache"]["used_blocks"].get<int>();
    if (used == 0) break;
  }
  return used;
}

TEST(BenchTest, SharedPrefixRunCompletesEveryRequestAndReportsTheServerSide) {
  test::ServerProcess server({"--num-kv-blocks", "64"});
  ASSERT_GT(server.port(), 0) << server.log();
  const BenchRun run = run_bench(server,
                                 "--concurrency 4 --num-requests 12 --input-len 32 --output-len 8 "
                                 "--shared-prefix-len 16 --vocab-size 500");
  ASSERT_EQ(run.exit_code, 0) << run.output;
  ASSERT_FALSE(run.report.is_discarded()) << run.output;
  const json& r = run.report;
  EXPECT_EQ(r["completed"], 12);
  EXPECT_EQ(r["failed"], 0);
  EXPECT_EQ(r["total_input_tokens"], 12 * 32);
  EXPECT_EQ(r["total_output_tokens"], 12 * 8);
  EXPECT_EQ(r["max_concurrency"], 4);
  EXPECT_EQ(r["ttft_ms"]["count"], 12);
  EXPECT_GT(r["ttft_ms"]["mean"].get<double>(), 0);
  // One gap between each pair of streamed events: at most one per pair of tokens, fewer
  // when the server sends tokens that were ready together in one event (under load, all
  // eight of a request may come in one), and the requests' own gaps together.
  EXPECT_LE(r["itl_ms"]["count"].get<int>(), 12 * 7);
  size_t gaps = 0;
  for (const json& q : r["requests"])
    gaps += q["itl_s"].size();
  EXPECT_EQ(r["itl_ms"]["count"].get<size_t>(), gaps);
  EXPECT_EQ(r["tpot_ms"]["count"], 12);
  EXPECT_GT(r["output_throughput"].get<double>(), 0);
  ASSERT_TRUE(r["server"].is_object()) << run.output;
  // The first prompt fills the prefix; later ones find its one full block.
  EXPECT_GT(r["server"]["prefix_cache_hit_rate"].get<double>(), 0);
  // Sampled every 100 ms: a run this short may end between two samples.
  EXPECT_GE(r["server"]["peak_kv_cache_usage"].get<double>(), 0);
  EXPECT_LE(r["server"]["peak_kv_cache_usage"].get<double>(), 1);
  EXPECT_EQ(r["server"]["preemptions"], 0);
  ASSERT_EQ(r["requests"].size(), 12u);
  for (const json& q : r["requests"]) {
    EXPECT_TRUE(q["ok"].get<bool>());
    EXPECT_EQ(q["output_tokens"], 8);
  }
  EXPECT_NE(run.output.find("Successful requests:                     12"), std::string::npos)
      << run.output;
  EXPECT_NE(run.output.find("Prefix cache hit rate (%):"), std::string::npos);
  EXPECT_EQ(kv_used_blocks_when_idle(server), 0);
}

TEST(BenchTest, OpenLoopPoissonArrivalsWithoutSharedPrefix) {
  test::ServerProcess server({"--num-kv-blocks", "64"});
  ASSERT_GT(server.port(), 0) << server.log();
  const BenchRun run = run_bench(server,
                                 "--request-rate 50 --burstiness 0.5 --num-requests 10 "
                                 "--input-len 20 --output-len 4 --range-ratio 0.2 --seed 3");
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_EQ(run.report["completed"], 10);
  EXPECT_EQ(run.report["request_rate"], 50.0);
  EXPECT_EQ(kv_used_blocks_when_idle(server), 0);
}

// An OpenAI-style server that streams each completion and says "Keep-Alive", but closes
// the connection when the next request arrives on it, unanswered: the race a client
// reusing a connection meets when the server drops it (llama.cpp's server closes every
// connection after a streamed response). Anything else gets a 404. One connection at a
// time.
class ClosingServer {
 public:
  // Each completion streams `text_events` events of one token, then waits `done_delay`
  // before its usage and [DONE].
  explicit ClosingServer(int text_events = 4,
                         std::chrono::milliseconds done_delay = std::chrono::milliseconds(0))
      : text_events_(text_events), done_delay_(done_delay) {
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof addr;
    if (bind(fd_, reinterpret_cast<sockaddr*>(&addr), len) != 0 || listen(fd_, 16) != 0 ||
        getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len) != 0)
      return;
    port_ = ntohs(addr.sin_port);
    thread_ = std::thread([this] { serve(); });
  }
  ~ClosingServer() {
    stop_ = true;
    shutdown(fd_, SHUT_RDWR);
    close(fd_);
    if (thread_.joinable()) thread_.join();
  }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_); }
  int port() const { return port_; }
  int completions() const { return completions_; }

 private:
  void serve() {
    std::vector<std::thread> connections;
    while (!stop_) {
      const int c = accept(fd_, nullptr, nullptr);
      if (c >= 0) connections.emplace_back([this, c] { answer(c); });
    }
    for (auto& t : connections)
      t.join();
  }

  void answer(int c) {
    // One request: headers, then Content-Length bytes of body.
    std::string in;
    char buf[4096];
    size_t body_at = std::string::npos, need = 0;
    while (true) {
      const ssize_t n = read(c, buf, sizeof buf);
      if (n <= 0) break;
      in.append(buf, n);
      if (body_at == std::string::npos && (body_at = in.find("\r\n\r\n")) != std::string::npos) {
        body_at += 4;
        const size_t cl = in.find("Content-Length: ");
        need = cl != std::string::npos && cl < body_at ? std::stoul(in.substr(cl + 16)) : 0;
      }
      if (body_at != std::string::npos && in.size() >= body_at + need) break;
    }
    std::string out;
    if (in.rfind("POST /v1/completions ", 0) == 0) {
      ++completions_;
      std::string events;
      for (int i = 0; i < text_events_; ++i)
        events += "data: {\"choices\":[{\"index\":0,\"text\":\" t\"}]}\n\n";
      const std::string end =
          "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":8,\"completion_tokens\":" +
          std::to_string(text_events_) + "}}\n\ndata: [DONE]\n\n";
      auto chunk = [](const std::string& data) {
        char size[16];
        std::snprintf(size, sizeof size, "%zx", data.size());
        return std::string(size) + "\r\n" + data + "\r\n";
      };
      out =
          "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
          "Transfer-Encoding: chunked\r\nKeep-Alive: timeout=5, max=100\r\n\r\n";
      if (done_delay_.count() > 0) {
        send_all(c, out + chunk(events));
        std::this_thread::sleep_for(done_delay_);
        out = chunk(end) + "0\r\n\r\n";
      } else {
        out += chunk(events + end) + "0\r\n\r\n";
      }
    } else {
      out = "HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nKeep-Alive: timeout=5\r\n\r\n";
    }
    send_all(c, out);
    (void)read(c, buf, sizeof buf);  // the client's next request, or its close
    close(c);
  }

  static void send_all(int c, const std::string& out) {
    for (size_t sent = 0; sent < out.size();) {
      const ssize_t n = write(c, out.data() + sent, out.size() - sent);
      if (n <= 0) break;
      sent += n;
    }
  }

  const int text_events_;
  const std::chrono::milliseconds done_delay_;
  int fd_ = -1, port_ = 0;
  std::atomic<bool> stop_{false};
  std::atomic<int> completions_{0};
  std::thread thread_;
};

// A request that meets a connection the server has closed goes again on a new one: no
// request fails, and none is answered twice.
TEST(BenchTest, ConnectionsTheServerClosesAreReopened) {
  ClosingServer server;
  ASSERT_GT(server.port(), 0);
  const BenchRun run = run_bench(server,
                                 "--model fake --concurrency 1 --num-requests 8 --input-len 8 "
                                 "--output-len 4 --warmup 2");
  EXPECT_EQ(run.exit_code, 0) << run.output;
  ASSERT_FALSE(run.report.is_discarded()) << run.output;
  EXPECT_EQ(run.report["completed"], 8) << run.report["errors"].dump();
  EXPECT_EQ(run.report["failed"], 0) << run.report["errors"].dump();
  EXPECT_EQ(server.completions(), 10);  // 2 warm-up + 8, each sent once
  // Four events of text a request, in one read: three gaps each, however short.
  EXPECT_EQ(run.report["itl_ms"]["count"], 8 * 3);
}

// A stream that ends without any text has no first token to time: it fails, as in vLLM,
// instead of counting with a TTFT of 0.
TEST(BenchTest, AStreamWithoutTextFails) {
  ClosingServer server(/*text_events=*/0);
  ASSERT_GT(server.port(), 0);
  const BenchRun run = run_bench(server,
                                 "--model fake --concurrency 1 --num-requests 3 --input-len 8 "
                                 "--output-len 4");
  EXPECT_EQ(run.exit_code, 1) << run.output;
  ASSERT_FALSE(run.report.is_discarded()) << run.output;
  EXPECT_EQ(run.report["completed"], 0) << run.report.dump();
  EXPECT_EQ(run.report["failed"], 3);
  EXPECT_TRUE(run.report["errors"].contains("no streamed tokens")) << run.report["errors"].dump();
}

// A request's latency ends at its last token, as vLLM counts it, not when the server
// gets round to closing the stream (here 400 ms after the text).
TEST(BenchTest, LatencyEndsAtTheLastToken) {
  ClosingServer server(/*text_events=*/4, std::chrono::milliseconds(400));
  ASSERT_GT(server.port(), 0);
  const BenchRun run = run_bench(server,
                                 "--model fake --concurrency 1 --num-requests 2 --input-len 8 "
                                 "--output-len 4");
  EXPECT_EQ(run.exit_code, 0) << run.output;
  ASSERT_FALSE(run.report.is_discarded()) << run.output;
  EXPECT_EQ(run.report["completed"], 2) << run.report["errors"].dump();
  EXPECT_LT(run.report["e2el_ms"]["max"].get<double>(), 300) << run.report["e2el_ms"].dump();
  EXPECT_LT(run.report["tpot_ms"]["max"].get<double>(), 100) << run.report["tpot_ms"].dump();
}

TEST(BenchTest, FailedRequestsAreCountedWithTheirErrorAndExitNonZero) {
  // 64 blocks of 16 tokens: a 2,000-token prompt never fits, and the server says 400.
  test::ServerProcess server({"--num-kv-blocks", "64"});
  ASSERT_GT(server.port(), 0) << server.log();
  const BenchRun run =
      run_bench(server, "--num-requests 3 --input-len 2000 --output-len 4 --warmup 2");
  EXPECT_EQ(run.exit_code, 1) << run.output;
  // Failed warm-up requests are reported, not counted in the run.
  EXPECT_NE(run.output.find("warning: 2 of 2 warm-up requests failed (first: HTTP 400: "),
            std::string::npos)
      << run.output;
  ASSERT_FALSE(run.report.is_discarded()) << run.output;
  EXPECT_EQ(run.report["failed"], 3);
  EXPECT_EQ(run.report["completed"], 0);
  ASSERT_EQ(run.report["errors"].size(), 1u) << run.report["errors"].dump();
  EXPECT_EQ(run.report["errors"].begin().key().rfind("HTTP 400: ", 0), 0u)
      << run.report["errors"].dump();
  EXPECT_EQ(run.report["requests"][0]["http_status"], 400);
  EXPECT_NE(run.output.find("Failed requests:                         3"), std::string::npos);
}

// --timeout bounds the whole request, not only each silence between two chunks.
// Two requests of the tiny model together stream 500 tokens each in some 40 ms on a
// two-core machine, as fast as a 0.05 s deadline; 2,000 take some 250 ms, 25 times a
// deadline of 0.01 s.
TEST(BenchTest, RequestsLongerThanTheTimeoutFail) {
  test::ServerProcess server({"--num-kv-blocks", "160"});
  ASSERT_GT(server.port(), 0) << server.log();
  const BenchRun run =
      run_bench(server, "--num-requests 2 --input-len 8 --output-len 2000 --timeout 0.01");
  EXPECT_EQ(run.exit_code, 1) << run.output;
  ASSERT_FALSE(run.report.is_discarded()) << run.output;
  EXPECT_EQ(run.report["failed"], 2) << run.report.dump();
  EXPECT_TRUE(run.report["errors"].contains("timed out after 0.01 s"))
      << run.report["errors"].dump();
  EXPECT_EQ(kv_used_blocks_when_idle(server), 0);
}

TEST(BenchTest, ChatEndpointAndAnApiKey) {
  test::ServerProcess server({"--num-kv-blocks", "64", "--api-key", "k1"});
  ASSERT_GT(server.port(), 0) << server.log();
  const BenchRun denied = run_bench(server, "--num-requests 1 --endpoint chat --api-key wrong");
  EXPECT_NE(denied.exit_code, 0) << denied.output;
  const BenchRun run = run_bench(server,
                                 "--num-requests 4 --concurrency 2 --endpoint chat --input-len 16 "
                                 "--output-len 6 --api-key k1");
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_EQ(run.report["completed"], 4);
  EXPECT_EQ(run.report["total_output_tokens"], 4 * 6);
}

TEST(BenchTest, DatasetPromptsWithWarmupCountOnlyTheMeasuredRequests) {
  test::ServerProcess server({"--num-kv-blocks", "64"});
  ASSERT_GT(server.port(), 0) << server.log();
  const auto dataset = std::filesystem::temp_directory_path() /
                       ("pagellm_bench_dataset_" + std::to_string(getpid()) + ".jsonl");
  {
    std::ofstream out(dataset);
    out << R"({"prompt": "The quick brown fox"})"
        << "\n"
        << R"({"prompt": "jumps over the lazy dog"})"
        << "\n";
  }
  const BenchRun run = run_bench(
      server, "--dataset '" + dataset.string() + "' --num-requests 5 --warmup 2 --output-len 3");
  std::filesystem::remove(dataset);
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_EQ(run.report["num_requests"], 5);
  EXPECT_EQ(run.report["completed"], 5);
  EXPECT_EQ(run.report["total_output_tokens"], 5 * 3);
  // Text prompts are counted by the server's usage.
  EXPECT_GT(run.report["total_input_tokens"].get<int>(), 5);
}

TEST(BenchTest, UsageErrorsExitTwo) {
  std::string output;
  EXPECT_EQ(test::run_command(std::string(PAGELLM_BINARY) + " bench", output), 2);
  EXPECT_NE(output.find("--url"), std::string::npos) << output;
  EXPECT_EQ(
      test::run_command(
          std::string(PAGELLM_BINARY) + " bench --url http://127.0.0.1:1 --endpoint grpc", output),
      2);
  EXPECT_EQ(test::run_command(std::string(PAGELLM_BINARY) +
                                  " bench --url http://127.0.0.1:1 --input-len 8 "
                                  "--shared-prefix-len 9",
                              output),
            2)
      << output;
  // Integers past an int are refused, not wrapped (4294967296 requests would be 0).
  for (const char* flag : {"--num-requests 4294967296", "--concurrency 4294967297",
                           "--output-len 4294967298", "--warmup 2147483648"}) {
    EXPECT_EQ(test::run_command(
                  std::string(PAGELLM_BINARY) + " bench --url http://127.0.0.1:1 --model m " + flag,
                  output),
              2)
        << flag << ": " << output;
  }
  for (const char* timeout : {"0", "inf", "nan"}) {
    EXPECT_EQ(test::run_command(std::string(PAGELLM_BINARY) +
                                    " bench --url http://127.0.0.1:1 --timeout " + timeout,
                                output),
              2)
        << timeout << ": " << output;
  }
  // Random-prompt shapes do not combine with a dataset (checked before it is read).
  EXPECT_EQ(test::run_command(std::string(PAGELLM_BINARY) +
                                  " bench --url http://127.0.0.1:1 --dataset /nonexistent.jsonl "
                                  "--input-len 8",
                              output),
            2)
      << output;
  EXPECT_NE(output.find("--input-len shapes random prompts"), std::string::npos) << output;
}

}  // namespace
}  // namespace pagellm

// /dashboard in headless Chromium while three users load the server: the page's grid and
// cards follow the pool during the load and after it. A screenshot taken during the
// load lands in the build folder as dashboard.png. Skipped where Chromium is not installed.

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "support/server_process.h"

namespace pagellm {
namespace {

using nlohmann::json;
using namespace std::chrono_literals;

std::string chromium_binary() {
  for (const char* name : {"chromium", "chromium-browser"}) {
    if (std::system(("command -v " + std::string(name) + " > /dev/null 2>&1").c_str()) == 0)
      return name;
  }
  return "";
}

// One headless Chromium run with a fresh profile; `action` is --dump-dom or --screenshot=...
// The virtual time budget lets the page's 500 ms polls run a few times before the dump.
std::string run_chromium(const std::string& chromium, const std::string& action,
                         const std::string& url) {
  const auto profile =
      std::filesystem::temp_directory_path() / ("pagellm_chromium_" + std::to_string(getpid()));
  std::filesystem::create_directories(profile);
  const std::string dom_file = profile.string() + ".html";
  const std::string command =
      "timeout 90 " + chromium +
      " --headless --no-sandbox --disable-gpu --disable-quic --no-first-run"
      " --disable-background-networking --disable-component-update --disable-sync"
      " --user-data-dir='" +
      profile.string() + "' --window-size=1000,900 --virtual-time-budget=1600 " + action + " '" +
      url + "' > '" + dom_file + "' 2> /dev/null";
  const int status = std::system(command.c_str());
  std::string dom = test::read_text_file(dom_file);
  std::error_code ignored;
  std::filesystem::remove_all(profile, ignored);
  std::filesystem::remove(dom_file, ignored);
  EXPECT_EQ(status, 0) << command;
  return dom;
}

// A number the page writes into an element: <b id="count-used">12</b>.
int counter(const std::string& dom, const std::string& id) {
  std::smatch m;
  if (!std::regex_search(dom, m, std::regex("id=\"" + id + "\">(\\d+)<"))) return -1;
  return std::stoi(m[1]);
}

// Polls a chart has drawn: <canvas ... id="occupancy" ... data-points="3">.
int chart_points(const std::string& dom, const std::string& id) {
  std::smatch m;
  if (!std::regex_search(dom, m, std::regex("id=\"" + id + "\"[^>]*data-points=\"(\\d+)\""))) {
    return -1;
  }
  return std::stoi(m[1]);
}

int card_value(const std::string& dom, const std::string& label) {
  std::smatch m;
  if (!std::regex_search(dom, m, std::regex(label + "<b>(-?\\d+)"))) return -1;
  return std::stoi(m[1]);
}

json stats(const test::ServerProcess& server) {
  auto res = server.client().Get("/v1/stats");
  return res && res->status == 200 ? json::parse(res->body) : json();
}

TEST(DashboardTest, GridAndCardsFollowThePoolDuringAndAfterALoad) {
  const std::string chromium = chromium_binary();
  if (chromium.empty()) GTEST_SKIP() << "chromium not found (Debian package chromium)";
  test::ServerProcess server({"--num-kv-blocks", "64"});
  ASSERT_GT(server.port(), 0) << server.log();
  const std::string page = server.url() + "/dashboard";

  // The load: three users, one shared system prompt, 200, 230 and 260 tokens a request,
  // until the browser has looked (a load of fixed size could end first on a busy machine).
  // Requests of one length would finish in one step and leave the engine empty until the
  // next three come: some 2% of the time on an idle machine, more on a busy one.
  const std::string shared =
      "You are a helpful assistant. Answer briefly, in plain words, and never make up "
      "facts. The quick brown fox jumps over the lazy dog.";
  std::atomic<bool> stop{false};
  std::atomic<int> completed{0}, failed{0};
  std::vector<std::thread> users;
  for (int u = 0; u < 3; ++u) {
    users.emplace_back([&, u] {
      httplib::Client client = server.client();
      client.set_read_timeout(120s);
      for (int i = 0; !stop; ++i) {
        const json body = {{"prompt", shared + " User " + std::to_string(u) + ", question " +
                                          std::to_string(i) + "?"},
                           {"max_tokens", 200 + 30 * u},
                           {"ignore_eos", true},
                           {"temperature", 0}};
        auto res = client.Post("/v1/completions", body.dump(), "application/json");
        ++(res && res->status == 200 ? completed : failed);
      }
    });
  }
  for (auto deadline = std::chrono::steady_clock::now() + 20s;
       std::chrono::steady_clock::now() < deadline; std::this_thread::sleep_for(20ms)) {
    const json s = stats(server);
    if (s.is_object() && s["num_requests_running"].get<int>() > 0) break;
  }

  const auto screenshot = std::filesystem::path(PAGELLM_BINARY).parent_path() / "dashboard.png";
  std::filesystem::remove(screenshot);
  const auto started = std::chrono::steady_clock::now();
  run_chromium(chromium, "--screenshot='" + screenshot.string() + "'", page);
  // Under --virtual-time-budget the page's polls, 500 ms apart in its own clock, can come
  // milliseconds apart in real time: an attempt may then see no engine step end between
  // its first and last poll, and a rate of 0; its last poll may fall between two
  // requests of each user. A few attempts while the load runs.
  std::string busy;
  for (int attempt = 0; attempt < 4; ++attempt) {
    busy = run_chromium(chromium, "--dump-dom", page);
    if (card_value(busy, "tokens/s") > 0 && card_value(busy, "running") > 0) break;
  }
  const double browser_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  stop = true;
  for (auto& user : users)
    user.join();
  EXPECT_EQ(failed, 0);
  EXPECT_GT(completed, 0);

  // During the load: blocks in use on the grid, requests running, a token rate, and the
  // charts drawn from several polls.
  EXPECT_GT(card_value(busy, "running"), 0) << "the browser took " << browser_s << " s\n" << busy;
  EXPECT_GT(counter(busy, "count-used") + counter(busy, "count-shared"), 0) << busy;
  EXPECT_EQ(counter(busy, "count-used") + counter(busy, "count-shared") +
                counter(busy, "count-cached") + counter(busy, "count-free"),
            64)
      << busy;
  EXPECT_GT(card_value(busy, "tokens/s"), 0) << busy;
  EXPECT_NE(busy.find("64 blocks of 16 tokens"), std::string::npos) << busy;
  for (const char* chart : {"occupancy", "requests", "rate"}) {
    EXPECT_GT(chart_points(busy, chart), 1) << chart << "\n" << busy;
  }

  // After it: nothing in use, the shared prefix's blocks stay cached-free, in the page and
  // in the block map of /v1/stats. (The counts drop as each request ends; the map is
  // redrawn at the end of the engine's step, a moment later.)
  for (auto deadline = std::chrono::steady_clock::now() + 10s;
       std::chrono::steady_clock::now() < deadline; std::this_thread::sleep_for(20ms)) {
    const json s = stats(server);
    if (s["kv_cache"]["used_blocks"] == 0 &&
        s["block_map"].get<std::string>().find_first_of("us") == std::string::npos)
      break;
  }
  const json after = stats(server);
  const std::string map = after["block_map"].get<std::string>();
  EXPECT_EQ(static_cast<int>(map.size()), after["kv_cache"]["total_blocks"].get<int>());
  EXPECT_EQ(map.find_first_of("us"), std::string::npos) << map;
  EXPECT_NE(map.find('c'), std::string::npos) << map;
  const std::string idle = run_chromium(chromium, "--dump-dom", page);
  EXPECT_EQ(counter(idle, "count-used"), 0) << idle;
  EXPECT_EQ(counter(idle, "count-shared"), 0) << idle;
  EXPECT_GT(counter(idle, "count-cached"), 0) << idle;
  EXPECT_EQ(card_value(idle, "running"), 0) << idle;

  ASSERT_TRUE(std::filesystem::exists(screenshot));
  EXPECT_EQ(test::read_text_file(screenshot).substr(1, 3), "PNG");
}

}  // namespace
}  // namespace pagellm

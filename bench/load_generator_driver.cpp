// The HTTP side of `pagellm bench`: streaming requests, the worker pool that paces them,
// and the /metrics scrapes around and during the run.

#include <httplib.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <thread>

#include "bench/load_generator.h"

namespace pagellm::bench {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

namespace {

struct Target {
  std::string host_url;  // scheme://host:port
  std::string prefix;    // a path before /v1, without the trailing slash
};

Target parse_url(const std::string& url) {
  const size_t scheme = url.find("://");
  if (scheme == std::string::npos || url.compare(0, scheme, "http") != 0)
    throw std::invalid_argument("--url must start with http://, not '" + url + "'");
  const size_t path = url.find('/', scheme + 3);
  Target t;
  t.host_url = url.substr(0, path);
  if (path != std::string::npos) t.prefix = url.substr(path);
  while (!t.prefix.empty() && t.prefix.back() == '/')
    t.prefix.pop_back();
  // Accept a base URL that already names the API version.
  if (t.prefix.size() >= 3 && t.prefix.compare(t.prefix.size() - 3, 3, "/v1") == 0)
    t.prefix.resize(t.prefix.size() - 3);
  return t;
}

// Read and write timeouts of `seconds`, fractions included.
void set_io_timeouts(httplib::Client& client, double seconds) {
  const auto timeout =
      std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::duration<double>(seconds));
  client.set_read_timeout(timeout);
  client.set_write_timeout(timeout);
}

httplib::Client make_client(const Target& target, const BenchOptions& o) {
  httplib::Client client(target.host_url);
  client.set_connection_timeout(10, 0);
  set_io_timeouts(client, o.timeout_s);
  client.set_keep_alive(true);
  // Without it, Nagle holds the request body back until the headers are acknowledged,
  // which a delayed ACK turns into tens of milliseconds of false TTFT.
  client.set_tcp_nodelay(true);
  if (!o.api_key.empty()) client.set_default_headers({{"Authorization", "Bearer " + o.api_key}});
  return client;
}

std::string error_message(int status, const std::string& body) {
  std::string message = body.substr(0, 300);
  const json parsed = json::parse(body, nullptr, false);
  if (!parsed.is_discarded() && parsed.is_object() && parsed.contains("error")) {
    const json& e = parsed["error"];
    if (e.is_object() && e.contains("message") && e["message"].is_string())
      message = e["message"].get<std::string>();
    else if (e.is_string())
      message = e.get<std::string>();
  }
  return "HTTP " + std::to_string(status) + ": " + message;
}

std::string request_body(const BenchOptions& o, const std::string& model, const BenchRequest& r) {
  json body;
  body["model"] = model;
  body["max_tokens"] = r.output_len;
  body["ignore_eos"] = true;
  body["temperature"] = 0;
  body["stream"] = true;
  body["stream_options"] = {{"include_usage", true}};
  if (o.endpoint == Endpoint::kChat) {
    std::string text = r.prompt_text;
    if (text.empty()) {
      // Chat takes text only: a random prompt is sent as its token ids in words, so the
      // length in tokens is approximate there.
      for (int32_t t : r.prompt_tokens)
        text += (text.empty() ? "" : " ") + std::to_string(t);
    }
    body["messages"] = json::array({{{"role", "user"}, {"content", text}}});
  } else if (!r.prompt_tokens.empty()) {
    body["prompt"] = r.prompt_tokens;
  } else {
    body["prompt"] = r.prompt_text;
  }
  return body.dump();
}

// Sends one streaming request and times its chunks.
RequestResult send_request(httplib::Client& client, const Target& target, const BenchOptions& o,
                           const std::string& model, const BenchRequest& r, Clock::time_point t0) {
  RequestResult result;
  result.input_tokens = r.input_len;
  const std::string path =
      target.prefix + (o.endpoint == Endpoint::kChat ? "/v1/chat/completions" : "/v1/completions");
  httplib::Request req;
  req.method = "POST";
  req.path = path;
  req.body = request_body(o, model, r);
  req.set_header("Content-Type", "application/json");
  req.set_header("Accept", "text/event-stream");

  SseParser parser;
  std::vector<std::string> events;
  std::string raw;  // the body, for error responses
  int chunks = 0;
  std::optional<int> usage_output, usage_input;
  std::string stream_error;
  bool done = false;
  bool timed_out = false;
  const auto start = Clock::now();
  // The read timeout bounds each silence; this bounds the whole request.
  const auto deadline = start + std::chrono::duration_cast<Clock::duration>(
                                    std::chrono::duration<double>(o.timeout_s));
  auto last = start;
  result.start_s = std::chrono::duration<double>(start - t0).count();
  req.response_handler = [&](const httplib::Response& res) {
    result.http_status = res.status;
    return true;
  };
  req.content_receiver = [&](const char* data, size_t len, uint64_t, uint64_t) {
    const auto now = Clock::now();
    if (now > deadline) {
      timed_out = true;
      return false;
    }
    if (result.http_status != 200) {
      if (raw.size() < 4096) raw.append(data, len);
      return true;
    }
    events.clear();
    parser.feed(std::string_view(data, len), events);
    for (const std::string& e : events) {
      if (e == "[DONE]") {
        done = true;
        continue;
      }
      const json chunk = json::parse(e, nullptr, false);
      if (chunk.is_discarded() || !chunk.is_object()) continue;
      if (chunk.contains("error")) {
        stream_error = error_message(result.http_status, e);
        continue;
      }
      if (chunk.contains("usage") && chunk["usage"].is_object()) {
        const json& u = chunk["usage"];
        if (u.contains("completion_tokens") && u["completion_tokens"].is_number())
          usage_output = u["completion_tokens"].get<int>();
        if (u.contains("prompt_tokens") && u["prompt_tokens"].is_number())
          usage_input = u["prompt_tokens"].get<int>();
      }
      if (!chunk_has_output(chunk)) continue;
      if (chunks == 0) {
        result.ttft_s = std::chrono::duration<double>(now - start).count();
      } else {
        result.itl_s.push_back(std::chrono::duration<double>(now - last).count());
      }
      last = now;
      ++chunks;
    }
    return true;
  };
  auto res = client.send(req);
  // A connection kept from an earlier request may have been closed by the server in the
  // meantime (llama.cpp's server closes one after each streamed response, although it
  // says Keep-Alive): the request then fails before any byte of an answer. It goes once
  // more, on a new connection; its times count from the first try.
  if (!res && (res.error() == httplib::Error::Read || res.error() == httplib::Error::Write) &&
      result.http_status == 0 && raw.empty() && chunks == 0 && !timed_out &&
      Clock::now() < deadline)
    res = client.send(req);
  const double elapsed = std::chrono::duration<double>(Clock::now() - start).count();
  // A stream that went quiet before the deadline ends only at the read timeout.
  if (elapsed > o.timeout_s) timed_out = true;
  // The latency ends at the last token, as vLLM counts it, not when the server closes
  // the stream.
  result.e2e_s = chunks > 0 ? std::chrono::duration<double>(last - start).count() : elapsed;
  if (timed_out) {
    char text[64];
    std::snprintf(text, sizeof text, "timed out after %g s", o.timeout_s);
    result.error = text;
    return result;
  }
  if (!res) {
    result.error = "connection: " + httplib::to_string(res.error());
    return result;
  }
  result.http_status = res->status;
  if (res->status != 200) {
    result.error = error_message(res->status, raw);
    return result;
  }
  if (!stream_error.empty()) {
    result.error = stream_error;
    return result;
  }
  if (!done) {
    result.error = "stream ended without [DONE]";
    return result;
  }
  if (chunks == 0) {  // no first token to time (vLLM fails these too)
    result.error = "no streamed tokens";
    return result;
  }
  result.output_tokens = usage_output.value_or(chunks);
  if (usage_input) result.input_tokens = *usage_input;
  result.ok = true;
  return result;
}

std::optional<ServerMetricsSample> scrape(httplib::Client& client, const Target& target) {
  auto res = client.Get(target.prefix + "/metrics");
  if (!res || res->status != 200) return std::nullopt;
  ServerMetricsSample s = parse_prometheus_metrics(res->body);
  if (!s.present) return std::nullopt;
  return s;
}

std::string first_model(httplib::Client& client, const Target& target) {
  auto res = client.Get(target.prefix + "/v1/models");
  if (!res)
    throw std::runtime_error("cannot reach " + target.host_url + ": " +
                             httplib::to_string(res.error()));
  if (res->status != 200)
    throw std::runtime_error("GET /v1/models: " + error_message(res->status, res->body));
  const json models = json::parse(res->body, nullptr, false);
  if (models.is_discarded() || !models.contains("data") || !models["data"].is_array() ||
      models["data"].empty() || !models["data"][0].contains("id"))
    throw std::runtime_error("GET /v1/models returned no model; pass --model");
  return models["data"][0]["id"].get<std::string>();
}

void draw_progress(bool tty, int done, int failed, int total, double elapsed, double kv) {
  const int width = 30;
  const int filled = total > 0 ? done * width / total : width;
  std::string bar(filled, '#');
  bar.resize(width, ' ');
  char kv_text[32] = "";
  if (kv >= 0) std::snprintf(kv_text, sizeof kv_text, "  KV %5.1f%%", kv * 100);
  std::fprintf(stderr, "%s[%s] %d/%d  %d failed  %.1fs%s%s", tty ? "\r" : "", bar.c_str(), done,
               total, failed, elapsed, kv_text, tty ? "" : "\n");
  std::fflush(stderr);
}

// Runs `requests` with at most `workers` in flight, each sent no earlier than its arrival.
std::vector<RequestResult> drive(const Target& target, const BenchOptions& o,
                                 const std::string& model,
                                 const std::vector<BenchRequest>& requests,
                                 const std::vector<double>& arrivals, int workers,
                                 Clock::time_point t0, std::atomic<int>& done,
                                 std::atomic<int>& failed) {
  std::vector<RequestResult> results(requests.size());
  std::atomic<size_t> next{0};
  std::vector<std::thread> threads;
  for (int w = 0; w < workers; ++w) {
    threads.emplace_back([&] {
      httplib::Client client = make_client(target, o);
      for (size_t i; (i = next.fetch_add(1)) < requests.size();) {
        std::this_thread::sleep_until(t0 + std::chrono::duration_cast<Clock::duration>(
                                               std::chrono::duration<double>(arrivals[i])));
        results[i] = send_request(client, target, o, model, requests[i], t0);
        if (!results[i].ok) failed.fetch_add(1);
        done.fetch_add(1);
      }
    });
  }
  for (auto& t : threads)
    t.join();
  return results;
}

}  // namespace

BenchReport run_benchmark(const BenchOptions& o) {
  // Bad options fail before the server is asked anything.
  const Target target = parse_url(o.url);
  const std::vector<BenchRequest> requests = build_requests(o.workload);
  httplib::Client control = make_client(target, o);
  set_io_timeouts(control, std::max(o.timeout_s, 10.0));  // /v1/models and /metrics
  const std::string model = o.model.empty() ? first_model(control, target) : o.model;

  const int limit = o.concurrency > 0 ? o.concurrency : 1024;
  const int workers = std::max(1, std::min<int>(limit, static_cast<int>(requests.size())));

  if (o.warmup > 0) {
    if (warmup_repeats_run_prompts(o.workload, o.warmup)) {
      std::fprintf(stderr,
                   "warning: the dataset has %zu prompts and the run sends them all: it finds "
                   "the warm-up's in the prefix cache\n",
                   o.workload.dataset_prompts.size());
    }
    const auto warm = build_requests(warmup_workload(o.workload, o.warmup));
    std::atomic<int> d{0}, f{0};
    const std::vector<RequestResult> results =
        drive(target, o, model, warm, std::vector<double>(warm.size(), 0.0),
              std::max(1, std::min<int>(limit, o.warmup)), Clock::now(), d, f);
    if (f.load() > 0) {
      const auto first = std::find_if(results.begin(), results.end(),
                                      [](const RequestResult& r) { return !r.ok; });
      std::fprintf(stderr, "warning: %d of %d warm-up requests failed (first: %s)\n", f.load(),
                   o.warmup, first->error.c_str());
    }
  }

  const std::vector<double> arrivals =
      arrival_times(static_cast<int>(requests.size()), o.request_rate, o.burstiness,
                    stream_seed(o.workload.seed, 2));
  const std::optional<ServerMetricsSample> before = scrape(control, target);

  // A monitor polls /metrics for the peak KV usage and draws the progress.
  std::atomic<int> done{0}, failed{0};
  std::atomic<bool> finished{false};
  double peak_kv = -1;
  const bool tty = isatty(STDERR_FILENO);
  const auto t0 = Clock::now();
  std::thread monitor([&] {
    httplib::Client client = make_client(target, o);
    client.set_read_timeout(5, 0);
    auto last_line = Clock::now();
    double kv = -1;
    while (!finished.load()) {
      if (before) {
        if (auto s = scrape(client, target); s && s->kv_cache_usage) {
          kv = *s->kv_cache_usage;
          peak_kv = std::max(peak_kv, kv);
        }
      }
      const auto now = Clock::now();
      if (o.progress && (tty || now - last_line > std::chrono::seconds(5))) {
        draw_progress(tty, done.load(), failed.load(), static_cast<int>(requests.size()),
                      std::chrono::duration<double>(now - t0).count(), kv);
        last_line = now;
      }
      // Usage is sampled, so a short peak between two polls goes unseen.
      for (int i = 0; i < 4 && !finished.load(); ++i)
        std::this_thread::sleep_for(std::chrono::milliseconds(25));
    }
  });
  std::vector<RequestResult> results =
      drive(target, o, model, requests, arrivals, workers, t0, done, failed);
  const double duration = std::chrono::duration<double>(Clock::now() - t0).count();
  finished = true;
  monitor.join();
  if (o.progress) {
    draw_progress(tty, done.load(), failed.load(), static_cast<int>(requests.size()), duration,
                  peak_kv);
    if (tty) std::fputc('\n', stderr);
  }

  BenchOptions named = o;
  named.model = model;
  BenchReport report = make_report(named, results, duration);
  const std::optional<ServerMetricsSample> after = scrape(control, target);
  if (before && after) {
    report.server_metrics = true;
    if (after->kv_cache_usage) peak_kv = std::max(peak_kv, *after->kv_cache_usage);
    if (peak_kv >= 0) report.peak_kv_cache_usage = peak_kv;
    if (before->prefix_cache_queries && after->prefix_cache_queries && before->prefix_cache_hits &&
        after->prefix_cache_hits) {
      const double queries = *after->prefix_cache_queries - *before->prefix_cache_queries;
      const double hits = *after->prefix_cache_hits - *before->prefix_cache_hits;
      report.prefix_cache_hit_rate = queries > 0 ? hits / queries : 0.0;
    }
    if (before->preemptions && after->preemptions)
      report.preemptions = *after->preemptions - *before->preemptions;
    report.kv_used_blocks_after = after->kv_used_blocks;
  }
  return report;
}

}  // namespace pagellm::bench

#include "bench/load_generator.h"

#include <httplib.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <random>
#include <stdexcept>
#include <thread>

namespace pagellm::bench {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

// ---- workload ----

namespace {

int draw_length(int len, double ratio, std::mt19937_64& rng) {
  if (ratio <= 0) return len;
  const int low = std::max(1, static_cast<int>(std::floor(len * (1 - ratio))));
  const int high = std::max(low, static_cast<int>(std::ceil(len * (1 + ratio))));
  return std::uniform_int_distribution<int>(low, high)(rng);
}

}  // namespace

std::vector<BenchRequest> build_requests(const WorkloadOptions& o) {
  if (o.num_requests < 0) throw std::invalid_argument("the number of requests is negative");
  if (o.output_len < 1) throw std::invalid_argument("the output length must be at least 1");
  if (o.range_ratio < 0 || o.range_ratio >= 1)
    throw std::invalid_argument("the range ratio must be in [0, 1)");
  std::mt19937_64 rng(o.seed);
  std::vector<BenchRequest> out(o.num_requests);
  if (!o.dataset_prompts.empty()) {
    for (int i = 0; i < o.num_requests; ++i) {
      out[i].prompt_text = o.dataset_prompts[i % o.dataset_prompts.size()];
      out[i].output_len = draw_length(o.output_len, o.range_ratio, rng);
    }
    return out;
  }
  if (o.input_len < 1) throw std::invalid_argument("the input length must be at least 1");
  if (o.vocab_size <= kFirstPromptTokenId)
    throw std::invalid_argument("the vocabulary size must be above " +
                                std::to_string(kFirstPromptTokenId));
  const int min_input =
      o.range_ratio > 0
          ? std::max(1, static_cast<int>(std::floor(o.input_len * (1 - o.range_ratio))))
          : o.input_len;
  if (o.shared_prefix_len < 0 || o.shared_prefix_len > min_input)
    throw std::invalid_argument("the shared prefix (" + std::to_string(o.shared_prefix_len) +
                                " tokens) must fit in the shortest prompt (" +
                                std::to_string(min_input) + " tokens)");
  std::uniform_int_distribution<int32_t> token(kFirstPromptTokenId, o.vocab_size - 1);
  std::vector<int32_t> prefix(o.shared_prefix_len);
  for (auto& t : prefix)
    t = token(rng);
  for (int i = 0; i < o.num_requests; ++i) {
    BenchRequest& r = out[i];
    r.input_len = draw_length(o.input_len, o.range_ratio, rng);
    r.output_len = draw_length(o.output_len, o.range_ratio, rng);
    r.prompt_tokens = prefix;
    while (static_cast<int>(r.prompt_tokens.size()) < r.input_len)
      r.prompt_tokens.push_back(token(rng));
  }
  return out;
}

std::vector<std::string> read_dataset_prompts(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error("cannot open the dataset " + path);
  std::vector<std::string> prompts;
  std::string line;
  for (int number = 1; std::getline(in, line); ++number) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const json row = json::parse(line, nullptr, false);
    if (row.is_discarded() || !row.is_object() || !row.contains("prompt") ||
        !row["prompt"].is_string())
      throw std::runtime_error(path + ":" + std::to_string(number) +
                               ": expected a JSON object with a string \"prompt\"");
    prompts.push_back(row["prompt"].get<std::string>());
  }
  if (prompts.empty()) throw std::runtime_error("the dataset " + path + " has no prompts");
  return prompts;
}

std::vector<double> arrival_times(int count, double rate, double burstiness, uint64_t seed) {
  std::vector<double> times(std::max(count, 0), 0.0);
  if (!(rate > 0) || std::isinf(rate)) return times;
  if (!(burstiness > 0)) throw std::invalid_argument("the burstiness must be positive");
  std::mt19937_64 rng(seed);
  // Shape k and scale 1 / (rate * k) keep the mean gap at 1 / rate for every k.
  std::gamma_distribution<double> gap(burstiness, 1.0 / (rate * burstiness));
  double t = 0;
  for (int i = 0; i < count; ++i) {
    if (i > 0) t += gap(rng);
    times[i] = t;
  }
  return times;
}

// ---- statistics ----

double percentile(std::vector<double> values, double p) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const double rank = std::clamp(p, 0.0, 100.0) / 100.0 * (values.size() - 1);
  const size_t low = static_cast<size_t>(std::floor(rank));
  const size_t high = std::min(low + 1, values.size() - 1);
  return values[low] + (values[high] - values[low]) * (rank - low);
}

LatencySummary summarize(const std::vector<double>& values) {
  LatencySummary s;
  s.count = values.size();
  if (values.empty()) return s;
  double sum = 0;
  for (double v : values)
    sum += v;
  s.mean = sum / values.size();
  double sq = 0;
  for (double v : values)
    sq += (v - s.mean) * (v - s.mean);
  s.std_dev = std::sqrt(sq / values.size());
  s.median = percentile(values, 50);
  s.p90 = percentile(values, 90);
  s.p99 = percentile(values, 99);
  s.min = *std::min_element(values.begin(), values.end());
  s.max = *std::max_element(values.begin(), values.end());
  return s;
}

// ---- Server-Sent Events ----

void SseParser::feed(std::string_view bytes, std::vector<std::string>& events) {
  for (char c : bytes) {
    if (c == '\n' && last_was_cr_) {  // the second half of "\r\n"
      last_was_cr_ = false;
      continue;
    }
    last_was_cr_ = c == '\r';
    if (c == '\r' || c == '\n') {
      end_line(events);
    } else {
      line_ += c;
    }
  }
}

void SseParser::end_line(std::vector<std::string>& events) {
  if (line_.empty()) {  // a blank line dispatches the event
    if (has_data_) events.push_back(std::move(data_));
    data_.clear();
    has_data_ = false;
    return;
  }
  if (line_[0] != ':') {  // lines starting with ':' are comments
    const size_t colon = line_.find(':');
    const std::string field = line_.substr(0, colon);
    std::string value = colon == std::string::npos ? "" : line_.substr(colon + 1);
    if (!value.empty() && value[0] == ' ') value.erase(0, 1);
    if (field == "data") {
      if (has_data_) data_ += '\n';
      data_ += value;
      has_data_ = true;
    }
  }
  line_.clear();
}

// ---- server metrics ----

ServerMetricsSample parse_prometheus_metrics(std::string_view text) {
  ServerMetricsSample s;
  std::map<std::string, double> sums;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t end = text.find('\n', pos);
    if (end == std::string_view::npos) end = text.size();
    std::string_view line = text.substr(pos, end - pos);
    pos = end + 1;
    if (line.empty() || line[0] == '#') continue;
    const size_t name_end = line.find_first_of("{ ");
    if (name_end == std::string_view::npos) continue;
    std::string_view name = line.substr(0, name_end);
    if (const size_t colon = name.rfind(':'); colon != std::string_view::npos)
      name = name.substr(colon + 1);
    // The value follows the labels; a timestamp may follow the value.
    size_t value_start = name_end;
    if (line[name_end] == '{') {
      value_start = line.rfind('}');
      if (value_start == std::string_view::npos) continue;
      ++value_start;
    }
    const std::string rest(line.substr(value_start));
    char* parsed_end = nullptr;
    const double value = std::strtod(rest.c_str(), &parsed_end);
    if (parsed_end == rest.c_str()) continue;
    sums[std::string(name)] += value;
    s.present = true;
  }
  auto get = [&](const char* name) -> std::optional<double> {
    auto it = sums.find(name);
    if (it == sums.end()) return std::nullopt;
    return it->second;
  };
  s.kv_cache_usage = get("kv_cache_usage_perc");
  if (!s.kv_cache_usage) s.kv_cache_usage = get("gpu_cache_usage_perc");
  s.kv_used_blocks = get("kv_cache_used_blocks");
  s.prefix_cache_queries = get("prefix_cache_queries_total");
  s.prefix_cache_hits = get("prefix_cache_hits_total");
  s.preemptions = get("num_preemptions_total");
  s.requests_running = get("num_requests_running");
  s.requests_waiting = get("num_requests_waiting");
  return s;
}

// ---- driver ----

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

httplib::Client make_client(const Target& target, const BenchOptions& o) {
  httplib::Client client(target.host_url);
  client.set_connection_timeout(10, 0);
  const auto timeout = static_cast<time_t>(o.timeout_s);
  client.set_read_timeout(timeout, 0);
  client.set_write_timeout(timeout, 0);
  client.set_keep_alive(true);
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
  const auto start = Clock::now();
  auto last = start;
  result.start_s = std::chrono::duration<double>(start - t0).count();
  req.response_handler = [&](const httplib::Response& res) {
    result.http_status = res.status;
    return true;
  };
  req.content_receiver = [&](const char* data, size_t len, uint64_t, uint64_t) {
    const auto now = Clock::now();
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
      bool has_content = false;
      if (chunk.contains("choices") && chunk["choices"].is_array()) {
        for (const json& c : chunk["choices"]) {
          if (c.contains("text") && c["text"].is_string() && !c["text"].get<std::string>().empty())
            has_content = true;
          if (c.contains("delta") && c["delta"].is_object()) {
            const json& d = c["delta"];
            if (d.contains("content") && d["content"].is_string() &&
                !d["content"].get<std::string>().empty())
              has_content = true;
          }
        }
      }
      if (!has_content) continue;
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
  result.e2e_s = std::chrono::duration<double>(Clock::now() - start).count();
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
  if (chunks == 0 && usage_output.value_or(0) > 0) {
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
  const std::string model = o.model.empty() ? first_model(control, target) : o.model;

  const int limit = o.concurrency > 0 ? o.concurrency : 1024;
  const int workers = std::max(1, std::min<int>(limit, static_cast<int>(requests.size())));

  if (o.warmup > 0) {
    WorkloadOptions w = o.workload;
    w.num_requests = o.warmup;
    w.seed = o.workload.seed + 1;
    const auto warm = build_requests(w);
    std::atomic<int> d{0}, f{0};
    drive(target, o, model, warm, std::vector<double>(warm.size(), 0.0),
          std::max(1, std::min<int>(limit, o.warmup)), Clock::now(), d, f);
  }

  const std::vector<double> arrivals = arrival_times(
      static_cast<int>(requests.size()), o.request_rate, o.burstiness, o.workload.seed + 2);
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

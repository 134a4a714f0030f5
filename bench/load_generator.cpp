// The pure parts of `pagellm bench`: workload, arrivals, statistics, SSE framing and
// Prometheus parsing.

#include "bench/load_generator.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <numeric>
#include <random>
#include <stdexcept>

namespace pagellm::bench {

using nlohmann::json;

// ---- workload ----

namespace {

// The dataset's prompt indices in the order a workload with `seed` takes them: a
// permutation of the whole file, then another, and so on.
std::vector<size_t> dataset_order(size_t size, size_t count, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<size_t> order;
  order.reserve(count + size);
  std::vector<size_t> perm(size);
  while (order.size() < count) {
    std::iota(perm.begin(), perm.end(), size_t{0});
    std::shuffle(perm.begin(), perm.end(), rng);
    order.insert(order.end(), perm.begin(), perm.end());
  }
  order.resize(count);
  return order;
}

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
    const std::vector<size_t> order =
        dataset_order(o.dataset_prompts.size(), o.num_requests, stream_seed(o.seed, 3));
    for (int i = 0; i < o.num_requests; ++i) {
      out[i].prompt_text = o.dataset_prompts[order[i]];
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

uint64_t stream_seed(uint64_t seed, uint64_t stream) {
  // splitmix64's output function over the seed offset by the stream.
  uint64_t z = seed + (stream + 1) * 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

WorkloadOptions warmup_workload(const WorkloadOptions& run, int count) {
  WorkloadOptions w = run;
  w.num_requests = count;
  w.seed = stream_seed(run.seed, 1);
  const size_t size = run.dataset_prompts.size();
  const size_t used = static_cast<size_t>(std::max(run.num_requests, 0));
  if (size > used) {
    // The prompts after the run's in its order: the run never sends them.
    const std::vector<size_t> order = dataset_order(size, size, stream_seed(run.seed, 3));
    w.dataset_prompts.clear();
    for (size_t i = used; i < size; ++i)
      w.dataset_prompts.push_back(run.dataset_prompts[order[i]]);
  }
  return w;
}

bool warmup_repeats_run_prompts(const WorkloadOptions& run, int count) {
  const size_t size = run.dataset_prompts.size();
  return count > 0 && size > 0 && static_cast<size_t>(std::max(run.num_requests, 0)) >= size;
}

bool chunk_has_output(const nlohmann::json& chunk) {
  auto non_empty = [](const nlohmann::json& object, const char* key) {
    auto it = object.find(key);
    if (it == object.end()) return false;
    if (it->is_string()) return !it->get_ref<const std::string&>().empty();
    return it->is_array() && !it->empty();
  };
  auto choices = chunk.find("choices");
  if (choices == chunk.end() || !choices->is_array()) return false;
  for (const nlohmann::json& c : *choices) {
    if (!c.is_object()) continue;
    if (non_empty(c, "text")) return true;
    auto delta = c.find("delta");
    if (delta == c.end() || !delta->is_object()) continue;
    for (const char* key : {"content", "reasoning", "reasoning_content", "tool_calls"}) {
      if (non_empty(*delta, key)) return true;
    }
  }
  return false;
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
  std::map<std::string, int> label_sets;
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
    ++label_sets[std::string(name)];
    s.present = true;
  }
  auto get = [&](const char* name) -> std::optional<double> {
    auto it = sums.find(name);
    if (it == sums.end()) return std::nullopt;
    return it->second;
  };
  // A share is averaged over its label sets (a data-parallel server's engines, of one
  // size); the counts are summed.
  auto share = [&](const char* name) -> std::optional<double> {
    auto sum = get(name);
    if (sum) *sum /= label_sets[name];
    return sum;
  };
  s.kv_cache_usage = share("kv_cache_usage_perc");
  if (!s.kv_cache_usage) s.kv_cache_usage = share("gpu_cache_usage_perc");
  s.kv_used_blocks = get("kv_cache_used_blocks");
  s.prefix_cache_queries = get("prefix_cache_queries_total");
  s.prefix_cache_hits = get("prefix_cache_hits_total");
  s.preemptions = get("num_preemptions_total");
  s.requests_running = get("num_requests_running");
  s.requests_waiting = get("num_requests_waiting");
  return s;
}

}  // namespace pagellm::bench

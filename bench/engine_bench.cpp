// Aggregate output tokens/s through the whole engine (scheduler, forward, sampling,
// detokenization, streams) with N concurrent requests, on the bench demo model.
//
//   pagellm_engine_bench [--model DIR] [--concurrency 1,8,32] [--prompt-len 64]
//                        [--output-len 64] [--num-kv-blocks 4096] [--json FILE]
// Without --model, the `bench` demo model is written under models/bench (once).

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "bench/bench_model.h"
#include "engine/engine.h"

using namespace pagellm;

namespace {

struct Options {
  std::filesystem::path model;
  std::vector<int> concurrency{1, 8, 32};
  int prompt_len = 64;
  int output_len = 64;
  int64_t num_kv_blocks = 4096;
  std::string json_path;
};

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw std::runtime_error(arg + " needs a value");
      return argv[++i];
    };
    if (arg == "--model") {
      o.model = value();
    } else if (arg == "--concurrency") {
      o.concurrency = bench::parse_int_list(value());
    } else if (arg == "--prompt-len") {
      o.prompt_len = std::stoi(value());
    } else if (arg == "--output-len") {
      o.output_len = std::stoi(value());
    } else if (arg == "--num-kv-blocks") {
      o.num_kv_blocks = std::stoll(value());
    } else if (arg == "--json") {
      o.json_path = value();
    } else {
      throw std::runtime_error("unknown option " + arg);
    }
  }
  return o;
}

struct Row {
  int concurrency;
  double seconds;
  int64_t output_tokens;
  double mean_ttft;
};

}  // namespace

int main(int argc, char** argv) try {
  Options opt = parse(argc, argv);
  opt.model = bench::bench_model_dir(opt.model);
  auto tokenizer =
      std::make_shared<const engine::Tokenizer>(engine::Tokenizer::from_dir(opt.model));
  engine::EngineConfig config;
  config.num_kv_blocks = opt.num_kv_blocks;
  config.scheduler.max_num_seqs = 256;
  config.scheduler.max_num_batched_tokens = 2048;
  config.enable_prefix_caching = false;  // distinct prompts anyway; measure the compute
  engine::Engine engine(engine::LlamaModel::load(opt.model), tokenizer, config);
  std::mt19937 rng(7);
  const int64_t vocab = engine.model_config().vocab_size;

  std::vector<Row> rows;
  for (int n : opt.concurrency) {
    std::vector<std::shared_ptr<engine::RequestStream>> streams;
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < n; ++i) {
      engine::GenerationRequest r;
      r.prompt.resize(opt.prompt_len);
      for (auto& t : r.prompt)
        t = static_cast<int32_t>(rng() % vocab);
      r.params.temperature = 0;
      r.params.max_tokens = opt.output_len;
      r.params.ignore_eos = true;
      auto submitted = engine.submit(r);
      if (!submitted.ok()) throw std::runtime_error(submitted.message);
      streams.push_back(submitted.stream);
    }
    int64_t tokens = 0;
    double ttft = 0;
    for (auto& s : streams) {
      const engine::GenerationChunk all = s->collect();
      tokens += all.usage.completion_tokens;
      ttft += all.times.first_token - all.times.arrival;
    }
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    rows.push_back({n, seconds, tokens, ttft / n});
  }

  std::printf("engine throughput: %s, prompts of %d tokens, %d output tokens each (greedy)\n\n",
              opt.model.c_str(), opt.prompt_len, opt.output_len);
  std::printf("%-12s %14s %12s %16s\n", "concurrency", "output tok/s", "seconds", "mean TTFT (ms)");
  for (const Row& r : rows) {
    std::printf("%-12d %14.1f %12.2f %16.1f\n", r.concurrency, r.output_tokens / r.seconds,
                r.seconds, 1000 * r.mean_ttft);
  }
  if (!opt.json_path.empty()) {
    FILE* f = std::fopen(opt.json_path.c_str(), "w");
    if (f == nullptr) throw std::runtime_error("cannot write " + opt.json_path);
    std::fprintf(f, "[");
    for (size_t i = 0; i < rows.size(); ++i) {
      std::fprintf(f, "%s{\"concurrency\": %d, \"output_tokens_per_s\": %.3f, \"seconds\": %.4f}",
                   i ? ", " : "", rows[i].concurrency, rows[i].output_tokens / rows[i].seconds,
                   rows[i].seconds);
    }
    std::fprintf(f, "]\n");
    std::fclose(f);
  }
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "pagellm_engine_bench: %s\n", e.what());
  return 1;
}

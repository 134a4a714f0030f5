// Forward-pass throughput of a model on this machine, next to the memory roofline.
//
// In one run: the copy bandwidth; decode tokens/s at several batch sizes (every sequence
// decoding one token per step through the paged KV cache); prefill tokens/s for one
// prompt. Decode at small batch is memory-bound: each step reads every weight byte once
// plus the batch's KV, so the roofline is bandwidth / bytes read per step, times batch.
// On the CPU the bandwidth of each decode figure is measured around and between its own
// steps (median of 5 samples), since a shared machine's bandwidth drifts within seconds.
//
//   pagellm_model_bench [--model DIR] [--batches 1,8,16,32] [--context 128]
//                       [--steps 32] [--prefill 512 (0: none)] [--json FILE]
//                       [--backend cpu|cuda] [--shape llama3-8b] [--no-graphs]
//                       [--sampling greedy|top-p|penalized] [--cpu-matmul auto|amx|fma]
// Without --model, the `bench` demo model is written under models/bench (once).
// --sampling: how each decode step picks its tokens, on the backend as the engine has it
// do: greedy (the argmax), top-p (temperature 0.8, top_p 0.95, a random draw per row) or
// penalized (top-p after repetition 1.1 and frequency 0.2 penalties, from an engine
// Sampler per sequence that has seen its prompt and the tokens drawn; the sequences are
// fed random tokens, so the lists grow as they would).
// --cpu-matmul: the CPU's bf16 matmul path (auto: AMX where the CPU has it; unlike
// `pagellm serve`, whatever the batch sizes).
// --backend cuda runs on the GPU (builds with CUDA), measuring the GPU's copy
// bandwidth; --shape llama3-8b there builds a model of Llama 3 8B's shape with random
// bf16 weights on the device instead of loading one.

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "bench/bench_model.h"
#include "bench/memory_bandwidth.h"
#include "engine/backend.h"
#include "engine/forward_batch_builder.h"
#include "engine/kv_cache_memory.h"
#include "engine/llama_model.h"
#include "engine/sampler.h"
#include "paging/kv_cache_manager.h"

#if PAGELLM_HAVE_CUDA
#include "bench/cuda_bandwidth.h"
#include "engine/cuda/cuda_backend.h"
#endif

using namespace pagellm;

namespace {

struct Options {
  std::filesystem::path model;
  std::vector<int> batches{1, 8, 16, 32};
  int context = 128;  // prompt tokens of each decoding sequence
  int steps = 32;     // timed decode steps per batch size
  int prefill = 512;
  std::string json_path;
  std::string backend = "cpu";
  std::string shape;  // a random model of a known shape (CUDA)
  bool graphs = true;
  std::string sampling = "greedy";
  std::string cpu_matmul = "auto";
};

constexpr const char* kUsage =
    "usage: pagellm_model_bench [--model DIR] [--batches 1,8,16,32] [--context 128]\n"
    "                           [--steps 32] [--prefill 512 (0: none)] [--json FILE]\n"
    "                           [--backend cpu|cuda] [--shape llama3-8b] [--no-graphs]\n"
    "                           [--sampling greedy|top-p|penalized]\n"
    "                           [--cpu-matmul auto|amx|fma]\n";

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
    } else if (arg == "--batches") {
      o.batches = bench::parse_int_list(value());
    } else if (arg == "--context") {
      o.context = std::stoi(value());
    } else if (arg == "--steps") {
      o.steps = std::stoi(value());
    } else if (arg == "--prefill") {
      o.prefill = std::stoi(value());
    } else if (arg == "--json") {
      o.json_path = value();
    } else if (arg == "--backend") {
      o.backend = value();
    } else if (arg == "--shape") {
      o.shape = value();
    } else if (arg == "--no-graphs") {
      o.graphs = false;
    } else if (arg == "--sampling") {
      o.sampling = value();
      if (o.sampling != "greedy" && o.sampling != "top-p" && o.sampling != "penalized") {
        throw std::runtime_error("--sampling must be greedy, top-p or penalized");
      }
    } else if (arg == "--cpu-matmul") {
      o.cpu_matmul = value();
      if (!engine::known_cpu_matmul(o.cpu_matmul)) {
        throw std::runtime_error("--cpu-matmul must be auto, amx or fma");
      }
    } else if (arg == "--help" || arg == "-h") {
      std::fputs(kUsage, stdout);
      std::exit(0);
    } else {
      throw std::runtime_error("unknown option " + arg + " (--help lists them)");
    }
  }
  return o;
}

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

// Llama 3 8B's config.json, for --shape llama3-8b.
engine::ModelConfig llama3_8b_shape() {
  engine::ModelConfig c;
  c.architecture = engine::Architecture::kLlama;
  c.vocab_size = 128256;
  c.hidden_size = 4096;
  c.intermediate_size = 14336;
  c.num_layers = 32;
  c.num_heads = 32;
  c.num_kv_heads = 8;
  c.head_dim = 128;
  c.rms_norm_eps = 1e-5;
  c.rope_theta = 500000.0;
  c.max_position_embeddings = 8192;
  c.dtype = kernels::DType::kBF16;
  c.eos_token_ids = {128001};
  return c;
}

struct Loaded {
  std::unique_ptr<engine::Backend> backend;
  double bandwidth_gbs = 0;
  std::unique_ptr<bench::CopyBandwidth> copy;  // CPU: to sample the bandwidth again
  std::string name;
};

Loaded load(const Options& opt, int max_batch, int max_tokens) {
  Loaded l;
  if (opt.backend == "cpu") {
    if (!opt.shape.empty()) throw std::runtime_error("--shape needs --backend cuda");
    l.name = bench::bench_model_dir(opt.model).string();
    l.copy = std::make_unique<bench::CopyBandwidth>();
    l.bandwidth_gbs = l.copy->measure();
    engine::select_cpu_matmul(opt.cpu_matmul);
    l.backend = engine::make_cpu_backend(engine::LlamaModel::load(l.name));
    return l;
  }
  if (opt.backend != "cuda") throw std::runtime_error("--backend must be cpu or cuda");
#if PAGELLM_HAVE_CUDA
  if (!engine::cuda_device_available()) throw std::runtime_error("no usable CUDA device here");
  engine::BackendOptions o;
  o.kind = "cuda";
  o.max_num_seqs = max_batch;
  o.max_num_batched_tokens = max_tokens;
  o.max_model_len = max_tokens;
  o.cuda_graphs = opt.graphs;
  l.bandwidth_gbs = bench::measure_cuda_copy_bandwidth();
  if (opt.shape == "llama3-8b") {
    l.name = "random weights of Llama 3 8B's shape";
    l.backend = engine::make_random_cuda_backend(llama3_8b_shape(), kernels::DType::kBF16, 1, o);
  } else if (opt.shape.empty()) {
    l.name = bench::bench_model_dir(opt.model).string();
    l.backend = engine::make_cuda_backend(l.name, o);
  } else {
    throw std::runtime_error("unknown --shape '" + opt.shape + "' (llama3-8b)");
  }
  return l;
#else
  throw std::runtime_error("this build has no CUDA backend");
#endif
}

struct DecodeResult {
  int batch;
  double tokens_per_s;
  double bytes_per_step;
  double bandwidth_gbs;  // the copy bandwidth while this batch ran
  double roofline_tokens_per_s;
};

}  // namespace

int main(int argc, char** argv) try {
  const Options opt = parse(argc, argv);
  const int max_batch = *std::max_element(opt.batches.begin(), opt.batches.end());
  const int max_tokens = std::max(opt.context + opt.steps + 8, opt.prefill);
  Loaded loaded = load(opt, max_batch, max_tokens);
  engine::Backend* model = loaded.backend.get();
  const double bandwidth = loaded.bandwidth_gbs;
  const engine::ModelConfig& config = model->config();
  const kernels::DType kv_dtype = engine::default_kv_dtype(config);
  const int64_t num_blocks = int64_t(max_batch) * paging::blocks_for_tokens(max_tokens) + 64;
  paging::KVCacheManager kv(static_cast<int32_t>(num_blocks), /*enable_prefix_caching=*/false);
  model->allocate_kv_cache(num_blocks, kv_dtype);
  std::mt19937 rng(1);
  std::uniform_int_distribution<int32_t> token(0, static_cast<int32_t>(config.vocab_size) - 1);

  std::printf("backend: %s, %s\n", std::string(model->name()).c_str(),
              model->device_description().c_str());
  std::printf("model: %s (%s, %lld layers, hidden %lld, %lld/%lld heads of %lld, vocab %lld)\n",
              loaded.name.c_str(), engine::architecture_name(config.architecture),
              (long long)config.num_layers, (long long)config.hidden_size,
              (long long)config.num_heads, (long long)config.num_kv_heads,
              (long long)config.head_dim, (long long)config.vocab_size);
  std::printf("weights read per step: %.1f MB (%s); KV cache %s\n",
              model->weight_bytes_per_step() / 1e6, kernels::dtype_name(config.dtype),
              kernels::dtype_name(kv_dtype));
  std::printf("copy bandwidth (read + write) at start: %.1f GB/s\n", bandwidth);
  // How --sampling picks the decode tokens (every sequence alike).
  scheduler::SamplingParams params;
  params.temperature = 0.8f;
  params.top_p = 0.95f;
  if (opt.sampling == "penalized") {
    params.repetition_penalty = 1.1f;
    params.frequency_penalty = 0.2f;
  }
  if (opt.sampling == "greedy") {
    std::printf("sampling: greedy (argmax)\n\n");
  } else {
    std::printf("sampling: temperature %g, top_p %g, repetition %g, frequency %g\n\n",
                params.temperature, params.top_p, params.repetition_penalty,
                params.frequency_penalty);
  }

  engine::ForwardBatch batch;
  engine::ForwardOutput out;
  std::vector<DecodeResult> decode;
  paging::SeqId next_id = 0;
  for (int b : opt.batches) {
    // Prefill `b` prompts of `context` tokens, then time `steps` decode steps.
    std::vector<paging::SeqId> ids;
    std::vector<std::vector<int32_t>> tokens(b);
    std::vector<engine::ScheduledChunk> chunks;
    std::vector<engine::Sampler> samplers;
    for (int s = 0; s < b; ++s) {
      ids.push_back(next_id++);
      for (int i = 0; i < opt.context; ++i)
        tokens[s].push_back(token(rng));
      kv.add_sequence(ids[s], paging::PrefixMatch{}, opt.context);
      chunks.push_back({ids[s], tokens[s], 0, opt.context, true});
      engine::build_forward_batch(chunks, kv, {}, batch);
      model->forward(batch, out);
      chunks.clear();
      samplers.emplace_back(params, tokens[s], next_id);
    }
    auto decode_step = [&]() {
      chunks.clear();
      for (int s = 0; s < b; ++s) {
        tokens[s].push_back(token(rng));
        kv.allocate_slots(ids[s], 1);
        chunks.push_back({ids[s], tokens[s], static_cast<int32_t>(tokens[s].size()) - 1, 1, true});
      }
      engine::build_forward_batch(chunks, kv, {}, batch);
      batch.host_logits.assign(batch.logit_rows.size(), 0);  // the backend picks the tokens
      if (opt.sampling != "greedy") {
        for (engine::Sampler& sampler : samplers)
          sampler.append_backend_row(batch);  // as Engine::step fills the rows
        engine::drop_unused_row_fields(batch);
      }
      model->forward(batch, out);
      if (opt.sampling == "penalized") {
        for (int s = 0; s < b; ++s)
          samplers[s].observe(out.sampled[s]);
      }
    };
    // Warm-up: on CUDA the first step of a batch size runs eagerly and the second
    // captures its graph.
    for (int w = 0; w < 3; ++w)
      decode_step();
    // The bandwidth is sampled before, between quarters of, and after the timed steps.
    constexpr int kSamples = 5;
    std::vector<double> step_seconds, bandwidth_samples;
    const auto sample_bandwidth = [&] {
      if (loaded.copy) bandwidth_samples.push_back(loaded.copy->measure(3));
    };
    sample_bandwidth();
    for (int step = 0; step < opt.steps; ++step) {
      const auto start = std::chrono::steady_clock::now();
      decode_step();
      step_seconds.push_back(seconds_since(start));
      if ((step + 1) % std::max(1, opt.steps / (kSamples - 1)) == 0 &&
          static_cast<int>(bandwidth_samples.size()) < kSamples - 1)
        sample_bandwidth();
    }
    sample_bandwidth();
    const double batch_bandwidth =
        bandwidth_samples.empty() ? bandwidth : median(bandwidth_samples);
    // KV bytes read in a step: every cached token of every sequence, at mid-run length.
    const double mid_context = opt.context + 3 + opt.steps / 2.0;
    const double bytes =
        model->weight_bytes_per_step() + b * mid_context * config.kv_bytes_per_token(kv_dtype);
    decode.push_back(
        {b, b / median(step_seconds), bytes, batch_bandwidth, batch_bandwidth * 1e9 / bytes * b});
    for (paging::SeqId id : ids)
      kv.free_sequence(id);
  }

  // Prefill: one prompt in a single chunk, best of three (--prefill 0: none).
  double prefill_best = 0;
  for (int rep = 0; rep < 3 && opt.prefill > 0; ++rep) {
    std::vector<int32_t> prompt(opt.prefill);
    for (auto& t : prompt)
      t = token(rng);
    const paging::SeqId id = next_id++;
    kv.add_sequence(id, paging::PrefixMatch{}, opt.prefill);
    const engine::ScheduledChunk chunk{id, prompt, 0, opt.prefill, true};
    engine::build_forward_batch({&chunk, 1}, kv, {}, batch);
    const auto start = std::chrono::steady_clock::now();
    model->forward(batch, out);
    prefill_best = std::max(prefill_best, opt.prefill / seconds_since(start));
    kv.free_sequence(id);
  }

  std::printf("%-22s %12s %16s %10s %14s %10s\n", "decode", "tokens/s", "MB read/step", "GB/s",
              "roofline t/s", "of roof");
  for (const DecodeResult& d : decode) {
    std::printf("batch %-16d %12.1f %16.1f %10.1f %14.1f %9.1f%%\n", d.batch, d.tokens_per_s,
                d.bytes_per_step / 1e6, d.bandwidth_gbs, d.roofline_tokens_per_s,
                100 * d.tokens_per_s / d.roofline_tokens_per_s);
  }
  if (opt.prefill > 0)
    std::printf("\nprefill, %d-token prompt: %.1f tokens/s\n", opt.prefill, prefill_best);

  if (!opt.json_path.empty()) {
    FILE* f = std::fopen(opt.json_path.c_str(), "w");
    if (f == nullptr) throw std::runtime_error("cannot write " + opt.json_path);
    std::fprintf(f,
                 "{\"copy_bandwidth_gbs\": %.3f, \"sampling\": \"%s\", \"prefill_tokens\": %d, "
                 "\"prefill_tokens_per_s\": %.3f, \"decode\": [",
                 bandwidth, opt.sampling.c_str(), opt.prefill, prefill_best);
    for (size_t i = 0; i < decode.size(); ++i) {
      std::fprintf(f,
                   "%s{\"batch\": %d, \"tokens_per_s\": %.3f, \"bytes_per_step\": %.0f, "
                   "\"copy_bandwidth_gbs\": %.3f, \"roofline_tokens_per_s\": %.3f}",
                   i ? ", " : "", decode[i].batch, decode[i].tokens_per_s, decode[i].bytes_per_step,
                   decode[i].bandwidth_gbs, decode[i].roofline_tokens_per_s);
    }
    std::fprintf(f, "]}\n");
    std::fclose(f);
  }
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "pagellm_model_bench: %s\n", e.what());
  return 1;
}

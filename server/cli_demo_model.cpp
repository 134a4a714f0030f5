// `pagellm demo-model`: writes a Hugging Face model directory with random weights and
// a small trained tokenizer, to serve, test and benchmark without a download.

#include <chrono>
#include <cstdio>
#include <exception>
#include <limits>
#include <string>

#include "engine/demo_model.h"
#include "server/cli.h"
#include "server/cli_args.h"

namespace pagellm::cli {
namespace {

constexpr const char* kUsage =
    "usage: pagellm demo-model DIR [--preset tiny|small|bench] [--arch llama|mistral|qwen2|qwen3]\n"
    "                              [--dtype bf16|f16|f32] [--seed N]\n"
    "\n"
    "Writes config.json, model.safetensors (random weights), tokenizer.json,\n"
    "tokenizer_config.json (ChatML template) and generation_config.json into DIR.\n"
    "\n"
    "  --preset  tiny: 2 layers, hidden 64, vocab 512 (tests)\n"
    "            small: 4 layers, hidden 256, vocab 4096 (default)\n"
    "            bench: 12 layers, hidden 768, vocab 32000, 124.7M parameters\n"
    "  --arch    llama (default), mistral (sliding window), qwen2 (q/k/v bias),\n"
    "            qwen3 (q/k norm)\n"
    "  --dtype   weight type: bf16 (default), f16, f32\n"
    "  --seed    random seed of the weights (default 0); same seed, same bytes\n";

kernels::DType parse_dtype(const std::string& name) {
  if (name == "bf16" || name == "bfloat16") return kernels::DType::kBF16;
  if (name == "f16" || name == "float16") return kernels::DType::kF16;
  if (name == "f32" || name == "float32") return kernels::DType::kF32;
  throw UsageError("--dtype must be bf16, f16 or f32, not '" + name + "'");
}

uint64_t parse_seed(const std::string& text) {
  size_t used = 0;
  unsigned long long value = 0;
  try {
    value = std::stoull(text, &used, 10);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != text.size() || text[0] == '-') {
    throw UsageError("--seed must be a non-negative integer, not '" + text + "'");
  }
  return value;
}

}  // namespace

int run_demo_model(Args args) {
  engine::DemoModelSpec spec;
  std::string dir;
  std::string preset_name;
  try {
    ArgReader reader(args, {"--preset", "--arch", "--dtype", "--seed"}, {});
    if (reader.help()) {
      std::fputs(kUsage, stdout);
      return 0;
    }
    if (reader.positional().size() != 1) {
      throw UsageError(reader.positional().empty()
                           ? "missing the output directory DIR"
                           : "expected one directory, got " +
                                 std::to_string(reader.positional().size()));
    }
    dir = reader.positional().front();
    preset_name = reader.option("--preset").value_or("small");
    engine::Architecture arch = engine::Architecture::kLlama;
    if (auto name = reader.option("--arch")) {
      auto parsed = engine::parse_architecture_name(*name);
      if (!parsed)
        throw UsageError("--arch must be llama, mistral, qwen2 or qwen3, not '" + *name + "'");
      arch = *parsed;
    }
    try {
      spec = engine::demo_model_preset(preset_name, arch);
    } catch (const std::invalid_argument& e) {
      throw UsageError(e.what());
    }
    if (auto dtype = reader.option("--dtype")) spec.dtype = parse_dtype(*dtype);
    if (auto seed = reader.option("--seed")) spec.seed = parse_seed(*seed);
  } catch (const UsageError& e) {
    std::fprintf(stderr, "pagellm demo-model: %s\n\n%s", e.what(), kUsage);
    return 2;
  }

  const auto start = std::chrono::steady_clock::now();
  try {
    engine::write_demo_model(dir, spec);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "pagellm demo-model: %s\n", e.what());
    return 1;
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const int64_t params = engine::demo_model_num_parameters(spec);
  std::printf("wrote %s: preset %s, %s, %lld parameters (%.1fM), %s weights, seed %llu, %.2f s\n",
              dir.c_str(), preset_name.c_str(), engine::architecture_name(spec.architecture),
              static_cast<long long>(params), params / 1e6, kernels::dtype_name(spec.dtype),
              static_cast<unsigned long long>(spec.seed), seconds);
  return 0;
}

}  // namespace pagellm::cli

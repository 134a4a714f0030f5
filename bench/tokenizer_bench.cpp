// Tokenizer speed: loading Llama 3's tokenizer.json, and encoding 100 KB of English
// (the license texts in /usr/share/common-licenses), with a warm and a cold word cache;
// and Qwen3's NFC on long runs of combining marks.
// The tokenizer files come from $PAGELLM_TEST_DATA or the shared data folder.

#include <benchmark/benchmark.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "engine/incremental_detokenizer.h"
#include "engine/tokenizer.h"

namespace {

using pagellm::engine::IncrementalDetokenizer;
using pagellm::engine::TokenId;
using pagellm::engine::Tokenizer;

constexpr size_t kTextBytes = 100 * 1024;

std::filesystem::path model_dir(const std::string& model) {
  const char* env = std::getenv("PAGELLM_TEST_DATA");
  const std::filesystem::path root = env != nullptr && *env != '\0' ? env : PAGELLM_TEST_DATA_DIR;
  return root / "tokenizers" / model;
}

bool have_model(benchmark::State& state, const std::string& model) {
  if (std::filesystem::exists(model_dir(model) / "tokenizer.json")) return true;
  state.SkipWithError(("no tokenizer at " + model_dir(model).string() +
                       " (set PAGELLM_TEST_DATA to the shared data folder)")
                          .c_str());
  return false;
}

// 100 KB of English: license texts, concatenated (and repeated if need be).
const std::string& english_text() {
  static const std::string text = [] {
    const char* names[] = {"GPL-3",    "Apache-2.0", "LGPL-3", "MPL-2.0",
                           "GFDL-1.3", "Artistic",   "BSD"};
    std::string all;
    for (int round = 0; round < 4 && all.size() < kTextBytes; ++round) {
      for (const char* name : names) {
        std::ifstream in(std::filesystem::path("/usr/share/common-licenses") / name,
                         std::ios::binary);
        if (!in) continue;
        std::ostringstream content;
        content << in.rdbuf();
        all += content.str();
        if (all.size() >= kTextBytes) break;
      }
    }
    if (all.size() > kTextBytes) all.resize(kTextBytes);
    return all;
  }();
  return text;
}

bool have_text(benchmark::State& state) {
  if (english_text().size() == kTextBytes) return true;
  state.SkipWithError("/usr/share/common-licenses is missing or too small for 100 KB of text");
  return false;
}

const Tokenizer& shared_tokenizer(const std::string& model) {
  static std::map<std::string, Tokenizer> loaded;
  auto it = loaded.find(model);
  if (it == loaded.end()) it = loaded.emplace(model, Tokenizer::from_dir(model_dir(model))).first;
  return it->second;
}

void BM_Load(benchmark::State& state, const std::string& model) {
  if (!have_model(state, model)) return;
  for (auto _ : state) {
    Tokenizer tokenizer = Tokenizer::from_dir(model_dir(model));
    benchmark::DoNotOptimize(tokenizer.vocab_size());
  }
}

// Steady state of a server: frequent words are in the tokenizer's cache.
void BM_Encode100KB(benchmark::State& state, const std::string& model) {
  if (!have_model(state, model) || !have_text(state)) return;
  const Tokenizer& tokenizer = shared_tokenizer(model);
  size_t tokens = 0;
  for (auto _ : state) {
    auto ids = tokenizer.encode(english_text());
    tokens = ids.size();
    benchmark::DoNotOptimize(ids.data());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * english_text().size()));
  state.counters["tokens"] = static_cast<double>(tokens);
}

// Each iteration on a freshly loaded tokenizer (load not timed): an empty cache.
void BM_Encode100KBColdCache(benchmark::State& state, const std::string& model) {
  if (!have_model(state, model) || !have_text(state)) return;
  for (auto _ : state) {
    state.PauseTiming();
    Tokenizer tokenizer = Tokenizer::from_dir(model_dir(model));
    state.ResumeTiming();
    auto ids = tokenizer.encode(english_text());
    benchmark::DoNotOptimize(ids.data());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * english_text().size()));
}

void BM_Decode100KB(benchmark::State& state, const std::string& model) {
  if (!have_model(state, model) || !have_text(state)) return;
  const Tokenizer& tokenizer = shared_tokenizer(model);
  const auto ids = tokenizer.encode(english_text());
  for (auto _ : state) {
    auto text = tokenizer.decode(ids);
    benchmark::DoNotOptimize(text.data());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * english_text().size()));
}

// Per-token cost of streaming detokenization (what the engine pays per generated token).
void BM_IncrementalDetokenize(benchmark::State& state, const std::string& model) {
  if (!have_model(state, model) || !have_text(state)) return;
  const Tokenizer& tokenizer = shared_tokenizer(model);
  const auto ids = tokenizer.encode(english_text());
  for (auto _ : state) {
    IncrementalDetokenizer detok(tokenizer);
    size_t bytes = 0;
    for (TokenId id : ids)
      bytes += detok.add(id).size();
    bytes += detok.finish().size();
    benchmark::DoNotOptimize(bytes);
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations() * ids.size()));
}

// A letter and a run of 2 x N combining marks in the reverse of their canonical order
// (N acutes, then N dots below): what NFC (Qwen3's normalizer) must reorder.
void BM_EncodeCombiningMarks(benchmark::State& state, const std::string& model) {
  if (!have_model(state, model)) return;
  const Tokenizer& tokenizer = shared_tokenizer(model);
  std::string text = "a";
  for (int64_t i = 0; i < state.range(0); ++i)
    text += "\u0301";
  for (int64_t i = 0; i < state.range(0); ++i)
    text += "\u0323";
  for (auto _ : state) {
    auto ids = tokenizer.encode(text);
    benchmark::DoNotOptimize(ids.data());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * text.size()));
}

BENCHMARK_CAPTURE(BM_Load, llama3, std::string("llama3"))
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK_CAPTURE(BM_Load, qwen3, std::string("qwen3"))
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK_CAPTURE(BM_Encode100KB, llama3, std::string("llama3"))->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Encode100KB, qwen3, std::string("qwen3"))->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Encode100KBColdCache, llama3, std::string("llama3"))
    ->Unit(benchmark::kMillisecond)
    ->Iterations(5);
BENCHMARK_CAPTURE(BM_Decode100KB, llama3, std::string("llama3"))->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_IncrementalDetokenize, llama3, std::string("llama3"))
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_EncodeCombiningMarks, qwen3, std::string("qwen3"))
    ->Unit(benchmark::kMillisecond)
    ->Arg(1000)
    ->Arg(4000)
    ->Arg(16000);

}  // namespace

BENCHMARK_MAIN();

// Reading tool calls out of a streamed reply: a reply fed in 4-byte pieces, as tokens
// arrive, for replies of 16 KB to 1 MB. The time per byte should not grow with the
// length: plain text, a Hermes call whose arguments are full of '<' (HTML in a
// write_file call), and a Llama 3 reply held whole until its end.

#include <benchmark/benchmark.h>

#include <string>

#include "server/tool_call_parser.h"

namespace {

using pagellm::server::ToolCallFormat;
using pagellm::server::ToolCallStream;

std::string filler(size_t bytes, const std::string& unit) {
  std::string out;
  while (out.size() < bytes)
    out += unit;
  out.resize(bytes);
  return out;
}

void feed_in_pieces(benchmark::State& state, ToolCallFormat format, const std::string& reply,
                    int expected_calls) {
  int calls = 0;
  for (auto _ : state) {
    ToolCallStream stream(format);
    for (size_t at = 0; at < reply.size(); at += 4)
      benchmark::DoNotOptimize(stream.feed(std::string_view(reply).substr(at, 4)));
    benchmark::DoNotOptimize(stream.finish());
    calls += stream.calls();
  }
  if (calls != expected_calls * static_cast<int>(state.iterations())) {
    state.SkipWithError("the reply did not give the calls it holds");
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * reply.size()));
}

void BM_PlainText(benchmark::State& state) {
  const std::string reply = filler(state.range(0), "The weather in Paris is <b>sunny</b>. ");
  feed_in_pieces(state, ToolCallFormat::kHermes, reply, 0);
}

void BM_HermesCallWithMarkup(benchmark::State& state) {
  const std::string reply = "<tool_call>\n{\"name\": \"write_file\", \"arguments\": {\"text\": \"" +
                            filler(state.range(0), "<p><a href='x'>y</a></p>") +
                            "\"}}\n</tool_call>";
  feed_in_pieces(state, ToolCallFormat::kHermes, reply, 1);
}

void BM_Llama3Call(benchmark::State& state) {
  const std::string reply = "{\"name\": \"write_file\", \"parameters\": {\"text\": \"" +
                            filler(state.range(0), "<p>text</p>") + "\"}}";
  feed_in_pieces(state, ToolCallFormat::kLlama3Json, reply, 1);
}

BENCHMARK(BM_PlainText)->RangeMultiplier(4)->Range(16 << 10, 1 << 20);
BENCHMARK(BM_HermesCallWithMarkup)->RangeMultiplier(4)->Range(16 << 10, 1 << 20);
BENCHMARK(BM_Llama3Call)->RangeMultiplier(4)->Range(16 << 10, 1 << 20);

}  // namespace

BENCHMARK_MAIN();

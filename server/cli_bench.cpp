// `pagellm bench`: load an OpenAI-compatible server and report latency and throughput
// as seen by the client, with what the server's /metrics said over the run.

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <fstream>
#include <limits>
#include <string>

#include "bench/load_generator.h"
#include "server/cli.h"
#include "server/cli_args.h"

namespace pagellm::cli {
namespace {

constexpr const char* kUsage =
    "usage: pagellm bench --url URL [--concurrency N] [--num-requests N] [--request-rate R]\n"
    "                     [--input-len L] [--output-len L] [--shared-prefix-len P] [--json FILE]\n"
    "                     [--model NAME] [--endpoint completions|chat] [--api-key KEY]\n"
    "                     [--burstiness B] [--range-ratio X] [--dataset FILE.jsonl]\n"
    "                     [--warmup N] [--seed S] [--vocab-size V] [--timeout S] [--no-progress]\n"
    "\n"
    "Streams every request and times each token from the client side.\n"
    "\n"
    "  --url                server base URL, e.g. http://127.0.0.1:8000\n"
    "  --concurrency        requests in flight at most (default: all, up to 1024)\n"
    "  --num-requests       measured requests (default 100)\n"
    "  --request-rate       arrivals per second (default inf: all at once)\n"
    "  --burstiness         gamma shape of the gaps: 1 Poisson (default), <1 burstier\n"
    "  --input-len          prompt tokens (default 128), sent as token ids to /v1/completions\n"
    "  --output-len         generated tokens (default 64); ignore_eos is set\n"
    "  --range-ratio        lengths uniform in [L*(1-X), L*(1+X)] (default 0)\n"
    "  --shared-prefix-len  tokens every prompt starts with (default 0)\n"
    "  --dataset            JSONL file whose lines have a \"prompt\" string, taken in an\n"
    "                       order of --seed (instead of --input-len and the prefix)\n"
    "  --endpoint           completions (default) or chat (text prompts)\n"
    "  --model              model name (default: the first of /v1/models)\n"
    "  --api-key            bearer key (default: $PAGELLM_API_KEY, then $OPENAI_API_KEY)\n"
    "  --warmup             requests sent and not measured before the run (default 0)\n"
    "  --seed               seed of prompts and arrivals (default 0); a second run with\n"
    "                       one seed finds its prompts in the server's prefix cache\n"
    "  --vocab-size         random prompt ids are drawn below this (default 500)\n"
    "  --timeout            seconds a request may take before it fails (default 600)\n"
    "  --json               write the report with every request to FILE\n"
    "\n"
    "Exits 1 when any request failed.\n";

double parse_number(const std::string& name, const std::string& text) {
  const std::optional<double> value = whole_number(text);  // "inf" included
  if (!value || !(*value >= 0))
    throw UsageError(name + " must be a non-negative number, not '" + text + "'");
  return *value;
}

}  // namespace

int run_bench(Args args) {
  bench::BenchOptions o;
  std::string json_path;
  try {
    ArgReader reader(args,
                     {"--url", "--concurrency", "--num-requests", "--request-rate", "--input-len",
                      "--output-len", "--shared-prefix-len", "--json", "--model", "--endpoint",
                      "--api-key", "--burstiness", "--range-ratio", "--dataset", "--warmup",
                      "--seed", "--vocab-size", "--timeout"},
                     {"--no-progress"});
    if (reader.help()) {
      std::fputs(kUsage, stdout);
      return 0;
    }
    if (!reader.positional().empty())
      throw UsageError("unexpected argument '" + reader.positional().front() + "'");
    o.url = reader.required_option("--url");
    // Counts and lengths are ints; the seed takes any non-negative long long.
    auto integer = [&](const char* name, long long fallback, long long min,
                       long long max = std::numeric_limits<int32_t>::max()) {
      auto v = reader.option(name);
      return v ? integer_in(name, *v, min, max) : fallback;
    };
    o.concurrency = static_cast<int>(integer("--concurrency", 0, 1));
    o.workload.num_requests = static_cast<int>(integer("--num-requests", 100, 1));
    o.workload.input_len = static_cast<int>(integer("--input-len", 128, 1));
    o.workload.output_len = static_cast<int>(integer("--output-len", 64, 1));
    o.workload.shared_prefix_len = static_cast<int>(integer("--shared-prefix-len", 0, 0));
    o.workload.vocab_size =
        static_cast<int>(integer("--vocab-size", 500, bench::kFirstPromptTokenId + 1));
    o.workload.seed =
        static_cast<uint64_t>(integer("--seed", 0, 0, std::numeric_limits<long long>::max()));
    o.warmup = static_cast<int>(integer("--warmup", 0, 0));
    if (auto v = reader.option("--request-rate")) {
      o.request_rate = parse_number("--request-rate", *v);
      if (o.request_rate == 0) throw UsageError("--request-rate must be above 0");
    }
    if (auto v = reader.option("--burstiness")) {
      o.burstiness = parse_number("--burstiness", *v);
      if (!(o.burstiness > 0) || std::isinf(o.burstiness))
        throw UsageError("--burstiness must be a positive number");
    }
    if (auto v = reader.option("--range-ratio")) {
      o.workload.range_ratio = parse_number("--range-ratio", *v);
      if (o.workload.range_ratio >= 1) throw UsageError("--range-ratio must be below 1");
    }
    if (auto v = reader.option("--timeout")) {
      o.timeout_s = parse_number("--timeout", *v);
      if (!(o.timeout_s > 0) || !(o.timeout_s <= 1e6))
        throw UsageError("--timeout must be above 0 and at most 1000000 seconds");
    }
    if (auto v = reader.option("--endpoint")) {
      if (*v == "completions")
        o.endpoint = bench::Endpoint::kCompletions;
      else if (*v == "chat")
        o.endpoint = bench::Endpoint::kChat;
      else
        throw UsageError("--endpoint must be completions or chat, not '" + *v + "'");
    }
    o.model = reader.option("--model").value_or("");
    if (auto v = reader.option("--api-key")) {
      o.api_key = *v;
    } else if (const char* env = std::getenv("PAGELLM_API_KEY"); env && *env) {
      o.api_key = env;
    } else if (const char* openai = std::getenv("OPENAI_API_KEY"); openai && *openai) {
      o.api_key = openai;
    }
    o.progress = !reader.flag("--no-progress");
    json_path = reader.option("--json").value_or("");
    if (auto dataset = reader.option("--dataset")) {
      for (const char* random_only : {"--input-len", "--shared-prefix-len", "--vocab-size"}) {
        if (reader.option(random_only))
          throw UsageError(std::string(random_only) + " shapes random prompts; it does not " +
                           "apply with --dataset");
      }
      o.workload.dataset_prompts = bench::read_dataset_prompts(*dataset);
    }
  } catch (const UsageError& e) {
    std::fprintf(stderr, "pagellm bench: %s\n\n%s", e.what(), kUsage);
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "pagellm bench: %s\n", e.what());
    return 2;
  }

  bench::BenchReport report;
  try {
    report = bench::run_benchmark(o);
  } catch (const std::invalid_argument& e) {
    std::fprintf(stderr, "pagellm bench: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "pagellm bench: %s\n", e.what());
    return 1;
  }
  std::fputs(bench::format_report(report).c_str(), stdout);
  std::fflush(stdout);
  if (!json_path.empty()) {
    std::ofstream out(json_path);
    out << bench::report_json(report) << "\n";
    if (!out) {
      std::fprintf(stderr, "pagellm bench: cannot write %s\n", json_path.c_str());
      return 1;
    }
  }
  return report.failed > 0 ? 1 : 0;
}

}  // namespace pagellm::cli

// KV memory efficiency: how many of the KV slots a server allocates hold real tokens.
//
// Replays a stream of requests through a continuous batch (up to --max-seqs running,
// each decoding one token per step) and, at every step, compares the tokens the running
// sequences hold with the slots each scheme has set aside for them:
//   paged       KVCacheManager with 16-token blocks (the real code, not a formula)
//   contiguous  one contiguous region per sequence of max-length slots (the context
//               window), or of prompt + max_tokens, as servers without paging reserve
// Prompt and output lengths are log-normal (long-tailed), capped at the context window.
//
//   pagellm_kv_memory_report [--requests N] [--max-seqs N] [--seed S] [--json FILE]

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <random>
#include <string>
#include <vector>

#include "paging/kv_cache_manager.h"

using namespace pagellm::paging;

namespace {

struct Options {
  int requests = 10000;
  int max_seqs = 256;
  int context = 4096;
  double prompt_mean = 300;
  double output_mean = 200;
  double sigma = 1.0;  // log-normal shape: the tail grows with it
  int max_tokens = 1024;
  uint32_t seed = 42;
  std::string json_path;
};

struct Request {
  int prompt;
  int output;
};

struct Scheme {
  const char* name;
  double token_steps = 0;  // sum over steps of tokens held
  double slot_steps = 0;   // sum over steps of slots reserved
  double useful() const { return slot_steps > 0 ? token_steps / slot_steps : 0; }
};

// Log-normal with the given mean, capped to [1, cap].
int draw_length(std::mt19937_64& rng, double mean, double sigma, int cap) {
  const double mu = std::log(mean) - sigma * sigma / 2;
  std::lognormal_distribution<double> dist(mu, sigma);
  return std::clamp(static_cast<int>(std::lround(dist(rng))), 1, cap);
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s needs a value\n", arg.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (arg == "--requests")
      o.requests = std::stoi(next());
    else if (arg == "--max-seqs")
      o.max_seqs = std::stoi(next());
    else if (arg == "--seed")
      o.seed = static_cast<uint32_t>(std::stoul(next()));
    else if (arg == "--json")
      o.json_path = next();
    else {
      std::fprintf(stderr, "usage: %s [--requests N] [--max-seqs N] [--seed S] [--json FILE]\n",
                   argv[0]);
      std::exit(2);
    }
  }
  return o;
}

}  // namespace

int main(int argc, char** argv) {
  const Options opt = parse(argc, argv);
  std::mt19937_64 rng(opt.seed);
  std::vector<Request> requests(opt.requests);
  double prompt_sum = 0, output_sum = 0;
  int prompt_max = 0, output_max = 0;
  for (Request& r : requests) {
    r.prompt = draw_length(rng, opt.prompt_mean, opt.sigma, opt.context - 1);
    r.output =
        std::min(draw_length(rng, opt.output_mean, opt.sigma, opt.context), opt.context - r.prompt);
    prompt_sum += r.prompt;
    output_sum += r.output;
    prompt_max = std::max(prompt_max, r.prompt);
    output_max = std::max(output_max, r.output);
  }

  // The pool is large enough for every running sequence at full length, so the replay
  // measures fragmentation, not admission control.
  KVCacheManager kv(opt.max_seqs * (opt.context / kBlockSize), /*enable_prefix_caching=*/false);
  struct Running {
    SeqId id;
    int prompt, output, generated;
  };
  std::deque<Running> running;
  size_t next_request = 0;
  Scheme paged{"paged, 16-token blocks"};
  Scheme max_len{"contiguous, max length"};
  Scheme max_tokens{"contiguous, prompt + max_tokens"};
  int64_t steps = 0;
  while (next_request < requests.size() || !running.empty()) {
    while (running.size() < static_cast<size_t>(opt.max_seqs) && next_request < requests.size()) {
      const Request& r = requests[next_request];
      const SeqId id = static_cast<SeqId>(next_request++);
      if (!kv.add_sequence(id, PrefixMatch{}, r.prompt)) {
        std::fprintf(stderr, "pool exhausted at request %lld\n", static_cast<long long>(id));
        return 1;
      }
      running.push_back({id, r.prompt, r.output, 0});
    }
    // One decode step: every running sequence gains a token.
    for (Running& s : running) {
      if (!kv.allocate_slots(s.id, 1)) {
        std::fprintf(stderr, "pool exhausted while decoding\n");
        return 1;
      }
      ++s.generated;
    }
    double tokens = 0, reserved_max_tokens = 0;
    for (const Running& s : running) {
      tokens += s.prompt + s.generated;
      reserved_max_tokens += std::min(s.prompt + opt.max_tokens, opt.context);
    }
    paged.token_steps += tokens;
    paged.slot_steps += static_cast<double>(kv.usage().used_blocks) * kBlockSize;
    max_len.token_steps += tokens;
    max_len.slot_steps += static_cast<double>(running.size()) * opt.context;
    max_tokens.token_steps += tokens;
    max_tokens.slot_steps += reserved_max_tokens;
    ++steps;
    for (auto it = running.begin(); it != running.end();) {
      if (it->generated >= it->output) {
        kv.free_sequence(it->id);
        it = running.erase(it);
      } else {
        ++it;
      }
    }
  }
  const KVCacheUsage end = kv.usage();
  if (end.used_blocks != 0) {
    std::fprintf(stderr, "leak: %d blocks still in use after the replay\n", end.used_blocks);
    return 1;
  }

  std::printf("KV memory efficiency: %d requests, up to %d running, context %d\n", opt.requests,
              opt.max_seqs, opt.context);
  std::printf(
      "prompt tokens: mean %.1f, max %d; output tokens: mean %.1f, max %d (log-normal, "
      "sigma %.1f)\n",
      prompt_sum / opt.requests, prompt_max, output_sum / opt.requests, output_max, opt.sigma);
  std::printf("%lld decode steps replayed\n\n", static_cast<long long>(steps));
  std::printf("%-36s %14s %18s\n", "scheme", "useful slots", "vs paged (memory)");
  for (const Scheme* s : {&paged, &max_len, &max_tokens}) {
    char label[64];
    if (s == &max_tokens) {
      std::snprintf(label, sizeof label, "contiguous, prompt + %d", opt.max_tokens);
    } else {
      std::snprintf(label, sizeof label, "%s", s->name);
    }
    std::printf("%-36s %13.2f%% %17.1fx\n", label, 100 * s->useful(),
                s->slot_steps / paged.slot_steps);
  }
  if (!opt.json_path.empty()) {
    FILE* f = std::fopen(opt.json_path.c_str(), "w");
    if (!f) {
      std::fprintf(stderr, "cannot write %s\n", opt.json_path.c_str());
      return 1;
    }
    std::fprintf(f,
                 "{\"requests\": %d, \"max_seqs\": %d, \"context\": %d, \"steps\": %lld,\n"
                 " \"prompt_mean\": %.3f, \"output_mean\": %.3f,\n"
                 " \"useful_paged\": %.6f, \"useful_contiguous_max_length\": %.6f,\n"
                 " \"useful_contiguous_max_tokens\": %.6f, \"max_tokens\": %d}\n",
                 opt.requests, opt.max_seqs, opt.context, static_cast<long long>(steps),
                 prompt_sum / opt.requests, output_sum / opt.requests, paged.useful(),
                 max_len.useful(), max_tokens.useful(), opt.max_tokens);
    std::fclose(f);
  }
  return paged.useful() >= 0.96 ? 0 : 1;
}

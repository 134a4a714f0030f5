#include "engine/sampler.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <map>
#include <random>
#include <set>
#include <vector>

namespace pagellm::engine {
namespace {

using scheduler::SamplingParams;

SamplingParams greedy() {
  SamplingParams p;
  p.temperature = 0.0f;
  return p;
}

TEST(Sampler, GreedyTakesTheFirstLargestLogit) {
  Sampler s(greedy(), {}, 1);
  const std::vector<float> logits = {0.5f, 3.0f, -1.0f, 3.0f};
  EXPECT_EQ(s.sample(logits).token, 1);
  SamplingParams top1;
  top1.top_k = 1;
  Sampler k1(top1, {}, 1);
  EXPECT_EQ(k1.sample(logits).token, 1);
}

// A temperature too small to sample with (1/T would overflow the scaled logits) is greedy.
TEST(Sampler, ATinyTemperatureIsGreedy) {
  SamplingParams p;
  p.temperature = 1e-40f;
  EXPECT_TRUE(p.greedy());
  Sampler s(p, {}, 1);
  for (int i = 0; i < 20; ++i)
    EXPECT_EQ(s.sample(std::vector<float>{0.5f, 2.0f, 1.9f}).token, 1);
  p.temperature = 1e-5f;
  EXPECT_FALSE(p.greedy());
}

TEST(Sampler, SameSeedSameTokensDifferentSeedDifferentTokens) {
  SamplingParams p;
  p.temperature = 1.0f;
  p.seed = 1234;
  std::vector<float> logits(100);
  for (int i = 0; i < 100; ++i)
    logits[i] = std::sin(i * 0.37f);
  auto run = [&](const SamplingParams& params, uint64_t fallback) {
    Sampler s(params, {}, fallback);
    std::vector<int32_t> out;
    for (int i = 0; i < 50; ++i)
      out.push_back(s.sample(logits).token);
    return out;
  };
  EXPECT_EQ(run(p, 1), run(p, 2));  // the request's seed wins over the fallback
  SamplingParams other = p;
  other.seed = 99;
  EXPECT_NE(run(p, 1), run(other, 1));
}

TEST(Sampler, DrawsFollowTheSoftmax) {
  SamplingParams p;
  p.temperature = 1.0f;
  p.seed = 7;
  const std::vector<float> logits = {std::log(0.5f), std::log(0.3f), std::log(0.2f)};
  Sampler s(p, {}, 0);
  std::map<int32_t, int> counts;
  constexpr int kDraws = 20000;
  for (int i = 0; i < kDraws; ++i)
    ++counts[s.sample(logits).token];
  // Binomial standard deviation is at most sqrt(0.25 / 20000) = 0.0035; allow 5 of them.
  EXPECT_NEAR(counts[0] / double(kDraws), 0.5, 0.018);
  EXPECT_NEAR(counts[1] / double(kDraws), 0.3, 0.018);
  EXPECT_NEAR(counts[2] / double(kDraws), 0.2, 0.018);
}

TEST(Sampler, TopKTopPAndMinPRemoveUnlikelyTokens) {
  const std::vector<float> logits = {std::log(0.45f), std::log(0.30f), std::log(0.15f),
                                     std::log(0.06f), std::log(0.04f)};
  auto seen = [&](SamplingParams p) {
    p.seed = 3;
    Sampler s(p, {}, 0);
    std::set<int32_t> tokens;
    for (int i = 0; i < 3000; ++i)
      tokens.insert(s.sample(logits).token);
    return tokens;
  };
  SamplingParams k;
  k.top_k = 2;
  EXPECT_EQ(seen(k), (std::set<int32_t>{0, 1}));
  SamplingParams p;
  p.top_p = 0.8f;  // 0.45 + 0.30 < 0.8 <= 0.45 + 0.30 + 0.15
  EXPECT_EQ(seen(p), (std::set<int32_t>{0, 1, 2}));
  SamplingParams m;
  m.min_p = 0.2f;  // keeps p >= 0.2 * 0.45 = 0.09
  EXPECT_EQ(seen(m), (std::set<int32_t>{0, 1, 2}));
  SamplingParams all;
  EXPECT_EQ(seen(all).size(), 5u);
}

TEST(Sampler, LowTemperatureSharpensHighFlattens) {
  const std::vector<float> logits = {1.0f, 0.0f};
  auto share_of_first = [&](float t) {
    SamplingParams p;
    p.temperature = t;
    p.seed = 11;
    Sampler s(p, {}, 0);
    int first = 0;
    for (int i = 0; i < 4000; ++i)
      first += s.sample(logits).token == 0;
    return first / 4000.0;
  };
  EXPECT_GT(share_of_first(0.1f), 0.99);  // e^10 : 1
  EXPECT_NEAR(share_of_first(1.0f), 1 / (1 + std::exp(-1.0)), 0.03);
  EXPECT_NEAR(share_of_first(100.0f), 0.5, 0.03);
}

TEST(Sampler, RepetitionPenaltyCoversPromptAndOutput) {
  SamplingParams p = greedy();
  p.repetition_penalty = 2.0f;
  // Token 0 is in the prompt: 4.0 / 2 = 2.0 < 3.0, so token 1 wins.
  Sampler s(p, std::vector<int32_t>{0}, 0);
  EXPECT_EQ(s.sample(std::vector<float>{4.0f, 3.0f, -5.0f}).token, 1);
  // Now 1 is in the output too: 3.0 / 2 = 1.5 < 2.0 (token 0 penalized), so 0 wins.
  EXPECT_EQ(s.sample(std::vector<float>{4.0f, 3.0f, -5.0f}).token, 0);
  // Negative logits are multiplied, pushing them further down.
  SamplingParams q = greedy();
  q.repetition_penalty = 2.0f;
  Sampler neg(q, std::vector<int32_t>{0}, 0);
  EXPECT_EQ(neg.sample(std::vector<float>{-1.0f, -1.5f}).token, 1);
}

TEST(Sampler, PresenceAndFrequencyPenaltiesCountOutputTokens) {
  SamplingParams p = greedy();
  p.frequency_penalty = 0.6f;
  Sampler s(p, std::vector<int32_t>{1}, 0);  // prompt tokens are not penalized
  const std::vector<float> logits = {2.0f, 1.0f};
  EXPECT_EQ(s.sample(logits).token, 0);  // 2.0
  EXPECT_EQ(s.sample(logits).token, 0);  // 2.0 - 0.6 = 1.4
  EXPECT_EQ(s.sample(logits).token, 1);  // 2.0 - 1.2 = 0.8 < 1.0
  SamplingParams q = greedy();
  q.presence_penalty = 1.5f;
  Sampler pres(q, {}, 0);
  EXPECT_EQ(pres.sample(logits).token, 0);
  EXPECT_EQ(pres.sample(logits).token, 1);  // 0.5 < 1.0
  EXPECT_EQ(pres.sample(logits).token, 0);  // both seen once: 0.5 vs -0.5
}

TEST(Sampler, LogitBiasIsAddedBeforeChoosing) {
  SamplingParams p = greedy();
  p.logit_bias = {{0, 5.0f}, {2, -100.0f}, {99, 100.0f}};  // 99: outside, ignored
  Sampler s(p, {}, 0);
  EXPECT_EQ(s.sample(std::vector<float>{1.0f, 2.0f, 3.0f}).token, 0);  // 6 > 2 > -97
  SamplingParams q;
  q.temperature = 1.0f;
  q.seed = 3;
  q.logit_bias = {{1, -100.0f}};
  Sampler draws(q, {}, 0);
  for (int i = 0; i < 200; ++i)
    EXPECT_NE(draws.sample(std::vector<float>{0.0f, 0.0f}).token, 1);
}

// min_tokens: the tokens that end a sequence (stop token ids, end of sequence unless
// ignored) are held at -inf for the first min_tokens tokens, whichever side samples.
TEST(Sampler, MinTokensHoldsBackTheTokensThatEndTheSequence) {
  SamplingParams p = greedy();
  p.min_tokens = 3;
  p.stop_token_ids = {2};
  p.logit_bias = {{3, 0.5f}};
  const std::vector<int32_t> eos = {3};
  const std::vector<float> logits = {0.0f, 1.0f, 5.0f, 4.0f};  // 2, then 3 (+0.5) lead
  Sampler s(p, {}, 1, eos);
  EXPECT_TRUE(s.has_penalties());
  for (int i = 0; i < 3; ++i)
    EXPECT_EQ(s.sample(logits).token, 1) << i;
  EXPECT_EQ(s.sample(logits).token, 2);
  // Released, the bias of token 3 is its own again: with 2 masked, it leads.
  const std::vector<float> no_two = {0.0f, 4.2f, -100.0f, 4.0f};
  EXPECT_EQ(s.sample(no_two).token, 3);

  // Backend rows carry the hold in their penalty list, and drop it after min_tokens.
  Sampler b(p, {}, 1, eos);
  for (int i = 0; i < 4; ++i) {
    ForwardBatch batch;
    b.append_backend_row(batch);
    const auto& tokens = batch.penalty_tokens;
    auto bias_of = [&](int32_t t) {
      for (const auto& e : tokens) {
        if (e.token == t && (e.flags & kernels::kPenaltyHasBias)) return e.bias;
      }
      return 0.0f;
    };
    EXPECT_EQ(std::isinf(bias_of(2)), i < 3) << i;
    EXPECT_EQ(bias_of(3), i < 3 ? -std::numeric_limits<float>::infinity() : 0.5f) << i;
    b.observe(1);
  }
  // ignore_eos: only the stop token ids are held.
  p.ignore_eos = true;
  Sampler ignoring(p, {}, 1, eos);
  EXPECT_EQ(ignoring.sample(logits).token, 3);
  EXPECT_FALSE(Sampler(greedy(), {}, 1, eos).has_penalties());
}

// The list a backend's apply_penalties reads: each token once, with its bias (a token
// named twice gets both), whether the prompt holds it (only where the repetition penalty
// needs it) and how often the output does.
TEST(Sampler, PenaltyListHasEachTokenOnceWithItsCounts) {
  SamplingParams p = greedy();
  p.repetition_penalty = 1.3f;
  p.presence_penalty = 0.2f;
  p.logit_bias = {{7, 2.0f}, {3, -1.0f}, {7, 1.0f}};
  Sampler s(p, std::vector<int32_t>{3, 5, 5, 9}, 0);
  s.observe(5);
  s.observe(11);
  s.observe(5);
  ASSERT_TRUE(s.has_penalties());
  std::map<int32_t, kernels::PenaltyToken> by_token;
  for (const kernels::PenaltyToken& t : s.penalty_tokens())
    EXPECT_TRUE(by_token.emplace(t.token, t).second) << "token " << t.token << " twice";
  ASSERT_EQ(by_token.size(), 5u);
  auto expect = [&](int32_t token, int32_t count, float bias, uint32_t flags) {
    const kernels::PenaltyToken& t = by_token.at(token);
    EXPECT_EQ(t.output_count, count) << token;
    EXPECT_EQ(t.flags, flags) << token;
    if (flags & kernels::kPenaltyHasBias) {
      EXPECT_EQ(t.bias, bias) << token;
    }
  };
  expect(7, 0, 3.0f, kernels::kPenaltyHasBias);
  expect(3, 0, -1.0f, kernels::kPenaltyHasBias | kernels::kPenaltyInPrompt);
  expect(5, 2, 0.0f, kernels::kPenaltyInPrompt);
  expect(9, 0, 0.0f, kernels::kPenaltyInPrompt);
  expect(11, 1, 0.0f, 0);
  const kernels::PenaltyRow row = s.penalty_row(40);
  EXPECT_EQ(row.begin, 40);
  EXPECT_EQ(row.end, 45);
  EXPECT_EQ(row.repetition, 1.3f);
  EXPECT_EQ(row.presence, 0.2f);
  EXPECT_EQ(row.frequency, 0.0f);

  // Without penalties nothing is listed or counted; a bias alone lists only its tokens.
  Sampler plain(greedy(), std::vector<int32_t>{1, 2}, 0);
  plain.observe(4);
  EXPECT_FALSE(plain.has_penalties());
  EXPECT_TRUE(plain.penalty_tokens().empty());
  SamplingParams b = greedy();
  b.logit_bias = {{2, 5.0f}};
  Sampler biased(b, std::vector<int32_t>{1, 2}, 0);
  biased.observe(4);
  EXPECT_TRUE(biased.has_penalties());
  ASSERT_EQ(biased.penalty_tokens().size(), 1u);
  EXPECT_EQ(biased.penalty_tokens()[0].token, 2);
  EXPECT_EQ(biased.penalty_tokens()[0].flags, kernels::kPenaltyHasBias);
}

// A backend row: the draw's parameters with the request's next random number (none taken
// when greedy), and the penalty list appended after what the batch already holds.
TEST(Sampler, AppendBackendRowFillsTheDrawAndThePenaltyList) {
  SamplingParams p;
  p.temperature = 0.7f;
  p.top_k = 9;
  p.top_p = 0.8f;
  p.min_p = 0.1f;
  p.seed = 5;
  p.frequency_penalty = 0.5f;
  Sampler drawn(p, std::vector<int32_t>{1, 2}, 0);
  drawn.observe(3);
  drawn.observe(4);
  Sampler same_seed(p, {}, 0);
  const double first_draw = same_seed.next_uniform();

  ForwardBatch batch;
  batch.penalty_tokens.resize(3);  // another row's list
  drawn.append_backend_row(batch);
  Sampler greedy_row(greedy(), std::vector<int32_t>{1}, 0);
  greedy_row.append_backend_row(batch);

  ASSERT_EQ(batch.sampling.size(), 2u);
  EXPECT_EQ(batch.sampling[0].temperature, 0.7f);
  EXPECT_EQ(batch.sampling[0].top_k, 9);
  EXPECT_EQ(batch.sampling[0].top_p, 0.8f);
  EXPECT_EQ(batch.sampling[0].min_p, 0.1f);
  EXPECT_EQ(batch.sampling[0].uniform, first_draw);
  EXPECT_EQ(batch.sampling[1].temperature, 0.0f);  // greedy: the backend's argmax
  ASSERT_EQ(batch.penalty_rows.size(), 2u);
  EXPECT_EQ(batch.penalty_rows[0].begin, 3);
  EXPECT_EQ(batch.penalty_rows[0].end, 5);  // tokens 3 and 4 (prompt not listed: no repetition)
  EXPECT_EQ(batch.penalty_rows[0].frequency, 0.5f);
  EXPECT_EQ(batch.penalty_rows[1].begin, batch.penalty_rows[1].end);
  ASSERT_EQ(batch.penalty_tokens.size(), 5u);
  EXPECT_EQ(batch.penalty_tokens[3].token, 3);
  EXPECT_EQ(batch.penalty_tokens[4].token, 4);
  EXPECT_EQ(batch.penalty_tokens[4].output_count, 1);
}

TEST(Sampler, LogprobsAreTheModelsLogSoftmax) {
  SamplingParams p = greedy();
  p.logprobs = true;
  p.top_logprobs = 2;
  p.repetition_penalty = 3.0f;  // changes the choice, not the reported logprobs
  const std::vector<float> logits = {1.0f, 2.0f, 0.0f};
  Sampler s(p, std::vector<int32_t>{1}, 0);
  const SampledToken t = s.sample(logits);
  const double z = std::log(std::exp(1.0) + std::exp(2.0) + std::exp(0.0));
  EXPECT_EQ(t.token, 0);  // 2.0 / 3 < 1.0
  EXPECT_NEAR(t.logprob, 1.0 - z, 1e-6);
  ASSERT_EQ(t.top.size(), 2u);
  EXPECT_EQ(t.top[0].token, 1);
  EXPECT_NEAR(t.top[0].logprob, 2.0 - z, 1e-6);
  EXPECT_EQ(t.top[1].token, 0);
}

TEST(Sampler, DrawIsTheCpuKernelWithTheRequestsUniformDraws) {
  // Without penalties, a sampled token is kernels::cpu::sample_top_k_top_p of the raw
  // logits with the next uniform draw of the request's generator (seeded mt19937_64).
  SamplingParams p;
  p.temperature = 0.8f;
  p.top_k = 20;
  p.top_p = 0.9f;
  p.min_p = 0.02f;
  p.seed = 42;
  std::vector<float> logits(500);
  for (int i = 0; i < 500; ++i)
    logits[i] = 3.0f * std::sin(i * 0.91f);
  Sampler s(p, {}, 0);
  std::mt19937_64 rng(42);
  for (int step = 0; step < 200; ++step) {
    const double u = std::uniform_real_distribution<double>(0.0, 1.0)(rng);
    const kernels::cpu::SamplingRows row{&p.temperature, &p.top_k, &p.top_p, &p.min_p, &u};
    int32_t expected = -1;
    kernels::cpu::sample_top_k_top_p(logits.data(), 1, 500, row, &expected);
    EXPECT_EQ(s.sample(logits).token, expected) << "step " << step;
  }
}

}  // namespace
}  // namespace pagellm::engine

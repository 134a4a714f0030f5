#include "engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

namespace pagellm::engine {
void log_softmax(std::span<const float> logits, std::vector<float>& out) {
  out.resize(logits.size());
  float max_logit = -std::numeric_limits<float>::infinity();
  for (float x : logits)
    max_logit = std::max(max_logit, x);
  double sum = 0.0;
  for (float x : logits)
    sum += std::exp(static_cast<double>(x) - max_logit);
  const double log_sum = std::log(sum) + max_logit;
  for (size_t i = 0; i < logits.size(); ++i) {
    out[i] = static_cast<float>(static_cast<double>(logits[i]) - log_sum);
  }
}

Sampler::Sampler(const scheduler::SamplingParams& params, std::span<const int32_t> prompt,
                 uint64_t seed, std::span<const int32_t> eos_token_ids)
    : params_(params), rng_(params.seed.value_or(seed)) {
  counts_output_ = params_.repetition_penalty != 1.0f || params_.presence_penalty != 0.0f ||
                   params_.frequency_penalty != 0.0f;
  has_penalties_ = counts_output_ || !params_.logit_bias.empty();
  // A token named twice in logit_bias (the server refuses that) gets the sum of its biases.
  for (const auto& [t, bias] : params_.logit_bias) {
    kernels::PenaltyToken& entry = penalty_token(t);
    entry.bias = (entry.flags & kernels::kPenaltyHasBias) ? entry.bias + bias : bias;
    entry.flags |= kernels::kPenaltyHasBias;
  }
  if (params_.repetition_penalty != 1.0f) {
    for (int32_t t : prompt)
      penalty_token(t).flags |= kernels::kPenaltyInPrompt;
  }
  if (params_.min_tokens > 0) {
    // The tokens that would end the sequence get a bias of -inf until min_tokens.
    auto hold = [&](int32_t t) {
      kernels::PenaltyToken& entry = penalty_token(t);
      const int32_t index = penalty_index_.at(t);
      if (std::any_of(held_.begin(), held_.end(), [&](const Held& h) { return h.index == index; }))
        return;
      held_.push_back({index, entry.bias, entry.flags});
      entry.bias = -std::numeric_limits<float>::infinity();
      entry.flags |= kernels::kPenaltyHasBias;
    };
    for (int32_t t : params_.stop_token_ids)
      hold(t);
    if (!params_.ignore_eos) {
      for (int32_t t : eos_token_ids)
        hold(t);
    }
    if (!held_.empty()) has_penalties_ = true;
  }
}

void Sampler::release_held() {
  for (const Held& h : held_) {
    penalty_tokens_[h.index].bias = h.bias;
    penalty_tokens_[h.index].flags = (penalty_tokens_[h.index].flags & ~kernels::kPenaltyHasBias) |
                                     (h.flags & kernels::kPenaltyHasBias);
  }
  held_.clear();
  has_penalties_ = counts_output_ || !params_.logit_bias.empty();
}

kernels::PenaltyToken& Sampler::penalty_token(int32_t token) {
  auto [it, added] =
      penalty_index_.try_emplace(token, static_cast<int32_t>(penalty_tokens_.size()));
  if (added) penalty_tokens_.push_back({token, 0, 0.0f, 0});
  return penalty_tokens_[it->second];
}

kernels::PenaltyRow Sampler::penalty_row(int32_t begin) const {
  return {begin, begin + static_cast<int32_t>(penalty_tokens_.size()), params_.repetition_penalty,
          params_.presence_penalty, params_.frequency_penalty};
}

void Sampler::append_backend_row(ForwardBatch& batch) {
  RowSampling row;
  if (!params_.greedy()) {
    row = {params_.temperature, params_.top_k, params_.top_p, params_.min_p, next_uniform()};
  }
  batch.sampling.push_back(row);
  // Without penalties, an empty range with the neutral settings.
  batch.penalty_rows.push_back(penalty_row(static_cast<int32_t>(batch.penalty_tokens.size())));
  batch.penalty_tokens.insert(batch.penalty_tokens.end(), penalty_tokens_.begin(),
                              penalty_tokens_.end());
}

void Sampler::observe(int32_t token) {
  if (counts_output_) ++penalty_token(token).output_count;
  if (!held_.empty() && ++num_chosen_ >= params_.min_tokens) release_held();
}

double Sampler::next_uniform() {
  return std::uniform_real_distribution<double>(0.0, 1.0)(rng_);
}

int32_t Sampler::draw(const std::vector<float>& logits) {
  // Temperature, min-p, top-k, top-p and the draw are the CPU sampling kernel's (one
  // piece of code with the reference of the CUDA kernel); the request's generator gives
  // the uniform draw.
  const double u = next_uniform();
  const kernels::cpu::SamplingRows row{&params_.temperature, &params_.top_k, &params_.top_p,
                                       &params_.min_p, &u};
  int32_t token = 0;
  kernels::cpu::sample_top_k_top_p(logits.data(), 1, static_cast<int64_t>(logits.size()), row,
                                   &token);
  return token;
}

SampledToken Sampler::sample(std::span<const float> logits) {
  SampledToken out;
  scratch_.assign(logits.begin(), logits.end());
  if (has_penalties_) {
    const kernels::PenaltyRow row = penalty_row(0);
    kernels::cpu::apply_penalties(scratch_.data(), 1, static_cast<int64_t>(scratch_.size()), &row,
                                  penalty_tokens_.data());
  }
  if (params_.greedy()) {
    // First maximum on ties, like torch.argmax on CPU; NaN never wins.
    kernels::cpu::argmax(scratch_.data(), 1, static_cast<int64_t>(scratch_.size()), &out.token);
  } else {
    out.token = draw(scratch_);
  }
  if (params_.logprobs || params_.top_logprobs > 0) {
    std::vector<float> lp;
    log_softmax(logits, lp);
    out.logprob = lp[out.token];
    const int32_t k = std::min<int32_t>(params_.top_logprobs, static_cast<int32_t>(lp.size()));
    if (k > 0) {
      std::vector<int32_t> ids(lp.size());
      std::iota(ids.begin(), ids.end(), 0);
      std::partial_sort(ids.begin(), ids.begin() + k, ids.end(), [&](int32_t a, int32_t b) {
        return lp[a] != lp[b] ? lp[a] > lp[b] : a < b;
      });
      for (int32_t i = 0; i < k; ++i)
        out.top.push_back({ids[i], lp[ids[i]]});
    }
  }
  observe(out.token);
  return out;
}

}  // namespace pagellm::engine

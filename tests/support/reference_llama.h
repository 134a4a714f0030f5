#pragma once
// A plain Llama-family forward pass for tests: no KV cache, no batching, no paging,
// every step recomputes the whole sequence with naive loops and double-precision sums.
// It shares nothing with the serving path but the weights, so agreeing with it is
// evidence that the paged, batched path is right.
//
// K and V are rounded to the cache's number format, as the paged path stores them: that
// rounding is part of the model as served, not an error of either implementation.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>
#include <vector>

#include "engine/model_config.h"
#include "engine/model_weights.h"
#include "kernels/dtype.h"

namespace pagellm::testing {

class ReferenceLlama {
 public:
  ReferenceLlama(const engine::ModelConfig& config, const engine::ModelWeights& weights,
                 kernels::DType kv_dtype)
      : c_(config), w_(weights), kv_dtype_(kv_dtype), inv_freq_(engine::rope_inv_freq(config)) {
    // YaRN scales the cos and sin (so q and k) by its attention factor, as transformers
    // does; the model under test folds its square into the softmax scale instead.
    if (c_.rope_scaling && c_.rope_scaling->type == engine::RopeScaling::Type::kYarn) {
      const engine::RopeScaling& s = *c_.rope_scaling;
      rope_gain_ = s.attention_factor.value_or(s.factor <= 1 ? 1.0 : 0.1 * std::log(s.factor) + 1);
    }
  }

  // Logits [vocab] of the token after `tokens`.
  std::vector<float> next_logits(const std::vector<int32_t>& tokens) const {
    const int64_t T = static_cast<int64_t>(tokens.size());
    const int64_t H = c_.hidden_size, D = c_.head_dim, nh = c_.num_heads, nkv = c_.num_kv_heads;
    std::vector<float> h(T * H);
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t j = 0; j < H; ++j)
        h[t * H + j] = at(w_.embed_tokens, tokens[t] * H + j);
    }
    for (const engine::LayerWeights& layer : w_.layers) {
      std::vector<float> x = rmsnorm(h, T, H, layer.input_norm);
      std::vector<float> q = linear(x, T, layer.q_proj, layer.q_bias);
      std::vector<float> k = linear(x, T, layer.k_proj, layer.k_bias);
      std::vector<float> v = linear(x, T, layer.v_proj, layer.v_bias);
      if (layer.q_norm) {
        q = rmsnorm(q, T * nh, D, *layer.q_norm);
        k = rmsnorm(k, T * nkv, D, *layer.k_norm);
      }
      for (int64_t t = 0; t < T; ++t) {
        for (int64_t hd = 0; hd < nh; ++hd)
          rotate(&q[(t * nh + hd) * D], t);
        for (int64_t hd = 0; hd < nkv; ++hd)
          rotate(&k[(t * nkv + hd) * D], t);
      }
      for (float& e : k)
        e = round_to_cache(e);
      for (float& e : v)
        e = round_to_cache(e);
      std::vector<float> attn(T * nh * D);
      const double scale = 1.0 / std::sqrt(static_cast<double>(D));
      for (int64_t t = 0; t < T; ++t) {
        const int64_t first =
            c_.sliding_window > 0 ? std::max<int64_t>(0, t - c_.sliding_window + 1) : 0;
        for (int64_t hd = 0; hd < nh; ++hd) {
          const int64_t kh = hd / (nh / nkv);
          std::vector<double> score(t + 1 - first);
          double max_score = -INFINITY;
          for (int64_t s = first; s <= t; ++s) {
            double dot = 0;
            for (int64_t d = 0; d < D; ++d)
              dot += double(q[(t * nh + hd) * D + d]) * k[(s * nkv + kh) * D + d];
            score[s - first] = dot * scale;
            max_score = std::max(max_score, score[s - first]);
          }
          double sum = 0;
          for (double& e : score)
            sum += (e = std::exp(e - max_score));
          for (int64_t d = 0; d < D; ++d) {
            double acc = 0;
            for (int64_t s = first; s <= t; ++s)
              acc += score[s - first] * v[(s * nkv + kh) * D + d];
            attn[(t * nh + hd) * D + d] = static_cast<float>(acc / sum);
          }
        }
      }
      const std::vector<float> o = linear(attn, T, layer.o_proj, std::nullopt);
      for (int64_t i = 0; i < T * H; ++i)
        h[i] += o[i];
      x = rmsnorm(h, T, H, layer.post_attention_norm);
      std::vector<float> gate = linear(x, T, layer.gate_proj, std::nullopt);
      const std::vector<float> up = linear(x, T, layer.up_proj, std::nullopt);
      for (size_t i = 0; i < gate.size(); ++i) {
        const double g = gate[i];
        gate[i] = static_cast<float>(g / (1.0 + std::exp(-g)) * up[i]);
      }
      const std::vector<float> down = linear(gate, T, layer.down_proj, std::nullopt);
      for (int64_t i = 0; i < T * H; ++i)
        h[i] += down[i];
    }
    std::vector<float> last(h.end() - H, h.end());
    last = rmsnorm(last, 1, H, w_.final_norm);
    return linear(last, 1, w_.lm_head, std::nullopt);
  }

  // Greedy continuation of `prompt`, `count` tokens long.
  std::vector<int32_t> greedy(std::vector<int32_t> tokens, int count) const {
    std::vector<int32_t> out;
    for (int i = 0; i < count; ++i) {
      const std::vector<float> logits = next_logits(tokens);
      const int32_t next =
          static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
      out.push_back(next);
      tokens.push_back(next);
    }
    return out;
  }

 private:
  static float at(const engine::TensorView& t, int64_t i) {
    switch (t.dtype) {
      case kernels::DType::kF32:
        return static_cast<const float*>(t.data)[i];
      case kernels::DType::kF16:
        return kernels::f16_to_f32(static_cast<const uint16_t*>(t.data)[i]);
      case kernels::DType::kBF16:
        return kernels::bf16_to_f32(static_cast<const uint16_t*>(t.data)[i]);
    }
    return 0;
  }

  float round_to_cache(float x) const {
    switch (kv_dtype_) {
      case kernels::DType::kF32:
        return x;
      case kernels::DType::kF16:
        return kernels::f16_to_f32(kernels::f32_to_f16(x));
      case kernels::DType::kBF16:
        return kernels::bf16_to_f32(kernels::f32_to_bf16(x));
    }
    return x;
  }

  std::vector<float> rmsnorm(const std::vector<float>& x, int64_t rows, int64_t dim,
                             const engine::TensorView& weight) const {
    std::vector<float> out(rows * dim);
    for (int64_t r = 0; r < rows; ++r) {
      double ss = 0;
      for (int64_t j = 0; j < dim; ++j)
        ss += double(x[r * dim + j]) * x[r * dim + j];
      const double inv = 1.0 / std::sqrt(ss / dim + c_.rms_norm_eps);
      for (int64_t j = 0; j < dim; ++j)
        out[r * dim + j] = static_cast<float>(x[r * dim + j] * inv * at(weight, j));
    }
    return out;
  }

  std::vector<float> linear(const std::vector<float>& x, int64_t rows, const engine::TensorView& w,
                            const std::optional<engine::TensorView>& bias) const {
    const int64_t n = w.shape[0], k = w.shape[1];
    std::vector<float> y(rows * n);
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t j = 0; j < n; ++j) {
        double acc = 0;
        for (int64_t i = 0; i < k; ++i)
          acc += double(x[r * k + i]) * at(w, j * k + i);
        if (bias) acc += at(*bias, j);
        y[r * n + j] = static_cast<float>(acc);
      }
    }
    return y;
  }

  // Rotate-half RoPE at position `pos`.
  void rotate(float* head, int64_t pos) const {
    const int64_t half = c_.head_dim / 2;
    for (int64_t i = 0; i < half; ++i) {
      const double angle = static_cast<double>(static_cast<float>(pos) * inv_freq_[i]);
      const double cs = std::cos(angle) * rope_gain_, sn = std::sin(angle) * rope_gain_;
      const double a = head[i], b = head[i + half];
      head[i] = static_cast<float>(a * cs - b * sn);
      head[i + half] = static_cast<float>(b * cs + a * sn);
    }
  }

  engine::ModelConfig c_;
  engine::ModelWeights w_;
  kernels::DType kv_dtype_;
  std::vector<float> inv_freq_;
  double rope_gain_ = 1.0;
};

}  // namespace pagellm::testing

#include "engine/llama_model.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <initializer_list>

namespace pagellm::engine {
namespace cpu = kernels::cpu;

namespace {

cpu::PackedWeight pack(const TensorView& t) {
  return cpu::PackedWeight(t.data, t.dtype, t.shape[0], t.shape[1]);
}

// One packed weight whose outputs are those of `parts` in order: a single pass over the
// weights for projections that read the same input. Each output's sum is unchanged.
cpu::PackedWeight pack_concat(std::initializer_list<const TensorView*> parts) {
  const TensorView& first = **parts.begin();
  const int64_t k = first.shape[1];
  const int64_t esize = kernels::dtype_size(first.dtype);
  int64_t n = 0;
  for (const TensorView* t : parts)
    n += t->shape[0];
  std::vector<unsigned char> rows(static_cast<size_t>(n * k * esize));
  int64_t offset = 0;
  for (const TensorView* t : parts) {
    const int64_t bytes = t->shape[0] * k * esize;
    std::memcpy(rows.data() + offset, t->data, static_cast<size_t>(bytes));
    offset += bytes;
  }
  return cpu::PackedWeight(rows.data(), first.dtype, n, k);
}

std::vector<float> to_f32(const std::optional<TensorView>& t) {
  std::vector<float> out;
  if (!t) return out;
  out.resize(t->num_elements());
  for (int64_t i = 0; i < t->num_elements(); ++i)
    out[i] = kernels::load_f32(t->data, t->dtype, i);
  return out;
}

const float* bias_or_null(const std::vector<float>& bias) {
  return bias.empty() ? nullptr : bias.data();
}

}  // namespace

LlamaModel::LlamaModel(ModelConfig config, SafetensorsCheckpoint checkpoint)
    : config_(std::move(config)), checkpoint_(std::move(checkpoint)) {}

std::unique_ptr<LlamaModel> LlamaModel::load(const std::filesystem::path& model_dir) {
  ModelConfig config = load_model_config(model_dir);
  SafetensorsCheckpoint checkpoint = SafetensorsCheckpoint::open(model_dir);
  std::unique_ptr<LlamaModel> model(new LlamaModel(std::move(config), std::move(checkpoint)));
  const ModelWeights w = bind_weights(model->config_, model->checkpoint_);
  take_weight_dtype(model->config_, w);
  model->embed_tokens_ = w.embed_tokens;
  model->final_norm_ = w.final_norm;
  model->layers_.resize(w.layers.size());
  for (size_t i = 0; i < w.layers.size(); ++i) {
    const LayerWeights& src = w.layers[i];
    Layer& dst = model->layers_[i];
    // q, k and v read the same input, and so do gate and up: each pair or triple is one
    // matmul. Biases are fused only when all three projections have one (adding a zero
    // bias would turn a -0 sum into +0).
    const bool same_type =
        src.q_proj.dtype == src.k_proj.dtype && src.q_proj.dtype == src.v_proj.dtype;
    const bool all_bias = src.q_bias && src.k_bias && src.v_bias;
    const bool no_bias = !src.q_bias && !src.k_bias && !src.v_bias;
    if (same_type && (all_bias || no_bias)) {
      dst.qkv = pack_concat({&src.q_proj, &src.k_proj, &src.v_proj});
      if (all_bias) {
        for (const auto* b : {&src.q_bias, &src.k_bias, &src.v_bias}) {
          const std::vector<float> part = to_f32(*b);
          dst.qkv_bias.insert(dst.qkv_bias.end(), part.begin(), part.end());
        }
      }
    } else {
      dst.q = pack(src.q_proj);
      dst.k = pack(src.k_proj);
      dst.v = pack(src.v_proj);
      dst.q_bias = to_f32(src.q_bias);
      dst.k_bias = to_f32(src.k_bias);
      dst.v_bias = to_f32(src.v_bias);
    }
    dst.o = pack(src.o_proj);
    if (src.gate_proj.dtype == src.up_proj.dtype) {
      dst.gate_up = pack_concat({&src.gate_proj, &src.up_proj});
    } else {
      dst.gate = pack(src.gate_proj);
      dst.up = pack(src.up_proj);
    }
    dst.down = pack(src.down_proj);
    dst.input_norm = src.input_norm;
    dst.post_attention_norm = src.post_attention_norm;
    dst.q_norm = src.q_norm;
    dst.k_norm = src.k_norm;
    for (const auto* p :
         {&dst.qkv, &dst.q, &dst.k, &dst.v, &dst.o, &dst.gate_up, &dst.gate, &dst.up, &dst.down}) {
      model->weight_bytes_ += p->n() * p->k() * kernels::dtype_size(p->dtype());
    }
  }
  model->lm_head_ = pack(w.lm_head);
  model->weight_bytes_ +=
      model->lm_head_.n() * model->lm_head_.k() * kernels::dtype_size(model->lm_head_.dtype());
  model->inv_freq_ = rope_inv_freq(model->config_);
  return model;
}

void LlamaModel::forward(const ForwardBatch& batch, KVCacheMemory& cache,
                         std::vector<float>& logits) {
  const ModelConfig& c = config_;
  const int64_t T = batch.num_tokens();
  const int64_t H = c.hidden_size;
  const int64_t D = c.head_dim;
  const int nh = static_cast<int>(c.num_heads);
  const int nkv = static_cast<int>(c.num_kv_heads);
  const int64_t I = c.intermediate_size;
  const float eps = static_cast<float>(c.rms_norm_eps);

  // Scratch grows to the largest step so far and stays: growing a vector zero-fills it,
  // which every step larger than the one before would pay again. Only the buffers of
  // this model's layout (fused q|k|v and gate|up or not) are sized.
  const auto ensure = [](std::vector<float>& v, int64_t n) {
    if (static_cast<int64_t>(v.size()) < n) v.resize(n);
  };
  const auto any_layer = [&](auto has) { return std::any_of(layers_.begin(), layers_.end(), has); };
  const bool fused_qkv = any_layer([](const Layer& l) { return l.qkv.n() > 0; });
  const bool fused_gate_up = any_layer([](const Layer& l) { return l.gate_up.n() > 0; });
  const bool split_gate_up = any_layer([](const Layer& l) { return l.gate_up.n() == 0; });
  const int64_t QD = nh * D, KD = nkv * D;
  ensure(hidden_, T * H);
  ensure(normed_, T * H);
  ensure(q_, T * QD);
  // Separate K and V rows only for layers that cannot go straight from q|k|v to the cache.
  if (any_layer([](const Layer& l) { return l.qkv.n() == 0 || l.q_norm; })) {
    ensure(k_, T * KD);
    ensure(v_, T * KD);
  }
  if (fused_qkv) ensure(qkv_, T * (QD + 2 * KD));
  ensure(attn_, T * nh * D);
  ensure(proj_, T * H);
  ensure(gate_, T * I);
  if (fused_gate_up) ensure(gate_up_, T * 2 * I);
  if (split_gate_up) ensure(up_, T * I);

  const cpu::PagedAttentionBatch attention{
      batch.num_seqs(),          batch.query_start.data(), batch.context_lens.data(),
      batch.block_tables.data(), batch.max_blocks_per_seq, static_cast<int32_t>(c.sliding_window)};
  const bool decode_only = T == batch.num_seqs();
  const float scale = c.attention_scale();

  if (!batch.copy_src.empty()) {
    for (int64_t l = 0; l < c.num_layers; ++l) {
      cpu::copy_blocks(cache.layer(l), batch.copy_src.data(), batch.copy_dst.data(),
                       static_cast<int64_t>(batch.copy_src.size()));
    }
  }

  cpu::embedding(batch.token_ids.data(), T, embed_tokens_.data, embed_tokens_.dtype, H,
                 hidden_.data());
  for (int64_t l = 0; l < c.num_layers; ++l) {
    Layer& layer = layers_[l];
    const cpu::KVCacheLayer kv = cache.layer(l);
    // The residual stream is `hidden_`; the previous sublayer's output (in proj_) is
    // added to it by add_rmsnorm, except before the first layer.
    if (l == 0) {
      cpu::rmsnorm(hidden_.data(), layer.input_norm.data, layer.input_norm.dtype, T, H, eps,
                   normed_.data());
    } else {
      cpu::add_rmsnorm(hidden_.data(), proj_.data(), layer.input_norm.data, layer.input_norm.dtype,
                       T, H, eps, normed_.data());
    }
    float* q = q_.data();
    float* k = k_.data();
    float* v = v_.data();
    if (layer.qkv.n() > 0 && !layer.q_norm) {
      // Straight from the fused projection: q rotated into q_, K and V into the cache.
      cpu::matmul(normed_.data(), layer.qkv, bias_or_null(layer.qkv_bias), T, qkv_.data());
      cpu::rope_write_kv(qkv_.data(), batch.positions.data(), batch.slots.data(), T, nh,
                         inv_freq_.data(), q, kv);
    } else {
      if (layer.qkv.n() > 0) {
        cpu::matmul(normed_.data(), layer.qkv, bias_or_null(layer.qkv_bias), T, qkv_.data());
        for (int64_t t = 0; t < T; ++t) {
          const float* r = qkv_.data() + t * (QD + 2 * KD);
          std::memcpy(q + t * QD, r, QD * sizeof(float));
          std::memcpy(k + t * KD, r + QD, KD * sizeof(float));
          std::memcpy(v + t * KD, r + QD + KD, KD * sizeof(float));
        }
      } else {
        cpu::matmul(normed_.data(), layer.q, bias_or_null(layer.q_bias), T, q);
        cpu::matmul(normed_.data(), layer.k, bias_or_null(layer.k_bias), T, k);
        cpu::matmul(normed_.data(), layer.v, bias_or_null(layer.v_bias), T, v);
      }
      if (layer.q_norm) {
        cpu::rmsnorm(q, layer.q_norm->data, layer.q_norm->dtype, T * nh, D, eps, q);
        cpu::rmsnorm(k, layer.k_norm->data, layer.k_norm->dtype, T * nkv, D, eps, k);
      }
      cpu::rope(q, k, batch.positions.data(), T, nh, nkv, static_cast<int>(D), inv_freq_.data());
      cpu::write_kv(k, v, batch.slots.data(), T, kv);
    }
    if (decode_only) {
      cpu::paged_attention_decode(q, kv, attention, nh, scale, attn_.data());
    } else {
      cpu::paged_attention(q, kv, attention, nh, scale, attn_.data());
    }
    cpu::matmul(attn_.data(), layer.o, nullptr, T, proj_.data());
    cpu::add_rmsnorm(hidden_.data(), proj_.data(), layer.post_attention_norm.data,
                     layer.post_attention_norm.dtype, T, H, eps, normed_.data());
    if (layer.gate_up.n() > 0) {
      cpu::matmul(normed_.data(), layer.gate_up, nullptr, T, gate_up_.data());
      cpu::silu_mul_fused(gate_up_.data(), T, I, gate_.data());
    } else {
      cpu::matmul(normed_.data(), layer.gate, nullptr, T, gate_.data());
      cpu::matmul(normed_.data(), layer.up, nullptr, T, up_.data());
      cpu::silu_mul(gate_.data(), up_.data(), T, I, gate_.data());
    }
    cpu::matmul(gate_.data(), layer.down, nullptr, T, proj_.data());
  }

  // Only the rows whose next token is wanted go through the final norm and lm_head.
  const int64_t R = static_cast<int64_t>(batch.logit_rows.size());
  ensure(rows_, R * H);
  for (int64_t r = 0; r < R; ++r) {
    const int64_t t = batch.logit_rows[r];
    for (int64_t j = 0; j < H; ++j)
      rows_[r * H + j] = hidden_[t * H + j] + proj_[t * H + j];
  }
  cpu::rmsnorm(rows_.data(), final_norm_.data, final_norm_.dtype, R, H, eps, rows_.data());
  logits.resize(R * c.vocab_size);
  cpu::matmul(rows_.data(), lm_head_, nullptr, R, logits.data());
}

}  // namespace pagellm::engine

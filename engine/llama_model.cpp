#include "engine/llama_model.h"

#include <algorithm>
#include <cmath>

namespace pagellm::engine {
namespace cpu = kernels::cpu;

namespace {

cpu::PackedWeight pack(const TensorView& t) {
  return cpu::PackedWeight(t.data, t.dtype, t.shape[0], t.shape[1]);
}

std::vector<float> to_f32(const std::optional<TensorView>& t) {
  std::vector<float> out;
  if (!t) return out;
  out.resize(t->num_elements());
  for (int64_t i = 0; i < t->num_elements(); ++i) {
    switch (t->dtype) {
      case kernels::DType::kF32:
        out[i] = static_cast<const float*>(t->data)[i];
        break;
      case kernels::DType::kF16:
        out[i] = kernels::f16_to_f32(static_cast<const uint16_t*>(t->data)[i]);
        break;
      case kernels::DType::kBF16:
        out[i] = kernels::bf16_to_f32(static_cast<const uint16_t*>(t->data)[i]);
        break;
    }
  }
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
  model->embed_tokens_ = w.embed_tokens;
  model->final_norm_ = w.final_norm;
  model->layers_.resize(w.layers.size());
  for (size_t i = 0; i < w.layers.size(); ++i) {
    const LayerWeights& src = w.layers[i];
    Layer& dst = model->layers_[i];
    dst.q = pack(src.q_proj);
    dst.k = pack(src.k_proj);
    dst.v = pack(src.v_proj);
    dst.o = pack(src.o_proj);
    dst.gate = pack(src.gate_proj);
    dst.up = pack(src.up_proj);
    dst.down = pack(src.down_proj);
    dst.q_bias = to_f32(src.q_bias);
    dst.k_bias = to_f32(src.k_bias);
    dst.v_bias = to_f32(src.v_bias);
    dst.input_norm = src.input_norm;
    dst.post_attention_norm = src.post_attention_norm;
    dst.q_norm = src.q_norm;
    dst.k_norm = src.k_norm;
    for (const auto* p : {&dst.q, &dst.k, &dst.v, &dst.o, &dst.gate, &dst.up, &dst.down}) {
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

  hidden_.resize(T * H);
  normed_.resize(T * H);
  q_.resize(T * nh * D);
  k_.resize(T * nkv * D);
  v_.resize(T * nkv * D);
  attn_.resize(T * nh * D);
  proj_.resize(T * H);
  gate_.resize(T * I);
  up_.resize(T * I);

  const cpu::PagedAttentionBatch attention{
      batch.num_seqs(),          batch.query_start.data(), batch.context_lens.data(),
      batch.block_tables.data(), batch.max_blocks_per_seq, static_cast<int32_t>(c.sliding_window)};
  const bool decode_only = T == batch.num_seqs();
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));

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
    cpu::matmul(normed_.data(), layer.q, bias_or_null(layer.q_bias), T, q_.data());
    cpu::matmul(normed_.data(), layer.k, bias_or_null(layer.k_bias), T, k_.data());
    cpu::matmul(normed_.data(), layer.v, bias_or_null(layer.v_bias), T, v_.data());
    if (layer.q_norm) {
      cpu::rmsnorm(q_.data(), layer.q_norm->data, layer.q_norm->dtype, T * nh, D, eps, q_.data());
      cpu::rmsnorm(k_.data(), layer.k_norm->data, layer.k_norm->dtype, T * nkv, D, eps, k_.data());
    }
    cpu::rope(q_.data(), k_.data(), batch.positions.data(), T, nh, nkv, static_cast<int>(D),
              inv_freq_.data());
    cpu::write_kv(k_.data(), v_.data(), batch.slots.data(), T, kv);
    if (decode_only) {
      cpu::paged_attention_decode(q_.data(), kv, attention, nh, scale, attn_.data());
    } else {
      cpu::paged_attention(q_.data(), kv, attention, nh, scale, attn_.data());
    }
    cpu::matmul(attn_.data(), layer.o, nullptr, T, proj_.data());
    cpu::add_rmsnorm(hidden_.data(), proj_.data(), layer.post_attention_norm.data,
                     layer.post_attention_norm.dtype, T, H, eps, normed_.data());
    cpu::matmul(normed_.data(), layer.gate, nullptr, T, gate_.data());
    cpu::matmul(normed_.data(), layer.up, nullptr, T, up_.data());
    cpu::silu_mul(gate_.data(), up_.data(), T, I, gate_.data());
    cpu::matmul(gate_.data(), layer.down, nullptr, T, proj_.data());
  }

  // Only the rows whose next token is wanted go through the final norm and lm_head.
  const int64_t R = static_cast<int64_t>(batch.logit_rows.size());
  rows_.resize(R * H);
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

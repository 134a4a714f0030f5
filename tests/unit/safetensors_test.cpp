#include "engine/safetensors.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "engine/model_config.h"
#include "engine/model_weights.h"
#include "engine/tokenizer_config.h"

namespace pagellm::engine {
namespace {

namespace fs = std::filesystem;
using kernels::DType;
using ::testing::AllOf;
using ::testing::HasSubstr;

class Safetensors : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("pagellm_safetensors_test_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string read(const fs::path& p) {
    std::ifstream in(p, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  }
  void write(const fs::path& p, const std::string& bytes) {
    std::ofstream(p, std::ios::binary) << bytes;
  }
  // A file with a hand-written header and `data_bytes` zero bytes after it.
  fs::path raw_file(const std::string& name, const std::string& header, size_t data_bytes) {
    std::string bytes(8, '\0');
    const uint64_t n = header.size();
    for (int i = 0; i < 8; ++i)
      bytes[i] = static_cast<char>(n >> (8 * i));
    bytes += header;
    bytes.append(data_bytes, '\0');
    write(dir_ / name, bytes);
    return dir_ / name;
  }
  std::string open_error(const fs::path& p) {
    try {
      fs::is_directory(p) ? SafetensorsCheckpoint::open(p) : SafetensorsCheckpoint::open_file(p);
    } catch (const ConfigError& e) {
      return e.what();
    }
    return "";
  }

  fs::path dir_;
};

std::vector<uint8_t> bytes_of(const std::vector<float>& values, DType dtype) {
  std::vector<uint8_t> out(values.size() * kernels::dtype_size(dtype));
  for (size_t i = 0; i < values.size(); ++i) {
    if (dtype == DType::kF32) {
      std::memcpy(out.data() + 4 * i, &values[i], 4);
    } else {
      const uint16_t h =
          dtype == DType::kBF16 ? kernels::f32_to_bf16(values[i]) : kernels::f32_to_f16(values[i]);
      std::memcpy(out.data() + 2 * i, &h, 2);
    }
  }
  return out;
}

float value_at(const TensorView& t, int64_t i) {
  uint16_t h;
  switch (t.dtype) {
    case DType::kF32: {
      float f;
      std::memcpy(&f, static_cast<const uint8_t*>(t.data) + 4 * i, 4);
      return f;
    }
    case DType::kF16:
      std::memcpy(&h, static_cast<const uint8_t*>(t.data) + 2 * i, 2);
      return kernels::f16_to_f32(h);
    case DType::kBF16:
      std::memcpy(&h, static_cast<const uint8_t*>(t.data) + 2 * i, 2);
      return kernels::bf16_to_f32(h);
  }
  return 0;
}

TEST_F(Safetensors, RoundTripsEveryDtype) {
  const std::vector<float> values = {1.0f, -2.5f, 0.125f, 3.0f, -0.0f, 1024.0f};
  std::vector<TensorToWrite> tensors;
  for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16}) {
    tensors.push_back(
        {std::string("w.") + kernels::dtype_name(dtype), dtype, {2, 3}, bytes_of(values, dtype)});
  }
  // A tensor with an odd byte count before others, a scalar and an empty tensor.
  tensors.insert(tensors.begin(), {"odd", DType::kF16, {1}, bytes_of({7.0f}, DType::kF16)});
  tensors.push_back({"scalar", DType::kF32, {}, bytes_of({42.0f}, DType::kF32)});
  tensors.push_back({"empty", DType::kBF16, {0, 4}, {}});
  write_safetensors(dir_ / "model.safetensors", tensors, {{"format", "pt"}});

  const SafetensorsCheckpoint ckpt = SafetensorsCheckpoint::open(dir_);
  EXPECT_EQ(ckpt.tensors().size(), tensors.size());
  EXPECT_EQ(ckpt.metadata().at("format"), "pt");
  EXPECT_EQ(ckpt.num_parameters(), 1 + 3 * 6 + 1 + 0);
  for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16}) {
    const TensorView& t = ckpt.get(std::string("w.") + kernels::dtype_name(dtype), {2, 3});
    EXPECT_EQ(t.dtype, dtype);
    EXPECT_EQ(t.file, (dir_ / "model.safetensors").string());
    EXPECT_EQ(t.shape_string(), "[2, 3]");
    EXPECT_EQ(t.num_elements(), 6);
    for (int i = 0; i < 6; ++i)
      EXPECT_EQ(value_at(t, i), values[i]) << kernels::dtype_name(dtype);
  }
  EXPECT_EQ(value_at(ckpt.get("odd"), 0), 7.0f);
  EXPECT_EQ(ckpt.get("scalar").shape.size(), 0u);
  EXPECT_EQ(value_at(ckpt.get("scalar"), 0), 42.0f);
  EXPECT_EQ(ckpt.get("empty").num_elements(), 0);
}

TEST_F(Safetensors, FileLayoutIsTheStandardOne) {
  write_safetensors(dir_ / "a.safetensors",
                    {{"x", DType::kBF16, {3}, bytes_of({1, 2, 3}, DType::kBF16)}});
  const std::string bytes = read(dir_ / "a.safetensors");
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i)
    n = (n << 8) | static_cast<uint8_t>(bytes[i]);
  EXPECT_EQ(n % 8, 0u);  // padded so that the data starts 8-byte aligned
  EXPECT_EQ(bytes.size(), 8 + n + 6);
  const std::string header = bytes.substr(8, n);
  // Only spaces pad the JSON.
  EXPECT_EQ(header.find_first_not_of(' ', header.rfind('}') + 1), std::string::npos);
  const auto json = nlohmann::json::parse(header);
  EXPECT_EQ(json["x"]["dtype"], "BF16");
  EXPECT_EQ(json["x"]["shape"], nlohmann::json::array({3}));
  EXPECT_EQ(json["x"]["data_offsets"], nlohmann::json::array({0, 6}));
  EXPECT_FALSE(fs::exists(dir_ / "a.safetensors.partial"));
}

TEST_F(Safetensors, StreamingWriterFillsInPlaceAndDiscardsUncommitted) {
  {
    SafetensorsWriter writer(dir_ / "never.safetensors", {{"x", DType::kF32, {4}}});
    EXPECT_EQ(writer.data(0).size(), 16u);
  }
  EXPECT_FALSE(fs::exists(dir_ / "never.safetensors"));
  EXPECT_FALSE(fs::exists(dir_ / "never.safetensors.partial"));

  SafetensorsWriter writer(dir_ / "model.safetensors",
                           {{"a", DType::kF16, {2}}, {"b", DType::kF32, {2, 2}}});
  const std::vector<uint8_t> a = bytes_of({1.5f, -1.0f}, DType::kF16);
  const std::vector<uint8_t> b = bytes_of({1, 2, 3, 4}, DType::kF32);
  std::memcpy(writer.data(0).data(), a.data(), a.size());
  std::memcpy(writer.data(1).data(), b.data(), b.size());
  writer.commit();
  const SafetensorsCheckpoint ckpt = SafetensorsCheckpoint::open(dir_);
  EXPECT_EQ(value_at(ckpt.get("a"), 0), 1.5f);
  EXPECT_EQ(value_at(ckpt.get("b", {2, 2}), 3), 4.0f);
}

TEST_F(Safetensors, ShardedIndex) {
  write_safetensors(dir_ / "model-00001-of-00002.safetensors",
                    {{"model.a", DType::kF32, {2}, bytes_of({1, 2}, DType::kF32)}});
  write_safetensors(dir_ / "model-00002-of-00002.safetensors",
                    {{"model.b", DType::kBF16, {1, 2}, bytes_of({3, 4}, DType::kBF16)},
                     {"model.c", DType::kF16, {1}, bytes_of({5}, DType::kF16)}});
  nlohmann::json index = {{"metadata", {{"total_size", 14}}},
                          {"weight_map",
                           {{"model.a", "model-00001-of-00002.safetensors"},
                            {"model.b", "model-00002-of-00002.safetensors"},
                            {"model.c", "model-00002-of-00002.safetensors"}}}};
  write(dir_ / "model.safetensors.index.json", index.dump());
  const SafetensorsCheckpoint ckpt = SafetensorsCheckpoint::open(dir_);
  ASSERT_EQ(ckpt.tensors().size(), 3u);
  EXPECT_EQ(value_at(ckpt.get("model.a"), 1), 2.0f);
  EXPECT_EQ(value_at(ckpt.get("model.b", {1, 2}), 1), 4.0f);
  EXPECT_EQ(value_at(ckpt.get("model.c"), 0), 5.0f);
  EXPECT_THAT(ckpt.get("model.b").file, HasSubstr("model-00002-of-00002.safetensors"));

  // The index names a tensor its shard does not hold.
  index["weight_map"]["model.d"] = "model-00001-of-00002.safetensors";
  write(dir_ / "model.safetensors.index.json", index.dump());
  EXPECT_THAT(open_error(dir_),
              AllOf(HasSubstr("model.safetensors.index.json"), HasSubstr("'model.d'"),
                    HasSubstr("model-00001-of-00002.safetensors")));
  // A missing shard.
  index["weight_map"].erase("model.d");
  index["weight_map"]["model.c"] = "model-00003-of-00003.safetensors";
  write(dir_ / "model.safetensors.index.json", index.dump());
  EXPECT_THAT(open_error(dir_), HasSubstr("model-00003-of-00003.safetensors"));
  // A shard path that leaves the directory.
  index["weight_map"]["model.c"] = "../elsewhere.safetensors";
  write(dir_ / "model.safetensors.index.json", index.dump());
  EXPECT_THAT(open_error(dir_),
              AllOf(HasSubstr("weight_map.model.c"), HasSubstr("../elsewhere.safetensors")));
  write(dir_ / "model.safetensors.index.json", "{\"weight_map\": 3}");
  EXPECT_THAT(open_error(dir_), HasSubstr("'weight_map'"));
}

TEST_F(Safetensors, MissingFilesAreNamed) {
  EXPECT_THAT(open_error(dir_), AllOf(HasSubstr(dir_.string()), HasSubstr("model.safetensors")));
  EXPECT_THAT(open_error(dir_ / "nope.safetensors"),
              AllOf(HasSubstr("nope.safetensors"), HasSubstr("cannot open")));
}

TEST_F(Safetensors, TruncatedFile) {
  write_safetensors(
      dir_ / "full.safetensors",
      {{"weight", DType::kF32, {4, 4}, bytes_of(std::vector<float>(16, 1), DType::kF32)}});
  const std::string bytes = read(dir_ / "full.safetensors");
  write(dir_ / "cut.safetensors", bytes.substr(0, bytes.size() - 10));
  EXPECT_THAT(open_error(dir_ / "cut.safetensors"),
              AllOf(HasSubstr("cut.safetensors"), HasSubstr("'weight'"), HasSubstr("outside")));
  write(dir_ / "tiny.safetensors", bytes.substr(0, 5));
  EXPECT_THAT(open_error(dir_ / "tiny.safetensors"),
              AllOf(HasSubstr("tiny.safetensors"), HasSubstr("truncated")));
}

TEST_F(Safetensors, HeaderLengthBeyondTheFile) {
  std::string bytes(8, '\0');
  bytes[0] = static_cast<char>(0xff);
  bytes[1] = static_cast<char>(0xff);
  bytes += "{}";
  write(dir_ / "long.safetensors", bytes);
  EXPECT_THAT(
      open_error(dir_ / "long.safetensors"),
      AllOf(HasSubstr("long.safetensors"), HasSubstr("header length 65535"), HasSubstr("beyond")));
  raw_file("bad.safetensors", "{not json", 0);
  EXPECT_THAT(open_error(dir_ / "bad.safetensors"),
              AllOf(HasSubstr("bad.safetensors"), HasSubstr("not valid JSON")));
}

TEST_F(Safetensors, OffsetsOutOfRangeOrInconsistent) {
  auto p =
      raw_file("a.safetensors", R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,16]}})", 8);
  EXPECT_THAT(open_error(p), AllOf(HasSubstr("a.safetensors"), HasSubstr("'w'"),
                                   HasSubstr("data_offsets [0, 16]"), HasSubstr("outside")));
  p = raw_file("b.safetensors", R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[8,4]}})", 8);
  EXPECT_THAT(open_error(p), AllOf(HasSubstr("'w'"), HasSubstr("outside")));
  p = raw_file("c.safetensors", R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8);
  EXPECT_THAT(open_error(p), AllOf(HasSubstr("'w'"), HasSubstr("needs 12")));
  p = raw_file("d.safetensors", R"({"w":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", 8);
  EXPECT_THAT(open_error(p), AllOf(HasSubstr("'w'"), HasSubstr("shape")));
  p = raw_file("e.safetensors", R"({"w":{"dtype":"F32","shape":[2]}})", 8);
  EXPECT_THAT(open_error(p), AllOf(HasSubstr("'w'"), HasSubstr("data_offsets")));
  // Two tensors over the same bytes would alias each other: refused, as the reference
  // library refuses them. Adjacent ones and an empty one between them are fine.
  p = raw_file("f.safetensors",
               R"({"v":{"dtype":"F32","shape":[2],"data_offsets":[4,12]},)"
               R"("w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})",
               12);
  EXPECT_THAT(open_error(p), AllOf(HasSubstr("f.safetensors"), HasSubstr("'v'"), HasSubstr("'w'"),
                                   HasSubstr("overlap")));
  p = raw_file("g.safetensors",
               R"({"v":{"dtype":"F32","shape":[2],"data_offsets":[8,16]},)"
               R"("e":{"dtype":"F32","shape":[0],"data_offsets":[8,8]},)"
               R"("w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})",
               16);
  EXPECT_EQ(open_error(p), "");
  // A number past a double's range is an error that names the file, not a bare one.
  p = raw_file("h.safetensors", R"({"__metadata__":{"x":1e400}})", 0);
  EXPECT_THAT(open_error(p), AllOf(HasSubstr("h.safetensors"), HasSubstr("not valid JSON")));
}

TEST_F(Safetensors, UnsupportedDtypeNamesFileTensorAndDtype) {
  for (const char* dtype : {"I8", "F64", "F8_E4M3"}) {
    const std::string header = std::string(R"({"model.embed_tokens.weight":{"dtype":")") + dtype +
                               R"(","shape":[2],"data_offsets":[0,2]}})";
    const auto p = raw_file(std::string("q_") + dtype + ".safetensors", header, 16);
    EXPECT_THAT(open_error(p),
                AllOf(HasSubstr(p.string()), HasSubstr("'model.embed_tokens.weight'"),
                      HasSubstr(std::string("dtype ") + dtype)));
  }
}

TEST_F(Safetensors, MissingTensorAndWrongShape) {
  write_safetensors(dir_ / "model.safetensors",
                    {{"model.norm.weight",
                      DType::kBF16,
                      {64},
                      bytes_of(std::vector<float>(64, 1), DType::kBF16)}});
  const SafetensorsCheckpoint ckpt = SafetensorsCheckpoint::open(dir_);
  EXPECT_TRUE(ckpt.contains("model.norm.weight"));
  EXPECT_FALSE(ckpt.contains("lm_head.weight"));
  try {
    ckpt.get("lm_head.weight");
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_THAT(e.what(), AllOf(HasSubstr(dir_.string()), HasSubstr("'lm_head.weight'"),
                                HasSubstr("missing")));
  }
  try {
    ckpt.get("model.norm.weight", {128});
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_THAT(e.what(), AllOf(HasSubstr((dir_ / "model.safetensors").string()),
                                HasSubstr("'model.norm.weight'"), HasSubstr("[64]"),
                                HasSubstr("expected [128]")));
  }
}

TEST_F(Safetensors, WriteRejectsByteCountsThatDoNotMatchTheShape) {
  EXPECT_THROW(write_safetensors(dir_ / "x.safetensors", {{"w", DType::kF32, {3}, {0, 0, 0, 0}}}),
               ConfigError);
  EXPECT_FALSE(fs::exists(dir_ / "x.safetensors"));
  EXPECT_THROW(write_safetensors(dir_ / "y.safetensors", {{"w", DType::kF32, {1}, {0, 0, 0, 0}},
                                                          {"w", DType::kF32, {1}, {0, 0, 0, 0}}}),
               ConfigError);
}

// bind_weights over a hand-made checkpoint: what is missing or mis-shaped is named with
// the file, the tensor and both shapes.
TEST_F(Safetensors, BindWeightsNamesMissingAndMisshapedTensors) {
  ModelConfig config;
  config.vocab_size = 8;
  config.hidden_size = 4;
  config.intermediate_size = 6;
  config.num_layers = 1;
  config.num_heads = 2;
  config.num_kv_heads = 1;
  config.head_dim = 2;
  std::vector<TensorToWrite> tensors;
  auto add = [&](const std::string& name, std::vector<int64_t> shape) {
    int64_t n = 1;
    for (int64_t d : shape)
      n *= d;
    tensors.push_back(
        {name, DType::kF32, shape, bytes_of(std::vector<float>(n, 0.5f), DType::kF32)});
  };
  add("model.embed_tokens.weight", {8, 4});
  add("model.layers.0.input_layernorm.weight", {4});
  add("model.layers.0.self_attn.q_proj.weight", {4, 4});
  add("model.layers.0.self_attn.k_proj.weight", {2, 4});
  add("model.layers.0.self_attn.v_proj.weight", {2, 4});
  add("model.layers.0.self_attn.o_proj.weight", {4, 4});
  add("model.layers.0.post_attention_layernorm.weight", {4});
  add("model.layers.0.mlp.gate_proj.weight", {6, 4});
  add("model.layers.0.mlp.up_proj.weight", {6, 4});
  add("model.layers.0.mlp.down_proj.weight", {4, 6});
  add("model.norm.weight", {4});
  write_safetensors(dir_ / "model.safetensors", tensors);
  auto bind_error = [&](const ModelConfig& c) {
    try {
      bind_weights(c, SafetensorsCheckpoint::open(dir_));
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_THAT(bind_error(config), AllOf(HasSubstr(dir_.string()), HasSubstr("'lm_head.weight'"),
                                        HasSubstr("missing"), HasSubstr("[8, 4]")));
  config.tie_word_embeddings = true;
  const SafetensorsCheckpoint ckpt = SafetensorsCheckpoint::open(dir_);
  const ModelWeights w = bind_weights(config, ckpt);
  EXPECT_EQ(w.lm_head.data, w.embed_tokens.data);
  EXPECT_EQ(w.layers.size(), 1u);
  EXPECT_FALSE(w.layers[0].q_bias.has_value());

  config.attention_bias = true;
  EXPECT_THAT(bind_error(config), AllOf(HasSubstr("'model.layers.0.self_attn.q_proj.bias'"),
                                        HasSubstr("missing"), HasSubstr("[4]")));
  config.attention_bias = false;
  config.intermediate_size = 5;
  EXPECT_THAT(bind_error(config), AllOf(HasSubstr((dir_ / "model.safetensors").string()),
                                        HasSubstr("'model.layers.0.mlp.gate_proj.weight'"),
                                        HasSubstr("shape [6, 4]"), HasSubstr("expected [5, 4]")));
  config.intermediate_size = 6;
  config.num_layers = 2;
  EXPECT_THAT(bind_error(config), HasSubstr("'model.layers.1.input_layernorm.weight'"));

  // Tensors the model would leave unused mean a config that does not describe the
  // checkpoint (a layer more, biases a Llama has none of): refused, as vLLM refuses
  // them, rather than served without. RoPE tables some checkpoints carry and a tied
  // model's copy of the embeddings are skipped, as vLLM skips them.
  config.num_layers = 1;
  add("model.layers.0.self_attn.rotary_emb.inv_freq", {1});
  add("lm_head.weight", {8, 4});
  write_safetensors(dir_ / "model.safetensors", tensors);
  EXPECT_EQ(bind_error(config), "");
  add("model.layers.1.mlp.up_proj.weight", {6, 4});
  add("model.layers.0.self_attn.q_proj.bias", {4});
  write_safetensors(dir_ / "model.safetensors", tensors);
  EXPECT_THAT(bind_error(config),
              AllOf(HasSubstr(dir_.string()), HasSubstr("2 tensors"),
                    HasSubstr("'model.layers.0.self_attn.q_proj.bias'"),
                    HasSubstr("'model.layers.1.mlp.up_proj.weight'"), HasSubstr("config.json")));
}

}  // namespace
}  // namespace pagellm::engine

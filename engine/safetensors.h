#pragma once
// Memory-mapped safetensors checkpoints: `model.safetensors`, or shards listed in
// `model.safetensors.index.json`. Tensors are views into the mapping (no copies).

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "kernels/dtype.h"

namespace pagellm::engine {

struct TensorView {
  std::string name;
  std::string file;  // the file it lives in, for error messages
  kernels::DType dtype = kernels::DType::kF32;
  std::vector<int64_t> shape;
  const void* data = nullptr;
  int64_t num_elements() const;
  int64_t num_bytes() const { return num_elements() * kernels::dtype_size(dtype); }
  std::string shape_string() const;  // "[4096, 128]"
};

std::string shape_string(const std::vector<int64_t>& shape);

class SafetensorsCheckpoint {
 public:
  // Opens DIR/model.safetensors, or every shard of DIR/model.safetensors.index.json.
  // Throws ConfigError naming the file and the problem: missing file, bad header,
  // unsupported dtype (only F32, F16, BF16), data offsets outside the file.
  static SafetensorsCheckpoint open(const std::filesystem::path& model_dir);
  static SafetensorsCheckpoint open_file(const std::filesystem::path& file);

  bool contains(const std::string& name) const;
  // Throws ConfigError naming the checkpoint and the tensor when it is missing.
  const TensorView& get(const std::string& name) const;
  // get() plus a shape check: throws ConfigError naming file, tensor, expected and
  // actual shape.
  const TensorView& get(const std::string& name, const std::vector<int64_t>& shape) const;
  const std::map<std::string, TensorView>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  std::string description() const { return description_; }  // the directory or file
  int64_t num_parameters() const;                           // elements over all tensors

 private:
  struct Mapping;
  void add_file(const std::filesystem::path& file);

  std::vector<std::shared_ptr<Mapping>> mappings_;
  std::map<std::string, TensorView> tensors_;
  std::map<std::string, std::string> metadata_;  // __metadata__ (of the first file)
  std::string description_;
};

// Writes a safetensors file (used by the demo-model writer and tests).
struct TensorToWrite {
  std::string name;
  kernels::DType dtype;
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;
};
void write_safetensors(const std::filesystem::path& file, const std::vector<TensorToWrite>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

// The streaming form: lays out the file (8-byte little-endian header length, the JSON
// header padded with spaces to a multiple of 8, then the tensors in the given order),
// maps it writable, and lets the caller fill each tensor's bytes in place, from any
// threads. The file appears under its name only on commit(), so an interrupted write
// never leaves a half-written checkpoint behind.
struct TensorLayout {
  std::string name;
  kernels::DType dtype;
  std::vector<int64_t> shape;
};
class SafetensorsWriter {
 public:
  SafetensorsWriter(const std::filesystem::path& file, std::vector<TensorLayout> tensors,
                    const std::map<std::string, std::string>& metadata = {});
  ~SafetensorsWriter();  // discards the file unless committed
  SafetensorsWriter(const SafetensorsWriter&) = delete;
  SafetensorsWriter& operator=(const SafetensorsWriter&) = delete;

  size_t size() const { return tensors_.size(); }
  const TensorLayout& layout(size_t index) const { return tensors_[index]; }
  std::span<uint8_t> data(size_t index);  // [num_elements * dtype_size] bytes
  void commit();                          // unmaps, closes and renames into place

 private:
  std::filesystem::path file_, temp_file_;
  std::vector<TensorLayout> tensors_;
  std::vector<uint64_t> offsets_;  // from the start of the file
  uint8_t* base_ = nullptr;
  size_t file_size_ = 0;
  int fd_ = -1;
};

}  // namespace pagellm::engine

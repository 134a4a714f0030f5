#include "engine/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>
#include <set>
#include <vector>

#include "engine/config_file.h"
#include "engine/tokenizer_config.h"

namespace pagellm::engine {
namespace {

using nlohmann::json;

constexpr const char* kSingleFile = "model.safetensors";
constexpr const char* kIndexFile = "model.safetensors.index.json";
// Headers of real checkpoints are well under this; a larger one is a corrupt length.
constexpr uint64_t kMaxHeaderBytes = 100u << 20;

std::string errno_text() {
  return std::strerror(errno);
}

bool parse_dtype(const std::string& name, kernels::DType* out) {
  if (name == "F32")
    *out = kernels::DType::kF32;
  else if (name == "F16")
    *out = kernels::DType::kF16;
  else if (name == "BF16")
    *out = kernels::DType::kBF16;
  else
    return false;
  return true;
}

uint64_t read_le64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i)
    v = (v << 8) | p[i];
  return v;
}

}  // namespace

// A read-only private mapping of one file, unmapped when the last view's owner goes.
struct SafetensorsCheckpoint::Mapping {
  void* base = nullptr;
  size_t size = 0;
  ~Mapping() {
    if (base != nullptr) munmap(base, size);
  }
};

std::string shape_string(const std::vector<int64_t>& shape) {
  std::string out = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i > 0) out += ", ";
    out += std::to_string(shape[i]);
  }
  return out + "]";
}

int64_t TensorView::num_elements() const {
  int64_t n = 1;
  for (int64_t d : shape)
    n *= d;
  return n;
}

std::string TensorView::shape_string() const {
  return engine::shape_string(shape);
}

SafetensorsCheckpoint SafetensorsCheckpoint::open_file(const std::filesystem::path& file) {
  SafetensorsCheckpoint checkpoint;
  checkpoint.description_ = file.string();
  checkpoint.add_file(file);
  return checkpoint;
}

SafetensorsCheckpoint SafetensorsCheckpoint::open(const std::filesystem::path& model_dir) {
  const std::filesystem::path index_file = model_dir / kIndexFile;
  const std::filesystem::path single_file = model_dir / kSingleFile;
  SafetensorsCheckpoint checkpoint;
  checkpoint.description_ = model_dir.string();
  if (!std::filesystem::exists(index_file)) {
    if (!std::filesystem::exists(single_file)) {
      throw ConfigError(model_dir.string() + ": no " + kSingleFile + " or " + kIndexFile);
    }
    checkpoint.add_file(single_file);
    return checkpoint;
  }

  const std::string origin = index_file.string();
  json index;
  try {
    index = json::parse(read_config_file(index_file));
  } catch (const json::exception& e) {  // parse_error; out_of_range for 1e400
    throw ConfigError(origin + ": not valid JSON: " + e.what());
  }
  auto map = index.is_object() ? index.find("weight_map") : index.end();
  if (map == index.end() || !map->is_object()) {
    throw ConfigError(origin + ": field 'weight_map' is missing or not an object");
  }
  std::map<std::string, std::string> shard_of;  // tensor -> shard file name
  std::set<std::string> shards;
  for (auto it = map->begin(); it != map->end(); ++it) {
    if (!it.value().is_string()) {
      throw ConfigError(origin + ": field 'weight_map." + it.key() + "' must be a file name");
    }
    const std::string shard = it.value().get<std::string>();
    // Shards are siblings of the index; anything else is not a checkpoint we trust.
    if (shard.empty() || shard.find('/') != std::string::npos || shard == "." || shard == "..") {
      throw ConfigError(origin + ": field 'weight_map." + it.key() + "' names '" + shard +
                        "', not a file in the model directory");
    }
    shard_of[it.key()] = shard;
    shards.insert(shard);
  }
  for (const std::string& shard : shards)
    checkpoint.add_file(model_dir / shard);
  for (const auto& [tensor, shard] : shard_of) {
    auto it = checkpoint.tensors_.find(tensor);
    if (it == checkpoint.tensors_.end()) {
      throw ConfigError(origin + ": tensor '" + tensor + "' is listed in shard " + shard +
                        ", which does not hold it");
    }
    if (std::filesystem::path(it->second.file).filename() != shard) {
      throw ConfigError(origin + ": tensor '" + tensor + "' is listed in shard " + shard +
                        " but found in " + it->second.file);
    }
  }
  return checkpoint;
}

void SafetensorsCheckpoint::add_file(const std::filesystem::path& path) {
  const std::string file = path.string();
  const int fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw ConfigError(file + ": cannot open file: " + errno_text());
  struct stat st {};
  if (fstat(fd, &st) != 0) {
    const std::string why = errno_text();
    ::close(fd);
    throw ConfigError(file + ": cannot stat file: " + why);
  }
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  if (size < 8) {
    ::close(fd);
    throw ConfigError(file + ": truncated: " + std::to_string(size) +
                      " bytes, shorter than the 8-byte header length");
  }
  auto mapping = std::make_shared<Mapping>();
  void* base = mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  const std::string why = errno_text();
  ::close(fd);  // the mapping keeps the file alive
  if (base == MAP_FAILED) throw ConfigError(file + ": cannot map file: " + why);
  mapping->base = base;
  mapping->size = size;
  const auto* bytes = static_cast<const uint8_t*>(base);

  const uint64_t header_size = read_le64(bytes);
  if (header_size > size - 8 || header_size > kMaxHeaderBytes) {
    throw ConfigError(file + ": header length " + std::to_string(header_size) +
                      " goes beyond the end of the file (" + std::to_string(size) + " bytes)");
  }
  json header;
  try {
    header = json::parse(bytes + 8, bytes + 8 + header_size);
  } catch (const json::exception& e) {  // parse_error; out_of_range for 1e400
    throw ConfigError(file + ": header is not valid JSON: " + e.what());
  }
  if (!header.is_object()) throw ConfigError(file + ": header is not a JSON object");

  const uint64_t data_start = 8 + header_size;
  const uint64_t data_size = size - data_start;
  struct Span {
    uint64_t begin, end;
    const std::string* name;
  };
  std::vector<Span> spans;
  for (auto it = header.begin(); it != header.end(); ++it) {
    const std::string& name = it.key();
    const json& entry = it.value();
    if (name == "__metadata__") {
      if (!entry.is_object()) throw ConfigError(file + ": '__metadata__' is not an object");
      if (mappings_.empty()) {
        for (auto m = entry.begin(); m != entry.end(); ++m) {
          if (m.value().is_string()) metadata_[m.key()] = m.value().get<std::string>();
        }
      }
      continue;
    }
    const std::string where = file + ": tensor '" + name + "'";
    if (!entry.is_object()) throw ConfigError(where + ": header entry is not an object");
    auto dtype_it = entry.find("dtype");
    auto shape_it = entry.find("shape");
    auto offsets_it = entry.find("data_offsets");
    if (dtype_it == entry.end() || !dtype_it->is_string()) {
      throw ConfigError(where + ": field 'dtype' is missing or not a string");
    }
    TensorView view;
    view.name = name;
    view.file = file;
    const std::string dtype_name = dtype_it->get<std::string>();
    if (!parse_dtype(dtype_name, &view.dtype)) {
      throw ConfigError(where + " has dtype " + dtype_name +
                        ", which is not supported (only F32, F16, BF16)");
    }
    if (shape_it == entry.end() || !shape_it->is_array()) {
      throw ConfigError(where + ": field 'shape' is missing or not a list");
    }
    uint64_t elements = 1;
    for (const json& d : *shape_it) {
      if (!d.is_number_unsigned() && !(d.is_number_integer() && d.get<int64_t>() >= 0)) {
        throw ConfigError(where + ": field 'shape' holds " + d.dump() +
                          ", not a non-negative integer");
      }
      const uint64_t dim = d.get<uint64_t>();
      if (dim != 0 && elements > (uint64_t{1} << 48) / dim) {
        throw ConfigError(where + ": shape " + shape_it->dump() + " is implausibly large");
      }
      elements *= dim;
      view.shape.push_back(static_cast<int64_t>(dim));
    }
    if (offsets_it == entry.end() || !offsets_it->is_array() || offsets_it->size() != 2 ||
        !(*offsets_it)[0].is_number_unsigned() || !(*offsets_it)[1].is_number_unsigned()) {
      throw ConfigError(where + ": field 'data_offsets' must be two non-negative integers");
    }
    const uint64_t begin = (*offsets_it)[0].get<uint64_t>();
    const uint64_t end = (*offsets_it)[1].get<uint64_t>();
    if (begin > end || end > data_size) {
      throw ConfigError(where + ": data_offsets [" + std::to_string(begin) + ", " +
                        std::to_string(end) + "] lie outside the data section (" +
                        std::to_string(data_size) + " bytes)");
    }
    const uint64_t expected = elements * static_cast<uint64_t>(kernels::dtype_size(view.dtype));
    if (end - begin != expected) {
      throw ConfigError(where + ": data_offsets span " + std::to_string(end - begin) +
                        " bytes, but " + dtype_name + " " + view.shape_string() + " needs " +
                        std::to_string(expected));
    }
    view.data = bytes + data_start + begin;
    if (end > begin) spans.push_back({begin, end, &name});  // an empty one holds no bytes
    if (tensors_.count(name)) {
      throw ConfigError(where + " also appears in " + tensors_[name].file);
    }
    tensors_.emplace(name, std::move(view));
  }
  // Tensors over the same bytes would alias each other (the reference library refuses
  // them too).
  std::sort(spans.begin(), spans.end(),
            [](const Span& a, const Span& b) { return a.begin < b.begin; });
  for (size_t i = 1; i < spans.size(); ++i) {
    const Span& a = spans[i - 1];
    const Span& b = spans[i];
    if (b.begin < a.end) {
      throw ConfigError(file + ": tensors '" + *a.name + "' [" + std::to_string(a.begin) + ", " +
                        std::to_string(a.end) + "] and '" + *b.name + "' [" +
                        std::to_string(b.begin) + ", " + std::to_string(b.end) +
                        "] overlap in the data section");
    }
  }
  mappings_.push_back(std::move(mapping));
}

bool SafetensorsCheckpoint::contains(const std::string& name) const {
  return tensors_.count(name) > 0;
}

const TensorView& SafetensorsCheckpoint::get(const std::string& name) const {
  auto it = tensors_.find(name);
  if (it == tensors_.end()) throw ConfigError(description_ + ": tensor '" + name + "' is missing");
  return it->second;
}

const TensorView& SafetensorsCheckpoint::get(const std::string& name,
                                             const std::vector<int64_t>& shape) const {
  const TensorView& view = get(name);
  if (view.shape != shape) {
    throw ConfigError(view.file + ": tensor '" + name + "' has shape " + view.shape_string() +
                      ", expected " + engine::shape_string(shape));
  }
  return view;
}

int64_t SafetensorsCheckpoint::num_parameters() const {
  int64_t n = 0;
  for (const auto& [name, view] : tensors_)
    n += view.num_elements();
  return n;
}

// ---- writing ----

SafetensorsWriter::SafetensorsWriter(const std::filesystem::path& file,
                                     std::vector<TensorLayout> tensors,
                                     const std::map<std::string, std::string>& metadata)
    : file_(file), tensors_(std::move(tensors)) {
  json header = json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::vector<uint64_t> begins;
  uint64_t offset = 0;
  std::set<std::string> names;
  for (const TensorLayout& t : tensors_) {
    if (t.name == "__metadata__" || !names.insert(t.name).second) {
      throw ConfigError(file.string() + ": tensor name '" + t.name + "' is reserved or repeated");
    }
    uint64_t bytes = static_cast<uint64_t>(kernels::dtype_size(t.dtype));
    for (int64_t d : t.shape) {
      if (d < 0) throw ConfigError(file.string() + ": tensor '" + t.name + "' has a negative dim");
      bytes *= static_cast<uint64_t>(d);
    }
    header[t.name] = {{"dtype", kernels::dtype_name(t.dtype)},
                      {"shape", t.shape},
                      {"data_offsets", {offset, offset + bytes}}};
    begins.push_back(offset);
    offset += bytes;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  const uint64_t data_start = 8 + text.size();
  for (uint64_t b : begins)
    offsets_.push_back(data_start + b);
  file_size_ = data_start + offset;

  temp_file_ = file_;
  temp_file_ += ".partial";
  fd_ = ::open(temp_file_.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) throw ConfigError(temp_file_.string() + ": cannot create file: " + errno_text());
  if (ftruncate(fd_, static_cast<off_t>(file_size_)) != 0) {
    const std::string why = errno_text();
    ::close(fd_);
    std::filesystem::remove(temp_file_);
    throw ConfigError(temp_file_.string() + ": cannot size file: " + why);
  }
  void* base = mmap(nullptr, file_size_, PROT_READ | PROT_WRITE, MAP_SHARED, fd_, 0);
  if (base == MAP_FAILED) {
    const std::string why = errno_text();
    ::close(fd_);
    std::filesystem::remove(temp_file_);
    throw ConfigError(temp_file_.string() + ": cannot map file: " + why);
  }
  base_ = static_cast<uint8_t*>(base);
  const uint64_t header_size = text.size();
  for (int i = 0; i < 8; ++i)
    base_[i] = static_cast<uint8_t>(header_size >> (8 * i));
  std::memcpy(base_ + 8, text.data(), text.size());
}

std::span<uint8_t> SafetensorsWriter::data(size_t index) {
  const uint64_t begin = offsets_.at(index);
  const uint64_t end = index + 1 < offsets_.size() ? offsets_[index + 1] : file_size_;
  return {base_ + begin, static_cast<size_t>(end - begin)};
}

void SafetensorsWriter::commit() {
  if (base_ == nullptr) throw ConfigError(file_.string() + ": already committed");
  munmap(base_, file_size_);
  base_ = nullptr;
  const int rc = ::close(fd_);
  fd_ = -1;
  if (rc != 0) throw ConfigError(temp_file_.string() + ": cannot write file: " + errno_text());
  std::error_code ec;
  std::filesystem::rename(temp_file_, file_, ec);
  if (ec) throw ConfigError(file_.string() + ": cannot rename into place: " + ec.message());
}

SafetensorsWriter::~SafetensorsWriter() {
  if (base_ == nullptr) return;
  munmap(base_, file_size_);
  ::close(fd_);
  std::error_code ignored;
  std::filesystem::remove(temp_file_, ignored);
}

void write_safetensors(const std::filesystem::path& file, const std::vector<TensorToWrite>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  std::vector<TensorLayout> layout;
  for (const TensorToWrite& t : tensors)
    layout.push_back({t.name, t.dtype, t.shape});
  SafetensorsWriter writer(file, std::move(layout), metadata);
  for (size_t i = 0; i < tensors.size(); ++i) {
    const std::span<uint8_t> out = writer.data(i);
    if (tensors[i].bytes.size() != out.size()) {
      throw ConfigError(file.string() + ": tensor '" + tensors[i].name + "' has " +
                        std::to_string(tensors[i].bytes.size()) + " bytes, but its shape " +
                        shape_string(tensors[i].shape) + " needs " + std::to_string(out.size()));
    }
    if (!out.empty()) std::memcpy(out.data(), tensors[i].bytes.data(), out.size());
  }
  writer.commit();
}

}  // namespace pagellm::engine

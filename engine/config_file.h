#pragma once
// A model folder's JSON files (config.json, generation_config.json, tokenizer_config.json)
// read and parsed, with ConfigErrors (tokenizer_config.h) that name the file. It brings
// nlohmann/json with it: include it from .cpp files only.

#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>

namespace pagellm::engine {

// The whole file; ConfigError when it cannot be opened.
std::string read_config_file(const std::filesystem::path& path);

// The JSON object `text` holds; ConfigError, naming `origin`, when it is not valid JSON or
// not an object.
nlohmann::json parse_config_object(const std::string& text, const std::string& origin);

}  // namespace pagellm::engine

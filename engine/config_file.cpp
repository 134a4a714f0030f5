#include "engine/config_file.h"

#include <fstream>
#include <sstream>

#include "engine/tokenizer_config.h"

namespace pagellm::engine {

std::string read_config_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw ConfigError(path.string() + ": cannot open file");
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

nlohmann::json parse_config_object(const std::string& text, const std::string& origin) {
  nlohmann::json value;
  try {
    value = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    // parse_error, and out_of_range for a number past a double's range (1e400).
    throw ConfigError(origin + ": not valid JSON: " + e.what());
  }
  if (!value.is_object()) throw ConfigError(origin + ": expected a JSON object at the top level");
  return value;
}

}  // namespace pagellm::engine

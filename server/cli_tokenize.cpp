// `pagellm tokenize`: JSON lines in, JSON lines out, for scripts and for checking the
// tokenizer against other implementations.

#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>

#include "engine/tokenizer.h"
#include "server/cli.h"
#include "server/cli_args.h"

namespace pagellm::cli {
namespace {

constexpr const char* kUsage =
    "usage: pagellm tokenize --model DIR [--decode] [--add-special-tokens]\n"
    "\n"
    "Reads one JSON value per line on stdin and writes one per line on stdout:\n"
    "  encode (default): a JSON string in, a JSON array of token ids out; special\n"
    "                    tokens (BOS/EOS) are added only with --add-special-tokens.\n"
    "  --decode:         a JSON array of token ids in, the decoded JSON string out.\n"
    "DIR needs tokenizer.json (and tokenizer_config.json if the model has one).\n"
    "A line that cannot be handled is reported on stderr with its number and answered\n"
    "with `null`; the exit status is then 1.\n";

using nlohmann::json;

// One output line for one input line; throws std::runtime_error with the reason.
std::string handle_line(const engine::Tokenizer& tokenizer, const std::string& line, bool decode,
                        bool add_special_tokens) {
  json input;
  try {
    input = json::parse(line);
  } catch (const json::parse_error& e) {
    throw std::runtime_error(std::string("not valid JSON: ") + e.what());
  }
  if (!decode) {
    if (!input.is_string()) throw std::runtime_error("expected a JSON string");
    return json(tokenizer.encode(input.get_ref<const std::string&>(), add_special_tokens)).dump();
  }
  if (!input.is_array()) throw std::runtime_error("expected a JSON array of token ids");
  std::vector<engine::TokenId> ids;
  ids.reserve(input.size());
  for (const json& id : input) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0 ||
        id.get<int64_t>() >= static_cast<int64_t>(tokenizer.vocab_size())) {
      throw std::runtime_error("token id " + id.dump() + " is not an integer in [0, " +
                               std::to_string(tokenizer.vocab_size()) + ")");
    }
    ids.push_back(static_cast<engine::TokenId>(id.get<int64_t>()));
  }
  return json(tokenizer.decode(ids)).dump(-1, ' ', false, json::error_handler_t::replace);
}

}  // namespace

int run_tokenize(Args args) {
  std::string model_dir;
  bool decode = false;
  bool add_special_tokens = false;
  try {
    ArgReader reader(args, {"--model"}, {"--decode", "--add-special-tokens"});
    if (reader.help()) {
      std::fputs(kUsage, stdout);
      return 0;
    }
    if (!reader.positional().empty()) {
      throw UsageError("unexpected argument '" + reader.positional().front() + "'");
    }
    model_dir = reader.required_option("--model");
    decode = reader.flag("--decode");
    add_special_tokens = reader.flag("--add-special-tokens");
    if (decode && add_special_tokens) {
      throw UsageError("--add-special-tokens applies to encoding, not to --decode");
    }
  } catch (const UsageError& e) {
    std::fprintf(stderr, "pagellm tokenize: %s\n\n%s", e.what(), kUsage);
    return 2;
  }

  std::optional<engine::Tokenizer> tokenizer;
  try {
    tokenizer = engine::Tokenizer::from_dir(model_dir);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "pagellm tokenize: %s\n", e.what());
    return 1;
  }

  std::ios::sync_with_stdio(false);
  std::string line;
  size_t line_number = 0;
  size_t failed = 0;
  while (std::getline(std::cin, line)) {
    ++line_number;
    std::string out;
    try {
      out = handle_line(*tokenizer, line, decode, add_special_tokens);
    } catch (const std::exception& e) {
      ++failed;
      std::cerr << "pagellm tokenize: line " << line_number << ": " << e.what() << '\n';
      out = "null";
    }
    // Flushed per line so that a caller can talk to the process through a pipe.
    std::cout << out << '\n' << std::flush;
  }
  return failed == 0 ? 0 : 1;
}

}  // namespace pagellm::cli

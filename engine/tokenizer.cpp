#include "engine/tokenizer.h"

#include <algorithm>
#include <fstream>

#include "engine/regex.h"
#include "engine/tokenizer_impl.h"
#include "engine/tokenizer_json.h"
#include "engine/utf8.h"

namespace pagellm::engine {
namespace {

using nlohmann::json;

std::string read_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) throw TokenizerError(path.string() + ": cannot open file");
  const std::streamoff size = in.tellg();
  if (size < 0) throw TokenizerError(path.string() + ": cannot read file");
  std::string text(static_cast<size_t>(size), '\0');
  in.seekg(0);
  if (!in.read(text.data(), size)) throw TokenizerError(path.string() + ": read error");
  return text;
}

std::vector<AddedToken> parse_added_tokens(const json& doc, const SpecReader& reader) {
  std::vector<AddedToken> out;
  auto it = doc.find("added_tokens");
  if (it == doc.end() || it->is_null()) return out;
  if (!it->is_array()) reader.fail("added_tokens", "expected a list");
  for (size_t i = 0; i < it->size(); ++i) {
    const json& entry = (*it)[i];
    const std::string where = "added_tokens[" + std::to_string(i) + "]";
    AddedToken token;
    const json& id = reader.require(entry, where, "id");
    if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() >= kMaxTokenId) {
      reader.fail(where + ".id", "expected an integer in [0, " + std::to_string(kMaxTokenId) + ")");
    }
    token.id = static_cast<TokenId>(id.get<int64_t>());
    token.content = reader.string_field(entry, where, "content");
    if (token.content.empty()) reader.fail(where + ".content", "must not be empty");
    token.special = reader.bool_or(entry, where, "special", false);
    token.lstrip = reader.bool_or(entry, where, "lstrip", false);
    token.rstrip = reader.bool_or(entry, where, "rstrip", false);
    token.single_word = reader.bool_or(entry, where, "single_word", false);
    token.normalized = reader.bool_or(entry, where, "normalized", !token.special);
    out.push_back(std::move(token));
  }
  return out;
}

// The ids a post-processor puts before and after a single sequence.
void parse_post_processor(const json& spec, const std::string& where, const SpecReader& reader,
                          std::vector<TokenId>& prefix, std::vector<TokenId>& suffix) {
  if (spec.is_null()) return;
  const std::string type = reader.type_of(spec, where);
  if (type == "ByteLevel") return;  // only adjusts offsets
  if (type == "Sequence") {
    const json& list = reader.require(spec, where, "processors");
    if (!list.is_array()) reader.fail(where + ".processors", "expected a list");
    for (size_t i = 0; i < list.size(); ++i) {
      parse_post_processor(list[i], where + ".processors[" + std::to_string(i) + "]", reader,
                           prefix, suffix);
    }
    return;
  }
  if (type == "TemplateProcessing") {
    const json& single = reader.require(spec, where, "single");
    const json& specials = reader.require(spec, where, "special_tokens");
    if (!single.is_array()) reader.fail(where + ".single", "expected a list");
    bool seen_sequence = false;
    for (size_t i = 0; i < single.size(); ++i) {
      const json& piece = single[i];
      const std::string piece_where = where + ".single[" + std::to_string(i) + "]";
      if (piece.is_object() && piece.contains("Sequence")) {
        seen_sequence = true;
        continue;
      }
      if (!piece.is_object() || !piece.contains("SpecialToken")) {
        reader.fail(piece_where, "expected a SpecialToken or Sequence entry");
      }
      const std::string name =
          reader.string_field(piece["SpecialToken"], piece_where + ".SpecialToken", "id");
      if (!specials.is_object() || !specials.contains(name)) {
        reader.fail(where + ".special_tokens", "no entry for '" + name + "'");
      }
      const json& ids = reader.require(specials[name], where + ".special_tokens." + name, "ids");
      if (!ids.is_array())
        reader.fail(where + ".special_tokens." + name + ".ids", "expected a list");
      for (const json& id : ids) {
        if (!id.is_number_integer()) {
          reader.fail(where + ".special_tokens." + name + ".ids", "expected integers");
        }
        (seen_sequence ? suffix : prefix).push_back(id.get<TokenId>());
      }
    }
    return;
  }
  if (type == "RobertaProcessing" || type == "BertProcessing") {
    auto token_id = [&](const char* key) {
      const json& pair = reader.require(spec, where, key);
      if (!pair.is_array() || pair.size() != 2 || !pair[1].is_number_integer()) {
        reader.fail(where + "." + key, "expected [token, id]");
      }
      return pair[1].get<TokenId>();
    };
    prefix.push_back(token_id("cls"));
    suffix.push_back(token_id("sep"));
    return;
  }
  reader.fail(where + ".type", "unsupported post_processor '" + type + "'");
}

// tokenizer_config.json's add_bos_token/add_eos_token, when set, win over the
// post-processor (transformers rebuilds the template from them).
void apply_config_overrides(const TokenizerConfig& config, Tokenizer::Impl& impl) {
  auto adjust = [](std::vector<TokenId>& ids, std::optional<TokenId> token, std::optional<bool> add,
                   bool front) {
    if (!add || !token) return;
    const bool present = std::find(ids.begin(), ids.end(), *token) != ids.end();
    if (*add && !present) {
      ids.insert(front ? ids.begin() : ids.end(), *token);
    } else if (!*add && present) {
      ids.erase(std::remove(ids.begin(), ids.end(), *token), ids.end());
    }
  };
  adjust(impl.prefix, impl.bos, config.add_bos_token, true);
  adjust(impl.suffix, impl.eos, config.add_eos_token, false);
}

}  // namespace

void Tokenizer::Impl::encode_text(std::string text, bool at_origin,
                                  std::vector<TokenId>& out) const {
  if (normalizer) normalizer->normalize(text);
  std::vector<PreToken> pieces;
  if (normalized_matcher.empty()) {
    pieces.push_back({std::move(text), at_origin});
  } else {
    std::vector<TextSegment> segments;
    normalized_matcher.split(text, segments);
    for (const TextSegment& seg : segments) {
      if (seg.token >= 0) {
        // Flush the text before the token so that ids stay in order.
        if (pre_tokenizer) pre_tokenizer->pre_tokenize(pieces);
        for (const PreToken& piece : pieces)
          model->tokenize(piece.text, out);
        pieces.clear();
        out.push_back(added[seg.token].id);
      } else {
        pieces.push_back(
            {text.substr(seg.start, seg.end - seg.start), at_origin && seg.start == 0});
      }
    }
  }
  if (pre_tokenizer) pre_tokenizer->pre_tokenize(pieces);
  for (const PreToken& piece : pieces)
    model->tokenize(piece.text, out);
}

Tokenizer Tokenizer::from_file(const std::filesystem::path& tokenizer_json,
                               const TokenizerConfig& config) {
  const std::string origin = tokenizer_json.string();
  TokenizerJson data = parse_tokenizer_json(read_file(tokenizer_json), origin);
  const SpecReader reader(origin);
  const json& doc = data.doc;
  auto impl = std::make_shared<Impl>();
  impl->origin = origin;

  const json& model_spec = reader.require(doc, "", "model");
  if (!model_spec.is_object()) reader.fail("model", "expected an object");
  std::string model_type = reader.string_or(model_spec, "model", "type", "");
  if (model_type.empty() && data.has_merges) model_type = "BPE";  // untagged, as HF reads it
  if (model_type.empty()) reader.fail("model.type", "missing");
  if (model_type != "BPE") {
    reader.fail("model.type",
                "unsupported model type '" + model_type + "' (only BPE is implemented)");
  }
  impl->model = std::make_unique<BpeModel>(model_spec, data, reader);

  auto field = [&](const char* key) -> const json& {
    static const json null_value;
    auto it = doc.find(key);
    return it == doc.end() ? null_value : *it;
  };
  impl->normalizer = make_normalizer(field("normalizer"), "normalizer", reader);
  impl->pre_tokenizer = make_pre_tokenizer(field("pre_tokenizer"), "pre_tokenizer", reader);
  impl->decoder = TokenDecoder(field("decoder"), "decoder", reader);

  impl->added = parse_added_tokens(doc, reader);
  size_t bound = impl->model->id_bound();
  for (const AddedToken& token : impl->added)
    bound = std::max(bound, static_cast<size_t>(token.id) + 1);
  impl->vocab_size = bound;
  impl->added_index.assign(bound, -1);
  std::vector<std::string> raw_patterns, normalized_patterns;
  for (size_t i = 0; i < impl->added.size(); ++i) {
    const AddedToken& token = impl->added[i];
    impl->added_index[token.id] = static_cast<int32_t>(i);
    if (token.normalized && impl->normalizer) {
      // Matched against normalized text, so the token is normalized the same way.
      std::string content = token.content;
      impl->normalizer->normalize(content);
      raw_patterns.emplace_back();
      normalized_patterns.push_back(std::move(content));
    } else {
      raw_patterns.push_back(token.content);
      normalized_patterns.emplace_back();
    }
  }
  impl->raw_matcher.build(impl->added, raw_patterns);
  impl->normalized_matcher.build(impl->added, normalized_patterns);

  parse_post_processor(field("post_processor"), "post_processor", reader, impl->prefix,
                       impl->suffix);
  Tokenizer tokenizer(impl);
  if (config.bos_token) impl->bos = tokenizer.token_to_id(*config.bos_token);
  if (config.eos_token) impl->eos = tokenizer.token_to_id(*config.eos_token);
  if (!impl->bos && !impl->prefix.empty()) impl->bos = impl->prefix.front();
  if (!impl->eos && !impl->suffix.empty()) impl->eos = impl->suffix.back();
  apply_config_overrides(config, *impl);
  impl->cleanup = config.clean_up_tokenization_spaces;
  return tokenizer;
}

Tokenizer Tokenizer::from_dir(const std::filesystem::path& model_dir) {
  TokenizerConfig config;
  try {
    config = load_tokenizer_config(model_dir);
  } catch (const ConfigError& e) {
    throw TokenizerError(e.what());
  }
  return from_file(model_dir / "tokenizer.json", config);
}

std::vector<TokenId> Tokenizer::encode(std::string_view text, bool add_special_tokens) const {
  const Impl& impl = *impl_;
  std::vector<TokenId> out;
  out.reserve(text.size() / 3 + 8);
  if (add_special_tokens) out.insert(out.end(), impl.prefix.begin(), impl.prefix.end());
  const std::string clean = utf8::sanitize(text);
  std::vector<TextSegment> segments;
  impl.raw_matcher.split(clean, segments);
  try {
    for (const TextSegment& seg : segments) {
      if (seg.token >= 0) {
        out.push_back(impl.added[seg.token].id);
      } else {
        impl.encode_text(clean.substr(seg.start, seg.end - seg.start), seg.start == 0, out);
      }
    }
  } catch (const RegexError& e) {
    throw TokenizerError(impl.origin + ": cannot split the text: " + e.what());
  }
  if (add_special_tokens) out.insert(out.end(), impl.suffix.begin(), impl.suffix.end());
  return out;
}

std::string Tokenizer::decode(std::span<const TokenId> ids, bool skip_special_tokens,
                              std::optional<bool> clean_up_tokenization_spaces) const {
  const Impl& impl = *impl_;
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (TokenId id : ids) {
    const std::string* token = impl.token_string(id);
    if (token == nullptr) continue;
    if (skip_special_tokens && impl.is_special(id)) continue;
    tokens.push_back(*token);
  }
  std::string text = impl.decoder.decode(std::move(tokens));
  if (clean_up_tokenization_spaces.value_or(impl.cleanup))
    text = clean_up_tokenization(std::move(text));
  return text;
}

std::optional<TokenId> Tokenizer::token_to_id(std::string_view token) const {
  for (const AddedToken& added : impl_->added) {
    if (added.content == token) return added.id;
  }
  return impl_->model->token_to_id(token);
}

std::optional<std::string> Tokenizer::id_to_token(TokenId id) const {
  const std::string* token = impl_->token_string(id);
  if (token == nullptr) return std::nullopt;
  return *token;
}

size_t Tokenizer::vocab_size() const {
  return impl_->vocab_size;
}
bool Tokenizer::is_special(TokenId id) const {
  return impl_->is_special(id);
}
std::optional<TokenId> Tokenizer::bos_id() const {
  return impl_->bos;
}
std::optional<TokenId> Tokenizer::eos_id() const {
  return impl_->eos;
}
bool Tokenizer::clean_up_tokenization_spaces() const {
  return impl_->cleanup;
}

}  // namespace pagellm::engine

// Tokenizer against the Hugging Face reference outputs of two real tokenizers
// (tokenizers/{llama3,qwen3}/cases.jsonl in the shared data), plus error handling.

#include "engine/tokenizer.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <thread>

#include "engine/utf8.h"
#include "support/sentencepiece_fixture.h"
#include "support/test_data.h"

namespace pagellm::engine {
namespace {

using nlohmann::json;

struct Case {
  std::string text;
  std::vector<TokenId> ids;
  std::string decoded, decoded_raw;
};

std::vector<Case> load_cases(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::vector<Case> cases;
  std::string line;
  while (std::getline(in, line, '\n')) {  // only \n ends a line (U+2028 may be inside)
    if (line.empty()) continue;
    const json c = json::parse(line);
    cases.push_back({c.at("text").get<std::string>(), c.at("ids").get<std::vector<TokenId>>(),
                     c.at("decoded").get<std::string>(), c.at("decoded_raw").get<std::string>()});
  }
  return cases;
}

// One tokenizer per model, loaded once for the whole file.
const Tokenizer& tokenizer_for(const std::string& model) {
  static std::map<std::string, Tokenizer> loaded;
  auto it = loaded.find(model);
  if (it == loaded.end()) {
    it =
        loaded
            .emplace(model, Tokenizer::from_dir(*testing::shared_data_dir() / "tokenizers" / model))
            .first;
  }
  return it->second;
}

class ReferenceCases : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    const auto data = testing::shared_data_dir();
    if (!data) GTEST_SKIP() << "shared test data not found (set PAGELLM_TEST_DATA)";
    cases_ = load_cases(*data / "tokenizers" / GetParam() / "cases.jsonl");
    ASSERT_GE(cases_.size(), 70u) << "cases.jsonl is incomplete";
  }
  const Tokenizer& tokenizer() const { return tokenizer_for(GetParam()); }
  std::vector<Case> cases_;
};

TEST_P(ReferenceCases, EncodeMatchesHuggingFace) {
  for (const Case& c : cases_) {
    EXPECT_EQ(tokenizer().encode(c.text), c.ids) << "text: " << json(c.text).dump();
  }
}

TEST_P(ReferenceCases, DecodeMatchesHuggingFace) {
  for (const Case& c : cases_) {
    EXPECT_EQ(tokenizer().decode(c.ids), c.decoded) << "text: " << json(c.text).dump();
  }
}

TEST_P(ReferenceCases, DecodeWithoutCleanupMatchesHuggingFace) {
  for (const Case& c : cases_) {
    EXPECT_EQ(tokenizer().decode(c.ids, false, false), c.decoded_raw)
        << "text: " << json(c.text).dump();
  }
}

TEST_P(ReferenceCases, InvalidUtf8IsReplacedNotRejected) {
  const Tokenizer& tok = tokenizer();
  // Stray continuation byte, truncated sequence, overlong form, surrogate, 0xFF.
  const std::string inputs[] = {"a\x80z",        "a\xE2\x82z", "\xC0\xAF",
                                "\xED\xA0\x80x", "\xFF",       "\xF0\x9F\x98"};
  const std::string expected[] = {"a\uFFFDz", "a\uFFFDz", "\uFFFD\uFFFD", "\uFFFD\uFFFD\uFFFDx",
                                  "\uFFFD",   "\uFFFD"};
  for (size_t i = 0; i < std::size(inputs); ++i) {
    EXPECT_EQ(tok.encode(inputs[i]), tok.encode(expected[i])) << "input " << i;
  }
}

TEST_P(ReferenceCases, ConcurrentEncodersAgree) {
  // The word cache is shared between threads. (The tokenizer is loaded before they start:
  // the test's own cache of loaded tokenizers is not thread-safe.)
  const Tokenizer& tok = tokenizer();
  std::vector<std::thread> threads;
  std::atomic<int> mismatches{0};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int round = 0; round < 5; ++round) {
        for (size_t i = t; i < cases_.size(); i += 2) {
          if (tok.encode(cases_[i].text) != cases_[i].ids) ++mismatches;
        }
      }
    });
  }
  for (auto& thread : threads)
    thread.join();
  EXPECT_EQ(mismatches.load(), 0);
}

TEST_P(ReferenceCases, PathologicalInputsDoNotCrash) {
  const Tokenizer& tok = tokenizer();
  const std::string inputs[] = {std::string(100000, ' ') + "x", std::string(100000, 'a'),
                                std::string(50000, '\n'),       std::string(30000, '\xFF'),
                                std::string(3, '\0'),           std::string(100000, '!')};
  for (const std::string& text : inputs) {
    const auto ids = tok.encode(text);
    EXPECT_FALSE(ids.empty());
    if (utf8::is_valid(text)) {
      EXPECT_EQ(tok.decode(ids, false, false), text);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Models, ReferenceCases, ::testing::Values("llama3", "qwen3"));

class RealTokenizers : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!testing::shared_data_dir())
      GTEST_SKIP() << "shared test data not found (set PAGELLM_TEST_DATA)";
  }
};

TEST_F(RealTokenizers, Llama3SpecialTokensAndIds) {
  const Tokenizer& tok = tokenizer_for("llama3");
  EXPECT_EQ(tok.vocab_size(), 128256u);
  EXPECT_EQ(tok.bos_id(), 128000);
  EXPECT_EQ(tok.eos_id(), 128001);
  EXPECT_EQ(tok.token_to_id("<|eot_id|>"), 128009);
  EXPECT_EQ(tok.id_to_token(128006), "<|start_header_id|>");
  EXPECT_TRUE(tok.is_special(128009));
  EXPECT_FALSE(tok.is_special(9906));
  EXPECT_EQ(tok.encode("Hello<|eot_id|>world"), (std::vector<TokenId>{9906, 128009, 14957}));
  // The post-processor is ByteLevel only: no BOS even when special tokens are asked for.
  EXPECT_EQ(tok.encode("Hello", true), tok.encode("Hello", false));
  EXPECT_EQ(tok.decode(std::vector<TokenId>{128000, 9906, 128009}, true), "Hello");
  EXPECT_EQ(tok.decode(std::vector<TokenId>{9906, 999999, -1}), "Hello");  // unknown ids skipped
}

TEST_F(RealTokenizers, Qwen3AddedTokensSpecialOrNot) {
  const Tokenizer& tok = tokenizer_for("qwen3");
  EXPECT_EQ(tok.vocab_size(), 151669u);
  EXPECT_FALSE(tok.bos_id().has_value());
  EXPECT_EQ(tok.eos_id(), 151645);
  EXPECT_EQ(tok.encode("<|im_start|>user\nhi<|im_end|>\n"),
            (std::vector<TokenId>{151644, 872, 198, 6023, 151645, 198}));
  const auto think = tok.encode("<think>x</think>");
  ASSERT_EQ(think.size(), 3u);
  EXPECT_EQ(think.front(), 151667);
  EXPECT_EQ(think.back(), 151668);
  EXPECT_FALSE(tok.is_special(151667));  // <think> is added but not special
  // skip_special_tokens drops special tokens only.
  EXPECT_EQ(tok.decode(think, true), "<think>x</think>");
  EXPECT_EQ(tok.decode(std::vector<TokenId>{151644, 872, 151645}, true), "user");
}

// Letters and digits of Unicode 15 and 16 pre-tokenize as letters and digits (the ids
// are those of Hugging Face's tokenizers 0.23), not as symbols split from their word.
TEST_F(RealTokenizers, LettersAndDigitsNewerThanUnicode14SplitAsHuggingFaceDoes) {
  const Tokenizer& llama3 = tokenizer_for("llama3");
  EXPECT_EQ(llama3.encode(" \U0001E5F1"), (std::vector<TokenId>{220, 172, 252, 245, 109}));
  EXPECT_EQ(llama3.encode("\U00016100.a"), (std::vector<TokenId>{172, 244, 226, 222, 5973}));
  EXPECT_EQ(llama3.encode("\u1c89.a"), (std::vector<TokenId>{157, 110, 231, 5973}));
  const Tokenizer& qwen3 = tokenizer_for("qwen3");
  EXPECT_EQ(qwen3.encode("\U00031350.a"), (std::vector<TokenId>{172, 109, 235, 238, 5849}));
}

// --- SentencePiece style (synthetic tokenizer.json, see sentencepiece_fixture.h) ---

Tokenizer load_sentencepiece(testing::SentencePieceStyle style,
                             const TokenizerConfig& config = {}) {
  const auto dir = testing::fresh_temp_dir("sp_tokenizer");
  const auto path = testing::write_file(dir, "tokenizer.json",
                                        testing::sentencepiece_tokenizer_json(style).dump());
  return Tokenizer::from_file(path, config);
}

using testing::byte_token_id;

TEST(SentencePieceTokenizer, LegacyNormalizerEncodesWithMergesAndByteFallback) {
  const Tokenizer tok = load_sentencepiece(testing::SentencePieceStyle::kLegacy);
  EXPECT_EQ(tok.vocab_size(), 278u);
  // "▁hello▁world": merges by rank, ▁h, ll, ▁he, llo, ▁hello, or, ▁w, ▁wor, ld, ▁world.
  EXPECT_EQ(tok.encode("hello world"), (std::vector<TokenId>{271, 276}));
  // The post-processor template adds <s>.
  EXPECT_EQ(tok.encode("hello world", true), (std::vector<TokenId>{1, 271, 276}));
  // 'i' is not a piece: its byte <0x69>.
  EXPECT_EQ(tok.encode("hi"), (std::vector<TokenId>{267, byte_token_id('i')}));
  EXPECT_EQ(tok.encode("\xC3\xA9"), (std::vector<TokenId>{259, 277}));  // é is a piece
  // 中 = E4 B8 AD, three byte tokens.
  EXPECT_EQ(
      tok.encode("\xE4\xB8\xAD"),
      (std::vector<TokenId>{259, byte_token_id(0xE4), byte_token_id(0xB8), byte_token_id(0xAD)}));
  EXPECT_EQ(tok.encode("  hello"), (std::vector<TokenId>{259, 259, 271}));
  EXPECT_EQ(tok.encode(""), std::vector<TokenId>{});
  // Text after an added token is normalized on its own, so it gets its own ▁ (as in
  // Hugging Face's legacy Llama tokenizer).
  EXPECT_EQ(tok.encode("<s>hello"), (std::vector<TokenId>{1, 271}));
}

// A merge listed twice takes the rank of its last listing, as in Hugging Face's
// tokenizers, which collect the merges into a map: "a b" (rank 1) then goes before
// "b c" (rank 2), and "abc" is ab c, not a bc.
TEST(BpeTokenizer, AMergeListedTwiceTakesItsLastRank) {
  const nlohmann::json spec = {{"model",
                                {{"type", "BPE"},
                                 {"vocab", {{"a", 0}, {"b", 1}, {"c", 2}, {"ab", 3}, {"bc", 4}}},
                                 {"merges", {"b c", "a b", "b c"}}}}};
  const auto dir = testing::fresh_temp_dir("bpe_duplicate_merge");
  const Tokenizer tok =
      Tokenizer::from_file(testing::write_file(dir, "tokenizer.json", spec.dump()));
  EXPECT_EQ(tok.encode("abc"), (std::vector<TokenId>{3, 2}));
  EXPECT_EQ(tok.encode("bc"), (std::vector<TokenId>{4}));
}

TEST(SentencePieceTokenizer, MetaspacePrependsOnlyAtTheStartOfTheInput) {
  const Tokenizer tok = load_sentencepiece(testing::SentencePieceStyle::kMetaspace);
  EXPECT_EQ(tok.encode("hello world"), (std::vector<TokenId>{271, 276}));
  // prepend_scheme "first": "hello" after <s> is not at offset 0, so no ▁: h e llo.
  EXPECT_EQ(tok.encode("<s>hello"), (std::vector<TokenId>{1, 260, 261, 270}));
}

TEST(SentencePieceTokenizer, DecodeReplacesSpacesFusesBytesAndStripsOneLeadingSpace) {
  const Tokenizer tok = load_sentencepiece(testing::SentencePieceStyle::kLegacy);
  EXPECT_EQ(tok.decode(std::vector<TokenId>{271, 276}), "hello world");
  EXPECT_EQ(tok.decode(std::vector<TokenId>{259, 259, 271}), "  hello");  // one space stripped
  EXPECT_EQ(tok.decode(std::vector<TokenId>{1, 271}), "<s> hello");
  EXPECT_EQ(tok.decode(std::vector<TokenId>{1, 271}, true), "hello");
  EXPECT_EQ(tok.decode(std::vector<TokenId>{259, byte_token_id(0xE4), byte_token_id(0xB8),
                                            byte_token_id(0xAD)}),
            "\xE4\xB8\xAD");
  // An incomplete or invalid run of byte tokens: one U+FFFD per byte (ByteFallback).
  EXPECT_EQ(tok.decode(std::vector<TokenId>{byte_token_id(0xE4), byte_token_id(0xB8), 276}),
            "\uFFFD\uFFFD world");
  EXPECT_EQ(tok.decode(std::vector<TokenId>{byte_token_id('A'), byte_token_id(0xFF)}),
            "\uFFFD\uFFFD");
}

TEST(SentencePieceTokenizer, MetaspaceDecoderDropsTheReplacementOfTheFirstTokenOnly) {
  json spec = testing::sentencepiece_tokenizer_json(testing::SentencePieceStyle::kMetaspace);
  spec["decoder"] = {{"type", "Metaspace"},
                     {"replacement", testing::kSpace},
                     {"prepend_scheme", "always"},
                     {"split", true}};
  const auto dir = testing::fresh_temp_dir("sp_metaspace_decoder");
  const Tokenizer tok =
      Tokenizer::from_file(testing::write_file(dir, "tokenizer.json", spec.dump()));
  EXPECT_EQ(tok.decode(std::vector<TokenId>{271, 276}), "hello world");
  EXPECT_EQ(tok.decode(std::vector<TokenId>{276, 271}), "world hello");
  // Byte tokens pass through the Metaspace decoder unchanged.
  EXPECT_EQ(tok.decode(std::vector<TokenId>{271, byte_token_id('!')}), "hello<0x21>");
}

TEST(SentencePieceTokenizer, AddedTokenFlagsLstripRstripSingleWord) {
  json spec = testing::sentencepiece_tokenizer_json(testing::SentencePieceStyle::kLegacy);
  auto added = [](int id, const char* content, bool lstrip, bool rstrip, bool single_word) {
    return json{{"id", id},         {"content", content}, {"single_word", single_word},
                {"lstrip", lstrip}, {"rstrip", rstrip},   {"normalized", false},
                {"special", false}};
  };
  spec["added_tokens"].push_back(added(278, "<mask>", true, false, false));
  spec["added_tokens"].push_back(added(279, "<pad>", false, true, false));
  spec["added_tokens"].push_back(added(280, "xx", false, false, true));
  const auto dir = testing::fresh_temp_dir("sp_added_flags");
  const Tokenizer tok =
      Tokenizer::from_file(testing::write_file(dir, "tokenizer.json", spec.dump()));
  EXPECT_EQ(tok.vocab_size(), 281u);
  // lstrip swallows the space before the token: "hello" alone, not "hello▁".
  EXPECT_EQ(tok.encode("hello <mask>"), (std::vector<TokenId>{271, 278}));
  // rstrip swallows the spaces after it.
  EXPECT_EQ(tok.encode("<pad>  hello"), (std::vector<TokenId>{279, 271}));
  // Without a flag, the space stays with the text: "▁hello▁" then the token.
  EXPECT_EQ(tok.encode("hello <pad>"), (std::vector<TokenId>{271, 259, 279}));
  // single_word: only as a word of its own.
  const auto inside = tok.encode("helloxx");
  EXPECT_EQ(std::count(inside.begin(), inside.end(), 280), 0);
  const auto alone = tok.encode("hello xx world");
  EXPECT_EQ(std::count(alone.begin(), alone.end(), 280), 1);
  EXPECT_FALSE(tok.is_special(280));
  EXPECT_EQ(tok.token_to_id("xx"), 280);
}

TEST(SentencePieceTokenizer, ConfigAddBosAndEosOverrideThePostProcessor) {
  TokenizerConfig config;
  config.bos_token = "<s>";
  config.eos_token = "</s>";
  config.add_bos_token = false;
  config.add_eos_token = true;
  const Tokenizer tok = load_sentencepiece(testing::SentencePieceStyle::kLegacy, config);
  EXPECT_EQ(tok.bos_id(), 1);
  EXPECT_EQ(tok.eos_id(), 2);
  EXPECT_EQ(tok.encode("hello", true), (std::vector<TokenId>{271, 2}));
  EXPECT_EQ(tok.encode("hello", false), (std::vector<TokenId>{271}));
}

// --- Broken files ---

std::string load_error(const std::string& content) {
  const auto dir = testing::fresh_temp_dir("bad_tokenizer");
  const auto path = testing::write_file(dir, "tokenizer.json", content);
  try {
    Tokenizer::from_file(path);
  } catch (const TokenizerError& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find(path.string()), std::string::npos)
        << "message does not name the file: " << message;
    return message;
  }
  ADD_FAILURE() << "loading succeeded";
  return "";
}

json valid_spec() {
  return testing::sentencepiece_tokenizer_json(testing::SentencePieceStyle::kLegacy);
}

TEST(TokenizerErrors, TruncatedFile) {
  const std::string full = valid_spec().dump();
  EXPECT_NE(load_error(full.substr(0, full.size() / 2)).find("truncated"), std::string::npos);
  EXPECT_NE(load_error("").find("not valid JSON"), std::string::npos);
}

TEST(TokenizerErrors, UnknownModelType) {
  json spec = valid_spec();
  spec["model"]["type"] = "Unigram";
  const std::string message = load_error(spec.dump());
  EXPECT_NE(message.find("model.type"), std::string::npos) << message;
  EXPECT_NE(message.find("Unigram"), std::string::npos) << message;
}

TEST(TokenizerErrors, MissingFields) {
  json spec = valid_spec();
  spec["model"].erase("vocab");
  EXPECT_NE(load_error(spec.dump()).find("model.vocab"), std::string::npos);
  spec = valid_spec();
  spec.erase("model");
  EXPECT_NE(load_error(spec.dump()).find("'model'"), std::string::npos);
  spec = valid_spec();
  spec["added_tokens"][1].erase("content");
  EXPECT_NE(load_error(spec.dump()).find("added_tokens[1].content"), std::string::npos);
  spec = valid_spec();
  spec["decoder"]["decoders"][0].erase("pattern");
  EXPECT_NE(load_error(spec.dump()).find("decoder.decoders[0].pattern"), std::string::npos);
}

TEST(TokenizerErrors, MalformedContent) {
  json spec = valid_spec();
  spec["model"]["merges"].push_back("nospace");
  EXPECT_NE(load_error(spec.dump()).find("model.merges[10]"), std::string::npos);
  spec = valid_spec();
  spec["model"]["merges"].push_back("x y");
  EXPECT_NE(load_error(spec.dump()).find("not in the vocabulary"), std::string::npos);
  spec = valid_spec();
  spec["pre_tokenizer"] = {{"type", "Whatever"}};
  EXPECT_NE(load_error(spec.dump()).find("unsupported pre_tokenizer 'Whatever'"),
            std::string::npos);
  spec = valid_spec();
  spec["pre_tokenizer"] = {
      {"type", "Split"}, {"pattern", {{"Regex", "(unclosed"}}}, {"behavior", "Isolated"}};
  EXPECT_NE(load_error(spec.dump()).find("pre_tokenizer.pattern.Regex"), std::string::npos);
  spec = valid_spec();
  spec["model"]["vocab"]["h"] = "not a number";
  EXPECT_NE(load_error(spec.dump()).find("model.vocab"), std::string::npos);
}

TEST(TokenizerErrors, MissingFileAndDirectory) {
  try {
    Tokenizer::from_dir("/nonexistent/model");
    FAIL() << "loading succeeded";
  } catch (const TokenizerError& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/model/tokenizer.json"), std::string::npos);
  }
}

}  // namespace
}  // namespace pagellm::engine

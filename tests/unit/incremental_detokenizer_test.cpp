// IncrementalDetokenizer: streamed text equals the full decode, characters are never
// split or repeated, and broken byte sequences end as U+FFFD.

#include "engine/incremental_detokenizer.h"

#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>

#include "engine/byte_level.h"
#include "engine/utf8.h"
#include "support/sentencepiece_fixture.h"
#include "support/test_data.h"

namespace pagellm::engine {
namespace {

using nlohmann::json;

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

// Streams `ids` one at a time; every piece must be valid UTF-8.
std::vector<std::string> stream(const Tokenizer& tok, const std::vector<TokenId>& ids,
                                DetokenizeOptions options = {}) {
  IncrementalDetokenizer detok(tok, options);
  std::vector<std::string> pieces;
  for (TokenId id : ids)
    pieces.push_back(detok.add(id));
  pieces.push_back(detok.finish());
  for (const std::string& piece : pieces)
    EXPECT_TRUE(utf8::is_valid(piece))
        << json::array({piece}).dump(-1, ' ', false, json::error_handler_t::replace);
  return pieces;
}

std::string joined(const std::vector<std::string>& pieces) {
  std::string out;
  for (const std::string& piece : pieces)
    out += piece;
  return out;
}

class IncrementalReference : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (!testing::shared_data_dir())
      GTEST_SKIP() << "shared test data not found (set PAGELLM_TEST_DATA)";
  }
};

TEST_P(IncrementalReference, StreamEqualsFullDecodeForEveryCase) {
  const Tokenizer& tok = tokenizer_for(GetParam());
  std::ifstream in(*testing::shared_data_dir() / "tokenizers" / GetParam() / "cases.jsonl",
                   std::ios::binary);
  std::string line;
  size_t count = 0;
  while (std::getline(in, line, '\n')) {
    if (line.empty()) continue;
    const json c = json::parse(line);
    const auto ids = c.at("ids").get<std::vector<TokenId>>();
    const std::string text = json(c.at("text")).dump();
    EXPECT_EQ(joined(stream(tok, ids)), c.at("decoded").get<std::string>()) << text;
    EXPECT_EQ(joined(stream(tok, ids, {false, false})), c.at("decoded_raw").get<std::string>())
        << text;
    EXPECT_EQ(joined(stream(tok, ids, {true, std::nullopt})), tok.decode(ids, true)) << text;
    ++count;
  }
  EXPECT_GE(count, 70u);
}

INSTANTIATE_TEST_SUITE_P(Models, IncrementalReference, ::testing::Values("llama3", "qwen3"));

class ByteLevelStreaming : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!testing::shared_data_dir())
      GTEST_SKIP() << "shared test data not found (set PAGELLM_TEST_DATA)";
  }
  // The byte-level token of one raw byte.
  static TokenId byte_id(unsigned char b) {
    const auto id = tokenizer_for("llama3").token_to_id(
        byte_level::encode(std::string(1, static_cast<char>(b))));
    EXPECT_TRUE(id.has_value());
    return *id;
  }
};

TEST_F(ByteLevelStreaming, MultiByteCharacterWaitsForItsLastByte) {
  const Tokenizer& tok = tokenizer_for("llama3");
  // € = E2 82 AC, one byte token each.
  const auto pieces = stream(tok, {byte_id(0xE2), byte_id(0x82), byte_id(0xAC)});
  EXPECT_EQ(pieces, (std::vector<std::string>{"", "", "\xE2\x82\xAC", ""}));
}

TEST_F(ByteLevelStreaming, FourByteEmojiAndZwjSequence) {
  const Tokenizer& tok = tokenizer_for("llama3");
  // 😀 = F0 9F 98 80 as four byte tokens.
  EXPECT_EQ(stream(tok, {byte_id(0xF0), byte_id(0x9F), byte_id(0x98), byte_id(0x80)}),
            (std::vector<std::string>{"", "", "", "\xF0\x9F\x98\x80", ""}));
  // A family ZWJ sequence with a skin tone, as the real tokenizer splits it.
  const std::string family =
      "\xF0\x9F\x91\xA8\xF0\x9F\x8F\xBD\xE2\x80\x8D\xF0\x9F\x91\xA9\xE2\x80\x8D\xF0\x9F\x91\xA7 ok";
  const auto ids = tok.encode(family);
  EXPECT_GT(ids.size(), 4u);
  EXPECT_EQ(joined(stream(tok, ids)), family);
  // Each piece holds whole characters: together they never repeat or drop one.
  size_t chars = 0;
  for (const std::string& piece : stream(tok, ids)) {
    for (size_t pos = 0; pos < piece.size(); ++chars)
      utf8::next_codepoint(piece, pos);
  }
  size_t expected = 0;
  for (size_t pos = 0; pos < family.size(); ++expected)
    utf8::next_codepoint(family, pos);
  EXPECT_EQ(chars, expected);
}

// A token's own bytes: the part of a character it holds, or its text with its space.
TEST_F(ByteLevelStreaming, TokenBytesAreTheRawBytesOfOneToken) {
  const Tokenizer& tok = tokenizer_for("llama3");
  const IncrementalDetokenizer detok(tok);
  EXPECT_EQ(detok.token_bytes(byte_id(0xE2)), "\xE2");
  EXPECT_EQ(detok.token_bytes(byte_id(0x82)), "\x82");
  const auto ids = tok.encode(" Hello world");
  std::string joined_bytes;
  for (TokenId id : ids)
    joined_bytes += detok.token_bytes(id);
  EXPECT_EQ(joined_bytes, " Hello world");
  EXPECT_EQ(detok.token_bytes(ids[0]), " Hello");
  EXPECT_EQ(detok.token_bytes(*tok.token_to_id("<|eot_id|>")), "<|eot_id|>");
  EXPECT_EQ(detok.token_bytes(-1), "");
}

TEST_F(ByteLevelStreaming, InvalidBytesBecomeReplacementCharacters) {
  const Tokenizer& tok = tokenizer_for("llama3");
  const TokenId a = *tok.token_to_id("A");
  // 0xFF can never start a character: replaced at once.
  EXPECT_EQ(stream(tok, {byte_id(0xFF), a}), (std::vector<std::string>{"\uFFFD", "A", ""}));
  // A truncated sequence followed by ASCII: one U+FFFD for the maximal subpart.
  const std::vector<TokenId> truncated{byte_id(0xE2), byte_id(0x82), a};
  EXPECT_EQ(stream(tok, truncated), (std::vector<std::string>{"", "", "\uFFFDA", ""}));
  EXPECT_EQ(tok.decode(truncated), "\uFFFDA");
  // Cut off at the end of the sequence: finish() flushes it.
  EXPECT_EQ(stream(tok, {a, byte_id(0xF0), byte_id(0x9F)}),
            (std::vector<std::string>{"A", "", "", "\uFFFD"}));
  EXPECT_EQ(tok.decode(std::vector<TokenId>{a, byte_id(0xF0), byte_id(0x9F)}), "A\uFFFD");
}

TEST_F(ByteLevelStreaming, CleanupHoldsBackASpaceUntilTheNextToken) {
  const Tokenizer& tok = tokenizer_for("llama3");  // clean_up_tokenization_spaces: true
  const auto ids = tok.encode("Wait ... what ?! It is n't , ok");
  IncrementalDetokenizer detok(tok);
  std::string out;
  for (TokenId id : ids)
    out += detok.add(id);
  out += detok.finish();
  EXPECT_EQ(out, tok.decode(ids));
  EXPECT_EQ(out, "Wait... what?! It isn't, ok");
}

TEST_F(ByteLevelStreaming, SkipsSpecialTokensAndIgnoresUnknownIds) {
  const Tokenizer& tok = tokenizer_for("qwen3");
  const auto ids = tok.encode("<|im_start|>assistant\nhi<|im_end|>");
  std::vector<TokenId> with_unknown = ids;
  with_unknown.push_back(-5);
  with_unknown.push_back(10'000'000);
  EXPECT_EQ(joined(stream(tok, with_unknown, {true, std::nullopt})), "assistant\nhi");
  EXPECT_EQ(joined(stream(tok, with_unknown)), "<|im_start|>assistant\nhi<|im_end|>");
}

TEST_F(ByteLevelStreaming, AddAfterFinishReturnsNothing) {
  const Tokenizer& tok = tokenizer_for("llama3");
  IncrementalDetokenizer detok(tok);
  EXPECT_EQ(detok.add(*tok.token_to_id("A")), "A");
  EXPECT_EQ(detok.finish(), "");
  EXPECT_EQ(detok.add(*tok.token_to_id("A")), "");
  EXPECT_EQ(detok.finish(), "");
}

TEST_P(IncrementalReference, RandomIdSequencesStreamLikeTheFullDecode) {
  const Tokenizer& tok = tokenizer_for(GetParam());
  std::mt19937 rng(1234);
  // Byte-level tokens of single bytes make random, often invalid, UTF-8.
  std::vector<TokenId> byte_ids;
  for (int b = 0; b < 256; ++b) {
    byte_ids.push_back(*tok.token_to_id(byte_level::encode(std::string(1, static_cast<char>(b)))));
  }
  std::uniform_int_distribution<TokenId> any_id(0, static_cast<TokenId>(tok.vocab_size()) - 1);
  std::uniform_int_distribution<size_t> length(1, 40);
  for (int round = 0; round < 300; ++round) {
    std::vector<TokenId> ids(length(rng));
    for (TokenId& id : ids)
      id = round % 2 == 0 ? any_id(rng) : byte_ids[rng() % 256];
    for (bool cleanup : {false, true}) {
      for (bool skip : {false, true}) {
        EXPECT_EQ(joined(stream(tok, ids, {skip, cleanup})), tok.decode(ids, skip, cleanup))
            << "ids: " << json(ids).dump();
      }
    }
  }
}

// --- SentencePiece style (synthetic tokenizer.json) ---

Tokenizer sentencepiece() {
  const auto dir = testing::fresh_temp_dir("sp_detok");
  return Tokenizer::from_file(testing::write_file(
      dir, "tokenizer.json",
      testing::sentencepiece_tokenizer_json(testing::SentencePieceStyle::kLegacy).dump()));
}

using testing::byte_token_id;

TEST(SentencePieceStreaming, StripsOnlyTheFirstLeadingSpace) {
  const Tokenizer tok = sentencepiece();
  EXPECT_EQ(stream(tok, {271, 276}), (std::vector<std::string>{"hello", " world", ""}));
  EXPECT_EQ(joined(stream(tok, {259, 259, 271})), tok.decode(std::vector<TokenId>{259, 259, 271}));
}

TEST(SentencePieceStreaming, TokenBytesKeepTheSpaceAndGiveFallbackBytes) {
  const Tokenizer tok = sentencepiece();
  const IncrementalDetokenizer detok(tok);
  EXPECT_EQ(tok.decode(std::vector<TokenId>{276}), "world");  // the first token loses it
  EXPECT_EQ(detok.token_bytes(276), " world");
  EXPECT_EQ(detok.token_bytes(271), " hello");
  EXPECT_EQ(detok.token_bytes(byte_token_id(0xE4)), "\xE4");
}

TEST(SentencePieceStreaming, ContextKeepsTheSpaceOfTheFirstGeneratedToken) {
  const Tokenizer tok = sentencepiece();
  const std::vector<TokenId> prompt{1, 271};
  IncrementalDetokenizer detok(tok, {}, prompt);
  EXPECT_EQ(detok.add(276), " world");
  EXPECT_EQ(detok.finish(), "");
}

TEST(SentencePieceStreaming, ByteFallbackRunsWaitForWholeCharacters) {
  const Tokenizer tok = sentencepiece();
  const std::vector<TokenId> ids{271, byte_token_id(0xE4), byte_token_id(0xB8), byte_token_id(0xAD),
                                 276};
  EXPECT_EQ(stream(tok, ids),
            (std::vector<std::string>{"hello", "", "", "\xE4\xB8\xAD", " world", ""}));
  EXPECT_EQ(joined(stream(tok, ids)), tok.decode(ids));
}

// A decoder the stream cannot follow token by token (a regex Replace) re-decodes the
// whole text each time. Cleanup there can rewrite text across the prompt's end (" 's"
// becomes "'s" once the s comes): the output still comes, as the streaming path gives it.
TEST(SentencePieceStreaming, ReDecodingGoesOnWhenCleanupRewritesThePromptsEnd) {
  json j = testing::sentencepiece_tokenizer_json(testing::SentencePieceStyle::kLegacy);
  j["decoder"]["decoders"].push_back(
      {{"type", "Replace"}, {"pattern", {{"Regex", "x{3}"}}}, {"content", "x"}});
  const auto dir = testing::fresh_temp_dir("sp_redecode");
  const Tokenizer tok = Tokenizer::from_file(testing::write_file(dir, "tokenizer.json", j.dump()));
  const std::vector<TokenId> prompt{271, 259, byte_token_id('\'')};  // "hello '"
  ASSERT_EQ(tok.decode(prompt, false, true), "hello '");
  const DetokenizeOptions cleanup{true, true};
  std::vector<TokenId> all = prompt;
  for (TokenId id : {byte_token_id('s'), 276, 276})
    all.push_back(id);
  ASSERT_EQ(tok.decode(all, false, true), "hello's world world");
  IncrementalDetokenizer detok(tok, cleanup, prompt);
  std::string out;
  for (size_t i = prompt.size(); i < all.size(); ++i)
    out += detok.add(all[i]);
  out += detok.finish();
  EXPECT_EQ(out, "s world world");
  // Without the rewrite, the plain re-decode.
  IncrementalDetokenizer plain(tok, cleanup, std::vector<TokenId>{271});
  std::string plain_out = plain.add(276);
  plain_out += plain.finish();
  EXPECT_EQ(plain_out, " world");
}

TEST(SentencePieceStreaming, BrokenByteRunsGiveOneReplacementPerByte) {
  const Tokenizer tok = sentencepiece();
  // Incomplete character cut by a normal token, as Hugging Face's ByteFallback does it.
  const std::vector<TokenId> cut{byte_token_id(0xE4), byte_token_id(0xB8), 276};
  EXPECT_EQ(joined(stream(tok, cut)), tok.decode(cut));
  EXPECT_EQ(joined(stream(tok, cut)), "\uFFFD\uFFFD world");
  // At the end of the stream.
  const std::vector<TokenId> tail{271, byte_token_id(0xF0), byte_token_id(0x9F),
                                  byte_token_id(0x98)};
  EXPECT_EQ(joined(stream(tok, tail)), tok.decode(tail));
  // A run mixing a valid character and an invalid byte: the streamed character stays
  // (documented difference: the full decode turns the whole run into U+FFFDs).
  EXPECT_EQ(joined(stream(tok, {byte_token_id('A'), byte_token_id(0xFF)})), "A\uFFFD");
  EXPECT_EQ(tok.decode(std::vector<TokenId>{byte_token_id('A'), byte_token_id(0xFF)}),
            "\uFFFD\uFFFD");
}

}  // namespace
}  // namespace pagellm::engine

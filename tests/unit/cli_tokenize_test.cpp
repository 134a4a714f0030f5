// `pagellm tokenize` end to end: the real binary, JSON lines through a pipe.

#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

#include "support/sentencepiece_fixture.h"
#include "support/test_data.h"

namespace pagellm {
namespace {

struct RunResult {
  int exit_code;
  std::string out, err;
};

std::string read_all(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

// Runs `pagellm tokenize ARGS` with `input` on stdin.
RunResult run_tokenize(const std::string& args, const std::string& input) {
  const auto dir = testing::fresh_temp_dir("cli_tokenize");
  const auto in = testing::write_file(dir, "in.txt", input);
  const std::string command = std::string("'") + PAGELLM_BINARY + "' tokenize " + args + " < '" +
                              in.string() + "' > '" + (dir / "out.txt").string() + "' 2> '" +
                              (dir / "err.txt").string() + "'";
  const int status = std::system(command.c_str());
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, read_all(dir / "out.txt"),
          read_all(dir / "err.txt")};
}

class CliTokenize : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto data = testing::shared_data_dir();
    if (!data) GTEST_SKIP() << "shared test data not found (set PAGELLM_TEST_DATA)";
    model_ = (*data / "tokenizers" / "llama3").string();
  }
  std::string model_;
};

TEST_F(CliTokenize, EncodesOneJsonStringPerLine) {
  const RunResult r = run_tokenize("--model '" + model_ + "'",
                                   "\"Hello, world!\"\n\"Hello<|eot_id|>world\"\n\"\"\n");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "[9906,11,1917,0]\n[9906,128009,14957]\n[]\n");
  EXPECT_EQ(r.err, "");
}

TEST_F(CliTokenize, DecodesOneJsonArrayPerLine) {
  const RunResult r = run_tokenize("--model '" + model_ + "' --decode", "[9906,11,1917,0]\n[]\n");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "\"Hello, world!\"\n\"\"\n");
}

TEST_F(CliTokenize, BadLinesAreReportedWithTheirNumberAndTheRestGoesOn) {
  const RunResult r = run_tokenize("--model '" + model_ + "'", "\"a\"\n[1,2]\nnot json\n\"b\"\n");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(r.out, "[64]\nnull\nnull\n[65]\n");
  EXPECT_NE(r.err.find("line 2"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("line 3"), std::string::npos) << r.err;
  const RunResult d = run_tokenize("--model '" + model_ + "' --decode", "[64]\n[-1]\n\"x\"\n");
  EXPECT_EQ(d.exit_code, 1);
  EXPECT_EQ(d.out, "\"a\"\nnull\nnull\n");
}

TEST(CliTokenizeSentencePiece, AddSpecialTokensAddsBos) {
  const auto dir = testing::fresh_temp_dir("cli_sp_model");
  testing::write_file(
      dir, "tokenizer.json",
      testing::sentencepiece_tokenizer_json(testing::SentencePieceStyle::kLegacy).dump());
  const std::string model = "--model '" + dir.string() + "'";
  EXPECT_EQ(run_tokenize(model, "\"hello world\"\n").out, "[271,276]\n");
  EXPECT_EQ(run_tokenize(model + " --add-special-tokens", "\"hello world\"\n").out,
            "[1,271,276]\n");
}

TEST(CliTokenizeErrors, MissingModelAndUsage) {
  const RunResult missing = run_tokenize("--model /nonexistent/model", "\"x\"\n");
  EXPECT_EQ(missing.exit_code, 1);
  EXPECT_NE(missing.err.find("/nonexistent/model/tokenizer.json"), std::string::npos)
      << missing.err;
  EXPECT_EQ(run_tokenize("", "").exit_code, 2);
  EXPECT_EQ(run_tokenize("--model x --bogus", "").exit_code, 2);
}

}  // namespace
}  // namespace pagellm

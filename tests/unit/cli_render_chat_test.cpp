// `pagellm render-chat` end to end: the real binary, JSON lines through a pipe.

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "support/test_data.h"

namespace {

namespace fs = std::filesystem;

struct CliResult {
  int exit_code = -1;
  std::vector<std::string> out_lines;
  std::string err;
};

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

class RenderChatCli : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(fs::exists(PAGELLM_BINARY)) << "build the pagellm target first: " << PAGELLM_BINARY;
    dir_ = fs::temp_directory_path() / ("pagellm_cli_render_chat_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // Pipes `input` into `pagellm render-chat ARGS`; stdout and stderr are kept apart.
  CliResult render_chat(const std::string& args, const std::string& input) {
    std::ofstream(dir_ / "in.jsonl", std::ios::binary) << input;
    const std::string command = "cat '" + (dir_ / "in.jsonl").string() + "' | '" + PAGELLM_BINARY +
                                "' render-chat " + args + " > '" + (dir_ / "out").string() +
                                "' 2> '" + (dir_ / "err").string() + "'";
    const int status = std::system(command.c_str());
    CliResult result;
    result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    std::istringstream out(read_file(dir_ / "out"));
    for (std::string line; std::getline(out, line);)
      result.out_lines.push_back(line);
    result.err = read_file(dir_ / "err");
    return result;
  }

  fs::path dir_;
};

TEST_F(RenderChatCli, RendersEachLineAndReportsBadLines) {
  const auto data = pagellm::testing::shared_data_dir();
  if (!data) GTEST_SKIP() << "shared test data not found (set PAGELLM_TEST_DATA)";
  const fs::path model = *data / "tokenizers" / "qwen3";
  const std::string input =
      R"({"messages": [{"role": "user", "content": "hi"}], "add_generation_prompt": true})"
      "\n"
      "this is not json\n"
      R"({"messages": [{"role": "user", "content": "x\u2028y"}], "add_generation_prompt": false})"
      "\n"
      R"({"messages": "oops"})"
      "\n"
      "\n";
  const CliResult r = render_chat("--model '" + model.string() + "'", input);
  EXPECT_EQ(r.exit_code, 1);
  ASSERT_EQ(r.out_lines.size(), 5u) << r.err;
  EXPECT_EQ(r.out_lines[4], "null");  // a blank line answers too, so the lines stay in step
  EXPECT_EQ(nlohmann::json::parse(r.out_lines[0]).get<std::string>(),
            "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n");
  EXPECT_EQ(r.out_lines[1], "null");
  EXPECT_EQ(r.out_lines[2], R"("<|im_start|>user\nx\u2028y<|im_end|>\n")");
  EXPECT_EQ(r.out_lines[3], "null");
  EXPECT_NE(r.err.find("line 2: not valid JSON"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("line 4: field 'messages' must be a list"), std::string::npos) << r.err;
}

TEST_F(RenderChatCli, MatchesTheReferenceRenders) {
  const auto data = pagellm::testing::shared_data_dir();
  if (!data) GTEST_SKIP() << "shared test data not found (set PAGELLM_TEST_DATA)";
  const fs::path model = *data / "tokenizers" / "llama3";
  std::istringstream cases(read_file(model / "chat_cases.jsonl"));
  std::string input;
  std::vector<std::string> expected;
  for (std::string line; std::getline(cases, line);) {
    const auto record = nlohmann::ordered_json::parse(line);
    nlohmann::ordered_json request = {{"messages", record["messages"]},
                                      {"add_generation_prompt", record["add_generation_prompt"]}};
    input += request.dump() + "\n";
    expected.push_back(record["rendered"].get<std::string>());
  }
  const CliResult r = render_chat("--model '" + model.string() + "'", input);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  ASSERT_EQ(r.out_lines.size(), expected.size());
  for (size_t i = 0; i < expected.size(); ++i) {
    EXPECT_EQ(nlohmann::json::parse(r.out_lines[i]).get<std::string>(), expected[i]) << i;
  }
}

TEST_F(RenderChatCli, ChatTemplateOverride) {
  std::ofstream(dir_ / "tokenizer_config.json") << R"({"bos_token": "<s>"})";
  std::ofstream(dir_ / "t.jinja")
      << "{{ bos_token }}{% for m in messages %}[{{ m.role }}]{% endfor %}\n";
  const CliResult r = render_chat(
      "--model '" + dir_.string() + "' --chat-template '" + (dir_ / "t.jinja").string() + "'",
      R"({"messages": [{"role": "user"}, {"role": "assistant"}]})"
      "\n");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  ASSERT_EQ(r.out_lines.size(), 1u);
  EXPECT_EQ(r.out_lines[0], R"("<s>[user][assistant]")");
}

TEST_F(RenderChatCli, ModelWithoutTemplateFailsClearly) {
  std::ofstream(dir_ / "tokenizer_config.json") << "{}";
  const CliResult r = render_chat("--model '" + dir_.string() + "'", "{\"messages\": []}\n");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_TRUE(r.out_lines.empty());
  EXPECT_NE(r.err.find("has no chat template"), std::string::npos) << r.err;
}

TEST_F(RenderChatCli, UnsupportedConstructInOverrideNamesFileAndLine) {
  std::ofstream(dir_ / "t.jinja") << "ok\n{{ messages | wordwrap }}";
  const CliResult r = render_chat(
      "--model '" + dir_.string() + "' --chat-template '" + (dir_ / "t.jinja").string() + "'",
      "{\"messages\": []}\n");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("t.jinja: unsupported filter 'wordwrap' at line 2"), std::string::npos)
      << r.err;
}

// A folder for the template opens as a stream but reads nothing: an error, not an empty
// template that renders every chat as "".
TEST_F(RenderChatCli, AFolderForTheTemplateIsAnError) {
  const CliResult r =
      render_chat("--model '" + dir_.string() + "' --chat-template '" + dir_.string() + "'",
                  "{\"messages\": []}\n");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_TRUE(r.out_lines.empty());
  EXPECT_NE(r.err.find("cannot read chat template file"), std::string::npos) << r.err;
}

TEST_F(RenderChatCli, MissingModelOptionIsAUsageError) {
  const CliResult r = render_chat("", "");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("--model"), std::string::npos) << r.err;
}

}  // namespace

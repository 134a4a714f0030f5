// ChatTemplate against Python jinja2's renders of the real llama3 and qwen3 templates
// (tests/.../tokenizers/*/chat_cases.jsonl), plus the public API: options, variables,
// errors and which template load_chat_template picks.

#include "engine/chat_template.h"

#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "support/test_data.h"

namespace pagellm::engine {
namespace {

using nlohmann::json;
using nlohmann::ordered_json;

std::string read_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

// Lines split on '\n' only: the data holds U+2028 and friends inside strings.
std::vector<std::string> split_lines(const std::string& text) {
  std::vector<std::string> lines;
  size_t start = 0;
  while (start < text.size()) {
    size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    if (end > start) lines.push_back(text.substr(start, end - start));
    start = end + 1;
  }
  return lines;
}

class ReferenceRenders : public ::testing::TestWithParam<std::string> {};

TEST_P(ReferenceRenders, MatchJinja2ByteForByte) {
  const auto data = pagellm::testing::shared_data_dir();
  if (!data) GTEST_SKIP() << "shared test data not found (set PAGELLM_TEST_DATA)";
  const auto dir = *data / "tokenizers" / GetParam();
  const TokenizerConfig config = load_tokenizer_config(dir);
  ASSERT_TRUE(config.chat_template.has_value());
  const ChatTemplate chat_template = ChatTemplate::parse(*config.chat_template);
  const auto lines = split_lines(read_file(dir / "chat_cases.jsonl"));
  ASSERT_FALSE(lines.empty());
  for (size_t i = 0; i < lines.size(); ++i) {
    SCOPED_TRACE(GetParam() + "/chat_cases.jsonl line " + std::to_string(i + 1));
    const ordered_json record = ordered_json::parse(lines[i]);
    ChatRenderOptions options = chat_render_options(config);
    options.add_generation_prompt = record.at("add_generation_prompt").get<bool>();
    EXPECT_EQ(chat_template.render(record.at("messages"), options),
              record.at("rendered").get<std::string>());
  }
}

INSTANTIATE_TEST_SUITE_P(Models, ReferenceRenders, ::testing::Values("llama3", "qwen3"));

TEST(ChatTemplate, RendersFromNlohmannJsonToo) {
  const auto t = ChatTemplate::parse(
      "{{ bos_token }}{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}"
      "{% if add_generation_prompt %}<assistant>{% endif %}{{ eos_token }}");
  ChatRenderOptions options;
  options.bos_token = "<s>";
  options.add_generation_prompt = true;
  const json messages = json::parse(R"([{"role": "user", "content": "hi"}])");
  EXPECT_EQ(t.render(messages, options), "<s><user>hi<assistant>");
}

TEST(ChatTemplate, ToolsAndDocumentsDefaultToNone) {
  const auto t = ChatTemplate::parse(
      "{{ tools is none }} {{ documents is none }} {{ enable_thinking is defined }}");
  EXPECT_EQ(t.render(json::array(), ChatRenderOptions{}), "True True False");
}

TEST(ChatTemplate, ExtraVariablesOverrideDefaults) {
  const auto t = ChatTemplate::parse(
      "{% for tool in tools %}{{ tool | tojson }};{% endfor %}"
      "{% if enable_thinking is false %}no-think{% endif %}");
  ChatRenderOptions options;
  options.set("tools", ordered_json::parse(R"([{"name": "f", "b": 1, "a": [true, null]}])"));
  options.set("enable_thinking", json(false));
  EXPECT_EQ(t.render(json::array(), options),
            R"({"name": "f", "b": 1, "a": [true, null]};no-think)");
}

TEST(ChatTemplate, ParseOnceRenderMany) {
  const auto t = ChatTemplate::parse("{{ messages | length }}");
  for (int n = 0; n < 3; ++n) {
    EXPECT_EQ(t.render(json(std::vector<int>(static_cast<size_t>(n), 1)), {}), std::to_string(n));
  }
}

TEST(ChatTemplate, RaiseExceptionFailsWithItsMessage) {
  const auto t = ChatTemplate::parse(
      "{% if messages[0].role != 'user' %}{{ raise_exception('Conversation must start with "
      "user') }}{% endif %}ok");
  EXPECT_EQ(t.render(json::parse(R"([{"role": "user"}])"), {}), "ok");
  try {
    t.render(json::parse(R"([{"role": "system"}])"), {});
    FAIL() << "expected ChatTemplateError";
  } catch (const ChatTemplateError& e) {
    EXPECT_STREQ(e.what(), "Conversation must start with user");
  }
}

TEST(ChatTemplate, UnsupportedFilterIsNamedWithItsLine) {
  try {
    ChatTemplate::parse("line one\n{{ x }}\n{{ messages | wordwrap }}");
    FAIL() << "expected ChatTemplateError";
  } catch (const ChatTemplateError& e) {
    EXPECT_STREQ(e.what(), "unsupported filter 'wordwrap' at line 3");
  }
}

class TempDir {
 public:
  TempDir() {
    path_ = std::filesystem::temp_directory_path() /
            ("pagellm_chat_template_test_" + std::to_string(::getpid()) + "_" +
             std::to_string(counter_++));
    std::filesystem::create_directories(path_);
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  const std::filesystem::path& path() const { return path_; }
  void write(const std::string& name, const std::string& text) const {
    std::ofstream(path_ / name, std::ios::binary) << text;
  }

 private:
  static inline int counter_ = 0;
  std::filesystem::path path_;
};

TEST(LoadChatTemplate, UsesTheModelsOwnTemplate) {
  TempDir dir;
  dir.write("tokenizer_config.json", R"({"chat_template": "own:{{ messages|length }}"})");
  EXPECT_EQ(load_chat_template(dir.path(), std::nullopt).render(json::array(), {}), "own:0");
}

TEST(LoadChatTemplate, OverrideWinsOverTheModelsTemplate) {
  TempDir dir;
  dir.write("tokenizer_config.json", R"({"chat_template": "own"})");
  dir.write("override.jinja", "override\n");
  EXPECT_EQ(load_chat_template(dir.path(), dir.path() / "override.jinja").render(json::array(), {}),
            "override");
}

TEST(LoadChatTemplate, FallsBackToChatTemplateJinja) {
  TempDir dir;
  dir.write("tokenizer_config.json", R"({"eos_token": "</s>"})");
  dir.write("chat_template.jinja", "from-file");
  EXPECT_EQ(load_chat_template(dir.path(), std::nullopt).render(json::array(), {}), "from-file");
}

TEST(LoadChatTemplate, MissingTemplateIsAClearError) {
  TempDir dir;
  dir.write("tokenizer_config.json", R"({"eos_token": "</s>"})");
  try {
    load_chat_template(dir.path(), std::nullopt);
    FAIL() << "expected ChatTemplateError";
  } catch (const ChatTemplateError& e) {
    EXPECT_NE(std::string(e.what()).find("has no chat template"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("--chat-template"), std::string::npos) << e.what();
  }
  EXPECT_THROW(load_chat_template(dir.path(), dir.path() / "absent.jinja"), ChatTemplateError);
}

TEST(LoadChatTemplate, ParseErrorsNameTheFile) {
  TempDir dir;
  dir.write("bad.jinja", "{% for x in y %}\n{{ x }}");
  try {
    load_chat_template(dir.path(), dir.path() / "bad.jinja");
    FAIL() << "expected ChatTemplateError";
  } catch (const ChatTemplateError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("bad.jinja: "), std::string::npos) << what;
    EXPECT_NE(what.find("'for' opened at line 1 is never closed"), std::string::npos) << what;
  }
}

}  // namespace
}  // namespace pagellm::engine

#include "engine/demo_tokenizer.h"

#include <algorithm>
#include <cctype>
#include <map>
#include <nlohmann/json.hpp>
#include <queue>
#include <stdexcept>
#include <unordered_map>

#include "engine/demo_corpus.h"

namespace pagellm::engine {
namespace {

using nlohmann::ordered_json;

// Llama 3's pre-tokenizer pattern; the training splitter below follows it for ASCII.
constexpr const char* kSplitPattern =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| "
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

constexpr const char* kChatTemplate =
    "{{ bos_token }}{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

constexpr int64_t kMaxVocab = 262144;
constexpr const char* kVocabPlaceholder = "@@vocab@@";
constexpr const char* kMergesPlaceholder = "@@merges@@";

bool is_letter(char c) {
  return std::isalpha(static_cast<unsigned char>(c)) != 0;
}
bool is_digit(char c) {
  return std::isdigit(static_cast<unsigned char>(c)) != 0;
}
bool is_space(char c) {
  return std::isspace(static_cast<unsigned char>(c)) != 0;
}
bool is_newline(char c) {
  return c == '\n' || c == '\r';
}

// Splits ASCII text as kSplitPattern does, alternative by alternative.
std::vector<std::string> split_words(std::string_view text) {
  std::vector<std::string> words;
  const size_t n = text.size();
  size_t i = 0;
  auto run_end = [&](size_t from, auto pred) {
    while (from < n && pred(text[from]))
      ++from;
    return from;
  };
  while (i < n) {
    const char c = text[i];
    size_t end = i;
    if (c == '\'' && i + 1 < n) {
      const char c1 = static_cast<char>(std::tolower(static_cast<unsigned char>(text[i + 1])));
      const char c2 = i + 2 < n ? static_cast<char>(std::tolower(text[i + 2])) : '\0';
      if (c1 == 's' || c1 == 't' || c1 == 'm' || c1 == 'd')
        end = i + 2;
      else if ((c1 == 'r' || c1 == 'v') && c2 == 'e')
        end = i + 3;
      else if (c1 == 'l' && c2 == 'l')
        end = i + 3;
    }
    if (end == i && is_letter(c)) {
      end = run_end(i, is_letter);
    } else if (end == i && !is_newline(c) && !is_digit(c) && i + 1 < n && is_letter(text[i + 1])) {
      end = run_end(i + 1, is_letter);
    } else if (end == i && is_digit(c)) {
      end = i + 1;
      while (end < n && end < i + 3 && is_digit(text[end]))
        ++end;
    }
    auto is_punct = [](char ch) { return !is_space(ch) && !is_letter(ch) && !is_digit(ch); };
    if (end == i) {
      const size_t start = (c == ' ' && i + 1 < n && is_punct(text[i + 1])) ? i + 1 : i;
      if (is_punct(text[start])) end = run_end(run_end(start, is_punct), is_newline);
    }
    if (end == i && is_space(c)) {
      const size_t k = run_end(i, is_space);
      size_t last_newline = k;
      for (size_t p = i; p < k; ++p) {
        if (is_newline(text[p])) last_newline = p;
      }
      if (last_newline != k) {
        end = last_newline + 1;
      } else if (k == n || k - i == 1) {
        end = k;
      } else {
        end = k - 1;  // leaves one space to lead the next word
      }
    }
    words.emplace_back(text.substr(i, end - i));
    i = end;
  }
  return words;
}

// Deterministic across platforms, unlike std:: distributions.
uint64_t splitmix64(uint64_t& state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// Word counts to learn from: the built-in text, weighted up so that its merges come
// first; the numbers 0-999 (pre-tokenized digits come in runs of up to three); and,
// because a few pages of text cannot supply tens of thousands of merges, compounds of
// two words of the text ("sun" + "light"), as many as the vocabulary needs.
std::map<std::string, int64_t> training_words(int64_t vocab_size) {
  constexpr int64_t kTextWeight = 64;
  std::map<std::string, int64_t> counts;
  for (const std::string& w : split_words(demo_corpus()))
    counts[w] += kTextWeight;
  std::vector<std::string> stems;
  for (const auto& [word, count] : counts) {
    const size_t first = word[0] == ' ' ? 1 : 0;
    if (word.size() > first + 1 &&
        std::all_of(word.begin() + first, word.end(), [](char c) { return is_letter(c); })) {
      stems.push_back(word);
    }
  }
  for (int n = 0; n < 1000; ++n)
    counts[std::to_string(n)] += 1;
  uint64_t state = 0x5eedu;
  for (int64_t i = 0; i < vocab_size + vocab_size / 4; ++i) {
    const std::string& head = stems[splitmix64(state) % stems.size()];
    std::string tail = stems[splitmix64(state) % stems.size()];
    if (tail[0] == ' ') tail.erase(0, 1);
    tail[0] = static_cast<char>(std::tolower(static_cast<unsigned char>(tail[0])));
    counts[head + tail] += 1;
  }
  return counts;
}

uint64_t pair_key(int32_t a, int32_t b) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
}

// A bijective mix of the pair key: ties between equally frequent pairs are broken in a
// scattered but fixed order (by id order, the rare pairs that finish the vocabulary
// would all start with the same word).
uint64_t tie_rank(uint64_t key) {
  key = (key ^ (key >> 30)) * 0xbf58476d1ce4e5b9ull;
  key = (key ^ (key >> 27)) * 0x94d049bb133111ebull;
  return key ^ (key >> 31);
}

struct HeapEntry {
  int64_t count;
  uint64_t tie;
  int32_t a, b;
  // The top is the most frequent pair, then the smallest tie rank: the result never
  // depends on hash-table order.
  bool operator<(const HeapEntry& o) const {
    if (count != o.count) return count < o.count;
    return tie > o.tie;
  }
};

// Classic BPE training with incremental pair counts: each merge only revisits the
// words that contain the merged pair.
class BpeTrainer {
 public:
  explicit BpeTrainer(const std::map<std::string, int64_t>& counts) {
    for (int b = 0; b < 256; ++b)
      add_token(std::string(1, static_cast<char>(b)));
    for (const auto& [word, count] : counts) {
      Word w;
      w.count = count;
      for (unsigned char ch : word)
        w.symbols.push_back(ch);
      words_.push_back(std::move(w));
    }
    for (size_t wi = 0; wi < words_.size(); ++wi) {
      const Word& w = words_[wi];
      for (size_t j = 0; j + 1 < w.symbols.size(); ++j) {
        const uint64_t key = pair_key(w.symbols[j], w.symbols[j + 1]);
        pair_counts_[key] += w.count;
        pair_words_[key].push_back(static_cast<int32_t>(wi));
      }
    }
    for (const auto& [key, count] : pair_counts_)
      push(key);
  }

  DemoVocabulary run(size_t target_tokens) {
    while (vocab_.tokens.size() < target_tokens) {
      if (heap_.empty()) {
        throw std::invalid_argument("demo tokenizer: the built-in text ran out of merges at " +
                                    std::to_string(vocab_.tokens.size()) + " tokens");
      }
      const HeapEntry top = heap_.top();
      heap_.pop();
      const uint64_t key = pair_key(top.a, top.b);
      auto it = pair_counts_.find(key);
      if (it == pair_counts_.end() || it->second != top.count) continue;  // stale
      merge(top.a, top.b);
    }
    return std::move(vocab_);
  }

 private:
  struct Word {
    std::vector<int32_t> symbols;
    int64_t count = 0;
  };

  int32_t add_token(const std::string& text) {
    auto [it, inserted] = ids_.emplace(text, static_cast<int32_t>(vocab_.tokens.size()));
    if (inserted) vocab_.tokens.push_back(text);
    return it->second;
  }

  void push(uint64_t key) {
    auto it = pair_counts_.find(key);
    if (it == pair_counts_.end() || it->second <= 0) return;
    heap_.push(
        {it->second, tie_rank(key), static_cast<int32_t>(key >> 32), static_cast<int32_t>(key)});
  }

  static void sorted_pairs(const std::vector<int32_t>& symbols, std::vector<uint64_t>& out) {
    out.clear();
    for (size_t j = 0; j + 1 < symbols.size(); ++j) {
      out.push_back(pair_key(symbols[j], symbols[j + 1]));
    }
    std::sort(out.begin(), out.end());
  }

  void merge(int32_t a, int32_t b) {
    const uint64_t merged_key = pair_key(a, b);
    // Two merges may spell the same string ("ab"+"c", "a"+"bc"): one id, two merges.
    const int32_t id = add_token(vocab_.tokens[a] + vocab_.tokens[b]);
    vocab_.merges.emplace_back(vocab_.tokens[a], vocab_.tokens[b]);

    std::vector<int32_t> affected = std::move(pair_words_[merged_key]);
    pair_words_.erase(merged_key);
    std::sort(affected.begin(), affected.end());
    affected.erase(std::unique(affected.begin(), affected.end()), affected.end());
    std::vector<uint64_t> changed, old_pairs, new_pairs;
    for (int32_t wi : affected) {
      Word& w = words_[wi];
      std::vector<int32_t> next;
      next.reserve(w.symbols.size());
      bool found = false;
      for (size_t j = 0; j < w.symbols.size(); ++j) {
        if (j + 1 < w.symbols.size() && w.symbols[j] == a && w.symbols[j + 1] == b) {
          next.push_back(id);
          ++j;
          found = true;
        } else {
          next.push_back(w.symbols[j]);
        }
      }
      if (!found) continue;
      // Only the pairs whose number in this word changed: those around merge sites.
      sorted_pairs(w.symbols, old_pairs);
      sorted_pairs(next, new_pairs);
      size_t i = 0, j = 0;
      while (i < old_pairs.size() || j < new_pairs.size()) {
        if (j == new_pairs.size() || (i < old_pairs.size() && old_pairs[i] < new_pairs[j])) {
          pair_counts_[old_pairs[i]] -= w.count;
          changed.push_back(old_pairs[i++]);
        } else if (i == old_pairs.size() || new_pairs[j] < old_pairs[i]) {
          const uint64_t key = new_pairs[j++];
          pair_counts_[key] += w.count;
          changed.push_back(key);
          pair_words_[key].push_back(wi);
        } else {
          ++i;
          ++j;
        }
      }
      w.symbols = std::move(next);
    }
    pair_counts_.erase(merged_key);
    std::sort(changed.begin(), changed.end());
    changed.erase(std::unique(changed.begin(), changed.end()), changed.end());
    for (uint64_t key : changed) {
      if (key == merged_key) continue;
      auto it = pair_counts_.find(key);
      if (it != pair_counts_.end() && it->second <= 0) {
        pair_counts_.erase(it);
      } else {
        push(key);
      }
    }
  }

  DemoVocabulary vocab_;
  std::unordered_map<std::string, int32_t> ids_;
  std::vector<Word> words_;
  std::unordered_map<uint64_t, int64_t> pair_counts_;
  std::unordered_map<uint64_t, std::vector<int32_t>> pair_words_;
  std::priority_queue<HeapEntry> heap_;
};

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

const std::array<uint32_t, 256>& byte_to_code_point() {
  static const std::array<uint32_t, 256> table = [] {
    std::array<uint32_t, 256> t{};
    uint32_t next = 256;
    for (uint32_t b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
      t[b] = printable ? b : next++;
    }
    return t;
  }();
  return table;
}

ordered_json added_token(const std::string& content, int64_t id) {
  ordered_json t;
  t["id"] = id;
  t["content"] = content;
  t["single_word"] = false;
  t["lstrip"] = false;
  t["rstrip"] = false;
  t["normalized"] = false;
  t["special"] = true;
  return t;
}

}  // namespace

std::string byte_level_encode(const std::string& bytes) {
  std::string out;
  for (unsigned char b : bytes)
    append_utf8(out, byte_to_code_point()[b]);
  return out;
}

DemoVocabulary train_demo_vocabulary(int64_t vocab_size) {
  const int64_t specials = static_cast<int64_t>(kDemoSpecialTokens.size());
  if (vocab_size < 256 + specials || vocab_size > kMaxVocab) {
    throw std::invalid_argument("demo tokenizer: vocab_size " + std::to_string(vocab_size) +
                                " is outside [" + std::to_string(256 + specials) + ", " +
                                std::to_string(kMaxVocab) + "]");
  }
  BpeTrainer trainer(training_words(vocab_size));
  DemoVocabulary vocab = trainer.run(static_cast<size_t>(vocab_size - specials));
  vocab.vocab_size = vocab_size;
  return vocab;
}

std::string demo_tokenizer_json(const DemoVocabulary& vocab) {
  ordered_json added = ordered_json::array();
  for (size_t i = 0; i < kDemoSpecialTokens.size(); ++i) {
    added.push_back(added_token(kDemoSpecialTokens[i], vocab.special_id(i)));
  }

  ordered_json split;
  split["type"] = "Split";
  split["pattern"] = {{"Regex", kSplitPattern}};
  split["behavior"] = "Isolated";
  split["invert"] = false;
  ordered_json byte_level;
  byte_level["type"] = "ByteLevel";
  byte_level["add_prefix_space"] = false;
  byte_level["trim_offsets"] = true;
  byte_level["use_regex"] = false;
  ordered_json pre_tokenizer;
  pre_tokenizer["type"] = "Sequence";
  pre_tokenizer["pretokenizers"] = {split, byte_level};

  // Llama 3's post-processor: BOS before each sequence.
  const std::string bos = kDemoSpecialTokens[0];
  ordered_json bos_piece = {{"SpecialToken", {{"id", bos}, {"type_id", 0}}}};
  ordered_json template_processing;
  template_processing["type"] = "TemplateProcessing";
  template_processing["single"] = {bos_piece, {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}};
  template_processing["pair"] = {bos_piece,
                                 {{"Sequence", {{"id", "A"}, {"type_id", 0}}}},
                                 {{"SpecialToken", {{"id", bos}, {"type_id", 1}}}},
                                 {{"Sequence", {{"id", "B"}, {"type_id", 1}}}}};
  ordered_json bos_entry;
  bos_entry["id"] = bos;
  bos_entry["ids"] = {vocab.bos_id()};
  bos_entry["tokens"] = {bos};
  template_processing["special_tokens"] = {{bos, bos_entry}};
  ordered_json byte_level_post;
  byte_level_post["type"] = "ByteLevel";
  byte_level_post["add_prefix_space"] = true;
  byte_level_post["trim_offsets"] = false;
  byte_level_post["use_regex"] = true;
  ordered_json post_processor;
  post_processor["type"] = "Sequence";
  post_processor["processors"] = {byte_level_post, template_processing};

  ordered_json decoder;
  decoder["type"] = "ByteLevel";
  decoder["add_prefix_space"] = true;
  decoder["trim_offsets"] = true;
  decoder["use_regex"] = true;

  // The vocabulary and merges are spliced in as text: ordered_json inserts keys by
  // linear search, too slow for tens of thousands of them.
  std::string vocab_text = "{";
  for (size_t id = 0; id < vocab.tokens.size(); ++id) {
    vocab_text += id == 0 ? "\n" : ",\n";
    vocab_text += "      " + ordered_json(byte_level_encode(vocab.tokens[id])).dump() + ": " +
                  std::to_string(id);
  }
  vocab_text += "\n    }";
  std::string merges_text = "[";
  for (size_t i = 0; i < vocab.merges.size(); ++i) {
    const auto& [left, right] = vocab.merges[i];
    merges_text += i == 0 ? "\n" : ",\n";
    merges_text +=
        "      " + ordered_json(byte_level_encode(left) + " " + byte_level_encode(right)).dump();
  }
  merges_text += vocab.merges.empty() ? "]" : "\n    ]";
  ordered_json model;
  model["type"] = "BPE";
  model["dropout"] = nullptr;
  model["unk_token"] = nullptr;
  model["continuing_subword_prefix"] = nullptr;
  model["end_of_word_suffix"] = nullptr;
  model["fuse_unk"] = false;
  model["byte_fallback"] = false;
  model["ignore_merges"] = false;
  model["vocab"] = kVocabPlaceholder;
  model["merges"] = kMergesPlaceholder;

  ordered_json out;
  out["version"] = "1.0";
  out["truncation"] = nullptr;
  out["padding"] = nullptr;
  out["added_tokens"] = std::move(added);
  out["normalizer"] = nullptr;
  out["pre_tokenizer"] = std::move(pre_tokenizer);
  out["post_processor"] = std::move(post_processor);
  out["decoder"] = std::move(decoder);
  out["model"] = std::move(model);
  std::string text = out.dump(2) + "\n";
  auto splice = [&text](const std::string& placeholder, const std::string& value) {
    const std::string quoted = "\"" + placeholder + "\"";
    text.replace(text.find(quoted), quoted.size(), value);
  };
  splice(kVocabPlaceholder, vocab_text);
  splice(kMergesPlaceholder, merges_text);
  return text;
}

std::string demo_tokenizer_config_json(const DemoVocabulary& vocab, int64_t model_max_length) {
  ordered_json decoder = ordered_json::object();
  for (size_t i = 0; i < kDemoSpecialTokens.size(); ++i) {
    ordered_json t = added_token(kDemoSpecialTokens[i], vocab.special_id(i));
    t.erase("id");
    decoder[std::to_string(vocab.special_id(i))] = std::move(t);
  }
  ordered_json out;
  out["added_tokens_decoder"] = std::move(decoder);
  out["bos_token"] = kDemoSpecialTokens[0];
  out["chat_template"] = kChatTemplate;
  out["clean_up_tokenization_spaces"] = false;
  out["eos_token"] = kDemoSpecialTokens[3];
  out["model_input_names"] = {"input_ids", "attention_mask"};
  out["model_max_length"] = model_max_length;
  out["pad_token"] = kDemoSpecialTokens[4];
  out["tokenizer_class"] = "PreTrainedTokenizerFast";
  return out.dump(2) + "\n";
}

}  // namespace pagellm::engine

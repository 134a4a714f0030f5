#include "engine/incremental_detokenizer.h"

#include "engine/byte_level.h"
#include "engine/token_decoder.h"
#include "engine/tokenizer_impl.h"
#include "engine/utf8.h"

namespace pagellm::engine {
namespace {

// A text-to-text streaming step over the joined output.
class Stage {
 public:
  virtual ~Stage() = default;
  virtual void push(std::string_view text, std::string& out) = 0;
  virtual void finish(std::string& out) = 0;
  virtual void drop_held() = 0;  // forget held-back text (after priming with context)
};

// Python str.replace / Hugging Face Replace on a stream: text that could still be the
// start of a match is held back until the next piece decides it.
class ReplaceStage : public Stage {
 public:
  ReplaceStage(std::string from, std::string to) : from_(std::move(from)), to_(std::move(to)) {}
  void push(std::string_view text, std::string& out) override {
    held_.append(text);
    size_t pos = 0;
    for (size_t at = held_.find(from_); at != std::string::npos; at = held_.find(from_, pos)) {
      out.append(held_, pos, at - pos);
      out += to_;
      pos = at + from_.size();
    }
    const size_t rest = held_.size() - pos;
    size_t keep = std::min(rest, from_.size() - 1);
    while (keep > 0 && held_.compare(held_.size() - keep, keep, from_, 0, keep) != 0)
      --keep;
    out.append(held_, pos, rest - keep);
    held_.erase(0, held_.size() - keep);
  }
  void finish(std::string& out) override {
    out += held_;
    held_.clear();
  }
  void drop_held() override { held_.clear(); }

 private:
  std::string from_, to_;
  std::string held_;
};

// Strip decoder on the joined text: up to `start` leading and `stop` trailing copies of
// one character. Trailing ones are held until later text shows they are not the end.
class StripStage : public Stage {
 public:
  StripStage(std::string content, size_t start, size_t stop)
      : content_(std::move(content)), to_strip_(start), stop_(stop) {}
  void push(std::string_view text, std::string& out) override {
    while (to_strip_ > 0 && text.substr(0, content_.size()) == content_) {
      text.remove_prefix(content_.size());
      --to_strip_;
    }
    if (text.empty()) return;
    to_strip_ = 0;
    if (stop_ == 0) {
      out.append(text);
      return;
    }
    held_.append(text);
    size_t trailing = 0;
    size_t end = held_.size();
    while (trailing < stop_ && end >= content_.size() &&
           held_.compare(end - content_.size(), content_.size(), content_) == 0) {
      end -= content_.size();
      ++trailing;
    }
    out.append(held_, 0, end);
    held_.erase(0, end);
  }
  void finish(std::string&) override { held_.clear(); }  // only strippable text is held
  void drop_held() override { held_.clear(); }

 private:
  std::string content_;
  size_t to_strip_;
  size_t stop_;
  std::string held_;
};

}  // namespace

struct IncrementalDetokenizer::State {
  enum class Join { kPlain, kSpaced, kByteLevel, kByteFallback };

  std::shared_ptr<const Tokenizer::Impl> impl;
  Tokenizer tokenizer;
  DetokenizeOptions options;
  bool cleanup = false;
  bool finished = false;

  // Fast path.
  bool streaming = true;
  std::vector<const DecoderStep*> token_steps;  // applied to each token on its own
  Join join = Join::kPlain;
  std::vector<std::unique_ptr<Stage>> stages;  // on the joined text, then cleanup
  size_t token_index = 0;
  std::string pending;  // bytes of an incomplete character

  // Fallback: re-decode everything.
  std::vector<TokenId> ids;
  size_t context_size = 0;
  std::string emitted;

  explicit State(const Tokenizer& t) : impl(t.impl()), tokenizer(t) {}

  void compile() {
    const TokenDecoder& decoder = impl->decoder;
    if (!decoder.present()) {
      join = Join::kSpaced;
    } else {
      bool joined = false;
      bool after_byte_fallback = false;
      for (const DecoderStep& step : decoder.steps()) {
        if (!joined) {
          switch (step.kind) {
            case DecoderStep::kByteLevel:
              if (!token_steps.empty() || after_byte_fallback) streaming = false;
              join = Join::kByteLevel;
              joined = true;
              break;
            case DecoderStep::kByteFallback:
              if (after_byte_fallback) streaming = false;
              join = Join::kByteFallback;
              after_byte_fallback = true;
              break;
            case DecoderStep::kFuse:
              joined = true;
              break;
            default:
              // Per-token steps after ByteFallback would see decoded runs: unsupported.
              if (after_byte_fallback) streaming = false;
              token_steps.push_back(&step);
          }
        } else if (step.kind == DecoderStep::kStrip) {
          stages.push_back(std::make_unique<StripStage>(step.content, step.start, step.stop));
        } else if (step.kind == DecoderStep::kReplace && !step.pattern.regex) {
          stages.push_back(std::make_unique<ReplaceStage>(step.pattern.literal, step.content));
        } else if (step.kind != DecoderStep::kFuse) {
          streaming = false;
        }
      }
    }
    if (cleanup) {
      for (const auto& [from, to] : kCleanupReplacements) {
        stages.push_back(std::make_unique<ReplaceStage>(std::string(from), std::string(to)));
      }
    }
  }

  void emit_text(std::string_view text, std::string& out) {
    if (text.empty()) return;
    std::string current(text), next;
    for (const auto& stage : stages) {
      next.clear();
      stage->push(current, next);
      current.swap(next);
      if (current.empty()) return;
    }
    out += current;
  }

  // Decodes as many whole characters of `pending` as possible.
  void drain_pending(std::string& out, bool final, bool fffd_per_byte) {
    if (pending.empty()) return;
    std::string text;
    size_t i = 0;
    while (i < pending.size()) {
      const utf8::SequenceInfo info = utf8::inspect(std::string_view(pending).substr(i));
      if (info.kind == utf8::SequenceInfo::kValid) {
        text.append(pending, i, info.length);
      } else if (info.kind == utf8::SequenceInfo::kIncomplete && !final) {
        break;
      } else {
        for (size_t n = fffd_per_byte ? info.length : 1; n > 0; --n)
          text += utf8::kReplacement;
      }
      i += info.length;
    }
    pending.erase(0, i);
    emit_text(text, out);
  }

  void add_token(TokenId id, std::string& out) {
    const std::string* token = impl->token_string(id);
    if (token == nullptr) return;
    if (options.skip_special_tokens && impl->is_special(id)) return;
    if (!streaming) {
      ids.push_back(id);
      return;
    }
    bool byte = false;
    const std::string piece = token_piece(*token, token_index++, byte);
    switch (join) {
      case Join::kSpaced:
      case Join::kPlain:
        emit_text(piece, out);
        return;
      case Join::kByteLevel:
        pending += piece;
        drain_pending(out, false, false);
        return;
      case Join::kByteFallback:
        if (byte) {
          pending += piece;
          drain_pending(out, false, true);
          return;
        }
        drain_pending(out, true, true);  // the run ends: leftovers are U+FFFD per byte
        emit_text(piece, out);
        return;
    }
  }

  // The bytes the `index`-th token adds to the text, before characters split across
  // tokens are put together: a byte-level token's bytes, or the one byte of a <0xNN>
  // byte-fallback token (`byte` set then), may be part of a character.
  std::string token_piece(const std::string& token, size_t index, bool& byte) const {
    byte = false;
    switch (join) {
      case Join::kSpaced:
        return index > 0 ? " " + token : token;
      case Join::kByteLevel: {
        std::string bytes;
        if (!byte_level::decode(token, bytes)) bytes = token;  // an added token's text
        return bytes;
      }
      case Join::kByteFallback: {
        std::string text = apply_token_steps(token, index);
        const int value = byte_fallback_value(text);
        if (value < 0) return text;
        byte = true;
        return std::string(1, static_cast<char>(value));
      }
      case Join::kPlain:
        break;
    }
    return apply_token_steps(token, index);
  }

  std::string apply_token_steps(const std::string& token, size_t index) const {
    std::string text = token;
    for (const DecoderStep* step : token_steps) {
      switch (step->kind) {
        case DecoderStep::kReplace:
          text = replace_all(text, step->pattern, step->content);
          break;
        case DecoderStep::kMetaspace:
          text = metaspace_token(text, step->content, index == 0 && step->strip_first);
          break;
        case DecoderStep::kStrip:
          text = strip_chars(text, step->content, step->start, step->stop);
          break;
        default:
          break;
      }
    }
    return text;
  }

  // Fallback: what can be emitted of the full decode so far.
  void emit_fallback(std::string& out, bool final) {
    std::string full = tokenizer.decode(ids, options.skip_special_tokens, cleanup);
    if (!final) {
      // A trailing U+FFFD may still become a character; later cleanup may still
      // change the last few characters, so keep them back.
      while (full.size() >= 3 && full.compare(full.size() - 3, 3, utf8::kReplacement) == 0) {
        full.resize(full.size() - 3);
      }
      size_t keep = std::min<size_t>(full.size(), 4);
      while (keep < full.size() &&
             (static_cast<unsigned char>(full[full.size() - keep]) & 0xC0) == 0x80)
        ++keep;
      full.resize(full.size() - keep);
    }
    if (full.compare(0, emitted.size(), emitted) != 0) resync(full);
    if (full.size() > emitted.size() && full.compare(0, emitted.size(), emitted) == 0) {
      out.append(full, emitted.size(), std::string::npos);
      emitted = std::move(full);
    }
  }

  // Cleanup rewrote text already emitted (or the prompt's end): " 's" became "'s" when
  // the s came. What went out stays; `emitted` becomes the part of `full` it stands
  // for, so that what follows still comes. Cleanup only ever drops a space before
  // punctuation; anything else, the text from the same length on.
  void resync(const std::string& full) {
    size_t common = 0;
    while (common < emitted.size() && common < full.size() && emitted[common] == full[common])
      ++common;
    const std::string_view rest = std::string_view(emitted).substr(common);
    if (!rest.empty() && rest[0] == ' ' &&
        std::string_view(full).substr(common, rest.size() - 1) == rest.substr(1)) {
      emitted = full.substr(0, common + rest.size() - 1);
    } else if (full.size() >= emitted.size()) {
      emitted = full.substr(0, emitted.size());
    }
  }
};

IncrementalDetokenizer::IncrementalDetokenizer(const Tokenizer& tokenizer,
                                               DetokenizeOptions options,
                                               std::span<const TokenId> context)
    : state_(std::make_unique<State>(tokenizer)) {
  State& s = *state_;
  s.options = options;
  s.cleanup =
      options.clean_up_tokenization_spaces.value_or(tokenizer.clean_up_tokenization_spaces());
  s.compile();
  if (context.empty()) return;
  std::string discarded;
  for (TokenId id : context)
    s.add_token(id, discarded);
  if (s.streaming) {
    s.pending.clear();
    for (const auto& stage : s.stages)
      stage->drop_held();
  } else {
    s.emitted = tokenizer.decode(s.ids, options.skip_special_tokens, s.cleanup);
  }
}

std::string IncrementalDetokenizer::token_bytes(TokenId id) const {
  const State& s = *state_;
  const std::string* token = s.impl->token_string(id);
  if (token == nullptr) return {};
  if (!s.streaming) {
    // Decoders the stream cannot follow token by token: the token's own decode.
    const TokenId one[] = {id};
    return s.tokenizer.decode(one, false, false);
  }
  bool byte = false;
  return s.token_piece(*token, 1, byte);
}

IncrementalDetokenizer::~IncrementalDetokenizer() = default;
IncrementalDetokenizer::IncrementalDetokenizer(IncrementalDetokenizer&&) noexcept = default;
IncrementalDetokenizer& IncrementalDetokenizer::operator=(IncrementalDetokenizer&&) noexcept =
    default;

std::string IncrementalDetokenizer::add(TokenId id) {
  std::string out;
  if (state_->finished) return out;
  state_->add_token(id, out);
  if (!state_->streaming) state_->emit_fallback(out, false);
  return out;
}

std::string IncrementalDetokenizer::add(std::span<const TokenId> ids) {
  std::string out;
  if (state_->finished) return out;
  for (TokenId id : ids)
    state_->add_token(id, out);
  if (!state_->streaming) state_->emit_fallback(out, false);
  return out;
}

std::string IncrementalDetokenizer::finish() {
  std::string out;
  State& s = *state_;
  if (s.finished) return out;
  s.finished = true;
  if (!s.streaming) {
    s.emit_fallback(out, true);
    return out;
  }
  s.drain_pending(out, true, s.join == State::Join::kByteFallback);
  std::string current, next;
  // Flush the stages in order: what one releases still passes through the next ones.
  for (size_t i = 0; i < s.stages.size(); ++i) {
    next.clear();
    if (!current.empty()) s.stages[i]->push(current, next);
    s.stages[i]->finish(next);
    current.swap(next);
  }
  out += current;
  return out;
}

}  // namespace pagellm::engine

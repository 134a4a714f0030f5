#pragma once
// StopStringMatcher: finds a request's stop strings in its streamed text.
//
// Text that could still turn out to be the start of a stop string is held back, so the
// client never receives part of a stop string; the stop string itself is not returned
// (as OpenAI does) unless asked for. Held-back text is cut at UTF-8 character boundaries.

#include <string>
#include <string_view>
#include <vector>

namespace pagellm::engine {

class StopStringMatcher {
 public:
  // `include_stop`: the text returned at a stop ends with the stop string.
  explicit StopStringMatcher(std::vector<std::string> stops, bool include_stop = false);

  // Appends new text; returns what can be sent now. Once a stop string is found, the
  // text before it is returned, stopped() turns true and later calls return nothing.
  // Unless `checked`, no stop string may end in this text (min_tokens: the first tokens'
  // text is never a stop, as in vLLM; one that ends in later text may begin in it).
  std::string push(std::string_view text, bool checked = true);
  // The end of the stream: returns the held-back text (nothing after a stop).
  std::string flush();
  bool stopped() const { return stopped_; }
  bool empty() const { return stops_.empty(); }
  bool includes_stop() const { return include_stop_; }

 private:
  std::vector<std::string> stops_;
  size_t hold_ = 0;  // longest stop string - 1: bytes that may start a match
  std::string pending_;
  size_t sent_ = 0;           // bytes returned so far (pending_ starts there)
  size_t unchecked_end_ = 0;  // no stop string ends at or before this byte
  bool stopped_ = false;
  bool include_stop_ = false;
};

}  // namespace pagellm::engine

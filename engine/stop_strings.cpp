#include "engine/stop_strings.h"

#include <algorithm>

namespace pagellm::engine {

StopStringMatcher::StopStringMatcher(std::vector<std::string> stops, bool include_stop)
    : include_stop_(include_stop) {
  for (std::string& s : stops) {
    if (!s.empty()) stops_.push_back(std::move(s));
  }
  for (const std::string& s : stops_)
    hold_ = std::max(hold_, s.size() - 1);
}

std::string StopStringMatcher::push(std::string_view text, bool checked) {
  if (stopped_) return {};
  if (stops_.empty()) return std::string(text);
  pending_.append(text);
  if (!checked) unchecked_end_ = sent_ + pending_.size();
  // The earliest match; of stop strings found at one place, the first listed. A match
  // must end past the unchecked text.
  size_t first = std::string::npos, length = 0;
  for (const std::string& s : stops_) {
    const size_t end_after = unchecked_end_ > sent_ ? unchecked_end_ - sent_ : 0;
    const size_t from = end_after >= s.size() ? end_after - s.size() + 1 : 0;
    const size_t at = pending_.find(s, from);
    if (at < first) {
      first = at;
      length = s.size();
    }
  }
  if (first != std::string::npos) {
    stopped_ = true;
    std::string out = pending_.substr(0, first + (include_stop_ ? length : 0));
    pending_.clear();
    return out;
  }
  if (pending_.size() <= hold_) return {};
  size_t cut = pending_.size() - hold_;
  // Do not split a UTF-8 character: back up over continuation bytes.
  while (cut > 0 && (static_cast<unsigned char>(pending_[cut]) & 0xC0) == 0x80)
    --cut;
  std::string out = pending_.substr(0, cut);
  pending_.erase(0, cut);
  sent_ += cut;
  return out;
}

std::string StopStringMatcher::flush() {
  if (stopped_) return {};
  std::string out;
  out.swap(pending_);
  return out;
}

}  // namespace pagellm::engine

#include "stop_matcher.h"

#include <algorithm>
#include <utility>

namespace geist::serve {

StopMatcher::StopMatcher(std::vector<std::string> stops) {
  for (std::string &s : stops) {
    if (!s.empty()) stops_.push_back(std::move(s));
  }
}

std::string StopMatcher::push(const std::string &text) {
  if (stopped_) return std::string();
  pending_ += text;
  // The earliest full match of any stop string ends the output before it.
  size_t first = std::string::npos;
  for (const std::string &s : stops_) first = std::min(first, pending_.find(s));
  if (first != std::string::npos) {
    stopped_ = true;
    std::string out = pending_.substr(0, first);
    pending_.clear();
    return out;
  }
  // Hold back the longest suffix of pending_ that is a proper prefix of a stop string
  // (it may complete later); emit the rest. pending_ holds no full match, so a held
  // suffix is shorter than the longest stop string.
  size_t hold = 0;
  for (const std::string &s : stops_) {
    const size_t most = std::min(s.size() - 1, pending_.size());
    for (size_t k = most; k > hold; --k) {
      if (pending_.compare(pending_.size() - k, k, s, 0, k) == 0) {
        hold = k;
        break;
      }
    }
  }
  std::string out = pending_.substr(0, pending_.size() - hold);
  pending_.erase(0, pending_.size() - hold);
  return out;
}

std::string StopMatcher::flush() {
  std::string out = stopped_ ? std::string() : std::move(pending_);
  pending_.clear();
  return out;
}

}  // namespace geist::serve

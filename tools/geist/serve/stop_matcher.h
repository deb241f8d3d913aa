// Stop strings over streamed text: text that could still become a stop string is held
// back, a stop string that spans tokens is found, and neither it nor anything after it
// is ever emitted. Not thread-safe (one per request).
#pragma once

#include <string>
#include <vector>

namespace geist::serve {

class StopMatcher {
 public:
  explicit StopMatcher(std::vector<std::string> stops);

  // Appends text; returns what may be emitted now. After a match, stopped() is true and
  // later pushes return "".
  std::string push(const std::string &text);
  // The held-back text (generation ended without a match); empty after a match.
  std::string flush();
  bool stopped() const { return stopped_; }

 private:
  std::vector<std::string> stops_;  // non-empty
  std::string pending_;             // text not yet emitted: a suffix that may begin a stop string
  bool stopped_ = false;
};

}  // namespace geist::serve

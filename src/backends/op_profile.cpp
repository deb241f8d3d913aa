#include "backends/op_profile.h"

#include <algorithm>
#include <cstdlib>
#include <vector>

namespace geist {

bool OpProfile::enabled() {
  static const bool v = [] {
    const char *e = std::getenv("GEIST_PROFILE");
    return e != nullptr && e[0] == '1';
  }();
  return v;
}

void OpProfile::print(const std::string &device, const char *note) const {
  if (ops_.empty()) return;
  std::vector<std::pair<std::string, std::pair<double, long>>> v(ops_.begin(), ops_.end());
  std::sort(v.begin(), v.end(), [](const auto &a, const auto &b) { return a.second.first > b.second.first; });
  double total = 0;
  for (const auto &e : v) total += e.second.first;
  std::fprintf(stderr, "GEIST_PROFILE %s: %.1f ms in ops (%s)\n", device.c_str(), total * 1e3, note);
  for (const auto &e : v) {
    std::fprintf(stderr, "  %-44s %9.2f ms %5.1f %%  %8ld calls  %9.1f us/call\n", e.first.c_str(),
                 e.second.first * 1e3, total > 0 ? 100 * e.second.first / total : 0.0, e.second.second,
                 e.second.first * 1e6 / double(e.second.second));
  }
}

std::string profile_label(const std::string &op, int n_rows) {
  return op + (n_rows == 1 ? " (1 row)" : " (n rows)");
}

}  // namespace geist

#include "engine/model_paths.h"

#include <cstdlib>

namespace geist {

std::string default_model_file() {
  if (const char *m = std::getenv("GEIST_MODEL"); m && *m) return m;
  std::string dir;
  if (const char *d = std::getenv("GEIST_MODEL_DIR"); d && *d) {
    dir = d;
  } else if (const char *x = std::getenv("XDG_CACHE_HOME"); x && *x) {
    dir = std::string(x) + "/geist/models";
  } else if (const char *h = std::getenv("HOME"); h && *h) {
    dir = std::string(h) + "/.cache/geist/models";
  } else {
    dir = ".cache/geist/models";
  }
  return dir + "/" + kDefaultModelName;
}

}  // namespace geist

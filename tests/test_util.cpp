#include "test_util.h"

#include <cstdlib>
#include <fstream>
#include <iterator>

#include "engine/model_paths.h"

namespace geist::test {

std::string data_path(const std::string &rel) { return std::string(GEIST_TEST_DATA_DIR) + "/" + rel; }

std::string default_model_path() {
  std::string p = geist::default_model_file();
  std::ifstream f(p, std::ios::binary);
  return f.good() ? p : std::string();
}

std::vector<uint8_t> read_file(const std::string &path) {
  std::ifstream f(path, std::ios::binary);
  EXPECT_TRUE(f.good()) << "cannot read " << path;
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(f), {});
}

}  // namespace geist::test

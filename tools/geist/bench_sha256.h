// SHA-256 (FIPS 180-4) of bytes and of files, for the model hash in `geist bench --hash`.
// Self-contained: the build's dependencies (scripts/install_deps.sh) carry no crypto
// library, and a benchmark header needs only the digest. Not constant-time; not for secrets.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace geist::cli::bench {

class Sha256 {
 public:
  Sha256();
  void update(const void *data, size_t n);
  // The digest as 64 lowercase hex digits. Call once; the object is spent afterwards.
  std::string hex_digest();

 private:
  void block(const uint8_t *p);  // one 64-byte block
  uint32_t h_[8];
  uint8_t buf_[64];
  size_t buf_len_ = 0;
  uint64_t total_ = 0;  // bytes
};

// Hex SHA-256 of a file's bytes, read in 1 MiB blocks; false if it cannot be read.
bool sha256_file(const std::string &path, std::string *hex);

}  // namespace geist::cli::bench

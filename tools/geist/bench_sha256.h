// SHA-256 of bytes and of files, for the model hash in `geist bench --hash`: OpenSSL's
// EVP digest (Debian's libssl-dev) behind a small interface.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace geist::cli::bench {

class Sha256 {
 public:
  Sha256();
  ~Sha256();
  Sha256(const Sha256 &) = delete;
  Sha256 &operator=(const Sha256 &) = delete;
  void update(const void *data, size_t n);
  // The digest as 64 lowercase hex digits. Call once; the object is spent afterwards.
  std::string hex_digest();

 private:
  void *ctx_;  // EVP_MD_CTX
};

// Hex SHA-256 of a file's bytes, read in 1 MiB blocks; false if it cannot be read.
bool sha256_file(const std::string &path, std::string *hex);

}  // namespace geist::cli::bench

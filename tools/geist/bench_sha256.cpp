#include "bench_sha256.h"

#include <openssl/evp.h>

#include <cstdio>
#include <new>
#include <vector>

namespace geist::cli::bench {

Sha256::Sha256() : ctx_(EVP_MD_CTX_new()) {
  if (!ctx_ || EVP_DigestInit_ex(static_cast<EVP_MD_CTX *>(ctx_), EVP_sha256(), nullptr) != 1) throw std::bad_alloc();
}

Sha256::~Sha256() { EVP_MD_CTX_free(static_cast<EVP_MD_CTX *>(ctx_)); }

void Sha256::update(const void *data, size_t n) {
  if (n) EVP_DigestUpdate(static_cast<EVP_MD_CTX *>(ctx_), data, n);
}

std::string Sha256::hex_digest() {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  EVP_DigestFinal_ex(static_cast<EVP_MD_CTX *>(ctx_), md, &len);
  static const char kHex[] = "0123456789abcdef";
  std::string out;
  for (unsigned int i = 0; i < len; ++i) {
    out += kHex[md[i] >> 4];
    out += kHex[md[i] & 15];
  }
  return out;
}

bool sha256_file(const std::string &path, std::string *hex) {
  FILE *f = std::fopen(path.c_str(), "rb");
  if (!f) return false;
  Sha256 h;
  std::vector<unsigned char> buf(1 << 20);
  size_t n;
  while ((n = std::fread(buf.data(), 1, buf.size(), f)) > 0) h.update(buf.data(), n);
  const bool ok = !std::ferror(f);
  std::fclose(f);
  if (ok) *hex = h.hex_digest();
  return ok;
}

}  // namespace geist::cli::bench

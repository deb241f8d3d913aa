// libFuzzer entry for the GGUF reader: any byte sequence must give a Status or a fully
// valid GgufFile, never a crash, leak or UB (built with ASan+UBSan by the fuzz preset).
// When parsing succeeds every accessor is exercised and every byte a view points at is
// read, so an out-of-bounds view is caught by ASan.
// Run: scripts/fuzz_gguf.sh [seconds]
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "gguf/gguf_reader.h"

namespace {

using geist::gguf::GgufFile;
using geist::gguf::TensorInfo;
using geist::gguf::Value;
using geist::gguf::ValueType;

// Folds bytes into a sink the optimizer cannot drop.
volatile uint64_t g_sink;
void touch(const void *p, size_t n) {
  uint64_t h = 0;
  const uint8_t *b = static_cast<const uint8_t *>(p);
  for (size_t i = 0; i < n; ++i) h = h * 31 + b[i];
  g_sink = g_sink + h;
}

void touch_value(const GgufFile &f, const std::string &key, const Value &v) {
  touch(key.data(), key.size());
  (void)v.as_uint(), (void)v.as_int(), (void)v.as_float(), (void)v.as_bool();
  if (auto s = v.as_string()) touch(s->data(), s->size());
  std::string r = v.to_string(4);
  touch(r.data(), r.size());
  if (v.is_array()) {
    uint64_t n = v.count < 64 ? v.count : 64;
    for (uint64_t i = 0; i <= n; ++i) (void)v.array_int(i), (void)v.array_float(i);
    (void)v.array_int(v.count - 1), (void)v.array_float(UINT64_MAX);
    for (std::string_view s : v.strings) touch(s.data(), s.size());
  }
  if (f.find(key) == nullptr) __builtin_trap();  // every key must be findable
  (void)f.get_uint(key), (void)f.get_float(key), (void)f.get_string(key), (void)f.get_bool(key);
}

void touch_tensor(const GgufFile &f, const TensorInfo &t) {
  if (f.tensor(t.name) != &t) __builtin_trap();  // names are unique and indexed
  if (t.data < f.base() || t.n_bytes > f.file_size() ||
      static_cast<size_t>(t.data - f.base()) > f.file_size() - t.n_bytes) {
    __builtin_trap();  // a view outside the buffer
  }
  (void)t.n_elements();
  (void)geist::quant::type_name(t.type);
  if (t.n_bytes != 0) touch(t.data, 1), touch(t.data + t.n_bytes - 1, 1);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  // Copy into an exactly sized heap buffer so ASan sees any read past the end.
  std::vector<uint8_t> buf(data, data + size);
  auto r = GgufFile::from_memory(size == 0 ? nullptr : buf.data(), size);
  if (!r.is_ok()) {
    if (r.status().message().empty()) __builtin_trap();  // every error says why
    return 0;
  }
  const GgufFile &f = *r.value();
  (void)f.version(), (void)f.alignment(), (void)f.data_offset();
  for (const auto &[key, v] : f.metadata()) touch_value(f, key, v);
  for (const TensorInfo &t : f.tensors()) touch_tensor(f, t);
  (void)f.find("general.alignment"), (void)f.tensor("token_embd.weight");
  (void)f.get_uint("general.alignment");
  return 0;
}

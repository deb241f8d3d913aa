// GGUF reader: maps a file (or borrows a caller's buffer) and validates all of it up front.
// Versions 2 and 3. After a successful open, every metadata value and tensor view is
// in bounds; nothing is copied except small per-key bookkeeping (string views into the
// mapping). A GgufFile is immutable after open and safe to read from many threads.
//
// Errors (never an assert, never UB on any byte sequence):
//   GEIST_E_IO            the file cannot be opened / stat'ed / mapped
//   GEIST_E_BAD_FORMAT    bad magic, truncated data, counts or sizes that overflow, tensor
//                         data outside the file, misaligned tensor offsets, duplicate keys or
//                         tensor names, bad dims, wrong type of general.alignment, ...
//   GEIST_E_UNSUPPORTED   version other than 2/3 (also big-endian files), unknown metadata
//                         value type, unknown tensor type id, arrays nested deeper than
//                         kMaxArrayDepth
// The message names the problem and where (key name, tensor name, byte offset).
// Accepted on purpose: tensors with zero elements (some ne == 0; n_bytes == 0, their
// offset must still be aligned and inside the data section), known tensor types that
// geist cannot dequantize (the model loader decides), nested arrays (validated, no
// element access), extra bytes after the last tensor.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/mapped_file.h"
#include "base/status.h"
#include "quant/ggml_type.h"

namespace geist::gguf {

// Deepest array-of-array nesting accepted (1 = a plain array).
inline constexpr int kMaxArrayDepth = 16;

enum class ValueType : uint32_t {
  UINT8 = 0, INT8 = 1, UINT16 = 2, INT16 = 3, UINT32 = 4, INT32 = 5, FLOAT32 = 6, BOOL = 7,
  STRING = 8, ARRAY = 9, UINT64 = 10, INT64 = 11, FLOAT64 = 12,
  COUNT  // sentinel
};
const char *value_type_name(ValueType t);

// One metadata value. Scalars and numeric arrays point at their bytes in the mapping
// (little-endian, possibly unaligned: read with memcpy). String arrays are pre-split.
struct Value {
  ValueType type = ValueType::UINT8;
  ValueType elem_type = ValueType::UINT8;  // ARRAY only
  uint64_t count = 0;                      // ARRAY only: number of elements
  const uint8_t *data = nullptr;           // scalar bytes, or first array element
  std::string_view str;                    // STRING only
  std::vector<std::string_view> strings;   // ARRAY of STRING only (views into the mapping)
                                           // ARRAY of ARRAY: data points at the first
                                           // nested array's header; no element access

  bool is_array() const { return type == ValueType::ARRAY; }

  // Scalar conversions; nullopt if the type does not fit (e.g. negative -> unsigned,
  // string -> number). Integer getters accept any integer type whose value fits; the
  // float getter accepts floats and integers.
  std::optional<uint64_t> as_uint() const;
  std::optional<int64_t> as_int() const;
  std::optional<double> as_float() const;
  std::optional<bool> as_bool() const;
  std::optional<std::string_view> as_string() const;

  // Numeric array element i converted as above; nullopt if not a numeric array, out of
  // range, or not convertible.
  std::optional<int64_t> array_int(uint64_t i) const;
  std::optional<double> array_float(uint64_t i) const;

  // Human-readable rendering for `geist inspect` (arrays abbreviated after max_elems).
  std::string to_string(size_t max_elems = 8) const;
};

struct TensorInfo {
  std::string name;
  uint32_t n_dims = 0;
  int64_t ne[4] = {1, 1, 1, 1};    // ggml order: ne[0] is the contiguous dimension
  quant::GgmlType type = quant::GgmlType::F32;
  uint64_t offset = 0;             // relative to the start of the data section
  size_t n_bytes = 0;              // exact size of the tensor's data
  const uint8_t *data = nullptr;   // base() + data_offset() + offset, inside the file

  int64_t n_elements() const { return ne[0] * ne[1] * ne[2] * ne[3]; }
};

class GgufFile {
 public:
  // Map and validate a file. The mapping lives as long as the GgufFile.
  static Result<std::unique_ptr<GgufFile>> open(const std::string &path);
  // An empty file gives GEIST_E_IO (it cannot be mapped); a missing one GEIST_E_IO.
  // Validate a caller-owned buffer (no copy); the caller keeps it alive and unchanged.
  // size 0 gives GEIST_E_BAD_FORMAT; data == nullptr with size > 0 GEIST_E_INVALID_ARGUMENT.
  static Result<std::unique_ptr<GgufFile>> from_memory(const void *data, size_t size);

  ~GgufFile();
  GgufFile(const GgufFile &) = delete;
  GgufFile &operator=(const GgufFile &) = delete;

  uint32_t version() const { return version_; }
  size_t alignment() const { return alignment_; }
  size_t file_size() const { return size_; }
  const uint8_t *base() const { return base_; }
  uint64_t data_offset() const { return data_offset_; }  // start of the tensor data section
  const std::string &path() const { return path_; }      // "" for from_memory

  // Metadata in file order.
  const std::vector<std::pair<std::string, Value>> &metadata() const { return kv_; }
  const Value *find(std::string_view key) const;  // nullptr if absent
  const std::vector<TensorInfo> &tensors() const { return tensors_; }
  const TensorInfo *tensor(std::string_view name) const;  // nullptr if absent

  // Typed lookups for required keys: GEIST_E_BAD_FORMAT naming the key if it is missing
  // or of an incompatible type.
  Result<uint64_t> get_uint(std::string_view key) const;
  Result<double> get_float(std::string_view key) const;
  Result<std::string_view> get_string(std::string_view key) const;
  Result<bool> get_bool(std::string_view key) const;

  // Advise the kernel on access patterns over the whole mapping (no-op for from_memory).
  void advise_willneed() const;
  // Drop the mapped pages wholly inside [p, p + len) from memory (MADV_DONTNEED; read
  // again, they fault back in from the file). For weights a backend repacked. No-op for
  // from_memory or a range outside the mapping.
  void release_pages(const void *p, size_t len) const;

 private:
  GgufFile() = default;
  Status parse();

  std::string path_;
  const uint8_t *base_ = nullptr;
  size_t size_ = 0;
  bool owns_mapping_ = false;
  MappedFile mapping_;  // set by open(); empty for from_memory
  uint32_t version_ = 0;
  size_t alignment_ = 32;
  uint64_t data_offset_ = 0;
  std::vector<std::pair<std::string, Value>> kv_;
  std::vector<TensorInfo> tensors_;
  // Lookup indexes (sorted by name), built once in parse().
  std::vector<uint32_t> kv_index_;
  std::vector<uint32_t> tensor_index_;
};

}  // namespace geist::gguf

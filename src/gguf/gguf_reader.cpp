// GGUF reader. File layout (all little-endian, no implicit padding):
//
//   header      char magic[4] = "GGUF"; u32 version (2 or 3); u64 tensor_count; u64 kv_count
//   kv[]        gguf_string key; u32 value_type; value
//                 gguf_string = u64 len; u8 bytes[len]        (not NUL-terminated)
//                 scalar      = 1/2/4/8 bytes by type; bool is one byte, 0 or 1
//                 array       = u32 elem_type; u64 count; elem[count] (elems may be arrays)
//   tensor[]    gguf_string name; u32 n_dims (1..4); u64 ne[n_dims]; u32 type; u64 offset
//   padding     zeros up to a multiple of general.alignment (u32, default 32)
//   data        tensor bytes; each tensor at data_offset + offset, offset % alignment == 0
//
// Every read goes through Cursor, which checks `n <= remaining` before forming any
// pointer, so no arithmetic on a count or length from the file can overflow or step
// outside the buffer. Counts are checked against the bytes left before any allocation.
#include "gguf/gguf_reader.h"

#include <algorithm>
#include <charconv>
#include <cstring>
#include <limits>

namespace geist::gguf {

namespace {

constexpr char kMagic[4] = {'G', 'G', 'U', 'F'};
constexpr size_t kHeaderBytes = 4 + 4 + 8 + 8;
// Smallest possible encodings, used to bound counts before reserving memory.
constexpr uint64_t kMinKvBytes = 8 + 4 + 1;                  // empty key, type, u8 value
constexpr uint64_t kMinTensorInfoBytes = 8 + 4 + 8 + 4 + 8;  // empty name, 1 dim
constexpr uint64_t kMinArrayBytes = 4 + 8;                   // elem type + count
constexpr uint64_t kMinStringBytes = 8;                      // length only
constexpr uint32_t kDefaultAlignment = 32;

// Bytes of one scalar of type t; 0 for STRING, ARRAY and unknown types.
size_t scalar_size(ValueType t) {
  switch (t) {
    case ValueType::UINT8:
    case ValueType::INT8:
    case ValueType::BOOL:
      return 1;
    case ValueType::UINT16:
    case ValueType::INT16:
      return 2;
    case ValueType::UINT32:
    case ValueType::INT32:
    case ValueType::FLOAT32:
      return 4;
    case ValueType::UINT64:
    case ValueType::INT64:
    case ValueType::FLOAT64:
      return 8;
    default:
      return 0;
  }
}

bool is_valid_type(uint32_t t) {
  return t < static_cast<uint32_t>(ValueType::COUNT);
}

template <typename T>
T load(const uint8_t *p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

// Bounds-checked sequential reader over [base, base + size). `where` names the
// enclosing key or tensor for messages ("key 'general.name'").
struct Cursor {
  const uint8_t *base;
  size_t size;
  size_t pos = 0;

  size_t remaining() const { return size - pos; }

  Status need(uint64_t n, const char *what, const std::string &where) const {
    if (n > remaining()) {
      return GEIST_ERROR(GEIST_E_BAD_FORMAT,
                         "truncated file: %s%s%s at offset %zu needs %llu bytes, only %zu "
                         "remain (file size %zu)",
                         where.c_str(), where.empty() ? "" : ": ", what, pos,
                         static_cast<unsigned long long>(n), remaining(), size);
    }
    return Status::ok();
  }
  // Returns a pointer to n bytes and advances; call need() first.
  const uint8_t *take(size_t n) {
    const uint8_t *p = base + pos;
    pos += n;
    return p;
  }
  template <typename T>
  Status read(T *out, const char *what, const std::string &where) {
    GEIST_RETURN_IF_ERROR(need(sizeof(T), what, where));
    *out = load<T>(take(sizeof(T)));
    return Status::ok();
  }
  Status read_string(std::string_view *out, const char *what, const std::string &where) {
    size_t at = pos;
    uint64_t len = 0;
    GEIST_RETURN_IF_ERROR(read(&len, what, where));
    if (len > remaining()) {
      return GEIST_ERROR(GEIST_E_BAD_FORMAT,
                         "%s%s%s at offset %zu has length %llu but only %zu bytes remain "
                         "(file size %zu)",
                         where.c_str(), where.empty() ? "" : ": ", what, at,
                         static_cast<unsigned long long>(len), remaining(), size);
    }
    const uint8_t *p = take(static_cast<size_t>(len));
    *out = std::string_view(reinterpret_cast<const char *>(p), static_cast<size_t>(len));
    return Status::ok();
  }
};

// Quoted for messages; control bytes escaped, long names cut to keep messages short.
std::string quote(std::string_view s) {
  constexpr size_t kMaxShown = 128;
  bool cut = s.size() > kMaxShown;
  if (cut) s = s.substr(0, kMaxShown);
  std::string out = "'";
  for (char c : s) {
    unsigned char u = static_cast<unsigned char>(c);
    if (u < 0x20 || u == 0x7f) {
      out += strprintf("\\x%02x", u);
    } else {
      out += c;
    }
  }
  return out + (cut ? "'..." : "'");
}

Status parse_value(Cursor &cur, ValueType type, const std::string &where, int depth, Value *out);

// Validates the array header and elements at the cursor; fills out->elem_type, count,
// data and (for strings) strings. Nested arrays are validated and skipped.
Status parse_array(Cursor &cur, const std::string &where, int depth, Value *out) {
  size_t at = cur.pos;
  if (depth > kMaxArrayDepth) {
    return GEIST_ERROR(GEIST_E_UNSUPPORTED, "%s: arrays nested deeper than %d levels at offset %zu",
                       where.c_str(), kMaxArrayDepth, at);
  }
  uint32_t elem = 0;
  uint64_t count = 0;
  GEIST_RETURN_IF_ERROR(cur.read(&elem, "array element type", where));
  if (!is_valid_type(elem)) {
    return GEIST_ERROR(GEIST_E_UNSUPPORTED, "%s: unknown array element type %u at offset %zu",
                       where.c_str(), elem, at);
  }
  size_t count_at = cur.pos;
  GEIST_RETURN_IF_ERROR(cur.read(&count, "array count", where));
  ValueType et = static_cast<ValueType>(elem);
  size_t esize = scalar_size(et);
  uint64_t min_elem = esize != 0                ? esize
                      : et == ValueType::STRING ? kMinStringBytes
                                                : kMinArrayBytes;
  if (count > cur.remaining() / min_elem) {
    return GEIST_ERROR(GEIST_E_BAD_FORMAT,
                       "%s: array of %llu %s elements at offset %zu cannot fit in the %zu "
                       "bytes that remain",
                       where.c_str(), static_cast<unsigned long long>(count), value_type_name(et),
                       count_at, cur.remaining());
  }
  out->elem_type = et;
  out->count = count;
  out->data = cur.base + cur.pos;
  if (esize != 0) {
    const uint8_t *p = cur.take(static_cast<size_t>(count * esize));
    if (et == ValueType::BOOL) {
      for (uint64_t i = 0; i < count; ++i) {
        if (p[i] > 1) {
          return GEIST_ERROR(GEIST_E_BAD_FORMAT,
                             "%s: bool array element %llu at offset %zu is %u, not 0 or 1",
                             where.c_str(), static_cast<unsigned long long>(i),
                             static_cast<size_t>(p + i - cur.base), static_cast<unsigned>(p[i]));
        }
      }
    }
    return Status::ok();
  }
  if (et == ValueType::STRING) {
    out->strings.reserve(static_cast<size_t>(count));  // bounded by remaining / 8
    for (uint64_t i = 0; i < count; ++i) {
      std::string_view s;
      GEIST_RETURN_IF_ERROR(cur.read_string(&s, "array string", where));
      out->strings.push_back(s);
    }
    return Status::ok();
  }
  for (uint64_t i = 0; i < count; ++i) {  // ARRAY of ARRAY: validate, keep nothing
    Value nested;
    nested.type = ValueType::ARRAY;
    GEIST_RETURN_IF_ERROR(parse_array(cur, where, depth + 1, &nested));
  }
  return Status::ok();
}

// Parses one value of a known type at the cursor into *out.
Status parse_value(Cursor &cur, ValueType type, const std::string &where, int depth, Value *out) {
  out->type = type;
  if (type == ValueType::STRING) {
    GEIST_RETURN_IF_ERROR(cur.read_string(&out->str, "string value", where));
    out->data = reinterpret_cast<const uint8_t *>(out->str.data());
    return Status::ok();
  }
  if (type == ValueType::ARRAY) return parse_array(cur, where, depth + 1, out);
  size_t n = scalar_size(type);
  size_t at = cur.pos;
  GEIST_RETURN_IF_ERROR(cur.need(n, value_type_name(type), where));
  out->data = cur.take(n);
  if (type == ValueType::BOOL && out->data[0] > 1) {
    return GEIST_ERROR(GEIST_E_BAD_FORMAT, "%s: bool value at offset %zu is %u, not 0 or 1",
                       where.c_str(), at, static_cast<unsigned>(out->data[0]));
  }
  return Status::ok();
}

// Sorted index of names; returns the first duplicate pair (positions in file order) if any.
template <typename NameOf>
std::vector<uint32_t> sorted_index(size_t n, NameOf name_of,
                                   std::optional<std::pair<uint32_t, uint32_t>> *dup) {
  std::vector<uint32_t> idx(n);
  for (size_t i = 0; i < n; ++i) idx[i] = static_cast<uint32_t>(i);
  std::stable_sort(idx.begin(), idx.end(),
                   [&](uint32_t a, uint32_t b) { return name_of(a) < name_of(b); });
  dup->reset();
  for (size_t i = 1; i < n; ++i) {
    if (name_of(idx[i - 1]) == name_of(idx[i])) {
      *dup = std::make_pair(idx[i - 1], idx[i]);
      break;
    }
  }
  return idx;
}

Status parse_header(Cursor &cur, uint32_t *version, uint64_t *tensor_count, uint64_t *kv_count) {
  if (cur.size < kHeaderBytes) {
    return GEIST_ERROR(GEIST_E_BAD_FORMAT,
                       "not a GGUF file: %zu bytes is shorter than the %zu-byte header", cur.size,
                       kHeaderBytes);
  }
  const uint8_t *m = cur.take(4);
  if (std::memcmp(m, kMagic, 4) != 0) {
    return GEIST_ERROR(GEIST_E_BAD_FORMAT,
                       "not a GGUF file: bad magic %02x %02x %02x %02x at offset 0 "
                       "(expected 'GGUF')",
                       m[0], m[1], m[2], m[3]);
  }
  *version = load<uint32_t>(cur.take(4));
  uint32_t swapped = __builtin_bswap32(*version);
  if (swapped == 2 || swapped == 3) {
    return GEIST_ERROR(GEIST_E_UNSUPPORTED,
                       "big-endian GGUF (version %u byte-swapped) is not supported", swapped);
  }
  if (*version != 2 && *version != 3) {
    return GEIST_ERROR(GEIST_E_UNSUPPORTED,
                       "GGUF version %u is not supported (only versions 2 and 3)", *version);
  }
  *tensor_count = load<uint64_t>(cur.take(8));
  *kv_count = load<uint64_t>(cur.take(8));
  // Bound both counts by the bytes left before anything is reserved.
  uint64_t rem = cur.remaining();
  if (*kv_count > rem / kMinKvBytes) {
    return GEIST_ERROR(GEIST_E_BAD_FORMAT,
                       "kv_count %llu at offset 16 cannot fit in the %llu bytes after the header",
                       static_cast<unsigned long long>(*kv_count),
                       static_cast<unsigned long long>(rem));
  }
  if (*tensor_count > rem / kMinTensorInfoBytes ||
      *tensor_count * kMinTensorInfoBytes > rem - *kv_count * kMinKvBytes) {
    return GEIST_ERROR(GEIST_E_BAD_FORMAT,
                       "tensor_count %llu at offset 8 cannot fit in the %llu bytes after the "
                       "header (with %llu metadata entries)",
                       static_cast<unsigned long long>(*tensor_count),
                       static_cast<unsigned long long>(rem),
                       static_cast<unsigned long long>(*kv_count));
  }
  // Index entries are 32-bit (a real file has far fewer than 2^32 keys or tensors).
  if (*kv_count > UINT32_MAX || *tensor_count > UINT32_MAX) {
    return GEIST_ERROR(GEIST_E_BAD_FORMAT, "tensor_count %llu or kv_count %llu exceeds 2^32",
                       static_cast<unsigned long long>(*tensor_count),
                       static_cast<unsigned long long>(*kv_count));
  }
  return Status::ok();
}

Status parse_kvs(Cursor &cur, uint64_t kv_count, std::vector<std::pair<std::string, Value>> *kv,
                 std::vector<size_t> *key_offsets) {
  kv->reserve(static_cast<size_t>(kv_count));
  key_offsets->reserve(static_cast<size_t>(kv_count));
  for (uint64_t i = 0; i < kv_count; ++i) {
    size_t at = cur.pos;
    std::string ctx = strprintf("metadata entry %llu", static_cast<unsigned long long>(i));
    std::string_view key;
    GEIST_RETURN_IF_ERROR(cur.read_string(&key, "key", ctx));
    ctx = "key " + quote(key);
    uint32_t type = 0;
    size_t type_at = cur.pos;
    GEIST_RETURN_IF_ERROR(cur.read(&type, "value type", ctx));
    if (!is_valid_type(type)) {
      return GEIST_ERROR(GEIST_E_UNSUPPORTED, "%s: unknown value type %u at offset %zu",
                         ctx.c_str(), type, type_at);
    }
    Value v;
    GEIST_RETURN_IF_ERROR(parse_value(cur, static_cast<ValueType>(type), ctx, 0, &v));
    kv->emplace_back(std::string(key), std::move(v));
    key_offsets->push_back(at);
  }
  return Status::ok();
}

// Reads one tensor info at the cursor and validates everything that does not depend on
// the data section (dims, type, size arithmetic).
Status parse_tensor_info(Cursor &cur, uint64_t i, TensorInfo *t) {
  std::string ctx = strprintf("tensor info %llu", static_cast<unsigned long long>(i));
  std::string_view name;
  GEIST_RETURN_IF_ERROR(cur.read_string(&name, "name", ctx));
  t->name = std::string(name);
  ctx = "tensor " + quote(name);
  size_t at = cur.pos;
  GEIST_RETURN_IF_ERROR(cur.read(&t->n_dims, "n_dims", ctx));
  if (t->n_dims < 1 || t->n_dims > 4) {
    return GEIST_ERROR(GEIST_E_BAD_FORMAT, "%s: n_dims %u at offset %zu is not in 1..4",
                       ctx.c_str(), t->n_dims, at);
  }
  int64_t n_elem = 1;
  bool overflow = false;
  for (uint32_t d = 0; d < t->n_dims; ++d) {
    at = cur.pos;
    GEIST_RETURN_IF_ERROR(cur.read(&t->ne[d], "dimension", ctx));
    if (t->ne[d] < 0) {
      return GEIST_ERROR(GEIST_E_BAD_FORMAT, "%s: ne[%u] = %lld at offset %zu is negative",
                         ctx.c_str(), d, static_cast<long long>(t->ne[d]), at);
    }
    overflow |= __builtin_mul_overflow(n_elem, t->ne[d], &n_elem);
  }
  if (overflow) {
    return GEIST_ERROR(GEIST_E_BAD_FORMAT,
                       "%s: element count %lld x %lld x %lld x %lld overflows int64", ctx.c_str(),
                       static_cast<long long>(t->ne[0]), static_cast<long long>(t->ne[1]),
                       static_cast<long long>(t->ne[2]), static_cast<long long>(t->ne[3]));
  }
  at = cur.pos;
  uint32_t type = 0;
  GEIST_RETURN_IF_ERROR(cur.read(&type, "type", ctx));
  const quant::TypeTraits *tt = quant::type_traits(type);
  if (tt == nullptr) {
    return GEIST_ERROR(GEIST_E_UNSUPPORTED, "%s: unknown tensor type id %u at offset %zu",
                       ctx.c_str(), type, at);
  }
  t->type = static_cast<quant::GgmlType>(type);
  if (t->ne[0] % tt->block_size != 0) {
    return GEIST_ERROR(GEIST_E_BAD_FORMAT,
                       "%s: ne[0] = %lld is not a multiple of the %s block size %lld", ctx.c_str(),
                       static_cast<long long>(t->ne[0]), tt->name,
                       static_cast<long long>(tt->block_size));
  }
  // Bytes = blocks * block_bytes; blocks <= n_elem < 2^63, so only the multiply can overflow.
  uint64_t blocks = static_cast<uint64_t>(n_elem / tt->block_size);
  uint64_t n_bytes = 0;
  if (__builtin_mul_overflow(blocks, static_cast<uint64_t>(tt->block_bytes), &n_bytes) ||
      n_bytes > std::numeric_limits<size_t>::max()) {
    return GEIST_ERROR(GEIST_E_BAD_FORMAT, "%s: data size of %lld %s elements overflows",
                       ctx.c_str(), static_cast<long long>(n_elem), tt->name);
  }
  t->n_bytes = static_cast<size_t>(n_bytes);
  return cur.read(&t->offset, "data offset", ctx);
}

// Reads general.alignment if present: must be a u32, nonzero power of two.
Status read_alignment(const std::vector<std::pair<std::string, Value>> &kv,
                      const std::vector<size_t> &key_offsets, size_t *alignment) {
  *alignment = kDefaultAlignment;
  for (size_t i = 0; i < kv.size(); ++i) {
    if (kv[i].first != "general.alignment") continue;
    const Value &v = kv[i].second;
    if (v.type != ValueType::UINT32) {
      return GEIST_ERROR(GEIST_E_BAD_FORMAT,
                         "key 'general.alignment' at offset %zu has type %s, expected UINT32",
                         key_offsets[i], value_type_name(v.type));
    }
    uint32_t a = load<uint32_t>(v.data);
    if (a == 0 || (a & (a - 1)) != 0) {
      return GEIST_ERROR(GEIST_E_BAD_FORMAT,
                         "key 'general.alignment' at offset %zu is %u, not a nonzero power of two",
                         key_offsets[i], a);
    }
    *alignment = a;
  }
  return Status::ok();
}

// Checks each tensor's offset alignment and bounds, sets its data pointer, then checks
// that no two tensors with data overlap.
Status place_tensors(std::vector<TensorInfo> *tensors, const uint8_t *base, size_t size,
                     uint64_t data_offset, size_t alignment) {
  if (!tensors->empty() && data_offset > size) {
    return GEIST_ERROR(GEIST_E_BAD_FORMAT,
                       "truncated file: the tensor data section would start at offset %llu, "
                       "past the end of the file (size %zu)",
                       static_cast<unsigned long long>(data_offset), size);
  }
  uint64_t data_size = data_offset <= size ? size - data_offset : 0;
  for (TensorInfo &t : *tensors) {
    if (t.offset % alignment != 0) {
      return GEIST_ERROR(GEIST_E_BAD_FORMAT,
                         "tensor %s: data offset %llu (relative to the data section) is not a "
                         "multiple of the alignment %zu",
                         quote(t.name).c_str(), static_cast<unsigned long long>(t.offset),
                         alignment);
    }
    if (t.offset > data_size || t.n_bytes > data_size - t.offset) {
      // File offset of the data, unless data_offset + offset itself overflows.
      uint64_t abs = 0;
      std::string where =
          __builtin_add_overflow(data_offset, t.offset, &abs)
              ? strprintf("%llu + %llu", static_cast<unsigned long long>(data_offset),
                          static_cast<unsigned long long>(t.offset))
              : std::to_string(abs);
      return GEIST_ERROR(GEIST_E_BAD_FORMAT,
                         "tensor %s: data [offset %s, %zu bytes) lies outside the file (size "
                         "%zu, data section at %llu)",
                         quote(t.name).c_str(), where.c_str(), t.n_bytes, size,
                         static_cast<unsigned long long>(data_offset));
    }
    t.data = base + data_offset + t.offset;
  }
  std::vector<const TensorInfo *> order;
  order.reserve(tensors->size());
  for (const TensorInfo &t : *tensors) {
    if (t.n_bytes != 0) order.push_back(&t);
  }
  std::sort(order.begin(), order.end(),
            [](const TensorInfo *a, const TensorInfo *b) { return a->offset < b->offset; });
  for (size_t i = 1; i < order.size(); ++i) {
    const TensorInfo *a = order[i - 1], *b = order[i];
    if (b->offset < a->offset + a->n_bytes) {  // no overflow: both end inside the file
      return GEIST_ERROR(GEIST_E_BAD_FORMAT,
                         "tensor %s: data [offset %llu, %zu bytes) overlaps tensor %s "
                         "[offset %llu, %zu bytes)",
                         quote(b->name).c_str(),
                         static_cast<unsigned long long>(data_offset + b->offset), b->n_bytes,
                         quote(a->name).c_str(),
                         static_cast<unsigned long long>(data_offset + a->offset), a->n_bytes);
    }
  }
  return Status::ok();
}

}  // namespace

const char *value_type_name(ValueType t) {
  static const char *const kNames[] = {"UINT8",  "INT8",    "UINT16", "INT16",  "UINT32",
                                       "INT32",  "FLOAT32", "BOOL",   "STRING", "ARRAY",
                                       "UINT64", "INT64",   "FLOAT64"};
  uint32_t i = static_cast<uint32_t>(t);
  return i < static_cast<uint32_t>(ValueType::COUNT) ? kNames[i] : "UNKNOWN";
}

// ---- Value ----------------------------------------------------------------------------

namespace {

// Integer scalar at p of type t, as a signed/unsigned pair; false if t is not an integer.
bool load_integer(ValueType t, const uint8_t *p, bool *negative, uint64_t *magnitude_or_bits) {
  int64_t s = 0;
  switch (t) {
    case ValueType::UINT8:
      *negative = false;
      *magnitude_or_bits = load<uint8_t>(p);
      return true;
    case ValueType::UINT16:
      *negative = false;
      *magnitude_or_bits = load<uint16_t>(p);
      return true;
    case ValueType::UINT32:
      *negative = false;
      *magnitude_or_bits = load<uint32_t>(p);
      return true;
    case ValueType::UINT64:
      *negative = false;
      *magnitude_or_bits = load<uint64_t>(p);
      return true;
    case ValueType::INT8:
      s = load<int8_t>(p);
      break;
    case ValueType::INT16:
      s = load<int16_t>(p);
      break;
    case ValueType::INT32:
      s = load<int32_t>(p);
      break;
    case ValueType::INT64:
      s = load<int64_t>(p);
      break;
    default:
      return false;
  }
  *negative = s < 0;
  *magnitude_or_bits = static_cast<uint64_t>(s);  // two's complement bits when negative
  return true;
}

std::optional<uint64_t> to_uint(ValueType t, const uint8_t *p) {
  bool neg = false;
  uint64_t v = 0;
  if (p == nullptr || !load_integer(t, p, &neg, &v) || neg) return std::nullopt;
  return v;
}

std::optional<int64_t> to_int(ValueType t, const uint8_t *p) {
  bool neg = false;
  uint64_t v = 0;
  if (p == nullptr || !load_integer(t, p, &neg, &v)) return std::nullopt;
  if (!neg && v > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return std::nullopt;
  return static_cast<int64_t>(v);
}

std::optional<double> to_float(ValueType t, const uint8_t *p) {
  if (p == nullptr) return std::nullopt;
  if (t == ValueType::FLOAT32) return static_cast<double>(load<float>(p));
  if (t == ValueType::FLOAT64) return load<double>(p);
  bool neg = false;
  uint64_t v = 0;
  if (!load_integer(t, p, &neg, &v)) return std::nullopt;
  return neg ? static_cast<double>(static_cast<int64_t>(v)) : static_cast<double>(v);
}

template <typename F>
std::string shortest(F v) {
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof(buf), v);
  return std::string(buf, r.ptr);
}

// Renders one scalar of type t at p.
std::string scalar_to_string(ValueType t, const uint8_t *p) {
  if (t == ValueType::BOOL) return p[0] != 0 ? "true" : "false";
  if (t == ValueType::FLOAT32) return shortest(load<float>(p));
  if (t == ValueType::FLOAT64) return shortest(load<double>(p));
  bool neg = false;
  uint64_t v = 0;
  if (!load_integer(t, p, &neg, &v)) return "?";
  return neg ? std::to_string(static_cast<int64_t>(v)) : std::to_string(v);
}

std::string string_to_display(std::string_view s) {
  std::string out = "\"";
  for (char c : s) {
    unsigned char u = static_cast<unsigned char>(c);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (c == '\n') {
      out += "\\n";
    } else if (u < 0x20 || u == 0x7f) {
      out += strprintf("\\x%02x", u);
    } else {
      out += c;
    }
  }
  return out + "\"";
}

}  // namespace

std::optional<uint64_t> Value::as_uint() const {
  return to_uint(type, data);
}
std::optional<int64_t> Value::as_int() const {
  return to_int(type, data);
}
std::optional<double> Value::as_float() const {
  return to_float(type, data);
}

std::optional<bool> Value::as_bool() const {
  if (type != ValueType::BOOL || data == nullptr) return std::nullopt;
  return data[0] != 0;
}

std::optional<std::string_view> Value::as_string() const {
  if (type != ValueType::STRING) return std::nullopt;
  return str;
}

std::optional<int64_t> Value::array_int(uint64_t i) const {
  size_t es = scalar_size(elem_type);
  if (type != ValueType::ARRAY || es == 0 || i >= count || data == nullptr) return std::nullopt;
  return to_int(elem_type, data + i * es);
}

std::optional<double> Value::array_float(uint64_t i) const {
  size_t es = scalar_size(elem_type);
  if (type != ValueType::ARRAY || es == 0 || i >= count || data == nullptr) return std::nullopt;
  return to_float(elem_type, data + i * es);
}

std::string Value::to_string(size_t max_elems) const {
  if (type == ValueType::STRING) return string_to_display(str);
  if (type != ValueType::ARRAY) {
    return data != nullptr && scalar_size(type) != 0 ? scalar_to_string(type, data) : "?";
  }
  std::string out = "[";
  uint64_t shown = std::min<uint64_t>(count, max_elems);
  size_t es = scalar_size(elem_type);
  for (uint64_t i = 0; i < shown; ++i) {
    if (i != 0) out += ", ";
    if (elem_type == ValueType::STRING && i < strings.size()) {
      out += string_to_display(strings[i]);
    } else if (es != 0 && data != nullptr) {
      out += scalar_to_string(elem_type, data + i * es);
    } else {
      out += "[...]";
    }
  }
  if (shown < count) {
    out += strprintf(", ... (%llu %s total)", static_cast<unsigned long long>(count),
                     value_type_name(elem_type));
  }
  return out + "]";
}

// ---- GgufFile -------------------------------------------------------------------------

GgufFile::~GgufFile() = default;

Result<std::unique_ptr<GgufFile>> GgufFile::open(const std::string &path) {
  GEIST_ASSIGN_OR_RETURN(MappedFile m, MappedFile::open(path));
  std::unique_ptr<GgufFile> f(new GgufFile());
  f->path_ = path;
  f->base_ = m.data();
  f->size_ = m.size();
  f->owns_mapping_ = true;
  f->mapping_ = std::move(m);
  Status st = f->parse();
  if (!st.is_ok()) return Status(st.code(), "'" + path + "': " + st.message());
  return f;
}

Result<std::unique_ptr<GgufFile>> GgufFile::from_memory(const void *data, size_t size) {
  if (data == nullptr && size != 0) {
    return GEIST_ERROR(GEIST_E_INVALID_ARGUMENT, "from_memory: null buffer of %zu bytes", size);
  }
  std::unique_ptr<GgufFile> f(new GgufFile());
  f->base_ = static_cast<const uint8_t *>(data);
  f->size_ = size;
  GEIST_RETURN_IF_ERROR(f->parse());
  return f;
}

Status GgufFile::parse() {
  if (size_ == 0 || base_ == nullptr) {
    return GEIST_ERROR(GEIST_E_BAD_FORMAT, "not a GGUF file: the file is empty (0 bytes)");
  }
  Cursor cur{base_, size_};
  uint64_t tensor_count = 0, kv_count = 0;
  GEIST_RETURN_IF_ERROR(parse_header(cur, &version_, &tensor_count, &kv_count));

  std::vector<size_t> key_offsets;
  GEIST_RETURN_IF_ERROR(parse_kvs(cur, kv_count, &kv_, &key_offsets));
  std::optional<std::pair<uint32_t, uint32_t>> dup;
  kv_index_ = sorted_index(
      kv_.size(), [&](uint32_t i) -> const std::string & { return kv_[i].first; }, &dup);
  if (dup) {
    return GEIST_ERROR(GEIST_E_BAD_FORMAT, "duplicate metadata key %s at offsets %zu and %zu",
                       quote(kv_[dup->first].first).c_str(), key_offsets[dup->first],
                       key_offsets[dup->second]);
  }
  GEIST_RETURN_IF_ERROR(read_alignment(kv_, key_offsets, &alignment_));

  tensors_.reserve(static_cast<size_t>(tensor_count));  // bounded by parse_header
  for (uint64_t i = 0; i < tensor_count; ++i) {
    TensorInfo t;
    GEIST_RETURN_IF_ERROR(parse_tensor_info(cur, i, &t));
    tensors_.push_back(std::move(t));
  }
  tensor_index_ = sorted_index(
      tensors_.size(), [&](uint32_t i) -> const std::string & { return tensors_[i].name; }, &dup);
  if (dup) {
    return GEIST_ERROR(GEIST_E_BAD_FORMAT, "duplicate tensor name %s (tensor infos %u and %u)",
                       quote(tensors_[dup->first].name).c_str(), dup->first, dup->second);
  }
  // Padding after the tensor infos up to the alignment; pos <= size, alignment <= 2^31,
  // so this cannot overflow a 64-bit offset.
  uint64_t pos = cur.pos;
  data_offset_ = (pos + alignment_ - 1) / alignment_ * alignment_;
  return place_tensors(&tensors_, base_, size_, data_offset_, alignment_);
}

const Value *GgufFile::find(std::string_view key) const {
  auto it = std::lower_bound(kv_index_.begin(), kv_index_.end(), key,
                             [&](uint32_t i, std::string_view k) { return kv_[i].first < k; });
  if (it == kv_index_.end() || kv_[*it].first != key) return nullptr;
  return &kv_[*it].second;
}

const TensorInfo *GgufFile::tensor(std::string_view name) const {
  auto it = std::lower_bound(tensor_index_.begin(), tensor_index_.end(), name,
                             [&](uint32_t i, std::string_view k) { return tensors_[i].name < k; });
  if (it == tensor_index_.end() || tensors_[*it].name != name) return nullptr;
  return &tensors_[*it];
}

namespace {

template <typename T, typename Get>
Result<T> typed_get(const GgufFile &f, std::string_view key, const char *expected, Get get) {
  const Value *v = f.find(key);
  if (v == nullptr) {
    return GEIST_ERROR(GEIST_E_BAD_FORMAT, "required metadata key '%.*s' is missing",
                       static_cast<int>(key.size()), key.data());
  }
  std::optional<T> r = get(*v);
  if (!r) {
    std::string shown = v->to_string(4);
    if (shown.size() > 64) shown = shown.substr(0, 60) + " ...";
    return GEIST_ERROR(GEIST_E_BAD_FORMAT, "metadata key '%.*s' is %s %s, expected %s",
                       static_cast<int>(key.size()), key.data(), value_type_name(v->type),
                       shown.c_str(), expected);
  }
  return *r;
}

}  // namespace

Result<uint64_t> GgufFile::get_uint(std::string_view key) const {
  return typed_get<uint64_t>(*this, key, "a non-negative integer",
                             [](const Value &v) { return v.as_uint(); });
}
Result<double> GgufFile::get_float(std::string_view key) const {
  return typed_get<double>(*this, key, "a number", [](const Value &v) { return v.as_float(); });
}
Result<std::string_view> GgufFile::get_string(std::string_view key) const {
  return typed_get<std::string_view>(*this, key, "a string",
                                     [](const Value &v) { return v.as_string(); });
}
Result<bool> GgufFile::get_bool(std::string_view key) const {
  return typed_get<bool>(*this, key, "a bool", [](const Value &v) { return v.as_bool(); });
}

void GgufFile::release_pages(const void *p, size_t len) const {
  const auto *b = static_cast<const uint8_t *>(p);
  if (!owns_mapping_ || b < base_ || b + len > base_ + size_) return;
  // Only whole pages inside [p, p + len): a neighbour's bytes on a shared page stay.
  const size_t page = 4096;
  size_t lo = static_cast<size_t>(b - base_), hi = lo + len;
  lo = (lo + page - 1) / page * page;
  hi = hi / page * page;
  if (hi > lo) mapping_.advise_dontneed(lo, hi - lo);
}

void GgufFile::advise_willneed() const {
  if (owns_mapping_) mapping_.advise_willneed();
}

}  // namespace geist::gguf

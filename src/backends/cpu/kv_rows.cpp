#include "backends/cpu/kv_rows.h"

#include <cstring>

#include "base/status.h"
#include "quant/block_formats.h"
#include "quant/dot.h"
#include "quant/quant.h"

namespace geist::cpu {
namespace {

constexpr int kQ8Block = 32;
constexpr size_t kQ8BlockBytes = 34;  // f16 d, then 32 int8 q: ggml's block_q8_0
static_assert(sizeof(quant::BlockQ8_0) == kQ8BlockBytes);

void store_f16(const float *x, int64_t n, uint8_t *p) {
  for (int64_t i = 0; i < n; ++i) {
    const uint16_t h = quant::fp32_to_fp16(x[i]);
    std::memcpy(p + 2 * i, &h, 2);
  }
}

void store_bf16(const float *x, int64_t n, uint8_t *p) {
  for (int64_t i = 0; i < n; ++i) {
    const uint16_t h = quant::fp32_to_bf16(x[i]);
    std::memcpy(p + 2 * i, &h, 2);
  }
}

// One block at a time through the activation quantizer (quant/dot.h), whose q lands in
// the block itself; its d is f32(f16(amax / 127)), so f16 of it is the f16 it came from
// (d is never NaN: amax ignores NaN elements).
void store_q8_0(const float *x, int64_t n, uint8_t *p) {
  for (int64_t b = 0; b < n / kQ8Block; ++b, p += kQ8BlockBytes) {
    float d;
    quant::quantize_row_to(quant::ActFormat::Q8_0, x + b * kQ8Block, kQ8Block, &d,
                           reinterpret_cast<int8_t *>(p + 2));
    const uint16_t h = quant::fp32_to_fp16(d);
    std::memcpy(p, &h, 2);
  }
}

void load_f16(const uint8_t *p, int64_t n, float *y) {
  for (int64_t i = 0; i < n; ++i) {
    uint16_t h;
    std::memcpy(&h, p + 2 * i, 2);
    y[i] = quant::fp16_to_fp32(h);
  }
}

void load_bf16(const uint8_t *p, int64_t n, float *y) {
  for (int64_t i = 0; i < n; ++i) {
    uint16_t h;
    std::memcpy(&h, p + 2 * i, 2);
    y[i] = quant::bf16_to_fp32(h);
  }
}

void load_q8_0(const uint8_t *p, int64_t n, float *y) {
  for (int64_t b = 0; b < n / kQ8Block; ++b, p += kQ8BlockBytes, y += kQ8Block) {
    uint16_t h;
    std::memcpy(&h, p, 2);
    const float d = quant::fp16_to_fp32(h);
    const auto *q = reinterpret_cast<const int8_t *>(p + 2);
    for (int j = 0; j < kQ8Block; ++j) y[j] = d * static_cast<float>(q[j]);
  }
}

}  // namespace

void kv_store_rows(KvType t, const float *src, int64_t n_rows, int64_t row_elems, void *dst) {
  GEIST_CHECK(t != KvType::Q8_0 || row_elems % kQ8Block == 0,
              "q8_0 KV rows must be whole blocks of 32");
  const size_t rb = kv_row_bytes(t, row_elems);
  auto *out = static_cast<uint8_t *>(dst);
  if (t == KvType::F32) {
    std::memcpy(out, src, rb * size_t(n_rows));
    return;
  }
  for (int64_t r = 0; r < n_rows; ++r) {
    const float *x = src + r * row_elems;
    uint8_t *p = out + size_t(r) * rb;
    switch (t) {
      case KvType::F16:
        store_f16(x, row_elems, p);
        break;
      case KvType::BF16:
        store_bf16(x, row_elems, p);
        break;
      case KvType::Q8_0:
        store_q8_0(x, row_elems, p);
        break;
      case KvType::F32:
        break;
    }
  }
}

void kv_load_rows(KvType t, const void *src, int64_t n_rows, int64_t row_elems, float *dst) {
  GEIST_CHECK(t != KvType::Q8_0 || row_elems % kQ8Block == 0,
              "q8_0 KV rows must be whole blocks of 32");
  const size_t rb = kv_row_bytes(t, row_elems);
  const auto *in = static_cast<const uint8_t *>(src);
  if (t == KvType::F32) {
    std::memcpy(dst, in, rb * size_t(n_rows));
    return;
  }
  for (int64_t r = 0; r < n_rows; ++r) {
    const uint8_t *p = in + size_t(r) * rb;
    float *y = dst + r * row_elems;
    switch (t) {
      case KvType::F16:
        load_f16(p, row_elems, y);
        break;
      case KvType::BF16:
        load_bf16(p, row_elems, y);
        break;
      case KvType::Q8_0:
        load_q8_0(p, row_elems, y);
        break;
      case KvType::F32:
        break;
    }
  }
}

}  // namespace geist::cpu

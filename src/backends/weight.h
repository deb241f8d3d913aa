// A weight matrix as the backends see it: a read-only view into the mapped GGUF.
#pragma once

#include <cstddef>
#include <cstdint>

#include "quant/ggml_type.h"

namespace geist {

// [n_out][n_in] row-major in blocks of `type` along n_in (GGUF ne = [n_in, n_out]).
// y[n] = sum_k W[n][k] * x[k]. Not owned: points into the model's mapping.
struct WeightView {
  const uint8_t *data = nullptr;
  quant::GgmlType type = quant::GgmlType::F32;
  int64_t n_in = 0;     // K, contiguous dimension
  int64_t n_out = 0;    // N, rows
  size_t row_bytes = 0; // bytes of one row of n_in elements
  // Set when a backend repacked the matrix at load (backends/cpu/packed.h): groups of 16
  // rows of `group_bytes`, owned by the model. `data` still points at the mapped original.
  const uint8_t *packed = nullptr;
  size_t group_bytes = 0;
  // Set by a device backend at prepare: the same bytes as `data`, in device memory.
  const uint8_t *device = nullptr;

  const uint8_t *row(int64_t n) const { return data + static_cast<size_t>(n) * row_bytes; }
  bool valid() const { return data != nullptr; }
};

}  // namespace geist

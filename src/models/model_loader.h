// Helpers that every architecture's loader uses: typed hyperparameter lookups with the
// architecture prefix, and tensor binding with shape and type checks. Errors name the
// key or tensor and what was expected.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "backends/weight.h"
#include "base/status.h"
#include "gguf/gguf_reader.h"

namespace geist::models {

class HparamReader {
 public:
  HparamReader(const gguf::GgufFile &f, std::string prefix) : f_(f), prefix_(std::move(prefix)) {}
  Result<int64_t> get_int(std::string_view key) const;
  Result<int64_t> get_int_or(std::string_view key, int64_t dflt) const;
  Result<double> get_float(std::string_view key) const;
  Result<double> get_float_or(std::string_view key, double dflt) const;
  Result<std::string> get_string_or(std::string_view key, std::string dflt) const;
  // A key that may be a scalar or a per-layer array of n_layer entries; architectures with
  // uniform layers require every entry to be equal.
  Result<int64_t> get_layer_int(std::string_view key, int64_t n_layer) const;

 private:
  std::string full(std::string_view key) const { return prefix_ + "." + std::string(key); }
  const gguf::GgufFile &f_;
  std::string prefix_;
};

class TensorBinder {
 public:
  explicit TensorBinder(const gguf::GgufFile &f) : f_(f) {}
  // A 2-D weight with ne = [n_in, n_out] (n_out < 0: any) of a type geist computes with.
  Result<WeightView> matrix(const std::string &name, int64_t n_in, int64_t n_out);
  // A 1-D F32 tensor of n elements.
  Result<const float *> vector(const std::string &name, int64_t n);
  int64_t total_elements() const { return total_; }

 private:
  Result<const gguf::TensorInfo *> find(const std::string &name);
  const gguf::GgufFile &f_;
  int64_t total_ = 0;
};

}  // namespace geist::models

// A loaded model: the mapped GGUF, its tokenizer and its architecture's bound weights.
// Immutable after load; share one Model between any number of sessions and threads.
#pragma once

#include <memory>
#include <string>

#include "base/status.h"
#include "engine/tokenizer.h"
#include "gguf/gguf_reader.h"
#include "models/arch.h"

namespace geist {

struct ModelParams {
  bool prefetch = true;  // madvise(WILLNEED) the weights at load so first use does not page them in
  BackendKind backend = BackendKind::Cpu;
  int device = 0;  // GPU ordinal for a device backend
};

class Model {
 public:
  // Map, validate and bind a GGUF file. Errors: GEIST_E_IO (cannot open/map),
  // GEIST_E_BAD_FORMAT (malformed GGUF, missing keys/tensors, wrong shapes),
  // GEIST_E_UNSUPPORTED (architecture, tensor type or tokenizer geist does not run).
  static Result<std::unique_ptr<Model>> load(const std::string &path, const ModelParams &p = {});
  // Same over a caller-owned buffer that must outlive the Model (no copy of the weights).
  static Result<std::unique_ptr<Model>> load_from_memory(const void *data, size_t size, const ModelParams &p = {});

  const gguf::GgufFile &file() const { return *file_; }
  const Tokenizer &tokenizer() const { return tokenizer_; }
  const models::ArchModel &arch() const { return *arch_; }
  const models::ModelInfo &info() const { return arch_->info(); }
  double load_seconds() const { return load_seconds_; }
  // The backend's device in words ("CPU, avx512 (...) tier", "NVIDIA H200 ...").
  const std::string &device() const { return device_; }
  // XXH3-64 of the file's bytes before the tensor data (header, metadata, tensor table):
  // the identity snapshots are checked against.
  uint64_t fingerprint() const { return fingerprint_; }

 private:
  Model(std::unique_ptr<gguf::GgufFile> f, Tokenizer t, std::unique_ptr<models::ArchModel> a)
      : file_(std::move(f)), tokenizer_(std::move(t)), arch_(std::move(a)) {}
  static Result<std::unique_ptr<Model>> finish(std::unique_ptr<gguf::GgufFile> f, const ModelParams &p, double t0);

  std::unique_ptr<gguf::GgufFile> file_;
  Tokenizer tokenizer_;
  std::unique_ptr<models::ArchModel> arch_;
  double load_seconds_ = 0;
  std::string device_;
  uint64_t fingerprint_ = 0;
};

}  // namespace geist

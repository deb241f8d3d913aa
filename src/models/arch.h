// The interface every architecture implements, and the per-session state it runs on
// (KV cache, scratch). An ArchModel is immutable after load and shared by all sessions;
// KvCache and Workspace belong to one session.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "base/status.h"
#include "base/thread_pool.h"

namespace geist::gguf {
class GgufFile;
}

namespace geist::models {

struct ModelInfo {
  std::string arch;     // general.architecture
  std::string name;     // general.name (may be empty)
  int64_t n_vocab = 0;  // rows of the output head
  int64_t n_embd = 0;
  int64_t n_layer = 0;
  int64_t n_ctx_train = 0;
  int64_t n_params = 0;  // elements of all tensors
  // Weights repacked at load for the CPU tier in use (0 on the generic tier).
  uint64_t packed_bytes = 0;
  double repack_seconds = 0;
};

// KV storage wanted for one layer.
struct KvLayerSpec {
  int64_t row_floats = 0;  // n_head_kv * head_dim: floats of one position's K (and of V)
  int window = 0;          // sliding window W, 0 for global layers
};

// K and V rows of every layer, f32. Global layers hold n_ctx positions; sliding layers a
// ring of min(n_ctx, W + max_chunk - 1) positions (position p at slot p % capacity), which
// is what a chunk of up to max_chunk queries needs. Memory is reserved with an anonymous
// mapping, so pages are committed only as positions are written.
class KvCache {
 public:
  static Result<std::unique_ptr<KvCache>> create(const std::vector<KvLayerSpec> &layers,
                                                 int64_t n_ctx, int max_chunk);
  ~KvCache();
  KvCache(const KvCache &) = delete;
  KvCache &operator=(const KvCache &) = delete;

  int64_t n_ctx() const { return n_ctx_; }
  int max_chunk() const { return max_chunk_; }
  int n_layers() const { return static_cast<int>(layers_.size()); }
  // [capacity(l)][row_floats] each
  float *k(int l) { return layers_[l].k; }
  float *v(int l) { return layers_[l].v; }
  const float *k(int l) const { return layers_[l].k; }
  const float *v(int l) const { return layers_[l].v; }
  int64_t capacity(int l) const { return layers_[l].capacity; }
  const KvLayerSpec &spec(int l) const { return layers_[l].spec; }
  size_t bytes_reserved() const { return bytes_; }

  // Rows by position. The ring (position p at slot p % capacity) stays inside this class:
  // callers name positions only. A "rows block" of positions [from, to) is the K rows
  // then the V rows: [2][to - from][row_floats], row-major.
  //
  // First position a continuation from n_past = n still reads in layer l: 0 for global
  // layers, max(0, n - (W - 1)) for sliding ones.
  int64_t first_live(int l, int64_t n) const;
  // Copy positions [from, to) of layer l out to / in from a rows block. The positions
  // must be the ones the ring holds (to - from <= capacity). Pointers need no alignment.
  void read_rows(int l, int64_t from, int64_t to, float *dst) const;
  void write_rows(int l, int64_t from, int64_t to, const float *src);
  // Store n_rows positions pos0 .. pos0 + n_rows - 1 of layer l from K and V rows of
  // row_floats each ([n_rows][row_floats] each), as a forward pass appends them.
  void append(int l, int64_t pos0, int n_rows, const float *k, const float *v);
  // Back to a state at n_pin positions, from a rows block of positions
  // [first_live(l, n_pin), n_pin) saved then: writes back only the rows whose slots a
  // later position in [n_pin, n_past) overwrote (none for global layers). Returns how many.
  int64_t rewind_rows(int l, int64_t n_pin, int64_t n_past, const float *saved);

  int64_t n_past = 0;  // positions [0, n_past) are in the cache

 private:
  struct Layer {
    KvLayerSpec spec;
    int64_t capacity = 0;
    float *k = nullptr;
    float *v = nullptr;
  };
  KvCache() = default;
  std::vector<Layer> layers_;
  int64_t n_ctx_ = 0;
  int max_chunk_ = 0;
  void *mapping_ = nullptr;
  size_t bytes_ = 0;
};

// Growable named scratch buffers of one session; reused across calls.
class Workspace {
 public:
  float *get(int slot, size_t n_floats) {
    if (slot >= static_cast<int>(bufs_.size())) bufs_.resize(slot + 1);
    if (bufs_[slot].size() < n_floats) bufs_[slot].resize(n_floats);
    return bufs_[slot].data();
  }

 private:
  std::vector<std::vector<float>> bufs_;
};

class ArchModel {
 public:
  virtual ~ArchModel() = default;
  virtual const ModelInfo &info() const = 0;
  virtual std::vector<KvLayerSpec> kv_layout() const = 0;
  // Grow ws to what forward() of up to max_chunk rows uses, so forward never allocates.
  virtual void reserve(Workspace &ws, int max_chunk) const = 0;

  // Run tokens[0..n_rows) at positions cache.n_past .. cache.n_past + n_rows - 1, append
  // their K/V, advance cache.n_past. If logits != nullptr, write the logits of rows
  // [first_logit_row, n_rows) to logits: [n_rows - first_logit_row][n_vocab].
  // Requires 1 <= n_rows <= cache.max_chunk(), cache.n_past + n_rows <= cache.n_ctx(),
  // token ids < n_vocab (checked: GEIST_E_INVALID_ARGUMENT / GEIST_E_CONTEXT_FULL, cache
  // unchanged on error).
  virtual Status forward(const int32_t *tokens, int n_rows, KvCache &cache, Workspace &ws,
                         ThreadPool &pool, int first_logit_row, float *logits) const = 0;
};

// Pick the architecture from general.architecture and load it (weights stay in the mapping).
// GEIST_E_UNSUPPORTED for an architecture geist does not run, GEIST_E_BAD_FORMAT for missing
// or inconsistent keys and tensors.
Result<std::unique_ptr<ArchModel>> load_arch(const gguf::GgufFile &file);

}  // namespace geist::models

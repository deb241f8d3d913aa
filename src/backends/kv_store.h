// KV storage of one session, the third interface of the backend seam (backend.h).
//
// Positions, not ring slots, cross this line. Global layers hold n_ctx positions; sliding
// layers a ring of min(n_ctx, W + max_chunk - 1) positions (what a chunk of up to
// max_chunk queries needs), and where a position lives in it is the store's business.
// Callers copy rows by position: snapshots read and write rows of positions, so an image
// moves between backends and chunk sizes. The pin checkpoint (the rows a later prefill
// can overwrite that a continuation from the pin still reads) lives in the store, on the
// device for a GPU, so a reset is a device-side copy of the few rows it needs.
#pragma once

#include <cstddef>
#include <algorithm>
#include <cstdint>
#include <memory>
#include <vector>

#include "backends/kv_type.h"
#include "base/status.h"

namespace geist {

// KV storage wanted for one layer.
struct KvLayerSpec {
  int64_t row_floats = 0;  // n_head_kv * head_dim: elements of one position's K (and of V)
  int window = 0;          // sliding window W, 0 for global layers
  int head_dim = 0;        // elements of one head (a q8_0 cache needs a multiple of 32)
};

// Memory for rows blocks kept where a store keeps its rows (device memory on a GPU): the
// KV part of a saved session state (Session::save_state), so that saving and loading one
// are copies inside the device and never cross the bus. Made by KvStore::new_buffer;
// outlives the store that made it and serves every store of the same space().
class KvBuffer {
 public:
  virtual ~KvBuffer() = default;
  KvBuffer(const KvBuffer &) = delete;
  KvBuffer &operator=(const KvBuffer &) = delete;
  uint8_t *data() const { return data_; }  // in the store's space: not for the host to touch
  size_t size() const { return size_; }
  int space() const { return space_; }
  // Bytes [off, off + n) to host memory (serialising a state). Safe from any thread
  // while no one writes the buffer; on a GPU it runs on a stream of its own.
  virtual Status read(size_t off, size_t n, void *host) const = 0;

 protected:
  KvBuffer(uint8_t *data, size_t size, int space) : data_(data), size_(size), space_(space) {}

 private:
  uint8_t *data_;
  size_t size_;
  int space_;
};

class KvStore {
 public:
  virtual ~KvStore() = default;
  KvStore(const KvStore &) = delete;
  KvStore &operator=(const KvStore &) = delete;

  int64_t n_ctx() const { return n_ctx_; }
  KvType type_k() const { return type_k_; }
  KvType type_v() const { return type_v_; }
  // Bytes of one position's K row / V row in layer l (kv_type.h formats).
  size_t row_bytes_k(int l) const { return kv_row_bytes(type_k_, specs_[l].row_floats); }
  size_t row_bytes_v(int l) const { return kv_row_bytes(type_v_, specs_[l].row_floats); }
  // Bytes of a rows block (below) of n positions of layer l.
  size_t block_bytes(int l, int64_t n) const { return size_t(n) * (row_bytes_k(l) + row_bytes_v(l)); }
  int max_chunk() const { return max_chunk_; }
  int n_layers() const { return static_cast<int>(specs_.size()); }
  const KvLayerSpec &spec(int l) const { return specs_[l]; }
  // Positions layer l can hold at once (n_ctx for global layers).
  int64_t capacity(int l) const { return capacity_[l]; }
  virtual size_t bytes_reserved() const = 0;
  // Where the rows live: -1 for host memory, a GPU's ordinal for its memory. A KvBuffer of
  // the same space may be passed wherever a rows block is read or written below.
  virtual int space() const { return -1; }
  // A buffer of `bytes` in this store's space. GEIST_E_OUT_OF_MEMORY if it does not fit.
  virtual Result<std::unique_ptr<KvBuffer>> new_buffer(size_t bytes) const = 0;

  // First position a continuation from n_past = n still reads in layer l: 0 for global
  // layers, max(0, n - (W - 1)) for sliding ones.
  int64_t first_live(int l, int64_t n) const {
    const int w = specs_[l].window;
    return w > 0 && n > w - 1 ? n - (w - 1) : 0;
  }

  // A "rows block" of positions [from, to) of layer l, on the host: the K rows
  // [to - from][row_bytes_k] then the V rows [to - from][row_bytes_v], in the store's types
  // exactly as stored (so an image moves between backends bit for bit). The positions must
  // be ones the store holds (to - from <= capacity(l)). Pointers need no alignment; each
  // is host memory or inside a KvBuffer of this store's space().
  virtual void read_rows(int l, int64_t from, int64_t to, void *dst) const = 0;
  virtual void write_rows(int l, int64_t from, int64_t to, const void *src) = 0;
  // The checkpoint of a pin at n_pin positions: for every sliding layer, the rows of
  // positions [first_live(l, n_pin), n_pin) (at most W - 1), copied inside the store.
  virtual void save_checkpoint(int64_t n_pin) = 0;
  // Back to a state at n_pin positions from the checkpoint saved at n_pin: writes back
  // only the rows a later position in [n_pin, n_past) overwrote (none for global layers).
  // Returns how many.
  virtual int64_t rewind(int l, int64_t n_pin, int64_t n_past) = 0;
  // The checkpoint of layer l (sliding) as a rows block of [first_live(l, n_pin), n_pin),
  // to and from the host (snapshots).
  virtual void read_checkpoint(int l, int64_t n_pin, void *dst) const = 0;
  virtual void write_checkpoint(int l, int64_t n_pin, const void *src) = 0;
  // Positions the checkpoint of layer l holds at most: W - 1 (at least 1) for sliding
  // layers, 0 for global ones.
  int64_t checkpoint_capacity(int l) const {
    const int w = specs_[l].window;
    return w > 0 ? std::max<int64_t>(1, std::min<int64_t>(w - 1, n_ctx_)) : 0;
  }
  // Bytes of the checkpoint at n_pin (what a pin costs in memory).
  size_t checkpoint_bytes(int64_t n_pin) const {
    size_t b = 0;
    for (int l = 0; l < n_layers(); ++l) {
      if (specs_[l].window > 0) b += block_bytes(l, n_pin - first_live(l, n_pin));
    }
    return b;
  }

  int64_t n_past = 0;  // positions [0, n_past) are in the store

 protected:
  KvStore(const std::vector<KvLayerSpec> &specs, int64_t n_ctx, int max_chunk, KvType tk, KvType tv)
      : specs_(specs), n_ctx_(n_ctx), max_chunk_(max_chunk), type_k_(tk), type_v_(tv) {
    for (const KvLayerSpec &s : specs_) {
      const int64_t ring = int64_t(s.window) + max_chunk - 1;
      capacity_.push_back(s.window > 0 && ring < n_ctx ? ring : n_ctx);
    }
  }

 private:
  std::vector<KvLayerSpec> specs_;
  std::vector<int64_t> capacity_;
  int64_t n_ctx_ = 0;
  int max_chunk_ = 0;
  KvType type_k_ = KvType::F32, type_v_ = KvType::F32;
};

}  // namespace geist

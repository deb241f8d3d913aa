// The CUDA backend: the kernels of kernels.h behind the seam of backend.h. Weights are
// uploaded once, as stored (quantized), and shared by every session; each session gets a
// stream, device scratch, a step block (tokens, first position, RoPE rows) and device KV
// rings. Only the logit rows a caller asked for come back to the host, at end_step.
//
// Compiled only with -DGEIST_CUDA=ON (src/CMakeLists.txt); plain C++ over kernels.h, so it
// needs no CUDA headers.
#include <algorithm>
#include <array>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <type_traits>
#include <mutex>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "backends/backend.h"
#include "backends/op_profile.h"
#include "backends/cpu/ops.h"
#include "backends/cuda/draw_kernels.h"
#include "backends/cuda/kernels.h"
#include "base/timer.h"

namespace geist {
namespace {

using cuda::CudaStream;

// A status from a CUDA call, with what geist was doing and on which device.
Status on_device(const Status &s, const std::string &device, const char *what) {
  if (s.is_ok()) return s;
  return Status(s.code(), std::string(what) + " on " + device + ": " + s.message());
}

// Bytes a weight tensor or KV ring takes in a shared device allocation: at least 1, rounded
// up to 256 (the alignment cudaMalloc gives an allocation of its own).
size_t arena_bytes(size_t bytes) {
  constexpr size_t kAlign = 256;
  return (std::max<size_t>(bytes, 1) + kAlign - 1) / kAlign * kAlign;
}

// A KvBuffer in device memory. read() copies out on a stream of its own (a non-blocking
// one: it waits for nothing a session runs, and no session waits for it).
class DeviceKvBuffer final : public KvBuffer {
 public:
  static Result<std::unique_ptr<KvBuffer>> create(size_t bytes, int device, const std::string &name) {
    GEIST_RETURN_IF_ERROR(on_device(cuda::set_device(device), name, "selecting the device"));
    Result<void *> p = cuda::device_alloc(std::max<size_t>(bytes, 1));
    if (!p) {
      return GEIST_ERROR(GEIST_E_OUT_OF_MEMORY, "a session state of %.1f MiB does not fit on %s: %s",
                         double(bytes) / 1048576.0, name.c_str(), p.status().message().c_str());
    }
    return std::unique_ptr<KvBuffer>(new DeviceKvBuffer(static_cast<uint8_t *>(*p), bytes, device, name));
  }
  ~DeviceKvBuffer() override {
    if (cuda::set_device(space()).is_ok()) cuda::device_free(data());
  }
  Status read(size_t off, size_t n, void *host) const override {
    if (off > size() || n > size() - off) return GEIST_ERROR(GEIST_E_INVALID_ARGUMENT, "KvBuffer::read out of range");
    if (n == 0) return Status::ok();
    GEIST_RETURN_IF_ERROR(on_device(cuda::set_device(space()), name_, "selecting the device"));
    Result<CudaStream> st = cuda::stream_create();
    if (!st) return on_device(st.status(), name_, "creating a stream");
    Status s = cuda::download_async(host, data() + off, n, *st);
    if (s.is_ok()) s = cuda::stream_sync(*st);
    cuda::stream_destroy(*st);
    return on_device(s, name_, "copying a session state to the host");
  }

 private:
  DeviceKvBuffer(uint8_t *p, size_t n, int device, std::string name)
      : KvBuffer(p, n, device), name_(std::move(name)) {}
  std::string name_;
};

class CudaKvStore final : public KvStore {
 public:
  CudaKvStore(const std::vector<KvLayerSpec> &layers, int64_t n_ctx, int max_chunk, KvType tk, KvType tv,
              int device, std::string name)
      : KvStore(layers, n_ctx, max_chunk, tk, tv), device_(device), name_(std::move(name)) {}
  ~CudaKvStore() override {
    if (cuda::set_device(device_).is_ok()) cuda::device_free(arena_);
  }

  // The rings (K, V of every layer), then the checkpoint's rings of the sliding layers, in
  // one allocation at 256-byte aligned offsets (as the weights: one cudaMalloc per ring would
  // round each up to the driver's pages).
  Status allocate() {
    std::vector<size_t> sizes;  // each ring's share of the allocation
    for (int l = 0; l < 2 * n_layers(); ++l) {
      const int ll = l % n_layers();
      const int64_t cap = l < n_layers() ? capacity(ll) : checkpoint_capacity(ll);
      sizes.push_back(arena_bytes(size_t(cap) * row_bytes_k(ll)));
      sizes.push_back(arena_bytes(size_t(cap) * row_bytes_v(ll)));
    }
    size_t total = 0;
    for (size_t b : sizes) total += b;
    Result<void *> p = cuda::device_alloc(total);
    if (!p) {
      return GEIST_ERROR(GEIST_E_OUT_OF_MEMORY,
                         "the KV cache (%.1f MiB for n_ctx %lld) does not fit on %s: %s; ask for a smaller "
                         "context (-c) or a smaller KV type (-ctk/-ctv)",
                         double(total_bytes()) / 1048576.0, (long long)n_ctx(), name_.c_str(),
                         p.status().message().c_str());
    }
    arena_ = *p;
    size_t off = 0;
    for (size_t b : sizes) {
      rings_.push_back(static_cast<uint8_t *>(arena_) + off);
      off += b;
    }
    bytes_ = total;
    return Status::ok();
  }
  size_t total_bytes() const {
    size_t b = 0;
    for (int l = 0; l < n_layers(); ++l) b += block_bytes(l, capacity(l)) + block_bytes(l, checkpoint_capacity(l));
    return b;
  }

  size_t bytes_reserved() const override { return bytes_; }
  int space() const override { return device_; }
  Result<std::unique_ptr<KvBuffer>> new_buffer(size_t bytes) const override {
    return DeviceKvBuffer::create(bytes, device_, name_);
  }
  void *k(int l) const { return rings_[2 * size_t(l)]; }
  void *v(int l) const { return rings_[2 * size_t(l) + 1]; }
  void *ck(int l) const { return rings_[2 * size_t(n_layers() + l)]; }
  void *cv(int l) const { return rings_[2 * size_t(n_layers() + l) + 1]; }
  int device() const { return device_; }

  // Copies by position to and from host memory or a DeviceKvBuffer (device to device). The
  // session calls these between forward passes, which end synchronized, so the legacy
  // stream's copies see every row.
  void read_rows(int l, int64_t from, int64_t to, void *dst) const override {
    if (to <= from) return;
    uint8_t *d = static_cast<uint8_t *>(dst);
    const int64_t rf = spec(l).row_floats, cap = capacity(l);
    check(cuda::kv_read_positions(type_k(), k(l), cap, rf, from, to, d, nullptr), "reading K rows");
    check(cuda::kv_read_positions(type_v(), v(l), cap, rf, from, to, d + size_t(to - from) * row_bytes_k(l),
                                  nullptr),
          "reading V rows");
    check(cuda::stream_sync(nullptr), "reading KV rows");
  }
  void write_rows(int l, int64_t from, int64_t to, const void *src) override {
    if (to <= from) return;
    const uint8_t *d = static_cast<const uint8_t *>(src);
    const int64_t rf = spec(l).row_floats, cap = capacity(l);
    check(cuda::kv_write_positions(type_k(), k(l), cap, rf, from, to, d, nullptr), "writing K rows");
    check(cuda::kv_write_positions(type_v(), v(l), cap, rf, from, to, d + size_t(to - from) * row_bytes_k(l),
                                   nullptr),
          "writing V rows");
    check(cuda::stream_sync(nullptr), "writing KV rows");
  }
  // The checkpoint: device to device, by position (no host copy on pin or reset).
  void save_checkpoint(int64_t n_pin) override {
    for (int l = 0; l < n_layers(); ++l) {
      if (spec(l).window == 0) continue;
      const int64_t from = first_live(l, n_pin), rf = spec(l).row_floats;
      check(cuda::kv_copy_positions(type_k(), k(l), capacity(l), ck(l), checkpoint_capacity(l), rf, from, n_pin,
                                    nullptr),
            "saving the K checkpoint");
      check(cuda::kv_copy_positions(type_v(), v(l), capacity(l), cv(l), checkpoint_capacity(l), rf, from, n_pin,
                                    nullptr),
            "saving the V checkpoint");
    }
    check(cuda::stream_sync(nullptr), "saving the checkpoint");
  }
  int64_t rewind(int l, int64_t n_pin, int64_t n_past) override {
    if (spec(l).window == 0 || n_past <= n_pin) return 0;
    // Position q's slot was overwritten iff q + capacity < n_past (see the CPU store).
    const int64_t from = first_live(l, n_pin), to = std::min(n_pin, n_past - capacity(l));
    if (to <= from) return 0;
    const int64_t rf = spec(l).row_floats;
    check(cuda::kv_copy_positions(type_k(), ck(l), checkpoint_capacity(l), k(l), capacity(l), rf, from, to, nullptr),
          "rewinding K rows");
    check(cuda::kv_copy_positions(type_v(), cv(l), checkpoint_capacity(l), v(l), capacity(l), rf, from, to, nullptr),
          "rewinding V rows");
    check(cuda::stream_sync(nullptr), "rewinding KV rows");
    return to - from;
  }
  void read_checkpoint(int l, int64_t n_pin, void *dst) const override {
    const int64_t from = first_live(l, n_pin), rf = spec(l).row_floats, cap = checkpoint_capacity(l);
    if (n_pin <= from) return;
    uint8_t *d = static_cast<uint8_t *>(dst);
    check(cuda::kv_read_positions(type_k(), ck(l), cap, rf, from, n_pin, d, nullptr), "reading the K checkpoint");
    check(cuda::kv_read_positions(type_v(), cv(l), cap, rf, from, n_pin, d + size_t(n_pin - from) * row_bytes_k(l),
                                  nullptr),
          "reading the V checkpoint");
    check(cuda::stream_sync(nullptr), "reading the checkpoint");
  }
  void write_checkpoint(int l, int64_t n_pin, const void *src) override {
    const int64_t from = first_live(l, n_pin), rf = spec(l).row_floats, cap = checkpoint_capacity(l);
    if (n_pin <= from) return;
    const uint8_t *d = static_cast<const uint8_t *>(src);
    check(cuda::kv_write_positions(type_k(), ck(l), cap, rf, from, n_pin, d, nullptr), "writing the K checkpoint");
    check(cuda::kv_write_positions(type_v(), cv(l), cap, rf, from, n_pin,
                                   d + size_t(n_pin - from) * row_bytes_k(l), nullptr),
          "writing the V checkpoint");
    check(cuda::stream_sync(nullptr), "writing the checkpoint");
  }

 private:
  // These copies have no error path in the KvStore interface: a device that fails a copy
  // of memory it allocated is broken, and is reported as an internal error.
  void check(const Status &s, const char *what) const {
    GEIST_CHECK(s.is_ok(), (std::string(what) + " on " + name_ + ": " + s.message()).c_str());
  }

  int device_;
  std::string name_;
  void *arena_ = nullptr;  // every ring
  std::vector<void *> rings_;  // K, V of each layer
  size_t bytes_ = 0;
};

class CudaExec final : public Exec {
 public:
  CudaExec(int device, std::string name, int max_chunk, size_t matmul_scratch)
      : device_(device), name_(std::move(name)), max_rows_(max_chunk), matmul_scratch_bytes_(matmul_scratch) {
    // Fault injection for tests: GEIST_CUDA_INJECT_FAULT=N makes the N-th op (counted from
    // this exec's creation, 1-based) fail as a device error would.
    if (const char *e = std::getenv("GEIST_CUDA_INJECT_FAULT")) inject_at_ = std::strtoll(e, nullptr, 10);
    // GEIST_PROFILE=1: wait for each op and add its time to a per-op table, printed to
    // stderr when the exec ends (the waits make the whole run slower; the shares hold).
    profile_ = OpProfile::enabled();
    // GEIST_CUDA_GRAPHS=0: every op launched on its own (also while profiling or injecting
    // faults, which count and time single ops).
    const char *g = std::getenv("GEIST_CUDA_GRAPHS");
    graphs_ = !(g && g[0] == '0') && !profile_ && inject_at_ == 0;
    // GEIST_CUDA_HOST_TIMES=1: where a step's wall time goes on the host (host_times_).
    const char *ht = std::getenv("GEIST_CUDA_HOST_TIMES");
    host_times_.on = ht && std::strcmp(ht, "1") == 0;
    // Greedy decode steps are queued (can_queue; GEIST_CUDA_QUEUE=0: never). Measured on an
    // H100 (2026-12-07, two calls): generation 270M +4-10 %, E4B +3-7 %. Not while
    // profiling, which times each op. GEIST_CUDA_INJECT_WAIT_FAULT=N (tests): the N-th wait
    // for a queued step fails as a device error found there would.
    const char *q = std::getenv("GEIST_CUDA_QUEUE");
    queue_ = !(q != nullptr && std::strcmp(q, "0") == 0) && !profile_;
    const char *sd = std::getenv("GEIST_CUDA_SAMPLE");  // draws_sampled()
    sample_ = !(sd != nullptr && std::strcmp(sd, "0") == 0);
    // GEIST_CUDA_DRAW_SELECT=1: the sampled draws find each tile's candidates by a radix select
    // instead of sorting the tile (cuda::DrawAlgo; off until measured on a GPU).
    const char *ds = std::getenv("GEIST_CUDA_DRAW_SELECT");
    draw_algo_ = ds != nullptr && std::strcmp(ds, "1") == 0 ? cuda::DrawAlgo::kSelect : cuda::DrawAlgo::kSort;
    const char *bl = std::getenv("GEIST_CUDA_BATCH_LAZY");  // hands_off_outputs()
    batch_lazy_ = !(bl != nullptr && std::strcmp(bl, "0") == 0);
    if (const char *e = std::getenv("GEIST_CUDA_INJECT_WAIT_FAULT")) inject_wait_at_ = std::strtoll(e, nullptr, 10);
    ops_.reserve(2048);
  }
  ~CudaExec() override {
    if (profile_) prof_.print(name_, "each op waited for");
    host_times_.print(name_);
    if (!cuda::set_device(device_).is_ok()) return;
    if (stream_) {
      (void)cuda::stream_sync(stream_);
      cuda::stream_destroy(stream_);
    }
    for (const Graph &g : cache_) cuda::graph_destroy(g.exec);
    for (cuda::CudaEvent e : events_) cuda::event_destroy(e);
    cuda::host_free_pinned(host_step_);
    for (auto &[slot, h] : host_rope_) cuda::host_free_pinned(h);
    for (auto &b : bufs_) cuda::device_free(b.p);
    cuda::device_free(step_);
    cuda::device_free(scratch_);
    cuda::device_free(fold_count_);
    cuda::device_free(attn_scratch_);
    cuda::device_free(attn_counters_);
    cuda::device_free(greedy_dev_);
    cuda::host_free_pinned(host_greedy_);
    cuda::device_free(sample_dev_);
    cuda::host_free_pinned(host_specs_);
    for (void *p : retired_) cuda::device_free(p);
    for (void *p : retired_host_) cuda::host_free_pinned(p);
  }

  Status init() {
    GEIST_RETURN_IF_ERROR(on_device(cuda::set_device(device_), name_, "selecting the device"));
    Result<CudaStream> s = cuda::stream_create();
    if (!s) return on_device(s.status(), name_, "creating a stream");
    stream_ = *s;
    // Step block: tokens [max_rows] int32, then each sequence's first position [max_rows]
    // int64 (8-aligned).
    step_tokens_bytes_ = (size_t(max_rows_) * sizeof(int32_t) + 7) / 8 * 8;
    const size_t step_bytes = step_tokens_bytes_ + size_t(max_rows_) * sizeof(int64_t);
    GEIST_RETURN_IF_ERROR(alloc(&step_, step_bytes, "the step block"));
    step_bytes_ = step_bytes;
    if (matmul_scratch_bytes_ > 0) GEIST_RETURN_IF_ERROR(alloc(&scratch_, matmul_scratch_bytes_, "matmul scratch"));
    // Pinned host staging for what each step uploads (tokens, pos0, the RoPE rows), two of
    // each (stage_): while a queued step's uploads may still be ahead of the device, the step
    // after it stages into the other half. Two suffice: a step begins only after the step
    // two before it was waited for (at most one is queued then).
    Result<void *> h = cuda::host_alloc_pinned(2 * step_bytes);
    if (!h) return on_device(h.status(), name_, "allocating pinned host memory");
    host_step_ = static_cast<uint8_t *>(*h);
    for (cuda::CudaEvent &e : events_) {
      Result<cuda::CudaEvent> ev = cuda::event_create();
      if (!ev) return on_device(ev.status(), name_, "creating an event");
      e = *ev;
    }
    return Status::ok();
  }

  int n_threads() const override { return 1; }

  Act buffer(int slot, int64_t width) override {
    if (slot >= int(bufs_.size())) bufs_.resize(size_t(slot) + 1);
    Buf &b = bufs_[size_t(slot)];
    const size_t n = size_t(max_rows_) * size_t(width);
    if (b.n < n) {
      // Only reserve() grows a buffer (forward asks for no more than it reserved).
      cuda::device_free(b.p);
      b.p = nullptr;
      b.n = 0;
      void *p = nullptr;
      if (Status s = alloc(&p, n * sizeof(float), "scratch"); !s.is_ok()) {
        // The logits buffer is made on the first step that wants logits: its failure is
        // that step's error only.
        if (slot != kOutputSlot && reserve_error_.is_ok()) reserve_error_ = s;
        fail(s);
        return {nullptr, width};
      }
      b.p = static_cast<float *>(p);
      b.n = n;
    }
    return {b.p, width};
  }

  Status reserve_status() const override { return reserve_error_; }
  // What this exec allocated with alloc() and holds between steps (buffers a step replaced
  // are freed at its end). The captured graphs' own device memory is the driver's and is
  // not counted.
  uint64_t scratch_bytes() const override {
    uint64_t n = step_bytes_ + (scratch_ ? matmul_scratch_bytes_ : 0) + attn_scratch_bytes_ + attn_counter_bytes_ +
                 greedy_dev_bytes_ + sample_dev_bytes_ + (fold_count_ ? sizeof(unsigned) : 0);
    for (const Buf &b : bufs_) n += b.n * sizeof(float);
    return n;
  }
  int warm_up_steps() const override { return graphs_ ? 2 : 0; }

  int max_rows() const override { return max_rows_; }
  void begin_step(const int32_t *tokens, int n_rows, const StepSeq *seqs, int n_seqs) override {
    if (host_times_.on) host_times_.begin(n_rows);
    error_ = reserve_error_;  // a buffer that never got memory fails every step
    const bool feed = feed_next_;
    feed_next_ = false;
    if (!queued_.empty() && (!feed || queued_.size() > 1)) {
      fail(Status(GEIST_E_INTERNAL, "a step began while a queued step was not waited for"));
    }
    stage_ ^= 1;
    outputs_.clear();
    deferred_.clear();  // this step overwrites them
    greedy_out_ = GreedyOut{};
    greedy_hosts_.clear();
    ops_.clear();
    producer_ = Producer{};
    head_norm_ = HeadNormOp{};
    step_hash_ = 0x6a09e667f3bcc908ull;
    n_rows_ = n_rows;
    seqs_.clear();
    int row0 = 0;
    for (int i = 0; i < n_seqs; ++i) {
      seqs_.push_back({static_cast<CudaKvStore *>(seqs[i].kv), row0, seqs[i].n_rows, seqs[i].kv->n_past});
      row0 += seqs[i].n_rows;
    }
    fail(on_device(cuda::set_device(device_), name_, "selecting the device"));
    uint8_t *const hs = host_step_ + size_t(stage_) * step_bytes_;
    std::memcpy(hs, tokens, size_t(n_rows) * sizeof(int32_t));
    auto *p0 = reinterpret_cast<int64_t *>(hs + step_tokens_bytes_);
    for (size_t i = 0; i < seqs_.size(); ++i) p0[i] = seqs_[i].pos0;
    run(cuda::upload_async(step_, hs, step_tokens_bytes_ + seqs_.size() * sizeof(int64_t), stream_),
        "uploading the step");
    if (feed) {
      // The row's token is the last step's drawn token: copied on the device, after the
      // upload and before the ops (stream order), so the host need not know it yet.
      if (n_rows != 1 || last_greedy_.n != 1) {
        fail(Status(GEIST_E_INTERNAL, "a fed step needs one row after a one-row step that drew its token"));
      } else {
        run(cuda::copy_async(step_, last_greedy_.dev, sizeof(int32_t), stream_), "feeding the drawn token");
      }
    }
    if (host_times_.on) host_times_.staged();
  }

  Act rope_rows(int slot, const cpu::RopeTable &t) override {
    const Act cs = buffer(slot, t.rot_dim());
    const size_t n = size_t(max_rows_) * size_t(cpu::RopeTable::kMaxRotDim);  // any table fits
    float *&h2 = host_rope_[slot];  // two halves, as the step's staging (stage_)
    if (h2 == nullptr) {
      Result<void *> p = cuda::host_alloc_pinned(2 * n * sizeof(float));
      if (!p) {
        fail(on_device(p.status(), name_, "allocating pinned host memory"));
        return cs;
      }
      h2 = static_cast<float *>(*p);
    }
    float *const h = h2 + size_t(stage_) * n;
    for (const Seq &q : seqs_) t.fill(q.pos0, q.n, h + size_t(q.row0) * size_t(t.rot_dim()));
    run(cuda::upload_async(cs.p, h, size_t(n_rows_) * size_t(t.rot_dim()) * sizeof(float), stream_),
        "uploading RoPE rows");
    return cs;
  }

  Act output(float *host, int64_t width, int n_rows) override {
    const Act y = buffer(kOutputSlot, width);
    outputs_.push_back({host, y.p, size_t(n_rows) * size_t(width) * sizeof(float)});
    return y;
  }

  Act output_rows(float *const *hosts, int64_t width, int n_rows) override {
    const Act y = buffer(kOutputSlot, width);
    for (int r = 0; r < n_rows; ++r) {
      outputs_.push_back({hosts[r], y.p == nullptr ? nullptr : y.p + size_t(r) * size_t(width),
                          size_t(width) * sizeof(float)});
    }
    return y;
  }

  // Page-locked, so end_step's downloads run at the link's speed (H200: 1 MiB 27 us, against
  // 130 us into pageable memory, which the driver stages through its own buffer).
  HostFloats host_floats(size_t n) override {
    Result<void *> p = cuda::host_alloc_pinned(n * sizeof(float));
    if (!p) return Exec::host_floats(n);
    std::memset(*p, 0, n * sizeof(float));
    return HostFloats(static_cast<float *>(*p), [](float *q) { cuda::host_free_pinned(q); });
  }

  // Replaces *dev (device memory) and *host (pinned) with new ones of dev_bytes and
  // host_bytes; the old ones are retired (freed at the step's end, after the device is done
  // with them). False, with the step failed and both left as they were, if either fails.
  bool regrow(void **dev, size_t dev_bytes, void **host, size_t host_bytes, const char *what) {
    void *p = nullptr;
    if (Status st = alloc(&p, dev_bytes, what); !st.is_ok()) {
      fail(st);
      return false;
    }
    Result<void *> h = cuda::host_alloc_pinned(host_bytes);
    if (!h) {
      cuda::device_free(p);
      fail(on_device(h.status(), name_, "allocating pinned host memory"));
      return false;
    }
    retired_.push_back(*dev);
    retired_host_.push_back(*host);
    *dev = p;
    *host = *h;
    return true;
  }
  // Sampled draws on the device for sessions (GEIST_CUDA_SAMPLE=0: on the host). H100,
  // 2026-12-07, `geist run` 256 tokens, temp 0.8 / top-k 40, two runs: 270M 1211 / 1213 t/s
  // against 1037 / 969 on the host (greedy 1360 / 1367), E4B 329 / 330 against 310 / 309
  // (greedy 338 / 339), the same text.
  bool draws_sampled() const override { return sample_; }
  // The tokens a step draws, and a download of 4 bytes a row, so that a session whose draws
  // a step computes does not read its 1 MiB logits row on the host: two kernels after the
  // logits for greedy rows (cuda::greedy_rows), and for sampled rows the top-k levels and
  // the pick (cuda::sample_rows; 2 kernels at a 262144-token vocabulary and top-k <= 64),
  // their specs uploaded with the step.
  void draw(Act x, int n_rows, StepDraw *const *rows) override {
    if (n_rows <= 0) return;
    bool any_greedy = false;
    int max_k = 0;
    std::vector<int32_t *> &hosts = greedy_hosts_;  // the step's token hosts (end_step writes them)
    hosts.assign(size_t(n_rows), nullptr);
    draw_specs_.assign(size_t(n_rows), DrawSpec{});  // temperature 0: not sampled here
    for (int r = 0; r < n_rows; ++r) {
      if (rows[r] == nullptr) continue;
      hosts[size_t(r)] = &rows[r]->token;
      const DrawSpec &d = rows[r]->spec;
      if (!(d.temperature > 0.0f)) {
        any_greedy = true;
        continue;
      }
      if (d.top_k < 1 || d.top_k > DrawSpec::kMaxStepTopK) {
        return fail(Status(GEIST_E_INVALID_ARGUMENT, "a sampled draw on the device needs top-k in [1, 256]"));
      }
      max_k = std::max(max_k, d.top_k);
      draw_specs_[size_t(r)] = d;
    }
    if (!any_greedy && max_k == 0) return;
    // The parts, then the tokens; sized by the most rows asked for (a decode step of several
    // sessions), grown like the attention scratch. The pinned staging takes the tokens.
    const size_t parts = cuda::greedy_scratch_bytes(n_rows);
    const size_t need = parts + size_t(n_rows) * sizeof(int32_t);
    if (greedy_dev_bytes_ < need) {
      // Two halves (stage_), as the step's staging. It never grows while a step is queued:
      // the only step that may begin then is a fed one-row step, and the session's warm-up
      // steps drew one row before any step was queued.
      void *h = host_greedy_;
      if (!regrow(&greedy_dev_, need, &h, 2 * size_t(n_rows) * sizeof(int32_t), "greedy scratch")) return;
      greedy_dev_bytes_ = need;
      host_greedy_ = static_cast<int32_t *>(h);
      greedy_cap_ = n_rows;
    }
    void *scratch = greedy_dev_;
    auto *tok = reinterpret_cast<int32_t *>(static_cast<uint8_t *>(greedy_dev_) + parts);
    if (any_greedy) {
      record("greedy", key(17, x.p, x.width, n_rows, scratch),
             [=, s = stream_] { return cuda::greedy_rows(x.p, x.width, n_rows, tok, scratch, s); });
    }
    if (max_k > 0) {
      // Candidates kept per tile: 64 up to a top-k of 64, else 256 (two shapes of graph).
      const int k = max_k <= 64 ? 64 : DrawSpec::kMaxStepTopK;
      const size_t keys = cuda::sample_scratch_bytes(x.width, n_rows, k);
      const size_t specs = size_t(n_rows) * sizeof(DrawSpec);
      const size_t keys_at = (specs + 255) / 256 * 256;
      if (sample_dev_bytes_ < keys_at + keys || sample_cap_ < n_rows) {
        const size_t cap_rows = size_t(std::max(n_rows, sample_cap_));
        const size_t bytes = std::max(keys_at + keys, sample_dev_bytes_);
        void *h = host_specs_;
        if (!regrow(&sample_dev_, bytes, &h, 2 * cap_rows * sizeof(DrawSpec), "sampling scratch")) return;
        sample_dev_bytes_ = bytes;
        host_specs_ = static_cast<DrawSpec *>(h);
        sample_cap_ = int(cap_rows);
      }
      // The specs (their uniforms change every step) go up with the step, before its graph;
      // the keys' scratch follows them in the same allocation.
      auto *dspec = static_cast<DrawSpec *>(sample_dev_);
      void *keys_p = static_cast<uint8_t *>(sample_dev_) + keys_at;
      DrawSpec *const hs = host_specs_ + size_t(stage_) * size_t(sample_cap_);
      std::memcpy(hs, draw_specs_.data(), specs);
      run(cuda::upload_async(dspec, hs, specs, stream_), "uploading the draws' parameters");
      // Every pointer the launch captures is in its key: a graph captured before either
      // buffer moved (a batch step of more rows grew one) is not replayed onto freed memory.
      const cuda::DrawAlgo algo = draw_algo_;
      record("sample", key(18, x.p, x.width, n_rows, k, sample_dev_, tok, int(algo)),
             [=, s = stream_] { return cuda::sample_rows(x.p, x.width, n_rows, dspec, k, tok, keys_p, s, algo); });
    }
    greedy_out_ = {tok, n_rows};
  }

  Status end_step() override {
    const bool queue = queue_next_;
    queue_next_ = false;
    if (host_times_.on) host_times_.recorded();
    if (error_.is_ok()) execute();
    if (host_times_.on) host_times_.launched();
    ops_.clear();
    producer_ = Producer{};
    head_norm_ = HeadNormOp{};
    if (!retired_.empty() || !retired_host_.empty()) {
      (void)cuda::stream_sync(stream_);
      for (void *p : retired_) cuda::device_free(p);
      for (void *p : retired_host_) cuda::host_free_pinned(p);
      retired_.clear();
      retired_host_.clear();
    }
    if (defer_) {
      deferred_.swap(outputs_);  // fetch_outputs copies them, if anyone asks
      defer_ = false;            // one step per defer_outputs(true)
    } else {
      for (const Output &o : outputs_) {
        if (o.bytes) run(cuda::download_async(o.host, o.dev, o.bytes, stream_), "copying logits to the host");
      }
    }
    outputs_.clear();
    const GreedyOut g = greedy_out_;
    greedy_out_ = GreedyOut{};
    int32_t *const hg = host_greedy_ + size_t(stage_) * size_t(greedy_cap_);
    if (g.n > 0) {
      run(cuda::download_async(hg, g.dev, size_t(g.n) * sizeof(int32_t), stream_), "copying greedy tokens to the host");
    }
    last_greedy_ = error_.is_ok() ? g : GreedyOut{};
    if (queue && error_.is_ok()) {
      cuda::CudaEvent ev = events_[size_t(stage_)];
      run(cuda::event_record(ev, stream_), "queuing the step");
      if (error_.is_ok()) {
        queued_.push_back({ev, hg, greedy_hosts_, n_rows_});
        if (host_times_.on) host_times_.queued();
        return Status::ok();
      }
    }
    if (host_times_.on) host_times_.syncing();
    if (error_.is_ok()) error_ = on_device(cuda::stream_sync(stream_), name_, "running the forward pass");
    if (host_times_.on) host_times_.end();
    if (!error_.is_ok()) {
      drop_queued();  // nothing of this step, or of a queued one, may still run
      last_greedy_ = GreedyOut{};
      return error_;
    }
    for (int r = 0; r < g.n && r < int(greedy_hosts_.size()); ++r) {
      if (greedy_hosts_[size_t(r)] != nullptr) *greedy_hosts_[size_t(r)] = hg[r];
    }
    return Status::ok();
  }

  // Queued steps (Exec): unless GEIST_CUDA_QUEUE=0, and not while profiling (which times each op).
  bool can_queue() const override { return queue_; }
  void queue_next_step() override { queue_next_ = queue_; }
  void feed_drawn() override { feed_next_ = true; }
  Status wait_queued() override {
    if (queued_.empty()) return Status::ok();
    const Queued q = std::move(queued_.front());
    queued_.pop_front();
    const double t0 = host_times_.on ? now_seconds() : 0;
    Status st = on_device(cuda::set_device(device_), name_, "selecting the device");
    if (st.is_ok()) st = on_device(cuda::event_sync(q.event), name_, "running the forward pass");
    if (st.is_ok() && inject_wait_at_ > 0 && ++waits_ == inject_wait_at_) {
      st = on_device(Status(GEIST_E_INTERNAL, "injected fault (GEIST_CUDA_INJECT_WAIT_FAULT)"), name_,
                     "running the forward pass");
    }
    if (host_times_.on) host_times_.waited(now_seconds() - t0, q.n_rows);
    if (!st.is_ok()) {
      drop_queued();
      return st;
    }
    for (size_t r = 0; r < q.hosts.size(); ++r) {
      if (q.hosts[r] != nullptr) *q.hosts[r] = q.greedy[r];
    }
    return Status::ok();
  }
  void drop_queued() override {
    (void)cuda::stream_sync(stream_);  // also a failed step's own ops and downloads
    queued_.clear();
    last_greedy_ = GreedyOut{};
    queue_next_ = feed_next_ = false;
  }

  // A greedy step's logits row (1 MiB at a 262144-token vocabulary, ~27 us over the link on
  // the H200, on every decoded token's critical path) stays on the device until the session
  // reads it (GEIST_CUDA_LAZY_LOGITS=0: copied at every step). Measured on an H100
  // (2026-12-07): 270M tg128 +3 %, E4B within the noise.
  void defer_outputs(bool on) override {
    static const bool lazy = [] {
      const char *e = std::getenv("GEIST_CUDA_LAZY_LOGITS");
      return e == nullptr || std::strcmp(e, "0") != 0;
    }();
    defer_ = on && lazy;
  }
  bool outputs_deferred() const override { return !deferred_.empty(); }
  // A step of several sessions leaves the rows of those that draw their token in it on the
  // device too, each copied into its own session's exec (1 MiB device to device in ~1 us,
  // against ~27-40 us to the host a row, after the step, on its critical path: 8 sessions'
  // rows took ~0.2-0.3 ms of every batched step). GEIST_CUDA_BATCH_LAZY=0 turns it off,
  // GEIST_CUDA_LAZY_LOGITS=0 too with the one-session kind. H100, 2026-12-07, `bench batch`
  // 8 sessions, two rounds: 270M step 1.563 / 1.623 -> 1.428 / 1.442 ms, E4B 4.79 / 4.69 ->
  // 4.78 / 4.76 (unchanged).
  bool hands_off_outputs() const override { return batch_lazy_; }
  Status hand_off_outputs(float *const *hosts, Exec *const *owners, size_t n, bool *kept) override {
    for (size_t i = 0; i < n; ++i) kept[i] = false;
    if (deferred_.empty()) return Status::ok();
    Status st = on_device(cuda::set_device(device_), name_, "selecting the device");
    size_t own = 0;  // this exec's own rows, compacted in place (nothing here allocates but an owner's list)
    for (size_t j = 0; j < deferred_.size() && st.is_ok(); ++j) {
      const Output o = deferred_[j];
      size_t i = 0;
      while (i < n && hosts[i] != o.host) ++i;
      CudaExec *const x = i < n ? dynamic_cast<CudaExec *>(owners[i]) : nullptr;
      if (x == this) {
        deferred_[own++] = o;
        kept[i] = true;
        continue;
      }
      float *const dst = x != nullptr && x->device_ == device_ ? x->output_row_buffer(o.bytes) : nullptr;
      if (dst == nullptr) {
        if (o.bytes) st = on_device(cuda::download_async(o.host, o.dev, o.bytes, stream_), name_, "copying logits to the host");
        continue;
      }
      // On this stream, which waits below: the owner's own stream then finds it there.
      st = on_device(cuda::copy_async(dst, o.dev, o.bytes, stream_), name_, "handing a logits row on");
      kept[i] = true;
      x->deferred_.assign(1, Output{o.host, dst, o.bytes});  // its own rows are older than this one
    }
    deferred_.resize(own);
    const Status sync = on_device(cuda::stream_sync(stream_), name_, "handing logits rows on");
    if (st.is_ok()) st = sync;
    if (!st.is_ok()) {
      deferred_.clear();
      for (size_t i = 0; i < n; ++i) {
        if (kept[i]) {
          if (auto *x = dynamic_cast<CudaExec *>(owners[i])) x->deferred_.clear();
        }
        kept[i] = false;
      }
    }
    return st;
  }
  Status fetch_outputs() override {
    if (deferred_.empty()) return Status::ok();
    std::vector<Output> d;
    d.swap(deferred_);  // asked once: an error leaves nothing pending
    Status st = on_device(cuda::set_device(device_), name_, "selecting the device");
    for (const Output &o : d) {
      if (st.is_ok() && o.bytes) {
        st = on_device(cuda::download_async(o.host, o.dev, o.bytes, stream_), name_, "copying logits to the host");
      }
    }
    const Status sync = on_device(cuda::stream_sync(stream_), name_, "copying logits to the host");
    return st.is_ok() ? sync : st;
  }

  void embed(const WeightView &table, float scale, Act out) override {
    const cuda::DevMatrix t = dev(table);
    const int n = n_rows_;
    const int32_t *ids = tokens();
    record("embedding", key(1, t.data, t.n_in, n, scale, out.p),
           [=, s = stream_] { return cuda::embed(t, ids, n, scale, out.p, s); });
  }
  void matmul(const WeightView *const *ws, int n_mat, Act x, const Act *ys, int n_rows) override {
    const cuda::ActMode mode = cpu::activation_mode() == cpu::ActivationMode::F32 ? cuda::ActMode::F32
                                                                                  : cuda::ActMode::Q8;
    constexpr int kMax = 4;  // Exec::matmul's bound
    if (n_mat < 1 || n_mat > kMax) return fail(Status(GEIST_E_INVALID_ARGUMENT, "matmul: 1 to 4 matrices"));
    std::array<cuda::DevMatrix, kMax> w{};
    std::array<float *, kMax> y{};
    uint64_t k = key(2, int(mode), x.p, n_rows, n_mat);
    std::string label;
    for (int m = 0; m < n_mat; ++m) {
      w[size_t(m)] = dev(*ws[m]);
      y[size_t(m)] = ys[m].p;
      k = mix(k, key(w[size_t(m)].data, w[size_t(m)].n_in, w[size_t(m)].n_out, y[size_t(m)]));
      if (profile_) {
        label += std::string(m ? " + " : "matmul ") + quant::type_name(ws[m]->type) + " " +
                 std::to_string(ws[m]->n_in) + "x" + std::to_string(ws[m]->n_out);
      }
    }
    void *scratch = scratch_;
    cuda::NormFold nf;
    if (mode == cuda::ActMode::Q8 && take_norm_fold(x, n_rows, w.data(), n_mat, &nf)) {
      record("rmsnorm_add_norm+matmul", mix(k, 2),
             [=, s = stream_] { return cuda::matmul_n_norm(w.data(), y.data(), n_mat, nf, s); });
      if (profile_) label.insert(0, "rmsnorm_add_norm+");
    } else if (mode == cuda::ActMode::Q8 && take_quantizing_producer(x, n_rows, w.data(), y.data(), n_mat, scratch)) {
      record("matmul", mix(k, 1), [=, s = stream_] {
        return cuda::matmul_n_quantized(w.data(), y.data(), n_mat, n_rows, scratch, s);
      });
    } else {
      record("matmul", k, [=, s = stream_] {
        return cuda::matmul_n(w.data(), y.data(), n_mat, x.p, n_rows, mode, scratch, s);
      });
    }
    if (profile_ && !ops_.empty()) ops_.back().label = label;
  }
  void rmsnorm(Act x, const WeightView *g, int64_t n_vec, int64_t dim, float eps, Act out) override {
    const float *gp = g ? reinterpret_cast<const float *>(g->device) : nullptr;
    record("rmsnorm", key(3, x.p, gp, n_vec, dim, eps, out.p),
           [=, s = stream_] { return cuda::rmsnorm(x.p, gp, out.p, n_vec, dim, eps, s); });
  }
  void rmsnorm_add(Act x, const WeightView *g, int64_t n_vec, int64_t dim, float eps, Act h) override {
    const float *gp = g ? reinterpret_cast<const float *>(g->device) : nullptr;
    record("rmsnorm_add", key(13, x.p, gp, n_vec, dim, eps, h.p),
           [=, s = stream_] { return cuda::rmsnorm_add(x.p, gp, x.p, h.p, n_vec, dim, eps, s); });
  }
  void rmsnorm_add_norm(Act x, const WeightView *g, Act h, float h_scale, const WeightView *g_next, Act out,
                        int64_t n_vec, int64_t dim, float eps) override {
    if (!fuse()) return Exec::rmsnorm_add_norm(x, g, h, h_scale, g_next, out, n_vec, dim, eps);
    const float *gp = g ? reinterpret_cast<const float *>(g->device) : nullptr;
    const float *np = g_next ? reinterpret_cast<const float *>(g_next->device) : nullptr;
    const size_t before = ops_.size();
    record("rmsnorm_add_norm", key(14, x.p, gp, h.p, h_scale, np, out.p, n_vec, dim, eps), [=, s = stream_] {
      return cuda::rmsnorm_add_norm(x.p, gp, h.p, h_scale, np, out.p, n_vec, dim, eps, s);
    });
    if (ops_.size() == before + 1 && out.p != nullptr && dim <= cuda::kRmsNormAddNormMaxDim && n_vec <= 65535) {
      producer_ = {ops_.size(), out.p, n_vec, dim, [=, s = stream_](int act_block, void *scratch) {
                     return [=] {
                       return cuda::rmsnorm_add_norm_quantize(x.p, gp, h.p, h_scale, np, out.p, n_vec, dim, eps,
                                                              act_block, scratch, s);
                     };
                   }, dim, "rmsnorm_add_norm+quantize", "norm", {}};
      if (n_vec == 1) producer_.fold = {x.p, gp, h.p, h_scale, np, out.p, dim, eps, nullptr};
    }
  }
  void head_norm_rope(const HeadNorm *t, int n_t, int n_rows, int head_dim, float eps, Act cs) override {
    if (!fuse()) return Exec::head_norm_rope(t, n_t, n_rows, head_dim, eps, cs);
    if (n_t < 1 || n_t > 3) return fail(Status(GEIST_E_INVALID_ARGUMENT, "head_norm_rope: 1 to 3 tensors"));
    cuda::HeadNormSet set;
    set.n = n_t;
    uint64_t k = key(15, n_t, n_rows, head_dim, eps, cs.p);
    for (int i = 0; i < n_t; ++i) {
      set.x[i] = t[i].x.p;
      set.g[i] = t[i].g ? reinterpret_cast<const float *>(t[i].g->device) : nullptr;
      set.n_heads[i] = t[i].n_heads;
      set.rope[i] = t[i].rope;
      k = mix(k, key(set.x[i], set.g[i], set.n_heads[i], int(set.rope[i])));
    }
    const size_t before = ops_.size();
    record("head_norm_rope", k,
           [=, s = stream_] { return cuda::head_norm_rope(set, n_rows, head_dim, eps, cs.p, s); });
    if (ops_.size() == before + 1) head_norm_ = {ops_.size(), set, n_rows, head_dim, eps, cs.p};
  }
  void rope(Act x, int n_rows, int n_heads, int head_dim, int rot_dim, Act cs) override {
    record("rope", key(4, x.p, n_rows, n_heads, head_dim, rot_dim, cs.p),
           [=, s = stream_] { return cuda::rope_neox(x.p, n_rows, n_heads, head_dim, rot_dim, cs.p, s); });
  }
  // kv_append and attention run the step's sequences in groups of up to kMaxStepSeqs
  // consecutive ones whose KV stores have the same types: one launch each per group.
  template <class F>
  void for_each_group(int l, F &&f) {
    size_t i = 0;
    while (i < seqs_.size()) {
      const CudaKvStore &c0 = *seqs_[i].kv;
      cuda::SeqRings t;
      uint64_t h = key(int(c0.type_k()), int(c0.type_v()), c0.spec(l).row_floats);
      const int row_first = seqs_[i].row0;
      size_t e = i;
      while (e < seqs_.size() && e - i < size_t(cuda::kMaxStepSeqs) && seqs_[e].kv->type_k() == c0.type_k() &&
             seqs_[e].kv->type_v() == c0.type_v()) {
        CudaKvStore &c = *seqs_[e].kv;
        const int g = int(e - i);
        t.pos0[g] = pos0(e);
        t.k[g] = c.k(l);
        t.v[g] = c.v(l);
        t.capacity[g] = c.capacity(l);
        t.row0[g + 1] = seqs_[e].row0 + seqs_[e].n - row_first;
        h = mix(h, key(t.pos0[g], t.k[g], t.v[g], t.capacity[g], t.row0[g + 1]));
        ++e;
      }
      t.n = int(e - i);
      f(c0, t, row_first, h);
      i = e;
    }
  }
  void kv_append(int l, Act k, Act v) override {
    if (take_head_norm_store(l, k, v)) return;
    for_each_group(l, [&](const CudaKvStore &c, const cuda::SeqRings &t, int row_first, uint64_t h) {
      const int64_t rf = c.spec(l).row_floats;
      const KvType tk = c.type_k(), tv = c.type_v();
      const float *kp = k.rows_from(row_first).p, *vp = v.rows_from(row_first).p;
      if (tk == tv && kv_pair()) {
        record("storing K and V rows", mix(h, key(5, kp, vp)),
               [=, s = stream_] { return cuda::kv_append_kv_seqs(tk, t, rf, kp, vp, s); });
        return;
      }
      record("storing K rows", mix(h, key(5, kp)),
             [=, s = stream_] { return cuda::kv_append_seqs(tk, t, false, rf, kp, s); });
      record("storing V rows", mix(h, key(5, vp)),
             [=, s = stream_] { return cuda::kv_append_seqs(tv, t, true, rf, vp, s); });
    });
  }
  void attention(int l, Act q, Act out, int n_head, int head_dim, int window, float scale) override {
    // The split kernel's scratch: sized by the largest (heads, head dim) seen (and, where a
    // prefill reaches the many-queries kernel, by the session's chunk: the queries one launch
    // may take), which the warm-up step at session creation reaches. A smaller one already
    // recorded into this step stays allocated until the step ends. Groups run one after
    // another on the stream, so they share it.
    const size_t need = cuda::attention_scratch_bytes(n_head, head_dim, cuda::attention_mq_in_steps() ? max_rows_ : 1);
    if (attn_scratch_bytes_ < need) {
      void *p = nullptr;
      if (Status st = alloc(&p, need, "attention scratch"); !st.is_ok()) return fail(st);
      retired_.push_back(attn_scratch_);
      attn_scratch_ = p;
      attn_scratch_bytes_ = need;
    }
    // The split kernel's merge counters (zero when allocated; every attention leaves them
    // zero) where merge_in_split(); otherwise the separate merge kernel runs.
    const size_t need_cnt = merge_in_split() ? cuda::attention_counter_bytes(n_head) : 0;
    if (attn_counter_bytes_ < need_cnt) {
      void *p = nullptr;
      if (Status st = alloc(&p, need_cnt, "attention counters"); !st.is_ok()) return fail(st);
      const std::vector<uint8_t> zeros(need_cnt, 0);
      if (Status st = cuda::upload(p, zeros.data(), need_cnt); !st.is_ok()) {
        cuda::device_free(p);
        return fail(st);
      }
      retired_.push_back(attn_counters_);
      attn_counters_ = p;
      attn_counter_bytes_ = need_cnt;
    }
    int groups = 0;
    Producer one;
    for_each_group(l, [&](const CudaKvStore &c, const cuda::SeqRings &t, int row_first, uint64_t h) {
      cuda::AttnArgs a;
      a.q = q.rows_from(row_first).p;
      a.k_type = c.type_k();
      a.v_type = c.type_v();
      a.out = out.rows_from(row_first).p;
      a.n_rows = t.row0[t.n];
      a.n_head = n_head;
      a.n_head_kv = int(c.spec(l).row_floats / head_dim);
      a.head_dim = head_dim;
      a.window = window;
      a.scale = scale;
      a.scratch = attn_scratch_;
      a.scratch_bytes = attn_scratch_bytes_;
      a.merge_counters = need_cnt > 0 ? static_cast<unsigned *>(attn_counters_) : nullptr;
      record("attention", mix(h, key(6, a.q, a.out, n_head, a.n_head_kv, head_dim, window, scale, a.scratch,
                                      a.merge_counters)),
             [=, s = stream_] { return cuda::attention_seqs(a, t, s); });
      ++groups;
      one = {ops_.size(), out.p, a.n_rows, int64_t(n_head) * head_dim,
             [=, s = stream_](int act_block, void *scratch) {
               cuda::AttnArgs aq = a;
               aq.quant_block = act_block;
               aq.quant_scratch = scratch;
               return [=] { return cuda::attention_seqs(aq, t, s); };
             },
             head_dim, "attention+quantize", "attn", {}};
    });
    // One group covering the step's rows: the attention can quantize its output for the
    // output projection (take_quantizing_producer).
    if (groups == 1 && one.rows == n_rows_ && one.ops == ops_.size()) producer_ = std::move(one);
  }
  void gelu_mul(Act gate, Act up, Act out, int64_t n) override {
    const size_t before = ops_.size();
    record("gelu_mul", key(7, gate.p, up.p, out.p, n),
           [=, s = stream_] { return cuda::gelu_mul(gate.p, up.p, out.p, n, s); });
    if (ops_.size() == before + 1 && out.width > 0 && n % out.width == 0 && n / out.width <= 65535) {
      const int rows = int(n / out.width);
      const int64_t width = out.width;
      producer_ = {ops_.size(), out.p, rows, width, [=, s = stream_](int act_block, void *scratch) {
                     return [=] {
                       return cuda::gelu_mul_quantize(gate.p, up.p, out.p, rows, width, act_block, scratch, s);
                     };
                   }, width, "gelu_mul+quantize", "gelu", {}};
    }
  }
  void gelu_mul_cols(Act gate, Act src, int64_t col0, Act tmp, int n_rows) override {
    if (!fuse()) return Exec::gelu_mul_cols(gate, src, col0, tmp, n_rows);
    record("gelu_mul_cols", key(16, gate.p, gate.width, src.p, src.width, col0, n_rows), [=, s = stream_] {
      return cuda::gelu_mul_cols(gate.p, gate.width, src.p, src.width, col0, n_rows, s);
    });
  }
  void add(Act x, Act y, int64_t n) override {
    record("add", key(8, x.p, y.p, n), [=, s = stream_] { return cuda::add_inplace(x.p, y.p, n, s); });
  }
  void scale(Act x, float f, int64_t n) override {
    record("scale", key(9, x.p, f, n), [=, s = stream_] { return cuda::scale_inplace(x.p, f, n, s); });
  }
  void add_scale(Act x, Act y, float f, int64_t n) override {
    record("add_scale", key(10, x.p, y.p, f, n), [=, s = stream_] { return cuda::add_scale(x.p, y.p, f, n, s); });
  }
  void softcap(Act x, float cap, int64_t n) override {
    record("softcap", key(11, x.p, cap, n), [=, s = stream_] { return cuda::softcap(x.p, n, cap, s); });
  }
  void copy_cols(Act src, int64_t col0, Act dst, int n_rows) override {
    record("copy_cols", key(12, src.p, src.width, col0, dst.p, dst.width, n_rows), [=, s = stream_] {
      return cuda::copy_cols(src.p, src.width, col0, dst.p, dst.width, n_rows, s);
    });
  }

 private:
  static constexpr int kOutputSlot = 1000;  // past every model's own slots
  // The fused ops (rmsnorm_add_norm, head_norm_rope, gelu_mul_cols: one launch each where
  // the forward pass had 2 to 5). GEIST_CUDA_FUSE=0 runs the separate ops they stand for
  // instead, to compare; the bits are the same either way (CudaOps memcmp tests,
  // cuda_model_int_UNFUSED).
  // The split attention kernel merging its own splits (AttnArgs::merge_counters), with
  // GEIST_CUDA_ATTN_MERGE=1: its tests passed on an H100 (2026-12-05) but tg128 measured no
  // faster with it (CUDA.md), so the merge kernel stays the default.
  static bool merge_in_split() {
    static const bool v = [] {
      const char *e = std::getenv("GEIST_CUDA_ATTN_MERGE");
      return e != nullptr && std::strcmp(e, "1") == 0;
    }();
    return v;
  }
  // K and V rows stored by one launch where the types match (CudaOps.KvAppendKAndVInOneLaunch);
  // GEIST_CUDA_KV_PAIR=0: one launch each.
  static bool kv_pair() {
    static const bool v = [] {
      const char *e = std::getenv("GEIST_CUDA_KV_PAIR");
      return e == nullptr || std::strcmp(e, "0") != 0;
    }();
    return v;
  }
  static bool fuse() {
    static const bool v = [] {
      const char *e = std::getenv("GEIST_CUDA_FUSE");
      return e == nullptr || std::strcmp(e, "0") != 0;
    }();
    return v;
  }
  struct Buf {
    float *p = nullptr;
    size_t n = 0;  // floats
  };
  struct Output {
    float *host;
    const float *dev;
    size_t bytes;
  };
  // Device memory for a row of `bytes` that another exec hands on (hand_off_outputs): row 0
  // of this exec's output buffer, which only its own steps write. Null if it cannot have one.
  float *output_row_buffer(size_t bytes) {
    if (kOutputSlot >= int(bufs_.size())) bufs_.resize(size_t(kOutputSlot) + 1);
    Buf &b = bufs_[size_t(kOutputSlot)];
    if (b.n * sizeof(float) >= bytes) return b.p;
    // As buffer(kOutputSlot, width) would make it for this exec's steps.
    const size_t n = size_t(max_rows_) * ((bytes + sizeof(float) - 1) / sizeof(float));
    void *p = nullptr;
    if (!alloc(&p, n * sizeof(float), "scratch").is_ok()) return nullptr;
    cuda::device_free(b.p);  // idle (the owner has no step in flight), and smaller
    b.p = static_cast<float *>(p);
    b.n = n;
    return b.p;
  }

  Status alloc(void **p, size_t bytes, const char *what) {
    Result<void *> r = cuda::device_alloc(bytes);
    if (!r) {
      return Status(r.status().code(), std::string("cannot allocate ") + std::to_string(bytes >> 20) + " MiB of " +
                                           what + " on " + name_ + ": " + r.status().message());
    }
    *p = *r;
    return Status::ok();
  }
  const int32_t *tokens() const { return static_cast<const int32_t *>(step_); }
  // Sequence i's first position, on the device.
  const int64_t *pos0(size_t i) const {
    return reinterpret_cast<const int64_t *>(static_cast<const uint8_t *>(step_) + step_tokens_bytes_) + i;
  }
  cuda::DevMatrix dev(const WeightView &w) const {
    return {w.device, w.type, w.n_in, w.n_out, w.row_bytes};
  }
  // The first error of a step sticks; later ops of the step are skipped.
  void fail(const Status &s) {
    if (error_.is_ok() && !s.is_ok()) error_ = s;
  }
  void run(const Status &s, const char *what) {
    if (inject_at_ > 0 && ++ops_run_ == inject_at_) {
      fail(on_device(Status(GEIST_E_INTERNAL, "injected fault (GEIST_CUDA_INJECT_FAULT)"), name_, what));
    }
    if (!s.is_ok()) fail(on_device(s, name_, what));
  }

  // ---- the step's ops: recorded by the forward pass, run at end_step ----
  // A step is a list of ops whose every argument (device pointers, shapes, scalars) goes
  // into the step's key; what changes from step to step with the same key (tokens, the
  // first position, RoPE rows) is in device memory, uploaded before the ops run. A key seen
  // a second time is captured into a CUDA graph, and later steps with that key replay it:
  // one launch instead of one per op.
  struct Op {
    const char *what;
    std::string label;  // GEIST_PROFILE's name (matmuls: type and shape)
    std::function<Status()> f;
  };
  // The last recorded op, where it is one that can also quantize what it writes for the
  // matmul after it (gelu_mul, rmsnorm_add_norm, attention): the rows it writes, and how to
  // make the op that does both. ops = ops_.size() just after it was recorded. unit: the
  // act blocks it can quantize divide unit (the width, or the attention's head dim).
  struct Producer {
    size_t ops = 0;
    const float *out = nullptr;
    int64_t rows = 0, width = 0;
    std::function<std::function<Status()>(int act_block, void *scratch)> make;
    int64_t unit = 0;
    const char *name = nullptr;  // the op's name once it quantizes
    const char *kind = nullptr;  // GEIST_CUDA_FUSE_QUANT's name for it
    cuda::NormFold fold;         // a one-row rmsnorm_add_norm's arguments (fold.x set)
  };
  Producer producer_;

  // Producers that quantize for the matmul after them (GEIST_CUDA_FUSE not 0): a list of
  // norm (rmsnorm_add_norm), gelu (gelu_mul), attn (the attention) in GEIST_CUDA_FUSE_QUANT,
  // 1 for all three (the default), 0 for none. Measured on an H100 (2026-12-05, CUDA.md):
  // E4B tg128 +6 % with norm and attn; gelu's quantizing form lost 3 % on the 270M while it
  // ran the GELU with a thread per 8 or 32 elements, and with a thread per element (since)
  // it gains with the mixed-type sets (270M 1065 -> 1103 t/s).
  static bool fuse_quant(const char *producer) {
    static const std::string list = [] {
      const char *e = std::getenv("GEIST_CUDA_FUSE_QUANT");
      if (e == nullptr) e = "1";
      if (std::strcmp(e, "0") == 0) return std::string();
      std::string l(",");
      l.append(std::strcmp(e, "1") == 0 ? "norm,gelu,attn" : e).append(",");
      return l;
    }();
    if (!fuse() || producer == nullptr || list.empty()) return false;
    std::string key(",");
    key.append(producer).append(",");
    return list.find(key) != std::string::npos;
  }
  // Where the op just recorded wrote x (all n_rows rows of the matrices' K) and the matrices
  // share one quantization of x: that op is replaced by its quantizing form, writing into
  // scratch, and true is returned (the matmul then runs on the scratch). The same bits.
  bool take_quantizing_producer(Act x, int n_rows, const cuda::DevMatrix *w, float *const *y, int n_mat,
                                void *scratch) {
    if (!fuse_quant(producer_.kind) || !error_.is_ok() || !producer_.make || producer_.ops != ops_.size() ||
        ops_.empty() || producer_.out != x.p || producer_.rows != n_rows || producer_.width != w[0].n_in ||
        scratch == nullptr) {
      return false;
    }
    const int act_block = cuda::matmul_n_act_block(w, y, n_mat, n_rows);
    const int64_t unit = producer_.unit > 0 ? producer_.unit : producer_.width;
    if (act_block == 0 || producer_.width % act_block != 0 || unit % act_block != 0) return false;
    ops_.back().f = producer_.make(act_block, scratch);
    ops_.back().what = producer_.name;
    step_hash_ = mix(step_hash_, uint64_t(act_block));
    producer_ = Producer{};
    return true;
  }
  // GEIST_CUDA_NORM_FOLD=1: a one-row rmsnorm_add_norm whose out only the matmul right after
  // it reads is folded into that matmul's kernel (cuda::matmul_n_norm) where the matrices
  // fit it: one dependent launch less per norm. Off by default: on an H100 (2026-12-07) the
  // 270M's tg128 was within the noise with it (1225 / 1217 / 1227 against 1224 / 1284 / 1220
  // t/s) and 2-6 % slower at depth 1024 (the consumer's blocks each recompute the norm).
  // GEIST_CUDA_SKIP_OPS names the fused op rmsnorm_add_norm+matmul (skipping
  // rmsnorm_add_norm leaves nothing to fold).
  static bool norm_fold() {
    static const bool v = [] {
      const char *e = std::getenv("GEIST_CUDA_NORM_FOLD");
      return e != nullptr && std::strcmp(e, "1") == 0;
    }();
    return v && fuse();
  }
  // Where the op just recorded is a one-row rmsnorm_add_norm that wrote x (n_rows 1) and the
  // matrices fit cuda::matmul_n_norm: that op is dropped, *nf gets its arguments and true is
  // returned (the matmul then runs both). The same bits.
  bool take_norm_fold(Act x, int n_rows, const cuda::DevMatrix *w, int n_mat, cuda::NormFold *nf) {
    if (!norm_fold() || !fuse_quant(producer_.kind) || !error_.is_ok() || producer_.ops != ops_.size() ||
        ops_.empty() || producer_.fold.x == nullptr || producer_.out != x.p || n_rows != 1 || producer_.rows != 1 ||
        !cuda::matmul_n_norm_fits(w, n_mat, producer_.fold.dim)) {
      return false;
    }
    if (fold_count_ == nullptr) {  // zero when allocated; every fold leaves it zero
      void *p = nullptr;
      if (Status st = alloc(&p, sizeof(unsigned), "the norm fold's counter"); !st.is_ok()) {
        fail(st);
        return false;
      }
      const unsigned zero = 0;
      if (Status st = cuda::upload(p, &zero, sizeof(zero)); !st.is_ok()) {
        cuda::device_free(p);
        fail(st);
        return false;
      }
      fold_count_ = static_cast<unsigned *>(p);
    }
    *nf = producer_.fold;
    nf->count = fold_count_;
    ops_.pop_back();
    producer_ = Producer{};
    return true;
  }
  // The last recorded op, where it is head_norm_rope: its arguments (ops as in Producer).
  struct HeadNormOp {
    size_t ops = 0;
    cuda::HeadNormSet set;
    int n_rows = 0, head_dim = 0;
    float eps = 0;
    const float *cs = nullptr;
  };
  HeadNormOp head_norm_;

  // The K and V stores run inside the head_norm_rope before them
  // (CudaOps.HeadNormRopeStoreIsOpsThenAppend); GEIST_CUDA_FUSE_KV=0 or GEIST_CUDA_FUSE=0:
  // kv_append's own launches.
  static bool fuse_kv() {
    static const bool v = [] {
      const char *e = std::getenv("GEIST_CUDA_FUSE_KV");
      return e == nullptr || std::strcmp(e, "0") != 0;
    }();
    return v && fuse();
  }
  // Where the op just recorded is the head_norm_rope that wrote k (and v, or v is untouched
  // by it), the step's sequences form one group and K and V rings share a type: that op is
  // replaced by head_norm_rope_store, storing the rows as kv_append would, and true is
  // returned. The same values and ring bytes.
  bool take_head_norm_store(int l, Act k, Act v) {
    if (!fuse_kv() || !error_.is_ok() || ops_.empty() || head_norm_.ops != ops_.size() || seqs_.empty()) {
      return false;
    }
    bool one_group = true;
    int groups = 0;
    cuda::SeqRings rings;
    uint64_t gh = 0;
    KvType type = KvType::F32;
    int64_t row_floats = 0;
    for_each_group(l, [&](const CudaKvStore &c, const cuda::SeqRings &t, int row_first, uint64_t h) {
      if (++groups > 1 || row_first != 0 || c.type_k() != c.type_v()) one_group = false;
      rings = t;
      gh = h;
      type = c.type_k();
      row_floats = c.spec(l).row_floats;
    });
    cuda::HeadNormSet set = head_norm_.set;
    const int hd = head_norm_.head_dim;
    if (!one_group || groups != 1 || rings.row0[rings.n] != head_norm_.n_rows || hd % 32 != 0 || hd > 512) {
      return false;
    }
    int ik = -1, iv = -1;
    for (int i = 0; i < set.n; ++i) {
      if (set.x[i] == k.p) ik = i;
      if (set.x[i] == v.p) iv = i;
    }
    if (ik < 0 || int64_t(set.n_heads[ik]) * hd != row_floats) return false;
    if (iv < 0) {  // v is not normalized: only stored
      if (set.n == 3 || row_floats % hd != 0) return false;
      iv = set.n++;
      set.x[iv] = v.p;
      set.g[iv] = nullptr;
      set.n_heads[iv] = int(row_floats / hd);
      set.rope[iv] = false;
      set.norm[iv] = false;
    }
    if (int64_t(set.n_heads[iv]) * hd != row_floats || ik == iv) return false;
    set.ring[ik] = 0;
    set.ring[iv] = 1;
    const int n_rows = head_norm_.n_rows;
    const float eps = head_norm_.eps;
    const float *cs = head_norm_.cs;
    ops_.back().f = [=, s = stream_] {
      return cuda::head_norm_rope_store(set, n_rows, hd, eps, cs, type, rings, s);
    };
    ops_.back().what = "head_norm_rope+kv_store";
    step_hash_ = mix(step_hash_, mix(gh, key(17, k.p, v.p, iv)));
    head_norm_ = HeadNormOp{};
    return true;
  }

  static uint64_t mix(uint64_t h, uint64_t v) {
    v *= 0x9E3779B97F4A7C15ull;
    v ^= v >> 32;
    return (h ^ v) * 0x100000001B3ull + 0x632BE59BD9B4E019ull;
  }
  static uint64_t word(const void *p) { return uint64_t(reinterpret_cast<uintptr_t>(p)); }
  static uint64_t word(float f) {
    uint32_t u;
    std::memcpy(&u, &f, sizeof u);
    return u;
  }
  template <class I, class = std::enable_if_t<std::is_integral_v<I>>>
  static uint64_t word(I i) {
    return uint64_t(int64_t(i));
  }
  template <class... A>
  static uint64_t key(A... a) {
    uint64_t h = 0xCBF29CE484222325ull;
    ((h = mix(h, word(a))), ...);
    return h;
  }
  template <class F>
  void record(const char *what, uint64_t k, F &&f) {
    if (!error_.is_ok()) return;
    if (skip_op(what)) return;
    step_hash_ = mix(step_hash_, k);
    ops_.push_back({what, std::string(), std::function<Status()>(std::forward<F>(f))});
  }

  // GEIST_CUDA_SKIP_OPS=name,name (a measurement knob, never for results): the ops of those
  // names are not run, so that the decode speed without them tells what they cost inside a
  // captured graph, where GEIST_PROFILE's op-by-op waits cannot look. The logits are wrong.
  static bool skip_op(const char *what) {
    static const std::string list = [] {
      std::string l;
      if (const char *e = std::getenv("GEIST_CUDA_SKIP_OPS")) l.append(",").append(e).append(",");
      return l;
    }();
    if (list.empty()) return false;
    std::string key(",");
    key.append(what).append(",");
    return list.find(key) != std::string::npos;
  }

  void run_ops() {
    double t0 = 0;
    if (profile_) {
      (void)cuda::stream_sync(stream_);
      t0 = now_seconds();
    }
    for (const Op &op : ops_) {
      if (!error_.is_ok()) return;
      run(op.f(), op.what);
      if (profile_) {
        (void)cuda::stream_sync(stream_);
        const double t = now_seconds();
        prof_.add(profile_label(op.label.empty() ? std::string(op.what) : op.label, n_rows_), t - t0);
        t0 = t;
      }
    }
  }

  void execute() {
    if (!graphs_) return run_ops();
    const std::pair<uint64_t, size_t> k{step_hash_, ops_.size()};
    auto it = std::find_if(cache_.begin(), cache_.end(), [&](const Graph &g) { return g.key == k; });
    if (it != cache_.end()) {
      it->last_use = ++clock_;
      if (host_times_.on) host_times_.found();
      run(cuda::graph_launch(it->exec, stream_), "launching the step's graph");
      return;
    }
    if (std::find(seen_.begin(), seen_.end(), k) == seen_.end()) {
      // First sighting: run the ops one by one and remember the key.
      if (seen_.size() >= kMaxSeen) seen_.erase(seen_.begin());
      seen_.push_back(k);
      return run_ops();
    }
    Status first = cuda::graph_capture_begin(stream_);
    if (!first.is_ok()) return fail(on_device(first, name_, "capturing the step"));
    for (const Op &op : ops_) {
      if (Status r = op.f(); !r.is_ok()) {
        first = on_device(r, name_, op.what);
        break;
      }
    }
    Result<cuda::CudaGraph> g = cuda::graph_capture_end(stream_);
    if (!first.is_ok()) {
      if (g) cuda::graph_destroy(*g);
      return fail(first);
    }
    if (!g) return fail(on_device(g.status(), name_, "capturing the step"));
    if (cache_.size() >= kMaxGraphs) {
      auto lru = std::min_element(cache_.begin(), cache_.end(),
                                  [](const Graph &a, const Graph &b) { return a.last_use < b.last_use; });
      cuda::graph_destroy(lru->exec);
      cache_.erase(lru);
    }
    cache_.push_back({k, *g, ++clock_});
    run(cuda::graph_launch(*g, stream_), "launching the step's graph");
  }

  // GEIST_CUDA_HOST_TIMES=1: per step, the host's time from begin_step to the graph's
  // launch (recording the ops, the step's uploads, finding the graph), from the launch to
  // the sync (the downloads queued), waiting in the sync, and from the last step's end to
  // this begin_step (the caller: sampling, the session, the bench loop); means over the
  // one-row steps and the others, printed to stderr when the exec ends. Tells how much of a
  // decode step the device waits on the host. The recording is split in begin_step (its
  // upload), the forward's recording (the ops, RoPE rows), finding the graph (the key
  // lookup) and graph_launch itself (replayed steps only: the step's "launch" share).
  struct HostTimes {
    bool on = false;
    struct Sum {
      long long n = 0, replays = 0;
      double record = 0, queue = 0, wait = 0, gap = 0;
      double stage = 0, forward = 0, find = 0, launch = 0;  // parts of record
    } one, many;
    double t_begin = 0, t_staged = 0, t_recorded = 0, t_found = 0, t_launched = 0, t_sync = 0, t_end = 0;
    Sum *cur = nullptr;
    void begin(int n_rows) {
      t_begin = now_seconds();
      t_found = 0;
      cur = n_rows == 1 ? &one : &many;
      if (t_end > 0) cur->gap += t_begin - t_end;
    }
    void staged() { t_staged = now_seconds(); }
    void recorded() { t_recorded = now_seconds(); }
    void found() { t_found = now_seconds(); }
    void launched() {
      t_launched = now_seconds();
      if (cur == nullptr) return;
      cur->stage += t_staged - t_begin;
      cur->forward += t_recorded - t_staged;
      if (t_found > 0) {
        cur->replays += 1;
        cur->find += t_found - t_recorded;
        cur->launch += t_launched - t_found;
      }
    }
    void syncing() { t_sync = now_seconds(); }
    // A queued step ends at its launch; its wait (waited) comes later, between later steps.
    void queued() {
      syncing();
      end();
    }
    void waited(double dt, int n_rows) {
      (n_rows == 1 ? one : many).wait += dt;
      t_end += dt;  // not the caller's time
    }
    void end() {
      t_end = now_seconds();
      if (cur == nullptr) return;
      cur->n += 1;
      cur->record += t_launched - t_begin;
      cur->queue += t_sync - t_launched;
      cur->wait += t_end - t_sync;
    }
    void print(const std::string &dev) const {
      if (!on) return;
      for (const auto &[what, x] : {std::pair<const char *, const Sum &>{"one-row steps", one}, {"other steps", many}}) {
        if (x.n == 0) continue;
        const double k = 1e6 / double(x.n);
        std::fprintf(stderr,
                     "GEIST_CUDA_HOST_TIMES %s: %lld %s, us per step: recording + launch %.1f, queueing the "
                     "downloads %.1f, waiting for the device %.1f; before the step (the caller) %.1f\n",
                     dev.c_str(), x.n, what, x.record * k, x.queue * k, x.wait * k, x.gap * k);
        const double kr = x.replays > 0 ? 1e6 / double(x.replays) : 0;
        std::fprintf(stderr,
                     "GEIST_CUDA_HOST_TIMES %s: %s, recording + launch in parts, us per step: begin_step %.1f, "
                     "the forward's recording %.1f; of the %lld replayed steps: finding the graph %.1f, "
                     "graph_launch %.1f\n",
                     dev.c_str(), what, x.stage * k, x.forward * k, x.replays, x.find * kr, x.launch * kr);
      }
    }
  } host_times_;

  int device_;
  std::string name_;
  int max_rows_;
  size_t matmul_scratch_bytes_;
  CudaStream stream_ = nullptr;
  std::vector<Buf> bufs_;
  void *step_ = nullptr;
  size_t step_bytes_ = 0;
  size_t step_tokens_bytes_ = 0;
  uint8_t *host_step_ = nullptr;                 // pinned
  std::unordered_map<int, float *> host_rope_;   // pinned, max_rows x rot_dim each
  void *scratch_ = nullptr;
  unsigned *fold_count_ = nullptr;  // take_norm_fold's counter
  void *attn_scratch_ = nullptr;
  size_t attn_scratch_bytes_ = 0;
  // The greedy op's device parts and tokens, its pinned staging, and this step's request.
  struct GreedyOut {
    const int32_t *dev = nullptr;
    int n = 0;
  };
  void *greedy_dev_ = nullptr;
  size_t greedy_dev_bytes_ = 0;
  int32_t *host_greedy_ = nullptr;  // pinned, two halves of greedy_cap_ (stage_)
  int greedy_cap_ = 0;
  GreedyOut greedy_out_;
  GreedyOut last_greedy_;  // the last step's, while it is there to feed the next (feed_drawn)
  std::vector<int32_t *> greedy_hosts_;
  // The sampled draws' device scratch (their specs, then the top-k keys) and the specs'
  // pinned staging (two halves of sample_cap_ rows, stage_).
  void *sample_dev_ = nullptr;
  size_t sample_dev_bytes_ = 0;
  DrawSpec *host_specs_ = nullptr;
  int sample_cap_ = 0;
  bool batch_lazy_ = true;  // GEIST_CUDA_BATCH_LAZY=0: batched steps copy every row to the host
  bool sample_ = true;  // sessions let the steps draw sampled tokens (GEIST_CUDA_SAMPLE=0: the host draws)
  cuda::DrawAlgo draw_algo_ = cuda::DrawAlgo::kSort;  // GEIST_CUDA_DRAW_SELECT=1: kSelect
  std::vector<DrawSpec> draw_specs_;
  std::vector<void *> retired_host_;  // pinned buffers replaced during a step
  void *attn_counters_ = nullptr;
  size_t attn_counter_bytes_ = 0;
  std::vector<void *> retired_;  // scratch replaced during a step, freed at its end
  std::vector<Output> outputs_;
  std::vector<Output> deferred_;  // the last step's outputs, left on the device (defer_outputs)
  bool defer_ = false;
  int n_rows_ = 0;
  // The step's sequences: rows [row0, row0 + n) at positions pos0.. of kv.
  struct Seq {
    CudaKvStore *kv;
    int row0, n;
    int64_t pos0;
  };
  std::vector<Seq> seqs_;
  Status error_;
  Status reserve_error_;
  long long inject_at_ = 0, ops_run_ = 0;
  long long inject_wait_at_ = 0, waits_ = 0;
  // Queued steps (queue_next_step), oldest first: the event after the step, its greedy
  // tokens' staging half and their hosts.
  struct Queued {
    cuda::CudaEvent event;
    const int32_t *greedy;
    std::vector<int32_t *> hosts;
    int n_rows;
  };
  std::deque<Queued> queued_;
  std::array<cuda::CudaEvent, 2> events_{};  // one per staging half
  int stage_ = 0;                            // the half of the host staging this step uses
  bool queue_ = false, queue_next_ = false, feed_next_ = false;
  bool profile_ = false;
  bool graphs_ = true;
  std::vector<Op> ops_;  // this step's, in order
  uint64_t step_hash_ = 0;
  struct Graph {
    std::pair<uint64_t, size_t> key;  // (hash of the ops and their arguments, number of ops)
    cuda::CudaGraph exec;
    uint64_t last_use;
  };
  static constexpr size_t kMaxGraphs = 16, kMaxSeen = 64;
  std::vector<Graph> cache_;
  std::vector<std::pair<uint64_t, size_t>> seen_;
  uint64_t clock_ = 0;
  OpProfile prof_;
};

class CudaBackend final : public Backend {
 public:
  CudaBackend(int device, std::string name) : device_(device), name_(std::move(name)) {}
  ~CudaBackend() override {
    if (!cuda::set_device(device_).is_ok()) return;
    for (void *p : arenas_) cuda::device_free(p);
  }

  const char *name() const override { return "cuda"; }
  std::string device() const override { return name_; }

  // Upload every weight as stored (one copy per distinct tensor: a tied output head shares
  // the embedding's), then release the mapped pages: the device copy is the one read. The
  // tensors share one allocation, each at a 256-byte aligned offset (what cudaMalloc gives a
  // tensor of its own): one cudaMalloc per tensor rounds each large one up to the driver's
  // 2 MiB pages, which on the E4B geometry (~600 tensors) cost 352 MiB the report did not see
  // (H100, 2026-12-07: 5684 MiB taken against 5332 reported).
  Status prepare(const ModelWeights &w, const std::function<void(const void *, size_t)> &release) override {
    const double t0 = now_seconds();
    GEIST_RETURN_IF_ERROR(on_device(cuda::set_device(device_), name_, "selecting the device"));
    size_t total = 0;
    std::unordered_set<const void *> counted;
    for (const auto *list : {&w.matrices, &w.tables, &w.vectors}) {
      for (const WeightView *v : *list) {
        if (!v->data) continue;
        if (list == &w.matrices && !cuda::matmul_supported(v->type)) {
          return GEIST_ERROR(GEIST_E_UNSUPPORTED, "the CUDA backend cannot multiply %s weights",
                             quant::type_name(v->type));
        }
        if (!uploaded_.count(v->data) && counted.insert(v->data).second) {
          total += arena_bytes(v->row_bytes * size_t(v->n_out));
        }
      }
    }
    uint8_t *arena = nullptr;
    if (total > 0) {
      Result<void *> p = cuda::device_alloc(total);
      if (!p) {
        return GEIST_ERROR(GEIST_E_OUT_OF_MEMORY, "the weights (%.1f MiB) do not fit on %s: %s",
                           double(total) / 1048576.0, name_.c_str(), p.status().message().c_str());
      }
      arena = static_cast<uint8_t *>(*p);
      arenas_.push_back(arena);
      bytes_ += total;
    }
    size_t off = 0;
    for (const auto *list : {&w.matrices, &w.tables, &w.vectors}) {
      for (WeightView *v : *list) {
        if (!v->data) continue;
        auto it = uploaded_.find(v->data);
        if (it == uploaded_.end()) {
          const size_t bytes = v->row_bytes * size_t(v->n_out);
          it = uploaded_.emplace(v->data, arena + off).first;
          off += arena_bytes(bytes);
          GEIST_RETURN_IF_ERROR(on_device(cuda::upload(it->second, v->data, bytes), name_, "uploading weights"));
        }
        v->device = static_cast<const uint8_t *>(it->second);
        if (list == &w.matrices) matrices_.push_back(*v);
      }
    }
    std::unordered_set<const void *> released;
    for (const auto *list : {&w.matrices, &w.tables, &w.vectors}) {
      for (const WeightView *v : *list) {
        if (v->data && released.insert(v->data).second) release(v->data, v->row_bytes * size_t(v->n_out));
      }
    }
    seconds_ = now_seconds() - t0;
    return Status::ok();
  }
  uint64_t weight_bytes() const override { return bytes_; }
  double prepare_seconds() const override { return seconds_; }

  Result<std::unique_ptr<KvStore>> create_kv(const std::vector<KvLayerSpec> &layers, int64_t n_ctx, int max_chunk,
                                             KvType tk, KvType tv) override {
    GEIST_RETURN_IF_ERROR(check_kv_args(layers, n_ctx, max_chunk, tk, tv));
    GEIST_RETURN_IF_ERROR(on_device(cuda::set_device(device_), name_, "selecting the device"));
    auto c = std::make_unique<CudaKvStore>(layers, n_ctx, max_chunk, tk, tv, device_, name_);
    GEIST_RETURN_IF_ERROR(c->allocate());
    return std::unique_ptr<KvStore>(std::move(c));
  }

  Result<std::unique_ptr<Exec>> create_exec(int, int max_chunk) override {
    size_t scratch = 0;
    for (const WeightView &w : matrices_) {
      scratch = std::max(scratch, cuda::matmul_scratch_bytes({w.device, w.type, w.n_in, w.n_out, w.row_bytes},
                                                             max_chunk));
    }
    auto e = std::make_unique<CudaExec>(device_, name_, max_chunk, scratch);
    GEIST_RETURN_IF_ERROR(e->init());
    return std::unique_ptr<Exec>(std::move(e));
  }

 private:
  int device_;
  std::string name_;
  std::unordered_map<const void *, void *> uploaded_;  // host bytes -> device copy (in an arena)
  std::vector<void *> arenas_;  // one allocation per prepare() with tensors to upload
  std::vector<WeightView> matrices_;  // for the matmul scratch each exec needs
  uint64_t bytes_ = 0;
  double seconds_ = 0;
};

}  // namespace

Result<std::unique_ptr<Backend>> make_cuda_backend(int device) {
  Result<int> n = cuda::device_count();
  if (!n) return Status(n.status().code(), "the CUDA backend cannot start: " + n.status().message());
  if (*n == 0) return GEIST_ERROR(GEIST_E_UNSUPPORTED, "the CUDA backend found no CUDA device");
  if (device < 0 || device >= *n) {
    return GEIST_ERROR(GEIST_E_INVALID_ARGUMENT, "CUDA device %d does not exist (%d device%s)", device, *n,
                       *n == 1 ? "" : "s");
  }
  Result<cuda::DeviceInfo> info = cuda::device_info(device);
  if (!info) return Status(info.status().code(), "the CUDA backend cannot start: " + info.status().message());
  GEIST_RETURN_IF_ERROR(cuda::set_device(device));
  return std::unique_ptr<Backend>(new CudaBackend(device, "CUDA " + std::to_string(device) + ": " +
                                                              cuda::describe(*info)));
}

}  // namespace geist

// The CPU backend: today's kernels (ops.h) behind the seam of backend.h. Weights are
// repacked once for the SIMD tier in use; each session gets a thread pool, scratch and a
// KV store of f32 rings in an anonymous mapping (pages committed as positions are written).
#include <sys/mman.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <limits>
#include <memory>
#include <new>
#include <string>

#include "backends/backend.h"
#include "backends/op_profile.h"
#include "backends/cpu/isa.h"
#include "backends/cpu/kv_rows.h"
#include "backends/cpu/ops.h"
#include "backends/cpu/packed.h"
#include "base/argmax.h"
#include "base/thread_pool.h"
#include "base/timer.h"

namespace geist {
namespace {

// A KvBuffer in host memory (left uninitialised: a state's save writes it whole).
class HostKvBuffer final : public KvBuffer {
 public:
  static Result<std::unique_ptr<KvBuffer>> create(size_t bytes) {
    uint8_t *p = new (std::nothrow) uint8_t[std::max<size_t>(bytes, 1)];
    if (p == nullptr) return GEIST_ERROR(GEIST_E_OUT_OF_MEMORY, "cannot allocate %zu bytes for a session state", bytes);
    return std::unique_ptr<KvBuffer>(new HostKvBuffer(p, bytes));
  }
  ~HostKvBuffer() override { delete[] data(); }
  Status read(size_t off, size_t n, void *host) const override {
    if (off > size() || n > size() - off) return GEIST_ERROR(GEIST_E_INVALID_ARGUMENT, "KvBuffer::read out of range");
    if (n) std::memcpy(host, data() + off, n);
    return Status::ok();
  }

 private:
  HostKvBuffer(uint8_t *p, size_t n) : KvBuffer(p, n, -1) {}
};

// K and V rings of every layer in the store's types (kv_type.h), then the pin checkpoint's
// rings (W - 1 positions of each sliding layer, also addressed by position), in one
// anonymous mapping: pages are committed as positions are written, the checkpoint's only
// once something is pinned.
class CpuKvStore final : public KvStore {
 public:
  static Result<std::unique_ptr<CpuKvStore>> create(const std::vector<KvLayerSpec> &layers, int64_t n_ctx,
                                                    int max_chunk, KvType tk, KvType tv) {
    std::unique_ptr<CpuKvStore> c(new CpuKvStore(layers, n_ctx, max_chunk, tk, tv));
    size_t total = 0;
    for (int l = 0; l < c->n_layers(); ++l) {
      total += c->block_bytes(l, c->capacity(l)) + c->block_bytes(l, c->checkpoint_capacity(l));
    }
    if (total > 0) {
      void *m = mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
      if (m == MAP_FAILED) {
        return GEIST_ERROR(GEIST_E_OUT_OF_MEMORY, "cannot reserve %zu bytes for the KV cache (n_ctx %lld)", total,
                           (long long)n_ctx);
      }
      c->mapping_ = m;
    }
    c->bytes_ = total;
    uint8_t *p = static_cast<uint8_t *>(c->mapping_);
    for (int l = 0; l < c->n_layers(); ++l) {
      c->main_.push_back({p, p + size_t(c->capacity(l)) * c->row_bytes_k(l), c->capacity(l)});
      p += c->block_bytes(l, c->capacity(l));
    }
    for (int l = 0; l < c->n_layers(); ++l) {
      const int64_t cap = c->checkpoint_capacity(l);
      c->ckpt_.push_back({p, p + size_t(cap) * c->row_bytes_k(l), cap});
      p += c->block_bytes(l, cap);
    }
    return c;
  }
  ~CpuKvStore() override {
    if (mapping_) munmap(mapping_, bytes_);
  }

  size_t bytes_reserved() const override { return bytes_; }
  Result<std::unique_ptr<KvBuffer>> new_buffer(size_t bytes) const override { return HostKvBuffer::create(bytes); }
  const uint8_t *k(int l) const { return main_[l].k; }
  const uint8_t *v(int l) const { return main_[l].v; }

  void read_rows(int l, int64_t from, int64_t to, void *dst) const override { to_block(l, main_[l], from, to, dst); }
  void write_rows(int l, int64_t from, int64_t to, const void *src) override {
    from_block(l, main_[l], from, to, src);
  }

  void save_checkpoint(int64_t n_pin) override {
    for (int l = 0; l < n_layers(); ++l) {
      if (spec(l).window > 0) copy(l, main_[l], ckpt_[l], first_live(l, n_pin), n_pin);
    }
  }
  int64_t rewind(int l, int64_t n_pin, int64_t n_past) override {
    if (spec(l).window == 0 || n_past <= n_pin) return 0;
    const int64_t from = first_live(l, n_pin);
    // Position q's slot was overwritten iff some position in [n_pin, n_past) maps to it,
    // i.e. q + capacity < n_past (q + capacity >= n_pin holds since capacity >= W - 1 >=
    // n_pin - q).
    const int64_t to = std::min(n_pin, n_past - capacity(l));
    if (to <= from) return 0;
    copy(l, ckpt_[l], main_[l], from, to);
    return to - from;
  }
  void read_checkpoint(int l, int64_t n_pin, void *dst) const override {
    to_block(l, ckpt_[l], first_live(l, n_pin), n_pin, dst);
  }
  void write_checkpoint(int l, int64_t n_pin, const void *src) override {
    from_block(l, ckpt_[l], first_live(l, n_pin), n_pin, src);
  }

  // Rows [n_rows][row_floats] f32 of positions pos0.. stored in the store's types. A chunk of
  // kPoolRows rows or more goes over the pool in runs of rows (the first touch of the ring's
  // pages and the f16 / bf16 / q8_0 encodings were one thread's work: 0.76 ms of every E4B
  // layer's 512-row prefill at 16 threads, no faster than at 8). Each row's bytes are the same
  // whoever writes them.
  void append(int l, int64_t pos0, int n_rows, const float *k, const float *v, ThreadPool &pool) {
    const int64_t rf = spec(l).row_floats;
    const Ring &R = main_[l];
    const size_t bk = row_bytes_k(l), bv = row_bytes_v(l);
    const auto rows = [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        const size_t s = size_t((pos0 + r) % R.cap);
        store_row(type_k(), k + size_t(r) * size_t(rf), rf, R.k + s * bk);
        store_row(type_v(), v + size_t(r) * size_t(rf), rf, R.v + s * bv);
      }
    };
    // Rows take distinct slots (a ring holds at least a chunk: KvStore's capacity), so runs
    // of them never write the same bytes; serially otherwise, where the last row must win.
    constexpr int kPoolRows = 16;
    if (n_rows < kPoolRows || n_rows > R.cap) return rows(0, n_rows);
    parallel_ranges(n_rows, kPoolRows / 2, pool, rows);
  }

 private:
  // K and V rows of positions in a ring of cap slots: position p at slot p % cap.
  struct Ring {
    uint8_t *k, *v;
    int64_t cap;
  };
  CpuKvStore(const std::vector<KvLayerSpec> &layers, int64_t n_ctx, int max_chunk, KvType tk, KvType tv)
      : KvStore(layers, n_ctx, max_chunk, tk, tv) {}

  // Positions [from, to) between a ring and a rows block / another ring.
  void to_block(int l, const Ring &R, int64_t from, int64_t to, void *dst) const {
    const size_t bk = row_bytes_k(l), bv = row_bytes_v(l), n = size_t(to - from);
    uint8_t *d = static_cast<uint8_t *>(dst);
    for (int64_t p = from; p < to; ++p) {
      const size_t s = size_t(p % R.cap), i = size_t(p - from);
      std::memcpy(d + i * bk, R.k + s * bk, bk);
      std::memcpy(d + n * bk + i * bv, R.v + s * bv, bv);
    }
  }
  void from_block(int l, const Ring &R, int64_t from, int64_t to, const void *src) {
    const size_t bk = row_bytes_k(l), bv = row_bytes_v(l), n = size_t(to - from);
    const uint8_t *d = static_cast<const uint8_t *>(src);
    for (int64_t p = from; p < to; ++p) {
      const size_t s = size_t(p % R.cap), i = size_t(p - from);
      std::memcpy(R.k + s * bk, d + i * bk, bk);
      std::memcpy(R.v + s * bv, d + n * bk + i * bv, bv);
    }
  }
  void copy(int l, const Ring &src, const Ring &dst, int64_t from, int64_t to) {
    const size_t bk = row_bytes_k(l), bv = row_bytes_v(l);
    for (int64_t p = from; p < to; ++p) {
      const size_t a = size_t(p % src.cap), b = size_t(p % dst.cap);
      std::memcpy(dst.k + b * bk, src.k + a * bk, bk);
      std::memcpy(dst.v + b * bv, src.v + a * bv, bv);
    }
  }
  static void store_row(KvType t, const float *x, int64_t n, uint8_t *dst) {
    if (t == KvType::F32) {
      std::memcpy(dst, x, size_t(n) * sizeof(float));
    } else {
      cpu::kv_store_rows(t, x, 1, n, dst);
    }
  }

  std::vector<Ring> main_, ckpt_;
  void *mapping_ = nullptr;
  size_t bytes_ = 0;
};

class CpuExec final : public Exec {
 public:
  CpuExec(int n_threads, int max_chunk) : pool_(ThreadPool::shared(n_threads)), max_rows_(max_chunk) {
    if (OpProfile::enabled()) profile_ = std::make_unique<OpProfile>();
    // GEIST_CPU_QUEUE=1 (tests): queued steps emulated (Exec::can_queue), so that the
    // session's queued decode runs on every CI machine, under the sanitizers: a queued step
    // runs at once, as every CPU step does, but its drawn tokens reach their hosts only at
    // wait_queued, and a fed step takes its token from the step before's drawn token, as
    // on a GPU. GEIST_CPU_INJECT_WAIT_FAULT=N: the N-th wait fails as a device error would.
    const char *q = std::getenv("GEIST_CPU_QUEUE");
    emulate_queue_ = q != nullptr && std::strcmp(q, "1") == 0;
    // GEIST_CPU_DEFER=1 (tests): deferred outputs emulated (Exec::defer_outputs), as the CUDA
    // exec's lazy logits: a deferred row stays in this exec (its host buffer is filled with
    // NaN meanwhile, so a read that skipped fetch_outputs shows) until fetch_outputs, and a
    // step of several sessions hands each its row (hand_off_outputs).
    const char *d = std::getenv("GEIST_CPU_DEFER");
    emulate_defer_ = d != nullptr && std::strcmp(d, "1") == 0;
    if (const char *e = std::getenv("GEIST_CPU_INJECT_WAIT_FAULT")) inject_wait_at_ = std::strtoll(e, nullptr, 10);
  }
  ~CpuExec() override {
    if (profile_) {
      profile_->print("CPU, " + cpu::isa_description() + " tier, " + std::to_string(pool_->n_threads()) + " threads",
                      "wall time of each op");
    }
  }

  int n_threads() const override { return pool_->n_threads(); }

  Act buffer(int slot, int64_t width) override {
    if (slot >= int(bufs_.size())) bufs_.resize(size_t(slot) + 1);
    std::vector<float> &b = bufs_[size_t(slot)];
    const size_t n = size_t(max_rows_) * size_t(width);
    if (b.size() < n) b.resize(n);
    return {b.data(), width};
  }

  uint64_t scratch_bytes() const override {
    uint64_t n = rows_out_.capacity();
    for (const std::vector<float> &b : bufs_) n += b.capacity();
    return n * sizeof(float);
  }

  int max_rows() const override { return max_rows_; }
  void begin_step(const int32_t *tokens, int n_rows, const StepSeq *seqs, int n_seqs) override {
    row_hosts_.clear();
    out_host_ = nullptr;
    deferred_.clear();  // this step overwrites them
    tokens_ = tokens;
    step_error_ = Status::ok();
    draw_writes_.clear();
    const bool feed = feed_next_;
    feed_next_ = false;
    if (!held_.empty() && (!feed || held_.size() > 1)) {
      step_error_ = Status(GEIST_E_INTERNAL, "a step began while a queued step was not waited for");
    }
    if (feed) {
      if (n_rows != 1 || last_drawn_ < 0) {
        step_error_ = Status(GEIST_E_INTERNAL, "a fed step needs one row after a one-row step that drew its token");
      } else {
        fed_token_ = last_drawn_;  // what the device copy does on a GPU
        tokens_ = &fed_token_;
      }
    }
    last_drawn_ = -1;  // this step's, if it computes one
    n_rows_ = n_rows;
    seqs_.clear();
    int row0 = 0;
    for (int i = 0; i < n_seqs; ++i) {
      seqs_.push_back({static_cast<CpuKvStore *>(seqs[i].kv), row0, seqs[i].n_rows, seqs[i].kv->n_past});
      row0 += seqs[i].n_rows;
    }
  }
  Act rope_rows(int slot, const cpu::RopeTable &t) override {
    Act cs = buffer(slot, t.rot_dim());
    for (const Seq &q : seqs_) t.fill(q.pos0, q.n, cs.rows_from(q.row0).p);
    return cs;
  }
  Act output(float *host, int64_t width, int n_rows) override {
    if (!defer_) return {host, width};
    out_scratch_.resize(size_t(n_rows) * size_t(width));  // kept here at end_step (deferred)
    out_host_ = host;
    return {out_scratch_.data(), width};
  }
  // Rows to separate buffers: computed into a scratch of the step's rows, copied at end_step.
  Act output_rows(float *const *hosts, int64_t width, int n_rows) override {
    rows_out_.resize(size_t(n_rows) * size_t(width));
    row_hosts_.assign(hosts, hosts + n_rows);
    row_width_ = width;
    return {rows_out_.data(), width};
  }
  // On the host already: one wanted greedy row read in segments over the pool
  // (greedy_argmax), several rows one per task (one fork and join for the step, not one per
  // row). A sampled row: draw_sampled, as the host sampler draws it.
  void draw(Act x, int n_rows, StepDraw *const *rows) override {
    const OpProfile::Scope ps = scope("draw");
    draw_rows_.clear();
    draw_writes_.clear();
    for (int r = 0; r < n_rows; ++r) {
      if (rows[r] == nullptr) continue;
      draw_rows_.push_back({r, rows[r]->spec});
      draw_writes_.push_back({&rows[r]->token, 0});
    }
    // Each row's candidate scratch, sized here: nothing allocates inside the pool's tasks.
    if (draw_cand_.size() < draw_rows_.size()) {
      draw_cand_.resize(draw_rows_.size());
      draw_pr_.resize(draw_rows_.size());
    }
    for (size_t t = 0; t < draw_rows_.size(); ++t) {
      const size_t k = size_t(std::max(draw_rows_[t].second.top_k, 0));
      draw_cand_[t].reserve(k);
      draw_pr_[t].reserve(k);
    }
    const auto one = [&](size_t t, ThreadPool *pool) {
      const int r = draw_rows_[t].first;
      const DrawSpec &d = draw_rows_[t].second;
      const float *row = x.rows_from(r).p;
      if (d.temperature <= 0.0f) {
        draw_writes_[t].second = static_cast<int32_t>(greedy_argmax(row, x.width, pool, greedy_segment()));
      } else {
        draw_writes_[t].second = draw_sampled(row, x.width, size_t(d.top_k), d.temperature, d.top_p, d.min_p, d.u,
                                              draw_cand_[t], draw_pr_[t]);
      }
    };
    if (draw_rows_.size() == 1) {
      one(0, pool_.get());
    } else {
      pool_->run(static_cast<int>(draw_rows_.size()), [&](int t, int) { one(size_t(t), nullptr); });
    }
    last_drawn_ = n_rows == 1 && draw_writes_.size() == 1 ? draw_writes_[0].second : -1;
  }
  Status end_step() override {
    const bool queue = queue_next_, defer = defer_;
    queue_next_ = false;
    defer_ = false;  // one step per defer_outputs(true)
    if (defer && step_error_.is_ok()) {
      for (size_t r = 0; r < row_hosts_.size(); ++r) {
        const float *row = rows_out_.data() + r * size_t(row_width_);
        keep(row_hosts_[r], row, size_t(row_width_));
      }
      if (out_host_ != nullptr) keep(out_host_, out_scratch_.data(), out_scratch_.size());
    } else {
      for (size_t r = 0; r < row_hosts_.size(); ++r) {
        std::memcpy(row_hosts_[r], rows_out_.data() + r * size_t(row_width_), size_t(row_width_) * sizeof(float));
      }
    }
    row_hosts_.clear();
    out_host_ = nullptr;
    if (!step_error_.is_ok()) {
      drop_queued();
      return step_error_;
    }
    if (queue) {
      held_.push_back(std::move(draw_writes_));
      draw_writes_.clear();
      return Status::ok();
    }
    for (const auto &[host, v] : draw_writes_) *host = v;
    draw_writes_.clear();
    return Status::ok();
  }

  void defer_outputs(bool on) override { defer_ = on && emulate_defer_; }
  bool outputs_deferred() const override { return !deferred_.empty(); }
  Status fetch_outputs() override {
    for (Deferred &d : deferred_) std::copy(d.row.begin(), d.row.end(), d.host);
    deferred_.clear();
    return Status::ok();
  }
  bool hands_off_outputs() const override { return emulate_defer_; }
  Status hand_off_outputs(float *const *hosts, Exec *const *owners, size_t n, bool *kept) override {
    for (size_t i = 0; i < n; ++i) kept[i] = false;
    size_t own = 0;  // this exec's own rows, compacted in place
    for (size_t j = 0; j < deferred_.size(); ++j) {
      Deferred &d = deferred_[j];
      size_t i = 0;
      while (i < n && hosts[i] != d.host) ++i;
      auto *to = i < n ? dynamic_cast<CpuExec *>(owners[i]) : nullptr;
      if (to == nullptr) {
        std::copy(d.row.begin(), d.row.end(), d.host);
        continue;
      }
      kept[i] = true;
      if (to == this) {
        if (own != j) deferred_[own] = std::move(d);
        ++own;
      } else {
        to->deferred_.clear();  // its own rows are older than this one
        to->deferred_.push_back(std::move(d));
      }
    }
    deferred_.resize(own);
    return Status::ok();
  }
  bool can_queue() const override { return emulate_queue_; }
  void queue_next_step() override { queue_next_ = emulate_queue_; }
  void feed_drawn() override { feed_next_ = true; }
  Status wait_queued() override {
    if (held_.empty()) return Status::ok();
    const std::vector<std::pair<int32_t *, int32_t>> w = std::move(held_.front());
    held_.pop_front();
    if (inject_wait_at_ > 0 && ++waits_ == inject_wait_at_) {
      drop_queued();
      return Status(GEIST_E_INTERNAL, "running the forward pass on CPU: injected fault (GEIST_CPU_INJECT_WAIT_FAULT)");
    }
    for (const auto &[host, v] : w) *host = v;
    return Status::ok();
  }
  void drop_queued() override {
    held_.clear();
    last_drawn_ = -1;
    queue_next_ = feed_next_ = false;
  }

  void embed(const WeightView &table, float scale, Act out) override {
    const OpProfile::Scope ps = scope("embedding");
    int r = 0;
    while (r < n_rows_) {  // runs of ids the table has, gathered together
      int e = r;
      while (e < n_rows_ && tokens_[e] < table.n_out) ++e;
      if (e > r) cpu::embedding_gather(table, tokens_ + r, e - r, scale, out.rows_from(r).p, *pool_);
      if (e < n_rows_) std::fill_n(out.rows_from(e).p, out.width, 0.0f);
      r = e + 1;
    }
  }
  void matmul(const WeightView *const *ws, int n_mat, Act x, const Act *ys, int n_rows) override {
    std::string label;
    if (profile_) {
      for (int m = 0; m < n_mat; ++m) {
        label += std::string(m ? " + " : "matmul ") + quant::type_name(ws[m]->type) + " " +
                 std::to_string(ws[m]->n_in) + "x" + std::to_string(ws[m]->n_out);
      }
    }
    const OpProfile::Scope ps(profile_.get(), profile_ ? profile_label(label, n_rows) : std::string());
    if (n_mat == 1) {
      cpu::matmul(*ws[0], x.p, ys[0].p, n_rows, *pool_);
      return;
    }
    float *y[4];
    for (int m = 0; m < n_mat; ++m) y[m] = ys[m].p;
    cpu::matmul_shared_input(ws, n_mat, x.p, y, n_rows, *pool_);
  }
  void rmsnorm(Act x, const WeightView *g, int64_t n_vec, int64_t dim, float eps, Act out) override {
    const OpProfile::Scope ps = scope("rmsnorm");
    const float *gp = g ? reinterpret_cast<const float *>(g->data) : nullptr;
    if (out.p == x.p) {
      cpu::rmsnorm(x.p, gp, n_vec, dim, eps, *pool_);
    } else {
      cpu::rmsnorm_to(x.p, gp, out.p, n_vec, dim, eps, *pool_);
    }
  }
  void rope(Act x, int n_rows, int n_heads, int head_dim, int rot_dim, Act cs) override {
    const OpProfile::Scope ps = scope("rope");
    cpu::rope_neox(x.p, n_rows, n_heads, head_dim, rot_dim, cs.p, *pool_);
  }
  void kv_append(int l, Act k, Act v) override {
    const OpProfile::Scope ps = scope("storing KV rows");
    for (const Seq &q : seqs_) q.kv->append(l, q.pos0, q.n, k.rows_from(q.row0).p, v.rows_from(q.row0).p, *pool_);
  }
  void attention(int l, Act q, Act out, int n_head, int head_dim, int window, float scale) override {
    // Global layers read every cached position, sliding ones at most the window.
    const OpProfile::Scope ps = scope(window > 0 ? "attention, sliding" : "attention, global");
    attn_args_.clear();
    for (const Seq &sq : seqs_) {
      const CpuKvStore &c = *sq.kv;
      attn_args_.push_back({q.rows_from(sq.row0).p,
                            c.k(l),
                            c.v(l),
                            out.rows_from(sq.row0).p,
                            sq.n,
                            sq.pos0,
                            c.capacity(l),
                            n_head,
                            int(c.spec(l).row_floats / head_dim),
                            head_dim,
                            window,
                            scale,
                            c.type_k(),
                            c.type_v()});
    }
    // Every sequence's queries in one call: two pool runs per layer, not two per sequence.
    cpu::attention_seqs(attn_args_.data(), int(attn_args_.size()), *pool_);
  }
  void gelu_mul(Act gate, Act up, Act out, int64_t n) override {
    const OpProfile::Scope ps = scope("gelu_mul");
    cpu::gelu_mul(gate.p, up.p, out.p, n, *pool_);
  }
  void add(Act x, Act y, int64_t n) override {
    const OpProfile::Scope ps = scope("add");
    cpu::add_inplace(x.p, y.p, n, *pool_);
  }
  void scale(Act x, float s, int64_t n) override {
    const OpProfile::Scope ps = scope("scale");
    cpu::scale_inplace(x.p, s, n, *pool_);
  }
  void add_scale(Act x, Act y, float s, int64_t n) override {
    const OpProfile::Scope ps = scope("add_scale");
    cpu::add_scale_inplace(x.p, y.p, s, n, *pool_);
  }
  void softcap(Act x, float cap, int64_t n) override {
    const OpProfile::Scope ps = scope("softcap");
    cpu::softcap(x.p, cap, n, *pool_);
  }
  void copy_cols(Act src, int64_t col0, Act dst, int n_rows) override {
    const OpProfile::Scope ps = scope("copy_cols");
    const auto rows = [&](int r0, int r1) {
      for (int r = r0; r < r1; ++r) {
        std::memcpy(dst.rows_from(r).p, src.rows_from(r).p + col0, sizeof(float) * size_t(dst.width));
      }
    };
    if (n_rows < 16) return rows(0, n_rows);
    const int per = (n_rows + pool_->n_threads() - 1) / pool_->n_threads();
    pool_->run((n_rows + per - 1) / per, [&](int t, int) { rows(t * per, std::min(n_rows, (t + 1) * per)); });
  }

 private:
  OpProfile::Scope scope(const char *op) {
    return OpProfile::Scope(profile_.get(), profile_ ? profile_label(op, n_rows_) : std::string());
  }

  // The process's pool of this many threads, shared with every other session asking for as
  // many (ThreadPool::shared): N sessions do not start N pools.
  std::shared_ptr<ThreadPool> pool_;
  std::unique_ptr<OpProfile> profile_;  // GEIST_PROFILE=1
  int max_rows_;
  std::vector<std::vector<float>> bufs_;
  std::vector<float> rows_out_;      // output_rows: the step's rows, copied out at end_step
  // GEIST_CPU_DEFER=1: the deferred outputs (defer_outputs), and output()'s rows while deferring.
  struct Deferred {
    float *host;
    std::vector<float> row;
  };
  void keep(float *host, const float *row, size_t n) {
    deferred_.push_back({host, std::vector<float>(row, row + n)});
    std::fill_n(host, n, std::numeric_limits<float>::quiet_NaN());
  }
  std::vector<Deferred> deferred_;
  std::vector<float> out_scratch_;
  float *out_host_ = nullptr;
  bool emulate_defer_ = false, defer_ = false;
  std::vector<std::pair<int, DrawSpec>> draw_rows_;  // draw: the rows wanted
  std::vector<std::vector<std::pair<float, int32_t>>> draw_cand_;  // and their sampled draws' scratch
  std::vector<std::vector<double>> draw_pr_;
  // This step's drawn tokens and their hosts: written at end_step, or for a queued step
  // (GEIST_CPU_QUEUE=1) held until wait_queued (held_, oldest first).
  std::vector<std::pair<int32_t *, int32_t>> draw_writes_;
  std::deque<std::vector<std::pair<int32_t *, int32_t>>> held_;
  int32_t last_drawn_ = -1;  // the last step's one drawn token, for a fed step
  int32_t fed_token_ = 0;
  Status step_error_;
  bool emulate_queue_ = false, queue_next_ = false, feed_next_ = false;
  long long inject_wait_at_ = 0, waits_ = 0;
  std::vector<float *> row_hosts_;
  int64_t row_width_ = 0;
  // The step's sequences: rows [row0, row0 + n) at positions pos0.. of kv.
  struct Seq {
    CpuKvStore *kv;
    int row0, n;
    int64_t pos0;
  };
  const int32_t *tokens_ = nullptr;
  int n_rows_ = 0;
  std::vector<Seq> seqs_;
  std::vector<cpu::AttentionArgs> attn_args_;  // attention()'s per-sequence arguments
};

class CpuBackend final : public Backend {
 public:
  const char *name() const override { return "cpu"; }
  std::string device() const override { return "CPU, " + cpu::isa_description() + " tier"; }

  // Repack the matrices for the tier in use, one at a time, releasing each one's mapped
  // pages after it is packed: the process then holds one copy of the weights. Tables
  // stay in the mapping (a lookup touches one row); when the output head is the token
  // embedding (tied), the head's packed copy is separate and the embedding rows fault
  // back in as tokens are seen.
  Status prepare(const ModelWeights &w, const std::function<void(const void *, size_t)> &release) override {
    const double t0 = now_seconds();
    ThreadPool pack_pool(ThreadPool::hardware_threads());
    for (WeightView *m : w.matrices) {
      if (m->data && cpu::pack_weight(m, &packed_, &pack_pool)) release(m->data, m->row_bytes * size_t(m->n_out));
    }
    seconds_ = now_seconds() - t0;
    return Status::ok();
  }
  uint64_t weight_bytes() const override { return packed_.bytes(); }
  double prepare_seconds() const override { return seconds_; }

  Result<std::unique_ptr<KvStore>> create_kv(const std::vector<KvLayerSpec> &layers, int64_t n_ctx, int max_chunk,
                                             KvType tk, KvType tv) override {
    GEIST_RETURN_IF_ERROR(check_kv_args(layers, n_ctx, max_chunk, tk, tv));
    std::unique_ptr<CpuKvStore> c;
    GEIST_ASSIGN_OR_RETURN(c, CpuKvStore::create(layers, n_ctx, max_chunk, tk, tv));
    return std::unique_ptr<KvStore>(std::move(c));
  }
  Result<std::unique_ptr<Exec>> create_exec(int n_threads, int max_chunk) override {
    const int t = n_threads > 0 ? n_threads : ThreadPool::hardware_threads();
    return std::unique_ptr<Exec>(new CpuExec(t, max_chunk));
  }

 private:
  cpu::PackedStore packed_;
  double seconds_ = 0;
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend() { return std::make_unique<CpuBackend>(); }

}  // namespace geist

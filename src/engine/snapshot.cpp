// Session snapshots: the image format of docs/SNAPSHOT.md, written and read here.
//
// Layout (little-endian; sections follow each other without padding):
//   header   72 bytes: magic "GEISTSNP", u32 version, u32 flags, u64 total size,
//            u64 checksum (XXH3-64 of bytes [32, total)), u64 model fingerprint,
//            u64 n_vocab, u64 n_tokens, u64 n_pinned, u32 n_layers,
//            u8 type_k, u8 type_v (KvType; version 1: both 0 = f32), u16 reserved (0)
//   layers   n_layers x {u64 row_floats, u32 window, u32 rows}   (rows: KV rows stored)
//   tokens   i32 x n_tokens
//   logits   f32 x n_vocab                           if flags & kHasLogits
//   sampler  u64 rng[4], u64 n_history, i32 x n_history
//   pin      u64 rng[4], u64 n_history, i32 x n_history, f32 x n_vocab   if n_pinned > 0
//   kv       per layer: K rows then V rows of positions [from_l, n_tokens), row_floats
//            elements each in type_k / type_v (backends/kv_type.h); from_l = 0 for
//            global layers, max(0, n_tokens - (W - 1)) for sliding
//   ckpt     per sliding layer: K then V rows of positions [max(0, P - (W - 1)), P)
//            if n_pinned = P > 0 and not flags & kCheckpointLive (then n_tokens == P and
//            the checkpoint is the kv section's rows)
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>
#include <xxhash.h>

#include "base/timer.h"
#include "engine/session.h"
#include "engine/snapshot_file.h"

namespace geist {
namespace {

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "snapshot I/O assumes a little-endian host");

constexpr const char *kMagic = kSnapshotMagic;
constexpr uint32_t kVersion = 2;  // 2: KV types in the header; version 1 images (f32) still read
constexpr uint32_t kHasLogits = 1u << 0;
constexpr uint32_t kCheckpointLive = 1u << 1;
constexpr uint32_t kKnownFlags = kHasLogits | kCheckpointLive;
constexpr size_t kHeaderBytes = 72;
constexpr size_t kChecksumFrom = 32;
// Header fields load_file reads before the rest (the layout above).
constexpr size_t kOffVersion = 8, kOffTotal = 16, kOffFingerprint = 32;
constexpr size_t kLayerBytes = 16;

class Writer {
 public:
  explicit Writer(uint8_t *p) : p_(p) {}
  void bytes(const void *src, size_t n) {
    if (n) std::memcpy(p_ + off_, src, n);
    off_ += n;
  }
  template <typename T>
  void put(T v) { bytes(&v, sizeof v); }
  void skip(size_t n) { off_ += n; }  // bytes written in place by the caller
  size_t offset() const { return off_; }

 private:
  uint8_t *p_;
  size_t off_ = 0;
};

// Bounds-checked reads; any overrun sets failed() and reads zeros.
class Reader {
 public:
  Reader(const uint8_t *p, size_t n) : p_(p), n_(n) {}
  bool take(void *dst, size_t n) {
    if (bad_ || n > n_ - off_) {
      bad_ = true;
      if (dst && n) std::memset(dst, 0, n);
      return false;
    }
    if (dst && n) std::memcpy(dst, p_ + off_, n);
    off_ += n;
    return true;
  }
  template <typename T>
  T get() {
    T v{};
    take(&v, sizeof v);
    return v;
  }
  // Pointer to the next n bytes, advanced past; nullptr if not there.
  const uint8_t *span(size_t n) {
    if (bad_ || n > n_ - off_) {
      bad_ = true;
      return nullptr;
    }
    const uint8_t *r = p_ + off_;
    off_ += n;
    return r;
  }
  bool failed() const { return bad_; }
  size_t offset() const { return off_; }

 private:
  const uint8_t *p_;
  size_t n_;
  size_t off_ = 0;
  bool bad_ = false;
};

// n * size, or SIZE_MAX on overflow.
size_t mul(uint64_t n, uint64_t size) {
  if (size != 0 && n > SIZE_MAX / size) return SIZE_MAX;
  return static_cast<size_t>(n * size);
}

}  // namespace

size_t Session::snapshot_size() const {
  const size_t nv = size_t(n_vocab());
  const int64_t n = int64_t(tokens_.size());
  size_t b = kHeaderBytes + kLayerBytes * size_t(cache_->n_layers());
  b += sizeof(int32_t) * tokens_.size();
  if (has_logits_) b += sizeof(float) * nv;
  b += 40 + sizeof(int32_t) * sampler_.state().history.size();
  const bool live = pin_ && pin_->n == tokens_.size();
  if (pin_) b += 40 + sizeof(int32_t) * pin_->sampler.history.size() + sizeof(float) * nv;
  for (int l = 0; l < cache_->n_layers(); ++l) {
    b += cache_->block_bytes(l, n - cache_->first_live(l, n));
    if (pin_ && !live && cache_->spec(l).window > 0) {
      b += cache_->block_bytes(l, int64_t(pin_->n) - cache_->first_live(l, int64_t(pin_->n)));
    }
  }
  return b;
}

Status Session::snapshot(void *buf, size_t cap, size_t *written) const {
  if (written == nullptr) return GEIST_ERROR(GEIST_E_INVALID_ARGUMENT, "written is NULL");
  const size_t size = snapshot_size();
  *written = size;
  if (cap < size) {
    return GEIST_ERROR(GEIST_E_BUFFER_TOO_SMALL, "the snapshot needs %zu bytes, the buffer holds %zu", size, cap);
  }
  if (buf == nullptr) return GEIST_ERROR(GEIST_E_INVALID_ARGUMENT, "buf is NULL");
  Timer t;
  const int64_t n = int64_t(tokens_.size());
  const size_t nv = size_t(n_vocab());
  const bool live = pin_ && pin_->n == tokens_.size();
  uint8_t *base = static_cast<uint8_t *>(buf);
  Writer w(base);
  w.bytes(kMagic, 8);
  w.put<uint32_t>(kVersion);
  w.put<uint32_t>((has_logits_ ? kHasLogits : 0) | (live ? kCheckpointLive : 0));
  w.put<uint64_t>(size);
  w.put<uint64_t>(0);  // checksum, filled in last
  w.put<uint64_t>(model_.fingerprint());
  w.put<uint64_t>(nv);
  w.put<uint64_t>(uint64_t(n));
  w.put<uint64_t>(n_pinned());
  w.put<uint32_t>(uint32_t(cache_->n_layers()));
  w.put<uint8_t>(uint8_t(cache_->type_k()));
  w.put<uint8_t>(uint8_t(cache_->type_v()));
  w.put<uint16_t>(0);
  for (int l = 0; l < cache_->n_layers(); ++l) {
    w.put<uint64_t>(uint64_t(cache_->spec(l).row_floats));
    w.put<uint32_t>(uint32_t(cache_->spec(l).window));
    w.put<uint32_t>(uint32_t(n - cache_->first_live(l, n)));
  }
  w.bytes(tokens_.data(), sizeof(int32_t) * tokens_.size());
  if (has_logits_) w.bytes(logits_.get(), sizeof(float) * nv);
  auto put_sampler = [&](const Sampler::State &st) {
    for (uint64_t r : st.rng) w.put<uint64_t>(r);
    w.put<uint64_t>(st.history.size());
    w.bytes(st.history.data(), sizeof(int32_t) * st.history.size());
  };
  put_sampler(sampler_.state());
  if (pin_) {
    put_sampler(pin_->sampler);
    w.bytes(pin_->logits.data(), sizeof(float) * nv);
  }
  for (int l = 0; l < cache_->n_layers(); ++l) {
    const int64_t from = cache_->first_live(l, n);
    cache_->read_rows(l, from, n, base + w.offset());
    w.skip(cache_->block_bytes(l, n - from));
  }
  if (pin_ && !live) {
    for (int l = 0; l < cache_->n_layers(); ++l) {
      if (cache_->spec(l).window == 0) continue;
      cache_->read_checkpoint(l, int64_t(pin_->n), base + w.offset());
      w.skip(cache_->block_bytes(l, int64_t(pin_->n) - cache_->first_live(l, int64_t(pin_->n))));
    }
  }
  GEIST_CHECK(w.offset() == size, "snapshot size and layout disagree");
  const uint64_t sum = XXH3_64bits(base + kChecksumFrom, size - kChecksumFrom);
  std::memcpy(base + 24, &sum, 8);
  stats_.snapshot_seconds += t.seconds();
  stats_.n_snapshots += 1;
  return Status::ok();
}

Status Session::restore(const void *buf, size_t size) {
  if (buf == nullptr) return GEIST_ERROR(GEIST_E_INVALID_ARGUMENT, "snapshot buffer is NULL");
  Timer t;
  const uint8_t *base = static_cast<const uint8_t *>(buf);
  if (size < kHeaderBytes || std::memcmp(base, kMagic, 8) != 0) {
    return GEIST_ERROR(GEIST_E_BAD_FORMAT, "not a geist session snapshot (%zu bytes, no GEISTSNP header)", size);
  }
  Reader r(base, size);
  r.span(8);
  const uint32_t version = r.get<uint32_t>();
  const uint32_t flags = r.get<uint32_t>();
  const uint64_t total = r.get<uint64_t>();
  const uint64_t sum = r.get<uint64_t>();
  if (version != 1 && version != kVersion) {
    return GEIST_ERROR(GEIST_E_UNSUPPORTED, "snapshot version %u; this build reads versions 1 and %u", version,
                       kVersion);
  }
  if (total != size) {
    return GEIST_ERROR(GEIST_E_BAD_FORMAT, "snapshot is %zu bytes but its header says %llu (truncated?)", size,
                       (unsigned long long)total);
  }
  if (XXH3_64bits(base + kChecksumFrom, size - kChecksumFrom) != sum) {
    return GEIST_ERROR(GEIST_E_BAD_FORMAT, "snapshot checksum mismatch: the image is corrupt");
  }
  if (flags & ~kKnownFlags) return GEIST_ERROR(GEIST_E_BAD_FORMAT, "snapshot has unknown flags 0x%x", flags);
  const uint64_t fingerprint = r.get<uint64_t>();
  const uint64_t nv = r.get<uint64_t>();
  const uint64_t n = r.get<uint64_t>();
  const uint64_t n_pin = r.get<uint64_t>();
  const uint32_t n_layers = r.get<uint32_t>();
  const uint8_t type_k = r.get<uint8_t>(), type_v = r.get<uint8_t>();
  const uint16_t reserved = r.get<uint16_t>();
  if (fingerprint != model_.fingerprint()) {
    return GEIST_ERROR(GEIST_E_MISMATCH, "snapshot was made with another model (fingerprint %016llx, this model %016llx)",
                       (unsigned long long)fingerprint, (unsigned long long)model_.fingerprint());
  }
  if (nv != uint64_t(n_vocab()) || n_layers != uint32_t(cache_->n_layers())) {
    return GEIST_ERROR(GEIST_E_MISMATCH, "snapshot geometry (%llu layers, vocabulary %llu) differs from the model's "
                       "(%d, %lld)", (unsigned long long)n_layers, (unsigned long long)nv, cache_->n_layers(),
                       (long long)n_vocab());
  }
  if (reserved != 0 || n_pin > n || type_k > uint8_t(KvType::Q8_0) || type_v > uint8_t(KvType::Q8_0) ||
      (version == 1 && (type_k != 0 || type_v != 0))) {
    return GEIST_ERROR(GEIST_E_BAD_FORMAT, "snapshot header is inconsistent");
  }
  if (KvType(type_k) != cache_->type_k() || KvType(type_v) != cache_->type_v()) {
    return GEIST_ERROR(GEIST_E_MISMATCH, "snapshot has a KV cache of %s K / %s V rows; this session's is %s / %s",
                       kv_type_name(KvType(type_k)), kv_type_name(KvType(type_v)), kv_type_name(cache_->type_k()),
                       kv_type_name(cache_->type_v()));
  }
  const bool has_logits = flags & kHasLogits, live = flags & kCheckpointLive;
  // live exactly when the pin is at the end: the writer's only form for n_pinned ==
  // n_tokens (a separate checkpoint could then disagree with the kv rows it duplicates).
  if ((n > 0) != has_logits || live != (n_pin > 0 && n_pin == n)) {
    return GEIST_ERROR(GEIST_E_BAD_FORMAT, "snapshot flags disagree with its token counts");
  }
  if (n > uint64_t(cache_->n_ctx())) {
    return GEIST_ERROR(GEIST_E_CONTEXT_FULL, "snapshot holds %llu tokens; this session's context is %lld",
                       (unsigned long long)n, (long long)cache_->n_ctx());
  }
  for (int l = 0; l < cache_->n_layers(); ++l) {
    const uint64_t rf = r.get<uint64_t>();
    const uint32_t window = r.get<uint32_t>();
    const uint32_t rows = r.get<uint32_t>();
    if (r.failed()) break;
    if (rf != uint64_t(cache_->spec(l).row_floats) || window != uint32_t(cache_->spec(l).window)) {
      return GEIST_ERROR(GEIST_E_MISMATCH, "snapshot layer %d has KV rows of %llu floats, window %u; the model's "
                         "are %lld, %d", l, (unsigned long long)rf, window, (long long)cache_->spec(l).row_floats,
                         cache_->spec(l).window);
    }
    if (rows != uint64_t(int64_t(n) - cache_->first_live(l, int64_t(n)))) {
      return GEIST_ERROR(GEIST_E_BAD_FORMAT, "snapshot layer %d stores %u rows, expected %lld", l, rows,
                         (long long)(int64_t(n) - cache_->first_live(l, int64_t(n))));
    }
  }
  const uint8_t *tok = r.span(mul(n, 4));
  const uint8_t *logits = has_logits ? r.span(mul(nv, 4)) : nullptr;
  Sampler::State sst, pst;
  auto get_sampler = [&](Sampler::State *st) -> bool {
    for (uint64_t &x : st->rng) x = r.get<uint64_t>();
    const uint64_t nh = r.get<uint64_t>();
    if (r.failed() || nh > (size - r.offset()) / 4) return false;
    st->history.resize(nh);
    return r.take(st->history.data(), nh * 4);
  };
  if (r.failed() || !get_sampler(&sst)) return GEIST_ERROR(GEIST_E_BAD_FORMAT, "snapshot is truncated");
  const uint8_t *pin_logits = nullptr;
  if (n_pin > 0) {
    if (!get_sampler(&pst)) return GEIST_ERROR(GEIST_E_BAD_FORMAT, "snapshot is truncated");
    pin_logits = r.span(mul(nv, 4));
  }
  std::vector<const uint8_t *> kv(cache_->n_layers()), ck(cache_->n_layers(), nullptr);
  for (int l = 0; l < cache_->n_layers(); ++l) {
    const uint64_t rows = uint64_t(int64_t(n) - cache_->first_live(l, int64_t(n)));
    kv[l] = r.span(mul(rows, cache_->row_bytes_k(l) + cache_->row_bytes_v(l)));
  }
  if (n_pin > 0 && !live) {
    for (int l = 0; l < cache_->n_layers(); ++l) {
      if (cache_->spec(l).window == 0) continue;
      const uint64_t rows = uint64_t(int64_t(n_pin) - cache_->first_live(l, int64_t(n_pin)));
      ck[l] = r.span(mul(rows, cache_->row_bytes_k(l) + cache_->row_bytes_v(l)));
    }
  }
  if (r.failed() || r.offset() != size) {
    return GEIST_ERROR(GEIST_E_BAD_FORMAT, "snapshot sections do not add up to its size (%s)",
                       r.failed() ? "truncated" : "trailing bytes");
  }
  for (uint64_t i = 0; i < n; ++i) {
    int32_t id;
    std::memcpy(&id, tok + 4 * i, 4);
    if (id < 0 || int64_t(id) >= n_vocab()) {
      return GEIST_ERROR(GEIST_E_BAD_FORMAT, "snapshot token %llu has id %d outside the vocabulary",
                         (unsigned long long)i, id);
    }
  }

  // Everything is validated. Stage what needs memory, then commit: nothing below the
  // sampler's set_state fails, and that leaves the session unchanged if it does. A serving
  // loop restores the same image before every request, so the session's own buffers (the
  // tokens, the pin's logits and sampler history) already have the capacity and are
  // overwritten in place, and the checkpoint rows go to the KV store's own checkpoint
  // (reserved with the store): a restore then allocates only the sampler's history. (Building a new pin every time, ~8 MiB on Gemma 3 270M, and freeing the old
  // one after, left the heap holding both: RSS rose for the first requests; issue 12,
  // finding 11.)
  std::vector<int32_t> new_tokens;
  if (tokens_.capacity() < n) new_tokens.reserve(n);
  const bool reuse_pin = n_pin > 0 && pin_ && pin_->logits.capacity() >= nv &&
                         pin_->sampler.history.capacity() >= pst.history.size();
  std::unique_ptr<Pin> new_pin;
  if (n_pin > 0 && !reuse_pin) {
    new_pin = std::make_unique<Pin>();
    new_pin->logits.reserve(nv);
  }
  sampler_.set_state(sst);  // the last step that can fail (strong guarantee)

  // Commit (no allocation below: every resize is within capacity).
  if (new_tokens.capacity() > 0) tokens_.swap(new_tokens);
  tokens_.resize(n);
  if (n) std::memcpy(tokens_.data(), tok, n * 4);
  if (has_logits) std::memcpy(logits_.get(), logits, nv * 4);
  has_logits_ = has_logits;
  if (new_pin) pin_ = std::move(new_pin);
  if (n_pin == 0) pin_.reset();
  if (pin_) {
    Pin &pin = *pin_;
    pin.n = n_pin;
    pin.logits.resize(nv);
    std::memcpy(pin.logits.data(), pin_logits, nv * 4);
    for (int i = 0; i < 4; ++i) pin.sampler.rng[i] = pst.rng[i];
    if (pin.sampler.history.capacity() >= pst.history.size()) {
      pin.sampler.history.assign(pst.history.begin(), pst.history.end());
    } else {
      pin.sampler.history.swap(pst.history);  // a new pin: take the staged vector
    }
  }
  // The checkpoint rows to the store's checkpoint and to the rings, then the live rows, so
  // each ring slot ends holding the latest position, as after an uninterrupted run. live:
  // the checkpoint rows are the kv section's rows (same positions).
  for (int l = 0; l < cache_->n_layers(); ++l) {
    if (pin_ && cache_->spec(l).window > 0) {
      const uint8_t *rows = live ? kv[l] : ck[l];
      cache_->write_checkpoint(l, int64_t(n_pin), rows);
      cache_->write_rows(l, cache_->first_live(l, int64_t(n_pin)), int64_t(n_pin), rows);
    }
    const int64_t from = cache_->first_live(l, int64_t(n));
    cache_->write_rows(l, from, int64_t(n), kv[l]);  // copies with memcpy: no alignment needed
  }
  cache_->n_past = int64_t(n);
  stats_.restore_seconds += t.seconds();
  stats_.n_restores += 1;
  return Status::ok();
}

Status Session::save_file(const std::string &path) const {
  // The target is checked before the image is built: a refused path costs nothing.
  GEIST_RETURN_IF_ERROR(check_snapshot_target(path));
  std::vector<uint8_t> img(snapshot_size());
  size_t written = 0;
  GEIST_RETURN_IF_ERROR(snapshot(img.data(), img.size(), &written));
  return write_snapshot_file(path, img.data(), written);
}

Status Session::load_file(const std::string &path) {
  // The header is checked before the rest is read: a large file that is not a snapshot
  // of this model costs 72 bytes of reading, not its size in memory.
  auto check = [&](const uint8_t *h, size_t got, uint64_t file_size) -> Status {
    if (got < kHeaderBytes || std::memcmp(h, kSnapshotMagic, 8) != 0) {
      return GEIST_ERROR(GEIST_E_BAD_FORMAT, "'%s' is not a geist session snapshot (%llu bytes, no GEISTSNP header)",
                         path.c_str(), (unsigned long long)file_size);
    }
    uint32_t version;
    uint64_t total, fingerprint;
    std::memcpy(&version, h + kOffVersion, 4);
    std::memcpy(&total, h + kOffTotal, 8);
    std::memcpy(&fingerprint, h + kOffFingerprint, 8);
    if (version != 1 && version != kVersion) {
      return GEIST_ERROR(GEIST_E_UNSUPPORTED, "'%s': snapshot version %u; this build reads versions 1 and %u",
                         path.c_str(), version, kVersion);
    }
    if (total != file_size) {
      return GEIST_ERROR(GEIST_E_BAD_FORMAT, "'%s': snapshot is %llu bytes but its header says %llu (truncated?)",
                         path.c_str(), (unsigned long long)file_size, (unsigned long long)total);
    }
    if (fingerprint != model_.fingerprint()) {
      return GEIST_ERROR(GEIST_E_MISMATCH,
                         "'%s': snapshot was made with another model (fingerprint %016llx, this model %016llx)",
                         path.c_str(), (unsigned long long)fingerprint, (unsigned long long)model_.fingerprint());
    }
    return Status::ok();
  };
  std::vector<uint8_t> img;
  GEIST_RETURN_IF_ERROR(read_snapshot_file(path, kHeaderBytes, check, &img));
  Status s = restore(img.data(), img.size());
  if (!s) return Status(s.code(), "'" + path + "': " + s.message());
  return s;
}

}  // namespace geist

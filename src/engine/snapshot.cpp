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
#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <vector>
#include <xxhash.h>

#include "base/timer.h"
#include "engine/session.h"
#include "engine/snapshot_file.h"

namespace geist {

// What an image holds besides its KV rows, by reference: a session's or a saved state's.
struct ImageParts {
  uint64_t fingerprint = 0;
  size_t nv = 0, n_pin = 0;
  const std::vector<KvLayerSpec> *layers = nullptr;
  KvType tk = KvType::F32, tv = KvType::F32;
  const std::vector<int32_t> *tokens = nullptr;
  const float *logits = nullptr;  // null: no logits
  const Sampler::State *sampler = nullptr;
  const Sampler::State *pin_sampler = nullptr;  // read when n_pin > 0
  const float *pin_logits = nullptr;
  size_t n() const { return tokens->size(); }
  // The pin's checkpoint is the kv section's rows when the pin is at the end.
  bool live() const { return n_pin > 0 && n_pin == n(); }
};

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

// KvStore::first_live and block_bytes for a layer spec without a store (saved states).
int64_t first_live(const KvLayerSpec &s, int64_t n) {
  return s.window > 0 && n > s.window - 1 ? n - (s.window - 1) : 0;
}
size_t block_bytes(KvType tk, KvType tv, const KvLayerSpec &s, int64_t n) {
  return size_t(n) * (kv_row_bytes(tk, s.row_floats) + kv_row_bytes(tv, s.row_floats));
}


// Bytes of the kv and ckpt sections.
size_t kv_sections_bytes(const ImageParts &p) {
  const int64_t n = int64_t(p.n()), np = int64_t(p.n_pin);
  size_t b = 0;
  for (const KvLayerSpec &s : *p.layers) {
    b += block_bytes(p.tk, p.tv, s, n - first_live(s, n));
    if (np > 0 && !p.live() && s.window > 0) b += block_bytes(p.tk, p.tv, s, np - first_live(s, np));
  }
  return b;
}

size_t image_size(const ImageParts &p) {
  size_t b = kHeaderBytes + kLayerBytes * p.layers->size() + sizeof(int32_t) * p.n();
  if (p.logits) b += sizeof(float) * p.nv;
  b += 40 + sizeof(int32_t) * p.sampler->history.size();
  if (p.n_pin > 0) b += 40 + sizeof(int32_t) * p.pin_sampler->history.size() + sizeof(float) * p.nv;
  return b + kv_sections_bytes(p);
}

// Writes the image_size(p) bytes of p's image at base; read_kv writes the kv and ckpt
// sections (kv_sections_bytes(p)) at the pointer it is given.
Status write_image(const ImageParts &p, uint8_t *base, const std::function<Status(uint8_t *)> &read_kv) {
  const size_t size = image_size(p);
  const int64_t n = int64_t(p.n());
  Writer w(base);
  w.bytes(kMagic, 8);
  w.put<uint32_t>(kVersion);
  w.put<uint32_t>((p.logits ? kHasLogits : 0) | (p.live() ? kCheckpointLive : 0));
  w.put<uint64_t>(size);
  w.put<uint64_t>(0);  // checksum, filled in last
  w.put<uint64_t>(p.fingerprint);
  w.put<uint64_t>(p.nv);
  w.put<uint64_t>(uint64_t(n));
  w.put<uint64_t>(p.n_pin);
  w.put<uint32_t>(uint32_t(p.layers->size()));
  w.put<uint8_t>(uint8_t(p.tk));
  w.put<uint8_t>(uint8_t(p.tv));
  w.put<uint16_t>(0);
  for (const KvLayerSpec &s : *p.layers) {
    w.put<uint64_t>(uint64_t(s.row_floats));
    w.put<uint32_t>(uint32_t(s.window));
    w.put<uint32_t>(uint32_t(n - first_live(s, n)));
  }
  w.bytes(p.tokens->data(), sizeof(int32_t) * p.n());
  if (p.logits) w.bytes(p.logits, sizeof(float) * p.nv);
  auto put_sampler = [&](const Sampler::State &st) {
    for (uint64_t r : st.rng) w.put<uint64_t>(r);
    w.put<uint64_t>(st.history.size());
    w.bytes(st.history.data(), sizeof(int32_t) * st.history.size());
  };
  put_sampler(*p.sampler);
  if (p.n_pin > 0) {
    put_sampler(*p.pin_sampler);
    w.bytes(p.pin_logits, sizeof(float) * p.nv);
  }
  GEIST_RETURN_IF_ERROR(read_kv(base + w.offset()));
  w.skip(kv_sections_bytes(p));
  GEIST_CHECK(w.offset() == size, "snapshot size and layout disagree");
  const uint64_t sum = XXH3_64bits(base + kChecksumFrom, size - kChecksumFrom);
  std::memcpy(base + 24, &sum, 8);
  return Status::ok();
}

// The KV buffer a state is given for kv bytes: rounded up to a multiple of an eighth of
// its highest power of two (at most 1/8 more), so that a state reused for a prompt a few
// tokens longer (a server's cache saves into evicted states) keeps its buffer.
size_t kv_buffer_bytes(size_t kv) {
  const size_t step = std::max<size_t>(1, std::bit_floor(kv) / 8);
  const size_t r = kv % step;
  return r == 0 || kv > SIZE_MAX - step ? kv : kv - r + step;
}

// The parts of an image (ImageParts) of a session's or a saved state's fields;
// pin_sampler and pin_logits are read only when n_pin > 0.
ImageParts state_parts(const std::vector<KvLayerSpec> &layers, KvType tk, KvType tv, const std::vector<int32_t> &tokens,
                       size_t nv, const float *logits, const Sampler::State &sampler, size_t n_pin,
                       const Sampler::State &pin_sampler, const float *pin_logits, uint64_t fingerprint) {
  ImageParts p;
  p.fingerprint = fingerprint;
  p.nv = nv;
  p.layers = &layers;
  p.tk = tk;
  p.tv = tv;
  p.tokens = &tokens;
  p.logits = logits;
  p.sampler = &sampler;
  p.n_pin = n_pin;
  p.pin_sampler = &pin_sampler;
  p.pin_logits = pin_logits;
  return p;
}

std::vector<KvLayerSpec> layer_specs(const KvStore &c) {
  std::vector<KvLayerSpec> v;
  v.reserve(size_t(c.n_layers()));
  for (int l = 0; l < c.n_layers(); ++l) v.push_back(c.spec(l));
  return v;
}

}  // namespace

// What restore and load_state hand to commit(): every count and section checked.
struct Session::Parts {
  size_t n = 0, n_pin = 0;
  bool has_logits = false;
  const uint8_t *tokens = nullptr;      // n int32, any alignment
  const uint8_t *logits = nullptr;      // n_vocab f32 when has_logits
  const uint8_t *pin_logits = nullptr;  // n_vocab f32 when n_pin > 0
  const Sampler::State *sampler = nullptr;
  // Per layer: the kv section's rows block, and for sliding layers the checkpoint's (the
  // kv block itself when the pin is at the end); host memory or a KvBuffer's.
  std::vector<const uint8_t *> kv, ck;
};

ImageParts Session::image_parts(const std::vector<KvLayerSpec> &layers, const Sampler::State &sampler) const {
  return state_parts(layers, cache_->type_k(), cache_->type_v(), tokens_, size_t(n_vocab()),
                     has_logits_ ? logits_.get() : nullptr, sampler, n_pinned(), pin_ ? pin_->sampler : sampler,
                     pin_ ? pin_->logits.data() : nullptr, model_.fingerprint());
}

size_t Session::snapshot_size() const {
  const std::vector<KvLayerSpec> layers = layer_specs(*cache_);
  const Sampler::State sst = sampler_.state();
  return image_size(image_parts(layers, sst));
}

Status Session::snapshot(void *buf, size_t cap, size_t *written) const {
  if (written == nullptr) return GEIST_ERROR(GEIST_E_INVALID_ARGUMENT, "written is NULL");
  const size_t size = snapshot_size();
  *written = size;
  if (cap < size) {
    return GEIST_ERROR(GEIST_E_BUFFER_TOO_SMALL, "the snapshot needs %zu bytes, the buffer holds %zu", size, cap);
  }
  if (buf == nullptr) return GEIST_ERROR(GEIST_E_INVALID_ARGUMENT, "buf is NULL");
  GEIST_RETURN_IF_ERROR(sync_logits());
  Timer t;
  const std::vector<KvLayerSpec> layers = layer_specs(*cache_);
  const Sampler::State sst = sampler_.state();
  const ImageParts p = image_parts(layers, sst);
  GEIST_RETURN_IF_ERROR(write_image(p, static_cast<uint8_t *>(buf), [&](uint8_t *dst) {
    read_kv_sections(dst);
    return Status::ok();
  }));
  stats_.snapshot_seconds += t.seconds();
  stats_.n_snapshots += 1;
  return Status::ok();
}

void Session::read_kv_sections(uint8_t *dst) const {
  const int64_t n = int64_t(tokens_.size());
  const bool live = pin_ && pin_->n == tokens_.size();
  size_t off = 0;
  for (int l = 0; l < cache_->n_layers(); ++l) {
    const int64_t from = cache_->first_live(l, n);
    cache_->read_rows(l, from, n, dst + off);
    off += cache_->block_bytes(l, n - from);
  }
  if (pin_ && !live) {
    const int64_t np = int64_t(pin_->n);
    for (int l = 0; l < cache_->n_layers(); ++l) {
      if (cache_->spec(l).window == 0) continue;
      cache_->read_checkpoint(l, np, dst + off);
      off += cache_->block_bytes(l, np - cache_->first_live(l, np));
    }
  }
}

size_t Session::state_kv_bytes() const {
  const std::vector<KvLayerSpec> layers = layer_specs(*cache_);
  const Sampler::State sst = sampler_.state();
  return kv_sections_bytes(image_parts(layers, sst));
}

size_t Session::state_bytes() const {
  const size_t nv = size_t(n_vocab());
  size_t b = state_kv_bytes() + sizeof(int32_t) * tokens_.size() + sizeof(KvLayerSpec) * size_t(cache_->n_layers());
  if (has_logits_) b += sizeof(float) * nv;
  b += sizeof(int32_t) * sampler_.state().history.size();
  if (pin_) b += sizeof(float) * nv + sizeof(int32_t) * pin_->sampler.history.size();
  return b;
}

Status Session::save_state(SessionState *st) const {
  if (st == nullptr) return GEIST_ERROR(GEIST_E_INVALID_ARGUMENT, "state is NULL");
  GEIST_RETURN_IF_ERROR(sync_logits());
  Timer t;
  const size_t kvb = state_kv_bytes(), nv = size_t(n_vocab());
  // Everything that can fail first (the KV buffer, then host capacity), so that a failed
  // save leaves *st as it was; the copies below do not allocate.
  std::unique_ptr<KvBuffer> fresh;
  if (!st->kv_ || st->kv_->size() < kvb || st->kv_->space() != cache_->space()) {
    GEIST_ASSIGN_OR_RETURN(fresh, cache_->new_buffer(kv_buffer_bytes(kvb)));
  }
  const Sampler::State sst = sampler_.state();
  st->tokens_.reserve(tokens_.size());
  if (has_logits_) st->logits_.reserve(nv);
  st->sampler_.history.reserve(sst.history.size());
  if (pin_) {
    st->pin_logits_.reserve(nv);
    st->pin_sampler_.history.reserve(pin_->sampler.history.size());
  }
  st->layers_.reserve(size_t(cache_->n_layers()));

  if (fresh) st->kv_ = std::move(fresh);
  st->saved_ = true;
  st->fingerprint_ = model_.fingerprint();
  st->layers_.clear();
  for (int l = 0; l < cache_->n_layers(); ++l) st->layers_.push_back(cache_->spec(l));
  st->type_k_ = cache_->type_k();
  st->type_v_ = cache_->type_v();
  st->tokens_.assign(tokens_.begin(), tokens_.end());
  st->n_vocab_ = nv;
  st->has_logits_ = has_logits_;
  if (has_logits_) {
    st->logits_.assign(logits_.get(), logits_.get() + nv);
  } else {
    st->logits_.clear();
  }
  for (int i = 0; i < 4; ++i) st->sampler_.rng[i] = sst.rng[i];
  st->sampler_.history.assign(sst.history.begin(), sst.history.end());
  st->n_pin_ = n_pinned();
  if (pin_) {
    st->pin_logits_.assign(pin_->logits.begin(), pin_->logits.end());
    for (int i = 0; i < 4; ++i) st->pin_sampler_.rng[i] = pin_->sampler.rng[i];
    st->pin_sampler_.history.assign(pin_->sampler.history.begin(), pin_->sampler.history.end());
  } else {
    st->pin_logits_.clear();
    st->pin_sampler_.history.clear();
  }
  read_kv_sections(st->kv_->data());
  st->kv_bytes_ = kvb;
  stats_.snapshot_seconds += t.seconds();
  stats_.n_snapshots += 1;
  return Status::ok();
}

Status Session::load_state(const SessionState &st) {
  GEIST_RETURN_IF_ERROR(ready());  // no queued step may write the KV rows this replaces
  if (st.empty()) return GEIST_ERROR(GEIST_E_STATE, "the state is empty (nothing was saved into it)");
  Timer t;
  if (st.fingerprint_ != model_.fingerprint()) {
    return GEIST_ERROR(GEIST_E_MISMATCH, "state was saved from a session of another model (fingerprint %016llx, this "
                       "model %016llx)", (unsigned long long)st.fingerprint_, (unsigned long long)model_.fingerprint());
  }
  if (st.n_vocab_ != size_t(n_vocab()) || st.layers_.size() != size_t(cache_->n_layers())) {
    return GEIST_ERROR(GEIST_E_MISMATCH, "state geometry (%zu layers, vocabulary %zu) differs from the model's (%d, "
                       "%lld)", st.layers_.size(), st.n_vocab_, cache_->n_layers(), (long long)n_vocab());
  }
  for (int l = 0; l < cache_->n_layers(); ++l) {
    const KvLayerSpec &s = st.layers_[size_t(l)];
    if (s.row_floats != cache_->spec(l).row_floats || s.window != cache_->spec(l).window) {
      return GEIST_ERROR(GEIST_E_MISMATCH, "state layer %d has KV rows of %lld floats, window %d; the model's are "
                         "%lld, %d", l, (long long)s.row_floats, s.window, (long long)cache_->spec(l).row_floats,
                         cache_->spec(l).window);
    }
  }
  if (st.type_k_ != cache_->type_k() || st.type_v_ != cache_->type_v()) {
    return GEIST_ERROR(GEIST_E_MISMATCH, "state has a KV cache of %s K / %s V rows; this session's is %s / %s",
                       kv_type_name(st.type_k_), kv_type_name(st.type_v_), kv_type_name(cache_->type_k()),
                       kv_type_name(cache_->type_v()));
  }
  if (st.kv_->space() != cache_->space()) {
    return GEIST_ERROR(GEIST_E_MISMATCH, "state's KV rows are in %s memory; this session's are in %s memory",
                       st.kv_->space() < 0 ? "host" : ("GPU " + std::to_string(st.kv_->space())).c_str(),
                       cache_->space() < 0 ? "host" : ("GPU " + std::to_string(cache_->space())).c_str());
  }
  if (st.tokens_.size() > size_t(cache_->n_ctx())) {
    return GEIST_ERROR(GEIST_E_CONTEXT_FULL, "state holds %zu tokens; this session's context is %lld",
                       st.tokens_.size(), (long long)cache_->n_ctx());
  }
  Parts p;
  p.n = st.tokens_.size();
  p.n_pin = st.n_pin_;
  p.has_logits = st.has_logits_;
  p.tokens = reinterpret_cast<const uint8_t *>(st.tokens_.data());
  p.logits = reinterpret_cast<const uint8_t *>(st.logits_.data());
  p.pin_logits = reinterpret_cast<const uint8_t *>(st.pin_logits_.data());
  p.sampler = &st.sampler_;
  const int64_t n = int64_t(p.n), np = int64_t(p.n_pin);
  const bool live = np > 0 && np == n;
  p.kv.assign(size_t(cache_->n_layers()), nullptr);
  p.ck.assign(size_t(cache_->n_layers()), nullptr);
  const uint8_t *base = st.kv_->data();
  size_t off = 0;
  for (int l = 0; l < cache_->n_layers(); ++l) {
    p.kv[size_t(l)] = base + off;
    off += cache_->block_bytes(l, n - cache_->first_live(l, n));
  }
  for (int l = 0; l < cache_->n_layers(); ++l) {
    if (np == 0 || cache_->spec(l).window == 0) continue;
    if (live) {
      p.ck[size_t(l)] = p.kv[size_t(l)];
    } else {
      p.ck[size_t(l)] = base + off;
      off += cache_->block_bytes(l, np - cache_->first_live(l, np));
    }
  }
  GEIST_CHECK(off == st.kv_bytes_, "state KV layout and size disagree");
  Sampler::State pst;
  pst.history.reserve(st.pin_sampler_.history.size());
  for (int i = 0; i < 4; ++i) pst.rng[i] = st.pin_sampler_.rng[i];
  pst.history.assign(st.pin_sampler_.history.begin(), st.pin_sampler_.history.end());
  commit(p, std::move(pst));
  stats_.restore_seconds += t.seconds();
  stats_.n_restores += 1;
  return Status::ok();
}

size_t SessionState::bytes() const {
  return sizeof(int32_t) * tokens_.capacity() + sizeof(float) * (logits_.capacity() + pin_logits_.capacity()) +
         sizeof(int32_t) * (sampler_.history.capacity() + pin_sampler_.history.capacity()) +
         sizeof(KvLayerSpec) * layers_.capacity() + (kv_ ? kv_->size() : 0);
}


size_t SessionState::snapshot_size() const {
  if (!saved_) return 0;
  return image_size(state_parts(layers_, type_k_, type_v_, tokens_, n_vocab_, has_logits_ ? logits_.data() : nullptr,
                                sampler_, n_pin_, pin_sampler_, pin_logits_.data(), fingerprint_));
}

Status SessionState::snapshot(void *buf, size_t cap, size_t *written) const {
  if (written == nullptr) return GEIST_ERROR(GEIST_E_INVALID_ARGUMENT, "written is NULL");
  if (!saved_) return GEIST_ERROR(GEIST_E_STATE, "the state is empty (nothing was saved into it)");
  const ImageParts p = state_parts(layers_, type_k_, type_v_, tokens_, n_vocab_,
                                   has_logits_ ? logits_.data() : nullptr, sampler_, n_pin_, pin_sampler_,
                                   pin_logits_.data(), fingerprint_);
  const size_t size = image_size(p);
  *written = size;
  if (cap < size) {
    return GEIST_ERROR(GEIST_E_BUFFER_TOO_SMALL, "the snapshot needs %zu bytes, the buffer holds %zu", size, cap);
  }
  if (buf == nullptr) return GEIST_ERROR(GEIST_E_INVALID_ARGUMENT, "buf is NULL");
  return write_image(p, static_cast<uint8_t *>(buf), [&](uint8_t *dst) { return kv_->read(0, kv_bytes_, dst); });
}

Status Session::restore(const void *buf, size_t size) {
  GEIST_RETURN_IF_ERROR(ready());  // no queued step may write the KV rows this replaces
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

  Parts p;
  p.n = size_t(n);
  p.n_pin = size_t(n_pin);
  p.has_logits = has_logits;
  p.tokens = tok;
  p.logits = logits;
  p.pin_logits = pin_logits;
  p.sampler = &sst;
  p.kv = std::move(kv);
  p.ck = std::move(ck);
  if (live) {
    for (int l = 0; l < cache_->n_layers(); ++l) {
      if (cache_->spec(l).window > 0) p.ck[size_t(l)] = p.kv[size_t(l)];
    }
  }
  commit(p, std::move(pst));
  stats_.restore_seconds += t.seconds();
  stats_.n_restores += 1;
  return Status::ok();
}

// Everything is validated. Stage what needs memory, then commit: nothing below the
// sampler's set_state fails, and that leaves the session unchanged if it does. A serving
// loop restores the same image before every request, so the session's own buffers (the
// tokens, the pin's logits and sampler history) already have the capacity and are
// overwritten in place, and the checkpoint rows go to the KV store's own checkpoint
// (reserved with the store): a restore then allocates only the sampler's history.
// (Building a new pin every time, ~8 MiB on Gemma 3 270M, and freeing the old one after,
// left the heap holding both: RSS rose for the first requests; issue 12, finding 11.)
void Session::commit(const Parts &p, Sampler::State &&pst) {
  const size_t nv = size_t(n_vocab());
  std::vector<int32_t> new_tokens;
  if (tokens_.capacity() < p.n) new_tokens.reserve(p.n);
  const bool reuse_pin = p.n_pin > 0 && pin_ && pin_->logits.capacity() >= nv &&
                         pin_->sampler.history.capacity() >= pst.history.size();
  std::unique_ptr<Pin> new_pin;
  if (p.n_pin > 0 && !reuse_pin) {
    new_pin = std::make_unique<Pin>();
    new_pin->logits.reserve(nv);
  }
  sampler_.set_state(*p.sampler);  // the last step that can fail (strong guarantee)

  // Commit (no allocation below: every resize is within capacity).
  if (new_tokens.capacity() > 0) tokens_.swap(new_tokens);
  tokens_.resize(p.n);
  if (p.n) std::memcpy(tokens_.data(), p.tokens, p.n * 4);
  if (p.has_logits) std::memcpy(logits_.get(), p.logits, nv * 4);
  has_logits_ = p.has_logits;
  logits_on_device_ = false;
  step_draw_ = StepDraw{};  // an image keeps no drawn token: the first draw reads the logits
  if (new_pin) pin_ = std::move(new_pin);
  if (p.n_pin == 0) pin_.reset();
  if (pin_) {
    Pin &pin = *pin_;
    pin.n = p.n_pin;
    pin.draw = StepDraw{};
    pin.logits.resize(nv);
    std::memcpy(pin.logits.data(), p.pin_logits, nv * 4);
    for (int i = 0; i < 4; ++i) pin.sampler.rng[i] = pst.rng[i];
    if (pin.sampler.history.capacity() >= pst.history.size()) {
      pin.sampler.history.assign(pst.history.begin(), pst.history.end());
    } else {
      pin.sampler.history.swap(pst.history);  // a new pin: take the staged vector
    }
  }
  // The checkpoint rows to the store's checkpoint and to the rings, then the live rows, so
  // each ring slot ends holding the latest position, as after an uninterrupted run.
  const int64_t n = int64_t(p.n), np = int64_t(p.n_pin);
  for (int l = 0; l < cache_->n_layers(); ++l) {
    if (pin_ && cache_->spec(l).window > 0) {
      const uint8_t *rows = p.ck[size_t(l)];
      cache_->write_checkpoint(l, np, rows);
      cache_->write_rows(l, cache_->first_live(l, np), np, rows);
    }
    cache_->write_rows(l, cache_->first_live(l, n), n, p.kv[size_t(l)]);  // no alignment needed
  }
  cache_->n_past = n;
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

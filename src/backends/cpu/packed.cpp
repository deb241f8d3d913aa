#include "backends/cpu/packed.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <new>

#include "backends/cpu/isa.h"
#include "backends/cpu/qgemm.h"
#include "quant/block_formats.h"

namespace geist::cpu {
namespace {

using quant::GgmlType;

// One row's 32-element chunk in raw form: unsigned quants (0..15, 0..31, 0..63 or the
// int8 of Q8_0 + 128).
struct Chunk {
  uint8_t q[32];
};

// Raw quants of 32-element block b of a row of type t (Q4_0, Q5_0, Q8_0), and its f16 d.
void raw_q32(GgmlType t, const uint8_t *row, int64_t b, Chunk *c, uint16_t *d) {
  if (t == GgmlType::Q8_0) {
    const auto blk = quant::block_load<quant::BlockQ8_0>(row, b);
    *d = blk.d;
    for (int j = 0; j < 32; ++j) c->q[j] = static_cast<uint8_t>(blk.qs[j] + 128);
  } else if (t == GgmlType::Q4_0) {
    const auto blk = quant::block_load<quant::BlockQ4_0>(row, b);
    *d = blk.d;
    for (int j = 0; j < 16; ++j) {
      c->q[j] = blk.qs[j] & 0x0F;
      c->q[j + 16] = blk.qs[j] >> 4;
    }
  } else {
    const auto blk = quant::block_load<quant::BlockQ5_0>(row, b);
    *d = blk.d;
    uint32_t qh;
    std::memcpy(&qh, blk.qh, 4);
    for (int j = 0; j < 16; ++j) {
      c->q[j] = static_cast<uint8_t>((blk.qs[j] & 0x0F) | (((qh >> j) & 1) << 4));
      c->q[j + 16] = static_cast<uint8_t>((blk.qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4));
    }
  }
}

// A K-quant super-block of one row in raw form.
struct Super {
  Chunk c[8];        // 32-element chunks
  uint8_t sc[16];    // Q4_K/Q5_K: 8 6-bit scales; Q6_K, Q3_K: 16 int8 scales (as bytes);
                     // Q2_K: 16 4-bit scales
  uint8_t mn[16];    // Q4_K/Q5_K: 8 mins; Q2_K: 16 mins
  uint16_t d = 0, dmin = 0;
};

void raw_k(GgmlType t, const uint8_t *row, int64_t s, Super *o) {
  if (t == GgmlType::Q2_K || t == GgmlType::Q3_K) {
    // Element e = 128 h + 32 sb + l: bits 2 sb..2 sb + 1 of qs[32 h + l] (block_formats.h);
    // Q3_K adds its high bit as + 4, so q in 0..7 stands for q - 4.
    const uint8_t *qs;
    if (t == GgmlType::Q2_K) {
      const auto blk = quant::block_load<quant::BlockQ2_K>(row, s);
      o->d = blk.d;
      o->dmin = blk.dmin;
      for (int u = 0; u < 16; ++u) {
        o->sc[u] = blk.scales[u] & 0x0F;
        o->mn[u] = blk.scales[u] >> 4;
      }
      for (int e = 0; e < 256; ++e) {
        const int h = e / 128, sb = (e / 32) % 4, l = e % 32;
        o->c[e / 32].q[e % 32] = static_cast<uint8_t>((blk.qs[32 * h + l] >> (2 * sb)) & 3);
      }
      return;
    }
    const auto blk = quant::block_load<quant::BlockQ3_K>(row, s);
    o->d = blk.d;
    qs = blk.qs;
    for (int u = 0; u < 16; ++u) {
      const int lo = (blk.scales[u % 8] >> (4 * (u / 8))) & 0x0F;
      const int hi = (blk.scales[8 + u % 4] >> (2 * (u / 4))) & 0x03;
      o->sc[u] = static_cast<uint8_t>(static_cast<int8_t>((lo | (hi << 4)) - 32));
    }
    for (int e = 0; e < 256; ++e) {
      const int h = e / 128, sb = (e / 32) % 4, l = e % 32;
      const int lo = (qs[32 * h + l] >> (2 * sb)) & 3;
      const int hb = (blk.hmask[l] >> (e / 32)) & 1;
      o->c[e / 32].q[e % 32] = static_cast<uint8_t>(lo | (hb << 2));
    }
    return;
  }
  if (t == GgmlType::Q6_K) {
    const auto blk = quant::block_load<quant::BlockQ6_K>(row, s);
    o->d = blk.d;
    std::memcpy(o->sc, blk.scales, 16);
    for (int e = 0; e < 256; ++e) {
      const int h = e / 128, sb = (e / 32) % 4, l = e % 32;
      const int lo = (blk.ql[64 * h + 32 * (sb % 2) + l] >> (4 * (sb / 2))) & 0x0F;
      const int hi = (blk.qh[32 * h + l] >> (2 * sb)) & 0x03;
      o->c[e / 32].q[e % 32] = static_cast<uint8_t>(lo | (hi << 4));
    }
    return;
  }
  const bool q5 = t == GgmlType::Q5_K;
  const uint8_t *scales, *qs, *qh = nullptr;
  quant::BlockQ4_K b4;
  quant::BlockQ5_K b5;
  if (q5) {
    b5 = quant::block_load<quant::BlockQ5_K>(row, s);
    o->d = b5.d;
    o->dmin = b5.dmin;
    scales = b5.scales;
    qs = b5.qs;
    qh = b5.qh;
  } else {
    b4 = quant::block_load<quant::BlockQ4_K>(row, s);
    o->d = b4.d;
    o->dmin = b4.dmin;
    scales = b4.scales;
    qs = b4.qs;
  }
  for (int t8 = 0; t8 < 8; ++t8) {
    int sc, mn;
    quant::unpack_scale_min_k4(scales, t8, &sc, &mn);
    o->sc[t8] = static_cast<uint8_t>(sc);
    o->mn[t8] = static_cast<uint8_t>(mn);
    for (int l = 0; l < 32; ++l) {
      int q = (qs[32 * (t8 / 2) + l] >> (4 * (t8 % 2))) & 0x0F;
      if (q5) q |= ((qh[l] >> t8) & 1) << 4;
      o->c[t8].q[l] = static_cast<uint8_t>(q);
    }
  }
}

// 16 rows' chunks -> 4 nibble vectors (256 B): vector v, byte 4i + e: low nibble =
// element 4v + e, high nibble = element 4(v + 4) + e.
void put_nibbles(const Chunk *rows[16], uint8_t *dst) {
  for (int v = 0; v < 4; ++v) {
    for (int i = 0; i < 16; ++i) {
      for (int e = 0; e < 4; ++e) {
        const uint8_t lo = rows[i]->q[4 * v + e] & 0x0F, hi = rows[i]->q[4 * (v + 4) + e] & 0x0F;
        dst[64 * v + 4 * i + e] = static_cast<uint8_t>(lo | (hi << 4));
      }
    }
  }
}

// 16 rows' chunks -> 2 crumb vectors (128 B): vector u, byte 4i + e, bits 2c..2c + 1 =
// bits 0..1 of element 4(4u + c) + e (k-group 4u + c).
void put_crumbs(const Chunk *rows[16], uint8_t *dst) {
  for (int u = 0; u < 2; ++u)
    for (int i = 0; i < 16; ++i)
      for (int e = 0; e < 4; ++e) {
        uint8_t b = 0;
        for (int c = 0; c < 4; ++c) b |= static_cast<uint8_t>((rows[i]->q[4 * (4 * u + c) + e] & 3) << (2 * c));
        dst[64 * u + 4 * i + e] = b;
      }
}

// One bit of every quant as 64 bytes of planes: byte 4i + e, bit j = bit `bit` of element
// 4j + e of row i, so the lanes line up with the nibble and crumb vectors' and k-group j's
// bits come out with one shift and mask (qgemm_impl.h: nibbles, tile_q23k).
void put_planes(const Chunk *rows[16], uint8_t *dst, int bit = 4) {
  for (int i = 0; i < 16; ++i) {
    for (int e = 0; e < 4; ++e) {
      uint8_t b = 0;
      for (int j = 0; j < 8; ++j) b |= static_cast<uint8_t>(((rows[i]->q[4 * j + e] >> bit) & 1) << j);
      dst[4 * i + e] = b;
    }
  }
}


int64_t block_of(GgmlType t) { return quant::traits(t).block_size; }

size_t round64(size_t n) { return (n + 63) & ~size_t(63); }

}  // namespace

bool has_packed_layout(GgmlType t) {
  switch (t) {
    case GgmlType::Q8_0: case GgmlType::Q4_0: case GgmlType::Q5_0:
    case GgmlType::Q2_K: case GgmlType::Q3_K: case GgmlType::Q4_K: case GgmlType::Q5_K: case GgmlType::Q6_K:
      return true;
    default:
      return false;
  }
}

size_t packed_group_bytes(GgmlType t, int64_t K) {
  if (!has_packed_layout(t) || K <= 0 || K % block_of(t) != 0) return 0;
  const size_t nb = static_cast<size_t>(K / block_of(t));
  switch (t) {
    case GgmlType::Q8_0: return round64(nb * (512 + 32));
    case GgmlType::Q4_0: return round64(nb * (256 + 32));
    case GgmlType::Q5_0: return round64(nb * (320 + 32));
    case GgmlType::Q2_K: return nb * 1856;
    case GgmlType::Q3_K: return nb * 1856;
    case GgmlType::Q4_K: return nb * 2496;
    case GgmlType::Q5_K: return nb * 3008;
    case GgmlType::Q6_K: return nb * 3392;
    default: return 0;
  }
}

void pack_group(GgmlType t, const uint8_t *rows, size_t row_bytes, int n_rows, int64_t K, uint8_t *dst) {
  const size_t gb = packed_group_bytes(t, K);
  std::memset(dst, 0, gb);
  static const Chunk kZero{};
  const int64_t nb = K / block_of(t);
  if (t == GgmlType::Q8_0 || t == GgmlType::Q4_0 || t == GgmlType::Q5_0) {
    const size_t per = t == GgmlType::Q8_0 ? 512 : t == GgmlType::Q4_0 ? 256 : 320;
    uint8_t *scales = dst + nb * per;
    Chunk ch[16];
    const Chunk *rp[16];
    for (int64_t b = 0; b < nb; ++b) {
      for (int i = 0; i < 16; ++i) {
        uint16_t d = 0;
        if (i < n_rows) {
          raw_q32(t, rows + i * row_bytes, b, &ch[i], &d);
          rp[i] = &ch[i];
        } else {
          rp[i] = &kZero;
          if (t == GgmlType::Q8_0) {  // a zero row: w = 0, stored + 128 (d = 0 anyway)
            std::memset(ch[i].q, 128, 32);
            rp[i] = &ch[i];
          }
        }
        std::memcpy(scales + b * 32 + 2 * i, &d, 2);
      }
      uint8_t *q = dst + b * per;
      if (t == GgmlType::Q8_0) {
        for (int j = 0; j < 8; ++j)
          for (int i = 0; i < 16; ++i) std::memcpy(q + 64 * j + 4 * i, rp[i]->q + 4 * j, 4);
      } else {
        put_nibbles(rp, q);
        if (t == GgmlType::Q5_0) put_planes(rp, q + 256);
      }
    }
    return;
  }
  // K-quants
  const size_t sb_bytes = packed_group_bytes(t, 256);
  static const Super kZeroSuper{};
  std::unique_ptr<Super[]> sup(new Super[16]);
  for (int64_t s = 0; s < nb; ++s) {
    uint8_t *o = dst + s * sb_bytes;
    const Super *sp[16];
    for (int i = 0; i < 16; ++i) {
      if (i < n_rows) {
        raw_k(t, rows + i * row_bytes, s, &sup[i]);
        sp[i] = &sup[i];
      } else {
        sp[i] = &kZeroSuper;
      }
    }
    const Chunk *rp[16];
    if (t == GgmlType::Q2_K || t == GgmlType::Q3_K) {
      const bool q3 = t == GgmlType::Q3_K;
      for (int c = 0; c < 8; ++c) {
        for (int i = 0; i < 16; ++i) rp[i] = &sp[i]->c[c];
        put_crumbs(rp, o + 128 * c);
        if (q3) put_planes(rp, o + 1024 + 64 * c, 2);
      }
      const size_t off = q3 ? 1536 : 1024;
      for (int u = 0; u < 16; ++u)
        for (int i = 0; i < 16; ++i) o[off + 16 * u + i] = sp[i]->sc[u];
      if (!q3) {
        for (int p = 0; p < 8; ++p)
          for (int i = 0; i < 16; ++i) {
            const int16_t m2[2] = {sp[i]->mn[2 * p], sp[i]->mn[2 * p + 1]};
            std::memcpy(o + 1280 + 64 * p + 4 * i, m2, 4);
          }
      }
      for (int i = 0; i < 16; ++i) {
        std::memcpy(o + 1792 + 2 * i, &sp[i]->d, 2);
        if (!q3) std::memcpy(o + 1824 + 2 * i, &sp[i]->dmin, 2);
      }
      continue;
    }
    for (int c = 0; c < 8; ++c) {
      for (int i = 0; i < 16; ++i) rp[i] = &sp[i]->c[c];
      put_nibbles(rp, o + 256 * c);
    }
    if (t == GgmlType::Q6_K) {
      for (int c = 0; c < 8; ++c) {
        uint8_t *h = o + 2048 + 128 * c;
        for (int j = 0; j < 8; ++j)
          for (int i = 0; i < 16; ++i)
            for (int e = 0; e < 4; ++e) {
              const int hi = (sp[i]->c[c].q[4 * j + e] >> 4) & 3;
              h[64 * (j / 4) + 4 * i + e] |= static_cast<uint8_t>(hi << (2 * (j % 4)));
            }
      }
      for (int u = 0; u < 16; ++u)
        for (int i = 0; i < 16; ++i) o[3072 + 16 * u + i] = sp[i]->sc[u];
      for (int i = 0; i < 16; ++i) std::memcpy(o + 3328 + 2 * i, &sp[i]->d, 2);
      continue;
    }
    size_t off = 2048;
    if (t == GgmlType::Q5_K) {
      for (int c = 0; c < 8; ++c) {
        for (int i = 0; i < 16; ++i) rp[i] = &sp[i]->c[c];
        put_planes(rp, o + 2048 + 64 * c);
      }
      off = 2560;
    }
    for (int t8 = 0; t8 < 8; ++t8)
      for (int i = 0; i < 16; ++i) o[off + 16 * t8 + i] = sp[i]->sc[t8];
    for (int p = 0; p < 4; ++p)
      for (int i = 0; i < 16; ++i) {
        const int16_t m2[2] = {sp[i]->mn[2 * p], sp[i]->mn[2 * p + 1]};
        std::memcpy(o + off + 128 + 64 * p + 4 * i, m2, 4);
      }
    for (int i = 0; i < 16; ++i) {
      std::memcpy(o + off + 384 + 2 * i, &sp[i]->d, 2);
      std::memcpy(o + off + 416 + 2 * i, &sp[i]->dmin, 2);
    }
  }
}

void PackedStore::Free::operator()(uint8_t *p) const { std::free(p); }

uint8_t *PackedStore::allocate(size_t bytes) {
  // Matrices of a few MiB and more (an output head is ~180 MiB) go on 2 MiB pages where
  // the kernel grants them (transparent huge pages in `madvise` mode): a GEMM streams the
  // whole matrix, and 4 KiB pages cost a TLB miss every 4 KiB of it.
  constexpr size_t kHuge = size_t(2) << 20;
  void *p;
  if (bytes >= 2 * kHuge) {
    const size_t n = (bytes + kHuge - 1) / kHuge * kHuge;
    p = std::aligned_alloc(kHuge, n);
#if defined(MADV_HUGEPAGE)
    if (p) madvise(p, n, MADV_HUGEPAGE);  // advice only: failure leaves 4 KiB pages
#endif
  } else {
    p = std::aligned_alloc(64, round64(bytes ? bytes : 64));
  }
  if (!p) throw std::bad_alloc();
  blocks_.emplace_back(static_cast<uint8_t *>(p));
  bytes_ += bytes;
  return static_cast<uint8_t *>(p);
}

bool pack_weight(WeightView *w, PackedStore *store, ThreadPool *pool) {
  const TierKernels *tk = tier_kernels(active_isa());
  if (!tk || !tk->for_type(w->type) || w->packed) return false;
  const size_t gb = packed_group_bytes(w->type, w->n_in);
  if (gb == 0) return false;
  const int64_t n_groups = (w->n_out + kPackRows - 1) / kPackRows;
  uint8_t *dst = store->allocate(gb * static_cast<size_t>(n_groups));
  auto pack_range = [&](int64_t g0, int64_t g1) {
    for (int64_t g = g0; g < g1; ++g) {
      const int rows = static_cast<int>(std::min<int64_t>(kPackRows, w->n_out - g * kPackRows));
      pack_group(w->type, w->row(g * kPackRows), w->row_bytes, rows, w->n_in, dst + g * gb);
    }
  };
  if (pool && pool->n_threads() > 1 && n_groups > 1) {
    const int64_t per = std::max<int64_t>(1, n_groups / (int64_t(pool->n_threads()) * 4));
    const int tasks = static_cast<int>((n_groups + per - 1) / per);
    pool->run(tasks, [&](int t, int) { pack_range(t * per, std::min(n_groups, (t + 1) * per)); });
  } else {
    pack_range(0, n_groups);
  }
  w->packed = dst;
  w->group_bytes = gb;
  return true;
}

}  // namespace geist::cpu

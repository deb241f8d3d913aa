// Attention over one chunk of keys for some query rows and one KV head (all the query
// heads of its group), written once over a SIMD abstraction S (float ops: L lanes,
// loadf/storef, fmadd, mul, sub, set1f, hsum4, exp) and instantiated by each tier TU.
// Include only from a tier TU, inside its anonymous namespace.
//
// Keys are walked in blocks of 16 absolute positions; for each block and head:
// s_j = scale * q.k_j, m' = max(m, max s_j), c = exp(m - m'), l = l c + sum_j exp(s_j - m'),
// acc = acc c + sum_j exp(s_j - m') v_j. Up to 4 heads of the group share every K and V
// load. What a query gets depends only on its position and the keys, never on the other
// rows of the chunk or on which thread runs it. Typed rings (F16, BF16, Q8_0; kv_type.h):
// each block's keys and values are first read to f32 rows (load_rows, the values of
// kv_rows.h's kv_load_rows) and the same f32 code runs on those.

#ifndef GEIST_NO_ICF
#if defined(__GNUC__) && !defined(__clang__)
#define GEIST_NO_ICF [[gnu::no_icf]]
#else
#define GEIST_NO_ICF
#endif
#endif

template <class S>
struct Attn {
  using F = typename S::F;
  static constexpr int L = S::L;
  static constexpr int DV = S::kAttnDv;  // vectors of head_dim per PV step
  static constexpr int kScoreHeads = S::kAttnScoreHeads;  // heads per scores4 call

  // How softmax<> and pv<> read elements [d, d + L) of a key or value row as f32: an f32 row, or an
  // f16 / bf16 row of the ring widened in place (exact: the values load_rows gives).
  struct FromF32 {
    using P = const float *;
    static F at(P p, int d) { return S::loadf(p + d); }
  };
  struct FromF16 {
    using P = const uint8_t *;
    static F at(P p, int d) { return S::cvtph(p + 2 * d); }
  };
  struct FromBF16 {
    using P = const uint8_t *;
    static F at(P p, int d) { return S::cvtbf16(p + 2 * d); }
  };

  // A q8_0 row (blocks of an f16 scale d and 32 int8 q) in place: f32(d) * q_j as one f32
  // multiply, load_rows' values. L divides 32, so [d, d + L) lies in one block.
  struct FromQ8 {
    using P = const uint8_t *;
    static F at(P p, int d) {
      const uint8_t *b = p + 34 * (d / 32);
      return S::mul(S::cvt(S::load_s8_i32(b + 2 + d % 32)), S::set1f(S::half1(b)));
    }
  };

  // Scores of NH heads x 4 keys: s[h][i] = scale * q_h . k_i.
  template <int NH, class KL = FromF32>
  static void scores4(const float *const q[], const typename KL::P k[4], int D, float scale, float s[][16],
                      int i0) {
    F acc[NH][4];
    for (int h = 0; h < NH; ++h)
      for (int i = 0; i < 4; ++i) acc[h][i] = S::set1f(0.0f);
    for (int d = 0; d < D; d += L) {
      F kv[4];
      for (int i = 0; i < 4; ++i) kv[i] = KL::at(k[i], d);
      for (int h = 0; h < NH; ++h) {
        const F qv = S::loadf(q[h] + d);
        for (int i = 0; i < 4; ++i) acc[h][i] = S::fmadd(qv, kv[i], acc[h][i]);
      }
    }
    for (int h = 0; h < NH; ++h) S::hsum4(acc[h][0], acc[h][1], acc[h][2], acc[h][3], scale, s[h] + i0);
  }

  // acc_h = acc_h * c_h + sum_i p[h][i] v_i for NH heads, n keys, over head_dim columns
  // [d_begin, d_end) in steps of W vectors.
  template <int NH, int W, class VL = FromF32>
  static int pv_cols(float *const o[], const float c[], const float p[][16], const typename VL::P v[16], int n,
                     int d_begin, int d_end) {
    int d0 = d_begin;
    for (; d0 + L * W <= d_end; d0 += L * W) {
      F acc[NH][W];
      for (int h = 0; h < NH; ++h) {
        const F cv = S::set1f(c[h]);
        for (int t = 0; t < W; ++t) acc[h][t] = S::mul(S::loadf(o[h] + d0 + t * L), cv);
      }
      for (int i = 0; i < n; ++i) {
        F vv[W];
        for (int t = 0; t < W; ++t) vv[t] = VL::at(v[i], d0 + t * L);
        for (int h = 0; h < NH; ++h) {
          const F pb = S::set1f(p[h][i]);
          for (int t = 0; t < W; ++t) acc[h][t] = S::fmadd(pb, vv[t], acc[h][t]);
        }
      }
      for (int h = 0; h < NH; ++h)
        for (int t = 0; t < W; ++t) S::storef(o[h] + d0 + t * L, acc[h][t]);
    }
    return d0;
  }
  template <int NH, class VL = FromF32>
  static void pv(float *const o[], const float c[], const float p[][16], const typename VL::P v[16], int n, int D) {
    const int d = pv_cols<NH, DV, VL>(o, c, p, v, n, 0, D);
    pv_cols<NH, 1, VL>(o, c, p, v, n, d, D);  // head_dim not a multiple of DV vectors
  }

  // Scores and softmax of one query row for NH heads over n keys of a block: updates the
  // heads' m and l and leaves p[h][0..n) = exp(s - m') and c[h] = exp(m - m') for pv().
  // kTyped: the typed rows' own copy, kept apart (no_icf: GCC would otherwise merge the
  // identical instantiations), so that rows<false> alone calls softmax<NH, false> and the
  // compiler inlines it there as it did before typed rings existed.
  // KL: how keys are read (FromF32: f32 rows; FromF16 / FromBF16 / FromQ8: ring rows in
  // place).
  template <int NH, bool kTyped = false, class KL = FromF32>
  GEIST_NO_ICF static void softmax(const AttentionArgs &a, int r, int hq0, const typename KL::P kp[], int n,
                                   float *m, float *l, float p[][16], float *c) {
    const int D = a.head_dim;
    const float *q[NH];
    for (int h = 0; h < NH; ++h) q[h] = a.q + (size_t(r) * a.n_head + hq0 + h) * D;
    alignas(64) float s[NH][16];
    for (int i = 0; i < n; i += 4) {
      typename KL::P k4[4];
      for (int j = 0; j < 4; ++j) k4[j] = kp[i + j < n ? i + j : i];
      if constexpr (NH > kScoreHeads) {
        scores4<kScoreHeads, KL>(q, k4, D, a.scale, s, i);
        scores4<NH - kScoreHeads, KL>(q + kScoreHeads, k4, D, a.scale, s + kScoreHeads, i);
      } else {
        scores4<NH, KL>(q, k4, D, a.scale, s, i);
      }
    }
    // The heads' maxima and sums are chains over the keys; walked with the heads inside,
    // the NH chains run side by side (each head's order, and so its bits, unchanged).
    float mx[NH], sum[NH];
    for (int h = 0; h < NH; ++h) {
      mx[h] = m[h];
      sum[h] = 0.0f;
    }
    for (int i = 0; i < n; ++i)
      for (int h = 0; h < NH; ++h) mx[h] = s[h][i] > mx[h] ? s[h][i] : mx[h];
    for (int h = 0; h < NH; ++h) {
      for (int i = n; i < 16; ++i) s[h][i] = mx[h];  // padding lanes: never used
      for (int i = 0; i < 16; i += L) S::storef(p[h] + i, S::exp(S::sub(S::loadf(s[h] + i), S::set1f(mx[h]))));
      c[h] = S::exp1(m[h] - mx[h]);
    }
    for (int i = 0; i < n; ++i)
      for (int h = 0; h < NH; ++h) sum[h] += p[h][i];
    for (int h = 0; h < NH; ++h) {
      l[h] = l[h] * c[h] + sum[h];
      m[h] = mx[h];
    }
  }

  // Rows [slot, slot + n) of a ring of type t (wrapping at cap), from byte head_off of
  // each row (a head's head_dim elements), into dst [n][D] f32: the values kv_load_rows gives (the tier's half and
  // bfloat16 widenings are exact; Q8_0 is f32(d) * q_j as one f32 multiply).
  static void load_rows(KvType t, const void *ring, int64_t slot, int64_t cap, size_t row_bytes, size_t head_off,
                        int n, int D, float *dst) {
    for (int i = 0; i < n; ++i, dst += D) {
      const uint8_t *p = static_cast<const uint8_t *>(ring) + size_t(slot) * row_bytes + head_off;
      if (++slot == cap) slot = 0;
      switch (t) {
        case KvType::F16:
          for (int d = 0; d < D; d += L) S::storef(dst + d, S::cvtph(p + 2 * d));
          break;
        case KvType::BF16:
          for (int d = 0; d < D; d += L) S::storef(dst + d, S::cvtbf16(p + 2 * d));
          break;
        case KvType::Q8_0:
          for (int b = 0; b < D / 32; ++b, p += 34) {
            uint16_t h;
            std::memcpy(&h, p, 2);
            const F dv = S::set1f(quant::fp16_to_fp32(h));
            for (int j = 0; j < 32; j += L) {
              S::storef(dst + 32 * b + j, S::mul(S::cvt(S::load_s8_i32(p + 2 + j)), dv));
            }
          }
          break;
        case KvType::F32:
          std::memcpy(dst, p, sizeof(float) * size_t(D));
          break;
      }
    }
  }

  // Prefetches head g's elements of n ring rows of type t (rows of `row` elements) from
  // slot on, wrapping at cap.
  static void prefetch_rows(const void *ring, KvType t, int64_t slot, int64_t cap, int64_t row, int g, int D,
                            int n) {
    const size_t row_bytes = kv_row_bytes(t, row), off = kv_row_bytes(t, int64_t(g) * D),
                 bytes = kv_row_bytes(t, D);
    for (int i = 0; i < n; ++i) {
      const char *p = static_cast<const char *>(ring) + size_t(slot) * row_bytes + off;
      for (size_t o = 0; o < bytes; o += 64) __builtin_prefetch(p + o);
      if (++slot == cap) slot = 0;
    }
  }

  // Partial states over keys [lo, hi] (inclusive) for query rows [r0, r1) and KV head g:
  // row r's keys are those of [lo, hi] it sees (kv_begin(p) .. p for its position p);
  // rows that see none are skipped, their state untouched. st[r - r0]: row r's state,
  // m[group], l[group], acc[group][head_dim] back to back.
  //
  // Each block of 16 keys is read once for all the rows (typed rings: read to f32 rows
  // once, [16][head_dim] per ring, in L1) and every row that sees part of it runs
  // softmax and pv on that part. A row's arithmetic is exactly that of a call for it alone over its own
  // keys of [lo, hi]: the same blocks (aligned to 16 absolute positions), the same key
  // counts, the same f32 values; the other rows of the call change nothing.
  // kTyped: false reads F32 rings in place, true reads any types through load_rows;
  // with KL FromF16 / FromBF16 / FromQ8 (both rings of that type), the rows are read in
  // place and widened inside the dot products instead: for one query row the round trip through
  // load_rows' f32 rows cost as much as the arithmetic (same values, same bits).
  template <bool kTyped, class KL = FromF32>
  static void rows(const AttentionArgs &a, int g, int r0, int r1, int64_t lo, int64_t hi, float *const *st) {
    const int group = a.n_head / a.n_head_kv;
    const int D = a.head_dim;
    auto row_lo = [&](int r) {
      const int64_t p = a.q_pos0 + r;
      return std::max(lo, a.window > 0 ? std::max<int64_t>(0, p - a.window + 1) : int64_t(0));
    };
    auto row_hi = [&](int r) { return std::min(hi, a.q_pos0 + r); };
    int64_t u_lo = hi + 1, u_hi = lo - 1;  // the union of the rows' keys
    for (int r = r0; r < r1; ++r) {
      const int64_t k0 = row_lo(r), k1 = row_hi(r);
      if (k0 > k1) continue;
      u_lo = std::min(u_lo, k0);
      u_hi = std::max(u_hi, k1);
      float *m = st[r - r0], *l = m + group, *acc = l + group;
      for (int h = 0; h < group; ++h) {
        m[h] = -std::numeric_limits<float>::infinity();
        l[h] = 0.0f;
      }
      std::fill(acc, acc + size_t(group) * D, 0.0f);
    }
    if (u_lo > u_hi) return;
    constexpr bool kInPlace16 = !std::is_same_v<KL, FromF32>;
    using P = typename KL::P;
    P kp[16], vp[16];
    float *kb = nullptr, *vb = nullptr;
    size_t k_row_bytes = 0, k_off = 0, v_row_bytes = 0, v_off = 0;
    if constexpr (kInPlace16) {
      const int64_t row = int64_t(a.n_head_kv) * D, off = int64_t(g) * D;
      k_row_bytes = kv_row_bytes(a.k_type, row);
      k_off = kv_row_bytes(a.k_type, off);
      v_row_bytes = kv_row_bytes(a.v_type, row);
      v_off = kv_row_bytes(a.v_type, off);
    } else if constexpr (kTyped) {
      static thread_local std::vector<float> buf;
      if (buf.size() < size_t(32) * D) buf.resize(size_t(32) * D);
      kb = buf.data();
      vb = kb + size_t(16) * D;
      const int64_t row = int64_t(a.n_head_kv) * D, off = int64_t(g) * D;
      k_row_bytes = kv_row_bytes(a.k_type, row);
      k_off = kv_row_bytes(a.k_type, off);
      v_row_bytes = kv_row_bytes(a.v_type, row);
      v_off = kv_row_bytes(a.v_type, off);
      for (int i = 0; i < 16; ++i) {
        kp[i] = kb + size_t(i) * D;
        vp[i] = vb + size_t(i) * D;
      }
    }
    const size_t stride = size_t(a.n_head_kv) * D;
    // p and c of every row and head of the current block, between the two passes: on the
    // stack for up to 16 rows of 8 heads (callers give at most 16 rows), else per thread.
    // (A thread_local vector for every call cost the AVX2 tier ~10 % at 64 rows.)
    constexpr size_t kStackPairs = 16 * 8;
    alignas(64) float pc_stack[kStackPairs * 17];
    const size_t n_pairs = size_t(r1 - r0) * group;
    float *pc = pc_stack;
    if (n_pairs > kStackPairs) {
      static thread_local std::vector<float> heap;
      if (heap.size() < n_pairs * 17) heap.resize(n_pairs * 17);
      pc = heap.data();
    }
    float(*pbuf)[16] = reinterpret_cast<float(*)[16]>(pc);
    float *cbuf = pc + n_pairs * 16;
    for (int64_t b0 = u_lo - u_lo % 16; b0 <= u_hi; b0 += 16) {
      const int64_t k0 = std::max(u_lo, b0), k1 = std::min(u_hi, b0 + 15);
      const int n = int(k1 - k0 + 1);
      if constexpr (kInPlace16) {
        int64_t slot = k0 % a.kv_cap;
        for (int i = 0; i < n; ++i) {
          kp[i] = static_cast<const uint8_t *>(a.k) + size_t(slot) * k_row_bytes + k_off;
          vp[i] = static_cast<const uint8_t *>(a.v) + size_t(slot) * v_row_bytes + v_off;
          if (++slot == a.kv_cap) slot = 0;
        }
      } else if constexpr (kTyped) {
        load_rows(a.k_type, a.k, k0 % a.kv_cap, a.kv_cap, k_row_bytes, k_off, n, D, kb);
        load_rows(a.v_type, a.v, k0 % a.kv_cap, a.kv_cap, v_row_bytes, v_off, n, D, vb);
      } else {
        int64_t slot = k0 % a.kv_cap;
        for (int i = 0; i < n; ++i) {
          kp[i] = static_cast<const float *>(a.k) + size_t(slot) * stride + size_t(g) * D;
          vp[i] = static_cast<const float *>(a.v) + size_t(slot) * stride + size_t(g) * D;
          if (++slot == a.kv_cap) slot = 0;
        }
      }
      // The next block's rows are fetched while this one is computed: with one or two
      // query rows the hardware prefetcher alone left the cores waiting on the ring.
      if (b0 + 16 <= u_hi) {
        const int nn = int(std::min(u_hi, b0 + 31) - (b0 + 16) + 1);
        prefetch_rows(a.k, a.k_type, (b0 + 16) % a.kv_cap, a.kv_cap, int64_t(a.n_head_kv) * D, g, D, nn);
        prefetch_rows(a.v, a.v_type, (b0 + 16) % a.kv_cap, a.kv_cap, int64_t(a.n_head_kv) * D, g, D, nn);
      }
      // Two passes over the rows: every row's scores and softmax (the block's keys and one
      // row's queries in L1), then every row's sums of values (the values and one row's
      // accumulators). Done row by row, the keys, values, queries and accumulators together
      // overflowed L1 (Zen 5's 48 KiB at head_dim 256). Each row's own operations keep
      // their order, so its bits do not change.
      for (int r = r0; r < r1; ++r) {
        const int64_t j0 = std::max(row_lo(r), b0), j1 = std::min(row_hi(r), b0 + 15);
        if (j0 > j1) continue;
        const int nr = int(j1 - j0 + 1), i0 = int(j0 - k0);
        float *m = st[r - r0], *l = m + group;
        float(*pr)[16] = pbuf + size_t(r - r0) * group;
        float *cr = cbuf + size_t(r - r0) * group;
        for (int h = 0; h < group; h += 4) {
          const int hq0 = g * group + h;
          switch (std::min(4, group - h)) {
            case 4: softmax<4, kTyped, KL>(a, r, hq0, kp + i0, nr, m + h, l + h, pr + h, cr + h); break;
            case 3: softmax<3, kTyped, KL>(a, r, hq0, kp + i0, nr, m + h, l + h, pr + h, cr + h); break;
            case 2: softmax<2, kTyped, KL>(a, r, hq0, kp + i0, nr, m + h, l + h, pr + h, cr + h); break;
            default: softmax<1, kTyped, KL>(a, r, hq0, kp + i0, nr, m + h, l + h, pr + h, cr + h); break;
          }
        }
      }
      for (int r = r0; r < r1; ++r) {
        const int64_t j0 = std::max(row_lo(r), b0), j1 = std::min(row_hi(r), b0 + 15);
        if (j0 > j1) continue;
        const int nr = int(j1 - j0 + 1), i0 = int(j0 - k0);
        float *acc = st[r - r0] + 2 * group;
        const float(*pr)[16] = pbuf + size_t(r - r0) * group;
        const float *cr = cbuf + size_t(r - r0) * group;
        for (int h = 0; h < group; h += 4) {
          float *o[4];
          for (int t = 0; t < 4; ++t) o[t] = acc + size_t(h + t) * D;
          switch (std::min(4, group - h)) {
            case 4: pv<4, KL>(o, cr + h, pr + h, vp + i0, nr, D); break;
            case 3: pv<3, KL>(o, cr + h, pr + h, vp + i0, nr, D); break;
            case 2: pv<2, KL>(o, cr + h, pr + h, vp + i0, nr, D); break;
            default: pv<1, KL>(o, cr + h, pr + h, vp + i0, nr, D); break;
          }
        }
      }
    }
  }

  // rows() with the reader for the rings' types: F32 in place; one query row over two f16,
  // bf16 or q8_0 rings widened in place inside the dots; anything else through load_rows.
  static void rows_any(const AttentionArgs &a, int g, int r0, int r1, int64_t lo, int64_t hi, float *const *st) {
    if (a.k_type == KvType::F32 && a.v_type == KvType::F32) {
      rows<false>(a, g, r0, r1, lo, hi, st);
    } else if (r1 - r0 == 1 && a.k_type == KvType::F16 && a.v_type == KvType::F16) {
      rows<true, FromF16>(a, g, r0, r1, lo, hi, st);
    } else if (r1 - r0 == 1 && a.k_type == KvType::BF16 && a.v_type == KvType::BF16) {
      rows<true, FromBF16>(a, g, r0, r1, lo, hi, st);
    } else if (r1 - r0 == 1 && a.k_type == KvType::Q8_0 && a.v_type == KvType::Q8_0) {
      rows<true, FromQ8>(a, g, r0, r1, lo, hi, st);
    } else {
      rows<true>(a, g, r0, r1, lo, hi, st);
    }
  }
};

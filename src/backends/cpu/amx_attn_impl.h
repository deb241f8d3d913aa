// Attention over bfloat16 K and V rings on AMX-BF16 tiles (the avx512 tier, where
// amx_enabled() and the CPU has AMX-BF16 and AVX512-BF16). Include only from
// tier_avx512.cpp, inside its anonymous namespace, after amx_impl.h and attn_impl.h.
//
// One call: query rows [r0, r1) (at most rows_per_call(): 32, or 128 queries) and the query
// heads of KV head g over the keys of one 256-position chunk [lo, hi] (attention_tiled's
// chunks). Its arithmetic:
// - the queries are rounded to bfloat16 (to nearest even); the keys already are;
// - scores s = scale * (q . k), the dot product a TDPBF16PS chain over head_dim in steps of
//   32 (f32 accumulation);
// - over the chunk at once (not online): m = the largest score a query sees (NaN ignored),
//   p = exp(s - m) (exp_le0, ~1e-5 relative) rounded to bfloat16, p = 0 exactly for keys it does not
//   see; l = the sum of those rounded p in key order;
// - acc = sum_k p_k v_k, a TDPBF16PS chain over the chunk's keys in steps of 32.
// The partial state (m, l, acc) then merges with the other chunks' as on every tier.
//
// Bits: a query's scores, m, l and acc depend only on its own values and the keys it sees.
// Keys it does not see weigh exactly 0 (and zero padding keys add zeros), so a row gets the
// same bits alone (decode), in a block of rows, on any thread count. Not the bits of the
// f32 path (which reads bf16 rings exactly and keeps q in f32): a precision choice made for
// bfloat16 rings only, where the keys and values already have 8 significant bits.
// A non-finite V element must not reach the queries that do not see its key (0 x inf is
// NaN): the tiles get 0 in its place, and the queries that see the key add p x v for it
// afterwards, so they get the inf or NaN the plain arithmetic would give.
//
// Orientation: the score tiles are keys x queries (A = 16 keys x 32 dims, read in place
// from the ring with its row stride; B = the queries, transposed once per task into the
// pair-interleaved layout TDPBF16PS wants), so the ring needs no reshuffling. The value
// product is queries x dims (A = p, 16 queries x 32 keys: the softmax's rows transposed;
// B = 32 keys x 16 dims of V with the key pairs interleaved).

template <class S>
struct AmxAttnBf16 {
  static constexpr int kMaxKeys = 256;  // one chunk of attention_tiled
  static constexpr int kMaxHeadDim = 512;
  static constexpr int kMaxQueries = 128;  // rows x query heads per call

  static constexpr int kMaxRows = 32;

  // Whether the arguments' calls run here: bf16 K and V, a head dim of whole 32-element tile
  // steps, at most kMaxQueries query heads per KV head, AMX-BF16 on.
  static bool takes(const AttentionArgs &a) {
    static const bool hw = cpu_features().amx_bf16 && cpu_features().avx512bf16;
    return hw && a.k_type == KvType::BF16 && a.v_type == KvType::BF16 && a.head_dim % 32 == 0 &&
           a.head_dim <= kMaxHeadDim && a.n_head / a.n_head_kv <= kMaxQueries && amx_enabled();
  }
  // The most query rows of one call (kMaxRows, fewer for large groups).
  static int rows_per_call(const AttentionArgs &a) { return std::min(kMaxRows, kMaxQueries / (a.n_head / a.n_head_kv)); }
  // This call: also a chunk of at most 256 keys starting on a 32-key boundary.
  static bool usable(const AttentionArgs &a, int r0, int r1, int64_t lo, int64_t hi) {
    return lo % 32 == 0 && hi - lo < kMaxKeys && r1 > r0 && takes(a) && r1 - r0 <= rows_per_call(a);
  }

  __attribute__((target("amx-tile,amx-bf16"))) static void configure() {
    AmxTileConfig cfg;
    for (int t = 0; t < 8; ++t) {
      cfg.rows[t] = 16;
      cfg.colsb[t] = 64;
    }
    __asm__ volatile("" : : "r"(&cfg) : "memory");  // GCC 12 drops the stores otherwise (amx_impl.h)
    _tile_loadconfig(&cfg);
  }
  __attribute__((target("amx-tile,amx-bf16"))) static void release() { _tile_release(); }

  // 16 x 16 dwords transposed in registers: four rounds, each swapping bit b of the row
  // index with bit b of the column index (b = 8, 4, 2, 1) by two-source permutes.
  static void transpose16(__m512i r[16]) {
    // [round][lo, hi][16]: round b = 8 >> round; lo[j] = j & b ? 16 + j - b : j, hi[j] = j & b ? 16 + j : j + b.
    alignas(64) static constexpr int32_t kIdx[4][2][16] = {
        {{0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23}, {8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31}},
        {{0, 1, 2, 3, 16, 17, 18, 19, 8, 9, 10, 11, 24, 25, 26, 27}, {4, 5, 6, 7, 20, 21, 22, 23, 12, 13, 14, 15, 28, 29, 30, 31}},
        {{0, 1, 16, 17, 4, 5, 20, 21, 8, 9, 24, 25, 12, 13, 28, 29}, {2, 3, 18, 19, 6, 7, 22, 23, 10, 11, 26, 27, 14, 15, 30, 31}},
        {{0, 16, 2, 18, 4, 20, 6, 22, 8, 24, 10, 26, 12, 28, 14, 30}, {1, 17, 3, 19, 5, 21, 7, 23, 9, 25, 11, 27, 13, 29, 15, 31}}};
    for (int round = 0; round < 4; ++round) {
      const int b = 8 >> round;
      const __m512i il = _mm512_load_si512(kIdx[round][0]), ih = _mm512_load_si512(kIdx[round][1]);
      for (int i = 0; i < 16; ++i) {
        if (i & b) continue;
        const __m512i x = r[i], y = r[i + b];
        r[i] = _mm512_permutex2var_epi32(x, il, y);
        r[i + b] = _mm512_permutex2var_epi32(x, ih, y);
      }
    }
  }

  // exp(x) for x <= 0 (a score minus its query's maximum), to ~1e-5 relative: its result is
  // rounded to bf16 next (2^-9). x below -87 or NaN gives exp(-87) (~1.6e-38; a NaN score
  // weighs about nothing, as in the f32 kernels). 2^(x log2 e) as 2^n 2^f, |f| <= 1/2, 2^f by
  // a degree-4 polynomial, 2^n by vscalefps.
  static __m512 exp_le0(__m512 x) {
    x = _mm512_max_ps(x, _mm512_set1_ps(-87.0f));  // max(NaN, c) = c
    const __m512 y = _mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f));
    const __m512 n = _mm512_roundscale_ps(y, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m512 f = _mm512_sub_ps(y, n);
    __m512 p = _mm512_set1_ps(9.6181291e-3f);
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(5.5504109e-2f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(2.4022651e-1f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(6.9314718e-1f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
    return _mm512_scalef_ps(p, n);
  }

  // 16 f32 -> bf16 -> f32, to nearest even (the value TDPBF16PS will read).
  __attribute__((target("avx512bf16"))) static __m512 round_bf16(__m512 x) {
    const __m256i h = std::bit_cast<__m256i>(_mm512_cvtneps_pbh(x));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
  // Two rows of 16 f32 (exact bf16 values) as 16 dwords (lo[j] | hi[j] << 16).
  __attribute__((target("avx512bf16"))) static __m512i pair_bf16(__m512 lo, __m512 hi) {
    const __m512i both = std::bit_cast<__m512i>(_mm512_cvtne2ps_pbh(hi, lo));  // lo in elements 0..15
    return _mm512_permutexvar_epi16(interleave_idx(), both);
  }
  // Word permutation: out[2j] = in[j], out[2j + 1] = in[16 + j].
  static __m512i interleave_idx() {
    alignas(64) static const int16_t idx[32] = {0, 16, 1, 17, 2,  18, 3,  19, 4,  20, 5,  21, 6,  22, 7,  23,
                                                8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31};
    return _mm512_load_si512(idx);
  }

  struct Scratch {
    std::vector<uint8_t> bytes;
    uint8_t *get(size_t n) {
      if (bytes.size() < n + 64) bytes.resize(n + 64);
      return bytes.data() + (64 - reinterpret_cast<uintptr_t>(bytes.data()) % 64) % 64;
    }
  };

  __attribute__((target("avx512bf16,amx-tile,amx-bf16"))) static void rows(const AttentionArgs &a, int g, int r0,
                                                                           int r1, int64_t lo, int64_t hi,
                                                                           float *const *st) {
    const int group = a.n_head / a.n_head_kv, D = a.head_dim, DS = D / 32;
    auto row_lo = [&](int r) {
      const int64_t p = a.q_pos0 + r;
      return std::max(lo, a.window > 0 ? std::max<int64_t>(0, p - a.window + 1) : int64_t(0));
    };
    auto row_hi = [&](int r) { return std::min(hi, a.q_pos0 + r); };
    int64_t u_lo = hi + 1, u_hi = lo - 1;
    for (int r = r0; r < r1; ++r) {
      if (row_lo(r) > row_hi(r)) continue;
      u_lo = std::min(u_lo, row_lo(r));
      u_hi = std::max(u_hi, row_hi(r));
    }
    if (u_lo > u_hi) return;
    // The value steps start at multiples of 32 absolute positions whatever the rows: which
    // keys share a TDPBF16PS step (and so the order of a query's sums) must not depend on
    // the other rows of the call.
    const int64_t kb0 = u_lo - u_lo % 32;
    const int nk = int(u_hi - kb0 + 1);    // keys from kb0 (<= 256)
    const int nks = (nk + 31) / 32;        // 32-key value steps
    const int nq = (r1 - r0) * group;      // query q: row r0 + q / group, head g * group + q % group
    const int QT = (nq + 15) / 16, ldq = QT * 16;  // query tiles; floats per score row

    // Scratch: scores / p [nks * 32][ldq] f32 | P tiles [QT][nks] | V tiles [DS][nks][2] |
    // K rows of wrapping tiles [32][D] bf16 | two C tiles. The query tiles [QT][DS] have
    // their own buffer: they are kept across the chunks of one task (attention_task_id()).
    static thread_local Scratch scratch, q_scratch;
    struct QKey {
      uint64_t task = 0;
      const float *q = nullptr;
      int g = -1, r0 = -1, r1 = -1;
    };
    static thread_local QKey q_key;
    const size_t q_bytes = size_t(QT) * DS * 1024, s_bytes = size_t(nks) * 32 * ldq * 4,
                 p_bytes = size_t(QT) * nks * 1024, v_bytes = size_t(DS) * nks * 2048, k_bytes = size_t(32) * D * 2;
    uint8_t *base = scratch.get(s_bytes + p_bytes + v_bytes + k_bytes + 2048);
    float *sc = reinterpret_cast<float *>(base);
    uint8_t *p_tiles = base + s_bytes;
    uint8_t *v_tiles = p_tiles + p_bytes;
    uint8_t *k_tmp = v_tiles + v_bytes;
    float *c_tile = reinterpret_cast<float *>(k_tmp + k_bytes);
    const size_t q_had = q_scratch.bytes.size();
    uint8_t *qt_tiles = q_scratch.get(q_bytes);
    const uint64_t task = attention_task_id();
    const bool q_ready = q_scratch.bytes.size() == q_had && q_key.task == task && task != 0 && q_key.q == a.q &&
                         q_key.g == g && q_key.r0 == r0 && q_key.r1 == r1;

    // The queries as bf16 B tiles: tile (t, s) row i, dword j = elements 32 s + 2 i, + 1 of
    // query 16 t + j. (The same task's earlier chunk made them already: the same queries.)
    for (int t = 0; t < QT && !q_ready; ++t) {
      for (int s = 0; s < DS; ++s) {
        __m512i m[16];
        for (int j = 0; j < 16; ++j) {
          const int q = 16 * t + j;
          if (q >= nq) {
            m[j] = _mm512_setzero_si512();
            continue;
          }
          const float *qp = a.q + (size_t(r0 + q / group) * a.n_head + size_t(g) * group + q % group) * D + 32 * s;
          // Elements 0..31 as bf16 in order: dword i = (2 i, 2 i + 1).
          m[j] = std::bit_cast<__m512i>(_mm512_cvtne2ps_pbh(_mm512_loadu_ps(qp + 16), _mm512_loadu_ps(qp)));
        }
        transpose16(m);
        for (int i = 0; i < 16; ++i) _mm512_store_si512(qt_tiles + (size_t(t) * DS + s) * 1024 + 64 * i, m[i]);
      }
    }
    q_key = QKey{task, a.q, g, r0, r1};

    // Scores: the tiles of 32 keys (two key tiles) x 2 query tiles at a time.
    const size_t k_rb = kv_row_bytes(KvType::BF16, int64_t(a.n_head_kv) * D), k_off = size_t(g) * D * 2;
    const uint8_t *kring = static_cast<const uint8_t *>(a.k);
    configure();
    __asm__ volatile("" ::: "memory");  // the tiles below read what was just stored
    for (int ks = 0; ks < nks; ++ks) {
      const uint8_t *kp[2];
      size_t kst[2];
      for (int h = 0; h < 2; ++h) {
        const int64_t slot0 = (kb0 + 32 * ks + 16 * h) % a.kv_cap;
        if (slot0 + 16 <= a.kv_cap) {
          kp[h] = kring + size_t(slot0) * k_rb + k_off;
          kst[h] = k_rb;
        } else {  // the ring wraps inside this tile: its rows copied in order
          int64_t slot = slot0;
          uint8_t *dst = k_tmp + size_t(h) * 16 * D * 2;
          for (int i = 0; i < 16; ++i) {
            std::memcpy(dst + size_t(i) * D * 2, kring + size_t(slot) * k_rb + k_off, size_t(D) * 2);
            if (++slot == a.kv_cap) slot = 0;
          }
          __asm__ volatile("" ::: "memory");
          kp[h] = dst;
          kst[h] = size_t(D) * 2;
        }
      }
      float *out = sc + size_t(32 * ks) * ldq;
      int t = 0;
      for (; t + 2 <= QT; t += 2) {
        score_block<2>(kp, kst, qt_tiles + size_t(t) * DS * 1024, DS, out + 16 * t, size_t(ldq) * 4);
      }
      if (t < QT) score_block<1>(kp, kst, qt_tiles + size_t(t) * DS * 1024, DS, out + 16 * t, size_t(ldq) * 4);
    }

    // Softmax over the chunk per query (16 queries per vector), keys outside a query's range
    // masked: p = 0, and no part in m or l.
    alignas(64) float mq[kMaxQueries], lq[kMaxQueries];
    alignas(64) int32_t qlo[kMaxQueries], qhi[kMaxQueries];
    for (int q = 0; q < ldq; ++q) {
      int r = r0 + q / group;
      if (q < nq && row_lo(r) <= row_hi(r)) {
        qlo[q] = int32_t(row_lo(r) - kb0);
        qhi[q] = int32_t(row_hi(r) - kb0);
      } else {
        qlo[q] = 1;
        qhi[q] = 0;
      }
    }
    const __m512 scale = _mm512_set1_ps(a.scale);
    for (int t = 0; t < QT; ++t) {
      const __m512i vlo = _mm512_load_si512(qlo + 16 * t), vhi = _mm512_load_si512(qhi + 16 * t);
      __m512 m = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
      __m512 l = _mm512_setzero_ps();
      // Every query of the tile sees every key [0, nk) (or is padding): no masks, the same
      // values (the masked keys past nk add +0 to l there).
      const __mmask16 pad = _mm512_cmpgt_epi32_mask(vlo, vhi);
      const __mmask16 all = _mm512_cmple_epi32_mask(vlo, _mm512_setzero_si512()) &
                            _mm512_cmpge_epi32_mask(vhi, _mm512_set1_epi32(nk - 1));
      if (__mmask16(pad | all) == 0xFFFF) {
        for (int k = 0; k < nk; ++k) m = _mm512_max_ps(_mm512_mul_ps(_mm512_loadu_ps(sc + size_t(k) * ldq + 16 * t), scale), m);
        for (int k = 0; k < nk; ++k) {
          float *row = sc + size_t(k) * ldq + 16 * t;
          const __m512 p = round_bf16(exp_le0(_mm512_sub_ps(_mm512_mul_ps(_mm512_loadu_ps(row), scale), m)));
          _mm512_storeu_ps(row, p);
          l = _mm512_add_ps(l, p);
        }
        for (int k = nk; k < 32 * nks; ++k) _mm512_storeu_ps(sc + size_t(k) * ldq + 16 * t, _mm512_setzero_ps());
      } else {
        for (int k = 0; k < nk; ++k) {
          const __m512i kk = _mm512_set1_epi32(k);
          const __mmask16 see = _mm512_cmple_epi32_mask(vlo, kk) & _mm512_cmpge_epi32_mask(vhi, kk);
          const __m512 s = _mm512_mul_ps(_mm512_loadu_ps(sc + size_t(k) * ldq + 16 * t), scale);
          m = _mm512_mask_max_ps(m, see, s, m);  // max(s, m): m where s is NaN
        }
        for (int k = 0; k < 32 * nks; ++k) {
          float *row = sc + size_t(k) * ldq + 16 * t;
          const __m512i kk = _mm512_set1_epi32(k);
          const __mmask16 see = _mm512_cmple_epi32_mask(vlo, kk) & _mm512_cmpge_epi32_mask(vhi, kk);
          const __m512 s = _mm512_mul_ps(_mm512_loadu_ps(row), scale);
          const __m512 p = round_bf16(_mm512_maskz_mov_ps(see, exp_le0(_mm512_sub_ps(s, m))));
          _mm512_storeu_ps(row, p);
          l = _mm512_add_ps(l, p);
        }
      }
      _mm512_store_ps(mq + 16 * t, m);
      _mm512_store_ps(lq + 16 * t, l);
      // The p rows of this query tile as A tiles: tile (t, ks) row j = query 16 t + j's p of
      // keys 32 ks .. 32 ks + 31 as bf16.
      for (int ks = 0; ks < nks; ++ks) {
        __m512i mm[16];
        for (int i = 0; i < 16; ++i) {
          const float *r0p = sc + size_t(32 * ks + 2 * i) * ldq + 16 * t;
          mm[i] = pair_bf16(_mm512_loadu_ps(r0p), _mm512_loadu_ps(r0p + ldq));
        }
        transpose16(mm);
        for (int j = 0; j < 16; ++j) _mm512_store_si512(p_tiles + (size_t(t) * nks + ks) * 1024 + 64 * j, mm[j]);
      }
    }

    // Values: for each 32 dims (two 16-dim column blocks), the B tiles of every 32 keys
    // (key pairs interleaved), then 2 query tiles x the two column blocks at a time.
    const size_t v_rb = kv_row_bytes(KvType::BF16, int64_t(a.n_head_kv) * D), v_off = size_t(g) * D * 2;
    const uint8_t *vring = static_cast<const uint8_t *>(a.v);
    alignas(64) static const uint8_t kZeroRow[2 * kMaxHeadDim] = {};
    const uint8_t *vrow[kMaxKeys + 32];
    for (int k = 0; k < 32 * nks; ++k) {
      vrow[k] = k < nk ? vring + size_t((kb0 + k) % a.kv_cap) * v_rb + v_off : kZeroRow;
    }
    const __m512i expo = _mm512_set1_epi16(0x7F80);
    // Unpacking a pair of key rows' 32 dims interleaves the keys within 128-bit lanes: lane L of
    // lo_half holds dims 8 L .. 8 L + 3, of hi_half 8 L + 4 .. 8 L + 7 (the B tiles' column
    // order, so the C tiles' too); un0 / un1 put dims 0..15 / 16..31 back in order.
    alignas(64) static constexpr int32_t kUn0[16] = {0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22, 23};
    alignas(64) static constexpr int32_t kUn1[16] = {8, 9, 10, 11, 24, 25, 26, 27, 12, 13, 14, 15, 28, 29, 30, 31};
    const __m512i un0 = _mm512_load_si512(kUn0), un1 = _mm512_load_si512(kUn1);
    bool nonfinite = false;
    // Every V tile of the chunk first, each key pair's rows read once from start to end;
    // V tile (ds, ks, half) row i: keys 32 ks + 2 i, + 1 of 16 of the dims 32 ds .. + 31 (the
    // lane order below).
    for (int ks = 0; ks < nks; ++ks) {
      for (int i = 0; i < 16; ++i) {
        const uint8_t *r0p = vrow[32 * ks + 2 * i], *r1p = vrow[32 * ks + 2 * i + 1];
        for (int ds = 0; ds < DS; ++ds) {
          const __m512i x0 = _mm512_loadu_si512(r0p + 64 * ds), x1 = _mm512_loadu_si512(r1p + 64 * ds);
          __m512i lo_half = _mm512_unpacklo_epi16(x0, x1), hi_half = _mm512_unpackhi_epi16(x0, x1);
          const __mmask32 bad_lo = _mm512_cmpeq_epi16_mask(_mm512_and_si512(lo_half, expo), expo);
          const __mmask32 bad_hi = _mm512_cmpeq_epi16_mask(_mm512_and_si512(hi_half, expo), expo);
          if (bad_lo | bad_hi) {
            nonfinite = true;
            lo_half = _mm512_maskz_mov_epi16(~bad_lo, lo_half);
            hi_half = _mm512_maskz_mov_epi16(~bad_hi, hi_half);
          }
          uint8_t *vt = v_tiles + (size_t(ds) * nks + ks) * 2048 + 64 * i;
          _mm512_store_si512(vt, lo_half);
          _mm512_store_si512(vt + 1024, hi_half);
        }
      }
    }
    __asm__ volatile("" ::: "memory");
    for (int ds = 0; ds < DS; ++ds) {
      // c: the query tile's two C tiles (columns: lo_half's dims, then hi_half's), back in
      // dim order for each query's acc.
      auto put = [&](int t, const float *c) {
        for (int j = 0; j < 16; ++j) {
          const int q = 16 * t + j;
          if (qlo[q] > qhi[q]) continue;
          const __m512 lo = _mm512_load_ps(c + 16 * j), hi = _mm512_load_ps(c + 256 + 16 * j);
          float *acc = st[q / group] + 2 * group + size_t(q % group) * D + 32 * ds;
          _mm512_storeu_ps(acc, _mm512_permutex2var_ps(lo, un0, hi));
          _mm512_storeu_ps(acc + 16, _mm512_permutex2var_ps(lo, un1, hi));
        }
      };
      int t = 0;
      for (; t + 2 <= QT; t += 2) value_block<2>(p_tiles + size_t(t) * nks * 1024, nks, v_tiles + size_t(ds) * nks * 2048, c_tile, t, put);
      if (t < QT) value_block<1>(p_tiles + size_t(t) * nks * 1024, nks, v_tiles + size_t(ds) * nks * 2048, c_tile, t, put);
    }
    release();

    for (int q = 0; q < nq; ++q) {
      if (qlo[q] > qhi[q]) continue;
      float *m = st[q / group];
      m[q % group] = mq[q];
      m[group + q % group] = lq[q];
    }
    if (nonfinite) add_nonfinite_values(st, group, D, nq, ldq, qlo, qhi, sc, vrow);
  }

  // Scores of 32 keys (key tiles kp[0], kp[1]: 16 keys x 32 dims per step, row strides
  // kst) x NT query tiles (qtiles: [NT][DS] B tiles), summed over the DS steps of the head
  // dim, stored to out (rows: keys; query tile t at column 16 t; row stride ld bytes).
  // Tiles: 0-3 C (key tile h, query tile t) at 2 t + h, 4-5 keys, 6-7 queries.
  template <int NT>
  __attribute__((target("amx-tile,amx-bf16"))) static void score_block(const uint8_t *const kp[2],
                                                                        const size_t kst[2], const uint8_t *qtiles,
                                                                        int DS, float *out, size_t ld) {
    _tile_zero(0);
    _tile_zero(1);
    if constexpr (NT > 1) {
      _tile_zero(2);
      _tile_zero(3);
    }
    for (int s = 0; s < DS; ++s) {
      _tile_loadd(4, kp[0] + 64 * s, kst[0]);
      _tile_loadd(5, kp[1] + 64 * s, kst[1]);
      _tile_loadd(6, qtiles + size_t(s) * 1024, 64);
      _tile_dpbf16ps(0, 4, 6);
      _tile_dpbf16ps(1, 5, 6);
      if constexpr (NT > 1) {
        _tile_loadd(7, qtiles + size_t(DS + s) * 1024, 64);
        _tile_dpbf16ps(2, 4, 7);
        _tile_dpbf16ps(3, 5, 7);
      }
    }
    const size_t row16 = 16 * ld / sizeof(float);  // floats to the second key tile
    _tile_stored(0, out, ld);
    _tile_stored(1, out + row16, ld);
    if constexpr (NT > 1) {
      _tile_stored(2, out + 16, ld);
      _tile_stored(3, out + row16 + 16, ld);
    }
  }

  // p x V for NT query tiles (ptiles: [NT][nks] A tiles) and two 16-dim column blocks
  // (vtiles: [nks][2] B tiles), summed over the nks 32-key steps; each query tile's two C
  // tiles stored to c (2 x 16 x 16 f32) and handed to put(query tile, c). Tiles: 0-3 C
  // (query tile t, half h) at 2 t + h, 4-5 p, 6-7 values.
  template <int NT, class Put>
  __attribute__((target("amx-tile,amx-bf16"))) static void value_block(const uint8_t *ptiles, int nks,
                                                                        const uint8_t *vtiles, float *c, int t0,
                                                                        Put &&put) {
    _tile_zero(0);
    _tile_zero(1);
    if constexpr (NT > 1) {
      _tile_zero(2);
      _tile_zero(3);
    }
    for (int ks = 0; ks < nks; ++ks) {
      _tile_loadd(6, vtiles + size_t(2 * ks) * 1024, 64);
      _tile_loadd(7, vtiles + size_t(2 * ks + 1) * 1024, 64);
      _tile_loadd(4, ptiles + size_t(ks) * 1024, 64);
      _tile_dpbf16ps(0, 4, 6);
      _tile_dpbf16ps(1, 4, 7);
      if constexpr (NT > 1) {
        _tile_loadd(5, ptiles + size_t(nks + ks) * 1024, 64);
        _tile_dpbf16ps(2, 5, 6);
        _tile_dpbf16ps(3, 5, 7);
      }
    }
    _tile_stored(0, c, 64);
    _tile_stored(1, c + 256, 64);
    put(t0, c);
    if constexpr (NT > 1) {
      _tile_stored(2, c, 64);
      _tile_stored(3, c + 256, 64);
      put(t0 + 1, c);
    }
  }

  // The V elements that are inf or NaN, left out of the tiles, added by the queries that
  // see their key: acc += p * v (p as the tiles used it).
  static void add_nonfinite_values(float *const *st, int group, int D, int nq, int ldq, const int32_t *qlo,
                                   const int32_t *qhi, const float *sc, const uint8_t *const *vrow) {
    for (int q = 0; q < nq; ++q) {
      float *acc = st[q / group] + 2 * group + size_t(q % group) * D;
      for (int k = qlo[q]; k <= qhi[q]; ++k) {
        const uint8_t *v = vrow[k];
        for (int d = 0; d < D; ++d) {
          uint16_t h;
          std::memcpy(&h, v + 2 * d, 2);
          if ((h & 0x7F80) != 0x7F80) continue;
          const uint32_t w = uint32_t(h) << 16;
          float x;
          std::memcpy(&x, &w, 4);
          acc[d] += sc[size_t(k) * ldq + q] * x;
        }
      }
    }
  }
};

// AMX-INT8 tile kernels for the avx512 tier's quantized matmuls of the 32-element block
// formats (Q8_0, Q4_0, Q5_0): full tiles of 16 activation rows x 16 weight rows (one packed
// group) per TDPBSSD, the rest of the rows on the tier's VNNI kernels (qgemm_impl.h).
// Include only from tier_avx512.cpp, inside its anonymous namespace, after qgemm_impl.h.
//
// The same bits as the VNNI kernels, by construction: per 32-element block a tile computes
// every (row, weight row) pair's exact integer sum of the signed weights times the s8
// activations (TDPBSSD; the VNNI kernel's sum of u8 quants, offset taken back, is the same
// integer), and the f32 step is the VNNI kernel's,
//   acc += (d_w * d_x) * float(isum),
// for every block in block order, lane by lane.
//
// The packed layout already is AMX's B layout: a block's k-group j (4 elements) of the 16
// weight rows is 64 bytes [i][e], i.e. row j of an 8 x 64-byte B tile. Each group's blocks
// are expanded once per row block into a per-thread buffer as signed bytes (the stored u8
// minus the type's offset; Q4_0 / Q5_0 unpack their nibbles and fifth bits first), reused
// by every 16-row tile of the row block. Signed weights leave the f32 step with one load
// per row and block besides the scales: it, not the tile product, bounds these kernels.
//
// Tiles: 0, 1 accumulators (16 x 16 int32) of two consecutive blocks; 2, 4 their activation
// tiles (16 rows x 32 bytes, read in place from the quantized rows with the row stride K);
// 3, 5 their weight tiles (8 x 64 bytes).

struct alignas(64) AmxTileConfig {
  uint8_t palette = 1, start_row = 0, reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// GCC's _tile_stored clobbers all memory, which makes the accumulators that the f32 steps
// keep in registers go through the stack around every store. This one says what it writes:
// the 16 x 16 int32 block at c (row stride 64 bytes). Tile loads read memory the asm does not
// name (GCC's _tile_loadd names none either): the weight buffer they read is written before
// a compiler barrier (gemm), the activations not at all.
#define GEIST_TILE_STORE_C(t, c) \
  __asm__ volatile("tilestored %%tmm" #t ", (%1,%2,1)" : "=m"(*reinterpret_cast<int32_t(*)[256]>(c)) : "r"(c), "r"(64L))

template <class S>
struct AmxQ32 {
  using K8 = Kernels<S>;
  static constexpr int kRows = 16;  // activation rows per tile
  // Rows per row block: the expanded weights of a group serve this many rows' tiles (the
  // VNNI kernel's 64 left the expansion a large share at 512 rows).
  static constexpr int kRowBlock = 256;

  __attribute__((target("amx-tile,amx-int8"))) static void configure() {
    AmxTileConfig cfg;
    for (int t : {0, 1}) {
      cfg.rows[t] = 16;
      cfg.colsb[t] = 64;
    }
    for (int t : {2, 4}) {
      cfg.rows[t] = 16;
      cfg.colsb[t] = 32;
    }
    for (int t : {3, 5}) {
      cfg.rows[t] = 8;
      cfg.colsb[t] = 64;
    }
    // GCC 12 does not see the builtin read cfg and drops the stores above (leaving an
    // all-zero configuration, whose first tile instruction faults): make them visible.
    __asm__ volatile("" : : "r"(&cfg) : "memory");
    _tile_loadconfig(&cfg);
  }

  __attribute__((target("amx-tile,amx-int8"))) static void release() { _tile_release(); }

  // The B tiles of every block of group `grp` (nb blocks) into out (nb x 512 bytes), as
  // signed weights: the packed u8 minus the offset (wraps for Q8_0's + 128, as int8 does).
  template <quant::GgmlType T>
  static void expand(const uint8_t *grp, int64_t nb, uint8_t *out) {
    constexpr int per = K8::template per_block<T>();
    const __m512i off = _mm512_set1_epi8(static_cast<char>(K8::template offset<T>()));
    for (int64_t b = 0; b < nb; ++b) {
      for (int j = 0; j < 8; ++j) {
        _mm512_storeu_si512(out + 512 * b + 64 * j, _mm512_sub_epi8(K8::template wvec<T>(grp + b * per, j, 0), off));
      }
    }
  }

  // Block b's tile product, into tiles (0, 2, 3) or (1, 4, 5) by parity, stored to c[b % 2].
  // (A member function, not a lambda: clang does not give a lambda its function's target.)
  __attribute__((target("amx-tile,amx-int8"))) static void product(const int8_t *xq, int64_t K, const uint8_t *bt,
                                                                   int64_t b, int32_t (*c)[16 * 16]) {
    if ((b & 1) == 0) {
      _tile_zero(0);
      _tile_loadd(2, xq + 32 * b, K);
      _tile_loadd(3, bt + 512 * b, 64);
      _tile_dpbssd(0, 2, 3);
      GEIST_TILE_STORE_C(0, c[0]);
    } else {
      _tile_zero(1);
      _tile_loadd(4, xq + 32 * b, K);
      _tile_loadd(5, bt + 512 * b, 64);
      _tile_dpbssd(1, 4, 5);
      GEIST_TILE_STORE_C(1, c[1]);
    }
  }

  // One tile: activation rows [r0, r0 + 16) of group g; bt: the group's B tiles (nb x 512
  // bytes, 64-byte rows).
  template <quant::GgmlType T>
  __attribute__((target("amx-tile,amx-int8"))) static void tile(const GemmArgs &a, int64_t g, int r0,
                                                                const uint8_t *bt) {
    constexpr int per = K8::template per_block<T>();
    const int64_t K = a.K, nb = K / 32;
    const uint8_t *grp = a.w + g * a.group_bytes;
    const uint8_t *scales = grp + nb * per;
    const int64_t n0 = g * 16;
    const int n_valid = int(std::min<int64_t>(16, a.n_out - n0));
    if (n_valid <= 0) return;
    const int8_t *xq = a.xq + int64_t(r0) * K;
    const float *xd = a.xd + int64_t(r0) * nb;
    alignas(64) int32_t c[2][16 * 16];
    __m512 acc[kRows];  // in registers: every loop over them is unrolled
    #pragma GCC unroll 16
    for (int r = 0; r < kRows; ++r) acc[r] = _mm512_setzero_ps();
    // Software-pipelined: block b + 1's product runs on the tile unit while the vector units
    // take block b's f32 steps (each waits only for its own block's stored sums).
    product(xq, K, bt, 0, c);
    for (int64_t b = 0; b < nb; ++b) {
      if (b + 1 < nb) product(xq, K, bt, b + 1, c);
      // Block b's f32 steps from its integer sums (row r at cb + 16 r).
      const int32_t *cb = c[b & 1];
      const __m512 dw = S::cvtph(scales + 32 * b);
      #pragma GCC unroll 16
      for (int r = 0; r < kRows; ++r) {
        const __m512 dx = _mm512_set1_ps(xd[r * nb + b]);
        acc[r] = _mm512_add_ps(acc[r], _mm512_mul_ps(_mm512_mul_ps(dw, dx), _mm512_cvtepi32_ps(_mm512_load_si512(cb + 16 * r))));
      }
    }
    float *y = a.y + int64_t(r0) * a.ldy + n0;
    #pragma GCC unroll 16
    for (int r = 0; r < kRows; ++r) S::store(y + r * a.ldy, acc[r], n_valid);
  }

  // Rows [full, n_rows) of a call (fewer than a tile) on the VNNI kernel; act_block: the
  // activation format's block (32: Q8_0, 256: Q8_K).
  template <quant::GgmlType T>
  static void rest_on_vnni(const GemmArgs &a, int full, int act_block, int64_t g0, int64_t g1) {
    if (full >= a.n_rows) return;
    GemmArgs t = a;
    t.xq += int64_t(full) * a.K;
    t.xd += int64_t(full) * (a.K / act_block);
    t.xs32 += int64_t(full) * (a.K / 32);
    t.xs16 += int64_t(full) * (a.K / 16);
    t.y += int64_t(full) * a.ldy;
    t.n_rows = a.n_rows - full;
    K8::template gemm<T>(t, g0, g1);
  }

  // qgemm.h's GemmFn contract for groups [g0, g1): the rows' full 16-row tiles on AMX, in
  // row blocks of kRowBlock, the remaining rows (fewer than 16) by the VNNI kernel.
  template <quant::GgmlType T>
  static void gemm(const GemmArgs &a, int64_t g0, int64_t g1) {
    const int full = a.n_rows / kRows * kRows;
    if (full > 0) {
      const int64_t nb = a.K / 32;
      thread_local std::vector<uint8_t> buf;
      if (buf.size() < size_t(512 * nb)) buf.resize(size_t(512 * nb));
      configure();
      for (int rb = 0; rb < full; rb += AmxQ32<S>::kRowBlock) {
        const int re = std::min(full, rb + AmxQ32<S>::kRowBlock);
        for (int64_t g = g0; g < g1; ++g) {
          expand<T>(a.w + g * a.group_bytes, nb, buf.data());
          __asm__ volatile("" : : : "memory");  // the tile loads read buf
          for (int r0 = rb; r0 < re; r0 += kRows) tile<T>(a, g, r0, buf.data());
        }
      }
      release();
    }
    AmxQ32<S>::template rest_on_vnni<T>(a, full, 32, g0, g1);
  }
};

// Q4_K and Q5_K on AMX tiles. A super-block's integer step is isum = sum_t sc_t p_t over its
// 8 sub-blocks (p_t the exact sum of q x over sub-block t, sc_t its 6-bit scale for that
// output row). The scale differs per output row and sub-block, so it goes into the B tiles:
// sc = 8 a + b with a, b <= 7 keeps a q and b q within a byte (q <= 31: <= 217 needs u8, so
// TDPBSUD, signed activations times unsigned weights), and two accumulators over the
// super-block's four K = 64 chunks give C_a = sum_t a_t p_t and C_b = sum_t b_t p_t, so
// isum = 8 C_a + C_b exactly (int32, |isum| < 2^26). The f32 step is the VNNI kernel's
// block_step_mins for 8 rows at a time, mins and all: the same bits.
//
// Per group and row block the B tiles of all its super-blocks are built once into a
// per-thread buffer (2 x 4 KiB per super-block: tile (s, c, v) at 1024 ((4 s + c) 2 + v),
// row 8 u + j = k-group j of sub-block 2 c + u): q times a_t (v = 0) or b_t (v = 1) by bit
// masks of the scale (a q = (q & -a0) + (2q & -a1) + (4q & -a2), as masked adds).
//
// Tiles: 0 (C_a) and 1 (C_b) 16 x 16 int32; 2 the activations (16 rows x 64 bytes, stride K);
// 3 and 4 the B tiles (16 x 64 bytes).
template <class S>
struct AmxK45 {
  using K8 = Kernels<S>;
  using I = typename S::I;
  using F = typename S::F;
  static constexpr int kRows = 16;

  __attribute__((target("amx-tile,amx-int8"))) static void configure() {
    AmxTileConfig cfg;
    for (int t = 0; t < 5; ++t) {
      cfg.rows[t] = 16;
      cfg.colsb[t] = 64;
    }
    __asm__ volatile("" : : "r"(&cfg) : "memory");  // see AmxQ32::configure
    _tile_loadconfig(&cfg);
  }

  template <quant::GgmlType T>
  static void expand(const uint8_t *grp, int64_t nsb, uint8_t *out) {
    constexpr bool q5 = T == quant::GgmlType::Q5_K;
    constexpr size_t sb_bytes = q5 ? 3008 : 2496;
    constexpr size_t off = q5 ? 2560 : 2048;
    for (int64_t s = 0; s < nsb; ++s) {
      const uint8_t *o = grp + s * sb_bytes;
      for (int t = 0; t < 8; ++t) {
        // The scale of row i in the 4 bytes of lane i, and its six bits as byte masks.
        const I sc = _mm512_mullo_epi32(S::load_u8_i32(o + off + 16 * t), _mm512_set1_epi32(0x01010101));
        const __mmask64 m0 = _mm512_test_epi8_mask(sc, _mm512_set1_epi8(1));
        const __mmask64 m1 = _mm512_test_epi8_mask(sc, _mm512_set1_epi8(2));
        const __mmask64 m2 = _mm512_test_epi8_mask(sc, _mm512_set1_epi8(4));
        const __mmask64 m3 = _mm512_test_epi8_mask(sc, _mm512_set1_epi8(8));
        const __mmask64 m4 = _mm512_test_epi8_mask(sc, _mm512_set1_epi8(16));
        const __mmask64 m5 = _mm512_test_epi8_mask(sc, _mm512_set1_epi8(32));
        uint8_t *ta = out + 1024 * ((4 * s + t / 2) * 2) + 512 * (t % 2);
        uint8_t *tb = ta + 1024;
        #pragma GCC unroll 8
        for (int j = 0; j < 8; ++j) {
          const I q = K8::nibbles(o + 256 * t, q5 ? o + 2048 + 64 * t : nullptr, j, 0);
          const I q2 = _mm512_add_epi8(q, q), q4 = _mm512_add_epi8(q2, q2);
          I b = _mm512_maskz_mov_epi8(m0, q);
          b = _mm512_mask_add_epi8(b, m1, b, q2);
          b = _mm512_mask_add_epi8(b, m2, b, q4);
          I a = _mm512_maskz_mov_epi8(m3, q);
          a = _mm512_mask_add_epi8(a, m4, a, q2);
          a = _mm512_mask_add_epi8(a, m5, a, q4);
          _mm512_storeu_si512(ta + 64 * j, a);
          _mm512_storeu_si512(tb + 64 * j, b);
        }
      }
    }
  }

  template <quant::GgmlType T>
  __attribute__((target("amx-tile,amx-int8"))) static void tile(const GemmArgs &a, int64_t g, int r0,
                                                                const uint8_t *bt) {
    constexpr bool q5 = T == quant::GgmlType::Q5_K;
    constexpr size_t sb_bytes = q5 ? 3008 : 2496;
    constexpr size_t off = q5 ? 2560 : 2048;
    const int64_t K = a.K, nsb = K / 256;
    const uint8_t *grp = a.w + g * a.group_bytes;
    const int64_t n0 = g * 16;
    const int n_valid = int(std::min<int64_t>(16, a.n_out - n0));
    if (n_valid <= 0) return;
    const int8_t *xq = a.xq + int64_t(r0) * K;
    alignas(64) int32_t c[2][16 * 16];
    F acc0[8], acc1[8];  // rows 0-7 and 8-15
    #pragma GCC unroll 8
    for (int r = 0; r < 8; ++r) acc0[r] = acc1[r] = S::fzero();
    for (int64_t s = 0; s < nsb; ++s) {
      _tile_zero(0);
      _tile_zero(1);
      #pragma GCC unroll 4
      for (int ch = 0; ch < 4; ++ch) {
        const uint8_t *b = bt + 1024 * ((4 * s + ch) * 2);
        _tile_loadd(2, xq + 256 * s + 64 * ch, K);
        _tile_loadd(3, b, 64);
        _tile_loadd(4, b + 1024, 64);
        _tile_dpbsud(0, 2, 3);
        _tile_dpbsud(1, 2, 4);
      }
      GEIST_TILE_STORE_C(0, c[0]);
      GEIST_TILE_STORE_C(1, c[1]);
      const uint8_t *o = grp + s * sb_bytes;
      const F d = S::cvtph(o + off + 384), dmin = S::cvtph(o + off + 416);
      I isum[8];
      #pragma GCC unroll 8
      for (int r = 0; r < 8; ++r) {
        isum[r] = _mm512_add_epi32(_mm512_slli_epi32(_mm512_load_si512(c[0] + 16 * r), 3),
                                   _mm512_load_si512(c[1] + 16 * r));
      }
      K8::template block_step_mins<4, 8>(acc0, isum, o + off + 128, 0, d, dmin, a.xs32, K / 32, a, r0, s);
      #pragma GCC unroll 8
      for (int r = 0; r < 8; ++r) {
        isum[r] = _mm512_add_epi32(_mm512_slli_epi32(_mm512_load_si512(c[0] + 16 * (r + 8)), 3),
                                   _mm512_load_si512(c[1] + 16 * (r + 8)));
      }
      K8::template block_step_mins<4, 8>(acc1, isum, o + off + 128, 0, d, dmin, a.xs32, K / 32, a, r0 + 8, s);
    }
    float *y = a.y + int64_t(r0) * a.ldy + n0;
    #pragma GCC unroll 8
    for (int r = 0; r < 8; ++r) {
      S::store(y + r * a.ldy, acc0[r], n_valid);
      S::store(y + (r + 8) * a.ldy, acc1[r], n_valid);
    }
  }

  template <quant::GgmlType T>
  static void gemm(const GemmArgs &a, int64_t g0, int64_t g1) {
    const int full = a.n_rows / kRows * kRows;
    if (full > 0) {
      const int64_t nsb = a.K / 256;
      thread_local std::vector<uint8_t> buf;
      if (buf.size() < size_t(8192 * nsb)) buf.resize(size_t(8192 * nsb));
      configure();
      for (int rb = 0; rb < full; rb += AmxQ32<S>::kRowBlock) {
        const int re = std::min(full, rb + AmxQ32<S>::kRowBlock);
        for (int64_t g = g0; g < g1; ++g) {
          expand<T>(a.w + g * a.group_bytes, nsb, buf.data());
          __asm__ volatile("" : : : "memory");  // the tile loads read buf
          for (int r0 = rb; r0 < re; r0 += kRows) tile<T>(a, g, r0, buf.data());
        }
      }
      AmxQ32<S>::release();
    }
    AmxQ32<S>::template rest_on_vnni<T>(a, full, 256, g0, g1);
  }
};

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
    // Block b's tile product, into tiles (0, 2, 3) or (1, 4, 5) by parity, stored to c[b % 2].
    auto product = [&](int64_t b) {
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
    };
    // Software-pipelined: block b + 1's product runs on the tile unit while the vector units
    // take block b's f32 steps (each waits only for its own block's stored sums).
    product(0);
    for (int64_t b = 0; b < nb; ++b) {
      if (b + 1 < nb) product(b + 1);
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

  // qgemm.h's GemmFn contract for groups [g0, g1): the rows' full 16-row tiles on AMX, in
  // row blocks of K8::kRowBlock as the VNNI kernel walks them, the remaining rows (fewer
  // than 16) by the VNNI kernel.
  template <quant::GgmlType T>
  static void gemm(const GemmArgs &a, int64_t g0, int64_t g1) {
    const int full = a.n_rows / kRows * kRows;
    if (full > 0) {
      const int64_t nb = a.K / 32;
      thread_local std::vector<uint8_t> buf;
      if (buf.size() < size_t(512 * nb)) buf.resize(size_t(512 * nb));
      configure();
      for (int rb = 0; rb < full; rb += K8::kRowBlock) {
        const int re = std::min(full, rb + K8::kRowBlock);
        for (int64_t g = g0; g < g1; ++g) {
          expand<T>(a.w + g * a.group_bytes, nb, buf.data());
          __asm__ volatile("" : : : "memory");  // the tile loads read buf
          for (int r0 = rb; r0 < re; r0 += kRows) tile<T>(a, g, r0, buf.data());
        }
      }
      release();
    }
    if (full < a.n_rows) {
      GemmArgs t = a;
      t.xq += int64_t(full) * a.K;
      t.xd += int64_t(full) * (a.K / 32);
      t.xs32 += int64_t(full) * (a.K / 32);
      t.xs16 += int64_t(full) * (a.K / 16);
      t.y += int64_t(full) * a.ldy;
      t.n_rows = a.n_rows - full;
      K8::template gemm<T>(t, g0, g1);
    }
  }
};

// Matmul for float weights (F32, F16, BF16) against f32 activations, over a SIMD
// abstraction S, instantiated by each tier TU (include only from there, inside its
// anonymous namespace).
//
// The arithmetic is ops.cpp's generic dot_f32, element for element: 16 partial sums,
// lane l taking k = l, l + 16, l + 32, ... (each step a rounded multiply, then a rounded
// add: no contraction), then the tree (l += l + 8, l += l + 4, l += l + 2, l += l + 1).
// F16 and BF16 convert to f32 exactly, so every tier gives the generic path's bits.
// Q4_1 and Q5_1 are dequantized L elements at a time as quant::dequantize_row does it
// (d * q, rounded, then + m, rounded), so they too give the generic bits.
//
// Tiles of WT weight rows x R activation rows keep WT * R 16-lane accumulators; the
// weights of a tile are converted once per 16 elements and used for all R rows. A K tail
// (K % 16) goes through zero-padded copies: adding 0 * 0 leaves a partial sum unchanged.

template <class S>
struct FloatGemm {
  using F = typename S::F;
  static constexpr int L = S::L;
  static constexpr int V = 16 / L;  // vectors per 16-lane partial sum
  static constexpr int WT = S::kFloatWT;
  static constexpr int RT = S::kFloatRT;

  template <quant::GgmlType T>
  static F wload(const uint8_t *row, int64_t k) {
    if constexpr (T == quant::GgmlType::F32) {
      return S::loadf(reinterpret_cast<const float *>(row) + k);
    } else if constexpr (T == quant::GgmlType::F16) {
      return S::cvtph(row + 2 * k);
    } else if constexpr (T == quant::GgmlType::Q4_1 || T == quant::GgmlType::Q5_1) {
      // k is a multiple of L (8 or 16), so the L elements lie in one half of a block:
      // the low nibbles (elements 0-15) or the high ones (16-31).
      constexpr bool q5 = T == quant::GgmlType::Q5_1;
      const uint8_t *bp = row + (k / 32) * (q5 ? 24 : 20);
      const int idx = static_cast<int>(k % 32);
      uint32_t hb = 0;
      if constexpr (q5) {
        std::memcpy(&hb, bp + 4, 4);
        hb >>= idx;
      }
      const F q = S::nib_f(bp + (q5 ? 8 : 4) + (idx & 15), idx >= 16 ? 4 : 0, hb);
      return S::add(S::mul(S::set1f(S::half1(bp)), q), S::set1f(S::half1(bp + 2)));
    } else {
      return S::cvtbf16(row + 2 * k);
    }
  }

  template <quant::GgmlType T>
  static float wscalar(const uint8_t *row, int64_t k) {
    if constexpr (T == quant::GgmlType::F32) {
      float v;
      std::memcpy(&v, row + 4 * k, 4);
      return v;
    } else if constexpr (T == quant::GgmlType::Q4_1 || T == quant::GgmlType::Q5_1) {
      float t[32];  // never reached: K is a multiple of 32 for these types
      quant::dequantize_row(T, row + (k / 32) * quant::traits(T).block_bytes, t, 32);
      return t[k % 32];
    } else {
      uint16_t h;
      std::memcpy(&h, row + 2 * k, 2);
      return T == quant::GgmlType::F16 ? quant::fp16_to_fp32(h) : quant::bf16_to_fp32(h);
    }
  }

  // Output rows n0..n0 + W - 1, whose weights are the W rows at w0, stride apart.
  template <quant::GgmlType T, int W, int R>
  static void tile(const FloatGemmArgs &a, int64_t n0, int r0, const uint8_t *w0, size_t stride) {
    const int64_t K = a.K;
    const uint8_t *rows[W];
    for (int i = 0; i < W; ++i) rows[i] = w0 + static_cast<size_t>(i) * stride;
    const float *xs[R];
    for (int r = 0; r < R; ++r) xs[r] = a.x + static_cast<size_t>(r0 + r) * K;
    F acc[W][R][V];
    for (int i = 0; i < W; ++i)
      for (int r = 0; r < R; ++r)
        for (int v = 0; v < V; ++v) acc[i][r][v] = S::fzero();
    const int64_t K16 = K / 16 * 16;
    for (int64_t k = 0; k < K16; k += 16) {
      for (int v = 0; v < V; ++v) {
        F w[W];
        for (int i = 0; i < W; ++i) w[i] = wload<T>(rows[i], k + v * L);
        for (int r = 0; r < R; ++r) {
          const F x = S::loadf(xs[r] + k + v * L);
          for (int i = 0; i < W; ++i) acc[i][r][v] = S::add(acc[i][r][v], S::mul(w[i], x));
        }
      }
    }
    if (K16 < K) {
      alignas(64) float wt[W][16] = {}, xt[R][16] = {};
      for (int i = 0; i < W; ++i)
        for (int64_t k = K16; k < K; ++k) wt[i][k - K16] = wscalar<T>(rows[i], k);
      for (int r = 0; r < R; ++r)
        for (int64_t k = K16; k < K; ++k) xt[r][k - K16] = xs[r][k];
      for (int v = 0; v < V; ++v) {
        for (int r = 0; r < R; ++r) {
          const F x = S::loadf(xt[r] + v * L);
          for (int i = 0; i < W; ++i) acc[i][r][v] = S::add(acc[i][r][v], S::mul(S::loadf(wt[i] + v * L), x));
        }
      }
    }
    for (int r = 0; r < R; ++r) {
      float *y = a.y + static_cast<size_t>(r0 + r) * a.ldy + (n0 - a.n_begin);
      for (int i = 0; i < W; ++i) y[i] = S::hsum16(acc[i][r]);
    }
  }

  template <quant::GgmlType T, int W>
  static void weight_tile_rows(const FloatGemmArgs &a, int64_t n0, const uint8_t *w0, size_t stride) {
    int r = 0;
    for (; r + RT <= a.n_rows; r += RT) tile<T, W, RT>(a, n0, r, w0, stride);
    const int rest = a.n_rows - r;
    if constexpr (RT > 1) {
      if (rest == 1) tile<T, W, 1>(a, n0, r, w0, stride);
    }
    if constexpr (RT > 2) {
      if (rest == 2) tile<T, W, 2>(a, n0, r, w0, stride);
    }
    if constexpr (RT > 3) {
      if (rest == 3) tile<T, W, 3>(a, n0, r, w0, stride);
    }
    static_assert(RT <= 4, "tails are instantiated for up to 3 rows");
  }

  template <quant::GgmlType T, int W>
  static void weight_tile(const FloatGemmArgs &a, int64_t n0) {
    const uint8_t *w0 = a.w + static_cast<size_t>(n0) * a.row_bytes;
    if constexpr (T == quant::GgmlType::Q4_1 || T == quant::GgmlType::Q5_1) {
      // Several activation rows: the W weight rows are dequantized once into f32 rows
      // ([W][K], thread-local, L1/L2-sized for the model widths) and every row tile reads
      // those: the same values, so the same bits, without converting per tile.
      if (a.n_rows > 1) {
        thread_local std::vector<float> buf;
        const int64_t K = a.K;
        if (static_cast<int64_t>(buf.size()) < W * K) buf.resize(static_cast<size_t>(W * K));
        for (int i = 0; i < W; ++i)
          for (int64_t k = 0; k < K; k += L) S::storef(buf.data() + i * K + k, wload<T>(w0 + i * a.row_bytes, k));
        weight_tile_rows<quant::GgmlType::F32, W>(a, n0, reinterpret_cast<const uint8_t *>(buf.data()),
                                                  sizeof(float) * static_cast<size_t>(K));
        return;
      }
    }
    weight_tile_rows<T, W>(a, n0, w0, a.row_bytes);
  }

  // Output rows [n0, n1) for every activation row.
  template <quant::GgmlType T>
  static void gemm(const FloatGemmArgs &a, int64_t n0, int64_t n1) {
    int64_t n = n0;
    for (; n + WT <= n1; n += WT) weight_tile<T, WT>(a, n);
    for (; n < n1; ++n) weight_tile<T, 1>(a, n);
  }
};

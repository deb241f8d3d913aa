// Matmul for float weights (F32, F16, BF16) against f32 activations, over a SIMD
// abstraction S, instantiated by each tier TU (include only from there, inside its
// anonymous namespace).
//
// The arithmetic is ops.cpp's generic dot_f32, element for element: 16 partial sums,
// lane l taking k = l, l + 16, l + 32, ... (each step a rounded multiply, then a rounded
// add: no contraction), then the tree (l += l + 8, l += l + 4, l += l + 2, l += l + 1).
// F16 and BF16 convert to f32 exactly, so every tier gives the generic path's bits.
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
    } else {
      uint16_t h;
      std::memcpy(&h, row + 2 * k, 2);
      return T == quant::GgmlType::F16 ? quant::fp16_to_fp32(h) : quant::bf16_to_fp32(h);
    }
  }

  template <quant::GgmlType T, int W, int R>
  static void tile(const FloatGemmArgs &a, int64_t n0, int r0) {
    const int64_t K = a.K;
    const uint8_t *rows[W];
    for (int i = 0; i < W; ++i) rows[i] = a.w + static_cast<size_t>(n0 + i) * a.row_bytes;
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
  static void weight_tile(const FloatGemmArgs &a, int64_t n0) {
    int r = 0;
    for (; r + RT <= a.n_rows; r += RT) tile<T, W, RT>(a, n0, r);
    const int rest = a.n_rows - r;
    if constexpr (RT > 1) {
      if (rest == 1) tile<T, W, 1>(a, n0, r);
    }
    if constexpr (RT > 2) {
      if (rest == 2) tile<T, W, 2>(a, n0, r);
    }
    if constexpr (RT > 3) {
      if (rest == 3) tile<T, W, 3>(a, n0, r);
    }
    static_assert(RT <= 4, "tails are instantiated for up to 3 rows");
  }

  // Output rows [n0, n1) for every activation row.
  template <quant::GgmlType T>
  static void gemm(const FloatGemmArgs &a, int64_t n0, int64_t n1) {
    int64_t n = n0;
    for (; n + WT <= n1; n += WT) weight_tile<T, WT>(a, n);
    for (; n < n1; ++n) weight_tile<T, 1>(a, n);
  }
};

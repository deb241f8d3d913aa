// The quantized GEMM kernels of qgemm.h, written once over a SIMD abstraction S and
// instantiated by each tier's translation unit (tier_avx512.cpp, tier_avx2.cpp), which
// compiles them with its own -m flags. Include only from a tier TU, inside its own
// anonymous namespace (so that nothing here has external linkage).
//
// S::L lanes (weight rows) per vector: 16 for AVX-512, 8 for AVX2 (a group of 16 is
// then run as two halves, h = 0, 1). S::RT: activation rows per tile. S::kQ8Offset: the
// value Q8_0's packed u8 quants carry over the signed weight (128 where the kernel
// multiplies u8 x s8, 0 where S::dp_q8 undoes the offset itself).
//
// The loops over the k-groups of a block are unrolled (#pragma GCC unroll): rolled, GCC
// rotates the R accumulators through copies and spills the weight vector every step.
//
// The arithmetic is quant/dot.h's, per output element: for each block the exact integer
// sum, then  acc += (d_w * d_x) * isum  (and  - (dmin_w * d_x) * msum  for mins), in
// block order, in f32 without contraction.
//
// S::kI16Dp (AVX2 without VNNI): runs of u8 x s8 pair sums (maddubs) are added in int16
// and widened to int32 once per run, the sub-block scale folded into that widening madd.
// The integer sums are the same; i16_run<T>() bounds a run so that no int16 sum can
// overflow.

template <class S>
struct Kernels {
  using I = typename S::I;
  using F = typename S::F;
  static constexpr int L = S::L;

  static int32_t x4(const int8_t *p) {
    int32_t v;
    std::memcpy(&v, p, 4);
    return v;
  }
  static int32_t s16pair(const int16_t *p) {
    int32_t v;
    std::memcpy(&v, p, 4);
    return v;
  }

  // Part i of n of the group at pf (group_bytes long) into L1, a cache line at a time:
  // while a tile works through the blocks of one group, the next group arrives, a part per
  // block. The hardware prefetchers alone leave a tile of several rows waiting on memory
  // for each group (weights stream from L3 or DRAM: the whole model does not fit in L2).
  // pf = nullptr: nothing (a prefetch never faults, but only one tile per group issues it).
  static void prefetch_part(const uint8_t *pf, size_t group_bytes, int64_t i, int64_t n) {
    if (!pf) return;
    const size_t lo = group_bytes * size_t(i) / size_t(n), hi = group_bytes * size_t(i + 1) / size_t(n);
    for (size_t o = lo & ~size_t(63); o < hi; o += 64) __builtin_prefetch(pf + o, 0, 3);
  }

  // --- 32-element block formats (Q8_0, Q4_0, Q5_0) ---
  template <quant::GgmlType T>
  static constexpr int per_block() {
    return T == quant::GgmlType::Q8_0 ? 512 : T == quant::GgmlType::Q4_0 ? 256 : 320;
  }
  template <quant::GgmlType T>
  static constexpr int offset() {
    return T == quant::GgmlType::Q8_0 ? S::kQ8Offset : T == quant::GgmlType::Q4_0 ? 8 : 16;
  }
  // Weight vector of k-group j of a 32-element chunk of nibble vectors at q (packed.h),
  // lanes of half h; planes: the chunk's 64 bytes of fifth-bit planes (Q5_0, Q5_K), nullptr
  // if none. Bit j of a plane byte is moved to bit 4 and or-ed in: three operations, where
  // expanding a bit mask to bytes took seven on AVX2 (two of them shuffles).
  static I nibbles(const uint8_t *q, const uint8_t *planes, int j, int h) {
    const I v = S::load(q + 64 * (j & 3) + 32 * h);
    const I w = j < 4 ? S::nib_lo(v) : S::nib_hi(v);
    if (!planes) return w;
    return S::or_bit(w, S::load(planes + 32 * h), j, 4);
  }

  // k-groups whose maddubs results an int16 lane can sum (S::kI16Dp): a pair of products
  // is at most 2 x wmax x 128 in magnitude (activations are in [-128, 127]), so 8 for
  // 4-bit weights (30720), 4 for 5-bit (31744), 2 for 6-bit (32256); 0: not on this tier
  // (VNNI sums into int32) or not for this type (Q8_0's pairs need all 16 bits).
  template <quant::GgmlType T>
  static constexpr int i16_run() {
    if constexpr (!S::kI16Dp) return 0;
    switch (T) {
      case quant::GgmlType::Q4_0:
      case quant::GgmlType::Q4_K: return 8;
      case quant::GgmlType::Q5_0:
      case quant::GgmlType::Q5_K: return 4;
      case quant::GgmlType::Q6_K: return 2;
      default: return 0;
    }
  }

  // Weight vector of k-group j of a block, lanes of half h.
  template <quant::GgmlType T>
  static I wvec(const uint8_t *q, int j, int h) {
    if constexpr (T == quant::GgmlType::Q8_0) {
      return S::load(q + 64 * j + 32 * h);
    } else {
      return nibbles(q, T == quant::GgmlType::Q5_0 ? q + 256 : nullptr, j, h);
    }
  }

  template <quant::GgmlType T, int R, bool U>
  static void tile_q32(const uint8_t *grp, int64_t nb, const GemmArgs &a, int r0, int h, float *y, int n_valid,
                       const uint8_t *pf, const uint8_t *wu) {
    constexpr int per = per_block<T>();
    const uint8_t *scales = grp + nb * per;
    const int64_t K = a.K;
    F acc[R];
    for (int r = 0; r < R; ++r) acc[r] = S::fzero();
    for (int64_t b = 0; b < nb; ++b) {
      prefetch_part(pf, a.group_bytes, b, nb);
      const uint8_t *q = grp + b * per;
      I isum[R];
      for (int r = 0; r < R; ++r) isum[r] = S::set1(-offset<T>() * a.xs32[(r0 + r) * (K / 32) + b]);
      if constexpr (i16_run<T>() > 0) {
        constexpr int run = i16_run<T>();
        #pragma GCC unroll 2
        for (int j0 = 0; j0 < 8; j0 += run) {
          I p[R];
          for (int r = 0; r < R; ++r) p[r] = S::zero();
          #pragma GCC unroll 8
          for (int j = j0; j < j0 + run; ++j) {
            const I w = U ? S::load(wu + 32 * (8 * b + j)) : wvec<T>(q, j, h);
            for (int r = 0; r < R; ++r) p[r] = S::dp16(p[r], w, x4(a.xq + (r0 + r) * K + 32 * b + 4 * j));
          }
          for (int r = 0; r < R; ++r) isum[r] = S::add(isum[r], S::widen16(p[r]));
        }
      } else {
      #pragma GCC unroll 8
      for (int j = 0; j < 8; ++j) {
        const I w = U ? S::load(wu + 32 * (8 * b + j)) : wvec<T>(q, j, h);
        for (int r = 0; r < R; ++r) {
          const int32_t xv = x4(a.xq + (r0 + r) * K + 32 * b + 4 * j);
          if constexpr (T == quant::GgmlType::Q8_0) {
            isum[r] = S::dp_q8(isum[r], w, xv);
          } else {
            isum[r] = S::dp(isum[r], w, xv);
          }
        }
      }
      }
      const F dw = S::cvtph(scales + 32 * b + 2 * L * h);
      for (int r = 0; r < R; ++r) {
        const F dx = S::set1f(a.xd[(r0 + r) * (K / 32) + b]);
        acc[r] = S::add(acc[r], S::mul(S::mul(dw, dx), S::cvt(isum[r])));
      }
    }
    for (int r = 0; r < R; ++r) S::store(y + r * a.ldy, acc[r], n_valid);
  }

  // A super-block's f32 step for R activation rows, for the types with mins (Q4_K/Q5_K:
  // NP = 4 pairs of 32-element sums, Q2_K: NP = 8 pairs of 16-element ones): msum = the
  // packed mins (NP vectors at mins + 64 pp + 32 h) against the rows' sub-block sums xs
  // (xs_row elements per row, 2 NP per super-block), then acc += d dx isum - dmin dx msum.
  template <int NP, int R>
  static void block_step_mins(F (&acc)[R], const I (&isum)[R], const uint8_t *mins_at, int h, F d, F dmin,
                              const int16_t *xs, int64_t xs_row, const GemmArgs &a, int r0, int64_t s) {
    I mins[NP];
    for (int pp = 0; pp < NP; ++pp) mins[pp] = S::load(mins_at + 64 * pp + 32 * h);
    for (int r = 0; r < R; ++r) {
      I msum = S::zero();
      const int16_t *x = xs + (r0 + r) * xs_row + 2 * NP * s;
      for (int pp = 0; pp < NP; ++pp) msum = S::dpwssd(msum, mins[pp], s16pair(x + 2 * pp));
      const F dx = S::set1f(a.xd[(r0 + r) * (a.K / 256) + s]);
      F v = S::mul(S::mul(d, dx), S::cvt(isum[r]));
      v = S::sub(v, S::mul(S::mul(dmin, dx), S::cvt(msum)));
      acc[r] = S::add(acc[r], v);
    }
  }

  // --- Q4_K / Q5_K ---
  template <quant::GgmlType T, int R, bool U>
  static void tile_q45k(const uint8_t *grp, int64_t nsb, const GemmArgs &a, int r0, int h, float *y, int n_valid,
                        const uint8_t *pf, const uint8_t *wu) {
    constexpr bool q5 = T == quant::GgmlType::Q5_K;
    constexpr size_t sb_bytes = q5 ? 3008 : 2496;
    constexpr size_t off = q5 ? 2560 : 2048;
    const int64_t K = a.K;
    F acc[R];
    for (int r = 0; r < R; ++r) acc[r] = S::fzero();
    for (int64_t s = 0; s < nsb; ++s) {
      prefetch_part(pf, a.group_bytes, s, nsb);
      const uint8_t *o = grp + s * sb_bytes;
      I isum[R];
      for (int r = 0; r < R; ++r) isum[r] = S::zero();
      for (int t = 0; t < 8; ++t) {
        const uint8_t *q = o + 256 * t;
        if constexpr (i16_run<T>() > 0) {
          constexpr int run = i16_run<T>();
          const I sc2 = S::load_u8_i16x2(o + off + 16 * t + L * h);
          #pragma GCC unroll 2
          for (int j0 = 0; j0 < 8; j0 += run) {
            I p[R];
            for (int r = 0; r < R; ++r) p[r] = S::zero();
            #pragma GCC unroll 8
            for (int j = j0; j < j0 + run; ++j) {
              const I w = U ? S::load(wu + 32 * (64 * s + 8 * t + j)) : nibbles(q, q5 ? o + 2048 + 64 * t : nullptr, j, h);
              for (int r = 0; r < R; ++r) p[r] = S::dp16(p[r], w, x4(a.xq + (r0 + r) * K + 256 * s + 32 * t + 4 * j));
            }
            for (int r = 0; r < R; ++r) isum[r] = S::add(isum[r], S::scale16(p[r], sc2));
          }
        } else {
          I p[R];
          for (int r = 0; r < R; ++r) p[r] = S::zero();
          #pragma GCC unroll 8
          for (int j = 0; j < 8; ++j) {
            const I w = U ? S::load(wu + 32 * (64 * s + 8 * t + j)) : nibbles(q, q5 ? o + 2048 + 64 * t : nullptr, j, h);
            for (int r = 0; r < R; ++r) p[r] = S::dp(p[r], w, x4(a.xq + (r0 + r) * K + 256 * s + 32 * t + 4 * j));
          }
          const I sc = S::load_u8_i32(o + off + 16 * t + L * h);
          for (int r = 0; r < R; ++r) isum[r] = S::add(isum[r], S::mullo(p[r], sc));
        }
      }
      block_step_mins<4, R>(acc, isum, o + off + 128, h, S::cvtph(o + off + 384 + 2 * L * h),
                            S::cvtph(o + off + 416 + 2 * L * h), a.xs32, K / 32, a, r0, s);
    }
    for (int r = 0; r < R; ++r) S::store(y + r * a.ldy, acc[r], n_valid);
  }

  // --- Q6_K ---
  template <int R, bool U>
  static void tile_q6k(const uint8_t *grp, int64_t nsb, const GemmArgs &a, int r0, int h, float *y, int n_valid,
                       const uint8_t *pf, const uint8_t *wu) {
    const int64_t K = a.K;
    F acc[R];
    for (int r = 0; r < R; ++r) acc[r] = S::fzero();
    for (int64_t s = 0; s < nsb; ++s) {
      prefetch_part(pf, a.group_bytes, s, nsb);
      const uint8_t *o = grp + s * 3392;
      I isum[R];
      for (int r = 0; r < R; ++r) isum[r] = S::zero();
      for (int c = 0; c < 8; ++c) {
        const uint8_t *q = o + 256 * c;
        const I hv0 = S::load(o + 2048 + 128 * c + 32 * h);
        const I hv1 = S::load(o + 2048 + 128 * c + 64 + 32 * h);
        if constexpr (i16_run<quant::GgmlType::Q6_K>() > 0) {
          // The chunk's offsets, -32 x (sc xs16 of sub-block 2c + the same of 2c + 1), as one
          // product of int16 pairs: (-32 sc[2c], -32 sc[2c + 1]) x (xs16[2c], xs16[2c + 1])
          // (|32 sc| <= 4096, |xs16| <= 2048).
          const I scn = S::mul16_m32(S::load_s8_pair_i16(o + 3072 + 32 * c + L * h, o + 3072 + 32 * c + 16 + L * h));
          for (int r = 0; r < R; ++r) {
            isum[r] = S::add(isum[r], S::scale16(S::set1(s16pair(a.xs16 + (r0 + r) * (K / 16) + 16 * s + 2 * c)), scn));
          }
        }
        #pragma GCC unroll 2
        for (int u = 0; u < 2; ++u) {  // the chunk's two 16-element sub-blocks
          const int sub = 2 * c + u;
          const I hv = u == 0 ? hv0 : hv1;
          // Weight vector of k-group j = 4u + jj: low nibbles and the pre-positioned high bits.
          const auto wv = [&](int jj) {
            const int j = 4 * u + jj;
            const I v = S::load(q + 64 * (j & 3) + 32 * h);
            const I lo = j < 4 ? S::nib_lo(v) : S::nib_hi(v);
            switch (jj) {
              case 0: return S::or_hi2_shl4(lo, hv);
              case 1: return S::or_hi2_shl2(lo, hv);
              case 2: return S::or_hi2_shl0(lo, hv);
              default: return S::or_hi2_shr2(lo, hv);
            }
          };
          if constexpr (i16_run<quant::GgmlType::Q6_K>() > 0) {
            const I sc2 = S::load_s8_i16x2(o + 3072 + 16 * sub + L * h);
            #pragma GCC unroll 2
            for (int j0 = 0; j0 < 4; j0 += 2) {
              I p[R];
              for (int r = 0; r < R; ++r) p[r] = S::zero();
              #pragma GCC unroll 2
              for (int jj = j0; jj < j0 + 2; ++jj) {
                const int j = 4 * u + jj;
                const I w = U ? S::load(wu + 32 * (64 * s + 8 * c + j)) : wv(jj);
                for (int r = 0; r < R; ++r) p[r] = S::dp16(p[r], w, x4(a.xq + (r0 + r) * K + 256 * s + 32 * c + 4 * j));
              }
              for (int r = 0; r < R; ++r) isum[r] = S::add(isum[r], S::scale16(p[r], sc2));
            }
          } else {
            I p[R];
            for (int r = 0; r < R; ++r) p[r] = S::set1(-32 * a.xs16[(r0 + r) * (K / 16) + 16 * s + sub]);
            #pragma GCC unroll 8
            for (int jj = 0; jj < 4; ++jj) {
              const int j = 4 * u + jj;
              const I w = U ? S::load(wu + 32 * (64 * s + 8 * c + j)) : wv(jj);
              for (int r = 0; r < R; ++r) p[r] = S::dp(p[r], w, x4(a.xq + (r0 + r) * K + 256 * s + 32 * c + 4 * j));
            }
            const I sc = S::load_s8_i32(o + 3072 + 16 * sub + L * h);
            for (int r = 0; r < R; ++r) isum[r] = S::add(isum[r], S::mullo(p[r], sc));
          }
        }
      }
      const F d = S::cvtph(o + 3328 + 2 * L * h);
      for (int r = 0; r < R; ++r) {
        const F dx = S::set1f(a.xd[(r0 + r) * (K / 256) + s]);
        acc[r] = S::add(acc[r], S::mul(S::mul(d, dx), S::cvt(isum[r])));
      }
    }
    for (int r = 0; r < R; ++r) S::store(y + r * a.ldy, acc[r], n_valid);
  }

  // --- Q2_K / Q3_K ---
  // Per 16-element sub-block u: the exact sum of q * x (Q3_K: (q - 4) * x, the offset
  // taken back as 4 * sum(x)), times the sub-block's integer scale; Q2_K's mins as
  // sum over sub-blocks of min * sum(x). The f32 step as Q4_K's (Q2_K) or Q6_K's (Q3_K).
  template <quant::GgmlType T, int R>
  static void tile_q23k(const uint8_t *grp, int64_t nsb, const GemmArgs &a, int r0, int h, float *y, int n_valid,
                        const uint8_t *pf) {
    constexpr bool q3 = T == quant::GgmlType::Q3_K;
    constexpr size_t sc_off = q3 ? 1536 : 1024;
    const int64_t K = a.K;
    F acc[R];
    for (int r = 0; r < R; ++r) acc[r] = S::fzero();
    for (int64_t s = 0; s < nsb; ++s) {
      prefetch_part(pf, a.group_bytes, s, nsb);
      const uint8_t *o = grp + s * 1856;
      I isum[R];
      for (int r = 0; r < R; ++r) isum[r] = S::zero();
      for (int c = 0; c < 8; ++c) {
        #pragma GCC unroll 2
        for (int u = 0; u < 2; ++u) {  // the chunk's two 16-element sub-blocks
          const int sub = 2 * c + u;
          const I v = S::load(o + 128 * c + 64 * u + 32 * h);
          auto wq = [&](int jj) {  // the quants (Q3_K: + 4) of k-group 4 u + jj
            I w = S::crumb(v, jj);
            if constexpr (q3) w = S::or_bit(w, S::load(o + 1024 + 64 * c + 32 * h), 4 * u + jj, 2);
            return w;
          };
          const uint8_t *scp = o + sc_off + 16 * sub + L * h;
          const I sc = q3 ? S::load_s8_i32(scp) : S::load_u8_i32(scp);
          if constexpr (S::kI16Dp) {
            // The sub-block's 4 k-groups in one int16 run (2-bit quants, 3-bit with Q3_K's
            // offset: a pair is at most 2 x 7 x 128, so 4 pairs fit), widened with the scale
            // folded into the madd; Q3_K's offset as -4 * sum(x) * scale.
            static_assert(4 * 2 * 7 * 128 <= 32767, "a Q2_K/Q3_K sub-block fits one int16 run");
            const I sc2 = q3 ? S::load_s8_i16x2(scp) : S::load_u8_i16x2(scp);
            I p[R];
            for (int r = 0; r < R; ++r) p[r] = S::zero();
            #pragma GCC unroll 4
            for (int jj = 0; jj < 4; ++jj) {
              const I w = wq(jj);
              for (int r = 0; r < R; ++r) {
                p[r] = S::dp16(p[r], w, x4(a.xq + (r0 + r) * K + 256 * s + 32 * c + 4 * (4 * u + jj)));
              }
            }
            for (int r = 0; r < R; ++r) {
              isum[r] = S::add(isum[r], S::scale16(p[r], sc2));
              if constexpr (q3) {
                isum[r] = S::add(isum[r], S::mullo(S::set1(-4 * a.xs16[(r0 + r) * (K / 16) + 16 * s + sub]), sc));
              }
            }
          } else {
            I p[R];
            for (int r = 0; r < R; ++r) {
              p[r] = q3 ? S::set1(-4 * a.xs16[(r0 + r) * (K / 16) + 16 * s + sub]) : S::zero();
            }
            #pragma GCC unroll 4
            for (int jj = 0; jj < 4; ++jj) {
              const I w = wq(jj);
              for (int r = 0; r < R; ++r) {
                p[r] = S::dp(p[r], w, x4(a.xq + (r0 + r) * K + 256 * s + 32 * c + 4 * (4 * u + jj)));
              }
            }
            for (int r = 0; r < R; ++r) isum[r] = S::add(isum[r], S::mullo(p[r], sc));
          }
        }
      }
      const F d = S::cvtph(o + 1792 + 2 * L * h);
      if constexpr (q3) {
        for (int r = 0; r < R; ++r) {
          const F dx = S::set1f(a.xd[(r0 + r) * (K / 256) + s]);
          acc[r] = S::add(acc[r], S::mul(S::mul(d, dx), S::cvt(isum[r])));
        }
      } else {
        block_step_mins<8, R>(acc, isum, o + 1280, h, d, S::cvtph(o + 1824 + 2 * L * h), a.xs16, K / 16, a, r0, s);
      }
    }
    for (int r = 0; r < R; ++r) S::store(y + r * a.ldy, acc[r], n_valid);
  }

  // Whether gemm builds each group's weight vectors once per row block (unpack): on the
  // 8-lane tiers (S::kUnpackOnce), where unpacking a k-group (Q5's fifth bits: six vector
  // ops) costs more than a row's dot product. Q8_0 is used as stored; Q2_K and Q3_K
  // (tile_q23k) unpack in the tile.
  template <quant::GgmlType T>
  static constexpr bool unpack_once() {
    return S::kUnpackOnce && T != quant::GgmlType::Q8_0 && T != quant::GgmlType::Q2_K && T != quant::GgmlType::Q3_K;
  }

  // The weight vectors of half h of the group at grp (K columns), in the order the tiles
  // read them: 32 bytes per k-group, [block of 32 / sub-block of 32][8 k-groups]. 8 K bytes.
  // pf: the next group, fetched a part per block (prefetch_part), or nullptr.
  template <quant::GgmlType T>
  static void unpack(const uint8_t *grp, int64_t K, int h, uint8_t *out, const uint8_t *pf, size_t group_bytes) {
    if constexpr (T == quant::GgmlType::Q6_K) {
      for (int64_t s = 0; s < K / 256; ++s) {
        prefetch_part(pf, group_bytes, s, K / 256);
        const uint8_t *o = grp + s * 3392;
        for (int c = 0; c < 8; ++c) {
          const uint8_t *q = o + 256 * c;
          for (int j = 0; j < 8; ++j) {
            const I v = S::load(q + 64 * (j & 3) + 32 * h);
            const I lo = j < 4 ? S::nib_lo(v) : S::nib_hi(v);
            const I hv = S::load(o + 2048 + 128 * c + 64 * (j / 4) + 32 * h);
            I w;
            switch (j & 3) {
              case 0: w = S::or_hi2_shl4(lo, hv); break;
              case 1: w = S::or_hi2_shl2(lo, hv); break;
              case 2: w = S::or_hi2_shl0(lo, hv); break;
              default: w = S::or_hi2_shr2(lo, hv); break;
            }
            S::storei(out + 32 * (64 * s + 8 * c + j), w);
          }
        }
      }
    } else if constexpr (T == quant::GgmlType::Q4_K || T == quant::GgmlType::Q5_K) {
      constexpr bool q5 = T == quant::GgmlType::Q5_K;
      constexpr size_t sb_bytes = q5 ? 3008 : 2496;
      for (int64_t s = 0; s < K / 256; ++s) {
        prefetch_part(pf, group_bytes, s, K / 256);
        const uint8_t *o = grp + s * sb_bytes;
        for (int t = 0; t < 8; ++t) {
          for (int j = 0; j < 8; ++j) {
            S::storei(out + 32 * (64 * s + 8 * t + j), nibbles(o + 256 * t, q5 ? o + 2048 + 64 * t : nullptr, j, h));
          }
        }
      }
    } else {
      constexpr int per = per_block<T>();
      for (int64_t b = 0; b < K / 32; ++b) {
        prefetch_part(pf, group_bytes, b, K / 32);
        for (int j = 0; j < 8; ++j) S::storei(out + 32 * (8 * b + j), wvec<T>(grp + b * per, j, h));
      }
    }
  }

  // One tile of R rows of group g, half h.
  // pf: the group to prefetch while this tile runs (prefetch_part), or nullptr.
  // wu: the group's half h unpacked by unpack() (U), else nullptr.
  template <quant::GgmlType T, int R, bool U = false>
  static void tile(const GemmArgs &a, int64_t g, int r0, int h, const uint8_t *pf, const uint8_t *wu = nullptr) {
    const uint8_t *grp = a.w + g * a.group_bytes;
    const int64_t n0 = g * 16 + int64_t(h) * L;
    const int n_valid = int(std::min<int64_t>(L, a.n_out - n0));
    if (n_valid <= 0) return;
    float *y = a.y + int64_t(r0) * a.ldy + n0;
    if constexpr (T == quant::GgmlType::Q2_K || T == quant::GgmlType::Q3_K) {
      tile_q23k<T, R>(grp, a.K / 256, a, r0, h, y, n_valid, pf);
    } else if constexpr (T == quant::GgmlType::Q6_K) {
      tile_q6k<R, U>(grp, a.K / 256, a, r0, h, y, n_valid, pf, wu);
    } else if constexpr (T == quant::GgmlType::Q4_K || T == quant::GgmlType::Q5_K) {
      tile_q45k<T, R, U>(grp, a.K / 256, a, r0, h, y, n_valid, pf, wu);
    } else {
      tile_q32<T, R, U>(grp, a.K / 32, a, r0, h, y, n_valid, pf, wu);
    }
  }

  template <quant::GgmlType T, int R, bool U = false>
  static void tail(const GemmArgs &a, int64_t g, int r0, int h, int rem, const uint8_t *pf,
                   const uint8_t *wu = nullptr) {
    if constexpr (R > 0) {
      if (rem == R) {
        tile<T, R, U>(a, g, r0, h, pf, wu);
      } else {
        tail<T, R - 1, U>(a, g, r0, h, rem, pf, wu);
      }
    }
  }

  // Rows in blocks of kRowBlock (their activations stay in L1/L2 while the task's weight
  // groups stream past), each block in tiles of RT rows and a narrower tail tile.
  static constexpr int kRowBlock = 64;

  template <quant::GgmlType T>
  static void gemm(const GemmArgs &a, int64_t g0, int64_t g1) {
    constexpr int RT = S::RT;
    for (int rb = 0; rb < a.n_rows; rb += kRowBlock) {
      const int re = std::min(a.n_rows, rb + kRowBlock);
      for (int64_t g = g0; g < g1; ++g) {
        // The first tile of the group fetches the next group of the task (of the next row
        // block's first group at the end), which the first tile of the next group reads.
        const uint8_t *next = g + 1 < g1 ? a.w + (g + 1) * a.group_bytes
                                         : (re < a.n_rows ? a.w + g0 * a.group_bytes : nullptr);
        for (int h = 0; h < 16 / L; ++h) {
          if constexpr (unpack_once<T>()) {
            if (re - rb >= 2 * RT) {
              // Every tile of the block reads the same weight vectors: build them once.
              thread_local std::vector<uint8_t> buf;
              if (buf.size() < size_t(8 * a.K)) buf.resize(size_t(8 * a.K));
              unpack<T>(a.w + g * a.group_bytes, a.K, h, buf.data(), h == 0 ? next : nullptr, a.group_bytes);
              int r0 = rb;
              for (; r0 + RT <= re; r0 += RT) tile<T, RT, true>(a, g, r0, h, nullptr, buf.data());
              if (r0 < re) tail<T, RT - 1, true>(a, g, r0, h, re - r0, nullptr, buf.data());
              continue;
            }
          }
          int r0 = rb;
          for (; r0 + RT <= re; r0 += RT) {
            tile<T, RT>(a, g, r0, h, h == 0 && r0 == rb ? next : nullptr);
          }
          if (r0 < re) tail<T, RT - 1>(a, g, r0, h, re - r0, h == 0 && r0 == rb ? next : nullptr);
        }
      }
    }
  }
};

// Weights repacked at load for the SIMD tiers: 16 output rows interleaved, so that one
// 512-bit VNNI instruction (or two 256-bit ones) computes 4-element dot products for 16
// rows at once and each lane holds one row's exact integer block sum; no horizontal
// reductions, and a tile of R activation rows reuses every unpacked weight register.
//
// A packed matrix is n_groups = ceil(n_out / 16) groups of `group_bytes`, 64-byte aligned;
// rows past n_out in the last group are zero. Within a group, lane i is row 16g + i.
// Quantized values are stored unsigned (as in the GGUF block, or + 128 for Q8_0), so
// that VNNI's u8 x s8 product applies; the offset comes back as offset * sum(x) from the
// activation's block sums. Layouts, per group (b: 32-element block, s: 256-element
// super-block, j: 4-element k-group of a 32-element block, e: element in the k-group):
//
//   Q8_0  quants  [b][j][i][e] u8 (w + 128)                     512 B per block
//         then    [b][i] f16 d                                   32 B per block
//   Q4_0  quants  [b][v][i][e] nibbles: low = k-group v,         256 B per block
//                 high = k-group v + 4  (v in 0..3)
//         then    [b][i] f16 d
//   Q5_0  as Q4_0, each block followed by 64 B of fifth-bit      320 B per block
//         planes (byte 4i + e, bit j = bit 4 of element 4j + e of row i)
//         then    [b][i] f16 d
//   Q4_K  per super-block (2496 B): nibbles of sub-block t at 256 t (as Q4_0);
//         scales [t][i] u8 at 2048; mins [p][i][2] i16 at 2176 (pair p = sub-blocks
//         2p, 2p+1); d [i] f16 at 2432; dmin [i] f16 at 2464
//   Q5_K  as Q4_K with Q5_0's 64 B of planes per sub-block after the nibbles (3008 B):
//         planes at 2048 + 64 t; scales 2560; mins 2688; d 2944; dmin 2976
//   Q6_K  per super-block (3392 B, 32 of them padding): low nibbles of 32-element chunk
//         c at 256 c (as Q4_0); high 2-bit pairs at 2048 + 128 c: two 64-byte vectors
//         (k-groups 0-3, then 4-7), bits 2(j%4)..2(j%4)+1 of byte [i][e];
//         scales [u][i] i8 at 3072 (u: 16-element sub-block); d [i] f16 at 3328
//   Q2_K  per super-block (1856 B, 64 of them padding): 2-bit quants of chunk c at 128 c:
//         two 64-byte vectors (k-groups 0-3, then 4-7), bits 2(j%4)..2(j%4)+1 of byte
//         [i][e]; scales [u][i] u8 at 1024; mins [p][i][2] i16 at 1280 (pair p =
//         sub-blocks 2p, 2p+1); d [i] f16 at 1792; dmin [i] f16 at 1824
//   Q3_K  per super-block (1856 B, 32 of them padding): low 2 bits as Q2_K's; the third
//         bits as Q5_0-style planes per chunk at 1024 + 64 c (so q in 0..7
//         stands for q - 4); scales [u][i] i8 (sc - 32) at 1536; d [i] f16 at 1792
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "backends/weight.h"
#include "base/thread_pool.h"
#include "quant/ggml_type.h"

namespace geist::cpu {

constexpr int kPackRows = 16;

// Bytes of one group of 16 rows of K elements of type t; 0 if t has no packed layout
// (or K is not a multiple of its block).
size_t packed_group_bytes(quant::GgmlType t, int64_t K);
bool has_packed_layout(quant::GgmlType t);

// Packs `n_rows` (1..16) consecutive GGUF rows of `row_bytes` each into one group at dst
// (packed_group_bytes(t, K) bytes); missing rows are zero.
void pack_group(quant::GgmlType t, const uint8_t *rows, size_t row_bytes, int n_rows, int64_t K, uint8_t *dst);

// 64-byte aligned storage for packed matrices, owned by a model.
class PackedStore {
 public:
  uint8_t *allocate(size_t bytes);
  size_t bytes() const { return bytes_; }

 private:
  struct Free {
    void operator()(uint8_t *p) const;
  };
  std::vector<std::unique_ptr<uint8_t, Free>> blocks_;
  size_t bytes_ = 0;
};

// If the tier in use has a packed kernel for w's type and shape, packs w into `store` and
// sets w->packed and w->group_bytes (w->data keeps pointing at the original, which the
// caller may then release from memory). Returns whether it packed. pool: groups are
// packed in parallel on it (nullptr: on the caller).
bool pack_weight(WeightView *w, PackedStore *store, ThreadPool *pool = nullptr);

}  // namespace geist::cpu

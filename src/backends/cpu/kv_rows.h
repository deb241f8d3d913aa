// KV cache rows between f32 and a KvType (backends/kv_type.h fixes the bytes of each
// type). The scalar reference: the tiers' attention kernels read typed rows into exactly
// the f32 values kv_load_rows gives. Pure functions, thread-safe, no allocation.
#pragma once

#include <cstddef>
#include <cstdint>

#include "backends/kv_type.h"

namespace geist::cpu {

// src: [n_rows][row_elems] f32 -> dst: n_rows rows of kv_row_bytes(t, row_elems) bytes,
// back to back. row_elems must be a multiple of 32 for Q8_0 (checked; a row is whole
// blocks), any count for the other types. Rows are independent: storing rows one at a
// time or all at once gives the same bytes. Cost: one pass over src.
void kv_store_rows(KvType t, const float *src, int64_t n_rows, int64_t row_elems, void *dst);

// The inverse read: src: n_rows rows of kv_row_bytes(t, row_elems) bytes ->
// dst: [n_rows][row_elems] f32. Exact for F32 (a copy), F16 and BF16 (every half and
// bfloat16 is a float; NaN payloads kept); Q8_0 gives f32(d) * q. Any bytes are accepted
// (a corrupt row reads as garbage values, never undefined behaviour).
void kv_load_rows(KvType t, const void *src, int64_t n_rows, int64_t row_elems, float *dst);

}  // namespace geist::cpu

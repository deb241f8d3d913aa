// Sampled draws on the device (draw.cu): apart from kernels.h so that the draw's kernels
// and the exec are all that include base/draw.h on the CUDA side.
#pragma once

#include <cstddef>
#include <cstdint>

#include "backends/cuda/kernels.h"
#include "base/draw.h"

namespace geist::cuda {

// out[r] = the sampled draw of row r of x [n_rows][width] by specs[r] (device memory), for
// the rows whose spec has temperature > 0 (the others' out is left as it is): base/draw.h's
// draw_sampled on the device, the same token as on the host. k: the candidates kept per
// tile, 1..256, at least every sampled row's top_k (each draws from its own top_k best).
// scratch: sample_scratch_bytes(width, n_rows, k) of device memory. width < 2^31,
// n_rows <= 65535. algo: how each tile's best keys are found (draw.cu); the same token
// either way.
enum class DrawAlgo { kSort, kSelect };
size_t sample_scratch_bytes(int64_t width, int n_rows, int k);
Status sample_rows(const float *x, int64_t width, int n_rows, const DrawSpec *specs, int k, int32_t *out,
                   void *scratch, CudaStream s, DrawAlgo algo = DrawAlgo::kSort);

}  // namespace geist::cuda

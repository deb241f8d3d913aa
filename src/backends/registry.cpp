// The one place that names concrete backends.
#include "backends/backend.h"

namespace geist {

Result<std::unique_ptr<Backend>> make_backend(BackendKind kind, int device) {
  switch (kind) {
    case BackendKind::Cpu:
      return make_cpu_backend();
    case BackendKind::Cuda:
#if GEIST_HAVE_CUDA
      return make_cuda_backend(device);
#else
      (void)device;
      return GEIST_ERROR(GEIST_E_UNSUPPORTED,
                         "this geist was built without CUDA (configure with -DGEIST_CUDA=ON to run on an NVIDIA GPU)");
#endif
  }
  return GEIST_ERROR(GEIST_E_INVALID_ARGUMENT, "unknown backend");
}

}  // namespace geist

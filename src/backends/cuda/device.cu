// Device queries, memory, streams and the mapping of CUDA errors to geist statuses.
#include <cuda_runtime.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "backends/cuda/common.cuh"

namespace geist::cuda {

Status cuda_status(cudaError_t e, const char *what) {
  if (e == cudaSuccess) return Status::ok();
  geist_status code = GEIST_E_INTERNAL;
  switch (e) {
    case cudaErrorMemoryAllocation: code = GEIST_E_OUT_OF_MEMORY; break;
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
    case cudaErrorNoKernelImageForDevice:
    case cudaErrorUnsupportedPtxVersion:
    case cudaErrorInvalidDevice:
    case cudaErrorDevicesUnavailable:
    case cudaErrorCompatNotSupportedOnDevice:
    case cudaErrorSystemDriverMismatch: code = GEIST_E_UNSUPPORTED; break;
    case cudaErrorInvalidValue: code = GEIST_E_INVALID_ARGUMENT; break;
    default: break;
  }
  char buf[96];
  std::snprintf(buf, sizeof buf, "CUDA error %d (", static_cast<int>(e));
  return Status(code, std::string(what) + ": " + buf + cudaGetErrorName(e) + "): " + cudaGetErrorString(e));
}

Status last_error(const char *what) { return cuda_status(cudaGetLastError(), what); }

Result<int> device_count() {
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();  // clear the sticky-free error so later calls start clean
    return cuda_status(e, "cudaGetDeviceCount");
  }
  return n;
}

Result<DeviceInfo> device_info(int index) {
  cudaDeviceProp p;
  cudaError_t e = cudaGetDeviceProperties(&p, index);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    return cuda_status(e, ("cudaGetDeviceProperties(" + std::to_string(index) + ")").c_str());
  }
  DeviceInfo d;
  d.index = index;
  d.name = p.name;
  d.cc_major = p.major;
  d.cc_minor = p.minor;
  d.total_mem = p.totalGlobalMem;
  d.sm_count = p.multiProcessorCount;
  if ((e = cudaDriverGetVersion(&d.driver_version)) != cudaSuccess) return cuda_status(e, "cudaDriverGetVersion");
  if ((e = cudaRuntimeGetVersion(&d.runtime_version)) != cudaSuccess) return cuda_status(e, "cudaRuntimeGetVersion");
  return d;
}

Status set_device(int index) { return cuda_status(cudaSetDevice(index), "cudaSetDevice"); }

Result<uint64_t> device_memory_used(int index) {
  GEIST_RETURN_IF_ERROR(set_device(index));
  size_t free = 0, total = 0;
  const cudaError_t e = cudaMemGetInfo(&free, &total);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    return cuda_status(e, "cudaMemGetInfo");
  }
  return uint64_t(total - free);
}

std::string describe(const DeviceInfo &d) {
  char buf[256];
  std::snprintf(buf, sizeof buf, "%s (sm_%d%d, %.1f GiB, driver %d.%d, runtime %d.%d)", d.name.c_str(), d.cc_major,
                d.cc_minor, double(d.total_mem) / (1024.0 * 1024.0 * 1024.0), d.driver_version / 1000,
                (d.driver_version % 1000) / 10, d.runtime_version / 1000, (d.runtime_version % 1000) / 10);
  return buf;
}

Result<void *> device_alloc(size_t bytes) {
  void *p = nullptr;
  cudaError_t e = cudaMalloc(&p, bytes == 0 ? 1 : bytes);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();  // an allocation failure is not sticky; clear it
    return cuda_status(e, ("cudaMalloc(" + std::to_string(bytes) + " bytes)").c_str());
  }
  return p;
}

void device_free(void *p) {
  if (p) (void)cudaFree(p);
}

Result<void *> host_alloc_pinned(size_t bytes) {
  void *p = nullptr;
  cudaError_t e = cudaMallocHost(&p, bytes == 0 ? 1 : bytes);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    return cuda_status(e, ("cudaMallocHost(" + std::to_string(bytes) + " bytes)").c_str());
  }
  return p;
}

void host_free_pinned(void *p) {
  if (p) (void)cudaFreeHost(p);
}

// From pageable memory cudaMemcpy returns once the bytes are staged, before their DMA to the
// device may have finished, and the copy is ordered on the legacy stream only: a kernel on a
// non-blocking stream (every stream here) could read the destination before it arrives.
// Waiting for the legacy stream makes the copy complete, as kernels.h promises.
Status upload(void *dst, const void *src, size_t bytes) {
  Status st = cuda_status(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice), "upload");
  if (!st.is_ok()) return st;
  return cuda_status(cudaStreamSynchronize(cudaStreamLegacy), "upload (waiting for the copy)");
}
Status download(void *dst, const void *src, size_t bytes) {
  return cuda_status(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost), "download");
}
Status upload_async(void *dst, const void *src, size_t bytes, CudaStream s) {
  return cuda_status(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, s), "upload_async");
}
Status download_async(void *dst, const void *src, size_t bytes, CudaStream s) {
  return cuda_status(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, s), "download_async");
}
Status copy_async(void *dst, const void *src, size_t bytes, CudaStream s) {
  return cuda_status(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, s), "copy_async");
}
Status memset_async(void *dst, int value, size_t bytes, CudaStream s) {
  return cuda_status(cudaMemsetAsync(dst, value, bytes, s), "memset_async");
}

Result<CudaStream> stream_create() {
  cudaStream_t s = nullptr;
  cudaError_t e = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  if (e != cudaSuccess) return cuda_status(e, "cudaStreamCreate");
  return s;
}
void stream_destroy(CudaStream s) {
  if (s) (void)cudaStreamDestroy(s);
}
Status stream_sync(CudaStream s) { return cuda_status(cudaStreamSynchronize(s), "cudaStreamSynchronize"); }

Result<CudaEvent> event_create() {
  cudaEvent_t e = nullptr;
  const cudaError_t r = cudaEventCreateWithFlags(&e, cudaEventDisableTiming);
  if (r != cudaSuccess) return cuda_status(r, "cudaEventCreate");
  return e;
}
void event_destroy(CudaEvent e) {
  if (e) (void)cudaEventDestroy(e);
}
Status event_record(CudaEvent e, CudaStream s) { return cuda_status(cudaEventRecord(e, s), "cudaEventRecord"); }
Status event_sync(CudaEvent e) { return cuda_status(cudaEventSynchronize(e), "cudaEventSynchronize"); }

bool reference_kernels() {
  static const bool v = [] {
    const char *e = std::getenv("GEIST_CUDA_REFERENCE");
    return e != nullptr && e[0] == '1';
  }();
  return v;
}

bool pdl_enabled() {
  static const bool env_on = [] {
    const char *e = std::getenv("GEIST_CUDA_PDL");
    return !(e != nullptr && e[0] == '0');
  }();
  if (!env_on) return false;
  // Compute capability by device ordinal, read once per device (0: not read yet).
  static std::atomic<int> major[64] = {};
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 64) return false;
  int m = major[dev].load(std::memory_order_relaxed);
  if (m == 0) {
    if (cudaDeviceGetAttribute(&m, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess) return false;
    major[dev].store(m, std::memory_order_relaxed);
  }
  return m >= 9;
}

int prefetch_mode() {
  static const int v = [] {
    const char *e = std::getenv("GEIST_CUDA_PREFETCH");
    if (e == nullptr || e[0] == '\0') return 1;
    return (e[0] == '0' || e[0] == '2') && e[1] == '\0' ? e[0] - '0' : 1;
  }();
  return v;
}

Status graph_capture_begin(CudaStream s) {
  return cuda_status(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), "cudaStreamBeginCapture");
}

Result<CudaGraph> graph_capture_end(CudaStream s) {
  cudaGraph_t g = nullptr;
  cudaError_t e = cudaStreamEndCapture(s, &g);
  if (e != cudaSuccess) {
    if (g) (void)cudaGraphDestroy(g);
    (void)cudaGetLastError();
    return cuda_status(e, "cudaStreamEndCapture");
  }
  cudaGraphExec_t x = nullptr;
  e = cudaGraphInstantiate(&x, g, 0);
  (void)cudaGraphDestroy(g);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    return cuda_status(e, "cudaGraphInstantiate");
  }
  return x;
}

Status graph_launch(CudaGraph g, CudaStream s) { return cuda_status(cudaGraphLaunch(g, s), "cudaGraphLaunch"); }

void graph_destroy(CudaGraph g) {
  if (g) (void)cudaGraphExecDestroy(g);
}

}  // namespace geist::cuda

#include "base/status.h"

#include <cstdarg>

namespace geist {

std::string strprintf(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  va_list ap2;
  va_copy(ap2, ap);
  int n = std::vsnprintf(nullptr, 0, fmt, ap);
  va_end(ap);
  std::string out;
  if (n > 0) {
    out.resize(static_cast<size_t>(n));
    std::vsnprintf(out.data(), out.size() + 1, fmt, ap2);
  }
  va_end(ap2);
  return out;
}

std::string Status::to_string() const {
  if (is_ok()) return "OK";
  return std::string(geist_status_name(code_)) + ": " + message_;
}

void check_failed(const char *expr, const char *file, int line, const char *msg) {
  std::fprintf(stderr, "geist: internal check failed at %s:%d: %s (%s)\n", file, line, msg, expr);
  std::abort();
}

}  // namespace geist

extern "C" const char *geist_status_name(geist_status s) {
  switch (s) {
    case GEIST_OK: return "GEIST_OK";
    case GEIST_E_INVALID_ARGUMENT: return "GEIST_E_INVALID_ARGUMENT";
    case GEIST_E_IO: return "GEIST_E_IO";
    case GEIST_E_BAD_FORMAT: return "GEIST_E_BAD_FORMAT";
    case GEIST_E_UNSUPPORTED: return "GEIST_E_UNSUPPORTED";
    case GEIST_E_OUT_OF_MEMORY: return "GEIST_E_OUT_OF_MEMORY";
    case GEIST_E_CONTEXT_FULL: return "GEIST_E_CONTEXT_FULL";
    case GEIST_E_BUFFER_TOO_SMALL: return "GEIST_E_BUFFER_TOO_SMALL";
    case GEIST_E_INTERNAL: return "GEIST_E_INTERNAL";
    case GEIST_E_STATE: return "GEIST_E_STATE";
    case GEIST_E_MISMATCH: return "GEIST_E_MISMATCH";
    case GEIST_STATUS_COUNT: break;
  }
  return "GEIST_E_UNKNOWN_STATUS";
}

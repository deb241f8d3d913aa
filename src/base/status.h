// Status and Result<T>: how every fallible call inside geist reports failure.
// A Status is a geist_status code plus a human-readable message naming the problem.
// Cheap to move; an OK status carries no allocation.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <utility>
#include <variant>

#include "geist/geist.h"

namespace geist {

class [[nodiscard]] Status {
 public:
  Status() = default;  // OK
  Status(geist_status code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status ok() { return {}; }

  bool is_ok() const { return code_ == GEIST_OK; }
  explicit operator bool() const { return is_ok(); }
  geist_status code() const { return code_; }
  const std::string &message() const { return message_; }

  // "GEIST_E_BAD_FORMAT: tensor 'x' data lies outside the file"
  std::string to_string() const;

 private:
  geist_status code_ = GEIST_OK;
  std::string message_;
};

// printf-style message formatting for statuses.
std::string strprintf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

#define GEIST_ERROR(code, ...) ::geist::Status((code), ::geist::strprintf(__VA_ARGS__))

// A value or a failed Status.
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}  // NOLINT: implicit by design
  Result(Status status) : v_(std::move(status)) {
    if (std::get<Status>(v_).is_ok()) {
      v_ = Status(GEIST_E_INTERNAL, "Result constructed from an OK status without a value");
    }
  }

  bool is_ok() const { return std::holds_alternative<T>(v_); }
  explicit operator bool() const { return is_ok(); }

  const Status &status() const {
    static const Status kOk;
    return is_ok() ? kOk : std::get<Status>(v_);
  }
  T &value() & { return std::get<T>(v_); }
  const T &value() const & { return std::get<T>(v_); }
  T &&value() && { return std::get<T>(std::move(v_)); }
  T *operator->() { return &value(); }
  const T *operator->() const { return &value(); }
  T &operator*() & { return value(); }

 private:
  std::variant<T, Status> v_;
};

// Programmer invariants only (never input validation): always on, aborts with location.
[[noreturn]] void check_failed(const char *expr, const char *file, int line, const char *msg);
#define GEIST_CHECK(cond, msg)                                                    \
  do {                                                                            \
    if (!(cond)) ::geist::check_failed(#cond, __FILE__, __LINE__, (msg));         \
  } while (0)

#define GEIST_RETURN_IF_ERROR(expr)          \
  do {                                       \
    ::geist::Status geist_st_ = (expr);      \
    if (!geist_st_.is_ok()) return geist_st_; \
  } while (0)

#define GEIST_CONCAT_INNER(a, b) a##b
#define GEIST_CONCAT(a, b) GEIST_CONCAT_INNER(a, b)
#define GEIST_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                                \
  if (!tmp.is_ok()) return tmp.status();            \
  lhs = std::move(tmp).value()
#define GEIST_ASSIGN_OR_RETURN(lhs, expr) \
  GEIST_ASSIGN_OR_RETURN_IMPL(GEIST_CONCAT(geist_res_, __LINE__), lhs, expr)

}  // namespace geist

// Helpers shared by the tests: data paths, the default model, SKIP handling.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "quant/ggml_type.h"

namespace geist::test {

// Absolute path of a file under tests/data.
std::string data_path(const std::string &rel);

// Path of the default model (GEIST_MODEL env var, else the fetch cache), or "" if absent.
std::string default_model_path();

// Whole file as bytes; fails the test (and returns empty) if unreadable.
std::vector<uint8_t> read_file(const std::string &path);

// Random but valid weight blocks of type t for a row of k elements: random bytes with
// every f16 scale field set to a small finite value. Float types (F32, F16, BF16): normal
// values over a wide range of magnitudes (subnormal halves included), no NaN or inf.
std::vector<uint8_t> random_row(quant::GgmlType t, int64_t k, std::mt19937 &rng);

}  // namespace geist::test

// Skip the current test with a reason printed as "SKIP: <reason>".
#define GEIST_SKIP(reason)                             \
  do {                                                 \
    std::printf("SKIP: %s\n", std::string(reason).c_str()); \
    GTEST_SKIP() << (reason);                          \
  } while (0)

// The default model or skip.
#define GEIST_REQUIRE_MODEL(var)                                                         \
  std::string var = ::geist::test::default_model_path();                                \
  if (var.empty())                                                                       \
  GEIST_SKIP("default model not found; run scripts/fetch_model.py or set GEIST_MODEL")

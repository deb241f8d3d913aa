// The model-free part of `geist bench` (tools/geist/bench_stats.h, bench_sha256.h) on
// known inputs: percentiles as numpy's default computes them, mean and sample stddev, the
// interleaving schedule, the aligned-neighbour line test, tables, SHA-256 test vectors, and
// the JSON documents against the schema of docs/BENCH.md.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "bench_sha256.h"
#include "bench_stats.h"

namespace geist::cli::bench {
namespace {

using nlohmann::json;

TEST(BenchStats, PercentileIsNumpyLinear) {
  // Values from numpy.percentile (method='linear', the default).
  EXPECT_DOUBLE_EQ(percentile({1, 2, 3, 4}, 50), 2.5);
  EXPECT_DOUBLE_EQ(percentile({1, 2, 3, 4}, 25), 1.75);
  EXPECT_NEAR(percentile({1, 2, 3, 4}, 95), 3.85, 1e-12);
  EXPECT_DOUBLE_EQ(percentile({4, 3, 2, 1}, 0), 1);
  EXPECT_DOUBLE_EQ(percentile({4, 3, 2, 1}, 100), 4);
  EXPECT_NEAR(percentile({50, 15, 40, 20, 35}, 40), 29.0, 1e-12);  // unsorted input
  std::vector<double> one_to_twenty;
  for (int i = 1; i <= 20; ++i) one_to_twenty.push_back(i);
  EXPECT_NEAR(percentile(one_to_twenty, 5), 1.95, 1e-12);
  EXPECT_NEAR(percentile(one_to_twenty, 95), 19.05, 1e-12);
  EXPECT_DOUBLE_EQ(percentile({7}, 95), 7);
  EXPECT_TRUE(std::isnan(percentile({}, 50)));
}

TEST(BenchStats, MeanAndSampleStddev) {
  const std::vector<double> x = {2, 4, 4, 4, 5, 5, 7, 9};
  EXPECT_DOUBLE_EQ(mean(x), 5);
  EXPECT_NEAR(stddev(x), std::sqrt(32.0 / 7.0), 1e-12);  // divides by n - 1
  EXPECT_EQ(stddev({3}), 0);
  EXPECT_TRUE(std::isnan(mean({})));
  const Summary s = summarize(x);
  EXPECT_EQ(s.n, 8u);
  EXPECT_EQ(s.min, 2);
  EXPECT_EQ(s.max, 9);
  EXPECT_DOUBLE_EQ(s.p50, 4.5);
  const Summary e = summarize(std::vector<double>{});
  EXPECT_EQ(e.n, 0u);
  EXPECT_TRUE(std::isnan(e.p50) && std::isnan(e.mean) && std::isnan(e.max));
}

TEST(BenchStats, InterleavedScheduleCoversEverythingInOrderAndRotates) {
  const int S = 3, R = 4, M = 3;
  const std::vector<Step> steps = interleaved_schedule(S, R, M);
  ASSERT_EQ(steps.size(), size_t(S * M + S * R * M));
  std::set<std::pair<int, int>> setups;
  std::set<std::tuple<int, int, int>> requests;
  std::map<std::pair<int, int>, int> last_request;  // (session, mode) -> last request index
  std::vector<std::vector<int>> at_position(M, std::vector<int>(M, 0));  // [position][mode]
  bool in_requests = false;
  for (size_t i = 0; i < steps.size(); ++i) {
    const Step &st = steps[i];
    ASSERT_GE(st.mode, 0);
    ASSERT_LT(st.mode, M);
    if (st.kind == Step::kSetup) {
      EXPECT_FALSE(in_requests) << "a setup after a request";
      EXPECT_EQ(st.request, -1);
      EXPECT_TRUE(setups.insert({st.session, st.mode}).second);
      continue;
    }
    in_requests = true;
    EXPECT_TRUE(requests.insert({st.session, st.request, st.mode}).second);
    auto it = last_request.find({st.session, st.mode});
    EXPECT_EQ(st.request, it == last_request.end() ? 0 : it->second + 1) << "requests out of order";
    last_request[{st.session, st.mode}] = st.request;
    at_position[(i - S * M) % M][st.mode]++;
  }
  EXPECT_EQ(setups.size(), size_t(S * M));
  EXPECT_EQ(requests.size(), size_t(S * R * M));
  // The modes of one (session, request) run back to back; each mode is first, second and
  // third equally often.
  for (size_t i = S * M; i < steps.size(); i += M)
    for (int k = 1; k < M; ++k) {
      EXPECT_EQ(steps[i + k].session, steps[i].session);
      EXPECT_EQ(steps[i + k].request, steps[i].request);
    }
  for (int k = 0; k < M; ++k)
    for (int m = 0; m < M; ++m)
      EXPECT_EQ(at_position[k][m], S * R / M) << "position " << k << " mode " << m;
  // The known start: setups of session 0 (modes 0 1 2), session 1 (1 2 0), ...; then
  // request 0 of session 0 in modes 0 1 2, of session 1 in 1 2 0.
  EXPECT_EQ(steps[3].mode, 1);
  EXPECT_EQ(steps[S * M + 0].mode, 0);
  EXPECT_EQ(steps[S * M + 3].session, 1);
  EXPECT_EQ(steps[S * M + 3].mode, 1);
  EXPECT_TRUE(interleaved_schedule(0, 5, 3).empty());
  EXPECT_EQ(interleaved_schedule(2, 2, 1).size(), 2u + 4u);
}

TEST(BenchStats, AlignedNeighbours) {
  auto nb = [](int n) {
    const Neighbours x = aligned_neighbours(n, 16);
    return std::make_pair(x.lo, x.hi);
  };
  EXPECT_EQ(nb(1), std::make_pair(0, 16));  // no lower neighbour: not tested
  EXPECT_FALSE(aligned_neighbours(1, 16).ok());
  EXPECT_EQ(nb(2), std::make_pair(1, 16));
  EXPECT_EQ(nb(15), std::make_pair(1, 16));
  EXPECT_EQ(nb(16), std::make_pair(1, 32));
  EXPECT_EQ(nb(17), std::make_pair(16, 32));
  EXPECT_EQ(nb(32), std::make_pair(16, 48));
  EXPECT_EQ(nb(33), std::make_pair(32, 48));
  EXPECT_EQ(nb(257), std::make_pair(256, 272));
  EXPECT_EQ(aligned_neighbours(65, 64).lo, 64);
  EXPECT_EQ(aligned_neighbours(65, 64).hi, 128);
  EXPECT_EQ(with_aligned_neighbours({1, 2, 3, 7, 8, 9, 15, 16, 17, 31, 32, 33}, 16),
            (std::vector<int>{1, 2, 3, 7, 8, 9, 15, 16, 17, 31, 32, 33, 48}));
  EXPECT_EQ(with_aligned_neighbours({5, 5, 0, -3}, 16), (std::vector<int>{1, 5, 16}));
}

TEST(BenchStats, LineTestFlagsOnlyWhatIsAboveTheLine) {
  // t(n) = 1 + 0.1 n: proportional cost plus a fixed overhead; nothing is flagged.
  std::vector<int> n;
  std::vector<double> t;
  for (int i = 1; i <= 48; ++i) {
    n.push_back(i);
    t.push_back(1 + 0.1 * i);
  }
  for (const RowCheck &c : check_rows(n, t, 16, 0.10)) {
    EXPECT_FALSE(c.flagged) << c.n;
    EXPECT_EQ(c.tested, c.n > 1 && c.n < 48) << c.n;  // 48 lacks its upper neighbour 64
    if (c.tested) {
      EXPECT_NEAR(c.excess, 0, 1e-9) << c.n;
    }
  }
  // A 32-row tile: 17..31 rows cost as much as 32. Against the line through 16 (2.6 ms)
  // and 32 (4.2 ms): n = 28 is 4.2 / 3.8 = +10.5 % (flagged), n = 29 is +7.7 % (not).
  std::vector<double> cliff = t;
  for (int i = 17; i <= 31; ++i) cliff[i - 1] = t[31];
  std::vector<int> flagged;
  for (const RowCheck &c : check_rows(n, cliff, 16, 0.10))
    if (c.flagged) flagged.push_back(c.n);
  std::vector<int> want;
  for (int i = 17; i <= 28; ++i) want.push_back(i);
  EXPECT_EQ(flagged, want);
  // One slow point, exactly measured: 25 % above the line is flagged with excess 0.25.
  std::vector<double> bump = t;
  bump[16] = 1.25 * t[16];  // n = 17
  bump[17] = 1.05 * t[17];  // n = 18: within 10 %
  const std::vector<RowCheck> c = check_rows(n, bump, 16, 0.10);
  EXPECT_TRUE(c[16].flagged);
  EXPECT_NEAR(c[16].excess, 0.25, 1e-9);
  EXPECT_NEAR(c[16].line_ms, t[16], 1e-9);
  EXPECT_FALSE(c[17].flagged);
  // Neighbours not measured: not tested, never flagged.
  const std::vector<RowCheck> lone = check_rows({17}, {100.0}, 16, 0.10);
  ASSERT_EQ(lone.size(), 1u);
  EXPECT_FALSE(lone[0].tested);
  EXPECT_FALSE(lone[0].flagged);
}

TEST(BenchStats, MarkdownTable) {
  const std::string t =
      format_table({"mode", "t/s"}, {{"pin", "1.00 ± 0.10"}, {"snapshot", "12.5"}}, "lr");
  EXPECT_EQ(t,
            "| mode     |         t/s |\n"
            "| -------- | ----------: |\n"
            "| pin      | 1.00 ± 0.10 |\n"
            "| snapshot |        12.5 |\n");
  EXPECT_EQ(ms(std::nan("")), "-");
  EXPECT_EQ(ms(1.25, 2), "1.25");
  EXPECT_EQ(mib(-1), "-");
  EXPECT_EQ(mib(3 * 1048576), "3.0");
  EXPECT_EQ(bytes_text(512), "512 B");
  EXPECT_EQ(bytes_text(1536), "1.5 KiB");
}

TEST(BenchStats, Sha256Vectors) {
  auto hex = [](const std::string &s) {
    Sha256 h;
    h.update(s.data(), s.size());
    return h.hex_digest();
  };
  EXPECT_EQ(hex(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(hex("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  // One million 'a' in uneven pieces (exercises the partial-block path).
  Sha256 h;
  const std::string a(1000, 'a');
  size_t done = 0;
  for (size_t k = 1; done < 1000000; k = k % 997 + 1) {
    const size_t n = std::min(k, 1000000 - done);
    h.update(a.data(), n);
    done += n;
  }
  EXPECT_EQ(h.hex_digest(), "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

Environment test_env(const std::string &command) {
  Environment e;
  e.command = command;
  e.geist_version = "0.1.0";
  e.geist_commit = "abcdef123456";
  e.cpu = "Test CPU";
  e.cpu_threads = 2;
  e.cpu_level = "x86-64-v4";
  e.cpu_features = {"avx2", "avx512f"};
  e.isa = "auto (target_clones: x86-64-v4)";
  e.threads = 2;
  e.model_path = "/models/m.gguf";
  e.model_name = "m";
  e.model_arch = "gemma3";
  e.model_size = 253113024;
  e.model_n_params = 268098176;
  e.model_fingerprint = 0x0123456789abcdefULL;
  e.n_ctx = 32768;
  e.time_utc = "2025-01-01T00:00:00Z";
  return e;
}

PinnedMode test_mode(const std::string &name, double scale) {
  PinnedMode m;
  m.mode = name;
  // 2 sessions x 3 requests; the first request of each session is slow (warm-up).
  m.request_ms = {{100 * scale, 10 * scale, 20 * scale}, {90 * scale, 30 * scale, 40 * scale}};
  m.prefill_ms = {{80 * scale, 8 * scale, 16 * scale}, {70 * scale, 24 * scale, 32 * scale}};
  m.reset_ms = {{0.1, 0.1, 0.1}, {0.1, 0.1, 0.1}};
  m.decode_ms = {1, 2, 3, 4};
  if (name == "full") {
    m.prefix_prefill_ms = {40, 44};
  } else {
    m.pin_ms = {41, 45};
    m.checkpoint_bytes = 1 << 20;
  }
  m.peak_rss = int64_t(300 * 1048576 * scale);
  m.rss_after_first = m.rss_after_last = m.peak_rss;
  return m;
}

TEST(BenchJson, PinnedDocumentFollowsTheSchema) {
  PinnedParams p;
  p.sessions = 2, p.requests = 3;
  const std::vector<PinnedMode> modes = {test_mode("full", 1), test_mode("pin", 0.5)};
  const json j = pinned_json(test_env("pinned"), p, modes, 1, 25 << 20);
  EXPECT_EQ(check_bench_json(j), std::vector<std::string>{});
  EXPECT_EQ(j["schema"], "geist-bench/1");
  EXPECT_EQ(j["command"], "pinned");
  EXPECT_EQ(j["environment"]["model"]["fingerprint"], "0x0123456789abcdef");
  EXPECT_TRUE(j["environment"]["model"]["sha256"].is_null());
  EXPECT_EQ(j["params"]["remainder_tokens"], 600 - 240);
  const json &full = j["results"]["modes"][0], &pin = j["results"]["modes"][1];
  // Percentiles over requests 2..R only: {10, 20, 30, 40}.
  EXPECT_EQ(full["request_ms"]["n"], 4);
  EXPECT_DOUBLE_EQ(full["request_ms"]["p50"].get<double>(), 25);
  EXPECT_NEAR(full["request_ms"]["p95"].get<double>(), 38.5, 1e-9);
  EXPECT_DOUBLE_EQ(full["request_ms"]["max"].get<double>(), 40);
  // The first requests on their own: {100, 90}.
  EXPECT_EQ(full["first_request_ms"]["n"], 2);
  EXPECT_DOUBLE_EQ(full["first_request_ms"]["mean"].get<double>(), 95);
  EXPECT_DOUBLE_EQ(pin["ratio_to_full"]["request_p50"].get<double>(), 0.5);
  EXPECT_DOUBLE_EQ(pin["ratio_to_full"]["peak_rss"].get<double>(), 0.5);
  EXPECT_DOUBLE_EQ(full["ratio_to_full"]["request_p50"].get<double>(), 1.0);
  // Not applicable is null, not 0: full has no pin, no snapshot.
  EXPECT_EQ(full["pin_ms"]["n"], 0);
  EXPECT_TRUE(full["pin_ms"]["p50"].is_null());
  EXPECT_TRUE(full["snapshot_bytes"].is_null());
  EXPECT_EQ(pin["checkpoint_bytes"], 1 << 20);
  EXPECT_EQ(j["results"]["outputs_identical"], true);
  EXPECT_EQ(pin["samples"]["request_ms"].size(), 2u);

  // Without full there are no ratios; one mode has no output comparison.
  const json one = pinned_json(test_env("pinned"), p, {test_mode("pin", 1)}, -1, -1);
  EXPECT_EQ(check_bench_json(one), std::vector<std::string>{});
  EXPECT_TRUE(one["results"]["modes"][0]["ratio_to_full"].is_null());
  EXPECT_TRUE(one["results"]["outputs_identical"].is_null());
}

TEST(BenchJson, SchemaCheckNamesWhatIsWrong) {
  PinnedParams p;
  json j = pinned_json(test_env("pinned"), p, {test_mode("full", 1)}, -1, 1);
  j["results"]["modes"][0]["request_ms"].erase("p95");
  j["environment"]["threads"] = "two";
  j["results"]["modes"][0]["peak_rss_bytes"] = 1.5;
  const std::vector<std::string> e = check_bench_json(j);
  const std::set<std::string> got(e.begin(), e.end());
  EXPECT_EQ(got,
            (std::set<std::string>{"results.modes[0].request_ms.p95: missing",
                                   "environment.threads: expected integer",
                                   "results.modes[0].peak_rss_bytes: expected integer or null"}));
  EXPECT_FALSE(check_bench_json(json::array()).empty());
  json bad_cmd = j;
  bad_cmd["command"] = "nope";
  EXPECT_FALSE(check_bench_json(bad_cmd).empty());
}

TEST(BenchJson, PpTgRecordsAsLlamaBench) {
  PpTgTest pp;
  pp.n_prompt = 512, pp.n_depth = 1024, pp.n_threads = 2, pp.n_batch = 512, pp.n_ctx = 1536;
  pp.samples_ns = {1e9, 2e9};  // 512 and 256 tokens/s
  PpTgTest tg;
  tg.n_gen = 128, tg.n_threads = 2, tg.n_batch = 512, tg.n_ctx = 128;
  tg.samples_ns = {4e9};
  EXPECT_EQ(pp.name(), "pp512 @ d1024");
  EXPECT_EQ(tg.name(), "tg128");
  const Environment env = test_env("pp-tg");
  const json params{{"n_prompt", {512}}, {"n_gen", {128}}, {"n_depth", {1024}}, {"threads", {2}},
                    {"repetitions", 2},  {"n_batch", 512}, {"warmup", true}};
  const json j = pptg_json(env, params, {pp, tg});
  EXPECT_EQ(check_bench_json(j), std::vector<std::string>{});
  const json &r = j["results"][0];
  EXPECT_DOUBLE_EQ(r["avg_ts"].get<double>(), 384);
  EXPECT_NEAR(r["stddev_ts"].get<double>(), std::sqrt(2.0) * 128, 1e-9);
  EXPECT_EQ(r["avg_ns"], 1500000000);
  EXPECT_EQ(r["samples_ns"], json({1000000000, 2000000000}));
  EXPECT_EQ(r["n_depth"], 1024);
  EXPECT_EQ(j["results"][1]["stddev_ts"], 0.0);  // one sample
  const std::string md = pptg_markdown(env, {pp, tg});
  EXPECT_NE(md.find("| model "), std::string::npos);
  EXPECT_NE(md.find("241.39 MiB"), std::string::npos);
  EXPECT_NE(md.find("268.10 M"), std::string::npos);
  EXPECT_NE(md.find("pp512 @ d1024"), std::string::npos);
  EXPECT_NE(md.find("384.00 ± 181.02"), std::string::npos);
  EXPECT_NE(md.find("32.00 ± 0.00"), std::string::npos);
  const std::string csv = pptg_csv(env, {pp, tg});
  EXPECT_EQ(std::count(csv.begin(), csv.end(), '\n'), 3);
  EXPECT_EQ(csv.rfind("build_commit,geist_version,", 0), 0u);
  EXPECT_NE(csv.find("\"pp512 @ d1024\""), std::string::npos);
}

TEST(BenchJson, RowsDocument) {
  std::vector<RowPoint> pts;
  std::vector<int> n;
  std::vector<double> t;
  for (int i : {1, 2, 16, 17, 32}) {
    RowPoint p;
    p.n = i;
    p.requested = i != 32;
    p.samples_ms = {1 + 0.1 * i + (i == 17 ? 2.0 : 0.0), 5 + 0.1 * i};  // the fastest counts
    pts.push_back(p);
    n.push_back(i);
    t.push_back(p.ms_per_call());
  }
  EXPECT_DOUBLE_EQ(pts[0].ms_per_call(), 1.1);
  EXPECT_DOUBLE_EQ(pts[0].median_ms(), 3.1);
  const std::vector<RowCheck> checks = check_rows(n, t, 16, 0.10);
  RowsParams rp;
  rp.requested = {1, 2, 16, 17};
  rp.chunk = 32;
  const json j = rows_json(test_env("rows"), rp, pts, checks, 1 << 20);
  EXPECT_EQ(check_bench_json(j), std::vector<std::string>{});
  EXPECT_EQ(j["results"]["n_flagged"], 1);
  EXPECT_TRUE(j["results"]["points"][3]["flagged"].get<bool>());
  EXPECT_EQ(j["results"]["points"][3]["lo"], 16);
  EXPECT_EQ(j["results"]["points"][3]["hi"], 32);
  EXPECT_TRUE(j["results"]["points"][0]["lo"].is_null());
  EXPECT_TRUE(j["results"]["points"][0]["excess"].is_null());
  EXPECT_FALSE(j["results"]["points"][4]["requested"].get<bool>());
}

}  // namespace
}  // namespace geist::cli::bench

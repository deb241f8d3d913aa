// Session cost measurements on one model (issue 3's note): pin cost against a cold
// prefill of the same tokens, reset time, snapshot size and snapshot/save/load/restore
// times at a given depth, and the same for saved states (save_state into a fresh state and
// into a reused one, load_state). Uses only the public C++ wrapper (geist.hpp over
// libgeist.so).
//   session_costs MODEL [pin_tokens=240] [depth=4096] [repeats=5] [threads=2] [cpu|cuda]
// Prints medians; the machine is shared and noisy, so read them as such.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "geist/geist.hpp"

using geist::api::Model;
using geist::api::Session;

namespace {
double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }
double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : (v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]));
}
void check(const geist::api::Error &e, const char *what) {
  if (e) {
    std::fprintf(stderr, "session_costs: %s: %s\n", what, e.to_string().c_str());
    std::exit(1);
  }
}
}  // namespace

int main(int argc, char **argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: session_costs MODEL [pin_tokens] [depth] [repeats] [threads] [cpu|cuda]\n");
    return 2;
  }
  const size_t pin_n = argc > 2 ? std::strtoul(argv[2], nullptr, 10) : 240;
  const size_t depth = argc > 3 ? std::strtoul(argv[3], nullptr, 10) : 4096;
  const int reps = argc > 4 ? std::atoi(argv[4]) : 5;
  const int threads = argc > 5 ? std::atoi(argv[5]) : 2;
  geist_model_params mp = geist_model_params_default();
  if (argc > 6 && std::string(argv[6]) == "cuda") mp.backend = GEIST_BACKEND_CUDA;
  Model m = Model::load_or_throw(argv[1], &mp);
  // Text tokens of a fixed English passage, repeated to the lengths needed.
  std::string text;
  while (text.size() < depth * 8)
    text += "In the beginning God created the heaven and the earth. And the earth was without form, and void; and "
            "darkness was upon the face of the deep. And the Spirit of God moved upon the face of the waters. ";
  std::vector<geist_token> toks = m.tokenize_or_throw(text, true, false);
  if (toks.size() < depth + 400) return 1;

  geist_session_params p = geist_session_params_default();
  p.n_threads = threads;
  p.chunk = 64;  // as apps call prefill_tokens
  p.n_ctx = int64_t(depth) + 512;
  Session warm = Session::create_or_throw(m, &p);  // page the weights in before timing
  check(warm.prefill(toks.data(), 64), "warm-up");

  // 1. Pin vs cold prefill of the same tokens (alternating), and reset + remainder.
  std::vector<double> cold, pin, reset, rest, full;
  std::vector<double> reset_rows;
  double ck_mib = 0;
  for (int r = 0; r < reps; ++r) {
    Session a = Session::create_or_throw(m, &p), b = Session::create_or_throw(m, &p);
    double t = now();
    check(a.prefill(toks.data(), pin_n), "cold prefill");
    cold.push_back(now() - t);
    t = now();
    check(b.pin_prefix(toks.data(), pin_n), "pin");
    pin.push_back(now() - t);
    ck_mib = b.stats().checkpoint_bytes / 1048576.0;
    const size_t req = pin_n * 3 / 2;  // a remainder of 1.5x the pin (the 40 % prefix workload)
    check(b.prefill(toks.data() + pin_n, req), "request");
    const uint64_t rows0 = b.stats().n_reset_rows;
    t = now();
    check(b.reset(), "reset");
    reset.push_back(now() - t);
    reset_rows.push_back(double(b.stats().n_reset_rows - rows0));
    t = now();
    check(b.prefill(toks.data() + pin_n, req), "remainder");
    rest.push_back(now() - t);
    check(a.clear(), "clear");
    t = now();
    check(a.prefill(toks.data(), pin_n + req), "full");
    full.push_back(now() - t);
  }
  std::printf("pin %zu tokens: pin %.1f ms vs cold prefill %.1f ms (ratio %.3f); checkpoint %.2f MiB\n", pin_n,
              median(pin) * 1e3, median(cold) * 1e3, median(pin) / median(cold), ck_mib);
  std::printf("request of %zu tokens after the pin: reset %.3f ms (%.0f rows copied back), remainder %.1f ms; "
              "full prompt %.1f ms (pinned/full %.3f)\n",
              pin_n * 3 / 2, median(reset) * 1e3, median(reset_rows), median(rest) * 1e3, median(full) * 1e3,
              (median(reset) + median(rest)) / median(full));

  // 2. Snapshot, save, load, restore at `depth` tokens.
  Session d = Session::create_or_throw(m, &p);
  double t = now();
  check(d.pin_prefix(toks.data(), pin_n), "pin");
  check(d.prefill(toks.data() + pin_n, depth - pin_n), "depth prefill");
  std::printf("depth %zu: prefill %.1f s (%.0f tokens/s); checkpoint %.2f MiB\n", depth, now() - t,
              depth / (now() - t), d.stats().checkpoint_bytes / 1048576.0);
  std::vector<double> snap, save, load, restore;
  std::vector<uint8_t> img;
  const std::string path = "/tmp/geist_session_costs.snap";
  for (int r = 0; r < reps; ++r) {
    t = now();
    check(d.snapshot(&img), "snapshot");
    snap.push_back(now() - t);
    t = now();
    check(d.save_file(path), "save");
    save.push_back(now() - t);
    Session e = Session::create_or_throw(m, &p);
    t = now();
    check(e.load_file(path), "load");
    load.push_back(now() - t);
    t = now();
    check(e.restore(img), "restore");
    restore.push_back(now() - t);
  }
  std::remove(path.c_str());
  std::printf("depth %zu: snapshot %.2f MiB; to memory %.1f ms, save_file %.1f ms, load_file %.1f ms, "
              "restore from memory %.1f ms\n",
              depth, img.size() / 1048576.0, median(snap) * 1e3, median(save) * 1e3, median(load) * 1e3,
              median(restore) * 1e3);

  // 3. Saved states at the same depth (kept where the session keeps its KV rows).
  std::vector<double> fresh, reused, first_load, loaded;
  geist::api::State kept;
  check(geist::api::State::create(&kept), "state");
  for (int r = 0; r < reps; ++r) {
    geist::api::State st;
    check(geist::api::State::create(&st), "state");
    t = now();
    check(d.save_state(&st), "save_state (fresh)");
    fresh.push_back(now() - t);
    t = now();
    check(d.save_state(&kept), "save_state (reused)");
    reused.push_back(now() - t);
    // Into a fresh session (its KV pages fault in as the rows land), then again (as the
    // restore above, which follows a load_file into the same session).
    Session e = Session::create_or_throw(m, &p);
    t = now();
    check(e.load_state(kept), "load_state");
    first_load.push_back(now() - t);
    t = now();
    check(e.load_state(kept), "load_state");
    loaded.push_back(now() - t);
  }
  std::printf("depth %zu: saved state %.2f MiB; save into a fresh state %.2f ms, into a reused one %.2f ms; "
              "load into a fresh session %.2f ms, into one that held it %.2f ms\n",
              depth, kept.bytes() / 1048576.0, median(fresh) * 1e3, median(reused) * 1e3, median(first_load) * 1e3,
              median(loaded) * 1e3);
  return 0;
}

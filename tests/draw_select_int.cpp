// The CUDA sampled draw's select path (src/backends/cuda/draw_select.cuh, DrawAlgo::kSelect)
// run here, without a GPU: the device code itself, compiled as C++, with its block of 1024
// threads emulated by 1024 host threads that meet at a barrier for each __syncthreads and,
// 32 at a time, for each warp vote and shuffle. The keys a block keeps must be the best ones
// of a sort, over rows with ties, NaNs, infinities, signed zeros and padding, for any number
// wanted; and a row drawn through the emulated levels and pick, as draw.cu launches them,
// must give the host's draw_sampled token. What this cannot show is the GPU's own behaviour
// (its memory model, its scheduling): CudaOps.SampleRowsEqualsTheHostDraw runs the kernels
// there. A barrier the code lacks shows here as a wrong answer or a hang (the host threads
// run in any order between barriers, and random warps lag) and under TSan as a race.
#include <gtest/gtest.h>

#include <algorithm>
#include <barrier>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <random>
#include <thread>
#include <vector>

namespace geist::cuda::sel {

// Stand-ins for the CUDA intrinsics draw_select.cuh calls, for one emulated block at a time.
struct Uint3 {
  unsigned x = 0, y = 0, z = 0;
};
thread_local Uint3 threadIdx;

struct Warp {
  std::barrier<> meet{32};
  uint64_t val[32] = {};
};
struct Block {
  std::barrier<> meet;
  Warp warps[32];
  uint32_t slow = 0;  // warps whose lane 0 dawdles before each vote (the others run ahead)
  explicit Block(int n) : meet(n) {}
};
Block *g_block = nullptr;

void __syncthreads() { g_block->meet.arrive_and_wait(); }

// Every lane of the warp posts v; f reads all 32 posts; nobody posts again until all have read.
template <class F>
auto warp_exchange(uint64_t v, F f) {
  Warp &w = g_block->warps[threadIdx.x / 32];
  if ((g_block->slow >> (threadIdx.x / 32) & 1) != 0 && threadIdx.x % 32 == 0) {
    std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
  w.val[threadIdx.x % 32] = v;
  w.meet.arrive_and_wait();
  auto r = f(w.val);
  w.meet.arrive_and_wait();
  return r;
}
unsigned __ballot_sync(unsigned mask, bool pred) {
  return mask & warp_exchange(pred ? 1 : 0, [](const uint64_t *v) {
           unsigned m = 0;
           for (int l = 0; l < 32; ++l) m |= v[l] != 0 ? 1u << l : 0u;
           return m;
         });
}
unsigned __match_any_sync(unsigned mask, unsigned x) {
  return mask & warp_exchange(x, [x](const uint64_t *v) {
           unsigned m = 0;
           for (int l = 0; l < 32; ++l) m |= v[l] == x ? 1u << l : 0u;
           return m;
         });
}
unsigned __reduce_add_sync(unsigned, unsigned x) {
  return warp_exchange(x, [](const uint64_t *v) {
    unsigned s = 0;
    for (int l = 0; l < 32; ++l) s += unsigned(v[l]);
    return s;
  });
}
unsigned __shfl_down_sync(unsigned, unsigned x, int off) {
  const unsigned lane = threadIdx.x % 32;
  return warp_exchange(x, [=](const uint64_t *v) {
    return lane + unsigned(off) < 32 ? unsigned(v[lane + unsigned(off)]) : x;  // past the warp: its own
  });
}
unsigned __shfl_sync(unsigned, unsigned x, int src) {
  return warp_exchange(x, [=](const uint64_t *v) { return unsigned(v[src]); });
}
// (The GCC / clang builtin: libc++ 14 has no std::atomic_ref.)
unsigned atomicAdd(unsigned *p, unsigned v) { return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST); }
int __popc(unsigned x) { return __builtin_popcount(x); }
unsigned __float_as_uint(float f) {
  unsigned u;
  std::memcpy(&u, &f, 4);
  return u;
}

}  // namespace geist::cuda::sel

#include "backends/cuda/draw_select.cuh"

namespace {

namespace sel = geist::cuda::sel;

// Runs body on an emulated block of kThreads threads (threadIdx set); slow: the warps that
// lag (sel::Block::slow), so that a read a barrier does not order comes early.
void run_block(uint32_t slow, const std::function<void(int)> &body) {
  sel::Block block(sel::kThreads);
  block.slow = slow;
  sel::g_block = &block;
  std::vector<std::thread> threads;
  threads.reserve(sel::kThreads);
  for (int t = 0; t < sel::kThreads; ++t) {
    threads.emplace_back([&body, t] {
      sel::threadIdx.x = unsigned(t);
      body(t);
    });
  }
  for (std::thread &th : threads) th.join();
  sel::g_block = nullptr;
}

// The keys select_top keeps of keys[0, kTile) (thread t holds keys t, t + 1024, ..., as the
// kernels load them), sorted descending; every thread must return the same count.
std::vector<uint64_t> run_select(const std::vector<uint64_t> &keys, int want, uint32_t slow) {
  sel::SelectSmem sm;
  std::vector<uint64_t> out(256, 0);
  std::vector<int> n(sel::kThreads, -1);
  run_block(slow, [&](int t) {
    uint64_t v[sel::kPer];
    for (int j = 0; j < sel::kPer; ++j) v[j] = keys[size_t(t + j * sel::kThreads)];
    n[size_t(t)] = sel::select_top(v, want, out.data(), sm);
  });
  for (int t = 1; t < sel::kThreads; ++t) EXPECT_EQ(n[size_t(t)], n[0]) << "thread " << t;
  out.resize(size_t(std::max(n[0], 0)));
  std::sort(out.begin(), out.end(), std::greater<>());
  return out;
}

// The best `want` nonzero keys by a sort: what the host draw's candidates are.
std::vector<uint64_t> best_by_sort(std::vector<uint64_t> keys, int want) {
  keys.erase(std::remove(keys.begin(), keys.end(), uint64_t(0)), keys.end());
  std::sort(keys.begin(), keys.end(), std::greater<>());
  if (keys.size() > size_t(want)) keys.resize(size_t(want));
  return keys;
}

TEST(DrawSelect, KeysOrderAsTheHostSort) {
  // Value descending, then index ascending; -0 as +0; NaN none.
  const float inf = INFINITY;
  EXPECT_GT(sel::key_of(2.0f, 5), sel::key_of(1.0f, 0));
  EXPECT_GT(sel::key_of(1.0f, 3), sel::key_of(1.0f, 4));
  EXPECT_GT(sel::key_of(-1.0f, 9), sel::key_of(-2.0f, 0));
  EXPECT_GT(sel::key_of(inf, 9), sel::key_of(3e38f, 0));
  EXPECT_GT(sel::key_of(-inf, 0x7FFFFFFE), uint64_t(0));
  EXPECT_EQ(sel::key_of(-0.0f, 7), sel::key_of(0.0f, 7));
  EXPECT_EQ(sel::key_of(std::nanf(""), 7), 0u);
  EXPECT_EQ(sel::id_of(sel::key_of(-3.5f, 123456)), 123456u);
}

TEST(DrawSelect, KeepsTheBestKeysOfABlock) {
  std::mt19937 rng(17);
  std::normal_distribution<float> nd(0.0f, 3.0f);
  const float nan = std::nanf(""), inf = INFINITY;
  int cases = 0;
  for (int pattern = 0; pattern < 9; ++pattern) {
    for (int round = 0; round < 2; ++round) {
      // How many of the block's 4096 slots hold a key (the rest padding, as a row's last
      // tile), and how many are wanted: 1, a typical top-k or the most a step takes, and
      // all the keys there are or all but one.
      const int n_keys = round == 0 ? sel::kTile : 1 + int(rng() % 300);
      const int typical[] = {1, 40, 256};
      const int wants[] = {typical[(pattern + round) % 3], std::max(1, std::min(256, n_keys - pattern % 2))};
      std::vector<float> x(static_cast<size_t>(n_keys));
      for (float &f : x) f = nd(rng);
      for (float &f : x) {
        switch (pattern) {
          case 1: f = std::round(f); break;  // ties everywhere
          case 2: if (rng() % 7 == 0) f = nan; break;
          case 3: f = nan; break;  // no key at all
          case 4: if (f < 1.0f) f = -inf; break;
          case 5: f = std::round(f) == 0.0f ? (f < 0 ? -0.0f : 0.0f) : f - 9.0f; break;
          case 6: if (rng() % 500 == 0) f = inf; break;
          case 7: f = 1.5f; break;  // one value: the indices decide
          case 8: f = -inf; break;  // the keys whose top byte is the padding's
          default: break;
        }
      }
      std::vector<uint64_t> keys(size_t(sel::kTile), 0);
      const uint32_t first = uint32_t(rng() % 200000);
      for (int i = 0; i < n_keys; ++i) keys[size_t(i)] = sel::key_of(x[size_t(i)], first + uint32_t(i));
      std::shuffle(keys.begin(), keys.end(), rng);  // the zeros anywhere in the block
      for (int want : wants) {
        EXPECT_EQ(run_select(keys, want, uint32_t(rng())), best_by_sort(keys, want))
            << "pattern " << pattern << " keys " << n_keys << " want " << want;
        ++cases;
      }
    }
  }
  std::printf("RESULT draw select: %d blocks emulated, the sort's keys\n", cases);
}

// sample_rows' select path end to end, as draw.cu launches it: a block per tile of the row
// (tile_best), a level of blocks over their keys while there are more than a tile's worth
// (keys_best), then the pick's block; the token must be the host's draw_sampled.
int32_t emulated_draw(const std::vector<float> &row, const geist::DrawSpec &d, int k, std::mt19937 &rng) {
  const int64_t width = int64_t(row.size());
  int tiles = int((width + sel::kTile - 1) / sel::kTile);
  std::vector<uint64_t> keys(size_t(tiles) * size_t(k), 1), next;  // 1: a key no block writes
  for (int tile = 0; tile < tiles; ++tile) {
    sel::TileSmem sm;
    run_block(uint32_t(rng()), [&](int) {
      sel::tile_best(row.data(), width, tile, sel::wanted(d, k), k, keys.data() + size_t(tile) * size_t(k), sm);
    });
  }
  int m = tiles * k;
  while (m > sel::kTile) {
    tiles = (m + sel::kTile - 1) / sel::kTile;
    next.assign(size_t(tiles) * size_t(k), 1);
    for (int tile = 0; tile < tiles; ++tile) {
      sel::TileSmem sm;
      run_block(uint32_t(rng()), [&](int) {
        sel::keys_best(keys.data(), m, tile, sel::wanted(d, k), k, next.data() + size_t(tile) * size_t(k), sm);
      });
    }
    keys.swap(next);
    m = tiles * k;
  }
  int32_t token = -5;
  sel::PickSmem sm;
  run_block(uint32_t(rng()), [&](int) { sel::pick(row.data(), keys.data(), m, d, k, &token, sm); });
  return token;
}

TEST(DrawSelect, TheKernelsDrawTheHostToken) {
  std::mt19937 rng(43);
  std::normal_distribution<float> nd(0.0f, 3.0f);
  std::uniform_real_distribution<double> uni(0.0, 1.0);
  std::vector<std::pair<float, int32_t>> cand;
  std::vector<double> pr;
  const geist::DrawSpec kinds[] = {{0.8f, 40, 0.95f, 0.05f, 0}, {1.5f, 1, 1.0f, 0.0f, 0}, {100.0f, 64, 1.0f, 0.0f, 0},
                                   {1.0f, 256, 0.99f, 0.0f, 0}, {0.3f, 17, 0.5f, 0.2f, 0}};
  int cases = 0;
  // A partial tile and three tiles, each case; then 17 tiles of 256 kept keys (4352 keys: a
  // merge level before the pick).
  for (int64_t width : {int64_t(300), int64_t(9000), int64_t(17 * 4096 - 5)}) {
    for (int c = 0; c < 5; ++c) {
      if (width > 10000 && c != 3) continue;  // the widest row (17 blocks and more): top-k 256
      std::vector<float> row(static_cast<size_t>(width));
      for (float &f : row) f = nd(rng);
      if (c == 1) {
        for (float &f : row) f = std::round(f);  // ties everywhere: the ids order them
      }
      if (c == 2) {
        for (size_t i = 0; i < row.size(); i += 3) row[i] = std::nanf("");
      }
      geist::DrawSpec d = kinds[size_t(c)];
      d.u = uni(rng);
      const int k = d.top_k <= 64 ? 64 : 256;  // as the CUDA exec chooses
      const int32_t want = geist::draw_sampled(row.data(), width, size_t(d.top_k), d.temperature, d.top_p, d.min_p,
                                               d.u, cand, pr);
      EXPECT_EQ(emulated_draw(row, d, k, rng), want) << "width " << width << " case " << c;
      ++cases;
    }
  }
  std::vector<float> none(5000, std::nanf(""));
  EXPECT_EQ(emulated_draw(none, kinds[0], 64, rng), 0) << "a row with no number draws 0, as the host";
  std::printf("RESULT draw select: %d rows drawn through the emulated kernels, the host's tokens\n", cases);
}

// A few blocks, for ThreadSanitizer (scripts/test.sh: the full sweep above takes minutes
// under it): every pass of the select (a tied row with padding), the early stop after the
// top byte (every key wanted but one) and the gather of fewer keys than wanted.
TEST(DrawSelect, FewBlocksForTheRaceChecker) {
  std::mt19937 rng(29);
  std::vector<uint64_t> keys(size_t(sel::kTile), 0);
  for (int i = 0; i < 3000; ++i) keys[size_t(i)] = sel::key_of(1.5f, uint32_t(7 * i));
  std::shuffle(keys.begin(), keys.end(), rng);
  EXPECT_EQ(run_select(keys, 40, 0x0F0F0F0Fu), best_by_sort(keys, 40));
  std::vector<uint64_t> few(size_t(sel::kTile), 0);
  for (int i = 0; i < 100; ++i) few[size_t(i) * 40] = sel::key_of(float(i % 9) - 4.0f, uint32_t(i));
  EXPECT_EQ(run_select(few, 99, 0xF0F0F0F0u), best_by_sort(few, 99));
  EXPECT_EQ(run_select(few, 256, 0x33333333u), best_by_sort(few, 256));
}

}  // namespace

// ThreadPool: every task runs exactly once per run(), results are complete when run()
// returns, for any thread count, across many back-to-back generations, and with several
// pools running at once on more threads than cores (each caller must finish on its own),
// and one shared pool taking runs from many threads at once.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <thread>
#include <vector>

#include "base/thread_pool.h"

namespace geist {
namespace {

TEST(ThreadPoolUnit, EveryTaskOnceForAnyThreadCount) {
  for (int threads : {1, 2, 3, 8}) {
    ThreadPool pool(threads);
    EXPECT_EQ(pool.n_threads(), threads);
    for (int n_tasks : {0, 1, 2, 7, 64, 1000}) {
      std::vector<int> hits(size_t(n_tasks), 0);
      std::atomic<int> bad_thread{0};
      pool.run(n_tasks, [&](int task, int thread) {
        hits[size_t(task)] += 1;  // each task index is owned by one call
        if (thread < 0 || thread >= threads) bad_thread.fetch_add(1);
      });
      for (int t = 0; t < n_tasks; ++t) ASSERT_EQ(hits[size_t(t)], 1) << threads << " threads, task " << t;
      EXPECT_EQ(bad_thread.load(), 0);
    }
  }
}

TEST(ThreadPoolUnit, ManyGenerationsBackToBack) {
  ThreadPool pool(3);
  std::vector<long> sum(16, 0);
  for (int g = 0; g < 20000; ++g) {  // wraps the 16-bit generation counter
    pool.run(16, [&](int task, int) { sum[size_t(task)] += g; });
  }
  const long expect = 20000L * 19999L / 2;
  for (long s : sum) EXPECT_EQ(s, expect);
}

TEST(ThreadPoolUnit, SeveralPoolsOversubscribed) {
  std::vector<std::thread> callers;
  std::atomic<int> wrong{0};
  for (int c = 0; c < 4; ++c) {
    callers.emplace_back([&] {
      ThreadPool pool(3);
      for (int g = 0; g < 2000; ++g) {
        std::vector<int> out(9, 0);
        pool.run(9, [&](int task, int) { out[size_t(task)] = task * g; });
        for (int t = 0; t < 9; ++t) wrong += out[size_t(t)] != t * g;
      }
    });
  }
  for (auto &t : callers) t.join();
  EXPECT_EQ(wrong.load(), 0);
}

// ThreadPool::shared: one pool per thread count, freed with its last holder; many threads
// calling run() on it at once (more than it has job slots) each get every one of their
// tasks run exactly once, and the workers take tasks of a job.
TEST(ThreadPoolUnit, SharedPoolRunsConcurrentCallersJobs) {
  std::shared_ptr<ThreadPool> a = ThreadPool::shared(3), b = ThreadPool::shared(3), c = ThreadPool::shared(2);
  EXPECT_EQ(a.get(), b.get());
  EXPECT_NE(a.get(), c.get());
  EXPECT_EQ(a->n_threads(), 3);
  std::weak_ptr<ThreadPool> w = c;
  c.reset();
  EXPECT_TRUE(w.expired());
  constexpr int kCallers = 40, kRuns = 60;  // more callers than the pool's 32 job slots
  std::atomic<int> failures{0};
  std::vector<std::thread> callers;
  for (int k = 0; k < kCallers; ++k) {
    callers.emplace_back([&, k] {
      std::shared_ptr<ThreadPool> pool = ThreadPool::shared(3);
      for (int r = 0; r < kRuns; ++r) {
        const int n = 2 + (k * 7 + r) % 50;
        std::vector<int> hits(size_t(n), 0);
        pool->run(n, [&](int task, int) {
          volatile int spin = 0;  // long enough tasks that the runs overlap in time
          for (int i = 0; i < 2000; ++i) spin = spin + 1;
          hits[size_t(task)] += 1;
        });
        for (int t = 0; t < n; ++t) {
          if (hits[size_t(t)] != 1) failures.fetch_add(1);
        }
      }
    });
  }
  for (auto &t : callers) t.join();
  EXPECT_EQ(failures.load(), 0);
  // The workers take tasks: the caller's task of this job waits for the other task, which
  // only a worker can run. (Counting the tasks workers ran during the 40 callers' runs, as
  // before, could find none on a loaded machine: there the callers may claim every task
  // before a worker wakes, which the design allows.) The wait is bounded, so a pool whose
  // workers never take a task fails here instead of hanging.
  std::shared_ptr<ThreadPool> pool = ThreadPool::shared(3);
  std::atomic<bool> worker_ran{false};
  pool->run(2, [&](int, int thread) {
    if (thread != 0) {
      worker_ran.store(true);
      return;
    }
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (!worker_ran.load() && std::chrono::steady_clock::now() < until) std::this_thread::yield();
  });
  EXPECT_TRUE(worker_ran.load());
}

}  // namespace
}  // namespace geist

#include "base/thread_pool.h"

#include <sched.h>

#include "base/status.h"

namespace geist {

namespace {
inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}
// Spin this many polls before sleeping on the futex: covers the gap between two ops of
// one forward pass without burning a core while idle.
constexpr int kSpinPolls = 20000;
}  // namespace

int ThreadPool::hardware_threads() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) {
    int n = CPU_COUNT(&set);
    if (n > 0) return n;
  }
  unsigned n = std::thread::hardware_concurrency();
  return n > 0 ? static_cast<int>(n) : 1;
}

ThreadPool::ThreadPool(int n_threads) : n_threads_(n_threads < 1 ? 1 : n_threads) {
  workers_.reserve(n_threads_ - 1);
  for (int t = 1; t < n_threads_; ++t) workers_.emplace_back([this, t] { worker_main(t); });
}

ThreadPool::~ThreadPool() {
  stop_.store(true, std::memory_order_release);
  generation_.fetch_add(1, std::memory_order_acq_rel);
  generation_.notify_all();
  for (auto &w : workers_) w.join();
}

int ThreadPool::claim(uint64_t gen) {
  uint64_t w = work_.load(std::memory_order_acquire);
  for (;;) {
    const uint64_t idx = w & 0xFFFFFF, n = (w >> 24) & 0xFFFFFF;
    if ((w >> 48) != (gen & 0xFFFF) || idx >= n) return -1;
    if (work_.compare_exchange_weak(w, w + 1, std::memory_order_acq_rel, std::memory_order_acquire)) {
      return static_cast<int>(idx);
    }
  }
}

void ThreadPool::drain(int thread) {
  const uint64_t gen = work_.load(std::memory_order_acquire) >> 48;
  for (int task; (task = claim(gen)) >= 0;) {
    (*fn_)(task, thread);  // fn_ is this generation's: it cannot end while a task is claimed
    done_.fetch_add(1, std::memory_order_acq_rel);
  }
}

void ThreadPool::worker_main(int thread) {
  uint32_t seen = 0;
  for (;;) {
    uint32_t g = generation_.load(std::memory_order_acquire);
    for (int i = 0; g == seen && i < kSpinPolls; ++i) {
      cpu_relax();
      g = generation_.load(std::memory_order_acquire);
    }
    if (g == seen) {
      generation_.wait(seen, std::memory_order_acquire);
      continue;
    }
    seen = g;
    if (stop_.load(std::memory_order_acquire)) return;
    drain(thread);
  }
}

void ThreadPool::run(int n_tasks, const TaskFn &fn) {
  if (n_tasks <= 0) return;
  if (n_threads_ == 1 || n_tasks == 1) {
    for (int t = 0; t < n_tasks; ++t) fn(t, 0);
    return;
  }
  GEIST_CHECK(n_tasks < (1 << 24), "ThreadPool::run: more than 2^24 tasks");
  fn_ = &fn;
  done_.store(0, std::memory_order_relaxed);
  const uint64_t gen = (generation_.load(std::memory_order_relaxed) + 1u) & 0xFFFF;
  work_.store((gen << 48) | (uint64_t(n_tasks) << 24), std::memory_order_release);
  generation_.fetch_add(1, std::memory_order_acq_rel);
  generation_.notify_all();
  drain(0);
  // Tasks the workers claimed may still be running: spin briefly, then yield the core
  // (the worker may be waiting for it).
  for (int i = 0; done_.load(std::memory_order_acquire) != n_tasks; ++i) {
    if (i < 2000) {
      cpu_relax();
    } else {
      std::this_thread::yield();
    }
  }
  fn_ = nullptr;
}

}  // namespace geist

#include "base/thread_pool.h"

#include <sched.h>

#include <map>
#include <mutex>

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

std::shared_ptr<ThreadPool> ThreadPool::shared(int n_threads) {
  if (n_threads < 1) n_threads = 1;
  static std::mutex mu;
  static std::map<int, std::weak_ptr<ThreadPool>> pools;
  const std::lock_guard<std::mutex> lock(mu);
  std::weak_ptr<ThreadPool> &w = pools[n_threads];
  std::shared_ptr<ThreadPool> p = w.lock();
  if (!p) {
    p = std::make_shared<ThreadPool>(n_threads);
    w = p;
  }
  return p;
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

int ThreadPool::claim(Slot &s) {
  uint64_t w = s.work.load(std::memory_order_acquire);
  for (;;) {
    const uint64_t idx = w & 0xFFFFFF, n = (w >> 24) & 0xFFFFFF;
    if (idx >= n) return -1;
    if (s.work.compare_exchange_weak(w, w + 1, std::memory_order_acq_rel, std::memory_order_acquire)) {
      return static_cast<int>(idx);
    }
  }
}

bool ThreadPool::work_once(int thread, int *start) {
  const uint32_t busy = busy_.load(std::memory_order_acquire);
  if (busy == 0) return false;
  bool ran = false;
  for (int k = 0; k < kSlots; ++k) {
    const int i = (*start + k) % kSlots;
    if (!(busy & (1u << i))) continue;
    Slot &s = slots_[i];
    const int task = claim(s);
    if (task < 0) continue;
    // The job cannot end while this task is claimed, so s.fn is still this job's.
    (*s.fn)(task, thread);
    s.done.fetch_add(1, std::memory_order_acq_rel);
    ran = true;
  }
  *start = (*start + 1) % kSlots;  // the next pass starts one job further on
  return ran;
}

void ThreadPool::worker_main(int thread) {
  int start = thread % kSlots;
  for (;;) {
    const uint32_t g = generation_.load(std::memory_order_acquire);
    if (stop_.load(std::memory_order_acquire)) return;
    if (work_once(thread, &start)) continue;
    // Nothing to claim: wait for a new job (every job bumps the generation after it is
    // published, so one published after the pass above ends the wait).
    uint32_t now = generation_.load(std::memory_order_acquire);
    for (int i = 0; now == g && i < kSpinPolls; ++i) {
      cpu_relax();
      now = generation_.load(std::memory_order_acquire);
    }
    if (now == g) generation_.wait(g, std::memory_order_acquire);
  }
}

void ThreadPool::run(int n_tasks, const TaskFn &fn) {
  if (n_tasks <= 0) return;
  if (n_threads_ == 1 || n_tasks == 1) {
    for (int t = 0; t < n_tasks; ++t) fn(t, 0);
    return;
  }
  GEIST_CHECK(n_tasks < (1 << 24), "ThreadPool::run: more than 2^24 tasks");
  // A free slot (more than kSlots callers at once: wait for one).
  int si = -1;
  for (int spins = 0; si < 0; ++spins) {
    uint32_t b = busy_.load(std::memory_order_relaxed);
    while (~b != 0) {
      const int i = __builtin_ctz(~b);
      if (busy_.compare_exchange_weak(b, b | (1u << i), std::memory_order_acq_rel, std::memory_order_relaxed)) {
        si = i;
        break;
      }
    }
    if (si < 0) {
      if (spins < 100) {
        cpu_relax();
      } else {
        std::this_thread::yield();
      }
    }
  }
  Slot &s = slots_[si];
  s.fn = &fn;
  s.done.store(0, std::memory_order_relaxed);
  s.gen = (s.gen + 1) & 0xFFFF;
  s.work.store((s.gen << 48) | (uint64_t(n_tasks) << 24), std::memory_order_release);
  generation_.fetch_add(1, std::memory_order_acq_rel);
  generation_.notify_all();
  // The caller works on its own job only: its thread-local scratch may be what the job's
  // tasks read.
  for (int task; (task = claim(s)) >= 0;) {
    fn(task, 0);
    s.done.fetch_add(1, std::memory_order_acq_rel);
  }
  // Tasks the workers claimed may still be running: spin briefly, then yield the core
  // (the worker may be waiting for it).
  for (int i = 0; s.done.load(std::memory_order_acquire) != n_tasks; ++i) {
    if (i < 2000) {
      cpu_relax();
    } else {
      std::this_thread::yield();
    }
  }
  s.fn = nullptr;
  busy_.fetch_and(~(1u << si), std::memory_order_release);
}

}  // namespace geist

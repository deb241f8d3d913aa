// A persistent pool of worker threads with a low-latency fork/join, shared by any number of
// callers.
//
// run(n_tasks, fn) calls fn(task, thread) once for every task in [0, n_tasks), spread over
// the calling thread plus the workers, and returns when all are done. Tasks are claimed
// from an atomic counter, so which thread runs a task varies; callers keep results
// independent of that (outputs indexed by `task`, scratch thread-local or the run's own),
// which is what makes kernels deterministic for any thread count. `thread` is in
// [0, n_threads) but concurrent runs may pass the same value (each caller is 0), so it
// must not index scratch shared between runs. fn must not throw and must not call run()
// on the same pool.
//
// Several threads may call run() at once (the sessions of a process share one pool,
// ThreadPool::shared): each run is a job in one of kSlots slots; its caller works on its
// own job only, and the workers take one task at a time from each job in turn, so every
// job progresses at least at its caller's pace and idle workers go where work is.
//
// run() returns as soon as every task is done, whether or not the workers ever woke up:
// a job's tasks are claimed from a word that packs (generation, n_tasks, next index), so a
// worker that wakes late finds nothing to claim and the caller never waits for a
// descheduled thread.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

namespace geist {

class ThreadPool {
 public:
  // n_threads counts the caller; n_threads <= 1 runs everything on the caller.
  explicit ThreadPool(int n_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool &) = delete;
  ThreadPool &operator=(const ThreadPool &) = delete;

  int n_threads() const { return n_threads_; }

  using TaskFn = std::function<void(int task, int thread)>;
  void run(int n_tasks, const TaskFn &fn);

  // Hardware threads available to this process (at least 1).
  static int hardware_threads();

  // The process's pool of n_threads threads (n_threads < 1: 1), made on first use and
  // shared by every caller asking for that many: N sessions start n_threads - 1 workers in
  // all instead of N times as many. Freed when the last holder lets go.
  static std::shared_ptr<ThreadPool> shared(int n_threads);

 private:
  static constexpr int kSlots = 32;  // jobs at once; a 33rd caller waits for a free slot
  struct alignas(64) Slot {
    // [63:48] generation (mod 2^16), [47:24] n_tasks, [23:0] next task index.
    std::atomic<uint64_t> work{0};
    const TaskFn *fn = nullptr;  // written before `work` is published, read after a claim
    std::atomic<int> done{0};    // tasks of the current job finished
    uint64_t gen = 0;            // the owner's generation counter
  };

  void worker_main(int thread);
  // One task of slot s, or -1 if it has none left.
  static int claim(Slot &s);
  // One pass over the busy slots taking at most one task from each; true if it ran any.
  bool work_once(int thread, int *start);

  int n_threads_;
  std::vector<std::thread> workers_;
  Slot slots_[kSlots];
  std::atomic<uint32_t> busy_{0};        // bit i: slot i holds a job (or is being set up)
  std::atomic<uint32_t> generation_{0};  // futex word the workers sleep on; +1 per job
  std::atomic<bool> stop_{false};
};

// Splits [0, n) into about 4 ranges per thread of the pool (at least `grain` items each) and
// runs fn(begin, end) on each; one range runs on the caller.
template <class Fn>
void parallel_ranges(int64_t n, int64_t grain, ThreadPool &pool, Fn fn) {
  const int64_t want = int64_t(pool.n_threads()) * 4;
  const int64_t per = std::max<int64_t>(grain, (n + want - 1) / want);
  const int tasks = static_cast<int>((n + per - 1) / per);
  if (tasks <= 1) {
    fn(int64_t(0), n);
    return;
  }
  pool.run(tasks, [&](int t, int) { fn(t * per, std::min(n, (t + 1) * per)); });
}

}  // namespace geist

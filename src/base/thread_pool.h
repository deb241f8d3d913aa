// A persistent pool of worker threads with a low-latency fork/join.
//
// run(n_tasks, fn) calls fn(task, thread) once for every task in [0, n_tasks), spread over
// the calling thread plus the workers, and returns when all are done. Tasks are claimed
// from an atomic counter, so which thread runs a task varies; callers keep results
// independent of that (scratch is indexed by `thread`, outputs by `task`), which is what
// makes kernels deterministic for any thread count.
// One run() at a time per pool (callers serialize); fn must not throw.
//
// run() returns as soon as every task is done, whether or not the workers ever woke up:
// tasks are claimed from a word that packs (generation, n_tasks, next index), so a worker
// that wakes late finds nothing to claim and the caller never waits for a descheduled
// thread (what matters when many sessions' pools share few cores).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
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

 private:
  void worker_main(int thread);
  void drain(int thread);

  int n_threads_;
  std::vector<std::thread> workers_;
  // Claims one task of generation `gen` from work_; -1 if none is left (or the
  // generation moved on).
  int claim(uint64_t gen);

  const TaskFn *fn_ = nullptr;
  // [63:48] generation (mod 2^16), [47:24] n_tasks, [23:0] next task index.
  std::atomic<uint64_t> work_{0};
  std::atomic<int> done_{0};             // tasks of the current generation finished
  std::atomic<uint32_t> generation_{0};  // futex word the workers sleep on
  std::atomic<bool> stop_{false};
};

}  // namespace geist

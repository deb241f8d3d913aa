// A persistent pool of worker threads with a low-latency fork/join.
//
// run(n_tasks, fn) calls fn(task, thread) once for every task in [0, n_tasks), spread over
// the calling thread plus the workers, and returns when all are done. Tasks are claimed
// from an atomic counter, so which thread runs a task varies; callers keep results
// independent of that (scratch is indexed by `thread`, outputs by `task`), which is what
// makes kernels deterministic for any thread count.
// One run() at a time per pool (callers serialize); fn must not throw.
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
  const TaskFn *fn_ = nullptr;
  int n_tasks_ = 0;
  std::atomic<int> next_task_{0};
  std::atomic<int> n_active_{0};     // workers still inside the current generation
  std::atomic<uint32_t> generation_{0};
  std::atomic<bool> stop_{false};
};

}  // namespace geist

// A device's compute threads: what kernels run their parallel loops on.
//
// parallel_for splits [begin, end) into at most num_threads() chunks of at
// least `grain` indices; the calling thread runs chunks too, so a call always
// makes progress even when every worker is busy with another caller's loop.
// A parallel_for issued from inside a worker runs serially (no nested
// parallelism, no deadlock). Workers and callers spin briefly before they
// block (see Note [Compute threads spin before they sleep] in
// compute_pool.cpp). In a process forked after the pool was made, the
// caller runs the whole loop (Note [A forked child cannot use the npu],
// fork_guard.cpp).
#pragma once

#include <npubridge/device_sim/fork_guard.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace npub::sim {

class ComputePool {
 public:
  using Body = void (*)(void* user, int64_t begin, int64_t end);
  static constexpr std::chrono::microseconds kDefaultSpin{2000};

  // num_threads counts the calling thread: a pool of n starts n - 1 workers.
  // `spin`: how long a thread polls for work (a worker) or for the other
  // threads' chunks (a caller) before it blocks.
  explicit ComputePool(int num_threads, std::chrono::nanoseconds spin = kDefaultSpin);
  ~ComputePool();
  ComputePool(const ComputePool&) = delete;
  ComputePool& operator=(const ComputePool&) = delete;

  void parallel_for(int64_t begin, int64_t end, int64_t grain, Body body, void* user);
  int num_threads() const { return num_threads_; }

 private:
  struct Job {
    Body body;
    void* user;
    int64_t begin;
    int64_t chunk;
    int64_t num_chunks;
    std::atomic<int64_t> next{0};
    std::atomic<int64_t> done{0};
    std::mutex mu;
    std::condition_variable cv;
  };
  static void run_chunks(Job& job);
  std::shared_ptr<Job> open_job();  // under mu_: a job with chunks left to claim
  void worker_loop();

  const ForkGuard fork_guard_;
  const int num_threads_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Job>> jobs_;
  bool stopping_ = false;
  int sleepers_ = 0;                 // workers blocked on cv_ (under mu_)
  std::atomic<uint64_t> posted_{0};  // bumped per posted job: what spinning workers poll
  const std::chrono::nanoseconds spin_;
  std::vector<std::thread> workers_;
};

}  // namespace npub::sim

#include <npubridge/device_sim/compute_pool.h>

#include <algorithm>
#include <chrono>
#include <thread>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace npub::sim {

namespace {
// Set on pool workers and while a thread runs chunks: nested loops go serial.
thread_local bool tls_in_parallel_region = false;

void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  _mm_pause();
#else
  std::this_thread::yield();
#endif
}

// Spins on `ready` for at most `budget`; true once it holds. The clock is read
// every 64 polls only (a pause is ~10-150 cycles, a clock read ~20 ns). After
// kPauseSpin of pauses the thread yields between polls: a thread that is
// ready to run on this core (the host's own thread pool, another process)
// runs, and an idle core still answers within a poll.
constexpr std::chrono::microseconds kPauseSpin{100};
template <typename Ready>
bool spin_until(Ready ready, std::chrono::nanoseconds budget) {
  const auto start = std::chrono::steady_clock::now();
  const auto deadline = start + budget,
             polite = start + std::min<std::chrono::nanoseconds>(budget, kPauseSpin);
  bool yield = false;
  for (;;) {
    for (int i = 0; i < 64; ++i) {
      if (ready()) return true;
      if (yield)
        std::this_thread::yield();
      else
        cpu_relax();
    }
    const auto now = std::chrono::steady_clock::now();
    if (now >= deadline) return ready();
    yield = now >= polite;
  }
}
}  // namespace

ComputePool::ComputePool(int num_threads, std::chrono::nanoseconds spin)
    : num_threads_(std::max(1, num_threads)), spin_(spin) {
  for (int i = 1; i < num_threads_; ++i) workers_.emplace_back([this] { worker_loop(); });
}

ComputePool::~ComputePool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
    posted_.fetch_add(1, std::memory_order_release);
  }
  cv_.notify_all();
  for (auto& t : workers_) t.join();
}

void ComputePool::run_chunks(Job& job) {
  const bool was = tls_in_parallel_region;
  tls_in_parallel_region = true;
  int64_t finished = 0;
  for (;;) {
    const int64_t c = job.next.fetch_add(1, std::memory_order_relaxed);
    if (c >= job.num_chunks) break;
    const int64_t b = job.begin + c * job.chunk;
    job.body(job.user, b, b + job.chunk);  // last chunk trimmed by the caller's end below
    ++finished;
  }
  tls_in_parallel_region = was;
  if (finished > 0 && job.done.fetch_add(finished, std::memory_order_acq_rel) + finished == job.num_chunks) {
    std::lock_guard<std::mutex> lock(job.mu);
    job.cv.notify_all();
  }
}

// Note [Compute threads spin before they sleep]
// Waking a thread blocked on a condition variable takes tens of microseconds
// on a virtual machine: for a 1M-element add (~300 us on two threads) that
// was a sixth of the op, and two threads ran 1.6x one where OpenMP reaches
// 1.9x. So, like OpenMP's runtime, a worker that just finished a loop keeps
// polling for the next one for `spin_` before it blocks, and a caller that
// finished its own chunks polls for the workers' for `spin_` before it
// blocks. The spin is bounded and only follows work: an idle device's
// workers sleep. A poster takes the futex path only when a worker sleeps.
// The spin is 2 ms by default (NPUB_SIM_SPIN_US): in a small model's step
// the host spends 0.1-1 ms of Python and autograd between two parallel
// loops, and with a 100 us spin each loop after such a gap paid a worker's
// wake-up: a [512,32] x [32,32] mm took 40-55 us instead of 11-15, and a
// hidden-32 Trainer step ran 1.5-1.6x the CPU's against 1.0-1.2x with 2 ms
// (OpenMP's runtimes spin longer still: KMP_BLOCKTIME is 200 ms). Past the
// first 100 us a spinning thread yields between polls, so that a thread
// ready to run on its core is not kept waiting by the spin.
void ComputePool::parallel_for(int64_t begin, int64_t end, int64_t grain, Body body, void* user) {
  // No worker survived the fork, and mu_ may be held for good (Note [A forked
  // child cannot use the npu]); this may run inside a kernel, behind the C
  // ABI, where nothing may throw: the caller runs the loop alone.
  if (fork_guard_.in_forked_child()) {
    body(user, begin, end);
    return;
  }
  if (end <= begin) return;
  const int64_t n = end - begin;
  grain = std::max<int64_t>(grain, 1);
  const int64_t max_chunks = std::min<int64_t>(num_threads_, (n + grain - 1) / grain);
  if (max_chunks <= 1 || tls_in_parallel_region) {
    body(user, begin, end);
    return;
  }
  // Equal chunks; the body sees [b, min(b + chunk, end)).
  struct Trim {
    Body body;
    void* user;
    int64_t end;
  } trim{body, user, end};
  auto job = std::make_shared<Job>();
  job->body = [](void* u, int64_t b, int64_t e) {
    auto* t = static_cast<Trim*>(u);
    t->body(t->user, b, std::min(e, t->end));
  };
  job->user = &trim;
  job->begin = begin;
  job->chunk = (n + max_chunks - 1) / max_chunks;
  job->num_chunks = (n + job->chunk - 1) / job->chunk;
  bool wake;
  {
    std::lock_guard<std::mutex> lock(mu_);
    jobs_.push_back(job);
    posted_.fetch_add(1, std::memory_order_release);
    wake = sleepers_ > 0;
  }
  if (wake) cv_.notify_all();
  run_chunks(*job);
  auto finished = [&] { return job->done.load(std::memory_order_acquire) == job->num_chunks; };
  if (!spin_until(finished, spin_)) {
    std::unique_lock<std::mutex> lock(job->mu);
    job->cv.wait(lock, finished);
  }
  std::lock_guard<std::mutex> lock(mu_);
  auto it = std::find(jobs_.begin(), jobs_.end(), job);
  if (it != jobs_.end()) jobs_.erase(it);
}

std::shared_ptr<ComputePool::Job> ComputePool::open_job() {
  for (auto& j : jobs_)
    if (j->next.load(std::memory_order_relaxed) < j->num_chunks) return j;
  return nullptr;
}

void ComputePool::worker_loop() {
  tls_in_parallel_region = true;
  uint64_t seen = posted_.load(std::memory_order_acquire);
  for (;;) {
    // See Note [Compute threads spin before they sleep].
    const bool posted = spin_until([&] { return posted_.load(std::memory_order_acquire) != seen; }, spin_);
    std::unique_lock<std::mutex> lock(mu_);
    if (!posted) {
      ++sleepers_;
      cv_.wait(lock, [&] { return stopping_ || open_job() != nullptr; });
      --sleepers_;
    }
    if (stopping_) return;
    seen = posted_.load(std::memory_order_relaxed);
    std::shared_ptr<Job> job = open_job();
    lock.unlock();
    if (job) run_chunks(*job);
  }
}

}  // namespace npub::sim

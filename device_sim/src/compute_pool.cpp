#include <npubridge/device_sim/compute_pool.h>

#include <algorithm>

namespace npub::sim {

namespace {
// Set on pool workers and while a thread runs chunks: nested loops go serial.
thread_local bool tls_in_parallel_region = false;
}  // namespace

ComputePool::ComputePool(int num_threads) : num_threads_(std::max(1, num_threads)) {
  for (int i = 1; i < num_threads_; ++i) workers_.emplace_back([this] { worker_loop(); });
}

ComputePool::~ComputePool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
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
  if (finished > 0 &&
      job.done.fetch_add(finished, std::memory_order_acq_rel) + finished == job.num_chunks) {
    std::lock_guard<std::mutex> lock(job.mu);
    job.cv.notify_all();
  }
}

void ComputePool::parallel_for(int64_t begin, int64_t end, int64_t grain, Body body,
                               void* user) {
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
  {
    std::lock_guard<std::mutex> lock(mu_);
    jobs_.push_back(job);
  }
  cv_.notify_all();
  run_chunks(*job);
  {
    std::unique_lock<std::mutex> lock(job->mu);
    job->cv.wait(lock, [&] { return job->done.load(std::memory_order_acquire) == job->num_chunks; });
  }
  std::lock_guard<std::mutex> lock(mu_);
  auto it = std::find(jobs_.begin(), jobs_.end(), job);
  if (it != jobs_.end()) jobs_.erase(it);
}

void ComputePool::worker_loop() {
  tls_in_parallel_region = true;
  for (;;) {
    std::shared_ptr<Job> job;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] {
        if (stopping_) return true;
        for (auto& j : jobs_)
          if (j->next.load(std::memory_order_relaxed) < j->num_chunks) return true;
        return false;
      });
      if (stopping_) return;
      for (auto& j : jobs_) {
        if (j->next.load(std::memory_order_relaxed) < j->num_chunks) {
          job = j;
          break;
        }
      }
    }
    if (job) run_chunks(*job);
  }
}

}  // namespace npub::sim

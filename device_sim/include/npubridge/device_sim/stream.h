// Streams and events of the simulated NPU.
//
// A Stream runs its work in order on a worker thread of its own (started at
// the first enqueue), asynchronously to the host. NPUB_LAUNCH_BLOCKING=1
// makes every enqueue run inline instead, which turns asynchronous bugs into
// synchronous ones while debugging.
//
// An error thrown by queued work is kept and rethrown by the next
// synchronize() of that stream, as CUDA reports asynchronous errors.
//
// In a process forked after a stream or event was made, queueing, waiting
// and recording on it throw instead of waiting on a worker thread the fork
// left behind (Note [A forked child cannot use the npu], fork_guard.cpp).
#pragma once

#include <npubridge/device_sim/fork_guard.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

namespace npub::sim {

class Event;

class Stream {
 public:
  using Task = std::function<void()>;

  Stream(int device_index, int stream_id, bool launch_blocking);
  ~Stream();  // finishes queued work, then joins the worker
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;

  // Queues a task; it runs after everything queued before it.
  void enqueue(Task task);
  // Queues a marker (Event::record): an instant task that runs when the
  // stream reaches it, under the stream's lock, after the stream counts it
  // done. See Note [An event completes with its stream's progress].
  void enqueue_marker(Task marker);
  // Blocks until all queued work has run; rethrows the first error of that
  // work (once).
  void synchronize();
  // True when no queued work is pending.
  bool query() const { return pending_.load(std::memory_order_acquire) == 0; }
  // Makes later work on this stream wait until `event` completes (as
  // recorded now). Does not block the host.
  void wait_event(const Event& event);

  int device_index() const { return device_index_; }
  int id() const { return stream_id_; }
  bool launch_blocking() const { return launch_blocking_; }

 private:
  void run_worker();
  void run_task(Task& task) noexcept;
  std::string name() const;  // "npu:0 stream 1", for errors

  const ForkGuard fork_guard_;
  const int device_index_;
  const int stream_id_;
  const bool launch_blocking_;
  std::atomic<int64_t> pending_{0};
  mutable std::mutex mu_;
  std::condition_variable work_cv_;
  std::condition_variable idle_cv_;
  struct Item {
    Task task;
    bool marker = false;
  };
  std::deque<Item> queue_;
  void push(Item item);  // queues for the worker, starting it on first use
  std::exception_ptr error_;
  bool stopping_ = false;
  std::thread worker_;
};

// A marker in a stream. Copyable handle to shared state.
class Event {
 public:
  Event();
  // Completes when `stream` reaches this point.
  void record(Stream& stream);
  // True when the last record has completed (or it was never recorded).
  bool query() const;
  // Blocks the host until the last record has completed.
  void synchronize() const;
  // Milliseconds between this event's completion and `end`'s. Both must be
  // recorded and complete; throws npub::Error otherwise.
  double elapsed_ms(const Event& end) const;

 private:
  friend class Stream;
  struct State {
    ForkGuard fork_guard;
    std::mutex mu;
    std::condition_variable cv;
    uint64_t recorded = 0;   // generation of the last record()
    uint64_t completed = 0;  // generation that has completed
    // The capture the last record() was made in (Note [A stream that waits
    // on a capture joins it], graph_capture.h), 0 for none.
    uint64_t capture = 0;
    std::chrono::steady_clock::time_point when{};
  };
  static void complete(State& s, uint64_t generation);
  std::shared_ptr<State> state_;
};

}  // namespace npub::sim

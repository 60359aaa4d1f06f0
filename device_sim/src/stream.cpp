#include <npubridge/device_sim/graph_capture.h>
#include <npubridge/device_sim/stream.h>
#include <npubridge/support/error.h>

#include <utility>

namespace npub::sim {

Stream::Stream(int device_index, int stream_id, bool launch_blocking)
    : device_index_(device_index), stream_id_(stream_id), launch_blocking_(launch_blocking) {}

Stream::~Stream() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  work_cv_.notify_all();
  if (worker_.joinable()) worker_.join();
}

void Stream::run_task(Task& task) noexcept {
  try {
    task();
  } catch (...) {
    std::lock_guard<std::mutex> lock(mu_);
    if (!error_) error_ = std::current_exception();
  }
}

void Stream::enqueue(Task task) {
  if (launch_blocking_) {
    synchronize();
    run_task(task);
    synchronize();  // surface the error now, at its call site
    return;
  }
  push(Item{std::move(task), false});
}

void Stream::enqueue_marker(Task marker) {
  if (launch_blocking_) {
    synchronize();
    marker();
    return;
  }
  push(Item{std::move(marker), true});
}

std::string Stream::name() const {
  return "npu:" + std::to_string(device_index_) + " stream " + std::to_string(stream_id_);
}

void Stream::push(Item item) {
  fork_guard_.check([&] { return name(); });
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!worker_.joinable()) worker_ = std::thread([this] { run_worker(); });
    pending_.fetch_add(1, std::memory_order_acq_rel);
    queue_.push_back(std::move(item));
  }
  work_cv_.notify_one();
}

// Note [An event completes with its stream's progress]
// Once an event recorded last on a stream completes, the stream must read
// as idle (query() true), and once synchronize() returns, every event
// recorded on the stream must read as complete, as on CUDA. A marker is
// therefore counted done first and then completed, both under the stream's
// lock: a thread woken by the event sees pending_ already lowered, and a
// thread in synchronize() wakes only after the lock is released, with the
// event complete. (Run as an ordinary task, the event completed a moment
// before the stream counted it done, and `end.synchronize();
// stream.query()` could read false.)
void Stream::run_worker() {
  for (;;) {
    Item item;
    {
      std::unique_lock<std::mutex> lock(mu_);
      work_cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping and drained
      item = std::move(queue_.front());
      queue_.pop_front();
    }
    if (item.marker) {
      std::lock_guard<std::mutex> lock(mu_);
      const bool idle = pending_.fetch_sub(1, std::memory_order_acq_rel) == 1;
      try {
        item.task();  // takes the event's lock, never the stream's
      } catch (...) {
        if (!error_) error_ = std::current_exception();
      }
      if (idle) idle_cv_.notify_all();
      continue;
    }
    run_task(item.task);
    std::lock_guard<std::mutex> lock(mu_);
    if (pending_.fetch_sub(1, std::memory_order_acq_rel) == 1) idle_cv_.notify_all();
  }
}

void Stream::synchronize() {
  fork_guard_.check([&] { return name(); });
  if (capture_checks_needed())
    check_capture_allows(device_index_, "synchronize of " + name(),
                         "the host would wait for work the capture records instead of running", true);
  std::unique_lock<std::mutex> lock(mu_);
  idle_cv_.wait(lock, [&] { return pending_.load(std::memory_order_acquire) == 0; });
  if (error_) {
    std::exception_ptr e = std::exchange(error_, nullptr);
    lock.unlock();
    std::rethrow_exception(e);
  }
}

void Stream::wait_event(const Event& event) {
  fork_guard_.check([&] { return name(); });
  std::shared_ptr<Event::State> state = event.state_;
  uint64_t generation;
  uint64_t capture;
  {
    std::lock_guard<std::mutex> lock(state->mu);
    generation = state->recorded;
    capture = state->capture;
  }
  // Note [A stream that waits on a capture joins it] (graph_capture.h).
  if (capture != 0) join_capture(capture, *this);
  {
    std::lock_guard<std::mutex> lock(state->mu);
    if (state->completed >= generation) return;  // nothing to wait for
  }
  enqueue([state, generation] {
    std::unique_lock<std::mutex> lock(state->mu);
    state->cv.wait(lock, [&] { return state->completed >= generation; });
  });
}

Event::Event() : state_(std::make_shared<State>()) {}

void Event::complete(State& s, uint64_t generation) {
  {
    std::lock_guard<std::mutex> lock(s.mu);
    if (generation > s.completed) {
      s.completed = generation;
      s.when = std::chrono::steady_clock::now();
    }
  }
  s.cv.notify_all();
}

void Event::record(Stream& stream) {
  state_->fork_guard.check([] { return std::string("an npu event"); });
  const uint64_t capture = recording_capture(stream);
  uint64_t generation;
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    generation = ++state_->recorded;
    state_->capture = capture;
  }
  std::shared_ptr<State> state = state_;
  stream.enqueue_marker([state, generation] { complete(*state, generation); });
}

bool Event::query() const {
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->completed >= state_->recorded;
}

void Event::synchronize() const {
  state_->fork_guard.check([] { return std::string("an npu event"); });
  if (capturing_graph_any() != nullptr) {
    Graph& g = *capturing_graph_any();
    if (g.mode() != CaptureMode::kRelaxed)
      g.forbid("event synchronize", "the host would wait for work the capture records instead of running");
  }
  std::unique_lock<std::mutex> lock(state_->mu);
  state_->cv.wait(lock, [&] { return state_->completed >= state_->recorded; });
}

double Event::elapsed_ms(const Event& end) const {
  auto read = [](const State& s, const char* which) {
    std::lock_guard<std::mutex> lock(const_cast<std::mutex&>(s.mu));
    if (s.recorded == 0)
      throw Error(ErrorCode::kInvalidArgument,
                  std::string("Event::elapsed_ms: the ") + which + " event was never recorded");
    if (s.completed < s.recorded)
      throw Error(ErrorCode::kInvalidArgument, std::string("Event::elapsed_ms: the ") + which +
                                                   " event has not completed yet; synchronize it first");
    return s.when;
  };
  auto t0 = read(*state_, "start");
  auto t1 = read(*end.state_, "end");
  return std::chrono::duration<double, std::milli>(t1 - t0).count();
}

}  // namespace npub::sim

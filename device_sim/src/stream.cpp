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
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!worker_.joinable()) worker_ = std::thread([this] { run_worker(); });
    pending_.fetch_add(1, std::memory_order_acq_rel);
    queue_.push_back(std::move(task));
  }
  work_cv_.notify_one();
}

void Stream::run_worker() {
  for (;;) {
    Task task;
    {
      std::unique_lock<std::mutex> lock(mu_);
      work_cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping and drained
      task = std::move(queue_.front());
      queue_.pop_front();
    }
    run_task(task);
    std::lock_guard<std::mutex> lock(mu_);
    if (pending_.fetch_sub(1, std::memory_order_acq_rel) == 1) idle_cv_.notify_all();
  }
}

void Stream::synchronize() {
  std::unique_lock<std::mutex> lock(mu_);
  idle_cv_.wait(lock, [&] { return pending_.load(std::memory_order_acquire) == 0; });
  if (error_) {
    std::exception_ptr e = std::exchange(error_, nullptr);
    lock.unlock();
    std::rethrow_exception(e);
  }
}

void Stream::wait_event(const Event& event) {
  std::shared_ptr<Event::State> state = event.state_;
  uint64_t generation;
  {
    std::lock_guard<std::mutex> lock(state->mu);
    generation = state->recorded;
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
  uint64_t generation;
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    generation = ++state_->recorded;
  }
  std::shared_ptr<State> state = state_;
  stream.enqueue([state, generation] { complete(*state, generation); });
}

bool Event::query() const {
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->completed >= state_->recorded;
}

void Event::synchronize() const {
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
      throw Error(ErrorCode::kInvalidArgument,
                  std::string("Event::elapsed_ms: the ") + which +
                      " event has not completed yet; synchronize it first");
    return s.when;
  };
  auto t0 = read(*state_, "start");
  auto t1 = read(*end.state_, "end");
  return std::chrono::duration<double, std::milli>(t1 - t0).count();
}

}  // namespace npub::sim

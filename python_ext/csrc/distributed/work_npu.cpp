// The Work of one npu collective: completion, errors, stream order and the
// future (work_npu.h).
#include "distributed/work_npu.h"

#include <ATen/core/jit_type.h>
#include <c10/util/Exception.h>

#include "runtime/npu_runtime.h"

#include <utility>

namespace npub::dist {

namespace {

// Note [The future of an npu collective carries its device]
// The future is made with the collective's npu device, as ProcessGroupNCCL
// makes its futures with the CUDA device: markCompleted() records an event
// on the completing thread's current stream of that device (the completer
// sets it to the collective stream) and wait()/value() users and then()
// callbacks are ordered after it through the PrivateUse1 guard
// (runtime/guard.cpp), which implements record/block and a stream pool.
// DDP's communication hooks chain `fut.then(...)` and read the value from
// the caller's stream; without the device, the callbacks would run
// unordered against the device work that produced the data. A barrier has
// no tensors and gets a future without devices.
std::vector<c10::Device> devices_of(int device) {
  if (device < 0) return {};
  return {c10::Device(c10::DeviceType::PrivateUse1, static_cast<c10::DeviceIndex>(device))};
}

}  // namespace

WorkNPU::WorkNPU(int rank, c10d::OpType type, std::string what, uint64_t seq, int device,
                 std::vector<at::Tensor> outputs)
    : c10d::Work(rank, type),
      what_(std::move(what)),
      seq_(seq),
      device_(device),
      outputs_(std::move(outputs)),
      future_(c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()),
                                                       devices_of(device))) {
  // Registered before any user's then(), so it runs first when the future
  // completes: the engine starts the next future only after this one
  // completed (Note [Future callbacks never run on the completer]).
  future_->addCallback([this](c10::ivalue::Future&) {
    if (settle_started_) settle_started_();
  });
}

bool WorkNPU::isCompleted() {
  std::lock_guard<std::mutex> lock(mutex_);
  return completed_;
}

bool WorkNPU::isSuccess() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return completed_ && !exception_;
}

std::exception_ptr WorkNPU::exception() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return exception_;
}

int WorkNPU::sourceRank() const {
  std::lock_guard<std::mutex> lock(mutex_);
  TORCH_CHECK(source_rank_ >= 0, "npu backend: ", what_,
              ": sourceRank() is only known for recv from any source");
  return source_rank_;
}

std::vector<at::Tensor> WorkNPU::result() { return outputs_; }

void WorkNPU::synchronize() {
  if (device_ < 0) return;
  sim::Stream& current = torch_backend::rt().devices().at(device_).current_stream();
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!completed_) {
      // done_ is recorded only at completion (the collective is driven by
      // the host), so a wait on it now would order nothing. Without
      // blocking the host, hold the caller's stream until the Work
      // completed: the completer completes it once the data is on the
      // device (or failed; wait() reports the error).
      current.enqueue([self = c10::intrusive_ptr<WorkNPU>::reclaim_copy(this)] {
        std::unique_lock<std::mutex> l(self->mutex_);
        self->cv_.wait(l, [&] { return self->completed_; });
      });
      return;
    }
  }
  current.wait_event(done_);
}

bool WorkNPU::wait(std::chrono::milliseconds timeout) {
  {
    std::unique_lock<std::mutex> lock(mutex_);
    if (timeout == kNoTimeout) {
      cv_.wait(lock, [&] { return completed_; });
    } else if (!cv_.wait_for(lock, timeout, [&] { return completed_; })) {
      C10_THROW_ERROR(DistBackendError, c10::str("npu backend: ", what_, " did not complete within ",
                                                 timeout.count(), " ms (Work.wait(timeout))"));
    }
    if (exception_) std::rethrow_exception(exception_);
  }
  if (std::exception_ptr e = first_member_error()) std::rethrow_exception(e);
  synchronize();
  return true;
}

c10::intrusive_ptr<c10::ivalue::Future> WorkNPU::getFuture() { return future_; }

std::exception_ptr WorkNPU::first_member_error() const {
  for (const auto& member : members_)
    if (std::exception_ptr e = member->exception()) return e;
  return nullptr;
}

void WorkNPU::complete(sim::Stream* stream, int source_rank) {
  if (stream != nullptr) done_.record(*stream);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    source_rank_ = source_rank;
    completed_ = true;
  }
  cv_.notify_all();
}

void WorkNPU::fail(std::exception_ptr error) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    exception_ = std::move(error);
    completed_ = true;
  }
  cv_.notify_all();
}

void WorkNPU::settle_future() {
  std::exception_ptr error;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    TORCH_INTERNAL_ASSERT(completed_, "npu backend: ", what_,
                          ": its future settled before the Work completed");
    error = exception_;
  }
  struct Started {  // also when markCompleted throws before any callback ran
    std::function<void()>& fn;
    ~Started() {
      if (fn) fn();
    }
  } started{settle_started_};
  if (future_->completed()) return;
  if (error) {
    future_->setError(error);
    return;
  }
  try {
    future_->markCompleted(c10::IValue(outputs_));
  } catch (...) {
    if (!future_->completed()) future_->setError(std::current_exception());
  }
}

}  // namespace npub::dist

// The Work of one collective of the npu backend (process_group_npu.h): what
// `dist.all_reduce(t, async_op=True)` returns. The completer thread of the
// group (collective_engine.h) finishes it once the result is back in device
// memory; until then it keeps the collective's tensors alive.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <npubridge/device_sim/stream.h>

#include <chrono>
#include <cstdint>
#include <exception>
#include <functional>
#include <string>
#include <vector>

namespace npub::dist {

class WorkNPU final : public c10d::Work {
 public:
  // `device` is the npu index the collective's tensors live on (-1 for a
  // barrier, which has none); `outputs` is what result() and the future
  // hold.
  WorkNPU(int rank, c10d::OpType type, std::string what, uint64_t seq, int device,
          std::vector<at::Tensor> outputs);

  bool isCompleted() override;
  bool isSuccess() const override;
  std::exception_ptr exception() const override;
  int sourceRank() const override;
  std::vector<at::Tensor> result() override;
  // Makes the caller's current stream wait for the collective's device work
  // (the "done" event, or, before completion, a stream task that waits for
  // it); does not block the host.
  void synchronize() override;
  // Blocks the host until the collective completed (or `timeout`, when not
  // kNoTimeout, passed: a DistBackendError naming the collective), rethrows
  // its error, then orders the caller's current stream after it.
  bool wait(std::chrono::milliseconds timeout) override;
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override;
  uint64_t getSequencenumber() const override { return seq_; }

  // The completer's side. complete() records the done event on `stream` (the
  // collective stream, already synchronised: the data is on the device) and
  // completes the Work (what wait() and isCompleted() look at); fail() sets
  // its error. Neither touches the future, whose callbacks may wait for
  // later collectives of the group: settle_future() completes it (or sets
  // the Work's error on it) afterwards, on a callback thread of the engine
  // (Note [Future callbacks never run on the completer]).
  void complete(sim::Stream* stream, int source_rank = -1);
  void fail(std::exception_ptr error);
  void settle_future();
  // Called (once or more) when settle_future() has completed the future,
  // before the user's callbacks run; set before settle_future().
  void set_settle_started(std::function<void()> fn) { settle_started_ = std::move(fn); }

  const std::string& what() const { return what_; }
  // endCoalescing's Work: wait() also rethrows the first error of these.
  void set_members(std::vector<c10::intrusive_ptr<WorkNPU>> members) { members_ = std::move(members); }
  // The first member's error (members complete before their coalesced Work:
  // issue order), or null.
  std::exception_ptr first_member_error() const;

 private:
  const std::string what_;  // "allreduce #7" for messages
  const uint64_t seq_;
  const int device_;
  std::vector<at::Tensor> outputs_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
  sim::Event done_;
  int source_rank_ = -1;
  std::vector<c10::intrusive_ptr<WorkNPU>> members_;
  std::function<void()> settle_started_;
};

}  // namespace npub::dist

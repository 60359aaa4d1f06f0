// The per-group engine of the npu backend: a FIFO of issued collectives run
// by a launcher and a completer thread on a collective stream of the device,
// with gloo underneath (the design: docs/architecture.md, "Distributed
// backend").
//
//   caller    checks arguments, records an event on its current stream,
//             pushes a Job, returns the Work (never blocks on the transport)
//   launcher  collective stream waits the caller's event; signature check;
//             per step: device->host copies into pinned staging, wait for
//             them, start the gloo collective; hand the step to the completer
//   completer per step, in order: wait for gloo (it honours the group's
//             timeout), host->device copies; after the last step, synchronise
//             the stream, record the done event, complete the Work
//   callback  complete the Work's future (its then() callbacks run there),
//             in order (Note [Future callbacks never run on the completer])
//
// A large allreduce or broadcast is split into steps (chunks), so that the
// staging copies of chunk k+1 run while gloo carries chunk k (Note
// [Pipelined chunks], process_group_npu.cpp).
//
// Issue order is kept on every rank, which is what gloo needs to match the
// ranks' collectives. The first failure breaks the group: later collectives
// fail at once with a message that names it (a mismatch found by the
// signature check does not: every rank found it before any data moved).
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>

#include <npubridge/device_sim/fork_guard.h>
#include <npubridge/device_sim/stream.h>

#include "distributed/fingerprint.h"
#include "distributed/staging.h"
#include "distributed/work_npu.h"

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace npub::dist {

using GlooWorks = std::vector<c10::intrusive_ptr<c10d::Work>>;

// The bytes a tensor's elements occupy: views of one buffer that do not
// overlap (DDP's bucket views, FSDP's shards of a flat parameter) do not
// order their collectives against each other.
struct MemSpan {
  uintptr_t begin = 0, end = 0;  // [begin, end); empty for an empty tensor
  bool overlaps(const MemSpan& o) const { return begin < o.end && o.begin < end; }
  bool operator==(const MemSpan& o) const { return begin == o.begin && end == o.end; }
};

inline MemSpan memory_span(const at::Tensor& t) {
  if (t.numel() == 0) return {};
  int64_t low = 0, high = 0;  // element offsets from data_ptr
  for (int64_t d = 0; d < t.dim(); ++d) {
    const int64_t extent = (t.size(d) - 1) * t.stride(d);
    (extent < 0 ? low : high) += extent;
  }
  const auto base = reinterpret_cast<uintptr_t>(t.data_ptr());
  const auto elem = static_cast<int64_t>(t.element_size());
  return {static_cast<uintptr_t>(static_cast<int64_t>(base) + low * elem),
          static_cast<uintptr_t>(static_cast<int64_t>(base) + (high + 1) * elem)};
}

// One pipelined piece of a collective.
struct Step {
  std::function<void(sim::Stream&)> to_host;    // launcher: queue D2H copies (may be empty)
  std::function<GlooWorks()> launch;            // launcher: start gloo on the staging
  std::function<void(sim::Stream&)> to_device;  // completer: queue H2D copies (may be empty)
};

struct Job {
  c10::intrusive_ptr<WorkNPU> work;
  std::string what;                    // "allreduce #7" for messages
  std::string peers;                   // "rank 1", "ranks 1, 2", for messages
  std::optional<Signature> signature;  // none for send/recv
  int device = -1;                     // npu index, -1: no tensors
  sim::Event ready;                    // recorded on the caller's stream at issue
  std::vector<Step> steps;
  std::vector<at::Tensor> keep_alive;
  std::vector<StagingLease> staging;
  // Memory the job reads and writes, for the order between in-flight
  // collectives (Note [A collective reads after the previous ones wrote]).
  std::vector<MemSpan> reads, writes;
  // recv from any source: the sender's rank, from the last step's gloo work.
  std::function<int(const GlooWorks&)> source_rank;
  // Held from taking the sequence number to the push into the FIFO
  // (ProcessGroupNPU::new_job/submit): numbers follow the FIFO's order.
  std::unique_lock<std::mutex> issue_lock;
  // Set by the engine.
  bool writes_registered = false;
  bool failed = false;
};

class CollectiveEngine {
 public:
  CollectiveEngine(c10::intrusive_ptr<c10d::Backend> gloo, int rank, int size,
                   std::chrono::milliseconds timeout);
  // Lets queued jobs finish, then joins the threads. Never run in a forked
  // child (~ProcessGroupNPU leaks the engine there).
  ~CollectiveEngine();

  // Throws DistBackendError at once when the group is broken.
  void submit(std::unique_ptr<Job> job);
  // The collective stream of npu `device` (made at first use, fixed for the
  // group).
  sim::Stream& stream(int device);
  std::shared_ptr<StagingPool> staging() { return staging_; }
  c10d::Backend& gloo() { return *gloo_; }
  void set_timeout(std::chrono::milliseconds timeout);
  std::chrono::milliseconds timeout() const;
  // "" while the group works.
  std::string broken_reason() const;
  // In a process forked after the group was made: the forked-child error
  // naming `what` ("allreduce #3"); the group's threads are the parent's.
  void check_not_forked(const std::string& what) const {
    fork_guard_.check([&] { return "npu backend: " + what; });
  }
  bool in_forked_child() const noexcept { return fork_guard_.in_forked_child(); }

 private:
  struct Launched {
    std::shared_ptr<Job> job;
    size_t step = 0;
    GlooWorks works;
    std::exception_ptr error;  // a launch failure, delivered in order
  };
  void run_launcher();
  void run_completer();
  void launch(const std::shared_ptr<Job>& job);
  void finish(const std::shared_ptr<Job>& job, std::exception_ptr error);
  std::exception_ptr transport_error(const Job& job, const char* stage, std::exception_ptr cause);
  void wait_for_writers(const Job& job);
  // Hands a completed (or failed) Work's future to the callback threads.
  void settle_later(const c10::intrusive_ptr<WorkNPU>& work, int device, sim::Stream* stream);
  void run_callbacks();

  const c10::intrusive_ptr<c10d::Backend> gloo_;
  const sim::ForkGuard fork_guard_;
  const int rank_, size_;
  const bool check_;
  std::shared_ptr<StagingPool> staging_ = std::make_shared<StagingPool>();

  mutable std::mutex mu_;
  std::condition_variable launch_cv_, complete_cv_, writers_cv_;
  std::chrono::milliseconds timeout_;
  std::deque<std::shared_ptr<Job>> pending_;  // issued, not launched
  std::deque<Launched> launched_;             // launched steps, FIFO
  std::vector<MemSpan> in_flight_writes_;
  std::map<int, sim::Stream*> streams_;
  std::string broken_;
  bool stopping_ = false;
  bool launcher_done_ = false;
  std::thread launcher_, completer_;

  // Futures to complete, in the completer's order (cb_mu_).
  struct Settle {
    c10::intrusive_ptr<WorkNPU> work;
    int device = -1;
    sim::Stream* stream = nullptr;
    uint64_t ticket = 0;
  };
  std::mutex cb_mu_;
  std::condition_variable cb_cv_;
  std::deque<Settle> settles_;
  uint64_t next_ticket_ = 0;  // tickets handed out
  uint64_t started_ = 0;      // futures [0, started_) completed
  size_t idle_callback_threads_ = 0;
  bool callbacks_stopping_ = false;
  std::vector<std::thread> callback_threads_;
};

}  // namespace npub::dist

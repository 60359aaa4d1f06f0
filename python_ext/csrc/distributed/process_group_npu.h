// The torch.distributed backend "npu" (the role of torch_npu's
// ProcessGroupHCCL): a c10d::Backend for npu tensors that stages them
// through pinned host memory and runs each collective with a real
// ProcessGroupGloo underneath, on the same store (prefixed), so that the
// transport is gloo's TCP and the same code runs across hosts.
//
// Each collective method checks its arguments on the caller's thread (named
// errors: collective, argument, expected, found), builds a Job of pipelined
// steps (staging copies + gloo calls) and hands it to the group's engine
// (collective_engine.h); it returns at once with the Work.
#pragma once

#include <torch/csrc/distributed/c10d/Backend.hpp>

#include "distributed/collective_engine.h"

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace npub::dist {

// A reduce op as gloo runs it. Gloo has no ReduceOp.PREMUL_SUM (NCCL's
// "multiply each rank's input by a factor, then sum", which FSDP2 uses for a
// gradient divide factor): it becomes SUM of the staged inputs, each
// multiplied by the factor first (Note [PREMUL_SUM over gloo]).
struct GlooReduce {
  c10d::ReduceOp op;  // what gloo is asked for
  at::Tensor factor;  // PREMUL_SUM: a 0-d CPU tensor of the collective's dtype; else undefined
  // On the launcher thread, after the device -> host copy of `staged`.
  void premultiply(const at::Tensor& staged) const {
    if (factor.defined()) staged.mul_(factor);
  }
};
// On the caller's thread, after check_reduce_op.
GlooReduce gloo_reduce(const char* op, const c10d::ReduceOp& reduce_op, at::ScalarType dtype);

class ProcessGroupNPU final : public c10d::Backend {
 public:
  // `gloo` is a ProcessGroupGloo of the same ranks (held as a plain
  // Backend); `timeout` bounds every wait on a peer.
  ProcessGroupNPU(c10::intrusive_ptr<c10d::Backend> gloo, int rank, int size,
                  std::chrono::milliseconds timeout);
  ~ProcessGroupNPU() override;

  const std::string getBackendName() const override { return "npu"; }
  void setTimeout(std::chrono::milliseconds timeout) override;
  c10::intrusive_ptr<c10d::Backend> gloo() const { return gloo_; }
  // The message of the failure that broke the group; "" while it works.
  std::string broken_reason() const { return engine_->broken_reason(); }

  // Collectives are numbered from 0 on every rank as they are issued (the
  // number in messages and in the signature check).
  void setSequenceNumberForGroup() override {}
  uint64_t getSequenceNumberForGroup() override { return seq_.load(); }
  c10d::ErrorType getError() override {
    return broken_reason().empty() ? c10d::ErrorType::SUCCESS : c10d::ErrorType::COMM_ERROR;
  }

  // Collectives issued between start and end complete with the Work that
  // endCoalescing returns (batch_isend_irecv, _coalescing_manager).
  bool supportsCoalescing() const override { return true; }
  void startCoalescing() override;
  c10::intrusive_ptr<c10d::Work> endCoalescing() override;

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                     const c10d::AllreduceCoalescedOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors,
                                        const c10d::ReduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputs,
                                                     std::vector<at::Tensor>& inputs,
                                                     const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather_into_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                 std::vector<at::Tensor>& inputs,
                                                                 const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs,
                                        std::vector<at::Tensor>& inputs,
                                        const c10d::GatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outputs,
                                         std::vector<std::vector<at::Tensor>>& inputs,
                                         const c10d::ScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& outputs,
                                                std::vector<std::vector<at::Tensor>>& inputs,
                                                const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                      const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter_tensor_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input,
                                               std::vector<int64_t>& output_split_sizes,
                                               std::vector<int64_t>& input_split_sizes,
                                               const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
                                          const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dst_rank, int tag) override;
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int src_rank, int tag) override;
  c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor>& tensors, int tag) override;

 private:
  std::unique_ptr<Job> new_job(c10d::OpType type, const char* op, int device, std::vector<at::Tensor> outputs,
                               int peer = -1);
  c10::intrusive_ptr<c10d::Work> submit(std::unique_ptr<Job> job);
  at::Tensor stage(Job& job, at::ScalarType dtype, int64_t numel);
  void add_allreduce(Job& job, const at::Tensor& t, const GlooReduce& op);
  // `outputs` / `inputs`: the consecutive pieces of the gathered whole (one
  // tensor of size x numel, or one per rank).
  void add_allgather(Job& job, const at::Tensor& input, const std::vector<at::Tensor>& outputs);
  void add_reduce_scatter(Job& job, const at::Tensor& output, const std::vector<at::Tensor>& inputs,
                          const GlooReduce& op);
  Signature signature(const char* op, at::ScalarType dtype, std::vector<std::vector<int64_t>> shapes,
                      int64_t root = -1, int reduce_op = -1) const;
  int64_t chunk_elements(const at::Tensor& t) const;
  // recv and recvAnysource: `tensors[0]` staged, `launch(staging)` starts
  // gloo's receive into it, `source_rank` names the sender for the Work.
  c10::intrusive_ptr<c10d::Work> submit_recv(std::vector<at::Tensor>& tensors, c10d::OpType type, int peer,
                                             std::function<GlooWorks(at::Tensor)> launch,
                                             std::function<int(const GlooWorks&)> source_rank);

  const c10::intrusive_ptr<c10d::Backend> gloo_;
  // Note [Pipelined chunks] (process_group_npu.cpp); read before the engine
  // starts its threads, so that a bad NPUB_DIST_CHUNK_BYTES starts none.
  const int64_t chunk_bytes_;
  std::unique_ptr<CollectiveEngine> engine_;
  // Atomic: DDP and FSDP issue from autograd's device threads too (the
  // ranks must still issue in one order, as c10d requires).
  std::atomic<uint64_t> seq_{0};      // collectives issued (the number in messages)
  std::atomic<uint64_t> p2p_seq_{0};  // sends and receives issued
  // Two threads issuing at once (DDP's and FSDP's autograd threads) would
  // otherwise push #n+1 before #n, and the signatures carry the number.
  std::mutex issue_mu_;
  std::mutex coalescing_mu_;
  bool coalescing_ = false;                             // under coalescing_mu_
  std::vector<c10::intrusive_ptr<WorkNPU>> coalesced_;  // under coalescing_mu_
};

}  // namespace npub::dist

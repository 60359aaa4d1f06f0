// The npu backend: set-up, jobs, coalescing, and the reducing collectives
// (allreduce, broadcast, reduce, barrier, send/recv); the gathering and
// scattering ones are in collectives_gather.cpp.
#include "distributed/process_group_npu.h"

#include <ATen/ops/scalar_tensor.h>
#include <c10/util/Exception.h>

#include <npubridge/support/env.h>

#include "distributed/arg_checks.h"
#include "runtime/npu_runtime.h"

#include <algorithm>
#include <string>
#include <utility>

namespace npub::dist {

namespace {

// Note [Pipelined chunks]
// A large allreduce or broadcast runs as steps of NPUB_DIST_CHUNK_BYTES
// (4 MiB unless set) over one staging buffer of the whole tensor: the
// launcher copies chunk k+1 to the host and starts gloo on it while gloo
// still carries chunk k, and the completer copies chunk k back as soon as
// gloo is done with it (collective_engine.h), so that only the first
// chunk's copy in and the last one's copy out are not hidden behind the
// transport. Gloo pairs the ranks' calls by their order, so every rank must
// cut the same calls: the plan depends only on the element count and the
// chunk size, never on the tensor's layout (a strided tensor crosses whole,
// in with the first chunk and out with the last: chunk_copies), and the
// chunk size is part of the collective's signature (fingerprint.h), so that
// ranks set differently fail naming both sizes instead of hanging. 4 MiB:
// smaller chunks pay gloo's per-call cost more often, larger ones leave
// less of the staging copies hidden behind gloo (the figures are in the
// commit that chose it). The setting is read when a group is made, as the
// other NPUB_* settings are read (Note [A setting is read strictly or
// refused], support/include/npubridge/support/env.h): "4M", "65536".
int64_t chunk_bytes_from_env() {
  return static_cast<int64_t>(env::get_positive_bytes("NPUB_DIST_CHUNK_BYTES", uint64_t{4} << 20));
}

std::string other_ranks(int rank, int size) {
  std::string s = size == 2 ? "rank " : "ranks ";
  for (int r = 0, n = 0; r < size; ++r) {
    if (r == rank) continue;
    s += (n++ ? ", " : "") + std::to_string(r);
  }
  return size == 1 ? "none" : s;
}

}  // namespace

ProcessGroupNPU::ProcessGroupNPU(c10::intrusive_ptr<c10d::Backend> gloo, int rank, int size,
                                 std::chrono::milliseconds timeout)
    : c10d::Backend(rank, size),
      gloo_(std::move(gloo)),
      chunk_bytes_(chunk_bytes_from_env()),
      engine_(std::make_unique<CollectiveEngine>(gloo_, rank, size, timeout)) {
  TORCH_CHECK_VALUE(gloo_, "npu backend: needs a gloo backend to carry its data");
}

ProcessGroupNPU::~ProcessGroupNPU() {
  // In a process forked after the group was made, the engine's threads and
  // gloo's are the parent's (fork copies one thread): joining them crashes,
  // and their locks and condition variables may be in any state. Leak both
  // there, as device_sim leaves its inherited devices alone (fork_guard.h).
  if (engine_->in_forked_child()) {
    (void)engine_.release();
    c10::raw::intrusive_ptr::incref(gloo_.get());
  }
}

void ProcessGroupNPU::setTimeout(std::chrono::milliseconds timeout) {
  engine_->set_timeout(timeout);
  gloo_->setTimeout(timeout);
}

std::unique_ptr<Job> ProcessGroupNPU::new_job(c10d::OpType type, const char* op, int device,
                                              std::vector<at::Tensor> outputs, int peer) {
  auto job = std::make_unique<Job>();
  job->issue_lock = std::unique_lock<std::mutex>(issue_mu_);  // released by submit()
  const bool p2p =
      type == c10d::OpType::SEND || type == c10d::OpType::RECV || type == c10d::OpType::RECVANYSOURCE;
  const uint64_t seq = p2p ? ++p2p_seq_ : ++seq_;
  job->what = c10::str(op, " #", seq);
  job->peers = peer >= 0 ? "rank " + std::to_string(peer)
                         : (peer == -2 ? "any rank" : other_ranks(getRank(), getSize()));
  job->device = device;
  engine_->check_not_forked(job->what);
  job->work = c10::make_intrusive<WorkNPU>(getRank(), type, job->what, seq, device, std::move(outputs));
  // The collective reads its inputs after the work the caller queued so far.
  if (device >= 0) job->ready.record(torch_backend::rt().devices().at(device).current_stream());
  return job;
}

c10::intrusive_ptr<c10d::Work> ProcessGroupNPU::submit(std::unique_ptr<Job> job) {
  std::unique_lock<std::mutex> issued = std::move(job->issue_lock);
  c10::intrusive_ptr<WorkNPU> work = job->work;
  if (job->signature) job->signature->seq = work->getSequencenumber();
  engine_->submit(std::move(job));
  std::lock_guard<std::mutex> lock(coalescing_mu_);
  if (coalescing_) coalesced_.push_back(work);
  return work;
}

at::Tensor ProcessGroupNPU::stage(Job& job, at::ScalarType dtype, int64_t numel) {
  job.staging.push_back(engine_->staging()->acquire(static_cast<size_t>(numel) * c10::elementSize(dtype)));
  return job.staging.back().as(dtype, numel);
}

Signature ProcessGroupNPU::signature(const char* op, at::ScalarType dtype,
                                     std::vector<std::vector<int64_t>> shapes, int64_t root,
                                     int reduce_op) const {
  Signature s;
  s.op = op;
  s.dtype = dtype;
  s.shapes = std::move(shapes);
  s.root = root;
  s.reduce_op = reduce_op;
  return s;
}

int64_t ProcessGroupNPU::chunk_elements(const at::Tensor& t) const {
  return std::max<int64_t>(1, chunk_bytes_ / static_cast<int64_t>(t.element_size()));
}

// Note [PREMUL_SUM over gloo]
// NCCL's premul sum multiplies each rank's input by the factor in the
// tensor's dtype (the factor converted to it: T(double_factor), or a
// one-element tensor of that dtype), then sums. Here the multiply runs on the
// staged host copy (the caller's input is left as it was, as with NCCL), in
// the collective's dtype, and gloo sums. The factor is read on the caller's
// thread at issue: a factor tensor on the npu device is copied to the host
// then, after the work queued before on the caller's stream (NCCL reads it
// when the collective runs, which is after that work too).
GlooReduce gloo_reduce(const char* op, const c10d::ReduceOp& reduce_op, at::ScalarType dtype) {
  if (reduce_op.op_ != c10d::ReduceOp::PREMUL_SUM) return GlooReduce{reduce_op, at::Tensor()};
  // The supplement of a PREMUL_SUM is always this type (torch makes it in
  // makePreMulSum); ProcessGroupNCCL downcasts it the same way.
  const auto* s = static_cast<const c10d::PreMulSumSupplement*>(reduce_op.supplement_.get());
  const at::TensorOptions cpu = at::TensorOptions().device(at::kCPU).dtype(dtype);
  at::Tensor factor;
  if (s->tensor_factor.defined()) {
    const at::Tensor& f = s->tensor_factor;
    TORCH_CHECK_VALUE(f.device().is_cpu() || f.device().is_privateuseone(), "npu backend: ", op,
                      ": the factor of ReduceOp.PREMUL_SUM must be a CPU or npu tensor, found one on ",
                      f.device());
    TORCH_CHECK_TYPE(!f.is_complex(), "npu backend: ", op,
                     ": the factor of ReduceOp.PREMUL_SUM must be real, found dtype ",
                     dtype_name(f.scalar_type()));
    // A copy: the caller may change its tensor after the call returns.
    factor = f.to(cpu, /*non_blocking=*/false, /*copy=*/true).reshape({});
  } else {
    factor = at::scalar_tensor(s->double_factor, cpu);
  }
  return GlooReduce{c10d::ReduceOp(c10d::ReduceOp::SUM), std::move(factor)};
}

namespace {

// One chunk of a pipelined collective on `t`, staged in `host` (contiguous,
// t.numel() elements). The chunk plan depends only on the element count and
// the chunk size, never on `t`'s layout, so every rank cuts the same gloo
// calls (Note [Pipelined chunks]). A contiguous `t` copies chunk by chunk; a
// strided one crosses whole (the copy engine walks its strides in one
// piece): in with the first chunk, out with the last.
struct ChunkCopies {
  std::function<void(sim::Stream&)> to_host, to_device;
};

ChunkCopies chunk_copies(const at::Tensor& t, const at::Tensor& host, int64_t offset, int64_t len) {
  const int64_t n = t.numel();
  if (t.is_contiguous()) {
    at::Tensor h = host.narrow(0, offset, len);
    at::Tensor d = t.view({-1}).narrow(0, offset, len);
    return {[h, d](sim::Stream& s) { queue_to_host(s, h, d); },
            [h, d](sim::Stream& s) { queue_to_device(s, d, h); }};
  }
  ChunkCopies c;
  if (offset == 0) c.to_host = [host, t](sim::Stream& s) { queue_to_host(s, host, t); };
  if (offset + len == n) c.to_device = [host, t](sim::Stream& s) { queue_to_device(s, t, host); };
  return c;
}

}  // namespace

void ProcessGroupNPU::add_allreduce(Job& job, const at::Tensor& t, const GlooReduce& op) {
  const int64_t n = t.numel();
  job.keep_alive.push_back(t);
  job.reads.push_back(memory_span(t));
  job.writes.push_back(memory_span(t));
  if (n == 0) {
    job.steps.emplace_back();  // nothing to carry; still completes in order
    return;
  }
  const at::Tensor host = stage(job, t.scalar_type(), n);
  const int64_t chunk = chunk_elements(t);
  for (int64_t offset = 0; offset < n; offset += chunk) {
    const int64_t len = std::min(chunk, n - offset);
    at::Tensor h = host.narrow(0, offset, len);
    ChunkCopies copies = chunk_copies(t, host, offset, len);
    Step step;
    step.to_host = std::move(copies.to_host);
    step.launch = [gloo = gloo_, h, op] {
      op.premultiply(h);
      std::vector<at::Tensor> v{h};
      c10d::AllreduceOptions o;
      o.reduceOp = op.op;
      return GlooWorks{gloo->allreduce(v, o)};
    };
    step.to_device = std::move(copies.to_device);
    job.steps.push_back(std::move(step));
  }
}

c10::intrusive_ptr<c10d::Work> ProcessGroupNPU::allreduce(std::vector<at::Tensor>& tensors,
                                                          const c10d::AllreduceOptions& opts) {
  const char* op = "allreduce";
  check_count(op, "tensors", tensors.size(), 1);
  TORCH_CHECK_VALUE(!opts.sparseIndices.has_value(),
                    "npu backend: allreduce: sparse tensors are not supported");
  int device = -1;
  check_output(op, "tensor", tensors[0], device);
  check_reduce_op(op, opts.reduceOp, tensors[0].scalar_type());
  const GlooReduce reduce_op = gloo_reduce(op, opts.reduceOp, tensors[0].scalar_type());
  auto job = new_job(c10d::OpType::ALLREDUCE, op, device, tensors);
  job->signature = signature(op, tensors[0].scalar_type(), {tensors[0].sizes().vec()}, -1, opts.reduceOp.op_);
  job->signature->chunk_bytes = chunk_bytes_;
  add_allreduce(*job, tensors[0], reduce_op);
  return submit(std::move(job));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupNPU::allreduce_coalesced(
    std::vector<at::Tensor>& tensors, const c10d::AllreduceCoalescedOptions& opts) {
  const char* op = "allreduce_coalesced";
  TORCH_CHECK_VALUE(!tensors.empty(), "npu backend: allreduce_coalesced: needs at least one tensor");
  int device = -1;
  std::vector<std::vector<int64_t>> shapes;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const std::string arg = "tensors[" + std::to_string(i) + "]";
    check_output(op, arg, tensors[i], device);
    check_same_dtype(op, arg, tensors[i], tensors[0].scalar_type(), "tensors[0]");
    shapes.push_back(tensors[i].sizes().vec());
  }
  check_reduce_op(op, opts.reduceOp, tensors[0].scalar_type());
  const GlooReduce reduce_op = gloo_reduce(op, opts.reduceOp, tensors[0].scalar_type());
  auto job = new_job(c10d::OpType::ALLREDUCE_COALESCED, op, device, tensors);
  job->signature = signature(op, tensors[0].scalar_type(), std::move(shapes), -1, opts.reduceOp.op_);
  job->signature->chunk_bytes = chunk_bytes_;
  for (const at::Tensor& t : tensors) add_allreduce(*job, t, reduce_op);
  return submit(std::move(job));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupNPU::broadcast(std::vector<at::Tensor>& tensors,
                                                          const c10d::BroadcastOptions& opts) {
  const char* op = "broadcast";
  check_count(op, "tensors", tensors.size(), 1);
  check_rank(op, "src", opts.rootRank, getSize());
  TORCH_CHECK_VALUE(opts.rootTensor == 0,
                    "npu backend: broadcast: rootTensor must be 0 (one tensor per rank), found ",
                    opts.rootTensor);
  int device = -1;
  const at::Tensor t = tensors[0];
  check_output(op, "tensor", t, device);
  auto job = new_job(c10d::OpType::BROADCAST, op, device, tensors);
  job->signature = signature(op, t.scalar_type(), {t.sizes().vec()}, opts.rootRank);
  job->signature->chunk_bytes = chunk_bytes_;
  const bool root = opts.rootRank == getRank();
  job->keep_alive.push_back(t);
  (root ? job->reads : job->writes).push_back(memory_span(t));
  const int64_t n = t.numel();
  if (n == 0) job->steps.emplace_back();
  const at::Tensor host = n > 0 ? stage(*job, t.scalar_type(), n) : at::Tensor();
  const int64_t chunk = chunk_elements(t);
  for (int64_t offset = 0; offset < n; offset += chunk) {
    const int64_t len = std::min(chunk, n - offset);
    at::Tensor h = host.narrow(0, offset, len);
    ChunkCopies copies = chunk_copies(t, host, offset, len);
    Step step;
    if (root) step.to_host = std::move(copies.to_host);
    step.launch = [gloo = gloo_, h, root_rank = opts.rootRank] {
      std::vector<at::Tensor> v{h};
      c10d::BroadcastOptions o;
      o.rootRank = root_rank;
      return GlooWorks{gloo->broadcast(v, o)};
    };
    if (!root) step.to_device = std::move(copies.to_device);
    job->steps.push_back(std::move(step));
  }
  return submit(std::move(job));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupNPU::reduce(std::vector<at::Tensor>& tensors,
                                                       const c10d::ReduceOptions& opts) {
  const char* op = "reduce";
  check_count(op, "tensors", tensors.size(), 1);
  check_rank(op, "dst", opts.rootRank, getSize());
  int device = -1;
  const at::Tensor t = tensors[0];
  check_output(op, "tensor", t, device);
  check_reduce_op(op, opts.reduceOp, t.scalar_type());
  const GlooReduce reduce_op = gloo_reduce(op, opts.reduceOp, t.scalar_type());
  auto job = new_job(c10d::OpType::REDUCE, op, device, tensors);
  job->signature = signature(op, t.scalar_type(), {t.sizes().vec()}, opts.rootRank, opts.reduceOp.op_);
  const bool root = opts.rootRank == getRank();
  job->keep_alive.push_back(t);
  job->reads.push_back(memory_span(t));
  if (root) job->writes.push_back(memory_span(t));
  Step step;
  if (t.numel() > 0) {
    at::Tensor h = stage(*job, t.scalar_type(), t.numel());
    step.to_host = [h, t](sim::Stream& s) { queue_to_host(s, h, t); };
    step.launch = [gloo = gloo_, h, reduce_op, root_rank = opts.rootRank] {
      reduce_op.premultiply(h);
      std::vector<at::Tensor> v{h};
      c10d::ReduceOptions o;
      o.reduceOp = reduce_op.op;
      o.rootRank = root_rank;
      return GlooWorks{gloo->reduce(v, o)};
    };
    // Only the destination receives the result (other ranks' tensors are
    // left as they were).
    if (root) step.to_device = [h, t](sim::Stream& s) { queue_to_device(s, t, h); };
  }
  job->steps.push_back(std::move(step));
  return submit(std::move(job));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupNPU::barrier(const c10d::BarrierOptions&) {
  const char* op = "barrier";
  // No tensors: ordered after every collective issued before it (FIFO), it
  // completes when all ranks reached it.
  auto job = new_job(c10d::OpType::BARRIER, op, -1, {});
  job->signature = signature(op, at::ScalarType::Undefined, {});
  Step step;
  step.launch = [gloo = gloo_] { return GlooWorks{gloo->barrier(c10d::BarrierOptions())}; };
  job->steps.push_back(std::move(step));
  return submit(std::move(job));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupNPU::send(std::vector<at::Tensor>& tensors, int dst_rank,
                                                     int tag) {
  const char* op = "send";
  check_count(op, "tensors", tensors.size(), 1);
  check_rank(op, "dst", dst_rank, getSize());
  int device = -1;
  const at::Tensor t = tensors[0];
  check_input(op, "tensor", t, device);
  auto job = new_job(c10d::OpType::SEND, op, device, tensors, dst_rank);
  job->keep_alive.push_back(t);
  job->reads.push_back(memory_span(t));
  Step step;
  at::Tensor h = stage(*job, t.scalar_type(), t.numel());
  step.to_host = [h, t](sim::Stream& s) { queue_to_host(s, h, t); };
  step.launch = [gloo = gloo_, h, dst_rank, tag] {
    std::vector<at::Tensor> v{h};
    return GlooWorks{gloo->send(v, dst_rank, tag)};
  };
  job->steps.push_back(std::move(step));
  return submit(std::move(job));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupNPU::submit_recv(
    std::vector<at::Tensor>& tensors, c10d::OpType type, int peer,
    std::function<GlooWorks(at::Tensor)> launch, std::function<int(const GlooWorks&)> source_rank) {
  const char* op = "recv";
  check_count(op, "tensors", tensors.size(), 1);
  int device = -1;
  const at::Tensor t = tensors[0];
  check_output(op, "tensor", t, device);
  auto job = new_job(type, op, device, tensors, peer);
  job->keep_alive.push_back(t);
  job->writes.push_back(memory_span(t));
  Step step;
  at::Tensor h = stage(*job, t.scalar_type(), t.numel());
  step.launch = [launch = std::move(launch), h] { return launch(h); };
  step.to_device = [h, t](sim::Stream& s) { queue_to_device(s, t, h); };
  job->steps.push_back(std::move(step));
  job->source_rank = std::move(source_rank);
  return submit(std::move(job));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupNPU::recv(std::vector<at::Tensor>& tensors, int src_rank,
                                                     int tag) {
  check_count("recv", "tensors", tensors.size(), 1);  // first, as for every collective
  check_rank("recv", "src", src_rank, getSize());
  return submit_recv(
      tensors, c10d::OpType::RECV, src_rank,
      [gloo = gloo_, src_rank, tag](at::Tensor h) {
        std::vector<at::Tensor> v{h};
        return GlooWorks{gloo->recv(v, src_rank, tag)};
      },
      [src_rank](const GlooWorks&) { return src_rank; });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupNPU::recvAnysource(std::vector<at::Tensor>& tensors, int tag) {
  return submit_recv(
      tensors, c10d::OpType::RECVANYSOURCE, -2,
      [gloo = gloo_, tag](at::Tensor h) {
        std::vector<at::Tensor> v{h};
        return GlooWorks{gloo->recvAnysource(v, tag)};
      },
      [](const GlooWorks& works) { return works.empty() ? -1 : works[0]->sourceRank(); });
}

void ProcessGroupNPU::startCoalescing() {
  std::lock_guard<std::mutex> lock(coalescing_mu_);
  TORCH_CHECK(!coalescing_,
              "npu backend: startCoalescing: already coalescing (endCoalescing was not called)");
  coalescing_ = true;
  coalesced_.clear();
}

c10::intrusive_ptr<c10d::Work> ProcessGroupNPU::endCoalescing() {
  std::vector<c10::intrusive_ptr<WorkNPU>> members;
  {
    std::lock_guard<std::mutex> lock(coalescing_mu_);
    TORCH_CHECK(coalescing_, "npu backend: endCoalescing without startCoalescing");
    coalescing_ = false;
    members = std::move(coalesced_);
    coalesced_.clear();
  }
  int device = -1;
  std::vector<at::Tensor> outputs;
  for (const auto& w : members) {
    for (const at::Tensor& t : w->result()) {
      outputs.push_back(t);
      if (device < 0 && t.defined()) device = t.device().index();
    }
  }
  // A job of no steps after the members: the engine completes in issue
  // order, so it completes after all of them; its Work rethrows theirs.
  auto job = std::make_unique<Job>();
  std::lock_guard<std::mutex> issued(issue_mu_);
  job->what = "coalesced collectives";
  job->peers = other_ranks(getRank(), getSize());
  job->device = device;
  engine_->check_not_forked(job->what);
  job->work = c10::make_intrusive<WorkNPU>(getRank(), c10d::OpType::COALESCED, job->what, seq_.load(), device,
                                           outputs);
  job->work->set_members(std::move(members));
  job->steps.emplace_back();
  c10::intrusive_ptr<WorkNPU> work = job->work;
  engine_->submit(std::move(job));
  return work;
}

}  // namespace npub::dist

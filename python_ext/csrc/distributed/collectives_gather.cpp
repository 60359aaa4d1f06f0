// The gathering and scattering collectives of the npu backend: allgather
// (list, into one tensor, coalesced), gather, scatter, reduce_scatter (list,
// tensor, coalesced) and alltoall (single tensor with split sizes, list).
// Each stages flat host buffers and runs gloo's flat form of the collective
// on them (_allgather_base, _reduce_scatter_base, alltoall_base), so that
// gloo does not copy between a flat buffer and a list of tensors again.
#include <c10/util/Exception.h>

#include "distributed/arg_checks.h"
#include "distributed/process_group_npu.h"

#include <numeric>
#include <string>
#include <utility>

namespace npub::dist {

namespace {

std::string item(const char* list, size_t i) { return std::string(list) + "[" + std::to_string(i) + "]"; }

std::string item(const char* list, size_t i, size_t j) {
  return item(list, i) + "[" + std::to_string(j) + "]";
}

// `host` (contiguous) into the consecutive pieces `outs`.
void to_pieces(sim::Stream& s, const std::vector<at::Tensor>& outs, const at::Tensor& host) {
  int64_t offset = 0;
  for (const at::Tensor& o : outs) {
    queue_to_device(s, o, host.narrow(0, offset, o.numel()));
    offset += o.numel();
  }
}

// The consecutive pieces `ins` into `host`.
void from_pieces(sim::Stream& s, const at::Tensor& host, const std::vector<at::Tensor>& ins) {
  int64_t offset = 0;
  for (const at::Tensor& i : ins) {
    queue_to_host(s, host.narrow(0, offset, i.numel()), i);
    offset += i.numel();
  }
}

int64_t total_numel(const std::vector<at::Tensor>& ts) {
  int64_t n = 0;
  for (const at::Tensor& t : ts) n += t.numel();
  return n;
}

void keep(Job& job, const std::vector<at::Tensor>& reads, const std::vector<at::Tensor>& writes) {
  for (const at::Tensor& t : reads) {
    job.keep_alive.push_back(t);
    job.reads.push_back(memory_span(t));
  }
  for (const at::Tensor& t : writes) {
    job.keep_alive.push_back(t);
    job.writes.push_back(memory_span(t));
  }
}

}  // namespace

void ProcessGroupNPU::add_allgather(Job& job, const at::Tensor& input,
                                    const std::vector<at::Tensor>& outputs) {
  keep(job, {input}, outputs);
  const int64_t n = input.numel();
  Step step;
  if (n > 0) {
    at::Tensor in = stage(job, input.scalar_type(), n);
    at::Tensor out = stage(job, input.scalar_type(), n * getSize());
    step.to_host = [in, input](sim::Stream& s) { queue_to_host(s, in, input); };
    step.launch = [gloo = gloo_, in, out] {
      at::Tensor i = in, o = out;
      return GlooWorks{gloo->_allgather_base(o, i, c10d::AllgatherOptions())};
    };
    step.to_device = [out, outputs](sim::Stream& s) { to_pieces(s, outputs, out); };
  }
  job.steps.push_back(std::move(step));
}

void ProcessGroupNPU::add_reduce_scatter(Job& job, const at::Tensor& output,
                                         const std::vector<at::Tensor>& inputs, const GlooReduce& op) {
  keep(job, inputs, {output});
  const int64_t n = output.numel();
  Step step;
  if (n > 0) {
    at::Tensor in = stage(job, output.scalar_type(), n * getSize());
    at::Tensor out = stage(job, output.scalar_type(), n);
    step.to_host = [in, inputs](sim::Stream& s) { from_pieces(s, in, inputs); };
    step.launch = [gloo = gloo_, in, out, op] {
      op.premultiply(in);
      at::Tensor i = in, o = out;
      c10d::ReduceScatterOptions opts;
      opts.reduceOp = op.op;
      return GlooWorks{gloo->_reduce_scatter_base(o, i, opts)};
    };
    step.to_device = [out, output](sim::Stream& s) { queue_to_device(s, output, out); };
  }
  job.steps.push_back(std::move(step));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupNPU::allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                                          std::vector<at::Tensor>& inputs,
                                                          const c10d::AllgatherOptions&) {
  const char* op = "allgather";
  check_count(op, "input_tensors", inputs.size(), 1);
  check_count(op, "output_tensor_lists", outputs.size(), 1);
  check_count(op, "output_tensor_lists[0]", outputs[0].size(), static_cast<size_t>(getSize()));
  int device = -1;
  const at::Tensor input = inputs[0];
  check_input(op, "input_tensor", input, device);
  for (size_t j = 0; j < outputs[0].size(); ++j) {
    const std::string arg = item("tensor_list", j);
    check_output(op, arg, outputs[0][j], device);
    check_same_dtype(op, arg, outputs[0][j], input.scalar_type());
    check_numel(op, arg, outputs[0][j], input.numel(), "one per rank, each the size of the input");
  }
  auto job = new_job(c10d::OpType::ALLGATHER, op, device, outputs[0]);
  job->signature = signature(op, input.scalar_type(), {input.sizes().vec()});
  add_allgather(*job, input, outputs[0]);
  return submit(std::move(job));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupNPU::_allgather_base(at::Tensor& output, at::Tensor& input,
                                                                const c10d::AllgatherOptions&) {
  const char* op = "all_gather_into_tensor";
  int device = -1;
  check_input(op, "input_tensor", input, device);
  check_output(op, "output_tensor", output, device);
  check_same_dtype(op, "output_tensor", output, input.scalar_type());
  check_numel(op, "output_tensor", output, input.numel() * getSize(), "world size x the input's");
  auto job = new_job(c10d::OpType::_ALLGATHER_BASE, op, device, {output});
  job->signature = signature(op, input.scalar_type(), {input.sizes().vec()});
  add_allgather(*job, input, {output});
  return submit(std::move(job));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupNPU::allgather_coalesced(
    std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions&) {
  const char* op = "allgather_coalesced";
  check_count(op, "output_lists", outputs.size(), inputs.size());
  TORCH_CHECK_VALUE(!inputs.empty(), "npu backend: allgather_coalesced: needs at least one tensor");
  int device = -1;
  std::vector<std::vector<int64_t>> shapes;
  std::vector<at::Tensor> results;
  for (size_t i = 0; i < inputs.size(); ++i) {
    check_input(op, item("input_list", i), inputs[i], device);
    check_same_dtype(op, item("input_list", i), inputs[i], inputs[0].scalar_type(), "input_list[0]");
    check_count(op, item("output_lists", i).c_str(), outputs[i].size(), static_cast<size_t>(getSize()));
    for (size_t j = 0; j < outputs[i].size(); ++j) {
      const std::string arg = item("output_lists", i, j);
      check_output(op, arg, outputs[i][j], device);
      check_same_dtype(op, arg, outputs[i][j], inputs[i].scalar_type(), item("input_list", i));
      check_numel(op, arg, outputs[i][j], inputs[i].numel(), "one per rank, each the size of its input");
      results.push_back(outputs[i][j]);
    }
    shapes.push_back(inputs[i].sizes().vec());
  }
  auto job = new_job(c10d::OpType::ALLGATHER_COALESCED, op, device, results);
  job->signature = signature(op, inputs[0].scalar_type(), std::move(shapes));
  for (size_t i = 0; i < inputs.size(); ++i) add_allgather(*job, inputs[i], outputs[i]);
  return submit(std::move(job));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupNPU::allgather_into_tensor_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs, const c10d::AllgatherOptions&) {
  const char* op = "allgather_into_tensor_coalesced";
  check_count(op, "outputs", outputs.size(), inputs.size());
  TORCH_CHECK_VALUE(!inputs.empty(),
                    "npu backend: allgather_into_tensor_coalesced: needs at least one tensor");
  int device = -1;
  std::vector<std::vector<int64_t>> shapes;
  for (size_t i = 0; i < inputs.size(); ++i) {
    check_input(op, item("inputs", i), inputs[i], device);
    check_same_dtype(op, item("inputs", i), inputs[i], inputs[0].scalar_type(), "inputs[0]");
    check_output(op, item("outputs", i), outputs[i], device);
    check_same_dtype(op, item("outputs", i), outputs[i], inputs[i].scalar_type(), item("inputs", i));
    check_numel(op, item("outputs", i), outputs[i], inputs[i].numel() * getSize(),
                "world size x its input's");
    shapes.push_back(inputs[i].sizes().vec());
  }
  auto job = new_job(c10d::OpType::COALESCED, op, device, outputs);
  job->signature = signature(op, inputs[0].scalar_type(), std::move(shapes));
  for (size_t i = 0; i < inputs.size(); ++i) add_allgather(*job, inputs[i], {outputs[i]});
  return submit(std::move(job));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupNPU::gather(std::vector<std::vector<at::Tensor>>& outputs,
                                                       std::vector<at::Tensor>& inputs,
                                                       const c10d::GatherOptions& opts) {
  const char* op = "gather";
  check_rank(op, "dst", opts.rootRank, getSize());
  check_count(op, "input_tensors", inputs.size(), 1);
  const bool root = opts.rootRank == getRank();
  int device = -1;
  const at::Tensor input = inputs[0];
  check_input(op, "tensor", input, device);
  std::vector<at::Tensor> outs;
  if (root) {
    check_count(op, "output_tensor_lists", outputs.size(), 1);
    check_count(op, "gather_list", outputs[0].size(), static_cast<size_t>(getSize()));
    for (size_t j = 0; j < outputs[0].size(); ++j) {
      const std::string arg = item("gather_list", j);
      check_output(op, arg, outputs[0][j], device);
      check_same_dtype(op, arg, outputs[0][j], input.scalar_type());
      check_numel(op, arg, outputs[0][j], input.numel(), "one per rank, each the size of the input");
    }
    outs = outputs[0];
  } else {
    TORCH_CHECK_VALUE(outputs.empty() || outputs[0].empty(),
                      "npu backend: gather: gather_list must be empty on rank ", getRank(),
                      ", which is not the destination ", opts.rootRank);
  }
  auto job = new_job(c10d::OpType::GATHER, op, device, outs);
  job->signature = signature(op, input.scalar_type(), {input.sizes().vec()}, opts.rootRank);
  keep(*job, {input}, outs);
  const int64_t n = input.numel();
  Step step;
  if (n > 0) {
    at::Tensor in = stage(*job, input.scalar_type(), n);
    at::Tensor out = root ? stage(*job, input.scalar_type(), n * getSize()) : at::Tensor();
    step.to_host = [in, input](sim::Stream& s) { queue_to_host(s, in, input); };
    step.launch = [gloo = gloo_, in, out, root, n, size = getSize(), opts] {
      std::vector<std::vector<at::Tensor>> o;
      if (root) {
        o.emplace_back();
        for (int j = 0; j < size; ++j) o[0].push_back(out.narrow(0, j * n, n));
      }
      std::vector<at::Tensor> i{in};
      c10d::GatherOptions g;
      g.rootRank = opts.rootRank;
      return GlooWorks{gloo->gather(o, i, g)};
    };
    if (root) step.to_device = [out, outs](sim::Stream& s) { to_pieces(s, outs, out); };
  }
  job->steps.push_back(std::move(step));
  return submit(std::move(job));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupNPU::scatter(std::vector<at::Tensor>& outputs,
                                                        std::vector<std::vector<at::Tensor>>& inputs,
                                                        const c10d::ScatterOptions& opts) {
  const char* op = "scatter";
  check_rank(op, "src", opts.rootRank, getSize());
  check_count(op, "output_tensors", outputs.size(), 1);
  const bool root = opts.rootRank == getRank();
  int device = -1;
  const at::Tensor output = outputs[0];
  check_output(op, "tensor", output, device);
  std::vector<at::Tensor> ins;
  if (root) {
    check_count(op, "input_tensor_lists", inputs.size(), 1);
    check_count(op, "scatter_list", inputs[0].size(), static_cast<size_t>(getSize()));
    for (size_t j = 0; j < inputs[0].size(); ++j) {
      const std::string arg = item("scatter_list", j);
      check_input(op, arg, inputs[0][j], device);
      check_same_dtype(op, arg, inputs[0][j], output.scalar_type(), "the output");
      check_numel(op, arg, inputs[0][j], output.numel(), "one per rank, each the size of the output");
    }
    ins = inputs[0];
  } else {
    TORCH_CHECK_VALUE(inputs.empty() || inputs[0].empty(),
                      "npu backend: scatter: scatter_list must be empty on rank ", getRank(),
                      ", which is not the source ", opts.rootRank);
  }
  auto job = new_job(c10d::OpType::SCATTER, op, device, {output});
  job->signature = signature(op, output.scalar_type(), {output.sizes().vec()}, opts.rootRank);
  keep(*job, ins, {output});
  const int64_t n = output.numel();
  Step step;
  if (n > 0) {
    at::Tensor out = stage(*job, output.scalar_type(), n);
    at::Tensor in = root ? stage(*job, output.scalar_type(), n * getSize()) : at::Tensor();
    if (root) step.to_host = [in, ins](sim::Stream& s) { from_pieces(s, in, ins); };
    step.launch = [gloo = gloo_, in, out, root, n, size = getSize(), opts] {
      std::vector<std::vector<at::Tensor>> i;
      if (root) {
        i.emplace_back();
        for (int j = 0; j < size; ++j) i[0].push_back(in.narrow(0, j * n, n));
      }
      std::vector<at::Tensor> o{out};
      c10d::ScatterOptions sc;
      sc.rootRank = opts.rootRank;
      return GlooWorks{gloo->scatter(o, i, sc)};
    };
    step.to_device = [out, output](sim::Stream& s) { queue_to_device(s, output, out); };
  }
  job->steps.push_back(std::move(step));
  return submit(std::move(job));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupNPU::reduce_scatter(std::vector<at::Tensor>& outputs,
                                                               std::vector<std::vector<at::Tensor>>& inputs,
                                                               const c10d::ReduceScatterOptions& opts) {
  const char* op = "reduce_scatter";
  check_count(op, "output_tensors", outputs.size(), 1);
  check_count(op, "input_tensor_lists", inputs.size(), 1);
  check_count(op, "input_list", inputs[0].size(), static_cast<size_t>(getSize()));
  int device = -1;
  const at::Tensor output = outputs[0];
  check_output(op, "output", output, device);
  check_reduce_op(op, opts.reduceOp, output.scalar_type());
  for (size_t j = 0; j < inputs[0].size(); ++j) {
    const std::string arg = item("input_list", j);
    check_input(op, arg, inputs[0][j], device);
    check_same_dtype(op, arg, inputs[0][j], output.scalar_type(), "the output");
    check_numel(op, arg, inputs[0][j], output.numel(), "one per rank, each the size of the output");
  }
  auto job = new_job(c10d::OpType::REDUCE_SCATTER, op, device, {output});
  job->signature = signature(op, output.scalar_type(), {output.sizes().vec()}, -1, opts.reduceOp.op_);
  add_reduce_scatter(*job, output, inputs[0], gloo_reduce(op, opts.reduceOp, output.scalar_type()));
  return submit(std::move(job));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupNPU::_reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                                     const c10d::ReduceScatterOptions& opts) {
  const char* op = "reduce_scatter_tensor";
  int device = -1;
  check_input(op, "input", input, device);
  check_output(op, "output", output, device);
  check_same_dtype(op, "output", output, input.scalar_type());
  check_numel(op, "input", input, output.numel() * getSize(), "world size x the output's");
  check_reduce_op(op, opts.reduceOp, output.scalar_type());
  auto job = new_job(c10d::OpType::_REDUCE_SCATTER_BASE, op, device, {output});
  job->signature = signature(op, output.scalar_type(), {output.sizes().vec()}, -1, opts.reduceOp.op_);
  add_reduce_scatter(*job, output, {input}, gloo_reduce(op, opts.reduceOp, output.scalar_type()));
  return submit(std::move(job));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupNPU::reduce_scatter_tensor_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::ReduceScatterOptions& opts) {
  const char* op = "reduce_scatter_tensor_coalesced";
  check_count(op, "inputs", inputs.size(), outputs.size());
  TORCH_CHECK_VALUE(!outputs.empty(),
                    "npu backend: reduce_scatter_tensor_coalesced: needs at least one tensor");
  int device = -1;
  std::vector<std::vector<int64_t>> shapes;
  for (size_t i = 0; i < outputs.size(); ++i) {
    check_input(op, item("inputs", i), inputs[i], device);
    check_output(op, item("outputs", i), outputs[i], device);
    check_same_dtype(op, item("outputs", i), outputs[i], outputs[0].scalar_type(), "outputs[0]");
    check_same_dtype(op, item("inputs", i), inputs[i], outputs[i].scalar_type(), item("outputs", i));
    check_numel(op, item("inputs", i), inputs[i], outputs[i].numel() * getSize(),
                "world size x its output's");
    shapes.push_back(outputs[i].sizes().vec());
  }
  check_reduce_op(op, opts.reduceOp, outputs[0].scalar_type());
  const GlooReduce reduce_op = gloo_reduce(op, opts.reduceOp, outputs[0].scalar_type());
  auto job = new_job(c10d::OpType::REDUCE_SCATTER_TENSOR_COALESCED, op, device, outputs);
  job->signature = signature(op, outputs[0].scalar_type(), std::move(shapes), -1, opts.reduceOp.op_);
  for (size_t i = 0; i < outputs.size(); ++i) add_reduce_scatter(*job, outputs[i], {inputs[i]}, reduce_op);
  return submit(std::move(job));
}

// alltoall on flat host buffers: gloo's alltoall_base with split sizes in
// elements of 1-D tensors, whatever the callers' shapes.
namespace {

GlooWorks flat_alltoall(const c10::intrusive_ptr<c10d::Backend>& gloo, at::Tensor out, at::Tensor in,
                        std::vector<int64_t> out_counts, std::vector<int64_t> in_counts) {
  return GlooWorks{gloo->alltoall_base(out, in, out_counts, in_counts, c10d::AllToAllOptions())};
}

}  // namespace

c10::intrusive_ptr<c10d::Work> ProcessGroupNPU::alltoall_base(at::Tensor& output, at::Tensor& input,
                                                              std::vector<int64_t>& output_split_sizes,
                                                              std::vector<int64_t>& input_split_sizes,
                                                              const c10d::AllToAllOptions&) {
  const char* op = "all_to_all_single";
  int device = -1;
  check_input(op, "input", input, device);
  check_output(op, "output", output, device);
  check_same_dtype(op, "output", output, input.scalar_type());
  TORCH_CHECK_VALUE(input.dim() >= 1 && output.dim() >= 1,
                    "npu backend: all_to_all_single: input and output need at least one dimension, found ",
                    input.dim(), " and ", output.dim());
  const int size = getSize();
  // Elements per row (dim 0 is split); the other dims must agree.
  TORCH_CHECK_VALUE(input.sizes().slice(1) == output.sizes().slice(1),
                    "npu backend: all_to_all_single: input and output must agree beyond dim 0, found shapes ",
                    input.sizes(), " and ", output.sizes());
  const int64_t row = input.size(0) > 0 ? input.numel() / input.size(0)
                                        : (output.size(0) > 0 ? output.numel() / output.size(0) : 0);
  auto splits = [&](const std::vector<int64_t>& given, const at::Tensor& t, const char* arg) {
    std::vector<int64_t> s = given;
    if (s.empty()) {
      TORCH_CHECK_VALUE(t.size(0) % size == 0, "npu backend: all_to_all_single: ", arg, " dim 0 (", t.size(0),
                        ") must divide by the world size ", size, " when no split sizes are given");
      s.assign(size, t.size(0) / size);
    }
    TORCH_CHECK_VALUE(static_cast<int>(s.size()) == size, "npu backend: all_to_all_single: ", arg,
                      " split sizes must have one entry per rank (", size, "), found ", s.size());
    int64_t sum = 0;
    for (int64_t v : s) {
      TORCH_CHECK_VALUE(v >= 0, "npu backend: all_to_all_single: ", arg,
                        " split sizes must not be negative, found ", v);
      sum += v;
    }
    TORCH_CHECK_VALUE(sum == t.size(0), "npu backend: all_to_all_single: ", arg, " split sizes sum to ", sum,
                      ", but its dim 0 is ", t.size(0));
    for (int64_t& v : s) v *= row;  // in elements
    return s;
  };
  std::vector<int64_t> in_counts = splits(input_split_sizes, input, "input");
  std::vector<int64_t> out_counts = splits(output_split_sizes, output, "output");
  auto job = new_job(c10d::OpType::ALLTOALL_BASE, op, device, {output});
  Signature sig = signature(op, input.scalar_type(), {input.sizes().slice(1).vec()});
  sig.send_counts = in_counts;
  sig.recv_counts = out_counts;
  job->signature = std::move(sig);
  keep(*job, {input}, {output});
  at::Tensor in = stage(*job, input.scalar_type(), input.numel());
  at::Tensor out = stage(*job, output.scalar_type(), output.numel());
  Step step;
  step.to_host = [in, input](sim::Stream& s) { queue_to_host(s, in, input); };
  step.launch = [gloo = gloo_, in, out, out_counts, in_counts] {
    return flat_alltoall(gloo, out, in, out_counts, in_counts);
  };
  step.to_device = [out, output](sim::Stream& s) { queue_to_device(s, output, out); };
  job->steps.push_back(std::move(step));
  return submit(std::move(job));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupNPU::alltoall(std::vector<at::Tensor>& outputs,
                                                         std::vector<at::Tensor>& inputs,
                                                         const c10d::AllToAllOptions&) {
  const char* op = "all_to_all";
  const size_t size = static_cast<size_t>(getSize());
  check_count(op, "input_tensor_list", inputs.size(), size);
  check_count(op, "output_tensor_list", outputs.size(), size);
  int device = -1;
  std::vector<int64_t> in_counts, out_counts;
  for (size_t j = 0; j < size; ++j) {
    check_input(op, item("input_tensor_list", j), inputs[j], device);
    check_same_dtype(op, item("input_tensor_list", j), inputs[j], inputs[0].scalar_type(),
                     "input_tensor_list[0]");
    check_output(op, item("output_tensor_list", j), outputs[j], device);
    check_same_dtype(op, item("output_tensor_list", j), outputs[j], inputs[0].scalar_type(),
                     "input_tensor_list[0]");
    in_counts.push_back(inputs[j].numel());
    out_counts.push_back(outputs[j].numel());
  }
  auto job = new_job(c10d::OpType::ALLTOALL, op, device, outputs);
  Signature sig = signature(op, inputs[0].scalar_type(), {});
  sig.send_counts = in_counts;
  sig.recv_counts = out_counts;
  job->signature = std::move(sig);
  keep(*job, inputs, outputs);
  at::Tensor in = stage(*job, inputs[0].scalar_type(), total_numel(inputs));
  at::Tensor out = stage(*job, inputs[0].scalar_type(), total_numel(outputs));
  Step step;
  step.to_host = [in, inputs](sim::Stream& s) { from_pieces(s, in, inputs); };
  step.launch = [gloo = gloo_, in, out, out_counts, in_counts] {
    return flat_alltoall(gloo, out, in, out_counts, in_counts);
  };
  step.to_device = [out, outputs](sim::Stream& s) { to_pieces(s, outputs, out); };
  job->steps.push_back(std::move(step));
  return submit(std::move(job));
}

}  // namespace npub::dist

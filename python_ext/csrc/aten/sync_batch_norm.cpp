// SyncBatchNorm's ops on the CPU (see sync_batch_norm.h). Each computes
// what ATen's CUDA kernel computes (Normalization.cuh), vectorised over the
// channels: the input is read as (N, C, *), reduced over every dim but 1,
// in the accumulation dtype CUDA uses (at::toAccumulateType(.., cuda):
// float for half, bfloat16 and float, double for double), and the
// elementwise results come back in the input's dtype.
#include "aten/sync_batch_norm.h"

#include <ATen/AccumulateType.h>
#include <ATen/TensorOperators.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/batch_norm_update_stats.h>
#include <ATen/ops/full.h>
#include <ATen/ops/sqrt.h>
#include <ATen/ops/var_mean.h>
#include <ATen/ops/where.h>
#include <ATen/ops/zeros_like.h>
#include <c10/util/Exception.h>

#include <optional>
#include <string>
#include <tuple>
#include <vector>

namespace npub::torch_backend {

namespace {
// Named, as the aten files are compiled as one unity group: their anonymous
// namespaces meet.
namespace sync_bn {

at::Tensor on_cpu(const c10::IValue& v) {
  if (v.isNone()) return at::Tensor();
  const at::Tensor& t = v.toTensor();
  return t.defined() ? t.cpu() : t;
}

at::Tensor given(const c10::IValue& v) { return v.isNone() ? at::Tensor() : v.toTensor(); }

at::ScalarType acc_type(at::ScalarType t) { return at::toAccumulateType(t, /*is_cuda=*/true); }

void check_input(const std::string& op, const char* arg, const at::Tensor& x) {
  TORCH_CHECK(x.dim() >= 2, "npubridge: ", op, ": argument '", arg,
              "' must be (N, C, *) with at least 2 dims, got a ", x.dim(), "-dim tensor of shape ",
              x.sizes());
}

// Every dim of `x` but the channels' (1).
std::vector<int64_t> reduced_dims(const at::Tensor& x) {
  std::vector<int64_t> dims{0};
  for (int64_t d = 2; d < x.dim(); ++d) dims.push_back(d);
  return dims;
}

// The per-channel vector `v` (C) in dtype `acc`, shaped to broadcast over
// an (N, C, *) tensor of `dim` dims.
at::Tensor per_channel(const at::Tensor& v, int64_t dim, at::ScalarType acc) {
  std::vector<int64_t> shape(static_cast<size_t>(dim), 1);
  shape[1] = -1;
  return v.to(acc).reshape(shape);
}

at::Tensor like_input(const at::Tensor& y, const at::Tensor& input) {
  return y.to(input.scalar_type()).contiguous(input.suggest_memory_format());
}

// (mean, invstd) per channel, invstd = 1 / sqrt(biased var + eps), 0 where
// both are 0 (CUDA's InvStd).
std::vector<at::Tensor> stats(const std::string& op, const at::Tensor& input, double eps) {
  check_input(op, "input", input);
  at::Tensor var, mean;
  std::tie(var, mean) = at::var_mean(input.to(acc_type(input.scalar_type())), reduced_dims(input),
                                     /*correction=*/std::optional<at::Scalar>(0), /*keepdim=*/false);
  at::Tensor invstd = 1 / at::sqrt(var + eps);
  if (eps == 0) invstd = at::where(var == 0, at::zeros_like(invstd), invstd);
  return {mean, invstd};
}

// Note [The gather ops write what their schema hides]
// batch_norm_gather_stats(_with_counts) update running_mean and running_var
// in place (CUDA writes them), and so does batch_norm_update_stats (which
// the CPU implements), but the schemas mark neither as written, so
// computing on CPU copies would drop the update, as Note [native_batch_norm
// writes what its schema hides] in fallback.cpp found for BatchNorm: the new
// statistics are copied back into the tensors given, on whatever device.
//
// The ranks' (mean_j, invstd_j, count_j) combine into the statistics of
// their union (the parallel variance formula; CUDA folds the same terms one
// rank at a time): mean = sum_j c_j m_j / n, biased var = sum_j c_j (var_j +
// (m_j - mean)^2) / n with var_j = 1 / invstd_j^2 - eps. A rank of count 0
// (an empty input, whose stats SyncBatchNorm sends as zeros) adds nothing.
std::vector<at::Tensor> gather_stats(const std::string& op, const at::Tensor& input,
                                     const at::Tensor& mean_all, const at::Tensor& invstd_all,
                                     const at::Tensor& running_mean, const at::Tensor& running_var,
                                     double momentum, double eps, const at::Tensor& counts) {
  TORCH_CHECK(mean_all.dim() == 2 && invstd_all.sizes() == mean_all.sizes(), "npubridge: ", op,
              ": arguments 'mean' and 'invstd' must be (world_size, C) of one shape, got ", mean_all.sizes(),
              " and ", invstd_all.sizes());
  TORCH_CHECK(counts.numel() == mean_all.size(0), "npubridge: ", op, ": argument 'counts' must hold ",
              mean_all.size(0), " counts (one per row of 'mean'), got ", counts.numel());
  // CUDA's arithmetic: the accumulation dtype of the running statistics
  // (else of the input); the results in mean's dtype, float for half.
  const at::ScalarType acc =
      acc_type(running_mean.defined() ? running_mean.scalar_type() : input.scalar_type());
  const at::ScalarType out = acc_type(mean_all.scalar_type());
  const at::Tensor c = counts.to(acc).reshape({-1, 1});
  const at::Tensor present = c > 0;
  const at::Tensor zero = at::zeros_like(c);
  const at::Tensor m = at::where(present, mean_all.to(acc), zero);
  const at::Tensor invstd = invstd_all.to(acc);
  const at::Tensor var = at::where(present, 1 / (invstd * invstd) - eps, zero);
  const at::Tensor n = c.sum();
  const at::Tensor mean = (c * m).sum(0) / n;
  const at::Tensor diff = m - mean;
  const at::Tensor var_n = (c * (var + diff * diff)).sum(0);
  const at::Tensor new_invstd = 1 / at::sqrt(var_n / n + eps);
  if (running_mean.defined()) {
    const at::Tensor r = running_mean.cpu().to(acc);
    running_mean.copy_((1 - momentum) * r + momentum * mean);
  }
  if (running_var.defined()) {
    const at::Tensor r = running_var.cpu().to(acc);
    running_var.copy_((1 - momentum) * r + momentum * (var_n / (n - 1)));
  }
  return {mean.to(out), new_invstd.to(out)};
}

// (x - mean) * invstd * weight + bias.
at::Tensor elemt(const std::string& op, const at::Tensor& input, const at::Tensor& weight,
                 const at::Tensor& bias, const at::Tensor& mean, const at::Tensor& invstd) {
  check_input(op, "input", input);
  const at::ScalarType acc = acc_type(input.scalar_type());
  const int64_t d = input.dim();
  at::Tensor y = (input.to(acc) - per_channel(mean, d, acc)) * per_channel(invstd, d, acc);
  if (weight.defined()) y = y * per_channel(weight, d, acc);
  if (bias.defined()) y = y + per_channel(bias, d, acc);
  return like_input(y, input);
}

// (sum dy, sum dy (x - mean), grad_weight = sum dy (x - mean) * invstd,
// grad_bias = sum dy) per channel, each only if asked; the sums in mean's
// dtype, the gradients in weight's.
std::vector<at::Tensor> backward_reduce(const std::string& op, const at::Tensor& grad_out,
                                        const at::Tensor& input, const at::Tensor& mean,
                                        const at::Tensor& invstd, const at::Tensor& weight, bool input_g,
                                        bool weight_g, bool bias_g) {
  check_input(op, "input", input);
  TORCH_CHECK(grad_out.sizes() == input.sizes(), "npubridge: ", op,
              ": argument 'grad_out' must have the input's shape ", input.sizes(), ", got ",
              grad_out.sizes());
  const at::ScalarType acc = acc_type(input.scalar_type());
  const auto dims = reduced_dims(input);
  const at::Tensor dy = grad_out.to(acc);
  const at::Tensor sum_dy = dy.sum(dims);
  const at::Tensor sum_dy_xmu = (dy * (input.to(acc) - per_channel(mean, input.dim(), acc))).sum(dims);
  const at::ScalarType grad_type = weight.defined() ? weight.scalar_type() : mean.scalar_type();
  return {input_g ? sum_dy.to(mean.scalar_type()) : at::Tensor(),
          input_g ? sum_dy_xmu.to(mean.scalar_type()) : at::Tensor(),
          weight_g ? (sum_dy_xmu * invstd.to(acc)).to(grad_type) : at::Tensor(),
          bias_g ? sum_dy.to(grad_type) : at::Tensor()};
}

// grad_input = (dy - sum_dy / n - (x - mean) invstd^2 sum_dy_xmu / n)
// invstd weight, n the whole batch's count per channel (the sum of the
// ranks' counts): BatchNorm's input gradient with the global sums.
at::Tensor backward_elemt(const std::string& op, const at::Tensor& grad_out, const at::Tensor& input,
                          const at::Tensor& mean, const at::Tensor& invstd, const at::Tensor& weight,
                          const at::Tensor& sum_dy, const at::Tensor& sum_dy_xmu, const at::Tensor& count) {
  check_input(op, "input", input);
  TORCH_CHECK(grad_out.sizes() == input.sizes(), "npubridge: ", op,
              ": argument 'grad_out' must have the input's shape ", input.sizes(), ", got ",
              grad_out.sizes());
  TORCH_CHECK(!at::isFloatingType(count.scalar_type()) && !at::isComplexType(count.scalar_type()),
              "npubridge: ", op, ": argument 'count' must hold integer counts, got ", count.scalar_type());
  const int64_t n = count.sum().item<int64_t>();
  TORCH_CHECK(n > 0, "npubridge: ", op, ": argument 'count' must sum to a positive count, got ", n);
  const at::ScalarType acc = acc_type(input.scalar_type());
  const int64_t d = input.dim();
  const at::Tensor is = per_channel(invstd, d, acc);
  // CUDA multiplies by 1/n in the accumulation dtype; a double scalar is
  // cast to the tensor's dtype the same way.
  const double norm = 1.0 / static_cast<double>(n);
  const at::Tensor mean_dy = per_channel(sum_dy, d, acc) * norm;
  const at::Tensor proj = is * is * per_channel(sum_dy_xmu, d, acc) * norm;
  const at::Tensor scale = weight.defined() ? is * per_channel(weight, d, acc) : is;
  const at::Tensor xmu = input.to(acc) - per_channel(mean, d, acc);
  return like_input((grad_out.to(acc) - mean_dy - xmu * proj) * scale, input);
}

// The call of an op: its arguments from the stack, its returns onto it. An
// .out overload computes the functional one (its leading arguments are the
// same) and resizes and copies the results into the out tensors it returns.
void run(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const std::string& name = op.schema().operator_name().name;
  const size_t nargs = op.schema().arguments().size();
  TORCH_INTERNAL_ASSERT(stack->size() >= nargs, "npubridge: ", name, ": the stack lacks its arguments");
  const std::vector<c10::IValue> a(stack->end() - static_cast<std::ptrdiff_t>(nargs), stack->end());
  stack->resize(stack->size() - nargs);
  const size_t nouts = op.schema().overload_name() == "out" ? op.schema().returns().size() : 0;
  std::vector<at::Tensor> out;
  if (name == "aten::batch_norm_stats") {
    out = stats(name, on_cpu(a[0]), a[1].toDouble());
  } else if (name == "aten::batch_norm_gather_stats_with_counts") {
    out = gather_stats(name, on_cpu(a[0]), on_cpu(a[1]), on_cpu(a[2]), given(a[3]), given(a[4]),
                       a[5].toDouble(), a[6].toDouble(), on_cpu(a[7]));
  } else if (name == "aten::batch_norm_gather_stats") {
    const at::Tensor mean_all = on_cpu(a[1]);
    const std::vector<int64_t> world{mean_all.dim() > 0 ? mean_all.size(0) : 0};
    const at::Tensor counts = at::full(world, a[7].toInt(), at::TensorOptions().dtype(at::kLong));
    out = gather_stats(name, on_cpu(a[0]), mean_all, on_cpu(a[2]), given(a[3]), given(a[4]), a[5].toDouble(),
                       a[6].toDouble(), counts);
  } else if (name == "aten::batch_norm_update_stats") {
    // The CPU has this one; it joins for the same hidden writes: its CPU
    // kernel on copies, whose new statistics go back into the tensors given.
    const at::Tensor rm = given(a[1]), rv = given(a[2]);
    const at::Tensor rm_cpu = on_cpu(a[1]), rv_cpu = on_cpu(a[2]);
    const auto r = at::batch_norm_update_stats(on_cpu(a[0]), rm_cpu, rv_cpu, a[3].toDouble());
    if (rm.defined()) rm.copy_(rm_cpu);
    if (rv.defined()) rv.copy_(rv_cpu);
    out = {std::get<0>(r), std::get<1>(r)};
  } else if (name == "aten::batch_norm_elemt") {
    out = {elemt(name, on_cpu(a[0]), on_cpu(a[1]), on_cpu(a[2]), on_cpu(a[3]), on_cpu(a[4]))};
  } else if (name == "aten::batch_norm_backward_reduce") {
    out = backward_reduce(name, on_cpu(a[0]), on_cpu(a[1]), on_cpu(a[2]), on_cpu(a[3]), on_cpu(a[4]),
                          a[5].toBool(), a[6].toBool(), a[7].toBool());
  } else {
    out = {backward_elemt(name, on_cpu(a[0]), on_cpu(a[1]), on_cpu(a[2]), on_cpu(a[3]), on_cpu(a[4]),
                          on_cpu(a[5]), on_cpu(a[6]), on_cpu(a[7]))};
  }
  if (nouts == 0) {
    for (auto& t : out) stack->emplace_back(std::move(t));
    return;
  }
  TORCH_INTERNAL_ASSERT(out.size() == nouts, "npubridge: ", name, ": ", out.size(), " results for ", nouts,
                        " outs");
  for (size_t i = 0; i < nouts; ++i) {
    at::Tensor dst = a[nargs - nouts + i].toTensor();
    TORCH_CHECK(dst.scalar_type() == out[i].scalar_type(), "npubridge: ", name, ".out: out argument ", i,
                " must have dtype ", out[i].scalar_type(), ", got ", dst.scalar_type());
    dst.resize_(out[i].sizes());
    dst.copy_(out[i]);
    stack->emplace_back(std::move(dst));
  }
}

}  // namespace sync_bn
}  // namespace

bool is_sync_batch_norm_op(const c10::OperatorName& name) {
  if (!name.overload_name.empty() && name.overload_name != "out") return false;
  return name.name == "aten::batch_norm_stats" || name.name == "aten::batch_norm_gather_stats" ||
         name.name == "aten::batch_norm_gather_stats_with_counts" || name.name == "aten::batch_norm_elemt" ||
         name.name == "aten::batch_norm_backward_reduce" || name.name == "aten::batch_norm_backward_elemt" ||
         name.name == "aten::batch_norm_update_stats";
}

void run_sync_batch_norm_op_on_cpu(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  sync_bn::run(op, stack);
}

}  // namespace npub::torch_backend

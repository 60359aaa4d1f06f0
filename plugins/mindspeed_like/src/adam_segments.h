// What mindspeed_like's Adam kernels share: a parameter list as segments of
// one flattened index space walked by one parallel loop, the per-dtype
// dispatch of a segment, and the checks of the per-parameter lists.
// adamw.cpp (npu_apply_adam_w, torch.optim's single-tensor arithmetic) and
// fused_adam.cpp (aten::_fused_adam_ / _fused_adamw_, ATen's fused CPU
// kernel's arithmetic) differ only in the element loop each passes in.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "float_access.h"

namespace mindspeed_like {

enum class Storage { kFloat32, kFloat64, kFloat16, kBFloat16 };

// The storage of a tensor of a floating dtype the Adam kernels take; fails
// naming `where` (e.g. "params[3]") otherwise.
inline Storage adam_storage_of(const npub::sdk::Call& call, const npub::sdk::TensorRef& t,
                               const std::string& where) {
  if (t.is(npub::sdk::kFloat32)) return Storage::kFloat32;
  if (t.is(npub::sdk::kFloat64)) return Storage::kFloat64;
  if (t.is(npub::sdk::kFloat16)) return Storage::kFloat16;
  if (t.is(npub::sdk::kBFloat16)) return Storage::kBFloat16;
  call.fail(NPUB_ERR_INVALID_ARGUMENT, where + ": expected float32, float16, bfloat16 or float64 but found " +
                                           npub::sdk::dtype_name(t.dtype()));
}

// Calls f(S{}) with S the element struct (float_access.h) of `s`.
template <typename F>
PLUGIN_KERNELS_INLINE void with_storage(Storage s, F&& f) {
  switch (s) {
    case Storage::kFloat32:
      f(F32{});
      break;
    case Storage::kFloat64:
      f(F64{});
      break;
    case Storage::kFloat16:
      f(F16{});
      break;
    case Storage::kBFloat16:
      f(BF16{});
      break;
  }
}

// Checks that `list` (the argument `name`) has one tensor per parameter,
// each of its parameter's shape and dtype. `params_name` is the schema's
// name of the parameter list ("params", or ATen's "self").
inline void check_like_params(const npub::sdk::Call& call, const std::vector<npub::sdk::TensorRef>& params,
                              const char* params_name, const std::vector<npub::sdk::TensorRef>& list,
                              const char* name, const char* why = "") {
  using npub::sdk::Call;
  const size_t n = params.size();
  if (list.size() != n)
    call.fail(NPUB_ERR_INVALID_ARGUMENT, std::string(name) + ": expected as many tensors as " + params_name +
                                             " (" + std::to_string(n) + ")" + why + " but found " +
                                             std::to_string(list.size()));
  for (size_t i = 0; i < n; ++i) {
    const npub::sdk::TensorRef& p = params[i];
    const npub::sdk::TensorRef& t = list[i];
    const std::string where = std::string(name) + "[" + std::to_string(i) + "]";
    const std::string of = std::string(params_name) + "[" + std::to_string(i) + "]";
    if (t.sizes() != p.sizes())
      call.fail(NPUB_ERR_INVALID_ARGUMENT, where + ": expected the shape of " + of + " " +
                                               Call::shape_str(p.sizes()) + " but found " +
                                               Call::shape_str(t.sizes()));
    if (!t.is(p.dtype()))
      call.fail(NPUB_ERR_INVALID_ARGUMENT, where + ": expected the dtype of " + of + " (" +
                                               npub::sdk::dtype_name(p.dtype()) + ") but found " +
                                               npub::sdk::dtype_name(t.dtype()));
  }
}

// An Adam step's lists against its parameters (the list `params_name`):
// each parameter of a floating storage; grads, exp_avgs and exp_avg_sqs,
// and max_exp_avg_sqs under amsgrad, one per parameter of its shape and
// dtype.
inline void check_adam_lists(const npub::sdk::Call& call, const std::vector<npub::sdk::TensorRef>& params,
                             const char* params_name, const std::vector<npub::sdk::TensorRef>& grads,
                             const std::vector<npub::sdk::TensorRef>& exp_avgs,
                             const std::vector<npub::sdk::TensorRef>& exp_avg_sqs,
                             const std::vector<npub::sdk::TensorRef>& max_exp_avg_sqs, bool amsgrad) {
  for (size_t i = 0; i < params.size(); ++i)
    adam_storage_of(call, params[i], std::string(params_name) + "[" + std::to_string(i) + "]");
  check_like_params(call, params, params_name, grads, "grads");
  check_like_params(call, params, params_name, exp_avgs, "exp_avgs");
  check_like_params(call, params, params_name, exp_avg_sqs, "exp_avg_sqs");
  if (amsgrad)
    check_like_params(call, params, params_name, max_exp_avg_sqs, "max_exp_avg_sqs", " since amsgrad is set");
}

// Note [One loop over all of a parameter list]
// An optimizer step touches every element of every parameter once. Each
// parameter is a segment [begin, begin + numel) of one flattened index
// space, and one parallel loop splits that space: each thread takes a
// contiguous stretch of it whatever the sizes of the tensors in it (a
// model's many small biases and few large matrices alike), and memory is
// streamed once. `Segment` has `begin` and `numel`, in increasing `begin`
// without gaps (empty tensors left out); body(segment, lo, hi) runs the
// elements [lo, hi) of one segment, in the segment's own indices.
template <typename Segment, typename Body>
void for_each_segment_range(npub::sdk::Call& call, const std::vector<Segment>& segs, Body&& body) {
  if (segs.empty()) return;
  const int64_t total = segs.back().begin + segs.back().numel;
  call.parallel_for(0, total, 1 << 15, [&](int64_t b, int64_t e) {
    auto it = std::upper_bound(segs.begin(), segs.end(), b,
                               [](int64_t x, const Segment& s) { return x < s.begin; });
    for (--it; it != segs.end() && it->begin < e; ++it) {
      const Segment& s = *it;
      const int64_t lo = std::max(b, s.begin) - s.begin, hi = std::min(e, s.begin + s.numel) - s.begin;
      body(s, lo, hi);
    }
  });
}

}  // namespace mindspeed_like

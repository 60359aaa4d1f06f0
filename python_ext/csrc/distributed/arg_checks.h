// Argument checks of the npu backend's collectives, on the caller's thread
// before anything is queued: each error names the collective, the argument,
// what was expected and what was found (ValueError, TypeError in Python).
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/csrc/distributed/c10d/Types.hpp>

#include <string>
#include <vector>

namespace npub::dist {

// `t` is a dense npu tensor of a dtype gloo carries, on the same npu device
// as the collective's other tensors (`device`: -1 until the first one).
void check_input(const char* op, const std::string& arg, const at::Tensor& t, int& device);
// check_input, and `t` can be written elementwise (no self-overlap, as an
// expanded view has).
void check_output(const char* op, const std::string& arg, const at::Tensor& t, int& device);
// The reduce op is one gloo applies to `dtype`.
void check_reduce_op(const char* op, const c10d::ReduceOp& reduce_op, at::ScalarType dtype);
// `like` names the tensor whose dtype `expected` is ("the input", "outputs[0]").
void check_same_dtype(const char* op, const std::string& arg, const at::Tensor& t, at::ScalarType expected,
                      const std::string& like = "the input");
void check_numel(const char* op, const std::string& arg, const at::Tensor& t, int64_t expected,
                 const char* why);
void check_rank(const char* op, const char* arg, int64_t rank, int size);
void check_count(const char* op, const char* arg, size_t found, size_t expected);

}  // namespace npub::dist

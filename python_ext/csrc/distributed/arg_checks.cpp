// Argument checks of the npu backend (arg_checks.h).
#include "distributed/arg_checks.h"

#include <ATen/MemoryOverlap.h>
#include <c10/util/Exception.h>

#include "distributed/fingerprint.h"

namespace npub::dist {

namespace {

// The dtypes ProcessGroupGloo carries (torch 2.13: int16 and the unsigned
// types beyond uint8 are "Invalid scalar type" there). Complex tensors
// reach the backend as real views (torch.distributed makes them).
bool gloo_carries(at::ScalarType t) {
  switch (t) {
    case at::kFloat:
    case at::kDouble:
    case at::kHalf:
    case at::kBFloat16:
    case at::kChar:
    case at::kByte:
    case at::kInt:
    case at::kLong:
    case at::kBool:
      return true;
    default:
      return false;
  }
}

}  // namespace

void check_input(const char* op, const std::string& arg, const at::Tensor& t, int& device) {
  TORCH_CHECK_VALUE(t.defined(), "npu backend: ", op, ": ", arg, " is an undefined tensor");
  TORCH_CHECK_VALUE(t.device().is_privateuseone(), "npu backend: ", op, ": ", arg,
                    " must be an npu tensor, found a tensor on ", t.device(),
                    " (use a \"cpu:gloo,npu:npu\" group for CPU tensors)");
  TORCH_CHECK_VALUE(t.layout() == at::kStrided, "npu backend: ", op, ": ", arg,
                    " must be a dense (strided) tensor, found layout ", t.layout());
  const int index = t.device().index();
  if (device < 0) device = index;
  TORCH_CHECK_VALUE(index == device, "npu backend: ", op,
                    ": all tensors of one collective must be on one npu device, found npu:", device, " and ",
                    arg, " on ", t.device());
  TORCH_CHECK_TYPE(
      gloo_carries(t.scalar_type()), "npu backend: ", op, ": ", arg, " has dtype ",
      dtype_name(t.scalar_type()),
      ", which the gloo transport cannot carry (supported: torch.float32, torch.float64, torch.float16, "
      "torch.bfloat16, torch.int8, torch.uint8, torch.int32, torch.int64, torch.bool)");
}

void check_output(const char* op, const std::string& arg, const at::Tensor& t, int& device) {
  check_input(op, arg, t, device);
  TORCH_CHECK_VALUE(at::has_internal_overlap(t) != at::MemOverlap::Yes, "npu backend: ", op, ": ", arg,
                    " overlaps itself (an expanded view, shape ", t.sizes(), " strides ", t.strides(),
                    "); an output must have one element per memory location");
}

void check_reduce_op(const char* op, const c10d::ReduceOp& reduce_op, at::ScalarType dtype) {
  switch (reduce_op.op_) {
    case c10d::ReduceOp::SUM:
    case c10d::ReduceOp::PRODUCT:
    case c10d::ReduceOp::MIN:
    case c10d::ReduceOp::MAX:
      return;
    case c10d::ReduceOp::AVG:
      TORCH_CHECK_VALUE(at::isFloatingType(dtype), "npu backend: ", op,
                        ": ReduceOp.AVG needs a floating-point tensor, found ", dtype_name(dtype),
                        " (gloo averages floating-point tensors only; reduce with SUM and divide)");
      return;
    case c10d::ReduceOp::PREMUL_SUM:
      TORCH_CHECK_VALUE(at::isFloatingType(dtype), "npu backend: ", op,
                        ": ReduceOp.PREMUL_SUM needs a floating-point tensor, found ", dtype_name(dtype),
                        " (as NCCL's premul sum)");
      TORCH_CHECK_VALUE(reduce_op.supplement_, "npu backend: ", op,
                        ": ReduceOp.PREMUL_SUM has no factor (make it with "
                        "torch.distributed._make_nccl_premul_sum(factor))");
      return;
    case c10d::ReduceOp::BAND:
    case c10d::ReduceOp::BOR:
    case c10d::ReduceOp::BXOR:
      TORCH_CHECK_VALUE(at::isIntegralType(dtype, /*includeBool=*/true), "npu backend: ", op, ": ReduceOp.",
                        reduce_op_name(reduce_op.op_), " needs an integer or bool tensor, found ",
                        dtype_name(dtype));
      return;
    default:
      TORCH_CHECK_VALUE(
          false, "npu backend: ", op, ": ReduceOp.", reduce_op_name(reduce_op.op_),
          " is not supported (supported: SUM, AVG, PRODUCT, MIN, MAX, BAND, BOR, BXOR, PREMUL_SUM)");
  }
}

void check_same_dtype(const char* op, const std::string& arg, const at::Tensor& t, at::ScalarType expected,
                      const std::string& like) {
  TORCH_CHECK_TYPE(t.scalar_type() == expected, "npu backend: ", op, ": ", arg, " must have dtype ",
                   dtype_name(expected), " like ", like, ", found ", dtype_name(t.scalar_type()));
}

void check_numel(const char* op, const std::string& arg, const at::Tensor& t, int64_t expected,
                 const char* why) {
  TORCH_CHECK_VALUE(t.numel() == expected, "npu backend: ", op, ": ", arg, " must have ", expected,
                    " elements (", why, "), found ", t.numel(), " (shape ", t.sizes(), ")");
}

void check_rank(const char* op, const char* arg, int64_t rank, int size) {
  TORCH_CHECK_VALUE(rank >= 0 && rank < size, "npu backend: ", op, ": ", arg, " must be a rank in [0, ", size,
                    "), found ", rank);
}

void check_count(const char* op, const char* arg, size_t found, size_t expected) {
  TORCH_CHECK_VALUE(found == expected, "npu backend: ", op, ": ", arg, " must hold ", expected,
                    " tensor(s), found ", found);
}

}  // namespace npub::dist

// Dispatcher::validate: a call's arguments against the op's schema, before
// any kernel is chosen: every error names the op, the argument, what was
// expected and what was found.
#include "call_state.h"

#include <npubridge/dispatcher/dispatcher.h>
#include <npubridge/support/error.h>

#include <cstring>
#include <string>

namespace npub {

namespace {

[[noreturn]] void bad_arg(const reg::OpEntry& op, const reg::Argument& a, int32_t index,
                          const std::string& what) {
  throw Error(ErrorCode::kInvalidArgument,
              "op '" + op.name() + "', argument '" + a.name + "' (" + std::to_string(index) + "): " + what);
}

}  // namespace

void Dispatcher::validate(CallState& cs) const {
  const reg::OpEntry& op = *cs.op;
  const auto& sargs = op.schema().arguments;
  const auto n = static_cast<int32_t>(sargs.size());
  if (cs.num_args > n || cs.num_args < op.num_required_args() || cs.num_args < 0)
    throw Error(ErrorCode::kInvalidArgument,
                "op '" + op.name() + "': expected " +
                    (op.num_required_args() == n
                         ? std::to_string(n)
                         : std::to_string(op.num_required_args()) + " to " + std::to_string(n)) +
                    " arguments but found " + std::to_string(cs.num_args) +
                    " (schema: " + op.schema().to_string() + ")");
  if (cs.num_rets != static_cast<int32_t>(op.schema().returns.size()))
    throw Error(ErrorCode::kInvalidArgument, "op '" + op.name() + "': expected " +
                                                 std::to_string(op.schema().returns.size()) +
                                                 " return slots but found " + std::to_string(cs.num_rets));
  if (cs.num_args < n) {
    NpubValue* filled = cs.inline_args.data();
    if (static_cast<size_t>(n) > cs.inline_args.size()) {
      cs.heap_args.resize(static_cast<size_t>(n));
      filled = cs.heap_args.data();
    }
    if (cs.num_args > 0) std::memcpy(filled, cs.args, sizeof(NpubValue) * static_cast<size_t>(cs.num_args));
    for (int32_t i = cs.num_args; i < n; ++i) filled[i] = sargs[static_cast<size_t>(i)].default_value->value;
    cs.args = filled;
    cs.num_args = n;
  }

  auto check_tensor = [&](const DLTensor* t, const reg::Argument& a, int32_t index) {
    if (t->ndim < 0 || t->ndim > 64)
      bad_arg(op, a, index,
              "expected a tensor with 0 to 64 dimensions but found ndim " + std::to_string(t->ndim));
    if (t->ndim > 0 && t->shape == nullptr) bad_arg(op, a, index, "tensor has ndim > 0 but a NULL shape");
    const DType dt = dtype_of(t->dtype);
    if (dt == DType::kUnknown) bad_arg(op, a, index, "unsupported dtype " + dtype_name(t->dtype));
    int64_t numel = 1;
    for (int32_t d = 0; d < t->ndim; ++d) {
      const int64_t s = t->shape[d];
      if (s < 0)
        bad_arg(
            op, a, index,
            "expected non-negative sizes but found " + std::to_string(s) + " at dim " + std::to_string(d));
      if (s != 0 && numel > (INT64_MAX / 8) / s) bad_arg(op, a, index, "element count overflows int64");
      numel *= s;
    }
    if (numel > 0 && t->data == nullptr && !cs.meta)
      bad_arg(op, a, index, "tensor has elements but a NULL data pointer");
    const DLDevice dev{t->device.device_type, t->device.device_id};
    if (dev.device_type != NPUB_DEVICE_NPU && dev.device_type != NPUB_DEVICE_CPU)
      bad_arg(op, a, index, "expected a tensor on npu or cpu but found one on " + device_str(dev));
    if (dev.device_type == NPUB_DEVICE_NPU && (dev.device_id < 0 || dev.device_id >= devices_.count()))
      bad_arg(op, a, index,
              "tensor is on " + device_str(dev) + ", which does not exist (" +
                  std::to_string(devices_.count()) + " devices)");
    if (!cs.has_device) {
      cs.device = dev;
      cs.has_device = true;
    } else if (cs.device.device_type != dev.device_type || cs.device.device_id != dev.device_id) {
      throw Error(ErrorCode::kInvalidArgument,
                  "Expected all tensors to be on the same device, but found at least two devices, " +
                      device_str(cs.device) + " and " + device_str(dev) + " (op '" + op.name() +
                      "', argument '" + a.name + "')");
    }
    if (cs.dtype == DType::kUnknown)
      cs.dtype = dt;
    else if (dt != cs.dtype)
      cs.mixed_dtypes = true;
  };

  const auto& accepted = op.accepted();
  for (int32_t i = 0; i < n; ++i) {
    const NpubValue& v = cs.args[i];
    const reg::Argument& a = sargs[static_cast<size_t>(i)];
    if (v.tag < 0 || v.tag > 31 || ((accepted[static_cast<size_t>(i)] >> v.tag) & 1u) == 0)
      bad_arg(op, a, i,
              "expected " + reg::type_to_string(a.type) + " but found " + reg::value_tag_name(v.tag));
    switch (v.tag) {
      case NPUB_VALUE_TENSOR:
        if (v.u.tensor == nullptr) bad_arg(op, a, i, "expected a tensor but found a NULL DLTensor pointer");
        check_tensor(v.u.tensor, a, i);
        break;
      case NPUB_VALUE_TENSOR_LIST:
        if (v.count < 0 || (v.count > 0 && v.u.tensors == nullptr))
          bad_arg(op, a, i, "malformed tensor list");
        for (int32_t k = 0; k < v.count; ++k) {
          if (v.u.tensors[k] == nullptr) {
            if (!a.type.element_optional) bad_arg(op, a, i, "element " + std::to_string(k) + " is NULL");
            continue;
          }
          check_tensor(v.u.tensors[k], a, i);
        }
        break;
      case NPUB_VALUE_INT_LIST:
      case NPUB_VALUE_DOUBLE_LIST:
        if (v.count < 0 || (v.count > 0 && v.u.ints == nullptr)) bad_arg(op, a, i, "malformed list");
        // int[N] with N >= 2 takes N values, one to repeat, or none (the
        // op's default, e.g. stride=[]); int[1] is any length.
        if (a.type.fixed_size > 1 && v.count != a.type.fixed_size && v.count > 1)
          bad_arg(op, a, i,
                  "expected a list of " + std::to_string(a.type.fixed_size) + " values but found " +
                      std::to_string(v.count));
        break;
      case NPUB_VALUE_STRING:
        if (v.u.s == nullptr || v.count < 0) bad_arg(op, a, i, "NULL string");
        break;
      default:
        break;
    }
  }
  const auto& alias = op.return_alias();
  for (int32_t i = 0; i < cs.num_rets; ++i) {
    NpubValue& r = cs.rets[i];
    const int32_t src = alias[static_cast<size_t>(i)];
    if (src >= 0) {
      r = cs.args[src];
      continue;
    }
    if (r.tag == NPUB_VALUE_NONE) continue;
    const reg::Argument& ra = op.schema().returns[static_cast<size_t>(i)];
    if (r.tag != NPUB_VALUE_TENSOR || ra.type.base != reg::BaseType::kTensor || ra.type.list)
      throw Error(ErrorCode::kInvalidArgument,
                  "op '" + op.name() + "', return " + std::to_string(i) +
                      ": expected an empty slot (None) or a preallocated tensor for " +
                      reg::type_to_string(ra.type) + " but found " + reg::value_tag_name(r.tag));
    if (r.u.tensor == nullptr)
      throw Error(ErrorCode::kInvalidArgument,
                  "op '" + op.name() + "', return " + std::to_string(i) + ": NULL tensor");
    reg::Argument as_arg = ra;
    as_arg.name = "return " + std::to_string(i);
    const bool mixed = cs.mixed_dtypes;  // the dtype rules look at arguments only
    check_tensor(r.u.tensor, as_arg, i);
    cs.mixed_dtypes = mixed;
  }
}

}  // namespace npub

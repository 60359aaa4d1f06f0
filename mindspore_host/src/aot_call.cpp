#include "aot_call.h"

#include "binding.h"

#include <npubridge/device_sim/copy_engine.h>
#include <npubridge/dispatcher/runtime.h>
#include <npubridge/dispatcher/tensor.h>
#include <npubridge/dispatcher/value.h>
#include <npubridge/support/dtype.h>
#include <npubridge/support/error.h>
#include <npubridge/support/shape.h>

#include <algorithm>
#include <cstring>
#include <deque>
#include <vector>

namespace npub::ms {

namespace {

[[noreturn]] void bad_call(const Binding& b, const std::string& what) {
  throw Error(ErrorCode::kInvalidArgument, "npubridge.mindspore: op '" + b.op_name + "': " + what);
}

DType dtype_of_param(const Binding& b, const AotParams& p, int i) {
  const DType t = dtype_from_name(p.dtypes[i] == nullptr ? "" : p.dtypes[i]);
  if (t == DType::kUnknown)
    bad_call(b, "tensor " + std::to_string(i) + " has dtype '" + std::string(p.dtypes[i] ? p.dtypes[i] : "") +
                    "', which npubridge does not know");
  return t;
}

std::vector<int64_t> shape_of(const AotParams& p, int i) {
  return std::vector<int64_t>(p.shapes[i], p.shapes[i] + p.ndims[i]);
}

// MindSpore's buffer i as a host tensor of dtype t.
DLTensor host_tensor(const AotParams& p, int i, DType t) {
  DLTensor h{};
  h.data = p.data[i];
  h.device = {kDLCPU, 0};
  h.ndim = p.ndims[i];
  h.shape = p.shapes[i];
  h.dtype = to_dl(t);
  return h;
}

// The value of 0-d input i, as the schema argument's type.
NpubValue scalar_value(const Binding& b, const AotParams& p, int i, const reg::Argument& arg) {
  if (p.ndims[i] != 0)
    bad_call(b, "argument '" + arg.name + "' (input " + std::to_string(i) +
                    ") expected a 0-d tensor, found shape " + shape_str(shape_of(p, i)));
  double v = 0;
  if (p.scalars != nullptr) {
    v = p.scalars[i];
  } else {
    Tensor host = Tensor::empty({}, DType::kFloat64, nullptr);
    sim::copy_tensor(*host.dl(), host_tensor(p, i, dtype_of_param(b, p, i)));
    v = *static_cast<const double*>(host.dl()->data);
  }
  switch (arg.type.base) {
    case reg::BaseType::kInt:
    case reg::BaseType::kScalarType:
      return int_value(static_cast<int64_t>(v));
    case reg::BaseType::kBool:
      return bool_value(v != 0);
    default:
      return double_value(v);
  }
}

// The tensors and values of one call, alive as long as it runs.
class CallArgs {
 public:
  CallArgs(const Binding& b, const AotParams& p, sim::Device& device) : b_(b), p_(p), device_(device) {
    const int nout = p.nparam - b.num_inputs;
    if (nout != static_cast<int>(b.outs.size()))
      bad_call(b, "the custom op passes " + std::to_string(p.nparam) + " tensors and the binding expects " +
                      std::to_string(b.num_inputs) + " inputs and " + std::to_string(b.outs.size()) +
                      " outputs");
    const auto& schema = b.op.op->schema();
    staged_.resize(static_cast<size_t>(p.nparam));
    for (size_t i = 0; i < b.args.size(); ++i) {
      const ArgSource& a = b.args[i];
      switch (a.kind) {
        case ArgSource::Kind::kTensor:
          values_.push_back(tensor_value(tensor(a.index, a.transposed)));
          break;
        case ArgSource::Kind::kOut:
          values_.push_back(tensor_value(tensor(b.num_inputs + a.index, false, /*is_output=*/true)));
          break;
        case ArgSource::Kind::kTensorList: {
          lists_.emplace_back();
          for (int k : a.inputs) lists_.back().push_back(tensor(k, false));
          values_.push_back(tensor_list_value(lists_.back()));
          break;
        }
        case ArgSource::Kind::kShapeOf:
          shapes_.push_back(shape_of(p, a.index));
          values_.push_back(int_list_value(shapes_.back()));
          break;
        case ArgSource::Kind::kScalar:
          values_.push_back(scalar_value(b, p, a.index, schema.arguments[i]));
          break;
        case ArgSource::Kind::kConstant:
          values_.push_back(a.constant);
          break;
      }
    }
  }
  const std::vector<NpubValue>& values() const { return values_; }
  // The device tensor that argument `arg` (element `element` of a list) was after the call.
  const DLTensor* argument(int arg, int element) const {
    const NpubValue& v = values_.at(static_cast<size_t>(arg));
    if (v.tag == NPUB_VALUE_TENSOR && element < 0) return v.u.tensor;
    if (v.tag == NPUB_VALUE_TENSOR_LIST && element >= 0 && element < v.count) return v.u.tensors[element];
    bad_call(b_, "output source a" + std::to_string(arg) +
                     (element >= 0 ? "." + std::to_string(element) : "") +
                     " is not a tensor argument of the call");
  }

 private:
  // Param i on the device: a copy of MindSpore's buffer (an uninitialised
  // tensor for an output), or, for a plan, its metadata alone.
  DLTensor* tensor(int i, bool transposed, bool is_output = false) {
    if (i >= p_.nparam)
      bad_call(b_, "the layout reads tensor " + std::to_string(i) + " of " + std::to_string(p_.nparam));
    Staged& s = staged_[static_cast<size_t>(i)];
    if (!s.made) {
      const std::vector<int64_t> shape = shape_of(p_, i);
      const DType t = dtype_of_param(b_, p_, i);
      if (p_.data == nullptr) {
        s.shape = shape;
        s.meta.ndim = static_cast<int32_t>(shape.size());
        s.meta.shape = s.shape.data();
        s.meta.dtype = to_dl(t);
        s.meta.device = {static_cast<DLDeviceType>(NPUB_DEVICE_NPU), device_.index()};
      } else {
        s.tensor = Tensor::empty(shape, t, &device_);
        if (!is_output) sim::copy_tensor(*s.tensor.dl(), host_tensor(p_, i, t));
      }
      s.made = true;
    }
    if (!transposed) return p_.data == nullptr ? &s.meta : s.tensor.dl();
    if (p_.ndims[i] < 2)
      bad_call(b_, "input " + std::to_string(i) + " is read transposed and has " +
                       std::to_string(p_.ndims[i]) + " dimension(s)");
    views_.emplace_back();
    View& v = views_.back();
    v.shape = shape_of(p_, i);
    v.strides.assign(v.shape.size(), 1);
    for (size_t d = v.shape.size() - 1; d-- > 0;) v.strides[d] = v.strides[d + 1] * v.shape[d + 1];
    std::swap(v.shape[v.shape.size() - 1], v.shape[v.shape.size() - 2]);
    std::swap(v.strides[v.strides.size() - 1], v.strides[v.strides.size() - 2]);
    v.dl = p_.data == nullptr ? s.meta : *s.tensor.dl();
    v.dl.shape = v.shape.data();
    v.dl.strides = v.strides.data();
    return &v.dl;
  }

  struct Staged {
    bool made = false;
    Tensor tensor;
    DLTensor meta{};
    std::vector<int64_t> shape;
  };
  struct View {
    std::vector<int64_t> shape, strides;
    DLTensor dl{};
  };
  const Binding& b_;
  const AotParams& p_;
  sim::Device& device_;
  std::vector<Staged> staged_;
  std::deque<View> views_;                    // stable addresses
  std::deque<std::vector<DLTensor*>> lists_;  // stable addresses
  std::deque<std::vector<int64_t>> shapes_;   // stable addresses
  std::vector<NpubValue> values_;
};

sim::Device& current_device(Runtime& rt) { return rt.devices().at(rt.devices().current_device()); }

}  // namespace

void run_slot(int slot, const AotParams& p) {
  const Binding& b = binding(slot);
  Runtime& rt = Runtime::global();
  CallArgs args(b, p, current_device(rt));
  const auto& schema = b.op.op->schema();
  std::vector<NpubValue> rets(schema.returns.size(), none_value());
  TensorOutputs outputs(rt.devices());
  try {
    rt.dispatcher().call(b.op, args.values().data(), static_cast<int32_t>(args.values().size()), rets.data(),
                         static_cast<int32_t>(rets.size()), &outputs);
  } catch (const Error& e) {
    // Note [The routing decision runs in Python, before the call]: a call
    // reaches here only when a kernel served it at the decision. One that
    // none serves now was decided under other settings.
    const CallPlan plan =
        rt.dispatcher().plan(b.op, args.values().data(), static_cast<int32_t>(args.values().size()));
    if (plan.serves()) throw;
    bad_call(b,
             "no kernel serves this call now (" + plan.fallback_reason +
                 "), and MindSpore's own operator cannot be reached from here: the routing was decided when "
                 "one did. A graph compiled before set_optim_level, auto_convert_dtype or "
                 "npubridge.set_optim_level changed that keeps its routing: compile it again");
  }
  for (size_t j = 0; j < b.outs.size(); ++j) {
    const OutSource& o = b.outs[j];
    const DLTensor* src = nullptr;
    if (o.from_return) {
      const NpubValue& r = rets[static_cast<size_t>(o.index)];
      if (r.tag != NPUB_VALUE_TENSOR || r.u.tensor == nullptr)
        bad_call(b, "return " + std::to_string(o.index) + " is not a tensor");
      src = r.u.tensor;
    } else {
      src = args.argument(o.index, o.element);
    }
    const int i = b.num_inputs + static_cast<int>(j);
    const std::vector<int64_t> want = shape_of(p, i);
    if (std::vector<int64_t>(src->shape, src->shape + src->ndim) != want)
      bad_call(b, "output " + std::to_string(j) + " was declared with shape " + shape_str(want) +
                      " and the op made " + shape_str(src->shape, src->ndim));
    sim::copy_tensor(host_tensor(p, i, dtype_of_param(b, p, i)), *src);
  }
}

bool plan_slot(int slot, const AotParams& p, std::string& plugin, std::string& conversion,
               std::string& reason) {
  const Binding& b = binding(slot);
  Runtime& rt = Runtime::global();
  CallArgs args(b, p, current_device(rt));
  const CallPlan plan =
      rt.dispatcher().plan(b.op, args.values().data(), static_cast<int32_t>(args.values().size()));
  plugin = plan.plugin();
  conversion = plan.conversion();
  reason = plan.fallback_reason;
  return plan.serves();
}

}  // namespace npub::ms

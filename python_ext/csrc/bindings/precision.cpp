// The precision check from npubridge._C (npubridge.precision_check; Note
// [The error model], dispatcher/error_bound.h): switching the dispatcher's
// check on, its mismatches, and the error model's verdict on one result,
// which the OpInfo runner asks for. Includes ATen and
// torch's pybind11 casters for at::Tensor.
#include "bindings/bindings.h"

#include <torch/csrc/utils/pybind.h>

#include <npubridge/dispatcher/runtime.h>
#include <npubridge/torch/error_bound.h>

#include "runtime/npu_runtime.h"

#include <sstream>
#include <string>

namespace py = pybind11;

namespace npub::torch_backend {

void bind_precision(py::module_& m) {
  // The dispatcher's check, as every host has it: each plugin call judged
  // against the fallback's run of the same call (ATen's CPU kernel, reached
  // from the call's values: Note [A reference call runs from its values],
  // aten/fallback.cpp), on the eager and the compiled paths alike.
  m.def("precision_check", [](bool enabled, bool raise_on_mismatch) {
    PrecisionCheckConfig c;
    c.enabled = enabled;
    c.raise_on_mismatch = raise_on_mismatch;
    rt().dispatcher().set_precision_check(c);
    rt().dispatcher().clear_precision_mismatches();
  });
  // The error model's verdict on one result with no op entry (PyTorch-level
  // ops, as the OpInfo runner compares them): host-calibrated against the
  // float64 reference. "" when it matches, else the message with the bound.
  m.def("judge", [](const at::Tensor& got, const at::Tensor& host, const at::Tensor& wide) -> std::string {
    if (!got.sizes().equals(host.sizes()) || got.scalar_type() != host.scalar_type()) {
      std::ostringstream s;
      s << "got " << got.scalar_type() << got.sizes() << ", expected " << host.scalar_type() << host.sizes();
      return s.str();
    }
    if (host.numel() == 0) return "";
    const at::Tensor w = wide.defined() && wide.sizes().equals(host.sizes()) ? wide : at::Tensor();
    const numerics::Verdict v = numerics::judge(numerics::error_model(""), got, host, w, at::Tensor(), 0, 0);
    return v.ok() ? std::string() : v.message();
  });
  m.def("precision_mismatches", [] {
    py::list out;
    for (const auto& mm : rt().dispatcher().precision_mismatches()) {
      py::dict d;
      d["op"] = mm.op;
      d["plugin"] = mm.plugin;
      d["output"] = mm.output;
      d["mismatched"] = mm.num_mismatched;
      d["numel"] = mm.numel;
      d["worst_index"] = mm.worst_index;
      d["kernel_value"] = mm.kernel_value;
      d["reference_value"] = mm.reference_value;
      d["abs_error"] = mm.abs_error;
      d["bound"] = mm.bound;
      d["message"] = mm.message();
      out.append(d);
    }
    return out;
  });
}

}  // namespace npub::torch_backend

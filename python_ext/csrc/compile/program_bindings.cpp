// npubridge._C._compiled_program: builds the C++ execution loop of a lowered
// graph (program.h) from the plan npubridge/_compile/lowering.py makes;
// _C._plan_step: one step's call plan, asked while lowering.
#include <ATen/ScalarOps.h>
#include <torch/csrc/Dtype.h>
#include <torch/csrc/DynamicTypes.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/jit/python/pybind_utils.h>
#include <torch/extension.h>

#include <npubridge/torch/dtype.h>

#include "compile/program.h"
#include "compile/step_call.h"

#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

namespace py = pybind11;

namespace npub::torch_backend {

namespace {

at::ScalarType graph_dtype(const py::handle& obj) {
  TORCH_CHECK(THPDtype_Check(obj.ptr()), "graph program: expected a torch.dtype but found ",
              std::string(py::str(py::type::of(obj))));
  return reinterpret_cast<THPDtype*>(obj.ptr())->scalar_type;
}

SlotSpec slot_spec(const py::dict& d) {
  static const std::map<std::string, SlotSpec::Kind> kinds = {
      {"input", SlotSpec::Kind::kInput},   {"arena", SlotSpec::Kind::kArena},
      {"output", SlotSpec::Kind::kOutput}, {"view", SlotSpec::Kind::kView},
      {"host", SlotSpec::Kind::kHost},     {"constant", SlotSpec::Kind::kConstant}};
  SlotSpec s;
  const auto kind = d["kind"].cast<std::string>();
  const auto it = kinds.find(kind);
  TORCH_CHECK(it != kinds.end(), "graph program: unknown slot kind '", kind, "'");
  s.kind = it->second;
  s.index = d["index"].cast<int64_t>();
  s.dtype = graph_dtype(d["dtype"]);
  s.sizes = d["sizes"].cast<std::vector<int64_t>>();
  s.strides = d["strides"].cast<std::vector<int64_t>>();
  s.offset = d["offset"].cast<int64_t>();
  if (s.kind == SlotSpec::Kind::kConstant) s.constant = d["tensor"].cast<at::Tensor>();
  return s;
}

StepSpec step_spec(const py::dict& d) {
  const auto name = d["op"].cast<std::string>();
  const auto overload = d["overload"].cast<std::string>();
  const auto h = c10::Dispatcher::singleton().findSchema({name, overload});
  TORCH_CHECK(h.has_value(), "graph program: unknown ATen op '", name, ".", overload, "'");
  StepSpec s{d["node"].cast<std::string>(), *h, d["target"].cast<std::string>(),
             d["via_out"].cast<bool>(),     {}, d["outs"].cast<std::vector<int64_t>>()};
  const auto& schema = h->schema().arguments();
  const py::list args = d["args"];
  TORCH_CHECK(args.size() == schema.size(), "graph node '", s.node, "': expected ", schema.size(),
              " arguments (", h->schema(), ") but found ", args.size());
  for (size_t i = 0; i < args.size(); ++i) {
    const py::tuple a = args[i];
    const auto kind = a[0].cast<std::string>();
    ArgSpec arg;
    if (kind == "slot") {
      arg.kind = ArgSpec::Kind::kSlot;
      arg.slot = a[1].cast<int64_t>();
    } else if (kind == "slots") {
      arg.kind = ArgSpec::Kind::kSlots;
      arg.slots = a[1].cast<std::vector<int64_t>>();
    } else {
      arg.kind = ArgSpec::Kind::kValue;
      // A number where the schema takes a Tensor (make_fx records `x * 2`
      // as mul.Tensor(x, 2)): a wrapped number, as the Python argument
      // parser makes it, so type promotion and the bridge treat it alike.
      c10::TypePtr t = schema[i].type();
      if (auto o = t->cast<c10::OptionalType>()) t = o->getElementType();
      const py::handle obj = a[1];
      if (t->kind() == c10::TypeKind::TensorType &&
          (py::isinstance<py::bool_>(obj) || py::isinstance<py::int_>(obj) ||
           py::isinstance<py::float_>(obj))) {
        const at::Scalar sc = py::isinstance<py::bool_>(obj)  ? at::Scalar(obj.cast<bool>())
                              : py::isinstance<py::int_>(obj) ? at::Scalar(obj.cast<int64_t>())
                                                              : at::Scalar(obj.cast<double>());
        at::Tensor w = c10::scalar_to_tensor(sc);
        w.unsafeGetTensorImpl()->set_wrapped_number(true);
        arg.value = w;
        s.args.push_back(std::move(arg));
        continue;
      }
      try {
        arg.value = torch::jit::toIValue(a[1], schema[i].type());
      } catch (const std::exception& e) {
        TORCH_CHECK(false, "graph node '", s.node, "', argument '", schema[i].name(), "': ", e.what());
      }
    }
    s.args.push_back(std::move(arg));
  }
  return s;
}

// A Python exception raised under a run (a __torch_dispatch__ mode's: under
// AOTAutograd's runtime wrapper, a host step's ATen CPU kernel raises
// through it, e.g. RuntimeError("ZeroDivisionError") for an integer
// division by zero) reaches here as python_error, whose what() is empty:
// pybind11 made it a RuntimeError with an empty message. It is raised again
// with its own type, its message prefixed with the graph node that failed,
// and the original as its __cause__.
template <typename F>
std::vector<at::Tensor> naming_the_step(F&& run) {
  try {
    return run();
  } catch (python_error& e) {
    e.restore();
    py::error_already_set original;
    const std::string where = Program::failed_step();
    const py::object value = original.value();
    const std::string message = py::str(value);
    if (where.empty() || message.rfind("graph node '", 0) == 0) throw original;
    py::object renamed;
    try {
      renamed = original.type()(where + ": " + message);
    } catch (const py::error_already_set&) {
      throw original;  // an exception type that takes no message
    }
    PyException_SetCause(renamed.ptr(), value.inc_ref().ptr());
    PyErr_SetObject(original.type().ptr(), renamed.ptr());
    throw py::error_already_set();
  }
}

}  // namespace

void bind_compiled_program(py::module& m) {
  py::class_<Program, std::shared_ptr<Program>>(m, "_CompiledProgram")
      .def("run",
           [](Program& p, std::vector<at::Tensor> inputs) {
             return naming_the_step([&] {
               py::gil_scoped_release nogil;
               return p.run(std::move(inputs));
             });
           })
      // AOTAutograd's boxed convention: the list is emptied, so that the
      // loop holds the only references and can drop each input after its
      // last use.
      .def("run_boxed",
           [](Program& p, py::list args) {
             auto inputs = args.cast<std::vector<at::Tensor>>();
             args.attr("clear")();
             return naming_the_step([&] {
               py::gil_scoped_release nogil;
               return p.run(std::move(inputs));
             });
           })
      .def("set_input_last_use", &Program::set_input_last_use)
      .def("info",
           [](const Program& p) {
             py::list out;
             for (const StepInfo& i : p.info()) {
               py::dict d;
               d["node"] = i.node;
               d["kind"] = i.kind;
               d["plugin"] = i.plugin;
               d["kernel_op"] = i.kernel_op;
               d["conversion"] = i.conversion;
               d["reason"] = i.reason;
               out.append(d);
             }
             return out;
           })
      .def_property_readonly("arena_bytes", &Program::arena_bytes);
  m.def("_compiled_program", [](int device, const py::list& slots, int64_t arena_bytes, const py::list& steps,
                                const std::vector<int64_t>& outputs, bool keep_arena) {
    std::vector<SlotSpec> sl;
    for (const auto& s : slots) sl.push_back(slot_spec(s.cast<py::dict>()));
    std::vector<StepSpec> st;
    for (const auto& s : steps) st.push_back(step_spec(s.cast<py::dict>()));
    return std::make_shared<Program>(device, std::move(sl), arena_bytes, std::move(st), outputs, keep_arena);
  });
  // One step's plan from the slots it names (Note [A plan's returns are its
  // kernel's]): the lowering sizes a kernel's buffers from its returns.
  m.def("_plan_step", [](int device, const py::dict& slots, const py::dict& step) {
    std::unordered_map<int64_t, SlotSpec> sl;
    for (const auto& [k, v] : slots) sl.emplace(k.cast<int64_t>(), slot_spec(v.cast<py::dict>()));
    const CallPlan plan = plan_step(device, sl, step_spec(step));
    py::list returns;
    for (const OutputMeta& r : plan.returns) {
      if (!r.set) {
        returns.append(py::none());
        continue;
      }
      py::object dtype = py::reinterpret_borrow<py::object>(
          reinterpret_cast<PyObject*>(torch::getTHPDtype(torch_dtype(r.dtype))));
      returns.append(py::make_tuple(r.shape, dtype));
    }
    py::dict out;
    out["plugin"] = plan.plugin();
    out["reason"] = plan.fallback_reason;
    out["conversion"] = plan.conversion();
    out["returns"] = returns;
    return out;
  });
}

}  // namespace npub::torch_backend

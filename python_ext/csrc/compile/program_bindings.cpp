// npubridge._C._compiled_program: builds the C++ execution loop of a lowered
// graph (program.h) from the slots and steps npubridge/_compile/lowering.py
// makes (_C._SlotSpec, _C._StepSpec); _C._plan_step: one step's call plan
// (_C._StepPlan), asked while lowering.
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
#include <optional>
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

const std::map<std::string, SlotSpec::Kind>& slot_kinds() {
  static const std::map<std::string, SlotSpec::Kind> kinds = {
      {"input", SlotSpec::Kind::kInput},   {"arena", SlotSpec::Kind::kArena},
      {"output", SlotSpec::Kind::kOutput}, {"view", SlotSpec::Kind::kView},
      {"host", SlotSpec::Kind::kHost},     {"constant", SlotSpec::Kind::kConstant}};
  return kinds;
}

SlotSpec::Kind slot_kind(const std::string& kind) {
  const auto it = slot_kinds().find(kind);
  TORCH_CHECK(it != slot_kinds().end(), "graph program: unknown slot kind '", kind, "'");
  return it->second;
}

std::string slot_kind_name(SlotSpec::Kind kind) {
  for (const auto& [name, k] : slot_kinds())
    if (k == kind) return name;
  return "?";
}

py::object py_dtype(at::ScalarType t) {
  return py::reinterpret_borrow<py::object>(reinterpret_cast<PyObject*>(torch::getTHPDtype(t)));
}

// A step from the lowering's description: the ATen op `name`.`overload` of
// FX node `node`, its arguments in schema order (("slot", k), ("slots",
// [k, ...]) or ("value", v)) and its return slots. Numbers and lists are
// read by the schema's types here, so a bad one names the node when the
// lowering makes the step.
StepSpec make_step(const std::string& node, const std::string& name, const std::string& overload,
                   const std::string& target, bool via_out, const py::list& args, std::vector<int64_t> outs) {
  const auto h = c10::Dispatcher::singleton().findSchema({name, overload});
  TORCH_CHECK(h.has_value(), "graph program: unknown ATen op '", name, ".", overload, "'");
  StepSpec s{node, *h, target, via_out, {}, std::move(outs)};
  const auto& schema = h->schema().arguments();
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
      TORCH_CHECK(kind == "value", "graph node '", s.node, "', argument '", schema[i].name(),
                  "': unknown kind '", kind, "' (expected slot, slots or value)");
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

// What _plan_step answers: the step's plan as the lowering reads it.
struct StepPlan {
  std::string plugin;      // "" when the fallback serves the step
  std::string reason;      // why the fallback serves it
  std::string conversion;  // "float16->float32", or ""
  py::list returns;        // per return: (shape, torch.dtype), or None where the plan cannot say
};

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
  // The lowering's slots (npubridge/_compile/lowering.py), typed: its memory
  // plan sets an arena slot's offset in the arena (`index`) and `offset`.
  py::class_<SlotSpec>(m, "_SlotSpec")
      .def(py::init([](const std::string& kind, int64_t index, const py::handle& dtype,
                       std::vector<int64_t> sizes, std::vector<int64_t> strides, int64_t offset,
                       std::optional<at::Tensor> tensor) {
             SlotSpec s;
             s.kind = slot_kind(kind);
             s.index = index;
             s.dtype = graph_dtype(dtype);
             s.sizes = std::move(sizes);
             s.strides = std::move(strides);
             s.offset = offset;
             TORCH_CHECK(s.kind != SlotSpec::Kind::kConstant || (tensor && tensor->defined()),
                         "graph program: a constant slot needs its tensor");
             if (tensor) s.constant = *tensor;
             return s;
           }),
           py::arg("kind"), py::arg("index"), py::arg("dtype"), py::arg("sizes"), py::arg("strides"),
           py::arg("offset"), py::arg("tensor") = py::none())
      .def_property(
          "kind", [](const SlotSpec& s) { return slot_kind_name(s.kind); },
          [](SlotSpec& s, const std::string& kind) { s.kind = slot_kind(kind); })
      .def_readwrite("index", &SlotSpec::index)
      .def_property(
          "dtype", [](const SlotSpec& s) { return py_dtype(s.dtype); },
          [](SlotSpec& s, const py::handle& dtype) { s.dtype = graph_dtype(dtype); })
      .def_readonly("sizes", &SlotSpec::sizes)
      .def_readonly("strides", &SlotSpec::strides)
      .def_readwrite("offset", &SlotSpec::offset)
      .def_property_readonly("tensor", [](const SlotSpec& s) -> std::optional<at::Tensor> {
        if (!s.constant.defined()) return std::nullopt;
        return s.constant;
      });
  py::class_<StepSpec, std::shared_ptr<StepSpec>>(m, "_StepSpec")
      .def(py::init([](const std::string& node, const std::string& op, const std::string& overload,
                       const std::string& target, bool via_out, const py::list& args,
                       std::vector<int64_t> outs) {
             return std::make_shared<StepSpec>(
                 make_step(node, op, overload, target, via_out, args, std::move(outs)));
           }),
           py::arg("node"), py::arg("op"), py::arg("overload"), py::arg("target"), py::arg("via_out"),
           py::arg("args"), py::arg("outs"))
      .def_readonly("node", &StepSpec::node)
      .def_readonly("target", &StepSpec::target)
      .def_readonly("via_out", &StepSpec::via_out)
      .def_readonly("outs", &StepSpec::outs);
  py::class_<StepPlan>(m, "_StepPlan")
      .def_readonly("plugin", &StepPlan::plugin)
      .def_readonly("reason", &StepPlan::reason)
      .def_readonly("conversion", &StepPlan::conversion)
      .def_readonly("returns", &StepPlan::returns);
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
  m.def("_compiled_program", [](int device, std::vector<SlotSpec> slots, int64_t arena_bytes,
                                const std::vector<std::shared_ptr<StepSpec>>& steps,
                                const std::vector<int64_t>& outputs, bool keep_arena) {
    std::vector<StepSpec> st;
    st.reserve(steps.size());
    for (const auto& s : steps) st.push_back(*s);
    return std::make_shared<Program>(device, std::move(slots), arena_bytes, std::move(st), outputs,
                                     keep_arena);
  });
  // One step's plan from the slots it names (Note [A plan's returns are its
  // kernel's]): the lowering sizes a kernel's buffers from its returns.
  m.def("_plan_step",
        [](int device, const std::unordered_map<int64_t, SlotSpec>& slots, const StepSpec& step) {
          const CallPlan plan = plan_step(device, slots, step);
          StepPlan out;
          for (const OutputMeta& r : plan.returns)
            out.returns.append(r.set ? py::object(py::make_tuple(r.shape, py_dtype(torch_dtype(r.dtype))))
                                     : py::none());
          out.plugin = plan.plugin();
          out.reason = plan.fallback_reason;
          out.conversion = plan.conversion();
          return out;
        });
}

}  // namespace npub::torch_backend

// The Python module npubridge._C: the backend's start-up, the devices,
// streams, events and memory stats, the plugins, the dispatcher's
// statistics and settings, the precision check and the registry's ops, for
// the npubridge package. The only file of npubridge._C that includes
// <torch/extension.h>.
#include <torch/csrc/Event.h>
#include <torch/extension.h>

#include <npubridge/dispatcher/runtime.h>
#include <npubridge/plugin_api.h>
#include <npubridge/registry/schema.h>
#include <npubridge/support/error.h>
#include <npubridge/torch/error_bound.h>

#include "aten/fallback.h"
#include "aten/mapped_ops.h"
#include "aten/precision_check.h"
#include "aten/register_plugin_ops.h"
#include "aten/routes.h"
#include "init.h"
#include "runtime/generator.h"
#include "runtime/npu_runtime.h"

#include <cstdint>
#include <map>
#include <sstream>
#include <string>

// ---------------------------------------------------------------------------
// Python module npubridge._C
// ---------------------------------------------------------------------------

namespace py = pybind11;
using namespace npub;
using npub::torch_backend::rt;

namespace npub::torch_backend {
void bind_fusion_patterns(py::module& m);  // graph/fusion_pattern_bindings.cpp
void bind_graph(py::module& m);            // graph/graph_bindings.cpp
void bind_npu_graph(py::module& m);        // runtime/npu_graph_bindings.cpp
}  // namespace npub::torch_backend

namespace {

// Runs `f`, turning c10's error into a RuntimeError with the message alone
// (pybind11 would show c10's C++ backtrace too).
template <class F>
auto message_only_errors(F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const c10::Error& e) {
    throw std::runtime_error(e.what_without_backtrace());
  }
}

}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "npubridge: PyTorch on the simulated NPU through acceleration-library plugins";
  // Note [The runtime starts at the first npu use] (init.cpp).
  m.def("_register_backend", &npub::torch_backend::register_backend);
  m.def("_set_start_hook", [](py::function hook) {
    // Kept for the process's life (the runtime never stops).
    auto* held = new py::function(std::move(hook));
    npub::torch_backend::set_python_start_hook([held] { (*held)(); });
  });
  m.def("_start", [] { message_only_errors(npub::torch_backend::ensure_started); });
  m.def("_is_started", &npub::torch_backend::runtime_started);
  npub::torch_backend::bind_graph(m);
  npub::torch_backend::bind_npu_graph(m);
  // The npu's DLPack device type (npubridge/_dlpack.py).
  m.attr("DLPACK_DEVICE_TYPE") = static_cast<int>(NPUB_DEVICE_NPU);
  // Note [A forked child cannot use the npu] (device_sim/src/fork_guard.cpp):
  // torch.npu._is_in_bad_fork() and the error torch.npu._lazy_init() raises.
  m.def("_is_in_bad_fork", [] {
    return npub::torch_backend::runtime_started() && Runtime::global().devices().in_forked_child();
  });
  m.def("_check_not_in_bad_fork", [] {
    if (npub::torch_backend::runtime_started() && Runtime::global().devices().in_forked_child())
      sim::throw_forked_child("torch.npu");
  });
  // Does not start the runtime (torch.npu.device_count/is_available before
  // the first npu use); raises the start's error naming the variable for a
  // bad setting.
  m.def("device_count", [] { return message_only_errors(npub::torch_backend::device_count_now); });
  m.def("current_device", [] { return rt().devices().current_device(); });
  m.def("set_device", [](int d) { rt().devices().set_current_device(d); });
  m.def("synchronize", [](int d) {
    auto& ds = rt().devices();
    // Without the GIL, as stream_synchronize: a queued task may wait for a
    // thread that needs it (the npu backend's completer releasing a finished
    // collective's tensors; Note [The engine's threads are joined without
    // the GIL], distributed/collective_engine.cpp).
    py::gil_scoped_release nogil;
    if (d < 0)
      for (int i = 0; i < ds.count(); ++i) ds.at(i).synchronize();
    else
      ds.at(d).synchronize();
  });
  m.def("manual_seed", [](int d, uint64_t seed) { rt().devices().at(d).manual_seed(seed); });
  // torch.npu.default_generators[d]: the device's own generator as a
  // torch.Generator (the state manual_seed and get_rng_state see).
  m.def("default_generator",
        [](int d) { return npub::torch_backend::default_generator(static_cast<c10::DeviceIndex>(d)); });
  m.def("get_rng_state", [](int d) {
    const auto s = rt().devices().at(d).philox_state();
    return py::make_tuple(s.seed, s.offset);
  });
  m.def("set_rng_state", [](int d, uint64_t seed, uint64_t offset) {
    rt().devices().at(d).set_philox_state({seed, offset});
  });
  // Streams, by id within their device.
  // torch.npu.Stream() draws from the pool torch.Stream(device="npu") uses.
  m.def("stream_new", [](int d) { return rt().devices().at(d).pooled_stream().id(); });
  m.def("stream_synchronize", [](int d, int id) {
    py::gil_scoped_release nogil;
    rt().devices().at(d).stream(id).synchronize();
  });
  m.def("stream_query", [](int d, int id) { return rt().devices().at(d).stream(id).query(); });
  m.def("set_current_stream", [](int d, int id) {
    auto& dev = rt().devices().at(d);
    dev.set_current_stream(dev.stream(id));
  });
  m.def("current_stream", [](int d) { return rt().devices().at(d).current_stream().id(); });
  // torch.npu.Event.elapsed_time: torch.Event's own refuses a subclass
  // (it compares the exact type), so torch.npu.Event, a torch.Event, times
  // its c10::Event here; the events themselves are the device guard's
  // (runtime/guard.cpp).
  m.def("event_elapsed_ms", [](py::handle start, py::handle end) {
    for (py::handle e : {start, end}) {
      if (!THPEvent_Check(e.ptr())) {
        throw py::type_error(std::string("torch.npu.Event.elapsed_time: expected a torch.Event but found ") +
                             Py_TYPE(e.ptr())->tp_name);
      }
    }
    return reinterpret_cast<THPEvent*>(start.ptr())
        ->event.elapsedTime(reinterpret_cast<THPEvent*>(end.ptr())->event);
  });
  m.def("memory_stats", [](int d) {
    const auto s = rt().devices().at(d).allocator().stats();
    py::dict r;
    r["allocated_bytes"] = s.allocated_bytes;
    r["reserved_bytes"] = s.reserved_bytes;
    r["peak_allocated_bytes"] = s.peak_allocated_bytes;
    r["peak_reserved_bytes"] = s.peak_reserved_bytes;
    r["num_allocs"] = s.num_allocs;
    r["num_frees"] = s.num_frees;
    r["num_ooms"] = s.num_ooms;
    return r;
  });
  // torch.npu.get_device_properties: the simulated device's name, its
  // capacity (NPUB_SIM_MEMORY), its compute threads (NPUB_SIM_THREADS, as a
  // GPU's multiprocessors) and, as its "compute capability", the plugin ABI
  // version it runs kernels of (what a kernel may rely on, as sm_80 for CUDA).
  m.def("device_properties", [](int d) {
    auto& dev = rt().devices().at(d);
    py::dict r;
    r["name"] = "npubridge simulated NPU";
    r["total_memory"] = dev.allocator().capacity();
    r["multi_processor_count"] = dev.compute().num_threads();
    r["major"] = NPUB_ABI_MAJOR;
    r["minor"] = NPUB_ABI_MINOR;
    return r;
  });
  // Note [The memory fraction limits reserved memory]
  // (device_sim/include/npubridge/device_sim/caching_allocator.h).
  m.def("set_memory_fraction", [](int d, double fraction) {
    try {
      rt().devices().at(d).allocator().set_memory_fraction(fraction);
    } catch (const Error& e) {
      throw py::value_error(e.what());
    }
  });
  m.def("memory_fraction", [](int d) { return rt().devices().at(d).allocator().memory_fraction(); });
  // torch.npu.memory_snapshot(): the caching allocator's segments and
  // blocks, with torch.cuda.memory_snapshot()'s keys.
  m.def("memory_snapshot", [](int d) {
    py::list out;
    for (const sim::SegmentSnapshot& seg : rt().devices().at(d).allocator().snapshot()) {
      py::dict r;
      r["device"] = d;
      r["address"] = seg.address;
      r["total_size"] = seg.size;
      r["allocated_size"] = seg.allocated;
      r["active_size"] = seg.allocated;
      r["requested_size"] = seg.requested;
      // The allocator keys blocks by the stream they were allocated on (a
      // sim::Stream of this device, which lives as long as the device).
      r["stream"] = seg.stream != nullptr ? static_cast<const sim::Stream*>(seg.stream)->id() : 0;
      r["segment_type"] = seg.small ? "small" : "large";
      py::list blocks;
      for (const sim::BlockSnapshot& b : seg.blocks) {
        py::dict block;
        block["address"] = b.address;
        block["size"] = b.size;
        block["requested_size"] = b.requested;
        block["state"] = b.allocated ? "active_allocated" : "inactive";
        blocks.append(block);
      }
      r["blocks"] = blocks;
      out.append(r);
    }
    return out;
  });
  m.def("empty_cache", [] {
    auto& ds = rt().devices();
    for (int i = 0; i < ds.count(); ++i) ds.at(i).allocator().empty_cache();
  });
  m.def("reset_peak_memory_stats", [](int d) { rt().devices().at(d).allocator().reset_peak_stats(); });
  m.def("plugins", [] {
    py::list out;
    for (const auto& p : rt().loader().plugins()) {
      int ops = 0;
      for (const reg::OpEntry* e : rt().registry().ops())
        for (const reg::Kernel* k : e->kernels(NPUB_DEVICE_NPU))
          if (k->plugin.get() == p.get()) {
            ++ops;
            break;
          }
      py::dict d;
      d["name"] = p->name;
      d["version"] = p->version;
      d["path"] = p->path;
      d["abi"] = "1." + std::to_string(p->abi_minor);
      d["ops"] = ops;
      d["enabled"] = p->enabled.load();
      out.append(d);
    }
    return out;
  });
  // Whether the plugin named `name` is loaded and enabled (None: not
  // loaded): what SDPA's backend choice asks on every call, without
  // plugins()'s count of each plugin's ops (70 us).
  m.def("plugin_enabled", [](const std::string& name) -> py::object {
    for (const auto& p : rt().loader().plugins())
      if (p->name == name) return py::bool_(p->enabled.load());
    return py::none();
  });
  m.def("load_failures", [] {
    py::list out;
    for (const auto& f : rt().loader().failures()) out.append(f.error);
    return out;
  });
  // Libraries of a scanned directory that are not plugins (Note [A directory
  // may hold libraries that are not plugins], plugin_loader.h).
  m.def("load_skipped", [] {
    py::list out;
    for (const auto& f : rt().loader().skipped()) out.append(f.error);
    return out;
  });
  m.def("stats", [] {
    py::dict out;
    for (const auto& s : rt().dispatcher().stats()) {
      py::dict d;
      d["calls"] = s.calls;
      d["fallbacks"] = s.fallbacks;
      d["conversions"] = s.conversions;
      d["errors"] = s.errors;
      d["precision_mismatches"] = s.precision_mismatches;
      d["time_ms"] = s.total_ms;
      std::map<std::string, int64_t> calls_by_plugin;  // a plugin may have several kernels for the op
      py::list kernels;
      for (const auto& k : s.kernels) {
        if (k.calls > 0) calls_by_plugin[k.plugin] += k.calls;
        py::dict kd;
        kd["plugin"] = k.plugin;
        kd["dtypes"] = k.dtypes;
        kd["priority"] = k.priority;
        kd["calls"] = k.calls;
        kernels.append(kd);
      }
      py::dict by_plugin;
      for (const auto& [plugin, calls] : calls_by_plugin) by_plugin[py::str(plugin)] = calls;
      d["native"] = by_plugin;
      d["kernels"] = kernels;
      out[py::str(s.op)] = d;
    }
    return out;
  });
  // Per registry op, the reason of its latest fallback (a kernel's decline
  // message, or why no kernel was eligible).
  m.def("fallback_reasons", [] { return npub::torch_backend::last_fallback_reasons(); });
  m.def("reset_stats", [] { rt().dispatcher().reset_stats(); });
  m.def("set_optim_level", [](int level) { rt().dispatcher().set_opt_level(level); });
  m.def("optim_level", [] { return rt().dispatcher().opt_level(); });
  m.def("enable_plugin", [](const std::string& name, bool on) {
    auto p = rt().loader().plugin(name);
    if (!p) throw py::value_error("no plugin named '" + name + "' is loaded");
    p->enabled = on;
  });
  m.def("register_op",
        [](const std::string& framework_op, const std::string& target_op, const std::string& plugin) {
          try {
            npub::torch_backend::map_op({framework_op, target_op, plugin});
          } catch (const Error& e) {
            throw py::value_error(e.what());
          }
        });
  m.def("unregister_op", [](const std::string& framework_op) {
    if (!npub::torch_backend::unmap_op(framework_op))
      throw py::value_error("cannot unmap '" + framework_op + "': the op-mapping table does not map it");
  });
  m.def("op_map", [] {
    py::list out;
    for (const reg::OpMapping& e : rt().op_map().entries())
      out.append(py::make_tuple(e.framework_op, e.target_op, e.plugin));
    return out;
  });
  // The extension checks at the torch level (every routed call against
  // ATen's CPU kernel on copies of its inputs); the dispatcher's own check,
  // which needs a fallback that computes on given arguments, stays off and
  // only holds the tolerances and the report.
  m.def("precision_check", [](bool enabled, bool raise_on_mismatch) {
    PrecisionCheckConfig c;
    c.enabled = false;
    c.raise_on_mismatch = raise_on_mismatch;
    rt().dispatcher().set_precision_check(c);
    rt().dispatcher().clear_precision_mismatches();
    npub::torch_backend::g_precision_on = enabled;
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
  // Derivative formulas plugins declared (NpubHostApi.define_derivative),
  // for the package to register with torch.library.register_autograd.
  m.def("derivatives", [] {
    py::list out;
    for (const reg::OpEntry* e : rt().registry().ops()) {
      const reg::Derivative* d = e->derivative();
      if (d == nullptr || e->kernels(NPUB_DEVICE_NPU).empty()) continue;
      py::dict r;
      r["op"] = e->name();
      r["backward"] = d->backward;
      r["formula"] = d->formula;
      r["plugin"] = d->plugin;
      py::list inputs, args;
      for (int32_t i : d->inputs) inputs.append(i);
      for (const auto& a : d->args)
        args.append(py::make_tuple(a.kind == reg::Derivative::Arg::kGrad     ? "grad"
                                   : a.kind == reg::Derivative::Arg::kResult ? "result"
                                                                             : "input",
                                   a.index));
      r["inputs"] = inputs;
      r["args"] = args;
      out.append(r);
    }
    return out;
  });
  // The route table (aten/routes.h), typed: what the lowering and
  // npubridge.routed_ops() read.
  {
    using npub::torch_backend::RouteEntry;
    py::class_<RouteEntry>(m, "Route")
        .def_readonly("op", &RouteEntry::op)
        .def_property_readonly("kind",
                               [](const RouteEntry& e) { return npub::torch_backend::route_name(e.route); })
        .def_readonly("target", &RouteEntry::target)
        .def_property_readonly(
            "origin", [](const RouteEntry& e) { return npub::torch_backend::route_origin_name(e.origin); })
        .def("__repr__", [](const RouteEntry& e) {
          return "Route(" + e.op + " -> " + e.target + ", " + npub::torch_backend::route_name(e.route) +
                 ", " + npub::torch_backend::route_origin_name(e.origin) + ")";
        });
    m.def("routes", &npub::torch_backend::routes);
  }
  // npubridge's schema parser, for the tests that hold it against PyTorch's
  // (Note [Defaults PyTorch takes], registry/src/schema.cpp): the canonical
  // text, or ValueError with the parser's message.
  m.def("parse_schema", [](const std::string& text) {
    try {
      return reg::parse_schema(text).to_string();
    } catch (const reg::SchemaError& e) {
      throw py::value_error(e.what());
    }
  });
  m.def("ops", [](const std::string& plugin) {
    py::list out;
    for (const reg::OpEntry* e : rt().registry().ops()) {
      for (const reg::Kernel* k : e->kernels(NPUB_DEVICE_NPU)) {
        if (!plugin.empty() && k->plugin_name() != plugin) continue;
        py::dict d;
        d["op"] = e->name();
        d["plugin"] = k->plugin_name();
        d["dtypes"] = k->dtypes_string();
        d["priority"] = k->priority;
        d["schema"] = e->schema().to_string();
        out.append(d);
      }
    }
    return out;
  });
  npub::torch_backend::bind_fusion_patterns(m);
}

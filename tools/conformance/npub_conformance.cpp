// npub-conformance: runs every kernel of a plugin on the simulated NPU and the
// same op in ATen on the CPU, over the samples of tools/conformance/samples/
// (one file per op family), and writes a coverage report (op x dtype x
// plugin: pass, fail with the worst error, or not covered).
//
//   npub-conformance --plugin lib/npubridge/plugins/libnpub_cann_like.so
//       [--plugin ...] [--all] [--op REGEX] [--md report.md] [--json report.json] [--seed S]
//
// Exits non-zero on any failure, and when nothing was covered (every op x
// dtype pair "not covered": an out-of-tree plugin's own ops have no sample
// specification here), saying why.
#include "conformance.h"

#include "cells.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <torch/version.h>

#include <npubridge/device_sim/copy_engine.h>
#include <npubridge/dispatcher/runtime.h>
#include <npubridge/dispatcher/value.h>
#include <npubridge/registry/schema.h>
#include <npubridge/support/error.h>
#include <npubridge/torch/boxing.h>
#include <npubridge/torch/dl_view.h>
#include <npubridge/torch/dtype.h>
#include <npubridge/torch/error_bound.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <memory>
#include <regex>
#include <set>
#include <sstream>
#include <tuple>

#include <csignal>

namespace npub::conformance {
namespace {

// ---------------------------------------------------------------------------
// torch <-> npub
// ---------------------------------------------------------------------------

// The DType of a sample's tensor; samples use only dtypes npubridge carries.
DType checked_dtype(at::ScalarType t) {
  const DType d = npub_dtype(t);
  if (d == DType::kUnknown)
    throw std::runtime_error(std::string("unsupported torch dtype ") + c10::toString(t));
  return d;
}

// A DLTensor view of a CPU torch tensor (valid while the tensor lives).
DLTensor cpu_view(const at::Tensor& t) {
  (void)checked_dtype(t.scalar_type());
  return dl_view(t, DLDevice{kDLCPU, 0});
}

// A device copy of `t` with the same sizes and strides (non-contiguous
// samples stay non-contiguous on the device).
Tensor to_device(const at::Tensor& t, sim::Device* dev) {
  int64_t span = t.numel() == 0 ? 0 : 1;
  if (t.numel() > 0)
    for (int64_t d = 0; d < t.dim(); ++d) span += (t.size(d) - 1) * t.stride(d);
  Tensor base = Tensor::empty({span}, checked_dtype(t.scalar_type()), dev);
  Tensor view = base.as_strided(t.sizes().vec(), t.strides().vec(), 0);
  if (t.numel() > 0) sim::copy_tensor(*view.dl(), cpu_view(t));
  return view;
}

at::Tensor to_torch(const DLTensor& d) {
  at::Tensor t = at::empty(std::vector<int64_t>(d.shape, d.shape + d.ndim),
                           at::TensorOptions().dtype(torch_dtype(dtype_of(d.dtype))));
  if (t.numel() > 0) {
    DLTensor dst = cpu_view(t);
    sim::copy_tensor(dst, d);
  }
  return t;
}

// Boxed arguments for the npu call, with the storage they point into.
struct NpuArgs {
  std::vector<NpubValue> values;
  std::vector<Tensor> tensors;
  BoxedStorage storage;
};

// Tensors are copied to the device (same sizes and strides).
NpubValue box(const c10::IValue& v, NpuArgs& a, sim::Device* dev) {
  return box_ivalue(v, a.storage, [&](const at::Tensor& t) {
    a.tensors.push_back(to_device(t, dev));
    return a.tensors.back().dl();
  });
}

// ---------------------------------------------------------------------------
// the references (Note [The error model] in error_bound.h)
// ---------------------------------------------------------------------------

struct Outcome {
  bool pass = false;
  bool declined = false;  // the kernel declined a sample ATen computes: the host's fallback's, not judged
  std::string message;
  double worst = 0;
};

std::pair<std::string, std::string> split_name(const std::string& qualified) {
  const auto dot = qualified.find('.', qualified.find("::"));
  if (dot == std::string::npos) return {qualified, ""};
  return {qualified.substr(0, dot), qualified.substr(dot + 1)};
}

using numerics::Precision;

// ATen's results for the sample: per return, or per written argument (in
// place and out=), in the order the npu run's outputs are collected.
struct Reference {
  std::vector<at::Tensor> outputs;
  std::vector<c10::IValue> args;  // after the call (written arguments resized)
  std::string error;              // what ATen raised, if it did
  bool index_error = false;       // ... as c10::IndexError (Python's IndexError)
};

Reference reference(const reg::OpEntry& op, const Sample& sample, Precision p,
                    at::ScalarType compute = at::ScalarType::Undefined) {
  const auto& schema = op.schema();
  Reference r;
  for (size_t i = 0; i < sample.args.size(); ++i)
    r.args.push_back(numerics::reference_input(
        sample.args[i],
        i < schema.arguments.size() && schema.arguments[i].type.base == reg::BaseType::kScalarType,
        i < schema.arguments.size() && schema.arguments[i].type.base == reg::BaseType::kScalar, p, compute));
  try {
    auto lib = reference_library().find(op.name());
    if (lib != reference_library().end()) {
      r.outputs = lib->second(r.args);
      return r;
    }
    auto [name, overload] = split_name(op.name());
    auto handle = c10::Dispatcher::singleton().findSchemaOrThrow(name.c_str(), overload.c_str());
    torch::jit::Stack stack(r.args.begin(), r.args.end());
    handle.callBoxed(&stack);
    const auto& alias = op.return_alias();
    if (alias.empty() || std::all_of(alias.begin(), alias.end(), [](int32_t a) { return a < 0; })) {
      for (const auto& v : stack) {
        if (v.isTensor() && !v.toTensor().defined()) continue;  // an output_mask'ed return
        if (v.isTensor())
          r.outputs.push_back(v.toTensor());
        else if (v.isTensorList())
          for (const auto& t : v.toTensorVector()) r.outputs.push_back(t);
      }
    }
    for (size_t i = 0; i < schema.arguments.size(); ++i)
      if (schema.arguments[i].is_write() && r.args[i].isTensor())
        r.outputs.push_back(r.args[i].toTensor());
      else if (schema.arguments[i].is_write() && r.args[i].isTensorList())
        for (const at::Tensor& t : r.args[i].toTensorVector()) r.outputs.push_back(t);
  } catch (const c10::IndexError& e) {
    r.error = e.what();
    r.index_error = true;
    r.outputs.clear();
  } catch (const std::exception& e) {
    r.error = e.what();
    r.outputs.clear();
  }
  return r;
}

// "" when `got` matches under the op's error model, else what differs.
std::string judge(const at::Tensor& got, size_t index, const Reference& same, const Reference* wide,
                  const Reference* magnitude, const numerics::ErrorModel& model, const reg::OpEntry& op,
                  const NpuArgs& args, double* worst) {
  const at::Tensor& want = same.outputs[index];
  if (got.scalar_type() != want.scalar_type())
    return std::string("dtype ") + c10::toString(got.scalar_type()) + ", expected " +
           c10::toString(want.scalar_type());
  if (!got.sizes().equals(want.sizes())) {
    std::ostringstream s;
    s << "shape " << got.sizes() << ", expected " << want.sizes();
    return s.str();
  }
  if (got.numel() == 0) return "";
  const at::Tensor ref = wide != nullptr ? wide->outputs[index] : at::Tensor();
  const int64_t terms =
      numerics::terms(model, op.schema(), args.values.data(), static_cast<int32_t>(args.values.size()));
  std::vector<c10::IValue> inputs;  // the call's read-only arguments
  for (size_t i = 0; i < same.args.size() && i < op.schema().arguments.size(); ++i)
    if (!op.schema().arguments[i].is_write()) inputs.push_back(same.args[i]);
  const double scale =
      model.magnitude == numerics::Magnitude::kScale && ref.defined() ? numerics::call_scale(inputs, ref) : 0;
  const numerics::Verdict v = numerics::judge(
      model, got, want, ref, magnitude != nullptr ? magnitude->outputs[index] : at::Tensor(), terms, scale);
  if (v.ok()) return "";
  *worst = std::max(*worst, v.error);
  return v.message();
}

// ---------------------------------------------------------------------------
// running one sample
// ---------------------------------------------------------------------------

// Random ops: run on the npu, then check the properties of what came out.
Outcome run_property_sample(Runtime& rt, const reg::OpEntry& op, const Sample& sample,
                            const PropertyFn& check) {
  Outcome o;
  NpuArgs args;
  sim::Device* dev = &rt.devices().at(0);
  for (const auto& v : sample.args) args.values.push_back(box(v, args, dev));
  std::vector<NpubValue> rets(op.schema().returns.size(), none_value());
  TensorOutputs outs(rt.devices());
  const bool expect_error = sample.name.find("(error)") != std::string::npos;
  try {
    rt.dispatcher().call(OpHandle{const_cast<reg::OpEntry*>(&op), nullptr}, args.values.data(),
                         static_cast<int32_t>(args.values.size()), rets.data(),
                         static_cast<int32_t>(rets.size()), &outs);
  } catch (const std::exception& e) {
    o.pass = expect_error;
    if (!o.pass) o.message = std::string("npu raised an error: ") + e.what();
    return o;
  }
  if (expect_error) {
    o.message = "the npu accepted an input that must be rejected";
    return o;
  }
  std::vector<at::Tensor> got;
  for (const NpubValue& r : rets)
    if (r.tag == NPUB_VALUE_TENSOR) got.push_back(to_torch(*r.u.tensor));
  o.message = check(sample.args, got);
  o.pass = o.message.empty();
  return o;
}

Outcome run_sample(Runtime& rt, const reg::OpEntry& op, const Sample& sample) {
  if (auto prop = property_checks().find(op.name()); prop != property_checks().end())
    return run_property_sample(rt, op, sample, prop->second);
  Outcome o;
  const auto& schema = op.schema();
  const numerics::ErrorModel& model = numerics::error_model(op.name());

  // 1. The references: ATen in the op's dtype (shapes, dtypes, errors, and
  // the values of exact ops), in float64, and on |inputs| for the magnitude
  // of accumulated terms.
  const Reference same = reference(op, sample, Precision::kSame);
  const bool wide_values = numerics::needs_float64(model);
  Reference wide, magnitude;
  if (same.error.empty() && wide_values) {
    at::ScalarType compute = at::ScalarType::Undefined;
    for (const at::Tensor& t : same.outputs)
      if (at::isFloatingType(t.scalar_type()) && compute == at::ScalarType::Undefined)
        compute = t.scalar_type();
    wide = reference(op, sample, Precision::kFloat64, compute);
    if (!wide.error.empty() || wide.outputs.size() != same.outputs.size()) {
      o.message = "no float64 reference: ATen raised '" + wide.error.substr(0, wide.error.find('\n')) + "'";
      return o;
    }
    if (numerics::needs_magnitude(model)) {
      magnitude = reference(op, sample, Precision::kMagnitude, compute);
      if (magnitude.outputs.size() != same.outputs.size()) {
        o.message = "no |inputs| reference for the error bound: ATen raised '" +
                    magnitude.error.substr(0, magnitude.error.find('\n')) + "'";
        return o;
      }
    }
  }
  const std::vector<at::Tensor>& expected = same.outputs;

  // 2. The npu run: out arguments get the reference's resized shapes.
  sim::Device* dev = &rt.devices().at(0);
  NpuArgs args;
  std::vector<size_t> written;
  const bool from_library = reference_library().count(op.name()) != 0;
  size_t out_index = 0;
  for (size_t i = 0; i < sample.args.size(); ++i) {
    c10::IValue v = sample.args[i];
    const bool is_out = i < schema.arguments.size() && schema.arguments[i].is_write() &&
                        schema.arguments[i].kwarg_only && v.isTensor() && same.error.empty();
    // out= arguments take the shape of the reference's result (ATen resized
    // its own; a library reference returns it).
    if (is_out) {
      at::Tensor shaped =
          from_library && out_index < expected.size() ? expected[out_index++] : same.args[i].toTensor();
      v = at::zeros(shaped.sizes(), at::TensorOptions().dtype(sample.args[i].toTensor().scalar_type()));
    }
    const size_t first = args.tensors.size();
    args.values.push_back(box(v, args, dev));
    // A written tensor, or each tensor of a written list (Tensor(a!)[]).
    if (i < schema.arguments.size() && schema.arguments[i].is_write() && (v.isTensor() || v.isTensorList()))
      for (size_t k = first; k < args.tensors.size(); ++k) written.push_back(k);
  }
  std::vector<NpubValue> rets(schema.returns.size(), none_value());
  TensorOutputs outs(rt.devices());
  std::string npu_error;
  // The npu rejected the input as ATen did: an invalid-argument error, or an
  // index error where ATen raised IndexError (as opposed to "not supported"
  // or a crash).
  bool npu_rejected_input = false;
  try {
    rt.dispatcher().call(OpHandle{const_cast<reg::OpEntry*>(&op), nullptr}, args.values.data(),
                         static_cast<int32_t>(args.values.size()), rets.data(),
                         static_cast<int32_t>(rets.size()), &outs);
  } catch (const Error& e) {
    npu_error = e.what();
    npu_rejected_input = e.code() == (same.index_error ? ErrorCode::kIndex : ErrorCode::kInvalidArgument);
    // A decline (NPUB_ERR_UNSUPPORTED) of a call ATen computes hands it to
    // the host's fallback, which this tool does not install: the sample is
    // not the plugin's to judge.
    if (e.code() == ErrorCode::kUnsupported && same.error.empty()) {
      o.declined = true;
      return o;
    }
  } catch (const std::exception& e) {
    npu_error = e.what();
  }

  // 3. Verdict. Both raising passes only for a sample written as an error
  // case, and only when the npu rejected the input (invalid argument): an
  // npu that cannot run the op at all ("not supported", an internal error)
  // must not pass on inputs ATen rejects.
  if (!same.error.empty() || !npu_error.empty()) {
    if (!same.error.empty() && !npu_error.empty()) {
      const bool marked = sample.name.find("(error)") != std::string::npos;
      const std::string aten_line = same.error.substr(0, same.error.find('\n'));
      if (marked && npu_rejected_input) {
        o.pass = true;  // both reject the input
      } else if (!marked) {
        o.message =
            "ATen and the npu both raised on a sample not written as an error case (name it '(error)' "
            "if it is one): ATen: " +
            aten_line + "; npu: " + npu_error;
      } else {
        o.message = "ATen rejects the input (" + aten_line + ") but the npu did not reject it as " +
                    (same.index_error ? "an index error" : "invalid") + ": " + npu_error;
      }
      return o;
    }
    const std::string first_line = same.error.substr(0, same.error.find('\n'));
    o.message = same.error.empty() ? "npu raised an error ATen did not: " + npu_error
                                   : "ATen raised an error the npu did not: " + first_line;
    return o;
  }
  std::vector<at::Tensor> got;
  const bool has_alias =
      std::any_of(op.return_alias().begin(), op.return_alias().end(), [](int32_t a) { return a >= 0; });
  if (!has_alias || from_library) {
    for (const NpubValue& r : rets)
      if (r.tag == NPUB_VALUE_TENSOR) got.push_back(to_torch(*r.u.tensor));
  }
  if (!from_library ||
      std::all_of(rets.begin(), rets.end(), [](const NpubValue& r) { return r.tag == NPUB_VALUE_NONE; })) {
    for (size_t w : written) got.push_back(to_torch(*args.tensors[w].dl()));
  }
  if (got.size() != expected.size()) {
    o.message =
        "produced " + std::to_string(got.size()) + " outputs, expected " + std::to_string(expected.size());
    return o;
  }
  for (size_t i = 0; i < got.size(); ++i) {
    const std::string diff =
        judge(got[i], i, same, wide_values ? &wide : nullptr,
              magnitude.outputs.empty() ? nullptr : &magnitude, model, op, args, &o.worst);
    if (!diff.empty()) {
      o.message = "output " + std::to_string(i) + ": " + diff;
      return o;
    }
  }
  o.pass = true;
  return o;
}

// A failing sample runs once more on the same data: a kernel that is right
// only sometimes (a race, uninitialised memory) is reported as flaky, and
// still fails.
Outcome run_sample_twice_on_failure(Runtime& rt, const reg::OpEntry& op, const Sample& sample) {
  Outcome first = run_sample(rt, op, sample);
  if (first.pass || first.declined) return first;
  Outcome second = run_sample(rt, op, sample);
  if (second.pass) {
    first.message = "flaky: failed, then passed on the same data; the failure: " + first.message;
  } else if (second.message != first.message) {
    first.message = "flaky: two runs on the same data failed differently; first: " + first.message +
                    "; second: " + second.message;
  } else {
    first.message += " (the same on a second run)";
  }
  return first;
}

// ---------------------------------------------------------------------------
// the cells: plugin x op x dtype
// ---------------------------------------------------------------------------

// One cell to check: the samples of `op` at dtype `d` on the kernels of
// `plugin`; `converted`: the dtype reaches a float32 kernel through the
// dispatcher's conversion; `no_kernel`: the rest of the grid.
struct Job {
  const reg::OpEntry* op;
  std::string plugin;
  DType d;
  bool converted = false, no_kernel = false;
};

std::vector<Job> plan(Runtime& rt, const std::regex& filter) {
  std::vector<Job> jobs;
  for (const reg::OpEntry* op : rt.registry().ops()) {
    if (!std::regex_search(op->name(), filter)) continue;
    std::set<std::pair<std::string, DType>> seen;
    std::set<std::string> op_plugins;
    for (const reg::Kernel* k : op->kernels(NPUB_DEVICE_NPU)) op_plugins.insert(k->plugin_name());
    for (const reg::Kernel* k : op->kernels(NPUB_DEVICE_NPU)) {
      for (int d = 0; d < kNumDTypes; ++d)
        if ((k->dtype_mask == 0 ? d == 0 : ((k->dtype_mask >> d) & 1u)) &&
            seen.insert({k->plugin_name(), static_cast<DType>(d)}).second)
          jobs.push_back({op, k->plugin_name(), static_cast<DType>(d)});
    }
    // Half types served by a float32 kernel through conversion.
    for (const reg::Kernel* k : op->kernels(NPUB_DEVICE_NPU))
      if (k->accepts(DType::kFloat32))
        for (DType d : {DType::kFloat16, DType::kBFloat16})
          if (seen.insert({k->plugin_name(), d}).second) jobs.push_back({op, k->plugin_name(), d, true});
    // The rest of the grid: dtypes no kernel of the plugin takes.
    for (const std::string& plugin : op_plugins)
      for (int d = 0; d < kNumDTypes; ++d)
        if (!seen.count({plugin, static_cast<DType>(d)}))
          jobs.push_back({op, plugin, static_cast<DType>(d), false, true});
  }
  return jobs;
}

Cell run_job(Runtime& rt, const Job& job, const std::string& seed, Progress& progress, size_t index) {
  const reg::OpEntry* op = job.op;
  Cell c{job.plugin, op->name(), dtype_name(job.d), "not covered", 0, 0, 0, ""};
  if (job.no_kernel) {
    c.detail = "no kernel for this dispatch dtype";
    return c;
  }
  progress.cell_started(index, c);
  auto spec = sample_specs().find(op->name());
  if (spec == sample_specs().end()) {
    c.detail = "no sample specification for this op";
    return c;
  }
  std::vector<Sample> samples;
  try {
    seed_samples(op->name() + " " + dtype_name(job.d) + (seed.empty() ? "" : " " + seed));
    samples = spec->second(torch_dtype(job.d));
  } catch (const std::exception& e) {
    c.status = "fail";
    c.detail = std::string("sample generation failed: ") + e.what();
    return c;
  }
  c.status = "pass";
  for (const Sample& s : samples) {
    progress.sample_started(s.name);
    ++c.samples;
    Outcome out = run_sample_twice_on_failure(rt, *op, s);
    c.worst = std::max(c.worst, out.worst);
    if (out.declined) {
      ++c.declined;
    } else if (out.pass) {
      ++c.passed;
    } else if (c.status == "pass") {
      c.status = "fail";
      c.detail = "sample '" + s.name + "': " + out.message;
    }
  }
  if (c.status == "pass" && job.converted) c.detail = "via float32 kernel (dispatcher dtype conversion)";
  if (c.status == "pass" && c.declined == c.samples) {
    c.status = "not covered";
    c.detail = "the kernel declines every sample (the host's fallback serves them)";
  } else if (c.declined > 0) {
    c.detail += std::string(c.detail.empty() ? "" : "; ") + std::to_string(c.declined) +
                " samples declined (the host's fallback serves them)";
  }
  if (c.status == "fail")
    std::cerr << "FAIL " << c.plugin << " " << c.op << " " << c.dtype << ": " << c.detail << "\n";
  return c;
}

int usage() {
  std::cerr
      << "usage: npub-conformance (--plugin FILE.so)... | --all  [--op REGEX] [--md FILE] [--json FILE] "
         "[--seed S] [--timeout S] [--in-process]\n"
         "  --seed S     sample data from another random stream (default: the one the coverage report uses)\n"
         "  --timeout S  seconds a sample may take before its cell is reported hung (default 120)\n"
         "  --in-process run the cells in this process (for a debugger): a kernel that crashes ends the "
         "run;\n"
         "               by default they run in a child process, and a crash or hang is reported against\n"
         "               the cell (plugin, op, dtype) and the run goes on in a new child\n";
  return 2;
}

}  // namespace
}  // namespace npub::conformance

int main(int argc, char** argv) {
  using namespace npub;
  using namespace npub::conformance;
  std::vector<std::string> plugin_paths;
  bool all = false;
  std::string op_filter = ".*", md, json, seed;
  double timeout = 120;
  bool in_process = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) throw std::runtime_error(a + " needs a value");
      return argv[++i];
    };
    try {
      if (a == "--plugin")
        plugin_paths.push_back(next());
      else if (a == "--all")
        all = true;
      else if (a == "--op")
        op_filter = next();
      else if (a == "--md")
        md = next();
      else if (a == "--json")
        json = next();
      else if (a == "--seed")
        seed = next();
      else if (a == "--timeout")
        timeout = std::stod(next());
      else if (a == "--in-process")
        in_process = true;
      else
        return usage();
    } catch (const std::exception& e) {
      std::cerr << "npub-conformance: " << e.what() << "\n";
      return usage();
    }
  }
  if (plugin_paths.empty() && !all) return usage();
  if (all) plugin_paths = PluginLoader::default_candidates();

  const std::regex filter(op_filter);
  const auto t0 = std::chrono::steady_clock::now();
  // The runtime starts, the plugins load and the cells run in `child`: in
  // this process with --in-process, else in forked children (cells.h).
  auto child = [&](Progress& progress, size_t first) -> int {
    RuntimeOptions options = RuntimeOptions::from_env();  // NPUB_SIM_THREADS and the like apply
    options.devices.num_devices = 1;
    options.load_default_plugins = false;
    options.load_default_op_map = false;
    options.dispatcher.fallback_mode = FallbackMode::kError;  // a kernel must serve every sample
    Runtime rt(options);
    for (const auto& p : plugin_paths) {
      LoadResult r = rt.loader().load(p);
      if (!r.ok) {
        if (first == 0) std::cerr << "npub-conformance: " << r.error << "\n";
        progress.load_failed();
      } else {
        progress.plugin_loaded(r.plugin_name);
      }
    }
    const std::vector<Job> jobs = plan(rt, filter);
    for (size_t i = first; i < jobs.size(); ++i)
      progress.cell_done(i, run_job(rt, jobs[i], seed, progress, i));
    progress.end();
    return 0;
  };
  IsolatedRun run;
  if (in_process) {
    Progress progress(-1, &run);
    child(progress, 0);
  } else {
    run = run_isolated(child, timeout);
  }
  std::vector<Cell>& cells = run.cells;
  std::vector<std::string>& plugin_names = run.plugins;
  const bool load_failed = run.load_failed;
  if (!run.error.empty()) std::cerr << "npub-conformance: " << run.error << "\n";
  int failures = 0;
  for (const Cell& c : cells) failures += c.status == "fail" || c.status == "crashed" || c.status == "hung";
  std::stable_sort(cells.begin(), cells.end(), [](const Cell& a, const Cell& b) {
    return std::tie(a.plugin, a.op) < std::tie(b.plugin, b.op);
  });
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  write_reports(cells, md, json, plugin_names, TORCH_VERSION);
  int pass = 0, failed = 0, crashed = 0, hung = 0, uncovered = 0, samples = 0;
  for (const Cell& c : cells) {
    pass += c.status == "pass";
    failed += c.status == "fail";
    crashed += c.status == "crashed";
    hung += c.status == "hung";
    uncovered += c.status == "not covered";
    samples += c.samples;
  }
  std::string died;
  if (crashed) died += std::to_string(crashed) + " crashed, ";
  if (hung) died += std::to_string(hung) + " hung, ";
  std::printf(
      "npub-conformance: %d op x dtype pairs: %d passed, %d failed, %s%d not covered (%d samples, %.1f s)\n",
      static_cast<int>(cells.size()), pass, failed, died.c_str(), uncovered, samples, secs);
  // A run that checked nothing proves nothing: a plugin whose ops have no
  // sample specification here (an out-of-tree plugin's own ops, an ATen op
  // no in-tree plugin serves) must not pass as a clean one does.
  const bool nothing_covered = pass == 0 && failures == 0;
  if (nothing_covered) {
    std::fflush(stdout);
    std::map<std::string, std::vector<std::string>> why;  // reason -> ops
    for (const Cell& c : cells) {
      if (c.detail == "no kernel for this dispatch dtype") continue;  // the grid around the kernels' dtypes
      auto& ops = why[c.detail];
      if (std::find(ops.begin(), ops.end(), c.op) == ops.end()) ops.push_back(c.op);
    }
    std::fprintf(stderr, "npub-conformance: nothing was covered%s\n",
                 cells.empty() ? (plugin_names.empty() ? ": no plugin loaded"
                                                       : ": the plugins serve no op --op selects")
                               : "; why, per op:");
    for (const auto& [reason, ops] : why) {
      std::string list;
      for (size_t i = 0; i < ops.size() && i < 8; ++i) list += (i ? ", " : "") + ops[i];
      if (ops.size() > 8) list += ", ... (" + std::to_string(ops.size()) + " ops)";
      std::fprintf(stderr, "  %s: %s\n", reason.c_str(), list.c_str());
    }
    if (std::any_of(cells.begin(), cells.end(),
                    [](const Cell& c) { return c.detail == "no sample specification for this op"; }))
      std::fprintf(stderr,
                   "  (samples for ops in-tree plugins do not implement: python3 -m npubridge conformance "
                   "--plugin FILE.so, see docs/plugin-authoring.md)\n");
  }
  return failures == 0 && !load_failed && !nothing_covered && run.error.empty() ? 0 : 1;
}

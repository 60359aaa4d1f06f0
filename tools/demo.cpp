// npub-demo: a C++ host on the simulated NPU. Loads the plugins found, lists
// what loaded, what was rejected and what was skipped, summarises the op table
// (in full with --ops), runs a few ops on npu:0 (checking them against values
// computed here), and shows one op falling back to the host's own
// implementation, then the dispatcher's statistics. Exits 1 when a plugin
// was rejected.
#include <npubridge/device_sim/copy_engine.h>
#include <npubridge/dispatcher/runtime.h>
#include <npubridge/dispatcher/value.h>
#include <npubridge/registry/schema.h>
#include <npubridge/support/error.h>

#include <cmath>
#include <cstdio>
#include <map>
#include <string>

using namespace npub;

namespace {

// The host framework's own tan, used by the dispatcher as the fallback:
// copy to host memory, compute, copy back (through the copy engine).
void host_fallback(const FallbackCall& call) {
  if (call.op.name() != "aten::tan")
    throw Error(ErrorCode::kUnsupported, "the demo host has no implementation of " + call.op.name());
  const DLTensor* x = call.args[0].u.tensor;
  std::vector<int64_t> shape(x->shape, x->shape + x->ndim);
  Tensor staged = Tensor::empty(shape, DType::kFloat64, nullptr);
  sim::copy_tensor(*staged.dl(), *x);
  std::vector<double> v = staged.to_doubles();
  for (double& e : v) e = std::tan(e);
  DLTensor* out = call.outputs.allocate(0, x->device, x->ndim, x->shape, x->dtype);
  Tensor result = Tensor::from_values(shape, DType::kFloat64, v, nullptr);
  sim::copy_tensor(*out, *result.dl());
  call.rets[0] = tensor_value(out);
}

void print_tensor(const char* name, const Tensor& t) {
  std::printf("  %s %s = [", name, t.shape_string().c_str());
  auto v = t.to_doubles();
  for (size_t i = 0; i < v.size(); ++i) std::printf("%s%g", i ? ", " : "", v[i]);
  std::printf("]\n");
}

void usage(std::FILE* to) {
  std::fprintf(to,
               "usage: npub-demo [--ops]\n"
               "  Loads the plugins of the built-in directory and of NPUB_PLUGIN_PATH (':'-separated .so\n"
               "  files or directories), lists what loaded (name, version, ABI, ops, file), what was\n"
               "  rejected (file and reason) and the libraries of a directory skipped as not plugins\n"
               "  (no npub_plugin_init_v1; a .so named in NPUB_PLUGIN_PATH must be a plugin), then runs\n"
               "  a few ops on npu:0 and prints the dispatcher's statistics.\n"
               "  --ops   print the whole op table (op: kernels by priority), not one line per plugin\n"
               "Exit status: 0, or 1 when a plugin was rejected or a result was wrong.\n");
}

// One line per plugin: name, version, ABI, the ops it has npu kernels for.
void print_plugins(Runtime& rt) {
  std::map<std::string, int> ops_of;
  for (const reg::OpEntry* op : rt.registry().ops()) {
    std::map<std::string, bool> counted;
    for (const reg::Kernel* k : op->kernels(NPUB_DEVICE_NPU))
      if (!counted[k->plugin_name()]) {
        counted[k->plugin_name()] = true;
        ++ops_of[k->plugin_name()];
      }
  }
  const auto plugins = rt.loader().plugins();
  std::printf("Plugins loaded (%zu):\n", plugins.size());
  for (const auto& p : plugins)
    std::printf("  %-16s %-8s ABI 1.%-2u %4d ops  %s\n", p->name.c_str(), p->version.c_str(), p->abi_minor,
                ops_of[p->name], p->path.c_str());
  const auto failures = rt.loader().failures();
  std::printf("Plugins rejected (%zu):\n", failures.size());
  for (const auto& f : failures) std::printf("  %s\n", f.error.c_str());
  const auto skipped = rt.loader().skipped();
  if (!skipped.empty()) {
    std::printf("Skipped, not plugins (%zu):\n", skipped.size());
    for (const auto& f : skipped) std::printf("  %s\n", f.error.c_str());
  }
}

void print_op_table(Runtime& rt, bool full) {
  size_t with_kernel = 0, without = 0;
  for (const reg::OpEntry* op : rt.registry().ops())
    (op->kernels(NPUB_DEVICE_NPU).empty() ? without : with_kernel)++;
  std::printf("\nOp table: %zu ops with npu kernels, %zu without (host fallback)%s\n", with_kernel, without,
              full ? " (op: kernels by priority):" : "; --ops lists them");
  if (!full) return;
  for (const reg::OpEntry* op : rt.registry().ops()) {
    std::printf("  %-30s", op->name().c_str());
    const auto& ks = op->kernels(NPUB_DEVICE_NPU);
    if (ks.empty()) std::printf(" (no npu kernel: host fallback)");
    for (const reg::Kernel* k : ks)
      std::printf(" %s{%s} p%d O%d", k->plugin_name().c_str(), k->dtypes_string().c_str(), k->priority,
                  k->min_opt_level);
    std::printf("\n");
  }
}

}  // namespace

int main(int argc, char** argv) {
  bool full_op_table = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--ops") {
      full_op_table = true;
    } else if (a == "-h" || a == "--help") {
      usage(stdout);
      return 0;
    } else {
      std::fprintf(stderr, "npub-demo: unknown argument '%s'\n", a.c_str());
      usage(stderr);
      return 2;
    }
  }
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // interleave with the log on stderr
  try {
    Runtime& rt = Runtime::global();
    std::printf("npubridge demo: %d simulated NPU device(s)\n\n", rt.devices().count());
    print_plugins(rt);
    const bool rejected = !rt.loader().failures().empty();

    // The host framework defines the ops it implements itself.
    rt.registry().define(reg::parse_schema("aten::tan(Tensor self) -> Tensor"), "host");
    print_op_table(rt, full_op_table);

    Dispatcher& d = rt.dispatcher();
    d.set_fallback(&host_fallback);
    sim::Device* npu0 = &rt.devices().at(0);

    std::printf("\nOn npu:0:\n");
    Tensor a = Tensor::from_values({2, 3}, DType::kFloat32, {1, -2, 3, -4, 5, -6}, npu0);
    Tensor b = Tensor::from_values({3}, DType::kFloat32, {10, 20, 30}, npu0);
    Tensor sum = Tensor::empty({2, 3}, DType::kFloat32, npu0);
    NpubValue add_args[] = {tensor_value(a.dl()), tensor_value(b.dl()), double_value(0.5),
                            tensor_value(sum.dl())};
    NpubValue add_rets[1] = {};
    d.call("aten::add.out", add_args, 4, add_rets, 1, nullptr);
    print_tensor("a", a);
    print_tensor("b", b);
    print_tensor("add(a, b, alpha=0.5)", sum);

    TensorOutputs outs(rt.devices());
    NpubValue relu_args[] = {tensor_value(sum.dl())};
    NpubValue relu_rets[1] = {};
    d.call("aten::relu", relu_args, 1, relu_rets, 1, &outs);
    print_tensor("relu(...)", outs[0]);

    Tensor w = Tensor::from_values({3, 2}, DType::kFloat32, {1, 0, 0, 1, 1, 1}, npu0);
    Tensor mm = Tensor::empty({2, 2}, DType::kFloat32, npu0);
    NpubValue mm_args[] = {tensor_value(a.dl()), tensor_value(w.dl()), tensor_value(mm.dl())};
    NpubValue mm_rets[1] = {};
    d.call("aten::mm.out", mm_args, 3, mm_rets, 1, nullptr);
    print_tensor("mm(a, w)", mm);

    // bf16 matmul: cann_like's GEMM is fp32-only, so the dispatcher converts
    // the operands to fp32, runs it, and casts the result back.
    Tensor ha = Tensor::from_values({2, 2}, DType::kBFloat16, {1.5, 2, -3, 4}, npu0);
    Tensor hm = Tensor::empty({2, 2}, DType::kBFloat16, npu0);
    NpubValue hmm_args[] = {tensor_value(ha.dl()), tensor_value(ha.dl()), tensor_value(hm.dl())};
    NpubValue hmm_rets[1] = {};
    d.call("aten::mm.out", hmm_args, 3, hmm_rets, 1, nullptr);
    print_tensor("mm(bf16 x, x) via fp32 kernel", hm);

    // tan: no plugin serves it -> the host's implementation (one warning).
    TensorOutputs tan_outs(rt.devices());
    NpubValue tan_args[] = {tensor_value(a.dl())};
    NpubValue tan_rets[1] = {};
    d.call("aten::tan", tan_args, 1, tan_rets, 1, &tan_outs);
    print_tensor("tan(a) [fallback]", tan_outs[0]);

    // Check results against values computed here.
    const double expect_add[] = {6, 8, 18, 1, 15, 9};
    auto got = sum.to_doubles();
    for (int i = 0; i < 6; ++i)
      if (std::fabs(got[static_cast<size_t>(i)] - expect_add[i]) > 1e-6) {
        std::fprintf(stderr, "demo: add result wrong at %d\n", i);
        return 1;
      }

    std::printf("\nDispatcher statistics:\n  %-28s %6s %9s %11s %10s  %s\n", "op", "calls", "fallbacks",
                "conversions", "time(ms)", "served by");
    for (const auto& s : d.stats()) {
      std::string served;
      for (const auto& k : s.kernels)
        if (k.calls > 0) served += k.plugin + " x" + std::to_string(k.calls) + " ";
      if (s.fallbacks > 0) served += "host fallback x" + std::to_string(s.fallbacks);
      std::printf("  %-28s %6lld %9lld %11lld %10.3f  %s\n", s.op.c_str(), static_cast<long long>(s.calls),
                  static_cast<long long>(s.fallbacks), static_cast<long long>(s.conversions), s.total_ms,
                  served.c_str());
    }
    auto st = npu0->allocator().stats();
    std::printf("\nnpu:0 memory: %lld bytes allocated, %lld reserved, peak %lld\n",
                static_cast<long long>(st.allocated_bytes), static_cast<long long>(st.reserved_bytes),
                static_cast<long long>(st.peak_allocated_bytes));
    if (rejected) {
      std::fprintf(stderr, "npub-demo: %zu plugin(s) rejected (listed above)\n",
                   rt.loader().failures().size());
      return 1;
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "npub-demo: %s\n", e.what());
    return 1;
  }
}

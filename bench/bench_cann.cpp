// cann_like against PyTorch on the CPU, in one process, with the same number
// of threads on both sides: each case runs through the dispatcher on npu:0
// and as the equivalent ATen call; the ratio npu time / torch time (lower is
// better) is printed with the achieved GFLOP/s or GB/s, a GFLOP/s rate also
// as a share of the machine's compute peak (machine_ceiling.h, measured
// first; memory-bound cases get no share: Note [The triad is a reference,
// not a memory ceiling]), and all figures go to the JSON file given as
// argv[1].
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/version.h>

#include <npubridge/device_sim/copy_engine.h>
#include <npubridge/dispatcher/runtime.h>
#include <npubridge/dispatcher/value.h>
#include <npubridge/torch/dl_view.h>
#include <npubridge/torch/dtype.h>

#include "machine_ceiling.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <functional>
#include <string>
#include <thread>
#include <vector>

using namespace npub;

namespace {

Tensor to_npu(const at::Tensor& t, sim::Device* dev) {
  at::Tensor c = t.contiguous();
  Tensor out = Tensor::empty(c.sizes().vec(), npub_dtype(c.scalar_type()), dev);
  sim::copy_tensor(*out.dl(), dl_view(c, DLDevice{kDLCPU, 0}), &dev->compute());
  return out;
}

double median_seconds(const std::function<void()>& f, int reps) {
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    const auto a = std::chrono::steady_clock::now();
    f();
    t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - a).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

struct Result {
  std::string name;
  double npu_s, torch_s, work;  // work: FLOP or bytes
  const char* unit;             // "GFLOP/s" or "GB/s"
  double target;
  double ceiling;  // the machine's compute peak for this work (GFLOP/s); 0: none (memory-bound)
};

}  // namespace

int main(int argc, char** argv) {
  const std::string json_path = argc > 1 ? argv[1] : "cann.json";
  const int threads = 2;
  at::set_num_threads(threads);
  RuntimeOptions o;
  o.devices.num_devices = 1;
  o.devices.compute_threads = threads;
  o.load_default_op_map = false;
  Runtime rt(o);
  Dispatcher& d = rt.dispatcher();
  d.set_fallback_mode(FallbackMode::kError);  // every case must run on a kernel
  sim::Device* dev = &rt.devices().at(0);
  std::vector<Result> results;
  const bench::MachineCeiling ceiling = bench::measure_machine_ceiling(threads);
  std::printf(
      "machine peaks, %d threads: fp32 FMA %.0f GFLOP/s (%s), bf16 dot products %.0f GFLOP/s; STREAM triad "
      "%.1f GB/s (a reference, not a bound on the memory-bound cases)\n",
      threads, ceiling.fp32_gflops, ceiling.isa, ceiling.bf16_gflops, ceiling.triad_gbps);

  // Runs the npu call and the torch call in alternating blocks (3 blocks of
  // `reps` calls each side) and compares medians. Blocks, not single calls:
  // torch's OpenMP threads spin for a while after each torch op, which
  // would otherwise steal the cores from the npu call that follows.
  auto measure = [&](const std::string& name, const std::function<void()>& npu,
                     const std::function<void()>& ref, double work, const char* unit, double target,
                     int reps) {
    npu();
    ref();  // warm-up (caches, allocator, page faults)
    std::vector<double> a, b;
    for (int block = 0; block < 3; ++block) {
      for (int i = 0; i < reps; ++i) a.push_back(median_seconds(npu, 1));
      for (int i = 0; i < reps; ++i) b.push_back(median_seconds(ref, 1));
    }
    std::sort(a.begin(), a.end());
    std::sort(b.begin(), b.end());
    const bool flops = std::string(unit) == "GFLOP/s";
    const bool bf16 = name.find("bf16") != std::string::npos && ceiling.bf16_gflops > 0;
    const double peak = !flops ? 0 : bf16 ? ceiling.bf16_gflops : ceiling.fp32_gflops;
    Result r{name, a[a.size() / 2], b[b.size() / 2], work, unit, target, peak};
    const double rate = work / r.npu_s / 1e9;
    char share[32] = "";
    if (peak > 0) std::snprintf(share, sizeof share, " (%3.0f%% of peak)", 100 * rate / peak);
    std::printf("%-44s npu %9.3f ms  torch %9.3f ms  ratio %5.2f (target <= %.2f) %s  %8.1f %s%s\n",
                name.c_str(), r.npu_s * 1e3, r.torch_s * 1e3, r.npu_s / r.torch_s, target,
                r.npu_s / r.torch_s <= target ? "ok    " : "MISSED", rate, unit, share);
    std::fflush(stdout);
    results.push_back(r);
  };

  auto opts = [](at::ScalarType t) { return at::TensorOptions().dtype(t); };
  NpubValue rets_storage[3] = {};
  // Return slots are cleared before every call: a slot holding a tensor means
  // "preallocated" to the dispatcher.
  struct Rets {
    NpubValue* r;
    operator NpubValue*() {
      for (int i = 0; i < 3; ++i) r[i] = none_value();
      return r;
    }
  } rets{rets_storage};

  for (int64_t n : {1024, 4096}) {
    at::Tensor a = at::randn({n, n}), b = at::randn({n, n}), c = at::empty({n, n});
    Tensor na = to_npu(a, dev), nb = to_npu(b, dev), nc = to_npu(c, dev);
    const OpHandle mm = d.op("aten::mm.out");
    NpubValue args[] = {tensor_value(na.dl()), tensor_value(nb.dl()), tensor_value(nc.dl())};
    const int reps = n == 1024 ? 5 : 1;
    measure(
        "mm fp32 " + std::to_string(n) + "^3", [&] { d.call(mm, args, 3, rets, 1, nullptr); },
        [&] { at::mm_out(c, a, b); }, 2.0 * n * n * n, "GFLOP/s", 1.15, reps);
    at::Tensor bias = at::randn({n});
    Tensor nbias = to_npu(bias, dev);
    const OpHandle addmm = d.op("aten::addmm.out");
    NpubValue aargs[] = {
        tensor_value(nbias.dl()), tensor_value(na.dl()), tensor_value(nb.dl()), int_value(1), int_value(1),
        tensor_value(nc.dl())};
    measure(
        "addmm fp32 " + std::to_string(n) + "^3", [&] { d.call(addmm, aargs, 6, rets, 1, nullptr); },
        [&] { at::addmm_out(c, bias, a, b); }, 2.0 * n * n * n, "GFLOP/s", 1.15, reps);
  }
  {
    const int64_t n = 16 << 20;
    at::Tensor a = at::randn({n}), b = at::randn({n}), c = at::empty({n});
    Tensor na = to_npu(a, dev), nb = to_npu(b, dev), nc = to_npu(c, dev);
    const OpHandle add = d.op("aten::add.out"), mul = d.op("aten::mul.out");
    NpubValue args[] = {tensor_value(na.dl()), tensor_value(nb.dl()), int_value(1), tensor_value(nc.dl())};
    measure(
        "add fp32 16M", [&] { d.call(add, args, 4, rets, 1, nullptr); }, [&] { at::add_out(c, a, b); },
        12.0 * n, "GB/s", 1.1, 7);
    NpubValue margs[] = {tensor_value(na.dl()), tensor_value(nb.dl()), tensor_value(nc.dl())};
    measure(
        "mul fp32 16M", [&] { d.call(mul, margs, 3, rets, 1, nullptr); }, [&] { at::mul_out(c, a, b); },
        12.0 * n, "GB/s", 1.1, 7);
    at::Tensor ab = a.to(at::kBFloat16), bb = b.to(at::kBFloat16), cb = at::empty({n}, opts(at::kBFloat16));
    Tensor nab = to_npu(ab, dev), nbb = to_npu(bb, dev), ncb = to_npu(cb, dev);
    NpubValue bargs[] = {tensor_value(nab.dl()), tensor_value(nbb.dl()), int_value(1),
                         tensor_value(ncb.dl())};
    measure(
        "add bf16 16M", [&] { d.call(add, bargs, 4, rets, 1, nullptr); }, [&] { at::add_out(cb, ab, bb); },
        6.0 * n, "GB/s", 1.1, 7);
  }
  {
    at::Tensor x = at::randn({4096, 4096}), y = at::empty({4096, 4096});
    Tensor nx = to_npu(x, dev), ny = to_npu(y, dev);
    const OpHandle sm = d.op("aten::_softmax.out");
    NpubValue args[] = {tensor_value(nx.dl()), int_value(1), bool_value(false), tensor_value(ny.dl())};
    measure(
        "softmax fp32 [4096, 4096]", [&] { d.call(sm, args, 4, rets, 1, nullptr); },
        [&] { at::_softmax_out(y, x, 1, false); }, 8.0 * 4096 * 4096, "GB/s", 1.1, 5);
  }
  {
    at::Tensor x = at::randn({8192, 1024}), w = at::randn({1024}), b = at::randn({1024});
    Tensor nx = to_npu(x, dev), nw = to_npu(w, dev), nb = to_npu(b, dev);
    const OpHandle ln = d.op("aten::native_layer_norm");
    std::vector<int64_t> shape{1024};
    NpubValue args[] = {tensor_value(nx.dl()), int_list_value(shape), tensor_value(nw.dl()),
                        tensor_value(nb.dl()), double_value(1e-5)};
    measure(
        "native_layer_norm fp32 [8192, 1024]",
        [&] {
          TensorOutputs outs(rt.devices());
          d.call(ln, args, 5, rets, 3, &outs);
        },
        [&] { at::native_layer_norm(x, {1024}, w, b, 1e-5); }, 8.0 * 8192 * 1024, "GB/s", 1.1, 5);
  }
  for (int64_t n : {1024, 4096}) {
    at::Tensor a = at::randn({n, n}, opts(at::kBFloat16)), b = at::randn({n, n}, opts(at::kBFloat16)),
               c = at::empty({n, n}, opts(at::kBFloat16));
    Tensor na = to_npu(a, dev), nb = to_npu(b, dev), nc = to_npu(c, dev);
    const OpHandle mm = d.op("aten::mm.out");
    NpubValue args[] = {tensor_value(na.dl()), tensor_value(nb.dl()), tensor_value(nc.dl())};
    const bool native = d.kernel_for(mm, DType::kBFloat16) != nullptr;
    measure(
        "mm bf16 " + std::to_string(n) + "^3" + (native ? "" : " (fp32 kernel via conversion)"),
        [&] { d.call(mm, args, 3, rets, 1, nullptr); }, [&] { at::mm_out(c, a, b); }, 2.0 * n * n * n,
        "GFLOP/s", 1.25, n == 1024 ? 5 : 1);
  }
  {
    // Stress: 4 host threads issue 512^3 products at once (the device's
    // compute threads split each); every result must equal ATen's within
    // fp32 rounding, and the 4 threads must get at least one thread's
    // throughput (ratio = 4 threads' time / one thread's time for the same
    // number of products).
    const int64_t n = 512;
    constexpr int kThreads = 4, kPerThread = 8;
    at::Tensor a = at::randn({n, n}), b = at::randn({n, n}), ref_t = at::mm(a, b);
    const std::vector<float> ref(ref_t.data_ptr<float>(), ref_t.data_ptr<float>() + n * n);
    Tensor na = to_npu(a, dev), nb = to_npu(b, dev);
    const OpHandle mm = d.op("aten::mm.out");
    std::atomic<int> wrong{0};
    auto products = [&](int count) {
      Tensor out = Tensor::empty({n, n}, DType::kFloat32, dev);
      NpubValue args[] = {tensor_value(na.dl()), tensor_value(nb.dl()), tensor_value(out.dl())};
      NpubValue r[1] = {};
      for (int i = 0; i < count; ++i) {
        r[0] = none_value();
        d.call(mm, args, 3, r, 1, nullptr);
        // Checked here, not with at::allclose: an ATen op from each of 4
        // host threads would start 4 OpenMP teams and time those instead.
        const float* got = static_cast<const float*>(out.dl()->data);
        for (int64_t e = 0; e < n * n; ++e)
          if (!(std::fabs(got[e] - ref[static_cast<size_t>(e)]) <=
                1e-4f + 1e-4f * std::fabs(ref[static_cast<size_t>(e)]))) {
            ++wrong;
            break;
          }
      }
    };
    measure(
        "mm fp32 512^3 x 32: 4 host threads / 1 thread",
        [&] {
          std::vector<std::thread> ts;
          for (int t = 0; t < kThreads; ++t) ts.emplace_back(products, kPerThread);
          for (auto& t : ts) t.join();
        },
        [&] { products(kThreads * kPerThread); }, 2.0 * n * n * n * kThreads * kPerThread, "GFLOP/s", 1.0, 3);
    std::printf("%-44s wrong results: %d\n", "  stress", wrong.load());
    if (wrong.load() != 0) return 1;
  }
  {
    // The convolution alone, forward and backward (ATen's convolution and
    // convolution_backward on the CPU, the same shapes as the fused case).
    at::Tensor x = at::randn({8, 64, 56, 56}), w = at::randn({64, 64, 3, 3}) * 0.05, b = at::randn({64});
    at::Tensor gy = at::randn({8, 64, 56, 56});
    Tensor nx = to_npu(x, dev), nw = to_npu(w, dev), nb = to_npu(b, dev), ngy = to_npu(gy, dev);
    std::vector<int64_t> one{1, 1}, zero{0, 0}, mask{1, 1, 1};
    const double flops = 2.0 * 8 * 64 * 64 * 9 * 56 * 56;
    const OpHandle fwd = d.op("aten::convolution_overrideable");
    NpubValue fargs[] = {tensor_value(nx.dl()), tensor_value(nw.dl()), tensor_value(nb.dl()),
                         int_list_value(one),   int_list_value(one),   int_list_value(one),
                         bool_value(false),     int_list_value(zero),  int_value(1)};
    measure(
        "conv2d forward [8,64,56,56] 3x3",
        [&] {
          TensorOutputs outs(rt.devices());
          d.call(fwd, fargs, 9, rets, 1, &outs);
        },
        [&] { at::conv2d(x, w, b, 1, 1); }, flops, "GFLOP/s", 1.1, 3);
    const OpHandle bwd = d.op("aten::convolution_backward_overrideable");
    NpubValue bargs[] = {tensor_value(ngy.dl()), tensor_value(nx.dl()), tensor_value(nw.dl()),
                         int_list_value(one),    int_list_value(one),   int_list_value(one),
                         bool_value(false),      int_list_value(zero),  int_value(1),
                         int_list_value(mask)};
    measure(
        "conv2d backward [8,64,56,56] 3x3",
        [&] {
          TensorOutputs outs(rt.devices());
          d.call(bwd, bargs, 10, rets, 3, &outs);
        },
        [&] {
          at::convolution_backward(gy, x, w, at::IntArrayRef{64}, {1, 1}, {1, 1}, {1, 1}, false, {0, 0}, 1,
                                   {true, true, true});
        },
        2 * flops, "GFLOP/s", 1.1, 3);
  }
  {
    // A transposed convolution (the upsampling of a decoder: stride 2) and
    // a 3-d one, forward and backward, against ATen's on the CPU.
    struct Case {
      const char* name;
      std::vector<int64_t> x, w, stride, padding, output_padding;
      bool transposed;
      double flops;  // forward multiply-adds * 2
    };
    const Case cases[] = {
        {"conv_transpose2d [8,64,28,28] 4x4 s2",
         {8, 64, 28, 28},
         {64, 32, 4, 4},
         {2, 2},
         {1, 1},
         {0, 0},
         true,
         2.0 * 8 * 64 * 32 * 16 * 28 * 28},
        {"conv3d [2,16,16,32,32] 3x3x3",
         {2, 16, 16, 32, 32},
         {32, 16, 3, 3, 3},
         {1, 1, 1},
         {1, 1, 1},
         {0, 0, 0},
         false,
         2.0 * 2 * 32 * 16 * 27 * 16 * 32 * 32},
    };
    for (const Case& c : cases) {
      at::Tensor x = at::randn(c.x), w = at::randn(c.w) * 0.05;
      const std::vector<int64_t> one(c.stride.size(), 1), mask{1, 1, 0};
      at::Tensor y = at::convolution(x, w, {}, c.stride, c.padding, one, c.transposed, c.output_padding, 1);
      at::Tensor gy = at::randn(y.sizes());
      Tensor nx = to_npu(x, dev), nw = to_npu(w, dev), ngy = to_npu(gy, dev);
      NpubValue fargs[] = {tensor_value(nx.dl()),
                           tensor_value(nw.dl()),
                           none_value(),
                           int_list_value(c.stride),
                           int_list_value(c.padding),
                           int_list_value(one),
                           bool_value(c.transposed),
                           int_list_value(c.output_padding),
                           int_value(1)};
      measure(
          std::string(c.name) + " forward",
          [&] {
            TensorOutputs outs(rt.devices());
            d.call(d.op("aten::convolution_overrideable"), fargs, 9, rets, 1, &outs);
          },
          [&] { at::convolution(x, w, {}, c.stride, c.padding, one, c.transposed, c.output_padding, 1); },
          c.flops, "GFLOP/s", 1.1, 3);
      NpubValue bargs[] = {tensor_value(ngy.dl()),
                           tensor_value(nx.dl()),
                           tensor_value(nw.dl()),
                           int_list_value(c.stride),
                           int_list_value(c.padding),
                           int_list_value(one),
                           bool_value(c.transposed),
                           int_list_value(c.output_padding),
                           int_value(1),
                           int_list_value(mask)};
      measure(
          std::string(c.name) + " backward",
          [&] {
            TensorOutputs outs(rt.devices());
            d.call(d.op("aten::convolution_backward_overrideable"), bargs, 10, rets, 3, &outs);
          },
          [&] {
            at::convolution_backward(gy, x, w, std::nullopt, c.stride, c.padding, one, c.transposed,
                                     c.output_padding, 1, {true, true, false});
          },
          2 * c.flops, "GFLOP/s", 1.1, 3);
    }
  }
  if (d.find("cann_like::conv2d_bias_relu")) {
    at::Tensor x = at::randn({8, 64, 56, 56}), w = at::randn({64, 64, 3, 3}) * 0.05, b = at::randn({64});
    Tensor nx = to_npu(x, dev), nw = to_npu(w, dev), nb = to_npu(b, dev);
    const OpHandle conv = d.op("cann_like::conv2d_bias_relu");
    std::vector<int64_t> one{1, 1};
    NpubValue args[] = {tensor_value(nx.dl()), tensor_value(nw.dl()), tensor_value(nb.dl()),
                        int_list_value(one),   int_list_value(one),   int_list_value(one),
                        int_value(1)};
    measure(
        "conv2d_bias_relu fused [8,64,56,56] 3x3",
        [&] {
          TensorOutputs outs(rt.devices());
          d.call(conv, args, 7, rets, 1, &outs);
        },
        [&] { at::relu(at::conv2d(x, w, b, 1, 1)); }, 2.0 * 8 * 64 * 64 * 9 * 56 * 56, "GFLOP/s", 0.9, 3);
  } else {
    std::printf("%-44s not implemented yet (cann_like::conv2d_bias_relu is not registered)\n",
                "conv2d_bias_relu fused");
  }

  std::ofstream f(json_path);
  f << "{\n  \"threads\": " << threads << ",\n  \"torch\": \"" << TORCH_VERSION << "\",\n";
  f << "  \"ceiling\": {\"fp32_gflops\": " << ceiling.fp32_gflops
    << ", \"bf16_gflops\": " << ceiling.bf16_gflops << ", \"isa\": \"" << ceiling.isa << "\"},\n";
  f << "  \"stream_triad_gbps\": " << ceiling.triad_gbps << ",\n  \"results\": [\n";
  for (size_t i = 0; i < results.size(); ++i) {
    const Result& r = results[i];
    f << "    {\"name\": \"" << r.name << "\", \"npu_ms\": " << r.npu_s * 1e3
      << ", \"torch_ms\": " << r.torch_s * 1e3 << ", \"ratio\": " << r.npu_s / r.torch_s
      << ", \"target\": " << r.target << ", \"rate\": " << r.work / r.npu_s / 1e9 << ", \"unit\": \""
      << r.unit << "\", \"ceiling\": ";
    if (r.ceiling > 0)
      f << r.ceiling;
    else
      f << "null";
    f << "}" << (i + 1 < results.size() ? "," : "") << "\n";
  }
  f << "  ]\n}\n";
  return 0;
}

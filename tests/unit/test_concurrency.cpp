// Many host threads dispatch at once over two devices: every result equals
// a serial run (or a float64 reference) and the allocator returns to zero.
#include "test_util.h"

#include <array>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <mutex>
#include <random>
#include <thread>

using namespace npub;
using namespace npub::test;

// acc = (acc + one) * factor, 10,000 times per thread: `one` and `factor`
// are shared by every thread of a device and `factor` differs per element,
// so a kernel that mixed up operands, elements or threads' tensors (or a
// mul that returned its first operand) cannot match the serial float32
// reference bit for bit.
TEST(Concurrency, EightThreadsTenThousandCallsOverTwoDevices) {
  auto rt = make_runtime();
  load_ok(*rt, builtin_plugin("npub_cann_like"));
  Dispatcher& d = rt->dispatcher();
  const OpHandle add = d.op("aten::add.out");
  const OpHandle mul = d.op("aten::mul.out");
  constexpr int kThreads = 8, kCalls = 10000, kN = 64;
  auto factor_of = [](int dev, int i) { return 0.5 + 0.125 * ((i + dev) % 4); };
  std::vector<Tensor> ones, factors;
  for (int dev = 0; dev < 2; ++dev) {
    std::vector<double> f(kN);
    for (int i = 0; i < kN; ++i) f[static_cast<size_t>(i)] = factor_of(dev, i);
    ones.push_back(
        Tensor::from_values({kN}, DType::kFloat32, std::vector<double>(kN, 1.0), &rt->devices().at(dev)));
    factors.push_back(Tensor::from_values({kN}, DType::kFloat32, f, &rt->devices().at(dev)));
  }
  std::vector<double> got(kThreads * kN);
  {
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&, t] {
        sim::Device* dev = &rt->devices().at(t % 2);
        std::vector<double> init(kN);
        for (int i = 0; i < kN; ++i) init[static_cast<size_t>(i)] = t + i * 0.5;
        Tensor acc = Tensor::from_values({kN}, DType::kFloat32, init, dev);
        Tensor tmp = Tensor::empty({kN}, DType::kFloat32, dev);
        const Tensor& one = ones[static_cast<size_t>(t % 2)];
        const Tensor& factor = factors[static_cast<size_t>(t % 2)];
        NpubValue rets[1] = {};
        for (int c = 0; c < kCalls; ++c) {
          NpubValue a[] = {tensor_value(acc.dl()), tensor_value(one.dl()), int_value(1),
                           tensor_value(tmp.dl())};
          d.call(add, a, 4, rets, 1, nullptr);
          NpubValue m[] = {tensor_value(tmp.dl()), tensor_value(factor.dl()), tensor_value(acc.dl())};
          d.call(mul, m, 3, rets, 1, nullptr);
          if (c % 1000 == 0) {  // allocations in the loop too
            Tensor scratch = Tensor::empty({128}, DType::kFloat32, dev);
          }
        }
        auto v = acc.to_doubles();
        std::copy(v.begin(), v.end(), got.begin() + t * kN);
      });
    }
    for (auto& th : threads) th.join();
  }
  // The serial reference: the same float32 arithmetic, one step at a time.
  for (int t = 0; t < kThreads; ++t)
    for (int i = 0; i < kN; ++i) {
      float v = static_cast<float>(t + i * 0.5);
      const float f = static_cast<float>(factor_of(t % 2, i));
      for (int c = 0; c < kCalls; ++c) v = (v + 1.0f) * f;
      ASSERT_EQ(got[static_cast<size_t>(t * kN + i)], static_cast<double>(v))
          << "thread " << t << " element " << i;
    }
  ones.clear();
  factors.clear();
  for (int dev = 0; dev < 2; ++dev) EXPECT_EQ(rt->devices().at(dev).allocator().stats().allocated_bytes, 0);
  auto stats = d.stats();
  int64_t calls = 0;
  for (const auto& s : stats) calls += s.calls;
  EXPECT_EQ(calls, 2LL * kThreads * kCalls);
}

// The registry and the op-mapping table are read without a lock (Note [Why
// dispatch reads take no lock]) while writers publish new snapshots: here
// four threads dispatch (by handle and by name, through a mapping) while
// the main thread loads plugins, which define ops and add kernels, and
// changes the mapping the threads resolve. Every result is checked; under
// ThreadSanitizer this is the lock-free design's test.
TEST(Concurrency, DispatchWhilePluginsLoadAndTheOpMapChanges) {
  auto rt = make_runtime();
  load_ok(*rt, builtin_plugin("npub_cann_like"));
  Dispatcher& d = rt->dispatcher();
  rt->op_map().set({"fw::plus", "aten::add.out", ""});
  std::atomic<bool> stop{false};
  std::atomic<int64_t> checked{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      sim::Device* dev = &rt->devices().at(t % 2);
      Tensor a = Tensor::from_values({16}, DType::kFloat32, std::vector<double>(16, t), dev);
      Tensor b = Tensor::from_values({16}, DType::kFloat32, std::vector<double>(16, 2), dev);
      Tensor out = Tensor::empty({16}, DType::kFloat32, dev);
      NpubValue rets[1] = {};
      while (!stop.load(std::memory_order_relaxed)) {
        NpubValue args[] = {tensor_value(a.dl()), tensor_value(b.dl()), int_value(1), tensor_value(out.dl())};
        d.call("fw::plus", args, 4, rets, 1, nullptr);  // resolved through the mapping each time
        const auto v = out.to_doubles();
        for (double e : v) ASSERT_EQ(e, t + 2.0);
        checked.fetch_add(1, std::memory_order_relaxed);
      }
    });
  }
  load_ok(*rt, test_plugin("npub_test_testsel"));
  for (int i = 0; i < 200; ++i)
    rt->op_map().set({"fw::other" + std::to_string(i), "testsel::twice", "testsel"});
  rt->op_map().set({"fw::plus", "aten::add.out", "cann_like"});
  load_ok(*rt, test_plugin("npub_test_good_c"));
  while (checked.load() < 200) std::this_thread::yield();
  stop = true;
  for (auto& th : threads) th.join();
  EXPECT_EQ(d.op("fw::plus").preferred_plugin, rt->loader().plugin("cann_like").get());
}

namespace {

// One call of the GEMM test below: an op on fixed inputs (one copy per
// device), its float64 reference and the bound's terms.
struct GemmCase {
  std::string name;
  DType dtype = DType::kFloat32;
  int64_t k = 0;                         // products summed per element
  std::vector<double> exact, magnitude;  // per output element
  std::vector<int64_t> out_shape;        // .out ops; empty: the op returns its result
  // Runs the op on device `dev` (0 or 1); `out` is preset to NaN (.out ops).
  std::function<std::vector<double>(Dispatcher&, int dev, Tensor* out)> run;
};

std::vector<double> random_values(size_t n, unsigned seed) {
  std::mt19937 g(seed);
  std::uniform_real_distribution<double> u(-2, 2);
  std::vector<double> v(n);
  for (auto& e : v) e = u(g);
  return v;
}

// The inputs of a case on both devices, and their values after rounding to
// the dtype (what the reference uses).
struct Inputs {
  Tensor t[2];
  std::vector<double> v;
};
Inputs make_input(Runtime& rt, const std::vector<int64_t>& shape, DType dtype, unsigned seed) {
  size_t n = 1;
  for (int64_t s : shape) n *= static_cast<size_t>(s);
  Inputs in;
  const auto values = random_values(n, seed);
  for (int dev = 0; dev < 2; ++dev)
    in.t[dev] = Tensor::from_values(shape, dtype, values, &rt.devices().at(dev));
  in.v = in.t[0].to_doubles();
  return in;
}

// C[b] = alpha * A[b] @ B[b] + beta * self (self broadcast from [n] or [b, m, n]).
void reference_gemm(int64_t batches, int64_t m, int64_t k, int64_t n, const std::vector<double>& a,
                    const std::vector<double>& b, const std::vector<double>* self, bool self_is_row,
                    double beta, double alpha, GemmCase* c) {
  c->k = k;
  c->exact.assign(static_cast<size_t>(batches * m * n), 0.0);
  c->magnitude.assign(c->exact.size(), 0.0);
  for (int64_t bi = 0; bi < batches; ++bi)
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) {
        double s = 0, mag = 0;
        for (int64_t p = 0; p < k; ++p) {
          const double t =
              a[static_cast<size_t>((bi * m + i) * k + p)] * b[static_cast<size_t>((bi * k + p) * n + j)];
          s += t;
          mag += std::fabs(t);
        }
        const size_t at = static_cast<size_t>((bi * m + i) * n + j);
        const double sv = self == nullptr ? 0.0 : (*self)[self_is_row ? static_cast<size_t>(j) : at];
        c->exact[at] = alpha * s + (beta == 0 ? 0.0 : beta * sv);
        c->magnitude[at] = std::fabs(alpha) * mag + (beta == 0 ? 0.0 : std::fabs(beta * sv));
      }
}

// `keep` holds the inputs the cases refer to (a deque: references stay valid
// as it grows).
std::vector<GemmCase> gemm_cases(Runtime& rt, std::deque<Inputs>& keep) {
  std::vector<GemmCase> cases;
  unsigned seed = 100;
  auto input = [&](const std::vector<int64_t>& shape, DType dtype) -> Inputs& {
    keep.push_back(make_input(rt, shape, dtype, seed++));
    return keep.back();
  };
  // mm: small (one thread), large enough to be split over the compute
  // threads in blocks of rows, odd sizes; float32 and bfloat16; and mat2
  // transposed (the strided kernel).
  for (DType dtype : {DType::kFloat32, DType::kBFloat16})
    for (auto [m, k, n] :
         {std::array<int64_t, 3>{17, 33, 9}, {128, 128, 128}, {300, 96, 70}, {512, 64, 96}}) {
      Inputs& a = input({m, k}, dtype);
      Inputs& b = input({k, n}, dtype);
      GemmCase c;
      c.name = std::string("mm ") + (dtype == DType::kFloat32 ? "float32 " : "bfloat16 ") +
               std::to_string(m) + "x" + std::to_string(k) + "x" + std::to_string(n);
      c.dtype = dtype;
      c.out_shape = {m, n};
      reference_gemm(1, m, k, n, a.v, b.v, nullptr, false, 0, 1, &c);
      c.run = [&a, &b](Dispatcher& d, int dev, Tensor* out) {
        NpubValue args[] = {tensor_value(a.t[dev].dl()), tensor_value(b.t[dev].dl()),
                            tensor_value(out->dl())};
        NpubValue rets[1] = {};
        d.call("aten::mm.out", args, 3, rets, 1, nullptr);
        return out->to_doubles();
      };
      cases.push_back(std::move(c));
    }
  {  // mm with mat2 stored transposed
    const int64_t m = 200, k = 80, n = 60;
    Inputs& a = input({m, k}, DType::kFloat32);
    Inputs& bt = input({n, k}, DType::kFloat32);  // B^T, row-major
    std::vector<double> b(static_cast<size_t>(k * n));
    for (int64_t p = 0; p < k; ++p)
      for (int64_t j = 0; j < n; ++j)
        b[static_cast<size_t>(p * n + j)] = bt.v[static_cast<size_t>(j * k + p)];
    GemmCase c;
    c.name = "mm float32 200x80x60, mat2 transposed";
    c.out_shape = {m, n};
    reference_gemm(1, m, k, n, a.v, b, nullptr, false, 0, 1, &c);
    c.run = [&a, &bt, k, n](Dispatcher& d, int dev, Tensor* out) {
      Tensor view = bt.t[dev].as_strided({k, n}, {1, k}, 0);
      NpubValue args[] = {tensor_value(a.t[dev].dl()), tensor_value(view.dl()), tensor_value(out->dl())};
      NpubValue rets[1] = {};
      d.call("aten::mm.out", args, 3, rets, 1, nullptr);
      return out->to_doubles();
    };
    cases.push_back(std::move(c));
  }
  for (DType dtype : {DType::kFloat32, DType::kBFloat16}) {  // addmm, bias row, beta 0.5, alpha 2
    const int64_t m = 160, k = 100, n = 48;
    Inputs& self = input({n}, dtype);
    Inputs& a = input({m, k}, dtype);
    Inputs& b = input({k, n}, dtype);
    GemmCase c;
    c.name = std::string("addmm ") + (dtype == DType::kFloat32 ? "float32" : "bfloat16");
    c.dtype = dtype;
    c.out_shape = {m, n};
    reference_gemm(1, m, k, n, a.v, b.v, &self.v, true, 0.5, 2.0, &c);
    c.run = [&self, &a, &b](Dispatcher& d, int dev, Tensor* out) {
      NpubValue args[] = {tensor_value(self.t[dev].dl()),
                          tensor_value(a.t[dev].dl()),
                          tensor_value(b.t[dev].dl()),
                          double_value(0.5),
                          double_value(2.0),
                          tensor_value(out->dl())};
      NpubValue rets[1] = {};
      d.call("aten::addmm.out", args, 6, rets, 1, nullptr);
      return out->to_doubles();
    };
    cases.push_back(std::move(c));
  }
  for (auto [bs, m, k, n] : {std::array<int64_t, 4>{6, 20, 32, 24},
                             {2, 256, 64, 40}}) {  // bmm: batches over threads, and split rows
    Inputs& a = input({bs, m, k}, DType::kFloat32);
    Inputs& b = input({bs, k, n}, DType::kFloat32);
    GemmCase c;
    c.name = "bmm float32 " + std::to_string(bs) + "x" + std::to_string(m) + "x" + std::to_string(k) + "x" +
             std::to_string(n);
    c.out_shape = {bs, m, n};
    reference_gemm(bs, m, k, n, a.v, b.v, nullptr, false, 0, 1, &c);
    c.run = [&a, &b](Dispatcher& d, int dev, Tensor* out) {
      NpubValue args[] = {tensor_value(a.t[dev].dl()), tensor_value(b.t[dev].dl()), tensor_value(out->dl())};
      NpubValue rets[1] = {};
      d.call("aten::bmm.out", args, 3, rets, 1, nullptr);
      return out->to_doubles();
    };
    cases.push_back(std::move(c));
  }
  {  // convolution (im2col + GEMM per image and group), with bias
    const int64_t N = 3, C = 4, H = 12, W = 10, OC = 6, KH = 3, KW = 3;  // stride 1, padding 1
    Inputs& x = input({N, C, H, W}, DType::kFloat32);
    Inputs& w = input({OC, C, KH, KW}, DType::kFloat32);
    Inputs& bias = input({OC}, DType::kFloat32);
    GemmCase c;
    c.name = "convolution float32 3x4x12x10 * 6x4x3x3";
    c.k = C * KH * KW + 1;
    for (int64_t ni = 0; ni < N; ++ni)
      for (int64_t oc = 0; oc < OC; ++oc)
        for (int64_t y = 0; y < H; ++y)
          for (int64_t xo = 0; xo < W; ++xo) {
            double s = bias.v[static_cast<size_t>(oc)], mag = std::fabs(s);
            for (int64_t ci = 0; ci < C; ++ci)
              for (int64_t ky = 0; ky < KH; ++ky)
                for (int64_t kx = 0; kx < KW; ++kx) {
                  const int64_t iy = y + ky - 1, ix = xo + kx - 1;
                  if (iy < 0 || iy >= H || ix < 0 || ix >= W) continue;
                  const double t = x.v[static_cast<size_t>(((ni * C + ci) * H + iy) * W + ix)] *
                                   w.v[static_cast<size_t>(((oc * C + ci) * KH + ky) * KW + kx)];
                  s += t;
                  mag += std::fabs(t);
                }
            c.exact.push_back(s);
            c.magnitude.push_back(mag);
          }
    c.run = [&rt, &x, &w, &bias](Dispatcher& d, int dev, Tensor*) {
      TensorOutputs outs(rt.devices());
      const std::vector<int64_t> ones = {1, 1}, zeros = {0, 0};  // the values point into these
      NpubValue args[] = {
          tensor_value(x.t[dev].dl()), tensor_value(w.t[dev].dl()), tensor_value(bias.t[dev].dl()),
          int_list_value(ones),        int_list_value(ones),        int_list_value(ones),
          bool_value(false),           int_list_value(zeros),       int_value(1)};
      NpubValue rets[1] = {};
      d.call("aten::convolution_overrideable", args, 9, rets, 1, &outs);
      return outs[0].to_doubles();
    };
    cases.push_back(std::move(c));
  }
  return cases;
}

}  // namespace

// Host threads on both devices issue matrix products and convolutions of
// mixed shapes and dtypes at once, while each device's compute threads split
// the large ones; every result is checked against its float64 reference
// (|err| <= k * 2^-24 * |A||B| + 1 ulp). The GEMM library must be safe to
// call from all of these threads at once (Note [GEMM runs on the caller's
// thread only], plugins/kernels/include/plugin_kernels/gemm.h): Debian's serial OpenBLAS
// returned wrong blocks of rows here. NPUB_SIM_THREADS sets the compute
// threads per device (default 4, more than this machine's cores).
TEST(Concurrency, MatrixProductsAndConvolutionsFromManyThreadsMatchFloat64) {
  RuntimeOptions o;
  o.devices = sim::DeviceOptions::from_env();
  o.devices.num_devices = 2;
  o.devices.memory_bytes = 1ull << 30;
  if (std::getenv("NPUB_SIM_THREADS") == nullptr) o.devices.compute_threads = 4;
  o.load_default_plugins = false;
  o.load_default_op_map = false;
  Runtime rt(o);
  load_ok(rt, builtin_plugin("npub_cann_like"));
  Dispatcher& d = rt.dispatcher();
  std::deque<Inputs> inputs;
  const std::vector<GemmCase> cases = gemm_cases(rt, inputs);

#if defined(__SANITIZE_THREAD__)
  constexpr int kRounds = 2;  // every case, every thread, twice: TSan is ~20x slower
#else
  constexpr int kRounds = 40;
#endif
  constexpr int kThreads = 6;
  std::atomic<int64_t> checked{0}, wrong{0};
  std::mutex first_mutex;
  std::string first_failure;
  {
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t)
      threads.emplace_back([&, t] {
        const int dev = t % 2;
        std::vector<Tensor> outs(cases.size());
        for (int round = 0; round < kRounds; ++round)
          for (size_t i = 0; i < cases.size(); ++i) {
            const size_t ci =
                (i + static_cast<size_t>(t) * 5) % cases.size();  // threads in different cases at once
            const GemmCase& c = cases[ci];
            Tensor& out = outs[ci];
            if (!c.out_shape.empty()) {
              if (!out.defined()) out = Tensor::empty(c.out_shape, c.dtype, &rt.devices().at(dev));
              std::memset(out.dl()->data, 0xff,
                          static_cast<size_t>(out.numel()) * (c.dtype == DType::kFloat32 ? 4 : 2));  // NaN
            }
            const std::string err =
                check_sum_of_products(c.run(d, dev, &out), c.exact, c.magnitude, c.k, c.dtype);
            ++checked;
            if (!err.empty()) {
              ++wrong;
              std::lock_guard<std::mutex> lock(first_mutex);
              if (first_failure.empty())
                first_failure = c.name + " (thread " + std::to_string(t) + "): " + err;
            }
          }
      });
    for (auto& th : threads) th.join();
  }
  EXPECT_EQ(wrong.load(), 0) << "of " << checked.load() << " results; first: " << first_failure;
  EXPECT_EQ(checked.load(), int64_t{kThreads} * kRounds * static_cast<int64_t>(cases.size()));
  inputs.clear();
  for (int dev = 0; dev < 2; ++dev) EXPECT_EQ(rt.devices().at(dev).allocator().stats().allocated_bytes, 0);
}

// The in-tree plugins against references computed here, independently.
#include "test_util.h"

#include <npubridge/device_sim/copy_engine.h>
#include <cmath>
#include <npubridge/half.hpp>

#include <cstdlib>
#include <random>

using namespace npub;
using namespace npub::test;

namespace {

class InTreePlugins : public ::testing::Test {
 protected:
  void SetUp() override {
    rt = make_runtime();
    for (const char* p : {"npub_cann_like", "npub_mindspeed_like", "npub_vllm_like"})
      load_ok(*rt, builtin_plugin(p));
    dev = &rt->devices().at(0);
  }
  std::vector<double> random(size_t n, unsigned seed) {
    std::mt19937 g(seed);
    std::uniform_real_distribution<double> u(-2, 2);
    std::vector<double> v(n);
    for (auto& e : v) e = static_cast<float>(u(g));
    return v;
  }
  std::unique_ptr<Runtime> rt;
  sim::Device* dev = nullptr;
};

TEST_F(InTreePlugins, AddAndMulBroadcast) {
  auto av = random(4 * 5, 1), bv = random(5, 2);
  Tensor a = Tensor::from_values({4, 5}, DType::kFloat32, av, dev);
  Tensor b = Tensor::from_values({5}, DType::kFloat32, bv, dev);
  Tensor out = Tensor::empty({4, 5}, DType::kFloat32, dev);
  NpubValue rets[1] = {};
  NpubValue args[] = {tensor_value(a.dl()), tensor_value(b.dl()), double_value(-1.5), tensor_value(out.dl())};
  rt->dispatcher().call("aten::add.out", args, 4, rets, 1, nullptr);
  std::vector<double> expect(20);
  for (int i = 0; i < 4; ++i)
    for (int j = 0; j < 5; ++j)
      expect[static_cast<size_t>(i * 5 + j)] = static_cast<float>(
          float(av[static_cast<size_t>(i * 5 + j)]) + float(-1.5) * float(bv[static_cast<size_t>(j)]));
  expect_values(out, expect, 1e-6);
  NpubValue margs[] = {tensor_value(a.dl()), tensor_value(b.dl()), tensor_value(out.dl())};
  rt->dispatcher().call("aten::mul.out", margs, 3, rets, 1, nullptr);
  for (int i = 0; i < 4; ++i)
    for (int j = 0; j < 5; ++j)
      expect[static_cast<size_t>(i * 5 + j)] =
          av[static_cast<size_t>(i * 5 + j)] * bv[static_cast<size_t>(j)];
  expect_values(out, expect, 1e-6);
  // int64 too
  Tensor ia = Tensor::from_values({3}, DType::kInt64, {1, -2, 3}, dev);
  Tensor iout = Tensor::empty({3}, DType::kInt64, dev);
  NpubValue iargs[] = {tensor_value(ia.dl()), tensor_value(ia.dl()), int_value(2), tensor_value(iout.dl())};
  rt->dispatcher().call("aten::add.out", iargs, 4, rets, 1, nullptr);
  expect_values(iout, {3, -6, 9});
}

TEST_F(InTreePlugins, MatmulMatchesNaiveDoubleReference) {
  const int m = 37, k = 300, n = 29;
  auto av = random(m * k, 3), bv = random(k * n, 4);
  Tensor a = Tensor::from_values({m, k}, DType::kFloat32, av, dev);
  Tensor b = Tensor::from_values({k, n}, DType::kFloat32, bv, dev);
  Tensor c = Tensor::empty({m, n}, DType::kFloat32, dev);
  NpubValue args[] = {tensor_value(a.dl()), tensor_value(b.dl()), tensor_value(c.dl())};
  NpubValue rets[1] = {};
  rt->dispatcher().call("aten::mm.out", args, 3, rets, 1, nullptr);
  std::vector<double> expect(static_cast<size_t>(m * n));
  for (int i = 0; i < m; ++i)
    for (int j = 0; j < n; ++j) {
      double s = 0;
      for (int p = 0; p < k; ++p)
        s += av[static_cast<size_t>(i * k + p)] * bv[static_cast<size_t>(p * n + j)];
      expect[static_cast<size_t>(i * n + j)] = s;
    }
  expect_values(c, expect, 1e-3);
  // A transposed (strided) operand is staged by the dispatcher.
  Tensor bt_base =
      Tensor::from_values({n, k}, DType::kFloat32, std::vector<double>(static_cast<size_t>(n * k)), dev);
  Tensor bt = bt_base.as_strided({k, n}, {1, k}, 0);
  sim::copy_tensor(*bt.dl(), *b.dl());
  NpubValue sargs[] = {tensor_value(a.dl()), tensor_value(bt.dl()), tensor_value(c.dl())};
  rt->dispatcher().call("aten::mm.out", sargs, 3, rets, 1, nullptr);
  expect_values(c, expect, 1e-3);
}

// A float32 linear layer's bias (addmm, beta and alpha 1, self a row of n
// or [1, n]) goes into the GEMM's accumulator: the result is the bias plus
// the product, within the product's bound; a NaN in the bias stays in its
// column; and an in-place addmm_ whose out is self (m == 1) still reads the
// bias before the product overwrites it.
TEST_F(InTreePlugins, Float32AddmmAddsTheBiasInTheGemm) {
  Dispatcher& d = rt->dispatcher();
  const int64_t m = 70, k = 300, n = 50;  // > 2^18 multiply-adds: split over the compute threads
  Tensor a = Tensor::from_values({m, k}, DType::kFloat32, random(m * k, 21), dev);
  Tensor b = Tensor::from_values({k, n}, DType::kFloat32, random(k * n, 22), dev);
  std::vector<double> sv = random(n, 23);
  sv[7] = NAN;
  const auto av = a.to_doubles(), bv = b.to_doubles();
  std::vector<double> expect(static_cast<size_t>(m * n)), mag(expect.size());
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double sum = sv[static_cast<size_t>(j)], abs_sum = std::fabs(sum);
      for (int64_t p = 0; p < k; ++p) {
        const double t = av[static_cast<size_t>(i * k + p)] * bv[static_cast<size_t>(p * n + j)];
        sum += t;
        abs_sum += std::fabs(t);
      }
      expect[static_cast<size_t>(i * n + j)] = sum;
      mag[static_cast<size_t>(i * n + j)] = abs_sum;
    }
  for (const std::vector<int64_t>& self_shape : {std::vector<int64_t>{n}, std::vector<int64_t>{1, n}}) {
    SCOPED_TRACE(self_shape.size() == 1 ? "self [n]" : "self [1, n]");
    Tensor self = Tensor::from_values(self_shape, DType::kFloat32, sv, dev);
    Tensor out = Tensor::empty({m, n}, DType::kFloat32, dev);
    NpubValue rets[1] = {};
    NpubValue args[] = {tensor_value(self.dl()), tensor_value(a.dl()), tensor_value(b.dl()),
                        double_value(1.0),       double_value(1.0),    tensor_value(out.dl())};
    d.call("aten::addmm.out", args, 6, rets, 1, nullptr);
    const auto got = out.to_doubles();
    std::vector<double> g, e, mg;  // the finite columns
    for (size_t i = 0; i < got.size(); ++i) {
      if (i % static_cast<size_t>(n) == 7) {
        EXPECT_TRUE(std::isnan(got[i])) << "element " << i;
        continue;
      }
      g.push_back(got[i]);
      e.push_back(expect[i]);
      mg.push_back(mag[i]);
    }
    EXPECT_EQ(check_sum_of_products(g, e, mg, k + 1, DType::kFloat32), "");
  }
  // addmm_ in place on a [1, n] self: out is self.
  Tensor row =
      Tensor::from_values({1, k}, DType::kFloat32, std::vector<double>(av.begin(), av.begin() + k), dev);
  std::vector<double> s1 = random(n, 24);
  Tensor inplace = Tensor::from_values({1, n}, DType::kFloat32, s1, dev);
  NpubValue rets[1] = {};
  NpubValue args[] = {tensor_value(inplace.dl()), tensor_value(row.dl()), tensor_value(b.dl()),
                      double_value(1.0),          double_value(1.0),      tensor_value(inplace.dl())};
  d.call("aten::addmm.out", args, 6, rets, 1, nullptr);
  std::vector<double> e1(static_cast<size_t>(n)), m1(e1.size());
  for (int64_t j = 0; j < n; ++j) {
    e1[static_cast<size_t>(j)] = s1[static_cast<size_t>(j)];
    m1[static_cast<size_t>(j)] = std::fabs(s1[static_cast<size_t>(j)]);
    for (int64_t p = 0; p < k; ++p) {
      const double t = av[static_cast<size_t>(p)] * bv[static_cast<size_t>(p * n + j)];
      e1[static_cast<size_t>(j)] += t;
      m1[static_cast<size_t>(j)] += std::fabs(t);
    }
  }
  EXPECT_EQ(check_sum_of_products(inplace.to_doubles(), e1, m1, k + 1, DType::kFloat32), "");
}

// bfloat16 and float16 products: fp32 accumulation, one rounding to the
// output dtype, ATen's alpha/beta (beta == 0 ignores self, NaNs included),
// a transposed operand; bfloat16 without the dispatcher's fp32 conversion
// where oneDNN has a bf16 kernel (AVX512-BF16 or AMX, not capped by
// ONEDNN_MAX_CPU_ISA).
TEST_F(InTreePlugins, HalfMatmulsAccumulateInFloat32AndRoundOnce) {
  Dispatcher& d = rt->dispatcher();
  auto conversions = [&](const char* op) {
    for (const auto& s : d.stats())
      if (s.op == op) return s.conversions;
    return int64_t{0};
  };
  for (DType dtype : {DType::kBFloat16, DType::kFloat16}) {
    SCOPED_TRACE(dtype == DType::kBFloat16 ? "bfloat16" : "float16");
    d.reset_stats();
    const int64_t m = 70, k = 300, n = 50;  // > 2^18 multiply-adds: split over the compute threads
    Tensor a = Tensor::from_values({m, k}, dtype, random(m * k, 11), dev);
    Tensor b = Tensor::from_values({k, n}, dtype, random(k * n, 12), dev);
    Tensor self = Tensor::from_values({n}, dtype, random(n, 13), dev);
    const auto av = a.to_doubles(), bv = b.to_doubles(), sv = self.to_doubles();
    std::vector<double> ab(static_cast<size_t>(m * n)), mag(ab.size());
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j)
        for (int64_t p = 0; p < k; ++p) {
          const double t = av[static_cast<size_t>(i * k + p)] * bv[static_cast<size_t>(p * n + j)];
          ab[static_cast<size_t>(i * n + j)] += t;
          mag[static_cast<size_t>(i * n + j)] += std::fabs(t);
        }
    Tensor out = Tensor::empty({m, n}, dtype, dev);
    NpubValue rets[1] = {};
    NpubValue mm[] = {tensor_value(a.dl()), tensor_value(b.dl()), tensor_value(out.dl())};
    d.call("aten::mm.out", mm, 3, rets, 1, nullptr);
    EXPECT_EQ(check_sum_of_products(out.to_doubles(), ab, mag, k, dtype), "");

    // addmm, beta 0.5 and alpha 2, self broadcast over the rows.
    std::vector<double> expect(ab.size()), expect_mag(ab.size());
    for (size_t i = 0; i < ab.size(); ++i) {
      expect[i] = 0.5 * sv[i % static_cast<size_t>(n)] + 2 * ab[i];
      expect_mag[i] = 0.5 * std::fabs(sv[i % static_cast<size_t>(n)]) + 2 * mag[i];
    }
    NpubValue addmm[] = {tensor_value(self.dl()), tensor_value(a.dl()), tensor_value(b.dl()),
                         double_value(0.5),       double_value(2.0),    tensor_value(out.dl())};
    d.call("aten::addmm.out", addmm, 6, rets, 1, nullptr);
    EXPECT_EQ(check_sum_of_products(out.to_doubles(), expect, expect_mag, k, dtype), "");

    // beta == 0: self is ignored, NaNs included.
    Tensor nan_self = Tensor::from_values({n}, dtype, std::vector<double>(static_cast<size_t>(n), NAN), dev);
    for (size_t i = 0; i < ab.size(); ++i) {
      expect[i] = 2 * ab[i];
      expect_mag[i] = 2 * mag[i];
    }
    NpubValue addmm0[] = {tensor_value(nan_self.dl()), tensor_value(a.dl()), tensor_value(b.dl()),
                          double_value(0.0),           double_value(2.0),    tensor_value(out.dl())};
    d.call("aten::addmm.out", addmm0, 6, rets, 1, nullptr);
    EXPECT_EQ(check_sum_of_products(out.to_doubles(), expect, expect_mag, k, dtype), "");

    // mm with a transposed mat2 (the strided kernel's layout).
    Tensor bt_base = Tensor::empty({n, k}, dtype, dev);
    Tensor bt = bt_base.as_strided({k, n}, {1, k}, 0);
    sim::copy_tensor(*bt.dl(), *b.dl());
    NpubValue mmt[] = {tensor_value(a.dl()), tensor_value(bt.dl()), tensor_value(out.dl())};
    d.call("aten::mm.out", mmt, 3, rets, 1, nullptr);
    EXPECT_EQ(check_sum_of_products(out.to_doubles(), ab, mag, k, dtype), "");

    const bool native_bf16 = dtype == DType::kBFloat16 && __builtin_cpu_supports("avx512bf16") &&
                             std::getenv("ONEDNN_MAX_CPU_ISA") == nullptr;
    if (native_bf16) {
      EXPECT_EQ(conversions("aten::mm.out"), 0);
      EXPECT_EQ(conversions("aten::addmm.out"), 0);
    }
  }
}

// cann_like's elementwise loops exist per ISA level (AVX-512, AVX2,
// baseline; NPUB_PLUGINS_MAX_ISA caps the level): every level must give the
// same correctly rounded bfloat16 and float16 results, denormals kept (see
// Note [bfloat16 rounding without vcvtneps2bf16]), NaN and infinity kept.
TEST(CannLikeIsaLevels, HalfElementwiseResultsAreRoundedOnceAtEveryLevel) {
  std::vector<double> av, bv;
  const double specials[] = {1e-39,  -3e-40,   9.2e-41,   1.1754944e-38, 1.0, -2.5,
                             3.0e38, INFINITY, -INFINITY, NAN,           0.0, -0.0};
  std::mt19937 g(7);
  std::uniform_real_distribution<double> u(-4, 4);
  for (int i = 0; i < 100; ++i) {  // > 16 elements: the vector loops, then a tail
    av.push_back(i < 12 ? specials[i] : u(g));
    bv.push_back(i < 12 ? 0.0 : i < 24 ? specials[i - 12] * 0.75 : u(g));
  }
  const int64_t n = static_cast<int64_t>(av.size());
  for (const char* level : {"avx512", "avx2", "baseline"}) {
    ScopedEnv cap("NPUB_PLUGINS_MAX_ISA", level);
    auto rt = make_runtime();
    load_ok(*rt, builtin_plugin("npub_cann_like"));
    sim::Device* dev = &rt->devices().at(0);
    for (DType dtype : {DType::kBFloat16, DType::kFloat16}) {
      SCOPED_TRACE(std::string(level) + (dtype == DType::kBFloat16 ? " bfloat16" : " float16"));
      Tensor a = Tensor::from_values({n}, dtype, av, dev), b = Tensor::from_values({n}, dtype, bv, dev);
      const auto ra = a.to_doubles(), rb = b.to_doubles();  // the inputs as stored
      Tensor out = Tensor::empty({n}, dtype, dev);
      NpubValue rets[1] = {};
      struct Case {
        const char* op;
        double alpha;
      };
      for (const Case c :
           {Case{"aten::add.out", 1.0}, Case{"aten::add.out", -0.5}, Case{"aten::mul.out", 0.0}}) {
        SCOPED_TRACE(std::string(c.op) + " alpha " + std::to_string(c.alpha));
        const bool mul = std::string(c.op) == "aten::mul.out";
        std::vector<NpubValue> args{tensor_value(a.dl()), tensor_value(b.dl())};
        if (!mul) args.push_back(double_value(c.alpha));
        args.push_back(tensor_value(out.dl()));
        rt->dispatcher().call(c.op, args.data(), static_cast<int32_t>(args.size()), rets, 1, nullptr);
        // float32 arithmetic (exact products and sums of two half values
        // need at most 2 roundings' worth of bits; float's 24 cover a*b),
        // then one rounding to the half type.
        std::vector<double> expect(av.size());
        for (size_t i = 0; i < av.size(); ++i) {
          const float x = static_cast<float>(ra[i]), y = static_cast<float>(rb[i]);
          const float r = mul ? x * y : c.alpha == 1.0 ? x + y : x + static_cast<float>(c.alpha) * y;
          expect[i] = dtype == DType::kBFloat16 ? half::bf16_to_float(half::float_to_bf16(r))
                                                : half::half_to_float(half::float_to_half(r));
        }
        const auto got = out.to_doubles();
        for (size_t i = 0; i < got.size(); ++i) {
          if (std::isnan(expect[i])) {
            EXPECT_TRUE(std::isnan(got[i])) << "element " << i;
          } else {
            EXPECT_EQ(got[i], expect[i]) << "element " << i << ": " << ra[i] << ", " << rb[i];
          }
        }
      }
    }
  }
}

// One cap for every in-tree plugin (Note [One ISA layer for the in-tree
// plugins], plugins/kernels/include/plugin_kernels/isa.h): each refuses a
// level it does not know, and a value in a per-plugin cap it replaced.
TEST(InTreePluginsIsaCap, AnUnknownLevelRejectsEachPluginNamingTheVariable) {
  ScopedEnv cap("NPUB_PLUGINS_MAX_ISA", "avx9");
  for (const char* name : {"npub_cann_like", "npub_mindspeed_like", "npub_vllm_like"}) {
    SCOPED_TRACE(name);
    auto rt = make_runtime();
    const std::string path = builtin_plugin(name);
    LoadResult r = rt->loader().load(path);
    EXPECT_FALSE(r.ok);
    EXPECT_EQ(
        r.error,
        "plugin '" + path +
            "' rejected: initialize failed: NPUB_PLUGINS_MAX_ISA: expected one of baseline, avx2, avx512 "
            "(or unset) but found 'avx9'");
    EXPECT_TRUE(rt->loader().plugins().empty());
  }
}

TEST(InTreePluginsIsaCap, TheRetiredPerPluginCapsAreRefusedNamingTheOneCap) {
  for (const char* retired : {"NPUB_CANN_MAX_ISA", "NPUB_MINDSPEED_MAX_ISA", "NPUB_VLLM_MAX_ISA"}) {
    ScopedEnv cap(retired, " baseline ");
    for (const char* name : {"npub_cann_like", "npub_mindspeed_like", "npub_vllm_like"}) {
      SCOPED_TRACE(std::string(retired) + " " + name);
      auto rt = make_runtime();
      const std::string path = builtin_plugin(name);
      LoadResult r = rt->loader().load(path);
      EXPECT_FALSE(r.ok);
      EXPECT_EQ(r.error,
                "plugin '" + path + "' rejected: initialize failed: " + retired +
                    ": expected unset (the in-tree plugins read one cap, NPUB_PLUGINS_MAX_ISA) but found "
                    "'baseline'");
    }
  }
  ScopedEnv unset("NPUB_CANN_MAX_ISA", "");  // empty is unset
  auto rt = make_runtime();
  EXPECT_TRUE(rt->loader().load(builtin_plugin("npub_cann_like")).ok);
}

TEST_F(InTreePlugins, RmsNormAndSiluAndMul) {
  const int rows = 6, cols = 16;
  auto xv = random(rows * cols, 5), gv = random(cols, 6);
  Tensor x = Tensor::from_values({2, 3, cols}, DType::kFloat32, xv, dev);
  Tensor g = Tensor::from_values({cols}, DType::kFloat32, gv, dev);
  TensorOutputs outs(rt->devices());
  NpubValue args[] = {tensor_value(x.dl()), tensor_value(g.dl())};  // epsilon from its default
  NpubValue rets[2] = {};
  rt->dispatcher().call("mindspeed_like::npu_rms_norm", args, 2, rets, 2, &outs);
  std::vector<double> ey, er;
  for (int r = 0; r < rows; ++r) {
    double ss = 0;
    for (int c = 0; c < cols; ++c)
      ss += xv[static_cast<size_t>(r * cols + c)] * xv[static_cast<size_t>(r * cols + c)];
    const double inv = 1.0 / std::sqrt(ss / cols + 1e-6);
    er.push_back(inv);
    for (int c = 0; c < cols; ++c)
      ey.push_back(xv[static_cast<size_t>(r * cols + c)] * inv * gv[static_cast<size_t>(c)]);
  }
  expect_values(outs[0], ey, 1e-5);
  EXPECT_EQ(outs[1].shape(), (std::vector<int64_t>{2, 3, 1}));
  expect_values(outs[1], er, 1e-5);

  Tensor in = Tensor::from_values({rows, 2 * cols}, DType::kFloat32, random(rows * 2 * cols, 7), dev);
  Tensor out = Tensor::empty({rows, cols}, DType::kFloat32, dev);
  NpubValue sargs[] = {tensor_value(out.dl()), tensor_value(in.dl())};
  rt->dispatcher().call("vllm_like::silu_and_mul", sargs, 2, nullptr, 0, nullptr);
  auto iv = in.to_doubles();
  std::vector<double> es;
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < cols; ++c) {
      const double gte = iv[static_cast<size_t>(r * 2 * cols + c)];
      es.push_back(gte / (1 + std::exp(-gte)) * iv[static_cast<size_t>(r * 2 * cols + cols + c)]);
    }
  expect_values(out, es, 1e-5);
  // Fused ops are O2: at O1 they are not eligible.
  rt->dispatcher().set_opt_level(1);
  EXPECT_EQ(rt->dispatcher().select(rt->dispatcher().op("vllm_like::silu_and_mul"), sargs, 2), nullptr);
}

TEST_F(InTreePlugins, DropoutIsReproduciblePerSeedAndDisjointAcrossCalls) {
  Tensor x = Tensor::from_values({4096}, DType::kFloat32, std::vector<double>(4096, 2.0), dev);
  auto run = [&] {
    TensorOutputs outs(rt->devices());
    NpubValue args[] = {tensor_value(x.dl()), double_value(0.25), bool_value(true)};
    NpubValue rets[2] = {};
    rt->dispatcher().call("aten::native_dropout", args, 3, rets, 2, &outs);
    return std::make_pair(outs[0].to_doubles(), outs[1].to_doubles());
  };
  dev->manual_seed(1234);
  auto [out1, mask1] = run();
  auto [out2, mask2] = run();
  EXPECT_NE(mask1, mask2);  // the generator advanced
  dev->manual_seed(1234);
  auto [out3, mask3] = run();
  EXPECT_EQ(mask1, mask3);  // same seed, same stream
  EXPECT_EQ(out1, out3);
  double kept = 0;
  for (size_t i = 0; i < mask1.size(); ++i) {
    kept += mask1[i];
    EXPECT_FLOAT_EQ(static_cast<float>(out1[i]),
                    static_cast<float>(mask1[i] * 2.0 / 0.75));  // float32 output
  }
  EXPECT_NEAR(kept / 4096.0, 0.75, 0.05);
  EXPECT_EQ(dev->philox_state().seed, 1234u);
  EXPECT_EQ(dev->philox_state().offset, 1024u);  // one counter per 4 elements
}

}  // namespace

// Many host threads dispatch at once over two devices: every result equals
// a serial run and the allocator returns to zero.
#include "test_util.h"

#include <thread>

using namespace npub;
using namespace npub::test;

TEST(Concurrency, EightThreadsTenThousandCallsOverTwoDevices) {
  auto rt = make_runtime();
  load_ok(*rt, builtin_plugin("npub_cann_like"));
  Dispatcher& d = rt->dispatcher();
  const OpHandle add = d.op("aten::add.out");
  const OpHandle mul = d.op("aten::mul.out");
  constexpr int kThreads = 8, kCalls = 10000, kN = 64;
  std::vector<double> got(kThreads * kN);
  {
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&, t] {
        sim::Device* dev = &rt->devices().at(t % 2);
        std::vector<double> init(kN);
        for (int i = 0; i < kN; ++i) init[static_cast<size_t>(i)] = t + i * 0.5;
        Tensor acc = Tensor::from_values({kN}, DType::kFloat32, init, dev);
        Tensor one = Tensor::from_values({kN}, DType::kFloat32, std::vector<double>(kN, 1.0), dev);
        Tensor tmp = Tensor::empty({kN}, DType::kFloat32, dev);
        NpubValue rets[1] = {};
        for (int c = 0; c < kCalls; ++c) {
          // acc = (acc + 1) * 1 (exact in float32 for these magnitudes)
          NpubValue a[] = {tensor_value(acc.dl()), tensor_value(one.dl()), int_value(1), tensor_value(tmp.dl())};
          d.call(add, a, 4, rets, 1, nullptr);
          NpubValue m[] = {tensor_value(tmp.dl()), tensor_value(one.dl()), tensor_value(acc.dl())};
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
  // The serial reference: the same arithmetic, one step at a time.
  for (int t = 0; t < kThreads; ++t)
    for (int i = 0; i < kN; ++i) {
      float v = static_cast<float>(t + i * 0.5);
      for (int c = 0; c < kCalls; ++c) v = (v + 1.0f) * 1.0f;
      ASSERT_EQ(got[static_cast<size_t>(t * kN + i)], static_cast<double>(v)) << "thread " << t << " element " << i;
    }
  for (int dev = 0; dev < 2; ++dev) EXPECT_EQ(rt->devices().at(dev).allocator().stats().allocated_bytes, 0);
  auto stats = d.stats();
  int64_t calls = 0;
  for (const auto& s : stats) calls += s.calls;
  EXPECT_EQ(calls, 2LL * kThreads * kCalls);
}

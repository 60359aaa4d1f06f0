// Graph capture and replay on the simulated device (device_sim/graph_capture.h):
// records instead of runs, deep copies of arguments, the private pool, the
// operations a capture forbids, and captures next to other threads' work.
#include "test_util.h"

#include <npubridge/device_sim/copy_engine.h>
#include <npubridge/device_sim/graph_capture.h>
#include <npubridge/dispatcher/dispatcher.h>
#include <npubridge/support/error.h>

#include <atomic>
#include <functional>
#include <string>
#include <thread>
#include <vector>

using namespace npub;
using namespace npub::test;

namespace {

class GraphCaptureTest : public TestselAndCannLike {
 protected:
  void add(const Tensor& a, const Tensor& b, double alpha, const Tensor& out) {
    NpubValue args[] = {tensor_value(a.dl()), tensor_value(b.dl()), double_value(alpha),
                        tensor_value(out.dl())};
    NpubValue rets[1] = {};
    rt->dispatcher().call("aten::add.out", args, 4, rets, 1, nullptr);
  }
  void mul(const Tensor& a, const Tensor& b, const Tensor& out) {
    NpubValue args[] = {tensor_value(a.dl()), tensor_value(b.dl()), tensor_value(out.dl())};
    NpubValue rets[1] = {};
    rt->dispatcher().call("aten::mul.out", args, 3, rets, 1, nullptr);
  }
  const reg::Kernel& add_kernel() {
    Tensor x = f32({1}, {0});
    const std::vector<NpubValue> args{tensor_value(x.dl()), tensor_value(x.dl()), double_value(1),
                                      tensor_value(x.dl())};
    return *rt->dispatcher().select(rt->dispatcher().op("aten::add.out"), args.data(), 4);
  }
};

TEST_F(GraphCaptureTest, RecordsKernelsWithoutRunningThemAndReplaysInOrder) {
  Tensor a = f32({4}, {1, 2, 3, 4});
  Tensor b = f32({4}, {10, 20, 30, 40});
  const reg::Kernel& k = add_kernel();
  const int64_t calls_before = k.calls.load();
  sim::Graph g;
  g.capture_begin(*dev);
  Tensor sum = Tensor::empty({4}, DType::kFloat32, dev);  // from the graph's pool
  Tensor prod = Tensor::empty({4}, DType::kFloat32, dev);
  add(a, b, 2.0, sum);  // sum = a + 2b
  mul(sum, a, prod);    // prod = sum * a
  g.capture_end();
  EXPECT_EQ(k.calls.load(), calls_before) << "a captured kernel must not run";
  EXPECT_EQ(g.describe(),
            (std::vector<std::string>{"kernel cann_like: aten::add.out", "kernel cann_like: aten::mul.out"}));
  g.replay();
  expect_values(prod, {21, 84, 189, 336});
  EXPECT_EQ(k.calls.load(), calls_before + 1);
  // A static input updated in place: the next replay reads the new values.
  sim::write_doubles(*a.dl(), {0, 1, 0, 1});
  g.replay();
  expect_values(sum, {20, 41, 60, 81});
  expect_values(prod, {0, 41, 0, 81});
}

TEST_F(GraphCaptureTest, RecordsOwnTheirShapesStridesAndLists) {
  Tensor a = f32({2, 3}, {1, 2, 3, 4, 5, 6});
  Tensor out = Tensor::empty({2}, DType::kFloat32, dev);
  sim::Graph g;
  {
    // The call's DLTensor, its shape and strides and the dim list live on
    // this scope's stack and are overwritten before the replay.
    int64_t shape[2] = {2, 3};
    int64_t strides[2] = {3, 1};
    DLTensor view = *a.dl();
    view.shape = shape;
    view.strides = strides;
    std::vector<int64_t> dims{1};
    NpubValue args[] = {tensor_value(&view), int_list_value(dims), bool_value(false), none_value(),
                        tensor_value(out.dl())};
    NpubValue rets[1] = {};
    g.capture_begin(*dev);
    rt->dispatcher().call("aten::sum.IntList_out", args, 5, rets, 1, nullptr);
    g.capture_end();
    shape[0] = shape[1] = strides[0] = strides[1] = 0;
    dims[0] = 0;
  }
  g.replay();
  expect_values(out, {6, 15});
}

TEST_F(GraphCaptureTest, ConvertedCallsRecordTheirStagingCopies) {
  // float16 add runs on the float32 kernel: staging copies in, the kernel,
  // the copy back: all recorded.
  Tensor a = Tensor::from_values({3}, DType::kFloat16, {1, 2, 3}, dev);
  Tensor b = Tensor::from_values({3}, DType::kFloat16, {0.5, 0.25, 4}, dev);
  Tensor out = Tensor::empty({3}, DType::kFloat16, dev);
  sim::Graph g;
  g.capture_begin(*dev);
  add(a, b, 1.0, out);
  g.capture_end();
  if (g.num_nodes() > 1) {  // when cann_like has no float16 add
    EXPECT_NE(g.describe().front().find("copy"), std::string::npos);
  }
  g.replay();
  expect_values(out, {1.5, 2.25, 7});
}

TEST_F(GraphCaptureTest, PoolReusesBlocksFreedDuringTheCaptureAndHoldsItsMemoryUntilReset) {
  sim::CachingAllocator& alloc = dev->allocator();
  alloc.empty_cache();
  const int64_t reserved_before = alloc.stats().reserved_bytes;
  sim::Graph g;
  g.capture_begin(*dev);
  void* first = dev->allocate(4096);
  dev->free(first);
  void* second = dev->allocate(4096);  // freed inside the capture: reused, in order
  EXPECT_EQ(second, first);
  g.capture_end();
  EXPECT_GT(alloc.pool_reserved_bytes(g.pool()), 0u);
  // Eager allocations never get the pool's blocks.
  void* eager = dev->allocate(4096);
  const size_t pool_bytes = alloc.pool_reserved_bytes(g.pool());
  dev->free(second);
  alloc.empty_cache();  // the pool's free segments stay: the records use them
  EXPECT_EQ(alloc.pool_reserved_bytes(g.pool()), pool_bytes);
  EXPECT_NE(eager, first);
  dev->free(eager);
  const uint64_t pool = g.pool();
  g.reset();
  EXPECT_EQ(alloc.pool_reserved_bytes(pool), 0u);
  alloc.empty_cache();
  EXPECT_EQ(alloc.stats().reserved_bytes, reserved_before);
}

TEST_F(GraphCaptureTest, ABlockStillLiveAtResetReturnsItsSegmentWhenFreed) {
  sim::CachingAllocator& alloc = dev->allocator();
  alloc.empty_cache();
  const int64_t reserved_before = alloc.stats().reserved_bytes;
  sim::Graph g;
  g.capture_begin(*dev);
  void* static_output = dev->allocate(1 << 16);
  g.capture_end();
  g.reset();  // the user still holds the static output
  EXPECT_GT(alloc.stats().reserved_bytes, reserved_before);
  dev->free(static_output);
  EXPECT_EQ(alloc.stats().reserved_bytes, reserved_before);
}

TEST_F(GraphCaptureTest, GraphsShareAPoolUntilTheLastOneLetsGo) {
  sim::CachingAllocator& alloc = dev->allocator();
  const uint64_t pool = sim::CachingAllocator::new_pool_id();
  sim::Graph g1, g2;
  g1.capture_begin(*dev, pool);
  void* p1 = dev->allocate(4096);
  dev->free(p1);
  g1.capture_end();
  g2.capture_begin(*dev, pool);
  void* p2 = dev->allocate(4096);  // g1's freed block: the pool is shared
  g2.capture_end();
  EXPECT_EQ(p2, p1);
  EXPECT_EQ(g1.pool(), pool);
  EXPECT_EQ(g2.pool(), pool);
  dev->free(p2);
  g1.reset();
  EXPECT_GT(alloc.pool_reserved_bytes(pool), 0u);  // g2 still holds it
  g2.reset();
  EXPECT_EQ(alloc.pool_reserved_bytes(pool), 0u);
}

TEST_F(GraphCaptureTest, ForbiddenOperationsRaiseNamingTheOpEndTheCaptureAndLeaveTheDeviceWorking) {
  Tensor a = f32({3}, {1, 2, 3});
  Tensor i32 = Tensor::from_values({3}, DType::kInt32, {1, 0, 3}, dev);
  struct Case {
    const char* what;
    std::function<void()> op;
  };
  sim::Event event;
  event.record(dev->default_stream());
  sim::Generator explicit_generator(7);
  const std::vector<Case> cases{
      {"Tensor::to", [&] { (void)a.to(nullptr); }},
      {"Tensor::to_doubles", [&] { (void)a.to_doubles(); }},
      {"Tensor::from_values", [&] { (void)f32({1}, {1}); }},
      {"synchronize of npu:0", [&] { dev->synchronize(); }},
      {"synchronize of npu:0 stream 0", [&] { dev->default_stream().synchronize(); }},
      {"event synchronize", [&] { event.synchronize(); }},
      {"op 'testsel::which'",  // int32: no kernel, the host's fallback
       [&] {
         Tensor out = Tensor::empty({3}, DType::kInt32, dev);
         NpubValue args[] = {tensor_value(i32.dl()), tensor_value(out.dl())};
         NpubValue rets[1] = {};
         rt->dispatcher().call("testsel::which", args, 2, rets, 1, nullptr);
       }},
      {"op 'aten::nonzero'",
       [&] {
         NpubValue args[] = {tensor_value(i32.dl())};
         NpubValue rets[1] = {none_value()};
         struct Outs final : OutputAllocator {
           std::vector<Tensor> made;
           sim::Device* d;
           explicit Outs(sim::Device* dv) : d(dv) {}
           DLTensor* allocate(int32_t, const DLDevice&, int32_t ndim, const int64_t* shape,
                              DLDataType dtype) override {
             made.push_back(Tensor::empty(std::vector<int64_t>(shape, shape + ndim), dtype_of(dtype), d));
             return made.back().dl();
           }
         } outs(dev);
         rt->dispatcher().call("aten::nonzero", args, 1, rets, 1, &outs);
       }},
      {"op 'aten::uniform_'",
       [&] {
         ScopedCallGenerator bind(&explicit_generator);
         NpubValue args[] = {tensor_value(a.dl()), double_value(0), double_value(1), none_value()};
         NpubValue rets[1] = {};
         rt->dispatcher().call("aten::uniform_", args, 4, rets, 1, nullptr);
       }},
  };
  sim::CachingAllocator& alloc = dev->allocator();
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    sim::Graph g;
    g.capture_begin(*dev);
    const std::string err = error_of(c.op);
    EXPECT_EQ(
        err.rfind(std::string("npu:0 graph capture: ") + c.what + " is not allowed while capturing a graph (",
                  0),
        0u)
        << err;
    EXPECT_NE(err.find("the capture was ended and the graph is invalid"), std::string::npos) << err;
    EXPECT_FALSE(g.capturing());
    EXPECT_FALSE(sim::thread_is_capturing());
    EXPECT_EQ(
        error_of([&] { g.capture_end(); }),
        "graph capture_end: the capture was ended by an error inside it, and the graph is invalid: " + err);
    EXPECT_NE(error_of([&] { g.replay(); }).find("the graph is invalid"), std::string::npos);
    // The device keeps working: eager work runs, allocations are eager again.
    const uint64_t pool = g.pool();
    Tensor out = Tensor::empty({3}, DType::kFloat32, dev);
    const size_t pool_bytes = alloc.pool_reserved_bytes(pool);
    add(a, a, 1.0, out);
    expect_values(out, {2, 4, 6});
    EXPECT_EQ(alloc.pool_reserved_bytes(pool), pool_bytes);
    dev->synchronize();
    g.reset();
    EXPECT_EQ(alloc.pool_reserved_bytes(pool), 0u);
  }
}

TEST_F(GraphCaptureTest, ReplayInsideACaptureAndDoubleBeginAreRefused) {
  Tensor a = f32({2}, {1, 2});
  Tensor out = Tensor::empty({2}, DType::kFloat32, dev);
  sim::Graph g1, g2;
  g1.capture_begin(*dev);
  add(a, a, 1.0, out);
  EXPECT_EQ(error_of([&] { g1.capture_begin(*dev); }),
            "graph capture_begin: this graph already holds a capture (state capturing); call reset() before "
            "capturing again");
  EXPECT_EQ(
      error_of([&] { g2.capture_begin(*dev); }),
      "graph capture_begin: this thread is already capturing on npu:0 (captures cannot nest: one capture per "
      "thread and device)");
  g1.capture_end();
  g2.capture_begin(*dev);
  EXPECT_EQ(error_of([&] { g1.replay(); }),
            "graph replay: not allowed while this thread captures on npu:0 (graphs do not nest)");
  g2.capture_end();
  EXPECT_EQ(error_of([&] { sim::Graph().replay(); }), "graph replay: nothing was captured");
  g1.replay();
  expect_values(out, {2, 4});
}

TEST_F(GraphCaptureTest, RandomOpsDrawNewCountersAtEachReplayAsEagerDoes) {
  Tensor eager = Tensor::empty({64}, DType::kFloat32, dev);
  Tensor captured = Tensor::empty({64}, DType::kFloat32, dev);
  auto uniform = [&](const Tensor& t) {
    NpubValue args[] = {tensor_value(t.dl()), double_value(0), double_value(1), none_value()};
    NpubValue rets[1] = {};
    rt->dispatcher().call("aten::uniform_", args, 4, rets, 1, nullptr);
  };
  dev->manual_seed(42);
  uniform(eager);
  const std::vector<double> first = eager.to_doubles();
  uniform(eager);
  const std::vector<double> second = eager.to_doubles();
  sim::Graph g;
  g.capture_begin(*dev);
  uniform(captured);
  g.capture_end();
  dev->manual_seed(42);
  g.replay();
  EXPECT_EQ(captured.to_doubles(), first);
  g.replay();
  EXPECT_EQ(captured.to_doubles(), second);
}

// Threads: tests named *Concurrency* run under TSan.
class GraphCaptureConcurrencyTest : public GraphCaptureTest {};

TEST_F(GraphCaptureConcurrencyTest, OtherThreadsRunEagerlyBesideAThreadLocalCapture) {
  Tensor a = f32({1024}, std::vector<double>(1024, 1.5));
  sim::Graph g;
  g.capture_begin(*dev, 0, sim::CaptureMode::kThreadLocal);
  Tensor captured_out = Tensor::empty({1024}, DType::kFloat32, dev);
  std::atomic<bool> ok{true};
  sim::Stream& other_stream = dev->create_stream();
  std::thread other([&] {
    dev->set_current_stream(other_stream);  // not the capturing stream (Note [Work a capture cannot see])
    for (int i = 0; i < 20; ++i) {
      Tensor out = Tensor::empty({1024}, DType::kFloat32, dev);  // the ordinary cache, not the pool
      add(a, a, 1.0, out);
      if (out.to_doubles()[7] != 3.0) ok = false;
      dev->synchronize();
    }
  });
  add(a, a, 2.0, captured_out);
  other.join();
  g.capture_end();
  EXPECT_TRUE(ok.load());
  EXPECT_EQ(g.num_nodes(), 1u);
  g.replay();
  EXPECT_EQ(captured_out.to_doubles()[7], 4.5);
}

TEST_F(GraphCaptureConcurrencyTest, AnotherThreadsWorkOnTheCapturingStreamIsRefusedAndPoisonsTheCapture) {
  // What autograd's device thread does with a backward inside a capture:
  // work on the forward's (capturing) stream from a thread that does not
  // capture. It would run once now and never at replay.
  Tensor a = f32({4}, {1, 2, 3, 4});
  Tensor out = f32({4}, {0, 0, 0, 0});
  sim::Stream& s = dev->create_stream();
  dev->set_current_stream(s);
  sim::Graph g;
  g.capture_begin(*dev);
  std::string err;
  std::thread other([&] {
    dev->set_current_stream(s);
    err = error_of([&] { add(a, a, 1.0, out); });
  });
  other.join();
  const std::string expected =
      "npu:0 graph capture: op 'aten::add.out' was issued to the capturing stream from a thread that is not "
      "capturing (autograd runs a backward on its device thread): it would run now and never at replay, so "
      "it is refused and the capture is invalid; capturing a backward is not supported: capture the forward "
      "only, or run backward() outside the capture";
  EXPECT_EQ(err, expected);
  EXPECT_EQ(error_of([&] { g.capture_end(); }), "graph capture_end: the graph is invalid: " + expected);
  EXPECT_FALSE(g.captured());
  dev->set_current_stream(dev->default_stream());
  EXPECT_EQ(out.to_doubles(), (std::vector<double>{0, 0, 0, 0}));  // nothing ran
  add(a, a, 1.0, out);                                             // the device keeps working
  EXPECT_EQ(out.to_doubles(), (std::vector<double>{2, 4, 6, 8}));
}

TEST_F(GraphCaptureTest, WorkOnAnotherDeviceInsideACaptureIsRefusedNamingBothDevices) {
  sim::Device& dev1 = rt->devices().at(1);
  Tensor a = Tensor::from_values({2}, DType::kFloat32, {1, 2}, &dev1);
  Tensor out = Tensor::from_values({2}, DType::kFloat32, {0, 0}, &dev1);
  sim::Graph g;
  g.capture_begin(*dev);
  EXPECT_EQ(error_of([&] { add(a, a, 1.0, out); }),
            "npu:0 graph capture: op 'aten::add.out' on npu:1 is not allowed while capturing a graph (this "
            "thread captures on npu:0, and work on another device is neither recorded nor replayed; move the "
            "tensors to npu:0 or capture on npu:1); the capture was ended and the graph is invalid");
  EXPECT_FALSE(g.capturing());
  add(a, a, 1.0, out);
  EXPECT_EQ(out.to_doubles(), (std::vector<double>{2, 4}));
}

TEST_F(GraphCaptureConcurrencyTest, GlobalModeRefusesOtherThreadsSynchronize) {
  sim::Graph g;
  g.capture_begin(*dev, 0, sim::CaptureMode::kGlobal);
  std::string err;
  std::thread other([&] { err = error_of([&] { dev->synchronize(); }); });
  other.join();
  g.capture_end();
  EXPECT_EQ(
      err,
      "synchronize of npu:0 is not allowed while another thread captures a graph on npu:0 in global mode "
      "(the host would wait for work the capture records instead of running)");
  std::thread after([&] { dev->synchronize(); });  // the capture is over
  after.join();
}

TEST_F(GraphCaptureConcurrencyTest, RelaxedModeAllowsTheCapturingThreadToSynchronize) {
  sim::Graph g;
  g.capture_begin(*dev, 0, sim::CaptureMode::kRelaxed);
  dev->synchronize();
  EXPECT_TRUE(g.capturing());
  EXPECT_NE(error_of([&] { (void)f32({1}, {1}); }).find("Tensor::from_values is not allowed"),
            std::string::npos);
}

}  // namespace

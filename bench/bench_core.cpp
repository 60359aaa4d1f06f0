// Core benchmarks: dispatch overhead (by cached op handle and by op name,
// and with three tensor arguments whose dtypes are checked) against a direct
// call of the same kernel function, the caching
// allocator's cache-hit alloc+free, and stream enqueue-to-execution latency.
#include <npubridge/dispatcher/runtime.h>
#include <npubridge/dispatcher/value.h>

#include <benchmark/benchmark.h>

#include <atomic>
#include <chrono>
#include <memory>

using namespace npub;

namespace {

struct Fixture {
  std::unique_ptr<Runtime> rt;
  Tensor t;
  OpHandle op, op3;
  const reg::Kernel* kernel = nullptr;
  const reg::Kernel* kernel3 = nullptr;
  Fixture() {
    RuntimeOptions o;
    o.devices.num_devices = 1;
    o.devices.compute_threads = 1;
    o.load_default_plugins = false;
    o.load_default_op_map = false;
    rt = std::make_unique<Runtime>(o);
    LoadResult r = rt->loader().load(NPUB_BENCH_PLUGIN);
    if (!r.ok) throw std::runtime_error(r.error);
    t = Tensor::from_values({16}, DType::kFloat32, std::vector<double>(16, 0), &rt->devices().at(0));
    op = rt->dispatcher().op("bench::touch");
    kernel = op.op->kernels(NPUB_DEVICE_NPU).front();
    op3 = rt->dispatcher().op("bench::touch3");
    kernel3 = op3.op->kernels(NPUB_DEVICE_NPU).front();
  }
};

Fixture& fixture() {
  static Fixture f;
  return f;
}

void BM_DirectCall(benchmark::State& state) {
  Fixture& f = fixture();
  NpubValue args[] = {tensor_value(f.t.dl())};
  NpubValue rets[1] = {};
  NpubKernelFn fn = f.kernel->fn;
  benchmark::DoNotOptimize(fn);
  for (auto _ : state) {
    rets[0] = args[0];
    NpubError* e = fn(nullptr, args, 1, rets, 1);
    benchmark::DoNotOptimize(e);
    benchmark::ClobberMemory();
  }
}
BENCHMARK(BM_DirectCall);

void BM_DispatchByHandle(benchmark::State& state) {
  Fixture& f = fixture();
  NpubValue args[] = {tensor_value(f.t.dl())};
  NpubValue rets[1] = {};
  Dispatcher& d = f.rt->dispatcher();
  for (auto _ : state) {
    d.call(f.op, args, 1, rets, 1, nullptr);
    benchmark::ClobberMemory();
  }
}
BENCHMARK(BM_DispatchByHandle);

void BM_DispatchByName(benchmark::State& state) {
  Fixture& f = fixture();
  NpubValue args[] = {tensor_value(f.t.dl())};
  NpubValue rets[1] = {};
  Dispatcher& d = f.rt->dispatcher();
  for (auto _ : state) {
    d.call("bench::touch", args, 1, rets, 1, nullptr);
    benchmark::ClobberMemory();
  }
}
BENCHMARK(BM_DispatchByName);

// Three tensor arguments, every one checked against the kernel's dtype rules.
void BM_DirectCallThreeTensors(benchmark::State& state) {
  Fixture& f = fixture();
  NpubValue args[] = {tensor_value(f.t.dl()), tensor_value(f.t.dl()), tensor_value(f.t.dl())};
  NpubValue rets[1] = {};
  NpubKernelFn fn = f.kernel3->fn;
  benchmark::DoNotOptimize(fn);
  for (auto _ : state) {
    rets[0] = args[0];
    NpubError* e = fn(nullptr, args, 3, rets, 1);
    benchmark::DoNotOptimize(e);
    benchmark::ClobberMemory();
  }
}
BENCHMARK(BM_DirectCallThreeTensors);

// The three-tensor call's arguments: the fixture's tensor and two of 16
// floats on npu:0.
struct ThreeTensors {
  explicit ThreeTensors(Fixture& f)
      : a(Tensor::from_values({16}, DType::kFloat32, std::vector<double>(16, 0), &f.rt->devices().at(0))),
        b(Tensor::from_values({16}, DType::kFloat32, std::vector<double>(16, 0), &f.rt->devices().at(0))),
        args{tensor_value(f.t.dl()), tensor_value(a.dl()), tensor_value(b.dl())} {}
  Tensor a, b;
  NpubValue args[3];
};

void BM_DispatchThreeTensorsByHandle(benchmark::State& state) {
  Fixture& f = fixture();
  ThreeTensors call(f);
  NpubValue rets[1] = {};
  Dispatcher& d = f.rt->dispatcher();
  for (auto _ : state) {
    d.call(f.op3, call.args, 3, rets, 1, nullptr);
    benchmark::ClobberMemory();
  }
}
BENCHMARK(BM_DispatchThreeTensorsByHandle);

// The same call through its call plan (Note [One call plan per signature]):
// what the PyTorch bridges and graph mode run; validation and selection
// were done once, how the written tensors share memory is checked per run.
void BM_RunPlanThreeTensors(benchmark::State& state) {
  Fixture& f = fixture();
  ThreeTensors call(f);
  NpubValue rets[1] = {};
  Dispatcher& d = f.rt->dispatcher();
  const CallPlan plan = d.plan(f.op3, call.args, 3, PlanInputs::kCall);
  for (auto _ : state) {
    d.run(plan, call.args, 3, rets, 1, nullptr);
    benchmark::ClobberMemory();
  }
}
BENCHMARK(BM_RunPlanThreeTensors);

void BM_AllocFreeCacheHit(benchmark::State& state) {
  Fixture& f = fixture();
  sim::Device& dev = f.rt->devices().at(0);
  dev.free(dev.allocate(4096));  // warm the cache
  for (auto _ : state) {
    void* p = dev.allocate(4096);
    benchmark::DoNotOptimize(p);
    dev.free(p);
  }
}
BENCHMARK(BM_AllocFreeCacheHit);

// Time from Stream::enqueue to the task starting on the stream's worker,
// measured per task with steady_clock (manual time).
void BM_StreamEnqueueToExecution(benchmark::State& state) {
  Fixture& f = fixture();
  sim::Stream& s = f.rt->devices().at(0).create_stream();
  std::atomic<int64_t> started{0};
  for (auto _ : state) {
    const auto t0 = std::chrono::steady_clock::now();
    s.enqueue([&started] {
      started.store(std::chrono::steady_clock::now().time_since_epoch().count(), std::memory_order_release);
    });
    s.synchronize();
    const int64_t t1 = started.load(std::memory_order_acquire);
    state.SetIterationTime(static_cast<double>(t1 - t0.time_since_epoch().count()) * 1e-9);
  }
}
BENCHMARK(BM_StreamEnqueueToExecution)->UseManualTime();

}  // namespace

BENCHMARK_MAIN();

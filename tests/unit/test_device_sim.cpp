// The simulated NPU: caching allocator, out-of-memory, streams and events,
// compute pool, copy engine, half-precision conversions and a forked child.
#include "test_util.h"

#include <npubridge/device_sim/copy_engine.h>
#include <npubridge/support/error.h>
#include <npubridge/half.hpp>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <string>
#include <thread>

using namespace npub;
using namespace npub::sim;
using npub::test::expect_values;

TEST(CachingAllocator, ReusesSplitsAndMergesBlocks) {
  CachingAllocator a(0, 1ull << 30);
  const void* s = reinterpret_cast<const void*>(1);
  void* p1 = a.allocate(1000, s);
  void* p2 = a.allocate(3000, s);
  auto st = a.stats();
  EXPECT_EQ(st.num_segments, 1);  // both from one 2 MiB small segment
  EXPECT_EQ(st.reserved_bytes, 2 << 20);
  EXPECT_EQ(st.allocated_bytes, 1024 + 3072);
  EXPECT_EQ(st.requested_bytes, 4000);
  a.free(p1);
  void* p3 = a.allocate(900, s);  // reuses p1's block
  EXPECT_EQ(p3, p1);
  a.free(p2);
  a.free(p3);
  st = a.stats();
  EXPECT_EQ(st.allocated_bytes, 0);
  EXPECT_EQ(st.active_blocks, 0);
  // Everything merged back: a request of the whole segment is a cache hit.
  void* whole = a.allocate(1 << 20, s);
  EXPECT_EQ(a.stats().num_segments, 1);
  a.free(whole);
  a.empty_cache();
  EXPECT_EQ(a.stats().reserved_bytes, 0);
  EXPECT_EQ(a.stats().peak_allocated_bytes, 1 << 20);
  a.reset_peak_stats();
  EXPECT_EQ(a.stats().peak_allocated_bytes, 0);
}

// Segments start on a 2 MiB boundary (huge-page backed where the OS allows),
// and a steady alloc/free cycle keeps returning the same blocks.
TEST(CachingAllocator, SegmentsAreHugePageAlignedAndCyclesReuseBlocks) {
  CachingAllocator a(0, 1ull << 30);
  const void* s = reinterpret_cast<const void*>(1);
  void* small = a.allocate(100, s);
  void* large = a.allocate(4 << 20, s);
  void* huge = a.allocate(30 << 20, s);
  for (void* p : {small, large, huge}) EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % (2 << 20), 0u) << p;
  std::memset(huge, 1, 30 << 20);  // the whole mapping is usable
  void* first = nullptr;
  for (int i = 0; i < 100; ++i) {
    void* x = a.allocate(4 << 20, s);
    if (i == 0) first = x;
    EXPECT_EQ(x, first);
    a.free(x);
  }
  for (void* p : {small, large, huge}) a.free(p);
  EXPECT_EQ(a.stats().allocated_bytes, 0);
  a.empty_cache();
  EXPECT_EQ(a.stats().reserved_bytes, 0);
}

// A stream of medium tensors (x = x + b of 4 MiB each) lives in one 20 MiB
// segment: the allocator must not map a new segment per allocation.
TEST(CachingAllocator, MediumRequestsReuseTheSharedLargeSegment) {
  CachingAllocator a(0, 1ull << 30);
  const void* s = reinterpret_cast<const void*>(1);
  void* x = a.allocate(4 << 20, s);
  for (int i = 0; i < 100; ++i) {
    void* y = a.allocate(4 << 20, s);
    a.free(x);
    x = y;
  }
  EXPECT_EQ(a.stats().num_segments, 1);
  EXPECT_EQ(a.stats().reserved_bytes, CachingAllocator::kLargeSegment);
  a.free(x);
  // An oversize segment (made for one huge request) is not carved up for
  // medium requests.
  void* huge = a.allocate(64 << 20, s);
  a.free(huge);
  void* m = a.allocate(4 << 20, s);
  EXPECT_FALSE(m >= huge && m < static_cast<char*>(huge) + (64 << 20));
  a.free(m);
}

TEST(CachingAllocator, BlocksAreReusedOnlyOnTheirStream) {
  CachingAllocator a(0, 1ull << 30);
  const void* s1 = reinterpret_cast<const void*>(1);
  const void* s2 = reinterpret_cast<const void*>(2);
  void* p = a.allocate(4096, s1);
  a.free(p);
  void* q = a.allocate(4096, s2);
  EXPECT_NE(p, q);
  EXPECT_EQ(a.stats().num_segments, 2);
  a.free(q);
}

TEST(CachingAllocator, OutOfMemoryStatesRequestCapacityAllocatedAndReserved) {
  CachingAllocator a(1, 64ull << 20);
  const void* s = nullptr;
  void* p = a.allocate(40ull << 20, s);
  std::string msg;
  try {
    a.allocate(30ull << 20, s);
  } catch (const OutOfMemoryError& e) {
    msg = e.what();
  }
  EXPECT_EQ(msg,
            "npu:1 out of memory: tried to allocate 30.00 MiB; the device has a capacity of 64.00 MiB, of "
            "which 40.00 MiB is allocated and 40.00 MiB is reserved by the caching allocator (0 bytes cached "
            "and free). Free tensors, call empty_cache(), or raise NPUB_SIM_MEMORY.");
  EXPECT_EQ(a.stats().num_ooms, 1);
  // Cached free memory is released before giving up.
  a.free(p);
  void* big = a.allocate(60ull << 20, s);
  EXPECT_NE(big, nullptr);
  a.free(big);
  EXPECT_THROW(a.free(big), Error);  // double free is reported, not ignored
  EXPECT_THROW(a.allocate(1ull << 40, s), OutOfMemoryError);
}

// Note [The memory fraction limits reserved memory].
TEST(CachingAllocator, TheMemoryFractionLimitsReservedMemoryAndTheMessageNamesIt) {
  CachingAllocator a(0, 64ull << 20);
  const void* s = nullptr;
  a.set_memory_fraction(0.25);
  EXPECT_EQ(a.limit(), 16ull << 20);
  EXPECT_EQ(a.memory_fraction(), 0.25);
  void* p = a.allocate(12ull << 20, s);
  std::string msg;
  try {
    a.allocate(6ull << 20, s);
  } catch (const OutOfMemoryError& e) {
    msg = e.what();
  }
  EXPECT_EQ(msg,
            "npu:0 out of memory: tried to allocate 6.00 MiB; the device has a capacity of 64.00 MiB (this "
            "process may use 16.00 MiB of it: set_per_process_memory_fraction(0.25)), of which 12.00 MiB is "
            "allocated and 12.00 MiB is reserved by the caching allocator (0 bytes cached and free). Free "
            "tensors, call empty_cache(), or raise the memory fraction.");
  a.set_memory_fraction(1.0);
  void* q = a.allocate(6ull << 20, s);
  a.free(q);
  a.free(p);
  EXPECT_THROW(a.set_memory_fraction(1.5), Error);
  EXPECT_THROW(a.set_memory_fraction(-0.1), Error);
  EXPECT_THROW(a.set_memory_fraction(std::nan("")), Error);
  EXPECT_EQ(a.memory_fraction(), 1.0);
}

TEST(CachingAllocator, SnapshotListsSegmentsAndTheirBlocksInAddressOrder) {
  CachingAllocator a(0, 1ull << 30);
  const void* s = nullptr;
  void* p = a.allocate(1000, s);        // a 2 MiB small segment, split
  void* q = a.allocate(3ull << 20, s);  // a 20 MiB large segment
  const std::vector<SegmentSnapshot> segs = a.snapshot();
  ASSERT_EQ(segs.size(), 2u);
  EXPECT_LT(segs[0].address, segs[1].address);
  size_t reserved = 0;
  for (const SegmentSnapshot& seg : segs) {
    reserved += seg.size;
    size_t sum = 0;
    uintptr_t next = seg.address;
    for (const BlockSnapshot& b : seg.blocks) {
      EXPECT_EQ(b.address, next);  // blocks tile the segment
      next += b.size;
      sum += b.size;
    }
    EXPECT_EQ(sum, seg.size);
  }
  EXPECT_EQ(static_cast<int64_t>(reserved), a.stats().reserved_bytes);
  const SegmentSnapshot& small = segs[0].small ? segs[0] : segs[1];
  const SegmentSnapshot& large = segs[0].small ? segs[1] : segs[0];
  EXPECT_EQ(small.size, CachingAllocator::kSmallSegment);
  EXPECT_EQ(small.blocks[0].address, reinterpret_cast<uintptr_t>(p));
  EXPECT_TRUE(small.blocks[0].allocated);
  EXPECT_EQ(small.blocks[0].requested, 1000u);
  EXPECT_EQ(small.allocated, 1024u);  // rounded to 512-byte blocks
  EXPECT_EQ(large.size, CachingAllocator::kLargeSegment);
  EXPECT_EQ(large.allocated, 3ull << 20);
  EXPECT_EQ(large.blocks[0].address, reinterpret_cast<uintptr_t>(q));
  a.free(p);
  a.free(q);
  for (const SegmentSnapshot& seg : a.snapshot()) {
    ASSERT_EQ(seg.blocks.size(), 1u);  // merged back into one free block
    EXPECT_FALSE(seg.blocks[0].allocated);
    EXPECT_EQ(seg.allocated, 0u);
  }
}

// Note [Segments shrink to the capacity]: a device smaller than the
// preferred segment still serves every request that fits.
TEST(CachingAllocator, DevicesSmallerThanASegmentServeWhatFits) {
  const void* s = nullptr;
  CachingAllocator tiny(0, 1ull << 20);  // below one 2 MiB small segment
  void* p = tiny.allocate(4000, s);
  void* q = tiny.allocate(500000, s);
  EXPECT_NE(p, nullptr);
  EXPECT_NE(q, nullptr);
  EXPECT_LE(tiny.stats().reserved_bytes, int64_t{1} << 20);
  EXPECT_THROW(tiny.allocate(600000, s), OutOfMemoryError);  // 4000 + 500000 + 600000 > 1 MiB
  tiny.free(p);
  tiny.free(q);
  CachingAllocator small(0, 19ull << 20);  // below one 20 MiB large segment
  void* a = small.allocate(4, s);
  void* b = small.allocate((1ull << 20) + 4, s);  // was refused "with 4 KiB allocated"
  void* c = small.allocate(12ull << 20, s);
  EXPECT_NE(b, nullptr);
  EXPECT_NE(c, nullptr);
  EXPECT_LE(small.stats().reserved_bytes, int64_t{19} << 20);
  for (void* x : {a, b, c}) small.free(x);
  // Cached segments give way: the whole capacity in one request.
  void* all = small.allocate(19ull << 20, s);
  EXPECT_NE(all, nullptr);
  small.free(all);
}

TEST(Streams, RunInOrderAsynchronously) {
  Stream s(0, 1, false);
  std::vector<int> order;
  std::atomic<bool> release{false};
  s.enqueue([&] {
    while (!release.load()) std::this_thread::yield();
    order.push_back(1);
  });
  for (int i = 2; i <= 100; ++i) s.enqueue([&order, i] { order.push_back(i); });
  EXPECT_FALSE(s.query());  // blocked on the first task: the host is not
  release = true;
  s.synchronize();
  EXPECT_TRUE(s.query());
  ASSERT_EQ(order.size(), 100u);
  for (int i = 0; i < 100; ++i) EXPECT_EQ(order[static_cast<size_t>(i)], i + 1);
}

TEST(Streams, ErrorsSurfaceAtSynchronize) {
  Stream s(0, 1, false);
  s.enqueue([] { throw Error(ErrorCode::kInternal, "async failure"); });
  s.enqueue([] {});
  EXPECT_THROW(s.synchronize(), Error);
  EXPECT_NO_THROW(s.synchronize());  // reported once
}

TEST(Streams, LaunchBlockingRunsInline) {
  Stream s(0, 1, true);
  const auto caller = std::this_thread::get_id();
  std::thread::id ran_on;
  s.enqueue([&] { ran_on = std::this_thread::get_id(); });
  EXPECT_EQ(ran_on, caller);
  EXPECT_THROW(s.enqueue([] { throw Error(ErrorCode::kInternal, "x"); }), Error);
}

TEST(Events, OrderWorkAcrossStreamsAndTime) {
  Stream producer(0, 1, false), consumer(0, 2, false);
  std::atomic<bool> release{false};
  std::atomic<int> value{0};
  Event start, done;
  start.record(producer);
  producer.enqueue([&] {
    while (!release.load()) std::this_thread::yield();
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    value = 42;
  });
  done.record(producer);
  EXPECT_FALSE(done.query());
  consumer.wait_event(done);
  int seen = -1;
  consumer.enqueue([&] { seen = value.load(); });
  release = true;
  consumer.synchronize();
  EXPECT_EQ(seen, 42);  // the consumer waited for the producer's event
  done.synchronize();
  EXPECT_TRUE(done.query());
  EXPECT_GE(start.elapsed_ms(done), 15.0);
  Event never;
  EXPECT_TRUE(never.query());
  EXPECT_THROW(never.elapsed_ms(done), Error);
}

TEST(Devices, CurrentDeviceAndStreamArePerThread) {
  auto rt = test::make_runtime();
  DeviceSet& ds = rt->devices();
  EXPECT_EQ(ds.current_device(), 0);
  ds.set_current_device(1);
  EXPECT_EQ(ds.current_device(), 1);
  std::thread([&] { EXPECT_EQ(ds.current_device(), 0); }).join();
  Device& d = ds.at(0);
  Stream& s = d.create_stream();
  d.set_current_stream(s);
  EXPECT_EQ(&d.current_stream(), &s);
  std::thread([&] { EXPECT_EQ(&d.current_stream(), &d.default_stream()); }).join();
  EXPECT_THROW(ds.set_current_device(2), Error);
  EXPECT_THROW(ds.at(-1), Error);
  EXPECT_THROW(ds.at(1).set_current_stream(s), Error);
}

// A set made where a destroyed one lived (the allocator hands the address
// out again) starts at device 0, not at the old set's current device.
TEST(Devices, ANewSetDoesNotInheritACurrentDeviceByAddress) {
  DeviceOptions o;
  o.num_devices = 2;
  o.memory_bytes = 1 << 20;
  o.compute_threads = 1;
  int recycled = 0;
  const void* last = nullptr;
  for (int i = 0; i < 8; ++i) {
    auto ds = std::make_unique<DeviceSet>(o);
    recycled += ds.get() == last;
    EXPECT_EQ(ds->current_device(), 0) << "try " << i << (ds.get() == last ? " (recycled address)" : "");
    ds->set_current_device(1);
    last = ds.get();
  }
  RecordProperty("recycled_addresses", recycled);
}

// The default stream and the current stream are read while another thread
// creates streams (which grows the device's stream list): no data race
// (this runs under ThreadSanitizer).
TEST(Devices, StreamsAreCreatedWhileOtherThreadsReadTheCurrentStream) {
  auto rt = test::make_runtime();
  Device& d = rt->devices().at(0);
  std::atomic<bool> stop{false};
  std::thread reader([&] {
    while (!stop.load()) {
      EXPECT_EQ(&d.current_stream(), &d.default_stream());
      EXPECT_EQ(d.default_stream().id(), 0);
    }
  });
  for (int i = 0; i < 64; ++i) d.create_stream();
  stop = true;
  reader.join();
  EXPECT_EQ(d.stream(64).id(), 64);
}

TEST(ComputePool, CoversTheRangeExactlyOnceAndNestsSerially) {
  ComputePool pool(3);
  std::vector<std::atomic<int>> hits(10007);
  struct Ctx {
    std::vector<std::atomic<int>>* hits;
    ComputePool* pool;
  } ctx{&hits, &pool};
  pool.parallel_for(
      0, 10007, 100,
      [](void* u, int64_t b, int64_t e) {
        auto* c = static_cast<Ctx*>(u);
        for (int64_t i = b; i < e; ++i) (*c->hits)[static_cast<size_t>(i)]++;
        // Nested: runs serially on this thread, no deadlock.
        c->pool->parallel_for(
            0, 10, 1, [](void*, int64_t, int64_t) {}, nullptr);
      },
      &ctx);
  for (auto& h : hits) EXPECT_EQ(h.load(), 1);
}

// Workers poll for work for a while after a loop, then sleep; a loop posted
// in either state, or by several callers at once, is run exactly once.
TEST(ComputePool, WorkersWakeFromSpinningAndFromSleep) {
  ComputePool pool(2, std::chrono::microseconds(200));
  auto sum_range = [&](int64_t n) {
    std::atomic<int64_t> sum{0};
    pool.parallel_for(
        0, n, 1,
        [](void* u, int64_t b, int64_t e) {
          int64_t s = 0;
          for (int64_t i = b; i < e; ++i) s += i;
          static_cast<std::atomic<int64_t>*>(u)->fetch_add(s);
        },
        &sum);
    return sum.load();
  };
  for (int round = 0; round < 50; ++round) {
    EXPECT_EQ(sum_range(1000), 999 * 1000 / 2);  // back to back: the worker is spinning
    if (round % 10 == 0) std::this_thread::sleep_for(std::chrono::milliseconds(2));  // past the spin: asleep
  }
  std::vector<std::thread> callers;
  std::atomic<int> wrong{0};
  for (int t = 0; t < 3; ++t)
    callers.emplace_back([&] {
      for (int i = 0; i < 200; ++i)
        if (sum_range(4096) != 4095 * 4096 / 2) wrong++;
    });
  for (auto& t : callers) t.join();
  EXPECT_EQ(wrong.load(), 0);
}

TEST(CopyEngine, ConvertsDtypesAndLayouts) {
  auto rt = test::make_runtime();
  Device* dev = &rt->devices().at(0);
  Tensor x = Tensor::from_values({2, 3}, DType::kFloat32, {1.5, -2.5, 3, 0, 65504, 1e-8}, dev);
  expect_values(x.to(dev, DType::kFloat16), {1.5, -2.5, 3, 0, 65504, 0}, 1e-9);
  expect_values(x.to(dev, DType::kInt32), {1, -2, 3, 0, 65504, 0});
  expect_values(x.to(dev, DType::kBool), {1, 1, 1, 0, 1, 1});
  expect_values(x.to(nullptr, DType::kBFloat16), {1.5, -2.5, 3, 0, 65536, 1e-8}, 1e-10);
  Tensor xt = x.as_strided({3, 2}, {1, 3}, 0);
  expect_values(xt.clone(), {1.5, 0, -2.5, 65504, 3, 1e-8}, 1e-12);
  Tensor y = Tensor::empty({2, 2}, DType::kFloat32, dev);
  EXPECT_THROW(copy_tensor(*y.dl(), *x.dl()), Error);
}

TEST(Half, ConversionsRoundToNearestEven) {
  using namespace npub::half;
  EXPECT_EQ(float_to_half(1.0f), 0x3c00);
  EXPECT_EQ(float_to_half(65504.0f), 0x7bff);
  EXPECT_EQ(float_to_half(65520.0f), 0x7c00);  // rounds to inf
  EXPECT_EQ(float_to_half(-0.0f), 0x8000);
  EXPECT_EQ(float_to_half(5.960464477539063e-08f), 0x0001);    // smallest subnormal
  EXPECT_EQ(float_to_half(2.98023223876953125e-08f), 0x0000);  // half of it: ties to even
  EXPECT_TRUE(std::isnan(half_to_float(float_to_half(std::nanf("")))));
  for (uint32_t h = 0; h < 0x7c00; ++h)  // every finite positive half round-trips
    ASSERT_EQ(float_to_half(half_to_float(static_cast<uint16_t>(h))), h) << h;
  EXPECT_EQ(float_to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(bf16_to_float(float_to_bf16(3.140625f)), 3.140625f);
  EXPECT_EQ(float_to_bf16(1.00390625f), 0x3f80);  // tie -> even
}

TEST(CopyEngine, AsyncCopiesRunInStreamOrder) {
  auto rt = test::make_runtime();
  Device& dev = rt->devices().at(0);
  Stream& s = dev.create_stream();
  std::vector<float> host_in(1 << 16), host_out(1 << 16, 0);
  for (size_t i = 0; i < host_in.size(); ++i) host_in[i] = static_cast<float>(i);
  const size_t bytes = host_in.size() * sizeof(float);
  void* d0 = dev.allocate(bytes);
  void* d1 = dev.allocate(bytes);
  std::atomic<bool> release{false};
  s.enqueue([&] {
    while (!release.load()) std::this_thread::yield();
  });
  memcpy_async(s, d0, host_in.data(), bytes);  // host -> device
  memcpy_async(s, d1, d0, bytes);              // device -> device
  // device -> host through the tensor path, with a dtype change
  int64_t shape[1] = {static_cast<int64_t>(host_in.size())};
  DLTensor src{d1,    DLDevice{static_cast<DLDeviceType>(NPUB_DEVICE_NPU), 0},
               1,     DLDataType{kDLFloat, 32, 1},
               shape, nullptr,
               0};
  std::vector<double> as_double(host_in.size());
  DLTensor dst{as_double.data(), DLDevice{kDLCPU, 0}, 1, DLDataType{kDLFloat, 64, 1}, shape, nullptr, 0};
  copy_tensor_async(s, dst, src);
  Event done;
  done.record(s);
  EXPECT_FALSE(done.query());  // nothing ran yet: the stream is held
  release = true;
  done.synchronize();
  for (size_t i = 0; i < host_in.size(); i += 997) EXPECT_EQ(as_double[i], static_cast<double>(i));
  memcpy_async(s, host_out.data(), d1, bytes);
  s.synchronize();
  EXPECT_EQ(host_out, host_in);
  dev.free(d0);
  dev.free(d1);
}

// Note [An event completes with its stream's progress]: an event recorded
// last on a stream is complete exactly when the stream is idle, from every
// thread's point of view.
TEST(Events, TheLastEventOfAStreamCompletesWithTheStream) {
  Stream s(0, 1, false);
  for (int i = 0; i < 2000; ++i) {
    Event e;
    s.enqueue([] {});
    e.record(s);
    e.synchronize();
    ASSERT_TRUE(s.query()) << "iteration " << i;
    Event f;
    s.enqueue([] {});
    f.record(s);
    s.synchronize();
    ASSERT_TRUE(f.query()) << "iteration " << i;
  }
}

TEST(Devices, NewStreamsComeFromARoundRobinPool) {
  auto rt = test::make_runtime();
  Device& d = rt->devices().at(0);
  std::vector<int> ids;
  for (int i = 0; i < 3 * Device::kStreamPoolSize; ++i) ids.push_back(d.pooled_stream().id());
  for (int i = 0; i < Device::kStreamPoolSize; ++i) {
    EXPECT_NE(ids[static_cast<size_t>(i)], 0);  // never the default stream
    EXPECT_EQ(ids[static_cast<size_t>(i + Device::kStreamPoolSize)], ids[static_cast<size_t>(i)]);
  }
  std::sort(ids.begin(), ids.end());
  EXPECT_EQ(std::unique(ids.begin(), ids.end()) - ids.begin(), Device::kStreamPoolSize);
}

// Note [A forked child cannot use the npu] (fork_guard.cpp): a child forked
// while another thread keeps a device busy gets the error from every entry
// point, never a hang; memory it frees is left alone; a device set made in
// the child works. The child reports through its exit status.
TEST(Devices, ForkedChildGetsAnErrorFromInheritedDevicesAndCanMakeNewOnes) {
  DeviceOptions o;
  o.num_devices = 1;
  o.compute_threads = 2;
  DeviceSet set(o);
  Device& dev = set.at(0);
  std::atomic<bool> stop{false};
  std::thread busy([&] {
    while (!stop.load()) {
      void* p = dev.allocate(4096);
      dev.default_stream().enqueue([&] {
        dev.compute().parallel_for(
            0, 1 << 12, 64, [](void*, int64_t, int64_t) {}, nullptr);
      });
      dev.default_stream().synchronize();
      dev.free(p);
    }
  });
  void* inherited = dev.allocate(256);
  for (int fork_no = 0; fork_no < 20; ++fork_no) {
    const pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      int failures = 0;
      auto expect_error = [&](auto use, const char* what) {
        try {
          use();
          ++failures;
        } catch (const Error& e) {
          const std::string m = e.what();
          if (m.rfind("Cannot re-initialize npu in forked subprocess. To use npu with multiprocessing, you "
                      "must use the 'spawn' start method (",
                      0) != 0 ||
              m.find(what) == std::string::npos)
            ++failures;
        }
      };
      if (!set.in_forked_child()) ++failures;
      expect_error([&] { set.at(0); }, "(npu:0: this process was forked");
      expect_error([&] { dev.synchronize(); }, "(npu:0: ");
      expect_error([&] { dev.default_stream().enqueue([] {}); }, "(npu:0 stream 0: ");
      expect_error([&] { dev.default_stream().synchronize(); }, "(npu:0 stream 0: ");
      expect_error([&] { dev.allocator().allocate(64, nullptr); }, "(npu:0's caching allocator: ");
      dev.allocator().free(inherited);  // left alone, no throw
      int ran = 0;
      dev.compute().parallel_for(
          0, 100, 1, [](void* n, int64_t b, int64_t e) { *static_cast<int*>(n) += static_cast<int>(e - b); },
          &ran);  // on this thread alone
      if (ran != 100) ++failures;
      // A set made after the fork is this process's own. No new thread:
      // ThreadSanitizer stops a child of a threaded process that starts one.
      DeviceOptions fresh_options;
      fresh_options.num_devices = 1;
      fresh_options.compute_threads = 1;
      fresh_options.launch_blocking = true;
      DeviceSet fresh(fresh_options);
      if (fresh.in_forked_child()) ++failures;
      Device& d = fresh.at(0);
      void* p = d.allocate(64);
      int value = 0;
      d.default_stream().enqueue([&] { value = 7; });
      d.synchronize();
      d.free(p);
      if (value != 7) ++failures;
      _exit(failures == 0 ? 0 : 10 + failures);
    }
    int status = 0;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    pid_t done = 0;
    while ((done = waitpid(pid, &status, WNOHANG)) == 0 && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    if (done == 0) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      ADD_FAILURE() << "fork " << fork_no << ": the child hung";
      break;
    }
    ASSERT_TRUE(WIFEXITED(status)) << "fork " << fork_no << ": the child died, status " << status;
    EXPECT_EQ(WEXITSTATUS(status), 0) << "fork " << fork_no << ": failed checks in the child";
  }
  stop.store(true);
  busy.join();
  EXPECT_FALSE(set.in_forked_child());
  dev.free(inherited);  // the parent's allocator still has it
  EXPECT_EQ(dev.allocator().stats().allocated_bytes, 0);
}

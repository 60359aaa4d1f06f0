// Note [Guard zones] (device_sim/caching_allocator.h): with NPUB_VALIDATE=1
// every device block has a zone before and after it, filled with a pattern;
// a kernel that writes into one is reported after it ran, naming the op and
// the plugin, and a zone found overwritten when its block is freed is
// reported by the next synchronize. Without guard zones nothing changes.
#include "test_util.h"

#include <npubridge/device_sim/caching_allocator.h>

#include <cstring>

using namespace npub;
using namespace npub::test;

namespace {

std::unique_ptr<Runtime> runtime_with_guards(size_t guard_bytes) {
  RuntimeOptions o;
  o.devices.num_devices = 1;
  o.devices.memory_bytes = 1ull << 30;
  o.devices.compute_threads = 2;
  o.devices.guard_bytes = guard_bytes;
  o.load_default_plugins = false;
  o.load_default_op_map = false;
  return std::make_unique<Runtime>(o);
}

class GuardZones : public ::testing::Test {
 protected:
  void SetUp() override {
    rt = runtime_with_guards(sim::CachingAllocator::kGuardBytes);
    load_ok(*rt, test_plugin("npub_test_out_of_bounds"));
    dev = &rt->devices().at(0);
  }
  std::unique_ptr<Runtime> rt;
  sim::Device* dev = nullptr;
};

}  // namespace

TEST_F(GuardZones, AWriteBeforeTheOutputNamesTheOpAndThePlugin) {
  Tensor x = Tensor::from_values({12}, DType::kFloat32, {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}, dev);
  TensorOutputs outs(rt->devices());
  NpubValue args[] = {tensor_value(x.dl())};
  NpubValue rets[1] = {};
  const std::string e =
      error_of([&] { rt->dispatcher().call("oob::write_before", args, 1, rets, 1, &outs); });
  EXPECT_NE(e.find("op 'oob::write_before': the kernel of plugin 'oob' wrote outside its buffers: 256 bytes "
                   "before the start of a buffer of 48 bytes at 0x"),
            std::string::npos)
      << e;
  EXPECT_NE(e.find("(a guard zone of device memory was overwritten; NPUB_VALIDATE=1)"), std::string::npos)
      << e;
  // Reported once: the zone is filled again, and the device keeps working.
  dev->synchronize();
  TensorOutputs outs2(rt->devices());
  NpubValue rets2[1] = {};
  rt->dispatcher().call("oob::copy", args, 1, rets2, 1, &outs2);
  expect_values(outs2[0], {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12});
}

TEST_F(GuardZones, AWritePastTheEndOfAnArgumentIsCaught) {
  Tensor x = Tensor::from_values({3}, DType::kFloat32, {1, 2, 3}, dev);
  Tensor out = Tensor::empty({3}, DType::kFloat32, dev);
  NpubValue args[] = {tensor_value(x.dl()), tensor_value(out.dl())};
  NpubValue rets[1] = {};
  const std::string e =
      error_of([&] { rt->dispatcher().call("oob::write_after", args, 2, rets, 1, nullptr); });
  EXPECT_NE(
      e.find("op 'oob::write_after': the kernel of plugin 'oob' wrote outside its buffers: 4 bytes past "
             "the end of a buffer of 12 bytes at 0x"),
      std::string::npos)
      << e;
}

TEST_F(GuardZones, InBoundsKernelsAndStatisticsAreUnchanged) {
  sim::CachingAllocator& a = dev->allocator();
  const auto before = a.stats();
  void* p = dev->allocate(1000);
  EXPECT_EQ(a.stats().allocated_bytes - before.allocated_bytes, 1024);  // as without zones
  EXPECT_EQ(a.stats().requested_bytes - before.requested_bytes, 1000);
  EXPECT_TRUE(a.contains(p, 1000));
  std::memset(p, 0, 1000);  // every byte of the buffer is the caller's
  EXPECT_EQ(a.check_guards(p), "");
  // The snapshot lists the block as its owner sees it, its zones as free
  // blocks around it: the blocks still tile their segment.
  bool listed = false;
  for (const sim::SegmentSnapshot& s : a.snapshot()) {
    size_t sum = 0;
    for (const sim::BlockSnapshot& b : s.blocks) {
      sum += b.size;
      listed =
          listed || (b.address == reinterpret_cast<uintptr_t>(p) && b.size == 1024 && b.requested == 1000);
    }
    EXPECT_EQ(sum, s.size);
  }
  EXPECT_TRUE(listed);
  // A large block (over 1 MiB) has no zones: its segment stays what it was.
  void* big = dev->allocate(3 << 20);
  EXPECT_EQ(a.check_guards(big), "");
  EXPECT_EQ(a.stats().allocated_bytes - before.allocated_bytes, 1024 + (3 << 20));
  dev->free(big);
  dev->free(p);
  dev->synchronize();
  Tensor x = Tensor::from_values({2}, DType::kFloat32, {1, 2}, dev);
  TensorOutputs outs(rt->devices());
  NpubValue args[] = {tensor_value(x.dl())};
  NpubValue rets[1] = {};
  rt->dispatcher().call("oob::copy", args, 1, rets, 1, &outs);
  expect_values(outs[0], {1, 2});
}

TEST_F(GuardZones, AnOverwriteNoKernelCheckSawIsReportedBySynchronize) {
  void* p = dev->allocate(64);
  static_cast<unsigned char*>(p)[-1] = 0;  // as a copy or host code out of bounds would
  static_cast<unsigned char*>(p)[64] = 0;
  dev->free(p);  // free has no caller to tell (a tensor's deleter)
  const std::string e = error_of([&] { dev->synchronize(); });
  EXPECT_NE(e.find("npu:0 caching allocator: device memory was written outside its buffer: 1 byte before the "
                   "start and 1 byte past the end of a buffer of 64 bytes at 0x"),
            std::string::npos)
      << e;
  EXPECT_EQ(error_of([&] { dev->synchronize(); }), "");  // reported once
}

TEST(GuardZonesOff, WithoutNpubValidateNothingIsChecked) {
  // The default: no zones, and the same kernel's stray write goes unseen
  // (it lands in the block's rounding slack, which is ours to spoil here).
  auto rt = runtime_with_guards(0);
  load_ok(*rt, test_plugin("npub_test_out_of_bounds"));
  sim::Device* dev = &rt->devices().at(0);
  EXPECT_EQ(dev->allocator().guard_bytes(), 0u);
  Tensor x = Tensor::from_values({3}, DType::kFloat32, {1, 2, 3}, dev);
  Tensor out = Tensor::empty({3}, DType::kFloat32, dev);
  NpubValue args[] = {tensor_value(x.dl()), tensor_value(out.dl())};
  NpubValue rets[1] = {};
  EXPECT_EQ(error_of([&] { rt->dispatcher().call("oob::write_after", args, 2, rets, 1, nullptr); }), "");
}

TEST(GuardZonesOff, NpubValidateTurnsThemOn) {
  {
    ScopedEnv v("NPUB_VALIDATE", "1");
    EXPECT_EQ(sim::DeviceOptions::from_env().guard_bytes, sim::CachingAllocator::kGuardBytes);
  }
  ScopedEnv v("NPUB_VALIDATE", "0");
  EXPECT_EQ(sim::DeviceOptions::from_env().guard_bytes, 0u);
}

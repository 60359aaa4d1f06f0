// torch.npu's memory functions from npubridge._C (npubridge/_memory.py): each
// device's caching allocator's statistics, snapshot, memory fraction and
// cache.
#include "bindings/bindings.h"

#include <npubridge/device_sim/caching_allocator.h>
#include <npubridge/dispatcher/runtime.h>
#include <npubridge/support/error.h>

#include "runtime/npu_runtime.h"

namespace py = pybind11;

namespace npub::torch_backend {

void bind_memory(py::module_& m) {
  m.def("memory_stats", [](int d) {
    const auto s = rt().devices().at(d).allocator().stats();
    py::dict r;
    r["allocated_bytes"] = s.allocated_bytes;
    r["reserved_bytes"] = s.reserved_bytes;
    r["peak_allocated_bytes"] = s.peak_allocated_bytes;
    r["peak_reserved_bytes"] = s.peak_reserved_bytes;
    r["num_allocs"] = s.num_allocs;
    r["num_frees"] = s.num_frees;
    r["num_ooms"] = s.num_ooms;
    return r;
  });
  // Note [The memory fraction limits reserved memory]
  // (device_sim/include/npubridge/device_sim/caching_allocator.h).
  m.def("set_memory_fraction", [](int d, double fraction) {
    try {
      rt().devices().at(d).allocator().set_memory_fraction(fraction);
    } catch (const Error& e) {
      throw py::value_error(e.what());
    }
  });
  m.def("memory_fraction", [](int d) { return rt().devices().at(d).allocator().memory_fraction(); });
  // torch.npu.memory_snapshot(): the caching allocator's segments and
  // blocks, with torch.cuda.memory_snapshot()'s keys.
  m.def("memory_snapshot", [](int d) {
    py::list out;
    for (const sim::SegmentSnapshot& seg : rt().devices().at(d).allocator().snapshot()) {
      py::dict r;
      r["device"] = d;
      r["address"] = seg.address;
      r["total_size"] = seg.size;
      r["allocated_size"] = seg.allocated;
      r["active_size"] = seg.allocated;
      r["requested_size"] = seg.requested;
      // The allocator keys blocks by the stream they were allocated on (a
      // sim::Stream of this device, which lives as long as the device).
      r["stream"] = seg.stream != nullptr ? static_cast<const sim::Stream*>(seg.stream)->id() : 0;
      r["segment_type"] = seg.small ? "small" : "large";
      py::list blocks;
      for (const sim::BlockSnapshot& b : seg.blocks) {
        py::dict block;
        block["address"] = b.address;
        block["size"] = b.size;
        block["requested_size"] = b.requested;
        block["state"] = b.allocated ? "active_allocated" : "inactive";
        blocks.append(block);
      }
      r["blocks"] = blocks;
      out.append(r);
    }
    return out;
  });
  m.def("empty_cache", [] {
    auto& ds = rt().devices();
    for (int i = 0; i < ds.count(); ++i) ds.at(i).allocator().empty_cache();
  });
  m.def("reset_peak_memory_stats", [](int d) { rt().devices().at(d).allocator().reset_peak_stats(); });
}

}  // namespace npub::torch_backend

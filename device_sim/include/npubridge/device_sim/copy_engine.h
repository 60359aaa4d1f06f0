// The simulated device's copy engine: element-wise copies between tensors of
// any layout and dtype, on the calling thread.
//
// Device memory is host-addressable in the simulation, so the same routine
// copies host->device, device->host and device->device; callers choose where
// it runs (inline, or queued on a stream). Used by the dispatcher for dtype
// and layout conversion and by hosts to move data in and out.
#pragma once

#include <npubridge/plugin_api.h>

#include <cstddef>
#include <vector>

namespace npub::sim {

class ComputePool;

// Copies src into dst elementwise, converting dtype. Shapes must be equal
// (throws npub::Error otherwise); dtypes must be known (npub::DType).
// With a pool, large contiguous copies run in parallel.
void copy_tensor(const DLTensor& dst, const DLTensor& src, ComputePool* pool = nullptr);

class Stream;

// Queues a byte copy on `stream` (host<->device or device<->device). Both
// buffers must stay valid until the stream reaches the copy.
void memcpy_async(Stream& stream, void* dst, const void* src, size_t bytes);

// Queues copy_tensor(dst, src) on `stream`. The DLTensor structs (shapes,
// strides) are copied now; the data buffers must stay valid until the
// stream reaches the copy.
void copy_tensor_async(Stream& stream, const DLTensor& dst, const DLTensor& src, ComputePool* pool = nullptr);

// True when the tensor's strides are row-major contiguous (NULL strides
// included; size-1 dims ignore their stride).
bool is_contiguous(const DLTensor& t);

// Reads every element of `t` (any layout and dtype) as row-major doubles.
std::vector<double> read_doubles(const DLTensor& t);

// Writes row-major doubles into `t`, converting to its dtype. Throws
// npub::Error if `values` does not hold exactly one value per element.
void write_doubles(const DLTensor& t, const std::vector<double>& values);

}  // namespace npub::sim

// Graph capture and replay on the simulated NPU, shaped as CUDA graphs.
//
// Note [Capture records instead of running]
// While a thread captures on a device (Graph::capture_begin .. capture_end),
// the device work that thread issues is recorded, not run: kernel launches
// (the dispatcher's invoke_kernel records the kernel with deep copies of its
// arguments), device-to-device copies of the copy engine (engine_copy).
// The thread's allocations on that device come from the graph's private pool
// (Note [Private pools], caching_allocator.h), so the addresses the records
// hold stay the graph's until reset(). replay() runs the records in order on
// the calling thread, after the current stream's queued work (Note [Kernels
// run inline, in stream order]), so a replay is ordered like eager work.
//
// Note [Work a capture cannot see]
// A capture records the CAPTURING THREAD's work on the capture's device.
// Two kinds of device work would escape it and run once, at capture, never
// at replay (silently wrong results), so both raise instead:
//  - work the capturing thread issues on ANOTHER device (x on npu:1 while
//    capturing on npu:0): CUDA refuses such cross-stream work too;
//  - work another thread issues to the capturing STREAM. On CUDA a capture
//    belongs to a stream, so autograd's backward (which the engine runs on
//    its device thread, on the forward's stream) is recorded; here the
//    records, the pool route and the constants are per thread, so a
//    backward inside a capture is refused (capture_target) and the capture
//    is poisoned: its capture_end raises too. Other threads' work on other
//    streams runs normally (kThreadLocal).
//
// Note [A stream that waits on a capture joins it]
// As on CUDA, a stream made to wait on an event the capturing thread
// recorded during the capture (stream.wait_event / wait_stream from the
// capture's stream) joins the capture until it ends: its work belongs to
// the graph too. That is how autograd's engine orders a backward whose
// forward ran before the capture: loss.backward() makes the gradient seed
// (ones_like) on the capturing stream, which is recorded, not run, and makes
// the forward's stream wait for it; the engine's device thread then runs the
// backward on that stream. Without the join, that backward ran at capture,
// on a seed never written (w.grad zeros, no error), and never at replay; with
// it, it is refused as work from another thread on the capture's streams.
//
// What cannot be recorded is forbidden inside a capture and raises
// npub::Error (kUnsupported) naming the operation (forbid_in_capture):
// copies between host and device memory, synchronize (device, stream,
// event), reading a value back (.item()), host fallbacks, outputs whose
// shape depends on data, random ops. The error ends the capture: the graph
// becomes invalid (capture_end says why), the thread allocates from the
// ordinary cache again, the pool is let go at reset, and the device keeps
// working.
//
// Capture modes (what PyTorch calls capture_error_mode):
//  - kThreadLocal: only the capturing thread is affected; other threads
//    run their work normally on the same device.
//  - kGlobal: as kThreadLocal, and other threads' synchronize and
//    host<->device copies on the capturing device raise too while it
//    lasts (their work might race with the static buffers).
//  - kRelaxed: as kThreadLocal, but the capturing thread may synchronize
//    (nothing recorded is queued, so a sync waits only for work from
//    before the capture). The rest stays forbidden: it would need results
//    of work that has not run.
#pragma once

#include <npubridge/plugin_api.h>
#include <npubridge/support/error.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace npub::sim {

class Device;
class Stream;

// The error of an operation a capture forbids (kUnsupported). A type of its
// own so that no caller takes it for a kernel's decline, which falls back
// (Note [A decline falls back on every path], dispatcher.cpp).
class CaptureError : public Error {
 public:
  explicit CaptureError(const std::string& message) : Error(ErrorCode::kUnsupported, message) {}
};

enum class CaptureMode { kThreadLocal, kGlobal, kRelaxed };
const char* capture_mode_name(CaptureMode mode);

// One recorded piece of work.
class GraphNode {
 public:
  virtual ~GraphNode() = default;
  // Runs the work on the calling thread for `stream`'s place in order.
  virtual void replay(Device& device, Stream& stream) = 0;
  // "kernel cann_like: aten::add.out", "copy npu->npu [4, 8]": for
  // debug_dump and the tests.
  virtual std::string describe() const = 0;
};

// A DLTensor with its own shape and strides (a record outlives the call's).
class OwnedTensor {
 public:
  explicit OwnedTensor(const DLTensor& t);
  OwnedTensor(const OwnedTensor&) = delete;
  OwnedTensor& operator=(const OwnedTensor&) = delete;
  DLTensor* dl() { return &dl_; }
  const DLTensor& view() const { return dl_; }

 private:
  DLTensor dl_;
  std::vector<int64_t> shape_;
  std::vector<int64_t> strides_;
};

class Graph {
 public:
  Graph();
  ~Graph();  // ends a capture still open (invalid) and resets
  Graph(const Graph&) = delete;
  Graph& operator=(const Graph&) = delete;

  // Starts recording the calling thread's work on `device`. `pool`: a pool
  // id (CachingAllocator::new_pool_id, or another graph's pool()) to share,
  // 0 for a new one. Throws when this graph is not empty (reset() first) or
  // the thread already captures on the device.
  void capture_begin(Device& device, uint64_t pool = 0, CaptureMode mode = CaptureMode::kThreadLocal);
  // Stops recording. Throws when no capture is open, and when an error
  // ended it (naming the error).
  void capture_end();
  // Runs the records in order on the calling thread's current stream of
  // the device. Throws unless captured.
  void replay();
  // Drops the records, the memory held for them, and the pool (its last
  // holder returns its free segments). Ends a capture still open.
  void reset();

  uint64_t pool() const { return pool_; }
  bool capturing() const { return state_ == State::kCapturing; }
  bool captured() const { return state_ == State::kCaptured; }
  // Why the capture ended early ("" if it did not).
  const std::string& invalid_reason() const { return invalid_reason_; }
  size_t num_nodes() const { return nodes_.size(); }
  std::vector<std::string> describe() const;
  Device* device() const { return device_; }
  CaptureMode mode() const { return mode_; }

  // The stream the capture began on ("npu:0 stream 1"'s object).
  const Stream* stream() const { return stream_; }
  // Unique in the process for each capture_begin (Note [A stream that waits
  // on a capture joins it]).
  uint64_t capture_id() const { return capture_id_; }
  // Note [Work a capture cannot see]: marks the capture as failed from
  // another thread; capture_end raises `reason`.
  void poison(const std::string& reason);

  // While capturing: appends a record; holds `ptr` (device memory of the
  // graph's pool, e.g. a kernel's workspace) until reset.
  void add_node(std::unique_ptr<GraphNode> node);
  void hold(void* ptr);

  // Note [Capture records instead of running]: ends the capture with an
  // error (the graph is invalid) and throws npub::Error (kUnsupported):
  // "npu:0 graph capture: <op> is not allowed while capturing (<why>); the
  // capture was ended and the graph is invalid" (a CaptureError).
  [[noreturn]] void forbid(const std::string& op, const std::string& why);

 private:
  enum class State { kEmpty, kCapturing, kCaptured, kInvalid };
  void stop_recording();  // the thread's capture entry and pool route go

  State state_ = State::kEmpty;
  Device* device_ = nullptr;
  uint64_t pool_ = 0;
  bool holds_pool_ = false;
  CaptureMode mode_ = CaptureMode::kThreadLocal;
  const Stream* stream_ = nullptr;
  uint64_t capture_id_ = 0;
  std::vector<const Stream*> joined_;  // under graph_capture.cpp's g_open_mu
  friend Graph* capture_target(Device&, const Stream&, const std::function<std::string()>&);
  friend void join_capture(uint64_t, const Stream&);
  std::atomic<bool> poisoned_{false};
  std::mutex poison_mu_;
  std::string poison_reason_;  // under poison_mu_
  std::vector<std::unique_ptr<GraphNode>> nodes_;
  std::vector<void*> held_;
  std::string invalid_reason_;
};

// The calling thread's open capture on `device`, or null (cheap: one
// thread-local test when the thread captures nothing).
Graph* capturing_graph(const Device& device);
// The same by device index (for a stream, which knows only its index).
Graph* capturing_graph(int device_index);
// Note [Work a capture cannot see]: the graph that records device work the
// calling thread issues on `device`'s `stream` (its open capture there), or
// null when the work runs now. Throws a CaptureError naming `op()` when the
// work would escape a capture: the thread captures on another device (that
// capture ends), or another thread captures on this very stream (that
// capture is poisoned). One relaxed load when no thread captures.
Graph* capture_target(Device& device, const Stream& stream, const std::function<std::string()>& op);

// Note [A stream that waits on a capture joins it]: the id of the calling
// thread's open capture on `stream`'s device (what an event recorded on the
// stream now belongs to), 0 when none; and the join of `waiter` to open
// capture `capture_id` (nothing when it has ended).
uint64_t recording_capture(const Stream& stream);
void join_capture(uint64_t capture_id, const Stream& waiter);

// The calling thread's first open capture on any device, or null.
Graph* capturing_graph_any();
// True when the calling thread captures on any device.
bool thread_is_capturing();
// True when some capture check could fail (this thread captures, or some
// thread captures: kGlobal mode and Note [Work a capture cannot see]): what
// callers test before they build the op's name.
bool capture_checks_needed();

// Note [Capture records instead of running]: for an operation that may not
// run inside a capture: forbids it when the calling thread captures on
// `device` (ending that capture), and when another thread captures there
// in kGlobal mode (`mode_matters`: the op is one kGlobal also forbids to
// other threads). `sync`: the op is a synchronize (kRelaxed allows it).
void check_capture_allows(const Device& device, const std::string& op, const std::string& why,
                          bool sync = false);
void check_capture_allows(int device_index, const std::string& op, const std::string& why, bool sync = false);

// The copy engine's copy for device work: runs copy_tensor(dst, src) now,
// or records it when the calling thread captures on the npu side's device.
// A copy with host memory on one side is forbidden inside a capture (`op`
// names the caller's operation). `device`: the npu device of the copy
// (null: host to host, which always runs).
void engine_copy(Device* device, const DLTensor& dst, const DLTensor& src, const std::string& op);

}  // namespace npub::sim

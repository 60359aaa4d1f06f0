#include <npubridge/device_sim/copy_engine.h>
#include <npubridge/device_sim/device.h>
#include <npubridge/device_sim/graph_capture.h>
#include <npubridge/device_sim/stream.h>
#include <npubridge/support/error.h>
#include <npubridge/support/shape.h>

#include <algorithm>
#include <atomic>
#include <mutex>
#include <unordered_map>
#include <utility>

namespace npub::sim {

const char* capture_mode_name(CaptureMode mode) {
  switch (mode) {
    case CaptureMode::kThreadLocal:
      return "thread_local";
    case CaptureMode::kGlobal:
      return "global";
    case CaptureMode::kRelaxed:
      return "relaxed";
  }
  return "?";
}

namespace {

// The calling thread's open captures (one per device at most).
thread_local std::vector<Graph*> tls_captures;

// kGlobal captures per device index, for other threads' checks; the atomic
// keeps the check one load when no thread captures globally.
std::atomic<int> g_global_captures{0};
std::mutex g_global_mu;
std::unordered_map<int, int>& global_captures_by_index() {
  static std::unordered_map<int, int> m;  // under g_global_mu
  return m;
}

std::string device_name(const Device& d) { return "npu:" + std::to_string(d.index()); }

// Every open capture of every thread (Note [Work a capture cannot see]); the
// atomic keeps capture_target one load when nothing captures.
std::atomic<int> g_open_captures{0};
std::mutex g_open_mu;
std::vector<Graph*>& open_captures() {
  static std::vector<Graph*> v;  // under g_open_mu
  return v;
}

}  // namespace

OwnedTensor::OwnedTensor(const DLTensor& t) : dl_(t) {
  if (t.ndim > 0 && t.shape != nullptr) shape_.assign(t.shape, t.shape + t.ndim);
  if (t.ndim > 0 && t.strides != nullptr) strides_.assign(t.strides, t.strides + t.ndim);
  dl_.shape = shape_.empty() ? nullptr : shape_.data();
  dl_.strides = strides_.empty() ? nullptr : strides_.data();
}

Graph::Graph() = default;

Graph::~Graph() {
  try {
    reset();
  } catch (...) {  // a destructor must not throw; reset only frees memory
  }
}

void Graph::capture_begin(Device& device, uint64_t pool, CaptureMode mode) {
  if (state_ != State::kEmpty)
    throw Error(ErrorCode::kInvalidArgument,
                "graph capture_begin: this graph already holds a capture (state " +
                    std::string(state_ == State::kCapturing ? "capturing" : "captured or invalid") +
                    "); call reset() before capturing again");
  if (capturing_graph(device) != nullptr)
    throw Error(ErrorCode::kInvalidArgument,
                "graph capture_begin: this thread is already capturing on " + device_name(device) +
                    " (captures cannot nest: one capture per thread and device)");
  device_ = &device;
  pool_ = pool != 0 ? pool : CachingAllocator::new_pool_id();
  mode_ = mode;
  device.allocator().retain_pool(pool_);
  holds_pool_ = true;
  device.allocator().begin_pool_route(pool_);
  stream_ = &device.current_stream();
  static std::atomic<uint64_t> next_capture_id{1};
  capture_id_ = next_capture_id.fetch_add(1);
  poisoned_.store(false);
  tls_captures.push_back(this);
  {
    std::lock_guard<std::mutex> lock(g_open_mu);
    open_captures().push_back(this);
    g_open_captures.fetch_add(1);
  }
  if (mode == CaptureMode::kGlobal) {
    std::lock_guard<std::mutex> lock(g_global_mu);
    ++global_captures_by_index()[device.index()];
    g_global_captures.fetch_add(1);
  }
  state_ = State::kCapturing;
}

void Graph::stop_recording() {
  if (state_ != State::kCapturing) return;
  device_->allocator().end_pool_route();
  tls_captures.erase(std::remove(tls_captures.begin(), tls_captures.end(), this), tls_captures.end());
  {
    std::lock_guard<std::mutex> lock(g_open_mu);
    auto& v = open_captures();
    v.erase(std::remove(v.begin(), v.end(), this), v.end());
    g_open_captures.fetch_sub(1);
    joined_.clear();
  }
  if (mode_ == CaptureMode::kGlobal) {
    std::lock_guard<std::mutex> lock(g_global_mu);
    auto& m = global_captures_by_index();
    if (--m[device_->index()] == 0) m.erase(device_->index());
    g_global_captures.fetch_sub(1);
  }
}

void Graph::capture_end() {
  if (state_ == State::kInvalid)
    throw Error(ErrorCode::kInvalidArgument,
                "graph capture_end: the capture was ended by an error inside it, and the graph is invalid: " +
                    invalid_reason_);
  if (state_ != State::kCapturing)
    throw Error(ErrorCode::kInvalidArgument, "graph capture_end: no capture is open on this graph");
  if (std::find(tls_captures.begin(), tls_captures.end(), this) == tls_captures.end())
    throw Error(ErrorCode::kInvalidArgument,
                "graph capture_end: called on a thread other than the one that began the capture");
  stop_recording();
  if (poisoned_.load()) {
    std::lock_guard<std::mutex> lock(poison_mu_);
    state_ = State::kInvalid;
    invalid_reason_ = poison_reason_;
    throw CaptureError("graph capture_end: the graph is invalid: " + invalid_reason_);
  }
  state_ = State::kCaptured;
}

void Graph::poison(const std::string& reason) {
  std::lock_guard<std::mutex> lock(poison_mu_);
  if (!poisoned_.load()) poison_reason_ = reason;
  poisoned_.store(true);
}

void Graph::replay() {
  if (state_ != State::kCaptured)
    throw Error(ErrorCode::kInvalidArgument,
                state_ == State::kInvalid ? "graph replay: the graph is invalid (" + invalid_reason_ + ")"
                : state_ == State::kCapturing
                    ? std::string("graph replay: the capture is still open (call capture_end first)")
                    : std::string("graph replay: nothing was captured"));
  if (capturing_graph(*device_) != nullptr)
    throw Error(ErrorCode::kUnsupported, "graph replay: not allowed while this thread captures on " +
                                             device_name(*device_) + " (graphs do not nest)");
  Stream& stream = device_->current_stream();
  if (!stream.query()) stream.synchronize();
  for (auto& node : nodes_) node->replay(*device_, stream);
}

void Graph::reset() {
  if (state_ == State::kCapturing) {
    stop_recording();
    state_ = State::kInvalid;
  }
  nodes_.clear();
  if (device_ != nullptr) {
    // The records may still be running on no other thread: replay is
    // synchronous, so nothing reads the held memory now.
    for (void* p : held_) device_->free(p);
    held_.clear();
    if (holds_pool_) device_->allocator().release_pool(pool_);
  }
  holds_pool_ = false;
  pool_ = 0;
  device_ = nullptr;
  invalid_reason_.clear();
  state_ = State::kEmpty;
}

std::vector<std::string> Graph::describe() const {
  std::vector<std::string> out;
  out.reserve(nodes_.size());
  for (const auto& n : nodes_) out.push_back(n->describe());
  return out;
}

void Graph::add_node(std::unique_ptr<GraphNode> node) {
  if (state_ != State::kCapturing)
    throw Error(ErrorCode::kInternal, "graph: a record was added outside a capture");
  nodes_.push_back(std::move(node));
}

void Graph::hold(void* ptr) {
  if (ptr != nullptr) held_.push_back(ptr);
}

void Graph::forbid(const std::string& op, const std::string& why) {
  const std::string msg = device_name(*device_) + " graph capture: " + op +
                          " is not allowed while capturing a graph (" + why +
                          "); the capture was ended and the graph is invalid";
  stop_recording();
  state_ = State::kInvalid;
  invalid_reason_ = msg;
  throw CaptureError(msg);
}

Graph* capturing_graph(const Device& device) {
  if (tls_captures.empty()) return nullptr;
  for (Graph* g : tls_captures)
    if (g->device() == &device) return g;
  return nullptr;
}

Graph* capturing_graph(int device_index) {
  if (tls_captures.empty()) return nullptr;
  for (Graph* g : tls_captures)
    if (g->device()->index() == device_index) return g;
  return nullptr;
}

Graph* capture_target(Device& device, const Stream& stream, const std::function<std::string()>& op) {
  if (g_open_captures.load(std::memory_order_relaxed) == 0) return nullptr;
  if (!tls_captures.empty()) {
    if (Graph* g = capturing_graph(device)) return g;
    Graph* g = tls_captures.front();
    g->forbid(op() + " on " + device_name(device),
              "this thread captures on " + device_name(*g->device()) +
                  ", and work on another device is neither recorded nor replayed; move the tensors to " +
                  device_name(*g->device()) + " or capture on " + device_name(device));
  }
  std::lock_guard<std::mutex> lock(g_open_mu);
  for (Graph* g : open_captures()) {
    if (g->device() != &device) continue;
    // Note [A stream that waits on a capture joins it].
    const bool joined = std::find(g->joined_.begin(), g->joined_.end(), &stream) != g->joined_.end();
    if (g->stream() != &stream && !joined) continue;
    const std::string msg =
        device_name(device) + " graph capture: " + op() +
        (joined ? " was issued, from a thread that is not capturing, to " + device_name(device) + " stream " +
                      std::to_string(stream.id()) +
                      ", which joined the capture when it waited on work the capture records (autograd runs "
                      "a backward on its device thread, on the forward's stream, after waiting for the "
                      "gradient made in the capture)"
                : std::string(" was issued to the capturing stream from a thread that is not capturing "
                              "(autograd runs a backward on its device thread)")) +
        ": it would run now and never at replay, so it is refused and the capture is "
        "invalid; capturing a backward is not supported: capture the forward only, or run backward() "
        "outside the capture";
    g->poison(msg);
    throw CaptureError(msg);
  }
  return nullptr;
}

uint64_t recording_capture(const Stream& stream) {
  if (tls_captures.empty()) return 0;
  Graph* g = capturing_graph(stream.device_index());
  return g != nullptr ? g->capture_id() : 0;
}

void join_capture(uint64_t capture_id, const Stream& waiter) {
  if (capture_id == 0 || g_open_captures.load(std::memory_order_relaxed) == 0) return;
  std::lock_guard<std::mutex> lock(g_open_mu);
  for (Graph* g : open_captures()) {
    if (g->capture_id() != capture_id || g->stream() == &waiter) continue;
    if (g->device()->index() != waiter.device_index()) continue;
    if (std::find(g->joined_.begin(), g->joined_.end(), &waiter) == g->joined_.end())
      g->joined_.push_back(&waiter);
  }
}

Graph* capturing_graph_any() { return tls_captures.empty() ? nullptr : tls_captures.front(); }

bool thread_is_capturing() { return !tls_captures.empty(); }

bool capture_checks_needed() {
  return !tls_captures.empty() || g_open_captures.load(std::memory_order_relaxed) != 0;
}

void check_capture_allows(int device_index, const std::string& op, const std::string& why, bool sync) {
  if (Graph* g = capturing_graph(device_index)) {
    if (sync && g->mode() == CaptureMode::kRelaxed) return;
    g->forbid(op, why);
  }
  if (g_global_captures.load(std::memory_order_relaxed) == 0) return;
  std::lock_guard<std::mutex> lock(g_global_mu);
  if (global_captures_by_index().count(device_index) != 0)
    throw CaptureError(op + " is not allowed while another thread captures a graph on npu:" +
                       std::to_string(device_index) + " in global mode (" + why + ")");
}

void check_capture_allows(const Device& device, const std::string& op, const std::string& why, bool sync) {
  if (Graph* g = capturing_graph(device)) {
    if (sync && g->mode() == CaptureMode::kRelaxed) return;
    g->forbid(op, why);
  }
  if (g_global_captures.load(std::memory_order_relaxed) != 0)
    check_capture_allows(device.index(), op, why, sync);
}

namespace {

class CopyNode final : public GraphNode {
 public:
  CopyNode(const DLTensor& dst, const DLTensor& src) : dst_(dst), src_(src) {}
  void replay(Device& device, Stream&) override { copy_tensor(dst_.view(), src_.view(), &device.compute()); }
  std::string describe() const override {
    return "copy " + shape_str(src_.view().shape, src_.view().ndim) + " -> " +
           shape_str(dst_.view().shape, dst_.view().ndim);
  }

 private:
  OwnedTensor dst_;
  OwnedTensor src_;
};

}  // namespace

void engine_copy(Device* device, const DLTensor& dst, const DLTensor& src, const std::string& op) {
  if (device == nullptr) {
    copy_tensor(dst, src);
    return;
  }
  const bool host_side =
      dst.device.device_type != NPUB_DEVICE_NPU || src.device.device_type != NPUB_DEVICE_NPU;
  if (Graph* g = capture_target(*device, device->current_stream(), [&] { return op; })) {
    if (host_side)
      g->forbid(op,
                "a copy between host and device memory: the host side would be read or written at capture, "
                "not at replay; copy into a static npu tensor outside the capture");
    g->add_node(std::make_unique<CopyNode>(dst, src));
    return;
  }
  if (host_side) check_capture_allows(*device, op, "a copy between host and device memory");
  copy_tensor(dst, src, &device->compute());
}

}  // namespace npub::sim

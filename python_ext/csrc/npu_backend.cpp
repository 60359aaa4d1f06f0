// npubridge's PyTorch backend (PrivateUse1, renamed "npu" by the Python
// package): the device runtime PyTorch needs (allocator, device guard,
// hooks), the native view and copy ops, and the bridge that routes ATen ops
// to the dispatcher: every aten op a loaded plugin implements is registered
// for PrivateUse1 at import, generically (no per-op code here); functional
// and in-place ops reach a plugin's .out kernel through their meta kernel;
// everything else falls back to the CPU through PyTorch's boxed fallback.
//
// The only translation unit of npubridge that includes torch headers besides
// the tools; it is compiled once into npubridge/_C.
#include <torch/extension.h>

#include <ATen/EmptyTensor.h>
#include <c10/core/CachingDeviceAllocator.h>
#include <ATen/autocast_mode.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <ATen/native/CPUFallback.h>
#include <ATen/ops/_reshape_alias_native.h>
#include <ATen/ops/alias_native.h>
#include <ATen/ops/as_strided_native.h>
#include <ATen/ops/set_native.h>
#include <ATen/ops/view_as_complex_native.h>
#include <ATen/ops/view_as_real_native.h>
#include <ATen/ops/view_native.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <npubridge/device_sim/copy_engine.h>
#include <npubridge/dispatcher/runtime.h>
#include <npubridge/dispatcher/torch_boxing.h>
#include <npubridge/dispatcher/torch_dtype.h>
#include <npubridge/dispatcher/torch_error_bound.h>
#include <npubridge/dispatcher/value.h>
#include <npubridge/support/error.h>

#include <algorithm>
#include <array>
#include <map>
#include <set>
#include <sstream>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <unordered_map>
#include <vector>

namespace npub::torch_backend {

namespace {

Runtime& rt() { return Runtime::global(); }

c10::DeviceIndex current_index() { return static_cast<c10::DeviceIndex>(rt().devices().current_device()); }

// ---------------------------------------------------------------------------
// allocator
// ---------------------------------------------------------------------------

// The deleter of a device's memory: one function per device index, the
// context being the pointer itself, so handing out a DataPtr allocates
// nothing on the host (see Note [A cache hit does not touch the heap]).
constexpr int kMaxDevices = 64;  // NPUB_SIM_DEVICES' upper bound
template <int kDevice>
void free_on_device(void* ptr) {
  rt().devices().at(kDevice).free(ptr);
}
template <int... kDevices>
constexpr std::array<c10::DeleterFnPtr, sizeof...(kDevices)> make_deleters(std::integer_sequence<int, kDevices...>) {
  return {&free_on_device<kDevices>...};
}
constexpr auto kDeleters = make_deleters(std::make_integer_sequence<int, kMaxDevices>());

// Device memory from the simulated NPU's caching allocator, on the current
// device. The memory is reached only through the device's copy APIs. A
// c10::DeviceAllocator, so torch.accelerator's memory functions work too.
class NpuAllocator final : public c10::DeviceAllocator {
 public:
  c10::DataPtr allocate(size_t n) override {
    const int dev = rt().devices().current_device();
    void* p = nullptr;
    try {
      p = rt().devices().at(dev).allocate(n);
    } catch (const OutOfMemoryError& e) {
      TORCH_CHECK_WITH(OutOfMemoryError, false, e.what());
    }
    TORCH_INTERNAL_ASSERT(dev >= 0 && dev < kMaxDevices, "npu: device index ", dev, " has no deleter");
    return {p, p, kDeleters[static_cast<size_t>(dev)], c10::Device(c10::DeviceType::PrivateUse1, static_cast<c10::DeviceIndex>(dev))};
  }
  c10::DeleterFnPtr raw_deleter() const override { return nullptr; }
  void copy_data(void* dest, const void* src, std::size_t count) const override { std::memcpy(dest, src, count); }

  bool initialized() override { return true; }
  void emptyCache(c10::MempoolId_t) override {
    for (int i = 0; i < rt().devices().count(); ++i) rt().devices().at(i).allocator().empty_cache();
  }
  // Blocks are stream-ordered and kernels run in stream order (Note [Blocks
  // are stream-ordered]); a tensor used on another stream is synchronised by
  // its user, as the caching allocator's note says.
  void recordStream(const c10::DataPtr&, c10::Stream) override {}
  c10::CachingDeviceAllocator::DeviceStats getDeviceStats(c10::DeviceIndex device) override {
    const sim::AllocatorStats s = allocator_of(device).stats();
    c10::CachingDeviceAllocator::DeviceStats d;
    auto fill = [](c10::CachingDeviceAllocator::StatArray& a, int64_t current, int64_t peak, int64_t allocated, int64_t freed) {
      auto& all = a[static_cast<size_t>(c10::CachingDeviceAllocator::StatType::AGGREGATE)];
      all.current = current;
      all.peak = peak;
      all.allocated = allocated;
      all.freed = freed;
    };
    fill(d.allocated_bytes, s.allocated_bytes, s.peak_allocated_bytes, s.total_allocated_bytes, s.total_freed_bytes);
    fill(d.active_bytes, s.allocated_bytes, s.peak_allocated_bytes, s.total_allocated_bytes, s.total_freed_bytes);
    fill(d.reserved_bytes, s.reserved_bytes, s.peak_reserved_bytes, s.total_reserved_bytes, s.total_released_bytes);
    fill(d.requested_bytes, s.requested_bytes, s.requested_bytes, 0, 0);
    fill(d.allocation, s.active_blocks, s.active_blocks, s.num_allocs, s.num_frees);
    fill(d.active, s.active_blocks, s.active_blocks, s.num_allocs, s.num_frees);
    fill(d.segment, s.num_segments, s.num_segments, 0, 0);
    d.num_ooms = s.num_ooms;
    return d;
  }
  void resetAccumulatedStats(c10::DeviceIndex device) override { allocator_of(device).reset_accumulated_stats(); }
  void resetPeakStats(c10::DeviceIndex device) override { allocator_of(device).reset_peak_stats(); }
  // (free, total): the capacity not reserved by the cache, and the capacity.
  std::pair<size_t, size_t> getMemoryInfo(c10::DeviceIndex device) override {
    sim::CachingAllocator& a = allocator_of(device);
    const uint64_t reserved = static_cast<uint64_t>(a.stats().reserved_bytes);
    return {a.capacity() - std::min(reserved, a.capacity()), a.capacity()};
  }

 private:
  static sim::CachingAllocator& allocator_of(c10::DeviceIndex device) {
    TORCH_CHECK(device >= 0 && device < rt().devices().count(), "npu: device index ", static_cast<int>(device),
                " is out of range (", rt().devices().count(), " devices)");
    return rt().devices().at(device).allocator();
  }
};

NpuAllocator g_allocator;

// ---------------------------------------------------------------------------
// device guard
// ---------------------------------------------------------------------------

struct NpuGuardImpl final : public c10::impl::DeviceGuardImplInterface {
  static constexpr c10::DeviceType kType = c10::DeviceType::PrivateUse1;
  c10::DeviceType type() const override { return kType; }
  c10::Device exchangeDevice(c10::Device d) const override {
    const c10::Device old = getDevice();
    setDevice(d);
    return old;
  }
  c10::Device getDevice() const override { return {kType, current_index()}; }
  void setDevice(c10::Device d) const override {
    TORCH_CHECK(d.type() == kType, "expected an npu device but got ", d);
    if (d.index() >= 0) rt().devices().set_current_device(d.index());
  }
  void uncheckedSetDevice(c10::Device d) const noexcept override {
    try {
      if (d.index() >= 0) rt().devices().set_current_device(d.index());
    } catch (...) {
    }
  }
  // Streams are the device's simulated streams; a c10::Stream's id is the
  // stream's id within its device (0: the default stream).
  static c10::Stream to_c10(const sim::Stream& s) {
    return c10::Stream(c10::Stream::UNSAFE, c10::Device(kType, static_cast<c10::DeviceIndex>(s.device_index())),
                       static_cast<c10::StreamId>(s.id()));
  }
  static sim::Device& device_of(c10::Device d) { return rt().devices().at(d.index() < 0 ? current_index() : d.index()); }
  static sim::Stream& from_c10(const c10::Stream& s) { return device_of(s.device()).stream(static_cast<int>(s.id())); }
  c10::Stream getStream(c10::Device d) const override { return to_c10(device_of(d).current_stream()); }
  c10::Stream getDefaultStream(c10::Device d) const override { return to_c10(device_of(d).stream(0)); }
  // New streams come from a small per-device pool, round robin (as CUDA's
  // pool does): every stream owns a worker thread.
  c10::Stream getNewStream(c10::Device d, int) const override {
    static std::mutex mu;
    static std::map<int, std::vector<int>> pool;
    static std::map<int, size_t> next;
    sim::Device& dev = device_of(d);
    std::lock_guard<std::mutex> lock(mu);
    std::vector<int>& ids = pool[dev.index()];
    if (ids.size() < 4) ids.push_back(dev.create_stream().id());
    const int id = ids[next[dev.index()]++ % ids.size()];
    return to_c10(dev.stream(id));
  }
  c10::Stream exchangeStream(c10::Stream s) const override {
    sim::Device& dev = device_of(s.device());
    const c10::Stream old = to_c10(dev.current_stream());
    dev.set_current_stream(from_c10(s));
    return old;
  }
  bool queryStream(const c10::Stream& s) const override { return from_c10(s).query(); }
  void synchronizeStream(const c10::Stream& s) const override { from_c10(s).synchronize(); }
  c10::DeviceIndex deviceCount() const noexcept override {
    try {
      return static_cast<c10::DeviceIndex>(rt().devices().count());
    } catch (...) {
      return 0;
    }
  }
  void synchronizeDevice(const c10::DeviceIndex index) const override {
    rt().devices().at(index < 0 ? current_index() : index).synchronize();
  }
  // Events are the simulator's events (completion and timing follow the
  // stream's queued work).
  void record(void** event, const c10::Stream& s, const c10::DeviceIndex, const c10::EventFlag) const override {
    if (*event == nullptr) *event = new sim::Event();
    static_cast<sim::Event*>(*event)->record(from_c10(s));
  }
  void block(void* event, const c10::Stream& s) const override {
    if (event != nullptr) from_c10(s).wait_event(*static_cast<sim::Event*>(event));
  }
  bool queryEvent(void* event) const override { return event == nullptr || static_cast<sim::Event*>(event)->query(); }
  void synchronizeEvent(void* event) const override {
    if (event != nullptr) static_cast<sim::Event*>(event)->synchronize();
  }
  double elapsedTime(void* start, void* end, const c10::DeviceIndex) const override {
    TORCH_CHECK(start != nullptr && end != nullptr, "npu: elapsed_time needs both events recorded");
    try {
      return static_cast<sim::Event*>(start)->elapsed_ms(*static_cast<sim::Event*>(end));
    } catch (const Error& e) {
      TORCH_CHECK(false, e.what());
    }
  }
  void destroyEvent(void* event, const c10::DeviceIndex) const noexcept override { delete static_cast<sim::Event*>(event); }
};

C10_REGISTER_GUARD_IMPL(PrivateUse1, NpuGuardImpl);

// ---------------------------------------------------------------------------
// hooks
// ---------------------------------------------------------------------------

struct NpuHooks final : public at::PrivateUse1HooksInterface {
  bool isBuilt() const override { return true; }
  bool isAvailable() const override { return rt().devices().count() > 0; }
  const at::Generator& getDefaultGenerator(c10::DeviceIndex device_index) const override {
    // Random factories run through the CPU fallback with the CPU generator;
    // device-side random kernels use the device's Philox stream.
    (void)device_index;
    return at::detail::getDefaultCPUGenerator();
  }
  at::Device getDeviceFromPtr(void* data) const override {
    for (int i = 0; i < rt().devices().count(); ++i)
      if (rt().devices().at(i).allocator().contains(data, 1)) return {c10::DeviceType::PrivateUse1, static_cast<c10::DeviceIndex>(i)};
    return {c10::DeviceType::PrivateUse1, current_index()};
  }
  bool hasPrimaryContext(c10::DeviceIndex) const override { return true; }
  // Host memory needs no pinning for the simulated device.
  c10::Allocator* getPinnedMemoryAllocator() const override { return at::getCPUAllocator(); }
  void resizePrivateUse1Bytes(const c10::Storage& storage, size_t newsize) const override {
    c10::DataPtr fresh = g_allocator.allocate(newsize);
    const size_t keep = std::min(newsize, storage.nbytes());
    if (keep > 0) std::memcpy(fresh.get(), storage.data(), keep);
    const_cast<c10::Storage&>(storage).set_data_ptr_noswap(std::move(fresh));
    const_cast<c10::Storage&>(storage).set_nbytes(newsize);
  }
};

// ---------------------------------------------------------------------------
// tensors as DLTensors
// ---------------------------------------------------------------------------

// A DLTensor describing a torch tensor, valid while the tensor lives and
// keeps its shape: shape and strides point into the tensor's own metadata
// (kernels only read them).
// A metadata-only view (data NULL) describes a meta or fake tensor as a
// tensor of the current npu.
struct DLView {
  DLTensor dl{};
  explicit DLView(const at::Tensor& t, bool metadata_only = false) {
    dl.data = metadata_only ? nullptr : t.data_ptr();
    dl.device = t.device().is_cpu() && !metadata_only
                    ? DLDevice{kDLCPU, 0}
                    : DLDevice{static_cast<DLDeviceType>(NPUB_DEVICE_NPU),
                               t.device().is_privateuseone() ? t.device().index() : current_index()};
    dl.ndim = static_cast<int32_t>(t.dim());
    dl.dtype = to_dl(npub_dtype(t.scalar_type()));
    dl.shape = const_cast<int64_t*>(t.sizes().data());
    dl.strides = const_cast<int64_t*>(t.strides().data());
  }
};

// ---------------------------------------------------------------------------
// native ops: factories, views, copies
// ---------------------------------------------------------------------------

at::Tensor empty_memory_format(c10::IntArrayRef size, std::optional<at::ScalarType> dtype, std::optional<at::Layout>,
                               std::optional<at::Device> device, std::optional<bool>, std::optional<at::MemoryFormat> mf) {
  c10::OptionalDeviceGuard guard;
  if (device.has_value() && device->has_index() && device->index() != current_index()) guard.reset_device(*device);
  return at::detail::empty_generic(size, &g_allocator, c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
                                   dtype.value_or(at::get_default_dtype_as_scalartype()), mf);
}

at::Tensor empty_strided(c10::IntArrayRef size, c10::IntArrayRef stride, std::optional<at::ScalarType> dtype,
                         std::optional<at::Layout>, std::optional<at::Device> device, std::optional<bool>) {
  c10::DeviceGuard guard(device.value_or(at::Device(c10::DeviceType::PrivateUse1, current_index())));
  return at::detail::empty_strided_generic(size, stride, &g_allocator, c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
                                           dtype.value_or(at::get_default_dtype_as_scalartype()));
}

at::Tensor as_strided(const at::Tensor& self, c10::IntArrayRef size, c10::IntArrayRef stride, std::optional<int64_t> offset) {
  return at::native::as_strided_tensorimpl(self, size, stride, offset);
}

const at::Tensor& resize_(const at::Tensor& self, c10::IntArrayRef size, std::optional<at::MemoryFormat> mf) {
  int64_t numel = 1;
  for (int64_t s : size) numel *= s;
  const size_t needed = static_cast<size_t>((numel + self.storage_offset()) * self.element_size());
  if (needed > self.storage().nbytes()) NpuHooks().resizePrivateUse1Bytes(self.storage(), needed);
  self.unsafeGetTensorImpl()->set_sizes_contiguous(size);
  if (mf.has_value() && *mf != at::MemoryFormat::Contiguous && *mf != at::MemoryFormat::Preserve)
    self.unsafeGetTensorImpl()->empty_tensor_restride(*mf);
  return self;
}

// Copies between npu and cpu tensors of any dtype and layout, through the
// device's copy engine (device memory is never aliased by a host tensor).
at::Tensor copy_from(const at::Tensor& self, const at::Tensor& dst, bool non_blocking) {
  // Types the copy engine does not know move as their real components or
  // as same-size integers (bit-exact): complex as pairs of floats, uint64
  // as int64.
  if (self.scalar_type() == dst.scalar_type() && npub_dtype(self.scalar_type()) == DType::kUnknown) {
    if (self.is_complex()) {
      // The native views directly: through the dispatcher they could land
      // in the CPU fallback, which copies with this function again.
      TORCH_CHECK(!self.is_conj(), "npu copy: conjugated complex views are not supported; call resolve_conj() first");
      copy_from(at::native::view_as_real(self), at::native::view_as_real(dst), non_blocking);
      return dst;
    }
    if (self.element_size() == 8 || self.element_size() == 4 || self.element_size() == 2 || self.element_size() == 1) {
      const at::ScalarType as = self.element_size() == 8 ? at::kLong : self.element_size() == 4 ? at::kInt
                                : self.element_size() == 2 ? at::kShort : at::kByte;
      copy_from(at::native::view_dtype(self, as), at::native::view_dtype(dst, as), non_blocking);
      return dst;
    }
  }
  TORCH_CHECK(npub_dtype(self.scalar_type()) != DType::kUnknown && npub_dtype(dst.scalar_type()) != DType::kUnknown,
              "npu copy: unsupported dtype ", self.scalar_type(), " -> ", dst.scalar_type());
  if (dst.numel() == 0) return dst;
  // Broadcast, or (as copy_ allows) the same number of elements in another
  // shape, e.g. [1] into [].
  at::Tensor src = self.sizes().equals(dst.sizes())     ? self
                   : self.numel() == dst.numel()        ? self.reshape(dst.sizes())
                                                        : self.expand_as(dst);
  if (self.is_privateuseone()) rt().devices().at(self.device().index()).synchronize();
  sim::copy_tensor(DLView(dst).dl, DLView(src).dl);
  return dst;
}

at::Tensor copy_from_and_resize(const at::Tensor& self, const at::Tensor& dst) {
  if (!dst.sizes().equals(self.sizes())) resize_(dst, self.sizes(), std::nullopt);
  return copy_from(self, dst, false);
}

at::Scalar local_scalar_dense(const at::Tensor& self) {
  at::Tensor cpu = at::empty({}, self.options().device(at::kCPU));
  copy_from(self, cpu, false);
  return cpu.item();
}

// set_: a tensor onto (part of) an npu storage; what storage copies and
// torch.save / torch.load use.
at::Tensor& set_storage(at::Tensor& self, c10::Storage source, c10::SymInt offset, c10::SymIntArrayRef size,
                        c10::SymIntArrayRef stride) {
  return at::native::set_storage_cpu_(self, std::move(source), offset.expect_int(), C10_AS_INTARRAYREF_SLOW(size),
                                      C10_AS_INTARRAYREF_SLOW(stride));
}

at::Tensor& set_empty(at::Tensor& self) {
  c10::Storage empty(c10::Storage::use_byte_size_t(), 0, &g_allocator, /*resizable=*/true);
  return at::native::set_storage_cpu_(self, empty, 0, {0}, {});
}

// Note [npu tensors are shallow-copy compatible with CPU ones]
// Module._apply (what .to("npu") runs) keeps each Parameter object and
// swaps its data (`param.data = param_applied`) only when
// _has_compatible_shallow_copy_type says the two tensor types may share a
// TensorImpl shape; otherwise it makes a new Parameter per module, and
// weights tied by object identity (a language model's input and output
// embeddings) come apart into two tensors that train separately.
// c10's default lists CUDA, XPU, ... but not PrivateUse1, so the device
// says it here, for dense strided tensors, as OpenReg's does.
bool has_compatible_shallow_copy_type(const at::Tensor& self, const at::Tensor& from) {
  auto dense = [](const at::Tensor& t) {
    return t.layout() == c10::kStrided && !t.is_quantized() && !t.is_nested() &&
           (t.device().is_cpu() || t.device().type() == c10::DeviceType::PrivateUse1);
  };
  return dense(self) && dense(from);
}

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("_has_compatible_shallow_copy_type", &has_compatible_shallow_copy_type);
  m.impl("set_.source_Storage", &at::native::set_);
  m.impl("set_.source_Storage_storage_offset", &set_storage);
  m.impl("set_.source_Tensor", &at::native::set_tensor_);
  m.impl("set_", &set_empty);
  m.impl("empty.memory_format", &empty_memory_format);
  m.impl("empty_strided", &empty_strided);
  m.impl("as_strided", &as_strided);
  m.impl("view", &at::native::view);
  m.impl("_reshape_alias", &at::native::_reshape_alias);
  m.impl("alias", &at::native::alias);
  m.impl("view_as_real", &at::native::view_as_real);
  m.impl("view_as_complex", &at::native::view_as_complex);
  m.impl("view.dtype", &at::native::view_dtype);
  m.impl("resize_", &resize_);
  m.impl("_copy_from", &copy_from);
  m.impl("_copy_from_and_resize", &copy_from_and_resize);
  m.impl("_local_scalar_dense", &local_scalar_dense);
}

// ---------------------------------------------------------------------------
// the bridge: ATen boxed calls -> npubridge's dispatcher
// ---------------------------------------------------------------------------

// The torch call being served on this thread, for the dispatcher's fallback.
struct TorchCall {
  TorchCall(const c10::OperatorHandle* o, torch::jit::Stack* s) : op(o), stack(s) {}
  const c10::OperatorHandle* op;
  torch::jit::Stack* stack;  // null for an unboxed call until a fallback needs it
  bool fell_back = false;
  // An unboxed call's arguments, pushed onto `own` when the fallback needs a
  // stack (see Note [Unboxed entry for the common signatures]).
  void (*push_args)(const void* ctx, torch::jit::Stack& stack) = nullptr;
  const void* push_ctx = nullptr;
  torch::jit::Stack own;
};
thread_local TorchCall* tls_call = nullptr;

// Makes `call` the thread's current torch call for its scope (nested calls
// restore the outer one).
struct ScopedTorchCall {
  TorchCall* outer;
  explicit ScopedTorchCall(TorchCall& call) : outer(tls_call) { tls_call = &call; }
  ~ScopedTorchCall() { tls_call = outer; }
  ScopedTorchCall(const ScopedTorchCall&) = delete;
  ScopedTorchCall& operator=(const ScopedTorchCall&) = delete;
};

// Produces torch npu tensors for returns the kernel allocates (rare: ops
// whose output shape depends on data).
class TorchOutputs final : public OutputAllocator {
 public:
  DLTensor* allocate(int32_t ret_index, const DLDevice& device, int32_t ndim, const int64_t* shape, DLDataType dtype) override {
    c10::DeviceGuard guard(at::Device(c10::DeviceType::PrivateUse1, static_cast<c10::DeviceIndex>(device.device_id)));
    at::Tensor t = at::empty(std::vector<int64_t>(shape, shape + ndim),
                             at::TensorOptions().dtype(torch_dtype(dtype_of(dtype))).device(c10::DeviceType::PrivateUse1,
                                                                                             device.device_id));
    slots_.push_back({ret_index, t, std::make_unique<DLView>(t)});
    return &slots_.back().view->dl;
  }
  const at::Tensor* find(int32_t ret_index) const {
    for (const Slot& s : slots_)
      if (s.index == ret_index) return &s.tensor;
    return nullptr;
  }

 private:
  struct Slot {
    int32_t index;
    at::Tensor tensor;
    std::unique_ptr<DLView> view;
  };
  std::vector<Slot> slots_;
};

// One call's arguments as NpubValues, and what they point to. `views` is
// reserved for every tensor of the call up front, so the DLTensor addresses
// handed out stay put; the rarer kinds live behind their own pointers.
struct Boxed {
  c10::SmallVector<NpubValue, 8> values;
  c10::SmallVector<DLView, 6> views;
  std::vector<at::Tensor> keep;  // CPU scalars moved to the device
  BoxedStorage storage;  // lists and strings
};

size_t count_tensors(c10::ArrayRef<c10::IValue> args) {
  size_t n = 0;
  for (const auto& v : args) {
    if (v.isTensor()) ++n;
    else if (v.isList()) n += v.toListRef().size();
  }
  return n;
}

// Converts one IValue. A 0-d CPU tensor (a wrapped Python number) joins the
// call's device, as CUDA accepts CPU scalars.
NpubValue box(const c10::IValue& v, Boxed& b, c10::DeviceIndex device, bool metadata_only = false) {
  auto tensor_view = [&](at::Tensor t) -> DLTensor* {
    if (metadata_only) {
      TORCH_INTERNAL_ASSERT(b.views.size() < b.views.capacity(), "npubridge: tensor views were not reserved");
      b.views.emplace_back(t, true);
      return &b.views.back().dl;
    }
    if (t.device().is_cpu() && t.dim() == 0) {
      t = t.to(at::Device(c10::DeviceType::PrivateUse1, device));
      b.keep.push_back(t);
    }
    TORCH_INTERNAL_ASSERT(b.views.size() < b.views.capacity(), "npubridge: tensor views were not reserved");
    b.views.emplace_back(t);
    return &b.views.back().dl;
  };
  return box_ivalue(v, b.storage, tensor_view);
}

c10::DeviceIndex call_device(c10::ArrayRef<c10::IValue> args) {
  for (const auto& v : args) {
    if (v.isTensor() && v.toTensor().defined() && v.toTensor().is_privateuseone()) return v.toTensor().device().index();
    if (v.isList())
      for (const auto& e : v.toListRef())
        if (e.isTensor() && e.toTensor().defined() && e.toTensor().is_privateuseone()) return e.toTensor().device().index();
  }
  return current_index();
}

// False when some tensor argument has a dtype without a DLPack code plugins
// know (DType::kUnknown: complex, float8, ...), so the host computes the op.
// Not for tensors with a lazy conjugate or negation: the CPU fallback
// resolves those on the device first (a clone, routed here again), so they
// keep the dispatcher's error instead of recursing.
bool describable(c10::ArrayRef<c10::IValue> args) {
  auto ok = [](const c10::IValue& v) {
    if (!v.isTensor() || !v.toTensor().defined()) return true;
    const at::Tensor& t = v.toTensor();
    return npub_dtype(t.scalar_type()) != DType::kUnknown || t.is_conj() || t.is_neg();
  };
  for (const auto& v : args) {
    if (!ok(v)) return false;
    if (v.isList())
      for (const auto& e : v.toListRef())
        if (!ok(e)) return false;
  }
  return true;
}

// "aten::add.out": the registry's spelling of an ATen operator name.
std::string full_name(const c10::OperatorName& n) {
  return n.overload_name.empty() ? n.name : n.name + "." + n.overload_name;
}

// Dispatcher::call with its errors as PyTorch's: out of memory as
// torch.OutOfMemoryError, anything else as a RuntimeError with the message.
void call_dispatcher(const OpHandle& target, const NpubValue* args, int32_t num_args, NpubValue* rets, int32_t num_rets,
                     OutputAllocator* outs) {
  try {
    rt().dispatcher().call(target, args, num_args, rets, num_rets, outs);
  } catch (const OutOfMemoryError& e) {
    TORCH_CHECK_WITH(OutOfMemoryError, false, e.what());
  } catch (const Error& e) {
    TORCH_CHECK(false, e.what());
  }
}

// Runs `target` (an op of the registry) on the given IValue arguments and
// leaves its results on `stack` (which must not hold the arguments; null:
// the caller needs no results).
void run_on_dispatcher(const OpHandle& target, c10::ArrayRef<c10::IValue> args, torch::jit::Stack* stack) {
  const c10::DeviceIndex device = call_device(args);
  c10::OptionalDeviceGuard guard;
  if (device != current_index()) guard.reset_device(at::Device(c10::DeviceType::PrivateUse1, device));
  Boxed b;
  b.values.reserve(args.size());
  b.views.reserve(count_tensors(args));
  for (const auto& a : args) b.values.push_back(box(a, b, device));
  const auto& returns = target.op->schema().returns;
  NpubValue rets_small[4];
  std::vector<NpubValue> rets_big;
  NpubValue* rets = rets_small;
  if (returns.size() > 4) {
    rets_big.resize(returns.size());
    rets = rets_big.data();
  }
  for (size_t i = 0; i < returns.size(); ++i) rets[i] = none_value();
  TorchOutputs outs;
  call_dispatcher(target, b.values.data(), static_cast<int32_t>(b.values.size()), rets,
                  static_cast<int32_t>(returns.size()), &outs);
  if (stack == nullptr) return;
  const auto& alias = target.op->return_alias();
  for (size_t i = 0; i < returns.size(); ++i) {
    if (alias[i] >= 0) {
      stack->push_back(args[static_cast<size_t>(alias[i])]);
    } else if (const at::Tensor* t = outs.find(static_cast<int32_t>(i))) {
      stack->push_back(*t);
    } else if (rets[i].tag == NPUB_VALUE_INT) {
      stack->push_back(rets[i].u.i);
    } else if (rets[i].tag == NPUB_VALUE_DOUBLE) {
      stack->push_back(rets[i].u.d);
    } else if (rets[i].tag == NPUB_VALUE_BOOL) {
      stack->push_back(rets[i].u.i != 0);
    } else {
      stack->push_back(at::Tensor());  // undefined (output_mask off)
    }
  }
}

void cpu_fallback_counted(const c10::OperatorHandle& op, torch::jit::Stack* stack);
void cpu_decides(const c10::OperatorHandle& op, torch::jit::Stack* stack);

// The same value with every tensor (also inside lists) on the meta device.
// Wrapped numbers (Python scalars as 0-d CPU tensors) stay as they are: meta
// kernels take CPU scalars, and type promotion depends on the flag.
at::Tensor to_meta(const at::Tensor& t) {
  if (!t.defined() || t.unsafeGetTensorImpl()->is_wrapped_number()) return t;
  return at::empty_strided(t.sizes(), t.strides(), t.options().device(at::kMeta));
}

// The same value with every tensor mapped by `fn` (lists of tensors too).
template <typename Fn>
c10::IValue map_tensors(const c10::IValue& v, Fn fn) {
  if (v.isTensor()) return fn(v.toTensor());
  if (v.isTensorList()) {
    c10::List<at::Tensor> l;
    for (const at::Tensor& t : v.toTensorVector()) l.push_back(fn(t));
    return l;
  }
  bool tensors = v.isList() && !v.isIntList() && !v.isDoubleList() && !v.isBoolList();
  if (tensors)
    for (const c10::IValue& e : v.toListRef()) tensors = tensors && (e.isNone() || e.isTensor());
  if (tensors) {
    c10::List<std::optional<at::Tensor>> l;
    for (const c10::IValue& e : v.toListRef())
      l.push_back(e.isNone() ? std::optional<at::Tensor>() : std::optional<at::Tensor>(fn(e.toTensor())));
    return l;
  }
  return v;
}

// Output shapes and dtypes by call signature (op, argument metadata and
// scalar values): ATen's meta kernels are exact but slow (many are written in
// Python); a repeated call shape reuses their answer.
struct OutputSpec {
  std::vector<int64_t> sizes;
  at::ScalarType dtype;
};
using OutputSpecs = std::vector<OutputSpec>;
// Per thread, so the hot path takes no lock; each thread asks the meta
// kernel once per call signature.
thread_local std::unordered_map<std::string, std::shared_ptr<const OutputSpecs>> tls_meta_cache;

// The cache key: raw bytes of every argument's metadata, prefixed with the
// op's address. False when some argument cannot be part of a key (the call
// is not cached).
template <typename T>
void put(std::string& k, const T& v) {
  k.append(reinterpret_cast<const char*>(&v), sizeof v);
}
void tensor_key(std::string& k, const at::Tensor& t) {
  if (!t.defined()) {
    k.push_back('U');
    return;
  }
  k.push_back(t.device().is_cpu() ? (t.unsafeGetTensorImpl()->is_wrapped_number() ? 'w' : 'c') : 'd');
  put(k, static_cast<int8_t>(t.scalar_type()));
  put(k, static_cast<int8_t>(t.dim()));
  k.append(reinterpret_cast<const char*>(t.sizes().data()), t.sizes().size() * sizeof(int64_t));
}
void int_key(std::string& k, int64_t v) { k.push_back('i'); put(k, v); }
void double_key(std::string& k, double v) { k.push_back('f'); put(k, v); }
void bool_key(std::string& k, bool v) { k.push_back('b'); put(k, v); }

bool signature(const c10::OperatorHandle& op, c10::ArrayRef<c10::IValue> args, std::string* key) {
  std::string& k = *key;
  k.clear();
  put(k, &op.schema());
  for (const auto& a : args) {
    if (a.isNone()) k.push_back('N');
    else if (a.isTensor()) tensor_key(k, a.toTensor());
    else if (a.isInt()) int_key(k, a.toInt());
    else if (a.isDouble()) double_key(k, a.toDouble());
    else if (a.isBool()) bool_key(k, a.toBool());
    else if (a.isString()) { k.push_back('s'); k += a.toStringRef(); k.push_back('\0'); }
    else if (a.isIntList()) {
      k.push_back('l');
      const auto l = a.toIntList();
      put(k, static_cast<int32_t>(l.size()));
      for (int64_t x : l) put(k, x);
    } else if (a.isTensorList()) {
      k.push_back('L');
      const auto l = a.toTensorList();
      put(k, static_cast<int32_t>(l.size()));
      for (const at::Tensor& t : l) tensor_key(k, t);
    } else {
      return false;
    }
  }
  return true;
}

// The outputs' shapes and dtypes of a functional op: from the cache, or from
// the op's meta kernel. Null when the meta kernel fails.
const OutputSpecs* cached_output_specs(const std::string& key) {
  auto it = tls_meta_cache.find(key);
  return it != tls_meta_cache.end() ? it->second.get() : nullptr;
}

std::shared_ptr<const OutputSpecs> output_specs(const c10::OperatorHandle& op, c10::ArrayRef<c10::IValue> args) {
  thread_local std::string key;  // keeps its capacity: no allocation per call
  const bool cacheable = signature(op, args, &key);
  if (cacheable) {
    if (auto it = tls_meta_cache.find(key); it != tls_meta_cache.end()) return it->second;
  }
  torch::jit::Stack meta;
  for (const auto& a : args) meta.push_back(map_tensors(a, [](const at::Tensor& t) { return to_meta(t); }));
  try {
    op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::Meta), &meta);
  } catch (const std::exception& e) {
    if (const char* lvl = std::getenv("NPUB_LOG_LEVEL"); lvl != nullptr && std::string(lvl) == "debug")
      std::fprintf(stderr, "[npubridge] [debug] meta kernel of '%s' failed: %s\n",
                   full_name(op.schema().operator_name()).c_str(), e.what());
    return nullptr;
  }
  auto specs = std::make_shared<OutputSpecs>();
  for (const auto& r : meta) specs->push_back({r.toTensor().sizes().vec(), r.toTensor().scalar_type()});
  if (cacheable) {
    if (tls_meta_cache.size() > 4096) tls_meta_cache.clear();
    tls_meta_cache.emplace(key, specs);
  }
  return specs;
}

// out= tensors of the wrong shape are resized first, as ATen's out
// convention does (callers pass empty outs); the shapes come from the op's
// meta kernel. Without a meta kernel the plugin's own shape check decides.
void resize_outs(const c10::OperatorHandle& op, c10::ArrayRef<c10::IValue> args) {
  const auto specs = output_specs(op, args);
  if (!specs) return;
  const auto& schema_args = op.schema().arguments();
  size_t r = 0;
  for (size_t i = 0; i < schema_args.size() && r < specs->size(); ++i) {
    if (!schema_args[i].is_out() || !args[i].isTensor()) continue;
    const at::Tensor& real = args[i].toTensor();
    const std::vector<int64_t>& sizes = (*specs)[r++].sizes;
    if (!real.sizes().equals(sizes)) resize_(real, sizes, std::nullopt);
  }
}

// ---------------------------------------------------------------------------
// precision check: every plugin call against ATen's CPU kernel
// ---------------------------------------------------------------------------

std::atomic<bool> g_precision_on{false};

// Judges a tensor a plugin produced under the op's error model
// (torch_error_bound.h: the same verdict as npub-conformance's) and reports
// a mismatch through the dispatcher. `host`: ATen's CPU result in the op's
// dtype; `wide`, `magnitude`: its float64 and |inputs| results (may be
// undefined).
void compare_with_cpu(const std::string& op, const reg::OpEntry* target, const std::string& plugin, const std::string& label,
                      const at::Tensor& got_npu, const at::Tensor& host, const at::Tensor& wide, const at::Tensor& magnitude,
                      const numerics::ErrorModel& model, int64_t terms, const std::vector<c10::IValue>& inputs) {
  if (!got_npu.defined() || !host.defined()) return;
  PrecisionMismatch m;
  m.op = op;
  m.plugin = plugin;
  m.output = label;
  const at::Tensor got = got_npu.cpu();
  m.numel = host.numel();
  if (!got.sizes().equals(host.sizes()) || got.scalar_type() != host.scalar_type()) {
    m.num_mismatched = 1;
    rt().dispatcher().record_precision_mismatch(m, target);
    return;
  }
  if (host.numel() == 0 || npub_dtype(host.scalar_type()) == DType::kUnknown) return;
  const bool wide_ok = wide.defined() && wide.sizes().equals(host.sizes());
  const bool mag_ok = magnitude.defined() && magnitude.sizes().equals(host.sizes());
  const double scale = model.magnitude == numerics::Magnitude::kScale && wide_ok ? numerics::call_scale(inputs, wide) : 0;
  const numerics::Verdict v = numerics::judge(model, got, host, wide_ok ? wide : at::Tensor(), mag_ok ? magnitude : at::Tensor(),
                                              terms, scale);
  if (v.ok()) return;
  m.take(v);
  rt().dispatcher().record_precision_mismatch(m, target);
}

// CPU copies of a call's arguments, taken before the plugin runs.
std::vector<c10::IValue> cpu_copies(c10::ArrayRef<c10::IValue> args) {
  std::vector<c10::IValue> cpu;
  cpu.reserve(args.size());
  for (const auto& a : args)
    cpu.push_back(map_tensors(a, [](const at::Tensor& t) {
      if (!t.defined()) return t;
      return t.device().is_cpu() ? t.clone() : t.to(at::kCPU, /*non_blocking=*/false, /*copy=*/true);
    }));
  return cpu;
}

// Runs `op` through ATen on the CPU copies (in the op's dtype, in float64
// and on |inputs| as the op's error model asks) and judges the returns and
// written arguments the plugin left in `results` and `args`.
void check_against_cpu(const c10::OperatorHandle& op, const OpHandle& target, std::vector<c10::IValue> cpu_args,
                       c10::ArrayRef<c10::IValue> args, const std::vector<c10::IValue>& results) {
  const auto& sargs = op.schema().arguments();
  const auto& sret = op.schema().returns();
  const std::string name = full_name(op.schema().operator_name());
  // The model is the plugin op's (a functional op routed through its .out
  // kernel is judged as that kernel).
  const std::string& model_name = target.op != nullptr ? target.op->name() : name;
  const numerics::ErrorModel& model = numerics::error_model(model_name);
  struct Run {
    std::vector<c10::IValue> args;
    torch::jit::Stack stack;
    bool ok = true;
  };
  auto run = [&](numerics::Precision p, at::ScalarType compute) {
    Run r;
    for (size_t i = 0; i < cpu_args.size(); ++i) {
      const bool scalar_type = i < sargs.size() && sargs[i].type()->kind() == c10::TypeKind::ScalarTypeType;
      const bool scalar = i < sargs.size() && sargs[i].type()->kind() == c10::TypeKind::NumberType;
      r.args.push_back(numerics::reference_input(cpu_args[i], scalar_type, scalar, p, compute));
    }
    r.stack.assign(r.args.begin(), r.args.end());
    try {
      at::AutoDispatchBelowADInplaceOrView below;
      op.callBoxed(&r.stack);
    } catch (const std::exception&) {
      if (p == numerics::Precision::kSame) throw;
      r.ok = false;  // no float64 kernel: judged against the op's dtype alone
    }
    return r;
  };
  const Run same = run(numerics::Precision::kSame, at::ScalarType::Undefined);
  at::ScalarType compute = at::ScalarType::Undefined;
  for (const auto& v : same.stack)
    if (v.isTensor() && v.toTensor().defined() && at::isFloatingType(v.toTensor().scalar_type())) {
      compute = v.toTensor().scalar_type();
      break;
    }
  Run wide, magnitude;
  wide.ok = magnitude.ok = false;
  if (compute != at::ScalarType::Undefined && numerics::needs_float64(model)) {
    wide = run(numerics::Precision::kFloat64, compute);
    if (wide.ok && numerics::needs_magnitude(model)) magnitude = run(numerics::Precision::kMagnitude, compute);
  }
  const DType dt = [&] {
    for (const auto& a : args)
      if (a.isTensor() && a.toTensor().defined()) return npub_dtype(a.toTensor().scalar_type());
    return DType::kUnknown;
  }();
  const reg::Kernel* k = rt().dispatcher().kernel_for(target, dt);
  const std::string plugin = k != nullptr ? k->plugin_name() : std::string("?");
  const int64_t terms = target.op != nullptr ? numerics::call_terms(model, target.op->schema(), cpu_args) : 0;
  std::vector<c10::IValue> inputs;  // read-only arguments, for Magnitude::kScale
  for (size_t i = 0; i < sargs.size() && i < cpu_args.size(); ++i)
    if (sargs[i].alias_info() == nullptr || !sargs[i].alias_info()->isWrite()) inputs.push_back(cpu_args[i]);
  auto tensor_at = [](const Run& r, bool from_args, size_t i) {
    if (!r.ok) return at::Tensor();
    const c10::IValue& v = from_args ? r.args[i] : r.stack[i];
    return v.isTensor() ? v.toTensor() : at::Tensor();
  };
  for (size_t i = 0; i < sargs.size() && i < args.size(); ++i)
    if (sargs[i].alias_info() != nullptr && sargs[i].alias_info()->isWrite() && args[i].isTensor())
      compare_with_cpu(name, target.op, plugin, "argument '" + sargs[i].name() + "'", args[i].toTensor(), same.args[i].toTensor(),
                       tensor_at(wide, true, i), tensor_at(magnitude, true, i), model, terms, inputs);
  for (size_t i = 0; i < sret.size() && i < results.size() && i < same.stack.size(); ++i) {
    if (sret[i].alias_info() != nullptr && sret[i].alias_info()->isWrite()) continue;  // compared as its argument
    if (results[i].isTensor() && same.stack[i].isTensor())
      compare_with_cpu(name, target.op, plugin, "return " + std::to_string(i), results[i].toTensor(), same.stack[i].toTensor(),
                       tensor_at(wide, false, i), tensor_at(magnitude, false, i), model, terms, inputs);
  }
}

// ---------------------------------------------------------------------------
// the boxed kernel every routed op is registered with
// ---------------------------------------------------------------------------

// How a torch op reaches a plugin kernel: the op itself (kDirect), or a
// functional / in-place op through the plugin's .out kernel, the outputs'
// shapes and dtypes coming from the op's meta kernel (ATen's own shape and
// type-promotion rules).
enum class Route { kDirect, kViaOut, kInplaceViaOut };

// State resolved once at registration, so a call does no name lookups; the
// registry op is re-resolved only when the op-mapping table changes.
class Bridge final : public c10::OperatorKernel {
 public:
  Bridge(Route route, std::string target_name) : route_(route), target_name_(std::move(target_name)) {}

  void operator()(const c10::OperatorHandle& op, c10::DispatchKeySet, torch::jit::Stack* stack) {
    const size_t n = op.schema().arguments().size();
    // The call's arguments, then (for the .out routes) its outputs.
    c10::SmallVector<c10::IValue, 8> args(stack->end() - static_cast<std::ptrdiff_t>(n), stack->end());
    // copy_ between the host and the device is a transfer, not a kernel: the
    // device's copy engine does it (a plugin's copy_ is device to device).
    if (route_ == Route::kDirect && op.schema().operator_name().name == "aten::copy_" &&
        args[0].toTensor().device() != args[1].toTensor().device()) {
      copy_from(args[1].toTensor(), args[0].toTensor(), false);
      torch::jit::drop(*stack, n);
      stack->push_back(args[0]);
      return;
    }
    // Tensors of a dtype plugins cannot describe (complex, float8, ...) are
    // the host's to compute.
    if (!describable(args)) {
      cpu_fallback_counted(op, stack);
      return;
    }
    c10::SmallVector<at::Tensor, 2> outs;
    if (route_ == Route::kDirect) {
      if (has_out_) resize_outs(op, args);
    } else if (route_ == Route::kInplaceViaOut) {
      outs.push_back(args[0].toTensor());
    } else {
      const auto specs = output_specs(op, args);
      if (!specs) {
        // No meta kernel (or an input the meta kernel rejects): let the CPU
        // implementation decide, and raise its own error if it must.
        cpu_decides(op, stack);
        return;
      }
      const c10::DeviceIndex device = call_device(args);
      for (const OutputSpec& spec : *specs)
        outs.push_back(empty_memory_format(spec.sizes, spec.dtype, std::nullopt,
                                           at::Device(c10::DeviceType::PrivateUse1, device), std::nullopt, std::nullopt));
    }
    // The reference is ATen's CPU kernel of the same op (ops of a plugin's
    // own namespace have none).
    const bool check = g_precision_on.load(std::memory_order_relaxed) &&
                       (op.hasKernelForDispatchKey(c10::DispatchKey::CPU) ||
                        op.hasKernelForDispatchKey(c10::DispatchKey::CompositeExplicitAutograd));
    std::vector<c10::IValue> cpu_args;
    if (check) cpu_args = cpu_copies(args);
    for (const auto& o : outs) args.push_back(o);
    const OpHandle target = resolve();
    TorchCall call{&op, stack};
    ScopedTorchCall scope(call);
    // The dispatcher's fallback (no kernel for these dtypes) runs ATen's CPU
    // fallback on the original stack; otherwise the results replace it (the
    // .out routes return their outputs).
    torch::jit::Stack results;
    run_on_dispatcher(target, args, route_ == Route::kDirect ? &results : nullptr);
    if (call.fell_back) return;
    torch::jit::drop(*stack, n);
    if (route_ == Route::kDirect) {
      for (auto& r : results) stack->push_back(std::move(r));
    } else {
      for (const auto& o : outs) stack->push_back(o);
    }
    if (check) {
      const std::vector<c10::IValue> got(stack->end() - static_cast<std::ptrdiff_t>(op.schema().returns().size()), stack->end());
      check_against_cpu(op, target, std::move(cpu_args), args, got);
    }
  }

  void set_has_out(bool v) { has_out_ = v; }
  Route route() const { return route_; }

  // The registry op for this call: lock-free while the op-mapping table
  // stays as it was (an immutable resolution published by pointer; replaced
  // ones are kept until the process ends, like the registry's snapshots).
  OpHandle resolve() {
    const uint64_t v = rt().op_map().version();
    const Resolution* r = resolved_.load(std::memory_order_acquire);
    if (r != nullptr && r->map_version == v) return r->handle;
    std::lock_guard<std::mutex> lock(mu_);
    retired_.push_back(std::make_unique<Resolution>(Resolution{rt().dispatcher().op(target_name_), v}));
    resolved_.store(retired_.back().get(), std::memory_order_release);
    return retired_.back()->handle;
  }

 private:
  struct Resolution {
    OpHandle handle;
    uint64_t map_version;
  };

  const Route route_;
  const std::string target_name_;
  bool has_out_ = false;
  std::atomic<const Resolution*> resolved_{nullptr};
  std::mutex mu_;  // writers of resolved_
  std::vector<std::unique_ptr<Resolution>> retired_;
};

// Note [Unboxed entry for the common signatures]
// A boxed kernel makes PyTorch build a stack for every call: the arguments
// are copied into IValues, and copying a tensor that Python owns takes the
// GIL (PyObject preservation), twice per call. Routed ops whose schema is
// made of tensors and scalars only and returns one new tensor (add.Tensor,
// mul.Tensor, relu, mul.Scalar, ...) or writes and returns its first
// argument (add_.Tensor, addcmul_, ...) get an unboxed entry instead. It serves
// the common case by reference: npu tensors of the current device, a call
// signature the meta cache already knows, no precision check. Anything else
// (CPU scalars, another device, a first call, complex values) goes to the
// boxed bridge unchanged, so both entries behave the same. When the
// dispatcher falls back, the stack is built then (TorchCall::push_args).
template <class... Args>
class UnboxedBridge {
 public:
  UnboxedBridge(std::shared_ptr<Bridge> boxed, c10::OperatorHandle op) : boxed_(std::move(boxed)), op_(std::move(op)) {}

  at::Tensor operator()(const Args&... args) const {
    at::Tensor result;
    if (!try_run(&result, args...)) return boxed(args...);
    return result;
  }

  // Serves the call by reference; false when it is the boxed bridge's. The
  // functional routes return their tensor in `result`; the in-place route
  // writes its first argument (and takes no `result`).
  bool try_run(at::Tensor* result, const Args&... args) const {
    constexpr size_t kArgs = sizeof...(Args);
    const c10::DeviceIndex device = current_index();
    if (g_precision_on.load(std::memory_order_relaxed) || !(servable(args, device) && ...)) return false;
    const Route route = boxed_->route();
    const OpHandle target = boxed_->resolve();
    if (!target || target.op->schema().returns.size() > 4) return false;
    at::Tensor out;
    if (route == Route::kViaOut) {
      thread_local std::string key;
      key.clear();
      put(key, &op_.schema());
      (add_key(key, args), ...);
      const OutputSpecs* specs = cached_output_specs(key);
      if (specs == nullptr || specs->size() != 1) return false;
      out = empty_memory_format((*specs)[0].sizes, (*specs)[0].dtype, std::nullopt,
                                at::Device(c10::DeviceType::PrivateUse1, device), std::nullopt, std::nullopt);
    }
    std::array<DLTensor, kArgs + 1> dls{};
    std::array<NpubValue, kArgs + 1> values{};
    size_t i = 0;
    ((values[i] = box_arg(args, dls[i]), ++i), ...);
    if (route == Route::kViaOut) values[i++] = tensor_value(&(dls[kArgs] = DLView(out).dl));
    if (route == Route::kInplaceViaOut) values[i++] = tensor_value(&(dls[kArgs] = dls[0]));  // out= self
    std::array<NpubValue, 4> rets;
    rets.fill(none_value());
    TorchOutputs outs;
    TorchCall call{&op_, nullptr};
    const std::tuple<const Args&...> refs(args...);
    call.push_args = [](const void* ctx, torch::jit::Stack& stack) {
      std::apply([&](const Args&... a) { (stack.emplace_back(a), ...); }, *static_cast<const std::tuple<const Args&...>*>(ctx));
    };
    call.push_ctx = &refs;
    ScopedTorchCall scope(call);
    call_dispatcher(target, values.data(), static_cast<int32_t>(i), rets.data(),
                    static_cast<int32_t>(target.op->schema().returns.size()), &outs);
    if (route == Route::kInplaceViaOut) return true;  // written in place (by the fallback too)
    if (call.fell_back) {
      *result = call.own.back().toTensor();
    } else if (route == Route::kViaOut) {
      *result = std::move(out);
    } else {
      const at::Tensor* r = outs.find(0);
      TORCH_INTERNAL_ASSERT(r != nullptr, "npubridge: '", full_name(op_.schema().operator_name()), "' returned no tensor");
      *result = *r;
    }
    return true;
  }

  at::Tensor boxed(const Args&... args) const {
    torch::jit::Stack stack;
    stack.reserve(sizeof...(Args));
    (stack.emplace_back(args), ...);
    (*boxed_)(op_, c10::DispatchKeySet(c10::DispatchKey::PrivateUse1), &stack);
    return stack.back().toTensor();
  }

 private:
  static bool servable(const at::Tensor& t, c10::DeviceIndex device) {
    return t.defined() && t.is_privateuseone() && t.device().index() == device &&
           npub_dtype(t.scalar_type()) != DType::kUnknown;
  }
  static bool servable(const c10::Scalar& s, c10::DeviceIndex) { return !s.isComplex() && !s.isSymbolic(); }
  // The same bytes signature() writes for the boxed form of the argument.
  static void add_key(std::string& k, const at::Tensor& t) { tensor_key(k, t); }
  static void add_key(std::string& k, const c10::Scalar& s) {
    if (s.isBoolean()) bool_key(k, s.toBool());
    else if (s.isIntegral(false)) int_key(k, s.toLong());
    else double_key(k, s.toDouble());
  }
  static NpubValue box_arg(const at::Tensor& t, DLTensor& dl) { return tensor_value(&(dl = DLView(t).dl)); }
  static NpubValue box_arg(const c10::Scalar& s, DLTensor&) {
    if (s.isBoolean()) return bool_value(s.toBool());
    if (s.isIntegral(false)) return int_value(s.toLong());
    return double_value(s.toDouble());
  }
  std::shared_ptr<Bridge> boxed_;
  c10::OperatorHandle op_;
};

// The in-place form (add_.Tensor, mul_.Scalar, addcmul_, ...): self is
// written through the op's .out kernel and returned as it came.
template <class... Rest>
class UnboxedInplaceBridge {
 public:
  UnboxedInplaceBridge(std::shared_ptr<Bridge> boxed, c10::OperatorHandle op) : impl_(std::move(boxed), std::move(op)) {}
  at::Tensor& operator()(at::Tensor& self, const Rest&... rest) const {
    if (!impl_.try_run(nullptr, self, rest...)) impl_.boxed(self, rest...);
    return self;
  }

 private:
  UnboxedBridge<at::Tensor, Rest...> impl_;
};

// The kernel registered for a routed op: the unboxed entry when the schema
// has one of its shapes (Note [Unboxed entry for the common signatures]),
// else the boxed bridge.
torch::CppFunction bridge_kernel(Route route, const std::string& target, const c10::OperatorHandle& op, bool has_out = false) {
  auto bridge = std::make_shared<Bridge>(route, target);
  bridge->set_has_out(has_out);
  const c10::FunctionSchema& f = op.schema();
  std::string shape;
  const bool inplace = route == Route::kInplaceViaOut;
  // Functional: one new tensor, no aliasing. In place: self (and only self)
  // written and returned.
  bool plain = f.returns().size() == 1 && f.returns()[0].type()->kind() == c10::TypeKind::TensorType &&
               (f.returns()[0].alias_info() == nullptr) != inplace;
  for (size_t i = 0; i < f.arguments().size(); ++i) {
    const auto& a = f.arguments()[i];
    plain = plain && (a.alias_info() == nullptr || (inplace && i == 0 && a.alias_info()->isWrite()));
    const c10::TypeKind k = a.type()->kind();
    shape += k == c10::TypeKind::TensorType ? 'T' : k == c10::TypeKind::NumberType ? 'S' : '?';
  }
  using T = at::Tensor;
  using S = c10::Scalar;
  if (plain && !inplace) {
    if (shape == "T") return torch::CppFunction(UnboxedBridge<T>(bridge, op));
    if (shape == "TT") return torch::CppFunction(UnboxedBridge<T, T>(bridge, op));
    if (shape == "TS") return torch::CppFunction(UnboxedBridge<T, S>(bridge, op));
    if (shape == "TTS") return torch::CppFunction(UnboxedBridge<T, T, S>(bridge, op));
    if (shape == "TSS") return torch::CppFunction(UnboxedBridge<T, S, S>(bridge, op));
    if (shape == "TTTS") return torch::CppFunction(UnboxedBridge<T, T, T, S>(bridge, op));
  }
  if (plain && inplace) {
    if (shape == "T") return torch::CppFunction(UnboxedInplaceBridge<>(bridge, op));
    if (shape == "TT") return torch::CppFunction(UnboxedInplaceBridge<T>(bridge, op));
    if (shape == "TS") return torch::CppFunction(UnboxedInplaceBridge<S>(bridge, op));
    if (shape == "TTS") return torch::CppFunction(UnboxedInplaceBridge<T, S>(bridge, op));
    if (shape == "TSS") return torch::CppFunction(UnboxedInplaceBridge<S, S>(bridge, op));
    if (shape == "TTTS") return torch::CppFunction(UnboxedInplaceBridge<T, T, S>(bridge, op));
  }
  struct BoxedEntry final : c10::OperatorKernel {
    std::shared_ptr<Bridge> bridge;
    void operator()(const c10::OperatorHandle& op, c10::DispatchKeySet ks, torch::jit::Stack* stack) { (*bridge)(op, ks, stack); }
  };
  auto k = std::make_unique<BoxedEntry>();
  k->bridge = std::move(bridge);
  return torch::CppFunction::makeFromBoxedFunctor(std::move(k));
}

// The Meta kernel of a plugin's own op: its outputs' shapes and dtypes from
// the meta function the plugin registered (Dispatcher::infer_meta), on meta
// tensors; what fake tensors, torch.compile and torch.export trace with.
class MetaBridge final : public c10::OperatorKernel {
 public:
  explicit MetaBridge(std::string target_name) : target_name_(std::move(target_name)) {}
  void operator()(const c10::OperatorHandle& op, c10::DispatchKeySet, torch::jit::Stack* stack) {
    const size_t n = op.schema().arguments().size();
    std::vector<c10::IValue> args(stack->end() - static_cast<std::ptrdiff_t>(n), stack->end());
    Boxed b;
    b.values.reserve(args.size());
    b.views.reserve(count_tensors(args));
    for (const auto& a : args) b.values.push_back(box(a, b, current_index(), /*metadata_only=*/true));
    std::vector<OutputMeta> metas;
    try {
      metas = rt().dispatcher().infer_meta(rt().dispatcher().op(target_name_), b.values.data(),
                                           static_cast<int32_t>(b.values.size()));
    } catch (const Error& e) {
      TORCH_CHECK(false, e.what());
    }
    torch::jit::drop(*stack, n);
    for (const OutputMeta& m : metas) {
      if (m.alias >= 0) stack->push_back(args[static_cast<size_t>(m.alias)]);
      else if (m.set) stack->push_back(at::empty(m.shape, at::TensorOptions().dtype(torch_dtype(m.dtype)).device(at::kMeta)));
      else stack->push_back(c10::IValue());
    }
  }

 private:
  const std::string target_name_;
};

// The dispatcher's fallback: ATen's CPU fallback on the torch call.
void torch_fallback(const reg::OpEntry&, const NpubValue*, int32_t, NpubValue*, int32_t, OutputAllocator&) {
  TORCH_CHECK(tls_call != nullptr, "npubridge: fallback outside a torch call");
  tls_call->fell_back = true;
  if (tls_call->stack == nullptr) {
    TORCH_INTERNAL_ASSERT(tls_call->push_args != nullptr, "npubridge: an unboxed call without its arguments");
    tls_call->push_args(tls_call->push_ctx, tls_call->own);
    tls_call->stack = &tls_call->own;
  }
  at::native::cpu_fallback(*tls_call->op, tls_call->stack);
}

// Global boxed fallback for ops no plugin registers: counted per op.
std::mutex g_fallback_mu;
std::map<std::string, int64_t> g_fallback_counts;
std::atomic<bool> g_fallback_error{false};

// Counts a fallback of `op`, warns on the first, and refuses under
// NPUB_FALLBACK=error.
void note_fallback(const c10::OperatorHandle& op) {
  const std::string name = full_name(op.schema().operator_name());
  bool first = false;
  {
    std::lock_guard<std::mutex> lock(g_fallback_mu);
    first = g_fallback_counts[name]++ == 0;
  }
  TORCH_CHECK(!g_fallback_error.load(), "npubridge: operator '", name,
              "' is not supported on the NPU backend and NPUB_FALLBACK=error forbids falling back to the CPU");
  if (first)
    TORCH_WARN("npubridge: operator '", name, "' is not supported on the NPU backend and will fall back to run on the CPU");
}

// ATen's CPU fallback for the call on `stack`.
void run_on_cpu(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  // PyTorch's cpu_fallback returns outputs to the first tensor argument's
  // device; when that is a CPU scalar (1 - x is sub(1, x)), the outputs
  // belong on the npu tensor's device instead, as with any device op.
  std::optional<c10::Device> npu;
  const size_t nargs = op.schema().arguments().size();
  for (size_t i = stack->size() - nargs; i < stack->size() && !npu; ++i) {
    const c10::IValue& v = (*stack)[i];
    if (v.isTensor() && v.toTensor().defined() && v.toTensor().is_privateuseone()) npu = v.toTensor().device();
  }
  at::native::cpu_fallback(op, stack);
  if (!npu) return;
  const size_t nret = op.schema().returns().size();
  for (size_t i = stack->size() - nret; i < stack->size(); ++i) {
    c10::IValue& v = (*stack)[i];
    if (v.isTensor() && v.toTensor().defined() && v.toTensor().device().is_cpu()) v = v.toTensor().to(*npu);
  }
}

void cpu_fallback_counted(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  note_fallback(op);
  run_on_cpu(op, stack);
}

// The op's meta kernel refused the call: ATen's CPU kernel decides. A user
// error (mismatched shapes, say) then raises ATen's own message without a
// "not supported" warning; only a call the CPU serves counts as a fallback.
void cpu_decides(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  if (g_fallback_error.load()) {
    cpu_fallback_counted(op, stack);
    return;
  }
  run_on_cpu(op, stack);
  note_fallback(op);
}

TORCH_LIBRARY_IMPL(_, PrivateUse1, m) { m.fallback(torch::CppFunction::makeFromBoxedFunction<&cpu_fallback_counted>()); }

// Autocast for npu: PyTorch's usual policy. Matrix products and
// convolutions in the autocast dtype; reductions, norms, losses and
// exponentials in float32.
TORCH_LIBRARY_IMPL(_, AutocastPrivateUse1, m) { m.fallback(torch::CppFunction::makeFallthrough()); }

TORCH_LIBRARY_IMPL(aten, AutocastPrivateUse1, m) {
  KERNEL_PRIVATEUSEONE(mm, lower_precision_fp)
  KERNEL_PRIVATEUSEONE(addmm, lower_precision_fp)
  KERNEL_PRIVATEUSEONE(bmm, lower_precision_fp)
  KERNEL_PRIVATEUSEONE(baddbmm, lower_precision_fp)
  KERNEL_PRIVATEUSEONE(matmul, lower_precision_fp)
  KERNEL_PRIVATEUSEONE(linear, lower_precision_fp)
  KERNEL_PRIVATEUSEONE(conv2d, lower_precision_fp)
  KERNEL_PRIVATEUSEONE(exp, fp32)
  KERNEL_PRIVATEUSEONE(log, fp32)
  KERNEL_PRIVATEUSEONE(log1p, fp32)
  KERNEL_PRIVATEUSEONE(rsqrt, fp32)
  KERNEL_PRIVATEUSEONE(reciprocal, fp32)
  KERNEL_PRIVATEUSEONE(pow, Tensor_Scalar, fp32)
  KERNEL_PRIVATEUSEONE(layer_norm, fp32)
  KERNEL_PRIVATEUSEONE(nll_loss, fp32)
  KERNEL_PRIVATEUSEONE(mse_loss, fp32)
  KERNEL_PRIVATEUSEONE(l1_loss, fp32)
  KERNEL_PRIVATEUSEONE(binary_cross_entropy_with_logits, fp32)
  KERNEL_PRIVATEUSEONE(softmax, int, fp32_set_opt_dtype)
  KERNEL_PRIVATEUSEONE(log_softmax, int, fp32_set_opt_dtype)
  KERNEL_PRIVATEUSEONE(sum, fp32_set_opt_dtype)
  KERNEL_PRIVATEUSEONE(cumsum, fp32_set_opt_dtype)
}

// Registrations made at init, kept alive for the process.
std::vector<std::unique_ptr<torch::Library>> g_libraries;
std::vector<std::string> g_native, g_via_out, g_custom;

// "Type name" of an argument without alias annotation and default.
std::string plain(std::string s) {
  for (size_t open; (open = s.find('(')) != std::string::npos;) {
    const size_t close = s.find(')', open);
    if (close == std::string::npos) break;
    s.erase(open, close - open + 1);
  }
  if (auto eq = s.find('='); eq != std::string::npos) s.resize(eq);
  return s;
}

// Whether functional/in-place `f` takes exactly the arguments of `out`
// minus its trailing out= tensors (same names and types, in order).
bool same_args(const c10::FunctionSchema& f, const reg::Schema& out) {
  size_t n = out.arguments.size();
  while (n > 0 && out.arguments[n - 1].is_write() && out.arguments[n - 1].kwarg_only) --n;
  if (n != f.arguments().size()) return false;
  for (size_t i = 0; i < n; ++i) {
    std::ostringstream theirs;
    theirs << f.arguments()[i];
    const reg::Argument& a = out.arguments[i];
    if (plain(theirs.str()) != plain(reg::type_to_string(a.type) + " " + a.name)) return false;
  }
  return true;
}

void register_plugin_ops() {
  auto lib = std::make_unique<torch::Library>(torch::Library::IMPL, "aten", c10::DispatchKey::PrivateUse1, __FILE__, __LINE__);
  std::set<std::string> registered;
  const auto ops = rt().registry().ops();
  for (const reg::OpEntry* e : ops) {
    if (e->schema().ns != "aten" || e->kernels(NPUB_DEVICE_NPU).empty()) continue;
    const std::string unqualified = e->schema().overload.empty() ? e->schema().name : e->schema().name + "." + e->schema().overload;
    auto h = c10::Dispatcher::singleton().findSchema({"aten::" + e->schema().name, e->schema().overload});
    if (!h) continue;
    // The plugin's schema must be ATen's (names and types); otherwise the
    // boxed arguments would not line up.
    const std::string theirs = c10::toString(h->schema());
    if (theirs != e->schema().to_string()) {
      TORCH_WARN("npubridge: not routing '", e->name(), "': its schema differs from ATen's (plugin: ", e->schema().to_string(),
                 ", ATen: ", theirs, ")");
      continue;
    }
    bool has_out = false;
    for (const auto& a : h->schema().arguments()) has_out = has_out || (a.is_out() && a.type()->kind() == c10::TypeKind::TensorType);
    lib->impl(unqualified.c_str(), bridge_kernel(Route::kDirect, e->name(), *h, has_out));
    registered.insert(e->name());
    g_native.push_back(e->name());
  }
  // Functional and in-place overloads of ops whose .out variant a plugin serves.
  for (const reg::OpEntry* e : ops) {
    if (e->schema().ns != "aten" || !registered.count(e->name())) continue;
    bool is_out = false;
    for (const auto& a : e->schema().arguments) is_out = is_out || (a.is_write() && a.kwarg_only);
    if (!is_out) continue;
    for (const c10::OperatorName& name : c10::Dispatcher::singleton().getAllOpNames()) {
      if (name.name != "aten::" + e->schema().name && name.name != "aten::" + e->schema().name + "_") continue;
      const std::string full = full_name(name);
      if (registered.count(full)) continue;
      auto h = c10::Dispatcher::singleton().findSchema(name);
      if (!h) continue;
      const auto& f = h->schema();
      const bool inplace = name.name.back() == '_';
      if (f.is_mutable() != inplace) continue;
      if (!same_args(f, e->schema())) continue;
      if (!inplace && (f.returns().size() == 0 || f.returns().size() != static_cast<size_t>(std::count_if(
                                                       e->schema().arguments.begin(), e->schema().arguments.end(),
                                                       [](const reg::Argument& a) { return a.is_write() && a.kwarg_only; }))))
        continue;
      if (inplace && std::count_if(e->schema().arguments.begin(), e->schema().arguments.end(),
                                   [](const reg::Argument& a) { return a.is_write() && a.kwarg_only; }) != 1)
        continue;
      const std::string unq = full.substr(std::string("aten::").size());
      lib->impl(unq.c_str(), bridge_kernel(inplace ? Route::kInplaceViaOut : Route::kViaOut, e->name(), *h));
      registered.insert(full);
      g_via_out.push_back(full + " -> " + e->name());
    }
  }
  g_libraries.push_back(std::move(lib));

  // Plugin ops outside aten: defined under torch.ops.<namespace> from the
  // schema the plugin registered, served by the same boxed bridge.
  std::map<std::string, std::vector<const reg::OpEntry*>> by_ns;
  for (const reg::OpEntry* e : ops)
    if (e->schema().ns != "aten" && !e->kernels(NPUB_DEVICE_NPU).empty()) by_ns[e->schema().ns].push_back(e);
  for (const auto& [ns, entries] : by_ns) {
    auto def = std::make_unique<torch::Library>(torch::Library::FRAGMENT, ns, std::nullopt, __FILE__, __LINE__);
    auto impl = std::make_unique<torch::Library>(torch::Library::IMPL, ns, c10::DispatchKey::PrivateUse1, __FILE__, __LINE__);
    auto meta = std::make_unique<torch::Library>(torch::Library::IMPL, ns, c10::DispatchKey::Meta, __FILE__, __LINE__);
    for (const reg::OpEntry* e : entries) {
      if (c10::Dispatcher::singleton().findSchema({ns + "::" + e->schema().name, e->schema().overload})) continue;
      // Each op in its own error boundary: a schema npubridge accepts but
      // PyTorch refuses (a default that does not fit its type, a required
      // argument after a defaulted one) disables that op under PyTorch, with
      // a warning, and never the import of torch.
      try {
        def->def(e->schema().to_string().c_str());
      } catch (const std::exception& err) {
        const reg::Kernel* k = e->kernels(NPUB_DEVICE_NPU).front();
        const std::string why = err.what();
        TORCH_WARN("npubridge: op '", e->name(), "' of plugin '", k->plugin_name(),
                   "' is not available under PyTorch: PyTorch refuses its schema \"", e->schema().to_string(),
                   "\": ", why.substr(0, why.find('\n')));
        continue;
      }
      const std::string unq = e->schema().overload.empty() ? e->schema().name : e->schema().name + "." + e->schema().overload;
      impl->impl(unq.c_str(), torch::CppFunction::makeFromBoxedFunctor(std::make_unique<Bridge>(Route::kDirect, e->name())));
      // Shapes without running: from the plugin's meta function, or, for ops
      // that only write their arguments, from the arguments themselves.
      bool writes_only = true;
      for (size_t i = 0; i < e->schema().returns.size(); ++i) writes_only = writes_only && e->return_alias()[i] >= 0;
      if (e->meta() != nullptr || writes_only)
        meta->impl(unq.c_str(), torch::CppFunction::makeFromBoxedFunctor(std::make_unique<MetaBridge>(e->name())));
      g_custom.push_back(e->name());
    }
    g_libraries.push_back(std::move(def));
    g_libraries.push_back(std::move(impl));
    g_libraries.push_back(std::move(meta));
  }
}

std::once_flag g_init_once;

void init() {
  std::call_once(g_init_once, [] {
    static NpuHooks hooks;
    at::RegisterPrivateUse1HooksInterface(&hooks);
    c10::SetAllocator(c10::DeviceType::PrivateUse1, &g_allocator);
    rt().dispatcher().set_fallback(&torch_fallback);
    g_fallback_error = rt().dispatcher().fallback_mode() == FallbackMode::kError;
    register_plugin_ops();
  });
}

}  // namespace

}  // namespace npub::torch_backend

// ---------------------------------------------------------------------------
// Python module npubridge._C
// ---------------------------------------------------------------------------

namespace py = pybind11;
using namespace npub;

namespace {
std::mutex g_events_mu;
std::map<int64_t, sim::Event> g_events;
int64_t g_next_event = 1;
sim::Event& event_at(int64_t id) {
  std::lock_guard<std::mutex> lock(g_events_mu);
  auto it = g_events.find(id);
  if (it == g_events.end()) throw py::value_error("unknown npu event " + std::to_string(id));
  return it->second;
}
}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "npubridge: PyTorch on the simulated NPU through acceleration-library plugins";
  m.def("_init", &npub::torch_backend::init);
  m.def("device_count", [] { return Runtime::global().devices().count(); });
  m.def("current_device", [] { return Runtime::global().devices().current_device(); });
  m.def("set_device", [](int d) { Runtime::global().devices().set_current_device(d); });
  m.def("synchronize", [](int d) {
    auto& ds = Runtime::global().devices();
    if (d < 0)
      for (int i = 0; i < ds.count(); ++i) ds.at(i).synchronize();
    else
      ds.at(d).synchronize();
  });
  m.def("manual_seed", [](int d, uint64_t seed) { Runtime::global().devices().at(d).manual_seed(seed); });
  m.def("get_rng_state", [](int d) {
    const auto s = Runtime::global().devices().at(d).philox_state();
    return py::make_tuple(s.seed, s.offset);
  });
  m.def("set_rng_state", [](int d, uint64_t seed, uint64_t offset) {
    Runtime::global().devices().at(d).set_philox_state({seed, offset});
  });
  // Streams (by id within their device) and events (by id).
  m.def("stream_new", [](int d) { return Runtime::global().devices().at(d).create_stream().id(); });
  m.def("stream_synchronize", [](int d, int id) {
    py::gil_scoped_release nogil;
    Runtime::global().devices().at(d).stream(id).synchronize();
  });
  m.def("stream_query", [](int d, int id) { return Runtime::global().devices().at(d).stream(id).query(); });
  m.def("set_current_stream", [](int d, int id) {
    auto& dev = Runtime::global().devices().at(d);
    dev.set_current_stream(dev.stream(id));
  });
  m.def("current_stream", [](int d) { return Runtime::global().devices().at(d).current_stream().id(); });
  m.def("stream_wait_event", [](int d, int id, int64_t ev) { Runtime::global().devices().at(d).stream(id).wait_event(event_at(ev)); });
  m.def("event_new", [] {
    std::lock_guard<std::mutex> lock(g_events_mu);
    const int64_t id = g_next_event++;
    g_events.emplace(id, sim::Event());
    return id;
  });
  m.def("event_destroy", [](int64_t id) {
    std::lock_guard<std::mutex> lock(g_events_mu);
    g_events.erase(id);
  });
  m.def("event_record", [](int64_t ev, int d, int id) { event_at(ev).record(Runtime::global().devices().at(d).stream(id)); });
  m.def("event_query", [](int64_t ev) { return event_at(ev).query(); });
  m.def("event_synchronize", [](int64_t ev) {
    sim::Event& e = event_at(ev);
    py::gil_scoped_release nogil;
    e.synchronize();
  });
  m.def("event_elapsed_ms", [](int64_t start, int64_t end) { return event_at(start).elapsed_ms(event_at(end)); });
  m.def("memory_stats", [](int d) {
    const auto s = Runtime::global().devices().at(d).allocator().stats();
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
  m.def("empty_cache", [] {
    auto& ds = Runtime::global().devices();
    for (int i = 0; i < ds.count(); ++i) ds.at(i).allocator().empty_cache();
  });
  m.def("reset_peak_memory_stats", [](int d) { Runtime::global().devices().at(d).allocator().reset_peak_stats(); });
  m.def("plugins", [] {
    py::list out;
    for (const auto& p : Runtime::global().loader().plugins()) {
      int ops = 0;
      for (const reg::OpEntry* e : Runtime::global().registry().ops())
        for (const reg::Kernel* k : e->kernels(NPUB_DEVICE_NPU))
          if (k->plugin.get() == p.get()) {
            ++ops;
            break;
          }
      py::dict d;
      d["name"] = p->name;
      d["version"] = p->version;
      d["path"] = p->path;
      d["ops"] = ops;
      d["enabled"] = p->enabled.load();
      out.append(d);
    }
    return out;
  });
  m.def("load_failures", [] {
    py::list out;
    for (const auto& f : Runtime::global().loader().failures()) out.append(f.error);
    return out;
  });
  m.def("stats", [] {
    py::dict out;
    for (const auto& s : Runtime::global().dispatcher().stats()) {
      py::dict d;
      d["calls"] = s.calls;
      d["fallbacks"] = s.fallbacks;
      d["conversions"] = s.conversions;
      d["errors"] = s.errors;
      d["precision_mismatches"] = s.precision_mismatches;
      d["time_ms"] = s.total_ms;
      py::dict by_plugin;
      for (const auto& k : s.kernels)
        if (k.calls > 0) by_plugin[py::str(k.plugin)] = k.calls;
      d["native"] = by_plugin;
      out[py::str(s.op)] = d;
    }
    std::lock_guard<std::mutex> lock(npub::torch_backend::g_fallback_mu);
    // Calls the host computed without asking the dispatcher (no plugin
    // serves the op, or its dtype has no DLPack code): added to the op's
    // entry when the dispatcher has one too.
    for (const auto& [name, count] : npub::torch_backend::g_fallback_counts) {
      py::str key(name);
      if (out.contains(key)) {
        py::dict d = out[key];
        d["calls"] = d["calls"].cast<int64_t>() + count;
        d["fallbacks"] = d["fallbacks"].cast<int64_t>() + count;
        continue;
      }
      py::dict d;
      d["calls"] = count;
      d["fallbacks"] = count;
      d["conversions"] = 0;
      d["errors"] = 0;
      d["precision_mismatches"] = 0;
      d["time_ms"] = 0.0;
      d["native"] = py::dict();
      out[key] = d;
    }
    return out;
  });
  m.def("reset_stats", [] {
    Runtime::global().dispatcher().reset_stats();
    std::lock_guard<std::mutex> lock(npub::torch_backend::g_fallback_mu);
    npub::torch_backend::g_fallback_counts.clear();
  });
  m.def("set_optim_level", [](int level) { Runtime::global().dispatcher().set_opt_level(level); });
  m.def("optim_level", [] { return Runtime::global().dispatcher().opt_level(); });
  m.def("enable_plugin", [](const std::string& name, bool on) {
    auto p = Runtime::global().loader().plugin(name);
    if (!p) throw py::value_error("no plugin named '" + name + "' is loaded");
    p->enabled = on;
  });
  m.def("register_op", [](const std::string& framework_op, const std::string& plugin_op, const std::string& plugin) {
    if (!Runtime::global().registry().find(plugin_op)) throw py::value_error("unknown op '" + plugin_op + "'");
    Runtime::global().op_map().set({framework_op, plugin_op, plugin});
  });
  // The extension checks at the torch level (every routed call against
  // ATen's CPU kernel on copies of its inputs); the dispatcher's own check,
  // which needs a fallback that computes on given arguments, stays off and
  // only holds the tolerances and the report.
  m.def("precision_check", [](bool enabled, bool raise_on_mismatch) {
    PrecisionCheckConfig c;
    c.enabled = false;
    c.raise_on_mismatch = raise_on_mismatch;
    Runtime::global().dispatcher().set_precision_check(c);
    Runtime::global().dispatcher().clear_precision_mismatches();
    npub::torch_backend::g_precision_on = enabled;
  });
  // The error model's verdict on one result with no op entry (PyTorch-level
  // ops, as the OpInfo runner compares them): host-calibrated against the
  // float64 reference. "" when it matches, else the message with the bound.
  m.def("judge", [](const at::Tensor& got, const at::Tensor& host, const at::Tensor& wide) -> std::string {
    if (!got.sizes().equals(host.sizes()) || got.scalar_type() != host.scalar_type()) {
      std::ostringstream s;
      s << "got " << got.scalar_type() << got.sizes() << ", expected " << host.scalar_type() << host.sizes();
      return s.str();
    }
    if (host.numel() == 0) return "";
    const at::Tensor w = wide.defined() && wide.sizes().equals(host.sizes()) ? wide : at::Tensor();
    const numerics::Verdict v = numerics::judge(numerics::error_model(""), got, host, w, at::Tensor(), 0, 0);
    return v.ok() ? std::string() : v.message();
  });
  m.def("precision_mismatches", [] {
    py::list out;
    for (const auto& mm : Runtime::global().dispatcher().precision_mismatches()) {
      py::dict d;
      d["op"] = mm.op;
      d["plugin"] = mm.plugin;
      d["output"] = mm.output;
      d["mismatched"] = mm.num_mismatched;
      d["numel"] = mm.numel;
      d["worst_index"] = mm.worst_index;
      d["kernel_value"] = mm.kernel_value;
      d["reference_value"] = mm.reference_value;
      d["abs_error"] = mm.abs_error;
      d["bound"] = mm.bound;
      d["message"] = mm.message();
      out.append(d);
    }
    return out;
  });
  // Derivative formulas plugins declared (NpubHostApi.define_derivative),
  // for the package to register with torch.library.register_autograd.
  m.def("derivatives", [] {
    py::list out;
    for (const reg::OpEntry* e : Runtime::global().registry().ops()) {
      const reg::Derivative* d = e->derivative();
      if (d == nullptr || e->kernels(NPUB_DEVICE_NPU).empty()) continue;
      py::dict r;
      r["op"] = e->name();
      r["backward"] = d->backward;
      r["formula"] = d->formula;
      r["plugin"] = d->plugin;
      py::list inputs, args;
      for (int32_t i : d->inputs) inputs.append(i);
      for (const auto& a : d->args)
        args.append(py::make_tuple(a.kind == reg::Derivative::Arg::kGrad     ? "grad"
                                   : a.kind == reg::Derivative::Arg::kResult ? "result"
                                                                             : "input",
                                   a.index));
      r["inputs"] = inputs;
      r["args"] = args;
      out.append(r);
    }
    return out;
  });
  m.def("routed_ops", [] {
    py::dict d;
    d["native"] = npub::torch_backend::g_native;
    d["via_out"] = npub::torch_backend::g_via_out;
    d["custom"] = npub::torch_backend::g_custom;
    return d;
  });
  m.def("ops", [](const std::string& plugin) {
    py::list out;
    for (const reg::OpEntry* e : Runtime::global().registry().ops()) {
      for (const reg::Kernel* k : e->kernels(NPUB_DEVICE_NPU)) {
        if (!plugin.empty() && k->plugin_name() != plugin) continue;
        py::dict d;
        d["op"] = e->name();
        d["plugin"] = k->plugin_name();
        d["dtypes"] = k->dtypes_string();
        d["priority"] = k->priority;
        d["schema"] = e->schema().to_string();
        out.append(d);
      }
    }
    return out;
  });
}

// npubridge plugin SDK: a header-only C++ layer over plugin_api.h.
//
// It exists so that a kernel is a few lines of C++ while the boundary stays C:
// everything here compiles into the plugin; nothing of it crosses to the host.
//  - Typed argument access (Call::tensor, Call::int_arg, ...), with errors
//    that name the op and the argument.
//  - An exception barrier: a C++ exception thrown by a kernel or by the
//    plugin's init function becomes an NpubError at the edge, never unwinds
//    into the host.
//  - Registration helpers (Registrar::def, Registrar::kernel, and
//    Registrar::op for both at once).
//  - parallel_for over the device's compute threads with a lambda.
//  - fp16/bf16 <-> fp32 conversion.
//
// Usage:
//   static void my_scale(npub::sdk::Call& call) { ... }
//   static void init(npub::sdk::Registrar& r) {
//     r.op("myns::scale(Tensor self, float factor) -> Tensor", &my_scale)
//         .dtypes({npub::sdk::kFloat32});
//   }
//   NPUB_DEFINE_PLUGIN(my_plugin, "1.0.0", init)
#ifndef NPUBRIDGE_PLUGIN_SDK_HPP_
#define NPUBRIDGE_PLUGIN_SDK_HPP_

#include <npubridge/plugin_api.h>
#include <npubridge/half.hpp>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <initializer_list>
#include <memory>
#include <mutex>
#include <new>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace npub::sdk {

// ---------------------------------------------------------------------------
// dtypes
// ---------------------------------------------------------------------------

constexpr DLDataType kFloat32{kDLFloat, 32, 1};
constexpr DLDataType kFloat64{kDLFloat, 64, 1};
constexpr DLDataType kFloat16{kDLFloat, 16, 1};
constexpr DLDataType kBFloat16{kDLBfloat, 16, 1};
constexpr DLDataType kInt64{kDLInt, 64, 1};
constexpr DLDataType kInt32{kDLInt, 32, 1};
constexpr DLDataType kInt16{kDLInt, 16, 1};
constexpr DLDataType kInt8{kDLInt, 8, 1};
constexpr DLDataType kUInt8{kDLUInt, 8, 1};
constexpr DLDataType kBool{NPUB_DL_BOOL, 8, 1};

constexpr bool same_dtype(DLDataType a, DLDataType b) {
  return a.code == b.code && a.bits == b.bits && a.lanes == b.lanes;
}

inline std::string dtype_name(DLDataType t) {
  if (same_dtype(t, kFloat32)) return "float32";
  if (same_dtype(t, kFloat64)) return "float64";
  if (same_dtype(t, kFloat16)) return "float16";
  if (same_dtype(t, kBFloat16)) return "bfloat16";
  if (same_dtype(t, kInt64)) return "int64";
  if (same_dtype(t, kInt32)) return "int32";
  if (same_dtype(t, kInt16)) return "int16";
  if (same_dtype(t, kInt8)) return "int8";
  if (same_dtype(t, kUInt8)) return "uint8";
  if (same_dtype(t, kBool)) return "bool";
  return "dtype(code=" + std::to_string(t.code) + ",bits=" + std::to_string(t.bits) +
         ",lanes=" + std::to_string(t.lanes) + ")";
}

using ::npub::half::bf16_to_float;
using ::npub::half::float_to_bf16;
using ::npub::half::float_to_half;
using ::npub::half::half_to_float;

// ---------------------------------------------------------------------------
// errors
// ---------------------------------------------------------------------------

// Thrown inside a plugin; turned into an NpubError at the boundary.
class Error : public std::runtime_error {
 public:
  Error(int32_t code, const std::string& message) : std::runtime_error(message), code_(code) {}
  int32_t code() const noexcept { return code_; }

 private:
  int32_t code_;
};

// Holds an NpubError received from the host so it can travel as an exception.
class HostError : public std::exception {
 public:
  explicit HostError(NpubError* e) : error_(e) {}
  HostError(HostError&& o) noexcept : error_(std::exchange(o.error_, nullptr)) {}
  HostError(const HostError&) = delete;
  ~HostError() override;
  NpubError* release() noexcept { return std::exchange(error_, nullptr); }
  const char* what() const noexcept override;

 private:
  NpubError* error_;
};

namespace detail {
// The host table this plugin was initialised with. Set once, before any
// kernel can run (see NPUB_DEFINE_PLUGIN); read-only afterwards.
inline const NpubHostApi*& host_slot() {
  static const NpubHostApi* host = nullptr;
  return host;
}
}  // namespace detail

inline const NpubHostApi& host() { return *detail::host_slot(); }

inline HostError::~HostError() {
  if (error_ != nullptr) host().error_destroy(error_);
}
inline const char* HostError::what() const noexcept {
  return error_ != nullptr ? host().error_message(error_) : "npubridge host error";
}

// Throws if a host call returned an error.
inline void check(NpubError* e) {
  if (e != nullptr) throw HostError(e);
}

// Runs f, converting any exception into an NpubError (the exception barrier).
template <typename F>
NpubError* guard(const char* where, F&& f) noexcept {
  try {
    f();
    return nullptr;
  } catch (HostError& e) {
    return e.release();
  } catch (const Error& e) {
    return host().error_create(e.code(), e.what());
  } catch (const std::bad_alloc&) {
    return host().error_create(NPUB_ERR_OUT_OF_MEMORY,
                               (std::string(where) + ": host memory exhausted").c_str());
  } catch (const std::exception& e) {
    return host().error_create(NPUB_ERR_INTERNAL, (std::string(where) + ": " + e.what()).c_str());
  } catch (...) {
    return host().error_create(NPUB_ERR_INTERNAL, (std::string(where) + ": unknown exception").c_str());
  }
}

// ---------------------------------------------------------------------------
// tensors
// ---------------------------------------------------------------------------

namespace detail {
// Note [One body for kernel and meta function]
// Thrown in a meta call by whatever needs data the meta call does not have
// (a tensor's data, parallel_for, scratch memory): it ends the body there,
// and the meta function's C entry (meta_thunk) counts that as done. So a
// kernel body that declares its outputs with Call::output before it touches
// data serves as its op's meta function as it is, and one that does not
// cannot crash: the host reports the returns it left undeclared.
struct MetaStop {};
}  // namespace detail

// A non-owning view of a DLTensor with the helpers kernels need.
class TensorRef {
 public:
  TensorRef() = default;
  explicit TensorRef(DLTensor* t, bool in_meta_call = false) : t_(t), meta_(in_meta_call) {}

  DLTensor* raw() const { return t_; }
  bool defined() const { return t_ != nullptr; }
  int32_t dim() const { return get()->ndim; }
  int64_t size(int32_t d) const { return get()->shape[wrap(d)]; }
  int64_t stride(int32_t d) const {
    int32_t i = wrap(d);
    if (t_->strides != nullptr) return t_->strides[i];
    int64_t s = 1;
    for (int32_t k = t_->ndim - 1; k > i; --k) s *= t_->shape[k];
    return s;
  }
  std::vector<int64_t> sizes() const { return {get()->shape, t_->shape + t_->ndim}; }
  std::vector<int64_t> strides() const {
    std::vector<int64_t> s(static_cast<size_t>(get()->ndim));
    for (int32_t i = 0; i < t_->ndim; ++i) s[static_cast<size_t>(i)] = stride(i);
    return s;
  }
  int64_t numel() const {
    int64_t n = 1;
    for (int32_t i = 0; i < get()->ndim; ++i) n *= t_->shape[i];
    return n;
  }
  DLDataType dtype() const { return get()->dtype; }
  bool is(DLDataType d) const { return same_dtype(get()->dtype, d); }
  bool is_contiguous() const {
    if (get()->strides == nullptr) return true;
    int64_t expected = 1;
    for (int32_t i = t_->ndim - 1; i >= 0; --i) {
      if (t_->shape[i] != 1 && t_->strides[i] != expected) return false;
      expected *= t_->shape[i];
    }
    return true;
  }
  // The first element. In a meta call there is no data: this ends the
  // body (Note [One body for kernel and meta function]).
  template <typename T>
  T* data() const {
    if (meta_) throw detail::MetaStop{};
    return reinterpret_cast<T*>(static_cast<char*>(get()->data) + t_->byte_offset);
  }
  int32_t wrap(int32_t d) const {
    int32_t n = get()->ndim;
    int32_t w = d < 0 ? d + n : d;
    if (w < 0 || w >= n)
      throw Error(NPUB_ERR_INVALID_ARGUMENT, "dimension " + std::to_string(d) + " out of range for a " +
                                                 std::to_string(n) + "-d tensor");
    return w;
  }

 private:
  // The tensor, or a clear error instead of a NULL dereference: an undefined
  // TensorRef is a None Tensor? argument, or what output() returns in a
  // meta call (which ends the body there).
  const DLTensor* get() const {
    if (t_ != nullptr) return t_;
    if (meta_) throw detail::MetaStop{};
    throw Error(NPUB_ERR_INTERNAL,
                "used an undefined tensor (a None Tensor? argument: check TensorRef::defined() first)");
  }
  DLTensor* t_ = nullptr;
  bool meta_ = false;  // from a meta call: data() ends the body
};

// ---------------------------------------------------------------------------
// a kernel call
// ---------------------------------------------------------------------------

class Call {
 public:
  Call(const char* op, NpubCallContext* ctx, const NpubValue* args, int32_t num_args, NpubValue* rets,
       int32_t num_rets)
      : op_(op), ctx_(ctx), args_(args), num_args_(num_args), rets_(rets), num_rets_(num_rets) {}
  // A meta-function call (ABI 1.2): tensors carry metadata only, and
  // output() declares a return's shape and dtype instead of allocating it.
  // A body that declares its outputs before it touches data serves as its
  // op's meta function as it is: the first data access ends it (Note [One
  // body for kernel and meta function]). `if (call.is_meta()) return;`
  // after the output() calls says the same explicitly.
  Call(const char* op, NpubMetaContext* meta, const NpubValue* args, int32_t num_args)
      : op_(op), ctx_(nullptr), meta_(meta), args_(args), num_args_(num_args), rets_(nullptr), num_rets_(0) {}
  bool is_meta() const { return meta_ != nullptr; }

  const char* op() const { return op_; }
  // The kernel call's context (NULL in a meta call: see head()).
  NpubCallContext* context() const { return ctx_; }
  // The context's public head, in a kernel and in a meta call alike: host
  // table, user data, op name (ABI 1.4; fails cleanly on an older host).
  const NpubContextHead& head() const {
    if (host().abi_minor < 4)
      fail(NPUB_ERR_UNSUPPORTED, "the host implements plugin ABI 1." + std::to_string(host().abi_minor) +
                                     "; the context head needs 1.4");
    return is_meta() ? *NPUB_CONTEXT_HEAD(meta_) : *NPUB_CONTEXT_HEAD(ctx_);
  }
  int32_t num_args() const { return num_args_; }
  int32_t num_rets() const { return num_rets_; }
  const NpubValue& arg(int32_t i) const {
    if (i < 0 || i >= num_args_)
      fail(NPUB_ERR_INVALID_ARGUMENT, "argument index " + std::to_string(i) + " out of range (" +
                                          std::to_string(num_args_) + " arguments)");
    return args_[i];
  }

  TensorRef tensor(int32_t i) const {
    const NpubValue& v = expect(i, NPUB_VALUE_TENSOR, "Tensor");
    return TensorRef(v.u.tensor, is_meta());
  }
  // Tensor? argument: an undefined TensorRef when None.
  TensorRef optional_tensor(int32_t i) const {
    const NpubValue& v = arg(i);
    if (v.tag == NPUB_VALUE_NONE) return TensorRef();
    return tensor(i);
  }
  int64_t int_arg(int32_t i) const { return expect(i, NPUB_VALUE_INT, "int").u.i; }
  bool bool_arg(int32_t i) const { return expect(i, NPUB_VALUE_BOOL, "bool").u.i != 0; }
  double double_arg(int32_t i) const {
    const NpubValue& v = arg(i);
    if (v.tag == NPUB_VALUE_INT) return static_cast<double>(v.u.i);
    return expect(i, NPUB_VALUE_DOUBLE, "float").u.d;
  }
  // Scalar argument (int, float or bool) as double.
  double scalar_arg(int32_t i) const {
    const NpubValue& v = arg(i);
    if (v.tag == NPUB_VALUE_INT || v.tag == NPUB_VALUE_BOOL) return static_cast<double>(v.u.i);
    return expect(i, NPUB_VALUE_DOUBLE, "Scalar").u.d;
  }
  bool is_none(int32_t i) const { return arg(i).tag == NPUB_VALUE_NONE; }
  std::string string_arg(int32_t i) const {
    const NpubValue& v = expect(i, NPUB_VALUE_STRING, "str");
    return std::string(v.u.s, static_cast<size_t>(v.count));
  }
  std::vector<int64_t> int_list(int32_t i) const {
    const NpubValue& v = expect(i, NPUB_VALUE_INT_LIST, "int[]");
    return {v.u.ints, v.u.ints + v.count};
  }
  std::vector<TensorRef> tensor_list(int32_t i) const {
    const NpubValue& v = expect(i, NPUB_VALUE_TENSOR_LIST, "Tensor[]");
    std::vector<TensorRef> out;
    out.reserve(static_cast<size_t>(v.count));
    for (int32_t k = 0; k < v.count; ++k) out.emplace_back(v.u.tensors[k], is_meta());
    return out;
  }

  // Return i: the preallocated tensor if the caller gave one (its shape and
  // dtype are checked), otherwise a new one allocated by the host.
  TensorRef output(int32_t i, const std::vector<int64_t>& shape, DLDataType dtype) {
    if (meta_ != nullptr) {
      check(host().set_output_meta(meta_, i, static_cast<int32_t>(shape.size()), shape.data(), dtype));
      // Metadata only: its shape and dtype can be read; its data() ends the
      // body (Note [One body for kernel and meta function]).
      meta_outputs_.push_back(std::make_unique<MetaOutput>());
      MetaOutput& m = *meta_outputs_.back();
      m.shape = shape;
      m.strides.assign(shape.size(), 1);
      for (size_t d = shape.size(); d-- > 1;) m.strides[d - 1] = m.strides[d] * shape[d];
      m.dl.ndim = static_cast<int32_t>(shape.size());
      m.dl.shape = m.shape.data();
      m.dl.strides = m.strides.data();
      m.dl.dtype = dtype;
      return TensorRef(&m.dl, true);
    }
    if (i < 0 || i >= num_rets_)
      fail(NPUB_ERR_INTERNAL, "return index " + std::to_string(i) + " out of range");
    NpubValue& r = rets_[i];
    if (r.tag == NPUB_VALUE_TENSOR) {
      TensorRef t(r.u.tensor);
      if (!t.is(dtype))
        fail(NPUB_ERR_INVALID_ARGUMENT, "output " + std::to_string(i) + ": expected dtype " +
                                            dtype_name(dtype) + " but found " + dtype_name(t.dtype()));
      if (t.sizes() != shape)
        fail(NPUB_ERR_INVALID_ARGUMENT, "output " + std::to_string(i) + ": expected shape " +
                                            shape_str(shape) + " but found " + shape_str(t.sizes()));
      return t;
    }
    DLTensor* out = nullptr;
    check(host().alloc_output(ctx_, i, static_cast<int32_t>(shape.size()), shape.data(), dtype, &out));
    return TensorRef(out);
  }
  void set_int_return(int32_t i, int64_t v) {
    if (is_meta()) return;  // a meta function declares tensor returns only
    set_ret(i, NPUB_VALUE_INT).u.i = v;
  }
  void set_double_return(int32_t i, double v) {
    if (is_meta()) return;
    set_ret(i, NPUB_VALUE_DOUBLE).u.d = v;
  }

  // Reserves `count` Philox counters of the device generator (ABI 1.1):
  // returns {seed, first counter}. Fails cleanly on a 1.0 host.
  std::pair<uint64_t, uint64_t> philox(uint64_t count) const {
    const NpubHostApi& h = host();
    if (h.struct_size < offsetof(NpubHostApi, philox_reserve) + sizeof(h.philox_reserve) ||
        h.philox_reserve == nullptr)
      fail(NPUB_ERR_UNSUPPORTED, "the host provides no random number generator (it implements plugin ABI 1." +
                                     std::to_string(h.abi_minor) + "; philox_reserve needs 1.1)");
    no_data_in_meta();
    uint64_t seed = 0, offset = 0;
    h.philox_reserve(ctx_, count, &seed, &offset);
    return {seed, offset};
  }

  // The pointer given to KernelBuilder::user_data (null if none; in a meta
  // call, the meta function's user data on a host of ABI 1.4 or later).
  void* kernel_user_data() const {
    if (is_meta()) return host().abi_minor >= 4 ? NPUB_CONTEXT_HEAD(meta_)->user_data : nullptr;
    return host().kernel_user_data(ctx_);
  }
  int32_t device_index() const {
    no_data_in_meta();
    return host().device_index(ctx_);
  }
  int32_t num_threads() const {
    no_data_in_meta();
    return host().num_threads(ctx_);
  }
  void* workspace(uint64_t* bytes) const {
    no_data_in_meta();
    return host().workspace(ctx_, bytes);
  }
  void* scratch(uint64_t bytes) const {
    no_data_in_meta();
    void* p = nullptr;
    check(host().alloc_scratch(ctx_, bytes, &p));
    return p;
  }

  // Runs f(begin, end) over [begin, end) on the device's compute threads.
  template <typename F>
  void parallel_for(int64_t begin, int64_t end, int64_t grain, F&& f) const {
    no_data_in_meta();
    struct Box {
      F* f;
      std::exception_ptr error;
    } box{&f, nullptr};
    host().parallel_for(
        ctx_, begin, end, grain,
        [](void* user, int64_t b, int64_t e) {
          auto* bx = static_cast<Box*>(user);
          try {
            (*bx->f)(b, e);
          } catch (...) {
            if (!bx->error) bx->error = std::current_exception();
          }
        },
        &box);
    if (box.error) std::rethrow_exception(box.error);
  }

  [[noreturn]] void fail(int32_t code, const std::string& what) const {
    throw Error(code, *op_ != '\0' ? std::string(op_) + ": " + what : what);
  }
  static std::string shape_str(const std::vector<int64_t>& s) {
    std::string out = "[";
    for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
    return out + "]";
  }

 private:
  // Note [One body for kernel and meta function]: a meta call ends here.
  void no_data_in_meta() const {
    if (is_meta()) throw detail::MetaStop{};
  }
  const NpubValue& expect(int32_t i, int32_t tag, const char* type) const {
    const NpubValue& v = arg(i);
    if (v.tag != tag)
      fail(NPUB_ERR_INVALID_ARGUMENT, "argument " + std::to_string(i) + ": expected " + type +
                                          " but found value tag " + std::to_string(v.tag));
    return v;
  }
  NpubValue& set_ret(int32_t i, int32_t tag) {
    if (i < 0 || i >= num_rets_)
      fail(NPUB_ERR_INTERNAL, "return index " + std::to_string(i) + " out of range");
    rets_[i].tag = tag;
    rets_[i].count = 0;
    return rets_[i];
  }

  // The outputs a meta call declared, as metadata-only tensors.
  struct MetaOutput {
    DLTensor dl{};
    std::vector<int64_t> shape, strides;
  };
  const char* op_;
  NpubCallContext* ctx_;
  NpubMetaContext* meta_ = nullptr;
  std::vector<std::unique_ptr<MetaOutput>> meta_outputs_;
  const NpubValue* args_;
  int32_t num_args_;
  NpubValue* rets_;
  int32_t num_rets_;
};

using KernelBody = void (*)(Call&);

namespace detail {
// Note [One C entry per SDK kernel]
// The C ABI hands a kernel only its call context, and the context's user_data
// is the plugin's own (KernelBuilder::user_data). So the SDK gives each (op,
// body) pair a plugin registers a C function of its own,
// kernel_entry_thunk<Slot>, which finds op name and C++ body in slot Slot of
// a table filled at registration: errors name the op, and a call costs no
// host round trip to find it. Registering the same pair again (a second
// runtime initialising the same library) reuses its slot. The table holds
// NPUB_SDK_MAX_KERNELS pairs; a plugin that needs more defines it larger, the
// same in all its files. The C functions are instantiated where a Registrar
// is constructed (the file with NPUB_DEFINE_PLUGIN), not in every file that
// registers kernels.
#ifndef NPUB_SDK_MAX_KERNELS
#define NPUB_SDK_MAX_KERNELS 1024
#endif
struct KernelEntry {
  std::string op;
  KernelBody body = nullptr;
};
struct KernelTable {
  std::mutex mutex;  // taken by registration only; a slot is written once, before its entry is registered
  const NpubKernelFn* thunks = nullptr;     // kernel_entry_thunk<0..NPUB_SDK_MAX_KERNELS-1>
  const NpubMetaFn* meta_thunks = nullptr;  // kernel_meta_thunk<0..NPUB_SDK_MAX_KERNELS-1>
  size_t used = 0;
  KernelEntry entries[NPUB_SDK_MAX_KERNELS];
};
inline KernelTable& kernel_table() {
  static KernelTable table;
  return table;
}

// Out of line so that each kernel_entry_thunk<Slot> stays a jump.
[[gnu::noinline]] inline NpubError* run_kernel_entry(size_t slot, NpubCallContext* ctx, const NpubValue* args,
                                                     int32_t num_args, NpubValue* rets, int32_t num_rets) {
  const KernelEntry& k = kernel_table().entries[slot];
  return guard(k.op.c_str(), [&] {
    Call call(k.op.c_str(), ctx, args, num_args, rets, num_rets);
    k.body(call);
  });
}
template <size_t Slot>
NpubError* kernel_entry_thunk(NpubCallContext* ctx, const NpubValue* args, int32_t num_args, NpubValue* rets,
                              int32_t num_rets) {
  return run_kernel_entry(Slot, ctx, args, num_args, rets, num_rets);
}
// The same body as the kernel's own meta function (NpubKernelDesc.meta,
// ABI 1.6; Note [One body for kernel and meta function]): what this kernel
// returns, which a graph compiler sizes its buffers from.
[[gnu::noinline]] inline NpubError* run_kernel_meta(size_t slot, NpubMetaContext* ctx, const NpubValue* args,
                                                    int32_t num_args) {
  const KernelEntry& k = kernel_table().entries[slot];
  return guard(k.op.c_str(), [&] {
    Call call(k.op.c_str(), ctx, args, num_args);
    try {
      k.body(call);
    } catch (const MetaStop&) {
      // The body reached data: the returns it declared so far are the answer.
    }
  });
}
template <size_t Slot>
NpubError* kernel_meta_thunk(NpubMetaContext* ctx, const NpubValue* args, int32_t num_args) {
  return run_kernel_meta(Slot, ctx, args, num_args);
}
template <size_t... Slots>
void install_kernel_entry_thunks(std::index_sequence<Slots...>) {
  static const NpubKernelFn thunks[] = {&kernel_entry_thunk<Slots>...};
  static const NpubMetaFn meta_thunks[] = {&kernel_meta_thunk<Slots>...};
  KernelTable& t = kernel_table();
  std::lock_guard<std::mutex> lock(t.mutex);
  t.thunks = thunks;
  t.meta_thunks = meta_thunks;
}
// The slot of (op, body), taken the first time.
inline size_t kernel_slot(const std::string& op, KernelBody body) {
  KernelTable& t = kernel_table();
  std::lock_guard<std::mutex> lock(t.mutex);
  size_t slot = 0;
  while (slot < t.used && !(t.entries[slot].body == body && t.entries[slot].op == op)) ++slot;
  if (slot == t.used) {
    if (t.used == NPUB_SDK_MAX_KERNELS)
      throw Error(NPUB_ERR_INTERNAL, op + ": the plugin SDK holds " + std::to_string(NPUB_SDK_MAX_KERNELS) +
                                         " kernels (distinct op and body pairs) at most; define "
                                         "NPUB_SDK_MAX_KERNELS larger for the whole plugin");
    t.entries[slot].op = op;
    t.entries[slot].body = body;
    ++t.used;
  }
  return slot;
}
// The C entries of (op, body): the kernel and its meta function.
inline NpubKernelFn kernel_entry(const std::string& op, KernelBody body) {
  return kernel_table().thunks[kernel_slot(op, body)];
}
inline NpubMetaFn kernel_meta_entry(const std::string& op, KernelBody body) {
  return kernel_table().meta_thunks[kernel_slot(op, body)];
}

// A meta function's C entry for the C++ body `Body` (the C signature has no
// user data, so the body is a template argument). The host names the op in
// every error, so the body's messages need not.
template <KernelBody Body>
NpubError* meta_thunk(NpubMetaContext* ctx, const NpubValue* args, int32_t num_args) {
  return guard("meta function", [&] {
    Call call("", ctx, args, num_args);
    try {
      Body(call);
    } catch (const MetaStop&) {
      // Note [One body for kernel and meta function]: the body reached data.
    }
  });
}
}  // namespace detail

// ---------------------------------------------------------------------------
// registration
// ---------------------------------------------------------------------------

class Registrar;

// Builder for one kernel; registers itself when it goes out of scope (or on
// an explicit commit()).
class KernelBuilder {
 public:
  KernelBuilder(Registrar* r, std::string op, KernelBody body) : r_(r), op_(std::move(op)), body_(body) {}
  KernelBuilder(const KernelBuilder&) = delete;
  KernelBuilder& operator=(const KernelBuilder&) = delete;
  ~KernelBuilder() noexcept(false) {
    if (!committed_ && std::uncaught_exceptions() == 0) commit();
  }
  KernelBuilder& dtypes(std::initializer_list<DLDataType> d) {
    dtypes_.assign(d.begin(), d.end());
    return *this;
  }
  KernelBuilder& dtypes(const std::vector<DLDataType>& d) {
    dtypes_ = d;
    return *this;
  }
  KernelBuilder& priority(int32_t p) {
    priority_ = p;
    return *this;
  }
  KernelBuilder& device(int32_t device_type) {
    device_type_ = device_type;
    return *this;
  }
  KernelBuilder& contiguous_only() {
    flags_ |= NPUB_KERNEL_CONTIGUOUS_ONLY;
    return *this;
  }
  // The body is correct when an output is the very same view as an input
  // (elementwise bodies are): x.add_(x) and add(x, y, out=x) then run on it
  // instead of the host's fallback (ABI 1.3; older hosts ignore it).
  KernelBuilder& alias_safe() {
    flags_ |= NPUB_KERNEL_ALIAS_SAFE;
    return *this;
  }
  // Per-argument dtypes (ABI 1.4; Note [Per-argument dtypes] in the host).
  // Without any of these, every tensor argument must have the dispatch
  // dtype (the first tensor argument's, one of dtypes()).
  //   .arg_dtypes("index", {kInt64, kInt32})  argument `index` is one of these
  //   .any_dtype("out")                      argument `out` may be anything: the body checks it
  //   .mixed_dtypes()                        every argument may be anything: the body promotes
  //                                          or checks dtypes itself
  // "*" names every argument not named otherwise. Older hosts ignore them.
  KernelBuilder& arg_dtypes(const char* arg, std::initializer_list<DLDataType> d) {
    arg_rules_.push_back({arg, NPUB_ARG_DTYPE_LISTED, std::vector<DLDataType>(d.begin(), d.end())});
    return *this;
  }
  KernelBuilder& arg_dtypes(const char* arg, const std::vector<DLDataType>& d) {
    arg_rules_.push_back({arg, NPUB_ARG_DTYPE_LISTED, d});
    return *this;
  }
  KernelBuilder& any_dtype(const char* arg) {
    arg_rules_.push_back({arg, NPUB_ARG_DTYPE_ANY, {}});
    return *this;
  }
  KernelBuilder& mixed_dtypes() {
    flags_ |= NPUB_KERNEL_MIXED_DTYPES;
    return *this;
  }
  KernelBuilder& supports(NpubSupportsFn f) {
    supports_ = f;
    return *this;
  }
  KernelBuilder& workspace(NpubWorkspaceSizeFn f) {
    workspace_ = f;
    return *this;
  }
  KernelBuilder& opt_level(int32_t level) {
    opt_level_ = level;
    return *this;
  }
  // Passed as is to supports/workspace_size, and returned by
  // Call::kernel_user_data() in the kernel body. The host calls `deleter`
  // (if non-null) when it drops the kernel; if the registration fails, the
  // data stays the plugin's (NpubKernelDesc.user_data).
  KernelBuilder& user_data(void* data, void (*deleter)(void*)) {
    user_data_ = data;
    user_deleter_ = deleter;
    return *this;
  }
  void commit();

 private:
  Registrar* r_;
  std::string op_;
  KernelBody body_;
  std::vector<DLDataType> dtypes_;
  int32_t priority_ = 0;
  int32_t device_type_ = NPUB_DEVICE_NPU;
  uint32_t flags_ = 0;
  NpubSupportsFn supports_ = nullptr;
  NpubWorkspaceSizeFn workspace_ = nullptr;
  int32_t opt_level_ = 1;
  void* user_data_ = nullptr;
  void (*user_deleter_)(void*) = nullptr;
  struct ArgRule {
    std::string arg;
    int32_t rule;
    std::vector<DLDataType> dtypes;
  };
  std::vector<ArgRule> arg_rules_;
  bool committed_ = false;
};

class Registrar {
 public:
  Registrar(const NpubHostApi* host, NpubRegistrar* reg) : host_(host), reg_(reg) {
    // Note [One C entry per SDK kernel]: instantiated here, in one file.
    detail::install_kernel_entry_thunks(std::make_index_sequence<NPUB_SDK_MAX_KERNELS>{});
  }
  void def(const char* schema) { check(host_->define_op(reg_, schema)); }
  // The meta function of `op` (ABI 1.2): a body that declares the returns'
  // shapes and dtypes with Call::output on metadata-only arguments.
  template <KernelBody Body>
  void meta(const char* op) {
    require_1_2("register_meta", host_->struct_size >= offsetof(NpubHostApi, register_meta) + sizeof(void*));
    check(host_->register_meta(reg_, op, &detail::meta_thunk<Body>));
  }
  // The same, with user data the body reads as Call::kernel_user_data() in
  // the meta call (ABI 1.4: register_meta_with_data). The plugin keeps it
  // alive until it is unloaded.
  template <KernelBody Body>
  void meta(const char* op, void* user_data) {
    if (host_->struct_size < NPUB_HOST_API_STRUCT_SIZE_1_4 || host_->register_meta_with_data == nullptr)
      throw Error(NPUB_ERR_ABI,
                  "register_meta_with_data needs a host with plugin ABI 1.4; this one implements 1." +
                      std::to_string(host_->abi_minor));
    check(host_->register_meta_with_data(reg_, op, &detail::meta_thunk<Body>, user_data));
  }
  // How autograd differentiates `op` through a backward op (ABI 1.2); see
  // NpubHostApi.define_derivative for the formula.
  void derivative(const char* op, const char* formula) {
    require_1_2("define_derivative",
                host_->struct_size >= offsetof(NpubHostApi, define_derivative) + sizeof(void*));
    check(host_->define_derivative(reg_, op, formula));
  }
  // Contributes fusion patterns for a graph compiler (ABI 1.5); see
  // NpubHostApi.register_fusion_pattern and docs/graph-mode.md. Call it
  // after defining the ops its replacements use.
  void fusion_pattern(const char* text) {
    if (host_->struct_size < NPUB_HOST_API_STRUCT_SIZE_1_5 || host_->register_fusion_pattern == nullptr)
      throw Error(NPUB_ERR_ABI,
                  "register_fusion_pattern needs a host with plugin ABI 1.5; this one implements 1." +
                      std::to_string(host_->abi_minor));
    check(host_->register_fusion_pattern(reg_, text));
  }
  // Whether the host takes fusion patterns (ABI 1.5): a plugin that also
  // loads into older hosts skips its patterns there.
  bool has_fusion_patterns() const {
    return host_->struct_size >= NPUB_HOST_API_STRUCT_SIZE_1_5 && host_->register_fusion_pattern != nullptr;
  }
  KernelBuilder kernel(std::string op, KernelBody body) { return {this, std::move(op), body}; }
  // def(schema) and kernel(op, body) in one, the op being the schema's name
  // (the text before its '('):
  //   r.op("ns::f(Tensor x) -> Tensor", &f).dtypes({kFloat32});
  KernelBuilder op(const char* schema, KernelBody body) {
    def(schema);
    return kernel(op_name_of(schema), body);
  }
  const NpubHostApi* host_api() const { return host_; }
  NpubRegistrar* raw() const { return reg_; }

 private:
  // "ns::name.overload" of a schema "ns::name.overload(...) -> ...".
  static std::string op_name_of(const char* schema) {
    const char* end = std::strchr(schema, '(');
    if (end == nullptr) end = schema + std::strlen(schema);
    while (end > schema && end[-1] == ' ') --end;
    while (schema < end && *schema == ' ') ++schema;
    return std::string(schema, end);
  }
  void require_1_2(const char* what, bool ok) const {
    if (!ok)
      throw Error(NPUB_ERR_ABI, std::string(what) +
                                    " needs a host with plugin ABI 1.2; this one implements 1." +
                                    std::to_string(host_->abi_minor));
  }
  const NpubHostApi* host_;
  NpubRegistrar* reg_;
};

// The C entry comes from Note [One C entry per SDK kernel]; user_data and
// its deleter go to the host as the plugin gave them.
inline void KernelBuilder::commit() {
  committed_ = true;
  NpubKernelDesc desc;
  std::memset(&desc, 0, sizeof desc);
  desc.struct_size = NPUB_KERNEL_DESC_STRUCT_SIZE;  // not sizeof: see NPUB_STRUCT_SIZE
  desc.op_name = op_.c_str();
  desc.device_type = device_type_;
  desc.priority = priority_;
  desc.dtypes = dtypes_.data();
  desc.num_dtypes = static_cast<int32_t>(dtypes_.size());
  desc.flags = flags_;
  desc.fn = detail::kernel_entry(op_, body_);
  desc.meta = detail::kernel_meta_entry(op_, body_);  // a host before ABI 1.6 reads no further than it knows
  desc.supports = supports_;
  desc.workspace_size = workspace_;
  desc.user_data = user_data_;
  desc.user_data_deleter = user_deleter_;
  desc.min_opt_level = opt_level_;
  // A host before ABI 1.4 would read none of the rules and hand the body
  // dtypes it did not declare: refused here rather than risked there.
  const NpubHostApi* h = r_->host_api();
  if (h->abi_minor < 4)
    for (const ArgRule& a : arg_rules_)
      if (a.rule != NPUB_ARG_DTYPE_ANY)
        throw Error(NPUB_ERR_ABI,
                    op_ + ": the dtype rule for argument '" + a.arg +
                        "' needs a host with plugin ABI 1.4, which checks it; this one implements 1." +
                        std::to_string(h->abi_minor) + " and would not");
  std::vector<NpubArgDtypes> rules;
  for (const ArgRule& a : arg_rules_)
    rules.push_back({a.arg.c_str(), a.rule, static_cast<int32_t>(a.dtypes.size()), a.dtypes.data()});
  desc.arg_dtypes = rules.data();
  desc.num_arg_dtypes = static_cast<int32_t>(rules.size());
  check(r_->host_api()->register_kernel(r_->raw(), &desc));
}

}  // namespace npub::sdk

// Defines the plugin's entry point. `init` is `void init(npub::sdk::Registrar&)`;
// exceptions it throws become the plugin's initialisation error.
#define NPUB_DEFINE_PLUGIN(plugin_name, plugin_version, init)                                      \
  static NpubError* npub_sdk_initialize_(const NpubHostApi* host, NpubRegistrar* reg) {            \
    ::npub::sdk::detail::host_slot() = host;                                                       \
    return ::npub::sdk::guard(#plugin_name " initialize", [&] {                                    \
      ::npub::sdk::Registrar r(host, reg);                                                         \
      init(r);                                                                                     \
    });                                                                                            \
  }                                                                                                \
  extern "C" NPUB_PLUGIN_EXPORT const NpubPluginApi* npub_plugin_init_v1(void) {                   \
    static const NpubPluginApi api = {                                                             \
        NPUB_PLUGIN_API_STRUCT_SIZE, NPUB_ABI_MAJOR, NPUB_ABI_MINOR, #plugin_name, plugin_version, \
        &npub_sdk_initialize_,       nullptr};                                                     \
    return &api;                                                                                   \
  }

#endif  // NPUBRIDGE_PLUGIN_SDK_HPP_

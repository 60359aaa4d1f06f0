// Output shapes and dtypes of ATen ops by call signature (meta_cache.cpp):
// the bridges allocate a functional op's outputs, and resize out= tensors,
// from the op's meta kernel, asked once per signature and thread.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/ivalue.h>
#include <c10/core/ScalarType.h>

#include <npubridge/dispatcher/dispatcher.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace npub::torch_backend {

// Output shapes and dtypes by call signature (op, argument metadata and
// scalar values): ATen's meta kernels are exact but slow (many are written in
// Python); a repeated call shape reuses their answer.
struct OutputSpec {
  std::vector<int64_t> sizes;
  at::ScalarType dtype;
  // ATen's layout of the result (channels_last for a channels_last input,
  // say); empty when it is contiguous.
  std::vector<int64_t> strides;
};

// An npu tensor laid out as `spec` on npu:`device`.
at::Tensor empty_like_spec(const OutputSpec& spec, c10::DeviceIndex device);
using OutputSpecs = std::vector<OutputSpec>;

// The bytes of a cache key: call_signature() writes them for a boxed call,
// UnboxedBridge for an unboxed one.
template <typename T>
inline void put(std::string& k, const T& v) {
  k.append(reinterpret_cast<const char*>(&v), sizeof v);
}
inline void tensor_key(std::string& k, const at::Tensor& t) {
  if (!t.defined()) {
    k.push_back('U');
    return;
  }
  k.push_back(t.device().is_cpu() ? (t.unsafeGetTensorImpl()->is_wrapped_number() ? 'w' : 'c') : 'd');
  put(k, static_cast<int8_t>(t.device().index()));  // a plan is made for one device
  put(k, static_cast<int8_t>(t.scalar_type()));
  put(k, static_cast<int8_t>(t.dim()));
  k.append(reinterpret_cast<const char*>(t.sizes().data()), t.sizes().size() * sizeof(int64_t));
  // The layout decides the result's (TensorIterator follows its inputs'
  // memory format), and a kernel's predicate may decide from the strides
  // themselves, also where PyTorch calls two layouts contiguous alike (the
  // stride of a size-1 dimension): every stride joins the key.
  k.append(reinterpret_cast<const char*>(t.strides().data()), t.strides().size() * sizeof(int64_t));
}
inline void int_key(std::string& k, int64_t v) {
  k.push_back('i');
  put(k, v);
}
inline void double_key(std::string& k, double v) {
  k.push_back('f');
  put(k, v);
}
inline void bool_key(std::string& k, bool v) {
  k.push_back('b');
  put(k, v);
}

// The key of a boxed call: raw bytes of every argument's metadata (and
// scalar values), prefixed with the op's address. False when some argument
// cannot be part of a key (the call is not cached).
bool call_signature(const c10::OperatorHandle& op, c10::ArrayRef<c10::IValue> args, std::string* key);

// What the eager bridges remember per call signature and thread: ATen's
// output shapes and dtypes (the op's meta kernel, asked when a route needs
// them) and the dispatcher's plan for the call (Note [One call plan per
// signature], dispatcher.h), both keyed by the same bytes.
struct SignatureEntry {
  std::shared_ptr<const OutputSpecs> specs;
  std::shared_ptr<const CallPlan> plan;
};
// The entry for `key` (null: none yet), and the entry made if missing.
SignatureEntry* find_signature(const std::string& key);
SignatureEntry& signature_entry(const std::string& key);

// The outputs' shapes and dtypes of a functional op: from the cache, or from
// the op's meta kernel. Null when the meta kernel fails.
const OutputSpecs* cached_output_specs(const std::string& key);
std::shared_ptr<const OutputSpecs> output_specs(const c10::OperatorHandle& op,
                                                c10::ArrayRef<c10::IValue> args);

// out= tensors of the wrong shape are resized first, as ATen's out
// convention does (callers pass empty outs); the shapes come from the op's
// meta kernel. False when the meta kernel refuses the call (an out= dtype
// the op cannot write, say) or has none, or when an out= needs a resize and
// `may_resize` is off: ATen's CPU kernel then decides.
bool resize_outs(const c10::OperatorHandle& op, c10::ArrayRef<c10::IValue> args, bool may_resize = true);

}  // namespace npub::torch_backend

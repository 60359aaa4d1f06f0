// The meta-shape cache: a functional op's output shapes and dtypes from its
// meta kernel, remembered per thread by call signature (see meta_cache.h).
#include "aten/meta_cache.h"

#include <ATen/ops/empty_strided.h>

#include <npubridge/support/env.h>

#include "aten/boxing.h"
#include "aten/minimal.h"

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <optional>
#include <unordered_map>

namespace npub::torch_backend {

namespace {

// The same value with every tensor (also inside lists) on the meta device.
// Wrapped numbers (Python scalars as 0-d CPU tensors) stay as they are: meta
// kernels take CPU scalars, and type promotion depends on the flag.
at::Tensor to_meta(const at::Tensor& t) {
  if (!t.defined() || t.unsafeGetTensorImpl()->is_wrapped_number()) return t;
  return at::empty_strided(t.sizes(), t.strides(), t.options().device(at::kMeta));
}

// Per thread, so the hot path takes no lock; each thread asks the meta
// kernel once per call signature.
thread_local std::unordered_map<std::string, SignatureEntry> tls_signatures;

// Bounded: a program that keeps making new shapes does not grow it forever
// (entries are shared_ptrs, so a call holding one is unaffected).
SignatureEntry& insert_signature(const std::string& key) {
  if (tls_signatures.size() > 4096) tls_signatures.clear();
  return tls_signatures[key];
}

}  // namespace

bool call_signature(const c10::OperatorHandle& op, c10::ArrayRef<c10::IValue> args, std::string* key) {
  std::string& k = *key;
  k.clear();
  put(k, &op.schema());
  for (const auto& a : args) {
    if (a.isNone())
      k.push_back('N');
    else if (a.isTensor())
      tensor_key(k, a.toTensor());
    else if (a.isInt())
      int_key(k, a.toInt());
    else if (a.isDouble())
      double_key(k, a.toDouble());
    else if (a.isBool())
      bool_key(k, a.toBool());
    else if (a.isString()) {
      k.push_back('s');
      k += a.toStringRef();
      k.push_back('\0');
    } else if (a.isIntList()) {
      k.push_back('l');
      const auto l = a.toIntList();
      put(k, static_cast<int32_t>(l.size()));
      for (int64_t x : l) put(k, x);
    } else if (a.isTensorList()) {
      k.push_back('L');
      const auto l = a.toTensorList();
      put(k, static_cast<int32_t>(l.size()));
      for (const at::Tensor& t : l) tensor_key(k, t);
    } else if (a.isList()) {
      // Tensor?[] (index's and index_put's indices). A boolean or byte
      // mask selects as many elements as it holds true values: a shape
      // that depends on data is never cached.
      k.push_back('O');
      const auto l = a.toListRef();
      put(k, static_cast<int32_t>(l.size()));
      for (const c10::IValue& e : l) {
        if (e.isNone()) {
          k.push_back('N');
        } else if (e.isTensor()) {
          const at::Tensor& t = e.toTensor();
          if (t.defined() && (t.scalar_type() == at::kBool || t.scalar_type() == at::kByte)) return false;
          tensor_key(k, t);
        } else {
          return false;
        }
      }
    } else {
      return false;
    }
  }
  return true;
}

at::Tensor empty_like_spec(const OutputSpec& spec, c10::DeviceIndex device) {
  const at::Device npu(c10::DeviceType::PrivateUse1, device);
  if (spec.strides.empty())
    return empty_memory_format(spec.sizes, spec.dtype, std::nullopt, npu, std::nullopt, std::nullopt);
  return empty_strided(spec.sizes, spec.strides, spec.dtype, std::nullopt, npu, std::nullopt);
}

SignatureEntry* find_signature(const std::string& key) {
  auto it = tls_signatures.find(key);
  return it != tls_signatures.end() ? &it->second : nullptr;
}

SignatureEntry& signature_entry(const std::string& key) {
  if (SignatureEntry* e = find_signature(key)) return *e;
  return insert_signature(key);
}

const OutputSpecs* cached_output_specs(const std::string& key) {
  const SignatureEntry* e = find_signature(key);
  return e != nullptr ? e->specs.get() : nullptr;
}

std::shared_ptr<const OutputSpecs> output_specs(const c10::OperatorHandle& op,
                                                c10::ArrayRef<c10::IValue> args) {
  thread_local std::string key;  // keeps its capacity: no allocation per call
  const bool cacheable = call_signature(op, args, &key);
  if (cacheable) {
    if (const SignatureEntry* e = find_signature(key); e != nullptr && e->specs) return e->specs;
  }
  torch::jit::Stack meta;
  for (const auto& a : args) meta.push_back(map_tensors(a, [](const at::Tensor& t) { return to_meta(t); }));
  try {
    op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::Meta), &meta);
  } catch (const std::exception& e) {
    if (env::get("NPUB_LOG_LEVEL") == std::optional<std::string>("debug"))
      std::fprintf(stderr, "[npubridge] [debug] meta kernel of '%s' failed: %s\n",
                   full_name(op.schema().operator_name()).c_str(), e.what());
    return nullptr;
  }
  auto specs = std::make_shared<OutputSpecs>();
  for (const auto& r : meta) {
    const at::Tensor& t = r.toTensor();
    specs->push_back(
        {t.sizes().vec(), t.scalar_type(), t.is_contiguous() ? std::vector<int64_t>{} : t.strides().vec()});
  }
  if (cacheable) signature_entry(key).specs = specs;
  return specs;
}

bool resize_outs(const c10::OperatorHandle& op, c10::ArrayRef<c10::IValue> args, bool may_resize) {
  const auto specs = output_specs(op, args);
  if (!specs) return false;
  const auto& schema_args = op.schema().arguments();
  // fn(out tensor, the sizes ATen gives it), for each out= tensor.
  auto for_each_out = [&](auto&& fn) {
    size_t r = 0;
    for (size_t i = 0; i < schema_args.size() && r < specs->size(); ++i)
      if (schema_args[i].is_out() && args[i].isTensor()) fn(args[i].toTensor(), (*specs)[r++].sizes);
  };
  bool resizes = false;
  for_each_out([&](const at::Tensor& out, const std::vector<int64_t>& sizes) {
    resizes = resizes || !out.sizes().equals(sizes);
  });
  if (!resizes) return true;
  if (!may_resize) return false;
  for_each_out([&](const at::Tensor& out, const std::vector<int64_t>& sizes) {
    if (!out.sizes().equals(sizes)) resize_(out, sizes, std::nullopt);
  });
  return true;
}

}  // namespace npub::torch_backend

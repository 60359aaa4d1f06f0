// c10::IValue -> NpubValue, for hosts built against LibTorch (the PyTorch
// extension and npub-conformance). Header-only, like dtype.h; the core
// libraries never include it. How a tensor becomes a DLTensor is the
// caller's (a view of a device tensor, a copy to the device, metadata only);
// everything else boxes the same way for every host.
#pragma once

#include <ATen/core/ivalue.h>
#include <c10/util/Exception.h>

#include <npubridge/dispatcher/value.h>

#include <memory>
#include <string>
#include <vector>

namespace npub {

// What boxed lists and strings point into; lives as long as the NpubValues.
struct BoxedStorage {
  std::vector<std::unique_ptr<std::vector<int64_t>>> ints;
  std::vector<std::unique_ptr<std::vector<double>>> doubles;
  std::vector<std::unique_ptr<std::vector<DLTensor*>>> tensor_lists;
  std::vector<std::unique_ptr<std::string>> strings;
};

// Boxes one IValue. `tensor(t)` gives the DLTensor for a defined tensor;
// undefined tensors and None (also inside tensor lists) box as none / NULL.
// A Generator boxes as none: the host binds it to the call instead
// (npub::ScopedCallGenerator), and the kernel's philox_reserve draws from it.
template <typename TensorFn>
NpubValue box_ivalue(const c10::IValue& v, BoxedStorage& s, TensorFn&& tensor) {
  if (v.isNone() || v.isGenerator()) return none_value();
  if (v.isTensor()) return v.toTensor().defined() ? tensor_value(tensor(v.toTensor())) : none_value();
  if (v.isBool()) return bool_value(v.toBool());
  if (v.isInt()) return int_value(v.toInt());
  if (v.isDouble()) return double_value(v.toDouble());
  if (v.isString()) {
    s.strings.push_back(std::make_unique<std::string>(v.toStringRef()));
    return string_value(s.strings.back()->c_str());
  }
  if (v.isIntList()) {
    s.ints.push_back(std::make_unique<std::vector<int64_t>>(v.toIntVector()));
    return int_list_value(*s.ints.back());
  }
  if (v.isList() && !v.toListRef().empty() && (v.toListRef()[0].isSymInt() || v.toListRef()[0].isInt())) {
    auto l = std::make_unique<std::vector<int64_t>>();
    for (const c10::IValue& e : v.toListRef())
      l->push_back(e.isSymInt() ? e.toSymInt().expect_int() : e.toInt());
    s.ints.push_back(std::move(l));
    return int_list_value(*s.ints.back());
  }
  if (v.isBoolList()) {
    auto l = std::make_unique<std::vector<int64_t>>();
    for (bool x : v.toBoolList()) l->push_back(x);
    s.ints.push_back(std::move(l));
    return int_list_value(*s.ints.back());
  }
  if (v.isDoubleList()) {
    s.doubles.push_back(std::make_unique<std::vector<double>>(v.toDoubleVector()));
    return double_list_value(*s.doubles.back());
  }
  if (v.isList()) {
    auto l = std::make_unique<std::vector<DLTensor*>>();
    for (const c10::IValue& e : v.toListRef())
      l->push_back(e.isNone() || !e.toTensor().defined() ? nullptr : tensor(e.toTensor()));
    s.tensor_lists.push_back(std::move(l));
    return tensor_list_value(*s.tensor_lists.back());
  }
  TORCH_CHECK(false, "npubridge: cannot pass an argument of type ", v.tagKind(), " to a plugin kernel");
  return none_value();  // not reached; unoptimised builds do not see TORCH_CHECK(false) as noreturn
}

}  // namespace npub

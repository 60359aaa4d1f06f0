// Building boxed values (NpubValue) from C++. Every pointer stays borrowed:
// the referenced tensor, list or string must outlive the call.
#pragma once

#include <npubridge/plugin_api.h>

#include <cstring>
#include <vector>

namespace npub {

inline NpubValue none_value() {
  NpubValue v{};
  v.tag = NPUB_VALUE_NONE;
  return v;
}
inline NpubValue tensor_value(DLTensor* t) {
  NpubValue v{};
  v.tag = NPUB_VALUE_TENSOR;
  v.u.tensor = t;
  return v;
}
inline NpubValue int_value(int64_t i) {
  NpubValue v{};
  v.tag = NPUB_VALUE_INT;
  v.u.i = i;
  return v;
}
inline NpubValue double_value(double d) {
  NpubValue v{};
  v.tag = NPUB_VALUE_DOUBLE;
  v.u.d = d;
  return v;
}
inline NpubValue bool_value(bool b) {
  NpubValue v{};
  v.tag = NPUB_VALUE_BOOL;
  v.u.i = b ? 1 : 0;
  return v;
}
inline NpubValue string_value(const char* s) {
  NpubValue v{};
  v.tag = NPUB_VALUE_STRING;
  v.count = static_cast<int32_t>(std::strlen(s));
  v.u.s = s;
  return v;
}
inline NpubValue int_list_value(const std::vector<int64_t>& list) {
  NpubValue v{};
  v.tag = NPUB_VALUE_INT_LIST;
  v.count = static_cast<int32_t>(list.size());
  v.u.ints = list.data();
  return v;
}
inline NpubValue double_list_value(const std::vector<double>& list) {
  NpubValue v{};
  v.tag = NPUB_VALUE_DOUBLE_LIST;
  v.count = static_cast<int32_t>(list.size());
  v.u.doubles = list.data();
  return v;
}
inline NpubValue tensor_list_value(const std::vector<DLTensor*>& list) {
  NpubValue v{};
  v.tag = NPUB_VALUE_TENSOR_LIST;
  v.count = static_cast<int32_t>(list.size());
  v.u.tensors = list.data();
  return v;
}

}  // namespace npub

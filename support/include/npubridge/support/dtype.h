// DLDataType helpers shared by the host layers.
#pragma once

#include <npubridge/plugin_api.h>

#include <cstdint>
#include <string>
#include <string_view>

namespace npub {

// The dtypes npubridge knows, as a dense index for bit sets and tables.
enum class DType : uint8_t {
  kFloat32 = 0,
  kFloat64,
  kFloat16,
  kBFloat16,
  kInt64,
  kInt32,
  kInt16,
  kInt8,
  kUInt8,
  kBool,
  kCount,
  kUnknown = 0xff,
};

constexpr int kNumDTypes = static_cast<int>(DType::kCount);

DType dtype_of(DLDataType t) noexcept;
DLDataType to_dl(DType t) noexcept;
const char* dtype_name(DType t) noexcept;
std::string dtype_name(DLDataType t);
// The dtype named `name` as dtype_name spells it (torch's spelling too:
// "float32", "bfloat16", "int64", "bool"); kUnknown for any other name.
DType dtype_from_name(std::string_view name) noexcept;
// Element size in bytes (0 for kUnknown).
int64_t element_size(DType t) noexcept;
bool is_floating(DType t) noexcept;
inline bool operator==(DLDataType a, DLDataType b) noexcept {
  return a.code == b.code && a.bits == b.bits && a.lanes == b.lanes;
}
inline bool operator!=(DLDataType a, DLDataType b) noexcept { return !(a == b); }

}  // namespace npub

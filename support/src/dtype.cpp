#include <npubridge/support/dtype.h>

namespace npub {

namespace {
struct DTypeInfo {
  DType type;
  DLDataType dl;
  const char* name;
  int64_t size;
};
constexpr DTypeInfo kInfo[] = {
    {DType::kFloat32, {kDLFloat, 32, 1}, "float32", 4}, {DType::kFloat64, {kDLFloat, 64, 1}, "float64", 8},
    {DType::kFloat16, {kDLFloat, 16, 1}, "float16", 2}, {DType::kBFloat16, {kDLBfloat, 16, 1}, "bfloat16", 2},
    {DType::kInt64, {kDLInt, 64, 1}, "int64", 8},       {DType::kInt32, {kDLInt, 32, 1}, "int32", 4},
    {DType::kInt16, {kDLInt, 16, 1}, "int16", 2},       {DType::kInt8, {kDLInt, 8, 1}, "int8", 1},
    {DType::kUInt8, {kDLUInt, 8, 1}, "uint8", 1},       {DType::kBool, {NPUB_DL_BOOL, 8, 1}, "bool", 1},
};
}  // namespace

DType dtype_of(DLDataType t) noexcept {
  if (t.lanes != 1) return DType::kUnknown;
  switch (t.code) {
    case kDLFloat:
      return t.bits == 32   ? DType::kFloat32
             : t.bits == 64 ? DType::kFloat64
             : t.bits == 16 ? DType::kFloat16
                            : DType::kUnknown;
    case kDLBfloat:
      return t.bits == 16 ? DType::kBFloat16 : DType::kUnknown;
    case kDLInt:
      return t.bits == 64   ? DType::kInt64
             : t.bits == 32 ? DType::kInt32
             : t.bits == 16 ? DType::kInt16
             : t.bits == 8  ? DType::kInt8
                            : DType::kUnknown;
    case kDLUInt:
      return t.bits == 8 ? DType::kUInt8 : DType::kUnknown;
    case NPUB_DL_BOOL:
      return t.bits == 8 ? DType::kBool : DType::kUnknown;
    default:
      return DType::kUnknown;
  }
}

DLDataType to_dl(DType t) noexcept {
  const auto i = static_cast<size_t>(t);
  return i < std::size(kInfo) ? kInfo[i].dl : DLDataType{0, 0, 0};
}

const char* dtype_name(DType t) noexcept {
  const auto i = static_cast<size_t>(t);
  return i < std::size(kInfo) ? kInfo[i].name : "unknown";
}

std::string dtype_name(DLDataType t) {
  DType d = dtype_of(t);
  if (d != DType::kUnknown) return dtype_name(d);
  return "dtype(code=" + std::to_string(t.code) + ", bits=" + std::to_string(t.bits) +
         ", lanes=" + std::to_string(t.lanes) + ")";
}

DType dtype_from_name(std::string_view name) noexcept {
  for (const DTypeInfo& i : kInfo)
    if (name == i.name) return i.type;
  return DType::kUnknown;
}

int64_t element_size(DType t) noexcept {
  const auto i = static_cast<size_t>(t);
  return i < std::size(kInfo) ? kInfo[i].size : 0;
}

bool is_floating(DType t) noexcept {
  return t == DType::kFloat32 || t == DType::kFloat64 || t == DType::kFloat16 || t == DType::kBFloat16;
}

}  // namespace npub

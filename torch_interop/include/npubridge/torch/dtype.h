// at::ScalarType <-> npub::DType, for hosts and tools built against LibTorch
// (the PyTorch extension, npub-conformance, the cann_like benchmark).
// Header-only (torch_interop/): the core libraries never include it.
#pragma once

#include <c10/core/ScalarType.h>

#include <npubridge/support/dtype.h>

namespace npub {

// DType::kUnknown for the scalar types npubridge does not carry (complex,
// unsigned wider than 8 bits, float8, ...).
inline DType npub_dtype(c10::ScalarType t) {
  switch (t) {
    case c10::kFloat:
      return DType::kFloat32;
    case c10::kDouble:
      return DType::kFloat64;
    case c10::kHalf:
      return DType::kFloat16;
    case c10::kBFloat16:
      return DType::kBFloat16;
    case c10::kLong:
      return DType::kInt64;
    case c10::kInt:
      return DType::kInt32;
    case c10::kShort:
      return DType::kInt16;
    case c10::kChar:
      return DType::kInt8;
    case c10::kByte:
      return DType::kUInt8;
    case c10::kBool:
      return DType::kBool;
    default:
      return DType::kUnknown;
  }
}

// Undefined for DType::kUnknown (returns c10::ScalarType::Undefined).
inline c10::ScalarType torch_dtype(DType t) {
  switch (t) {
    case DType::kFloat32:
      return c10::kFloat;
    case DType::kFloat64:
      return c10::kDouble;
    case DType::kFloat16:
      return c10::kHalf;
    case DType::kBFloat16:
      return c10::kBFloat16;
    case DType::kInt64:
      return c10::kLong;
    case DType::kInt32:
      return c10::kInt;
    case DType::kInt16:
      return c10::kShort;
    case DType::kInt8:
      return c10::kChar;
    case DType::kUInt8:
      return c10::kByte;
    case DType::kBool:
      return c10::kBool;
    default:
      return c10::ScalarType::Undefined;
  }
}

}  // namespace npub

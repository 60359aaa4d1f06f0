// Shapes and strides as the core reads them: one definition of "contiguous"
// and one way of printing a shape in messages ("[2, 3]").
#pragma once

#include <cstdint>
#include <span>
#include <string>

namespace npub {

// Row-major contiguous: each dimension's stride is the product of the sizes
// after it; size-1 dimensions may have any stride. NULL strides (DLPack's
// "compact row-major") are contiguous.
bool is_contiguous(const int64_t* shape, const int64_t* strides, int ndim);

// "[2, 3]"; "[]" for a 0-d tensor. Every message that prints a shape (or
// strides) prints it this way.
std::string shape_str(const int64_t* shape, int ndim);
// The same for a std::vector<int64_t> or a torch host's c10::IntArrayRef.
inline std::string shape_str(std::span<const int64_t> shape) {
  return shape_str(shape.data(), static_cast<int>(shape.size()));
}

}  // namespace npub

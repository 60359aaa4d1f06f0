#include <npubridge/support/shape.h>

namespace npub {

bool is_contiguous(const int64_t* shape, const int64_t* strides, int ndim) {
  if (strides == nullptr) return true;
  int64_t expected = 1;
  for (int i = ndim - 1; i >= 0; --i) {
    if (shape[i] != 1 && strides[i] != expected) return false;
    expected *= shape[i];
  }
  return true;
}

std::string shape_str(const int64_t* shape, int ndim) {
  std::string s = "[";
  for (int i = 0; i < ndim; ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

}  // namespace npub

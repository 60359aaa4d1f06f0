#include "scalar_range.h"

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>

namespace cann_like {

const char* c10_type_name(DT d) {
  switch (d) {
    case DT::f32:
      return "float";
    case DT::f64:
      return "double";
    case DT::f16:
      return "c10::Half";
    case DT::bf16:
      return "c10::BFloat16";
    case DT::i64:
      return "int64_t";
    case DT::i32:
      return "int";
    case DT::i16:
      return "int16_t";
    case DT::i8:
      return "int8_t";
    case DT::u8:
      return "uint8_t";
    case DT::b8:
      return "bool";
    default:
      return "unknown";
  }
}

const char* demangled_type_name(DT d) {
  switch (d) {
    case DT::i64:
      return "long int";
    case DT::i16:
      return "short int";
    case DT::i8:
      return "signed char";
    case DT::u8:
      return "unsigned char";
    default:
      return c10_type_name(d);
  }
}

double floating_max(DT d) {
  switch (d) {
    case DT::f16:
      return 65504.0;
    case DT::bf16:
      return 3.3895313892515355e38;
    case DT::f32:
      return static_cast<double>(std::numeric_limits<float>::max());
    default:
      return std::numeric_limits<double>::max();
  }
}

namespace {

// [lowest, max] of an integral dtype.
void integral_range(DT d, int64_t* lo, int64_t* hi) {
  switch (d) {
    case DT::u8:
      *lo = 0, *hi = 255;
      return;
    case DT::i8:
      *lo = INT8_MIN, *hi = INT8_MAX;
      return;
    case DT::i16:
      *lo = INT16_MIN, *hi = INT16_MAX;
      return;
    case DT::i32:
      *lo = INT32_MIN, *hi = INT32_MAX;
      return;
    default:
      *lo = INT64_MIN, *hi = INT64_MAX;
      return;
  }
}

}  // namespace

bool scalar_fits(const NpubValue& v, DT d) {
  if (d == DT::b8 || d == DT::f64 || v.tag == NPUB_VALUE_BOOL) return true;
  if (is_floating(d)) {
    const double x = v.tag == NPUB_VALUE_DOUBLE ? v.u.d : static_cast<double>(v.u.i);
    if (std::isnan(x) || std::isinf(x)) return true;
    return std::fabs(x) <= floating_max(d);
  }
  int64_t lo = 0, hi = 0;
  integral_range(d, &lo, &hi);
  if (v.tag == NPUB_VALUE_DOUBLE) {
    const double x = v.u.d;
    if (std::isnan(x)) return false;
    return x >= static_cast<double>(lo) && x <= static_cast<double>(hi);  // infinity: false
  }
  const int64_t i = v.u.i;
  if (d == DT::u8) return i <= hi && (i >= 0 || -static_cast<uint64_t>(i) <= static_cast<uint64_t>(hi));
  return i >= lo && i <= hi;
}

void check_scalar_fits(const Call& call, const NpubValue& v, DT d) {
  if (!scalar_fits(v, d))
    call.fail(NPUB_ERR_INVALID_ARGUMENT,
              std::string("value cannot be converted to type ") + c10_type_name(d) + " without overflow");
}

}  // namespace cann_like

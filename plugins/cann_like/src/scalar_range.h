// Scalar arguments meeting a tensor's dtype, checked as ATen checks them
// (c10::overflows), with ATen's messages: fill values, masked_fill values,
// alpha, and the bounds of random fills.
#pragma once

#include "common.h"

namespace cann_like {

// The C++ type name ATen's messages give a dtype ("int8_t", "int",
// "c10::Half", "float", ...).
const char* c10_type_name(DT d);

// The demangled C++ type ATen's dtype checks print ("long int", "short int",
// "signed char", "unsigned char", "float", "c10::Half", ...).
const char* demangled_type_name(DT d);

// Whether `v` converts to `d` without overflow, as c10::overflows judges:
// NaN and infinity fit floating types only; an integer fits an unsigned
// type down to -max (it wraps, so a - b may be a + 255 * b in uint8); bool
// takes anything.
bool scalar_fits(const NpubValue& v, DT d);

// Fails with ATen's "value cannot be converted to type int8_t without
// overflow" when `v` does not fit `d`.
void check_scalar_fits(const Call& call, const NpubValue& v, DT d);

// The finite range of a floating dtype: [-max, max].
double floating_max(DT d);

}  // namespace cann_like

// Random fills on the call's Philox stream (plugin ABI 1.1): uniform_,
// normal_ (Box-Muller), bernoulli_, exponential_ (inverse CDF), random_
// (integers in a range). The stream is the caller's generator
// (torch.Generator(device="npu")) or the device's default one (seeded by
// torch.npu.manual_seed / torch.manual_seed): philox_reserve picks it.
// Independent of thread count, as every element's numbers depend only on
// (seed, counter).
#include "elementwise.h"
#include "ops.h"
#include "scalar_range.h"

#include <npubridge/philox.hpp>

#include <cmath>
#include <limits>
#include <sstream>
#include <string>

namespace cann_like {

namespace {

enum class Dist { uniform, normal, bernoulli, exponential };

// A double as C++ streams print it (6 significant digits: "3e+38").
std::string shortest(double v) {
  std::ostringstream os;
  os << v;
  return os.str();
}

// ATen's check_uniform_bounds: both bounds finite in the dtype, and their
// difference too.
void check_uniform_bounds(const Call& call, DT d, double from, double to) {
  if (!is_floating(d)) return;
  const double max = floating_max(d);
  if (!(from >= -max && from <= max))
    call.fail(NPUB_ERR_INVALID_ARGUMENT, std::string("from is out of bounds for ") + c10_type_name(d));
  if (!(to >= -max && to <= max))
    call.fail(NPUB_ERR_INVALID_ARGUMENT, std::string("to is out of bounds for ") + c10_type_name(d));
  if (from <= to && to - from > max) {
    static const char* aten_names[] = {"Float", "Double", "Half", "BFloat16"};
    call.fail(NPUB_ERR_INVALID_ARGUMENT,
              std::string("uniform_ expects to-from <= std::numeric_limits<") +
                  aten_names[static_cast<int>(d)] + ">::max(), but found to=" + shortest(to) +
                  " and from=" + shortest(from) + " which result in to-from to exceed the limit");
  }
}

template <Dist kDist>
void fill_random(Call& call) {
  TensorRef self = call.tensor(0);
  const DT d = dt_of(self.dtype());
  const double a = call.double_arg(1);
  const double b = kDist == Dist::bernoulli || kDist == Dist::exponential ? 0.0 : call.double_arg(2);
  if (kDist == Dist::uniform) check_uniform_bounds(call, d, a, b);
  if (kDist == Dist::uniform && !(a <= b))
    call.fail(NPUB_ERR_INVALID_ARGUMENT, "uniform_ expects to return a [from, to) range, but found from=" +
                                             std::to_string(a) + " > to=" + std::to_string(b));
  if (kDist == Dist::normal && !(b >= 0))
    call.fail(NPUB_ERR_INVALID_ARGUMENT, "normal expects std >= 0.0, but found std " + std::to_string(b));
  if (kDist == Dist::bernoulli && !(a >= 0 && a <= 1))
    call.fail(NPUB_ERR_INVALID_ARGUMENT,
              "bernoulli_ expects p to be in [0, 1], but got p=" + std::to_string(a));
  if (kDist == Dist::exponential && !(a > 0))
    call.fail(NPUB_ERR_INVALID_ARGUMENT,
              "exponential_ expects lambda > 0.0, but found lambda=" + shortest(a));
  if (!is_floating(d) && kDist != Dist::bernoulli)
    call.fail(NPUB_ERR_UNSUPPORTED, std::string("random fill of dtype ") + dt_name(d));
  const int64_t n = self.numel(), es = dt_size(d);
  if (n == 0) return;
  const auto [seed, offset] = call.philox(static_cast<uint64_t>((n + 3) / 4));
  call.parallel_for(0, (n + 3) / 4, 2048, [&](int64_t blk0, int64_t blk1) {
    for (int64_t blk = blk0; blk < blk1; ++blk) {
      const auto r = npub::philox::block(seed, offset + static_cast<uint64_t>(blk));
      double v[4];
      if constexpr (kDist == Dist::normal) {
        for (int k = 0; k < 4; k += 2) {
          // u1 in (0, 1] so that log(u1) is finite.
          const double u1 = (static_cast<double>(r[static_cast<size_t>(k)] >> 8) + 1.0) / 16777216.0;
          const double u2 = static_cast<double>(r[static_cast<size_t>(k + 1)] >> 8) / 16777216.0;
          const double radius = std::sqrt(-2.0 * std::log(u1));
          v[k] = a + b * radius * std::cos(2.0 * M_PI * u2);
          v[k + 1] = a + b * radius * std::sin(2.0 * M_PI * u2);
        }
      } else {
        for (int k = 0; k < 4; ++k) {
          const double u = static_cast<double>(r[static_cast<size_t>(k)] >> 8) / 16777216.0;  // [0, 1)
          if constexpr (kDist == Dist::uniform)
            v[k] = std::min(a + (b - a) * u, std::nextafter(b, a));
          else if constexpr (kDist == Dist::exponential)
            // -log(u) / lambda with u in (0, 1) (half a step off both
            // ends): never 0, as ATen's exponential_ never is (vLLM's
            // sampler divides by it), and finite; in float16 at least its
            // smallest subnormal, which the smallest draws would round below.
            v[k] = std::max(-std::log(u + 0.5 / 16777216.0) / a, d == DT::f16 ? 0x1p-24 : 0.0);
          else
            v[k] = u < a ? 1.0 : 0.0;
        }
      }
      for (int k = 0; k < 4; ++k) {
        const int64_t i = blk * 4 + k;
        if (i >= n) break;
        store<double>(self.data<char>() + i * es, d, v[k]);
      }
    }
  });
}

// The integers a random_ fill may produce in dtype d up to `to` excluded:
// ATen's bounds (a floating dtype holds the integers up to 2^digits).
int64_t max_integer(DT d) {
  switch (d) {
    case DT::f32:
      return int64_t{1} << 24;
    case DT::f64:
      return int64_t{1} << 53;
    case DT::f16:
      return int64_t{1} << 11;
    case DT::bf16:
      return int64_t{1} << 8;
    case DT::i32:
      return std::numeric_limits<int32_t>::max();
    case DT::i16:
      return std::numeric_limits<int16_t>::max();
    case DT::i8:
      return std::numeric_limits<int8_t>::max();
    case DT::u8:
      return std::numeric_limits<uint8_t>::max();
    case DT::b8:
      return 1;
    default:
      return std::numeric_limits<int64_t>::max();
  }
}
int64_t min_integer(DT d) {
  if (is_floating(d)) return -max_integer(d);
  if (d == DT::u8 || d == DT::b8) return 0;
  return d == DT::i64 ? std::numeric_limits<int64_t>::min() : -max_integer(d) - 1;
}

// aten::random_.from(self, int from, int? to, *, Generator? generator): the
// integers [from, to) uniformly (to = None: up to the dtype's largest
// integer, included), from 32 random bits when the range fits them, else 64
// (as ATen's random_from_to).
void random_from(Call& call) {
  TensorRef self = call.tensor(0);
  const DT d = dt_of(self.dtype());
  const int64_t from = call.int_arg(1);
  const bool open = call.is_none(2);
  if (!open && !(from < call.int_arg(2)))
    call.fail(NPUB_ERR_INVALID_ARGUMENT,
              "random_ expects 'from' to be less than 'to', but got from=" + std::to_string(from) +
                  " >= to=" + std::to_string(call.int_arg(2)));
  const int64_t last = open ? max_integer(d) : call.int_arg(2) - 1;  // the largest value
  if (from < min_integer(d) || from > max_integer(d))
    call.fail(NPUB_ERR_INVALID_ARGUMENT, std::string("from is out of bounds for ") + c10_type_name(d));
  if (last < min_integer(d) || last > max_integer(d))
    call.fail(NPUB_ERR_INVALID_ARGUMENT, std::string("to - 1 is out of bounds for ") + c10_type_name(d));
  // range - 1 as unsigned: [from, last] may span all 2^64 int64 values.
  const uint64_t span = static_cast<uint64_t>(last) - static_cast<uint64_t>(from);
  const int64_t n = self.numel(), es = dt_size(d);
  if (n == 0) return;
  const auto [seed, offset] = call.philox(static_cast<uint64_t>((n + 1) / 2));
  call.parallel_for(0, (n + 1) / 2, 2048, [&](int64_t blk0, int64_t blk1) {
    for (int64_t blk = blk0; blk < blk1; ++blk) {
      const auto r = npub::philox::block(seed, offset + static_cast<uint64_t>(blk));
      for (int k = 0; k < 2; ++k) {
        const int64_t i = blk * 2 + k;
        if (i >= n) break;
        const uint64_t lo = r[static_cast<size_t>(2 * k)], hi = r[static_cast<size_t>(2 * k + 1)];
        uint64_t pick;
        if (span == std::numeric_limits<uint64_t>::max())
          pick = (hi << 32) | lo;
        else if (span < (uint64_t{1} << 32))
          pick = lo % (span + 1);
        else
          pick = ((hi << 32) | lo) % (span + 1);
        const int64_t v = static_cast<int64_t>(static_cast<uint64_t>(from) + pick);
        if (is_floating(d))
          store<double>(self.data<char>() + i * es, d, static_cast<double>(v));
        else
          store<int64_t>(self.data<char>() + i * es, d, v);
      }
    }
  });
}

}  // namespace

void register_random(npub::sdk::Registrar& r) {
  r.op("aten::uniform_(Tensor(a!) self, float from=0., float to=1., *, Generator? generator=None) -> "
       "Tensor(a!)",
       &fill_random<Dist::uniform>)
      .dtypes(dtypes_floating())
      .contiguous_only();
  r.op("aten::normal_(Tensor(a!) self, float mean=0., float std=1., *, Generator? generator=None) -> "
       "Tensor(a!)",
       &fill_random<Dist::normal>)
      .dtypes(dtypes_floating())
      .contiguous_only();
  r.op("aten::bernoulli_.float(Tensor(a!) self, float p=0.5, *, Generator? generator=None) -> Tensor(a!)",
       &fill_random<Dist::bernoulli>)
      .dtypes(dtypes_all())
      .contiguous_only();
  r.op("aten::exponential_(Tensor(a!) self, float lambd=1., *, Generator? generator=None) -> Tensor(a!)",
       &fill_random<Dist::exponential>)
      .dtypes(dtypes_floating())
      .contiguous_only();
  r.op("aten::random_.from(Tensor(a!) self, int from, int? to, *, Generator? generator=None) -> Tensor(a!)",
       &random_from)
      .dtypes(dtypes_all())
      .contiguous_only();
}

}  // namespace cann_like

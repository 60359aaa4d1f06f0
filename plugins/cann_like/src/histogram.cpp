// aten::histc.out for every numeric dtype, as CUDA's histc computes it: the
// counts have the input's dtype; min == max takes the data's range (and
// widens an empty one by 1 on each side); values outside [min, max] (and
// NaN) are not counted; bins are [lo, hi) except the last, [lo, max].
// Mixture-of-experts layers call it on int32 expert ids on any device but
// the CPU, whose histc has no integer kernel.
#include "common.h"
#include "ops.h"

#include <cmath>
#include <limits>

namespace cann_like {

namespace {

// Note [histc computes bins exactly]
// CUDA computes bin = (x - min) * bins / (max - min) in the input's
// accumulate type: int64 for integers (exact unless the product
// overflows), float32 for float32 (off by one near a bin edge). Here
// integers use 128-bit products (exact for every int64 range), and floats
// double (bounds rounded to the input's dtype first, as CUDA and the CPU
// do), so a value lands in the bin its exact quotient says.
struct Bins {
  int64_t count;
  double lo, hi;     // floating inputs
  int64_t ilo, ihi;  // integer inputs
  bool narrow;       // (ihi - ilo) * count fits int64
};

template <typename T>
int64_t bin_of(const Bins& b, T v) {
  if constexpr (std::is_integral_v<T>) {
    const int64_t x = static_cast<int64_t>(v);
    if (x < b.ilo || x > b.ihi) return -1;
    if (b.narrow)  // the product fits 63 bits
      return std::min<int64_t>((x - b.ilo) * b.count / (b.ihi - b.ilo), b.count - 1);
    const __int128 q = static_cast<__int128>(x - b.ilo) * b.count / (static_cast<__int128>(b.ihi) - b.ilo);
    return std::min<int64_t>(static_cast<int64_t>(q), b.count - 1);
  } else {
    const double x = static_cast<double>(v);
    if (!(x >= b.lo && x <= b.hi)) return -1;  // NaN too
    const int64_t q = static_cast<int64_t>((x - b.lo) * static_cast<double>(b.count) / (b.hi - b.lo));
    return std::min<int64_t>(q, b.count - 1);
  }
}

// A bound as a floating dtype holds it (rounded to float32 or a half type).
double as_dtype(DT d, double v) {
  char buf[8];
  store<double>(buf, d, v);
  return load<double>(buf, d);
}

// aten::histc.out(self, int bins=100, Scalar min=0, Scalar max=0, *, out)
void histc(Call& call) {
  TensorRef in = call.tensor(0), out = call.tensor(4);
  const DT d = dt_of(in.dtype());
  const int64_t nbins = call.int_arg(1);
  if (nbins <= 0)
    call.fail(NPUB_ERR_INVALID_ARGUMENT, "torch.histc: bins must be > 0, but got " + std::to_string(nbins));
  const double min_arg = call.scalar_arg(2), max_arg = call.scalar_arg(3);
  if (!(min_arg <= max_arg))
    call.fail(NPUB_ERR_INVALID_ARGUMENT, "torch.histc: max must be larger than min, but found min=" +
                                             std::to_string(min_arg) + " and max=" + std::to_string(max_arg));
  if (dt_of(out.dtype()) != d)
    call.fail(NPUB_ERR_INVALID_ARGUMENT, std::string("torch.histc: expected out of the input's dtype ") +
                                             dt_name(d) + " but found " + dt_name(dt_of(out.dtype())));
  check_out(call, out, {nbins});
  const int64_t n = in.numel(), es = dt_size(d);
  const char* data = in.data<char>();
  // Integer inputs take the bounds truncated (CUDA's Scalar::to<int64_t>).
  auto bound = [&](double v) {
    return is_floating(d) ? as_dtype(d, v) : std::clamp(std::trunc(v), -0x1p62, 0x1p62);
  };
  Bins b{nbins, bound(min_arg), bound(max_arg), 0, 0, false};
  if (b.lo == b.hi && n > 0) {  // the data's range; a NaN in it has no range
    b.lo = std::numeric_limits<double>::infinity();
    b.hi = -b.lo;
    bool nan = false;
    for (int64_t i = 0; i < n; ++i) {
      const double v = load<double>(data + i * es, d);
      nan = nan || std::isnan(v);
      b.lo = std::min(b.lo, v);
      b.hi = std::max(b.hi, v);
    }
    if (nan) b.lo = b.hi = std::nan("");
  }
  if (b.lo == b.hi) {
    b.lo -= 1;
    b.hi += 1;
  }
  if (!(std::isfinite(b.lo) && std::isfinite(b.hi)))
    call.fail(NPUB_ERR_INVALID_ARGUMENT, "torch.histc: range of [" + std::to_string(b.lo) + ", " +
                                             std::to_string(b.hi) + "] is not finite");
  b.ilo = static_cast<int64_t>(b.lo);
  b.ihi = static_cast<int64_t>(b.hi);
  b.narrow = b.hi - b.lo < 0x1p31 && nbins < (int64_t{1} << 31);
  // Each thread counts a slice into its own histogram; the slices add up.
  // One slice when the bins outnumber the values (a histogram per thread
  // would cost more than the counting).
  const int64_t threads = std::max<int32_t>(1, call.num_threads());
  const int64_t slices = nbins > n ? 1 : std::max<int64_t>(1, std::min<int64_t>(threads, n >> 14));
  const int64_t per = (n + slices - 1) / std::max<int64_t>(slices, 1);
  int64_t* counts =
      static_cast<int64_t*>(call.scratch(static_cast<uint64_t>(slices * nbins) * sizeof(int64_t)));
  std::fill(counts, counts + slices * nbins, int64_t{0});
  visit_compute(d, [&](auto tag) {
    using T = decltype(tag);
    if constexpr (std::is_same_v<T, bool>) {
      call.fail(NPUB_ERR_UNSUPPORTED, "histc of bool tensors");
    } else {
      call.parallel_for(0, slices, 1, [&](int64_t s0, int64_t s1) {
        for (int64_t s = s0; s < s1; ++s) {
          int64_t* mine = counts + s * nbins;
          for (int64_t i = s * per; i < std::min(n, (s + 1) * per); ++i) {
            T v;
            if constexpr (std::is_same_v<T, float>) {
              v = d == DT::f32 ? reinterpret_cast<const float*>(data)[i] : load<float>(data + i * es, d);
            } else {
              std::memcpy(&v, data + i * es, sizeof(T));  // the compute type is the stored type
            }
            const int64_t bin = bin_of<T>(b, v);
            if (bin >= 0) ++mine[bin];
          }
        }
      });
    }
  });
  const DT od = dt_of(out.dtype());
  char* o = out.data<char>();
  for (int64_t k = 0; k < nbins; ++k) {
    int64_t total = 0;
    for (int64_t s = 0; s < slices; ++s) total += counts[s * nbins + k];
    store<int64_t>(o + k * es, od, total);
  }
}

}  // namespace

void register_histogram(npub::sdk::Registrar& r) {
  r.op("aten::histc.out(Tensor self, int bins=100, Scalar min=0, Scalar max=0, *, Tensor(a!) out) -> "
       "Tensor(a!)",
       &histc)
      .dtypes(dtypes_numeric())
      .contiguous_only();
}

}  // namespace cann_like

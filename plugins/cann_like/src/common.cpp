#include "common.h"
#include "elementwise.h"

namespace cann_like {

DT promote(DT a, DT b) {
  if (a == b) return a;
  if (a == DT::unknown) return b;
  if (b == DT::unknown) return a;
  // Rank within the lattice bool < u8/i8 < i16 < i32 < i64 < f16/bf16 < f32 < f64.
  auto rank = [](DT t) {
    switch (t) {
      case DT::b8:
        return 0;
      case DT::u8:
      case DT::i8:
        return 1;
      case DT::i16:
        return 2;
      case DT::i32:
        return 3;
      case DT::i64:
        return 4;
      case DT::f16:
      case DT::bf16:
        return 5;
      case DT::f32:
        return 6;
      default:
        return 7;
    }
  };
  if ((a == DT::u8 && b == DT::i8) || (a == DT::i8 && b == DT::u8)) return DT::i16;
  if ((a == DT::f16 && b == DT::bf16) || (a == DT::bf16 && b == DT::f16)) return DT::f32;
  return rank(a) >= rank(b) ? a : b;
}

DT from_scalar_type(int64_t c) {
  // c10::ScalarType: Byte 0, Char 1, Short 2, Int 3, Long 4, Half 5, Float 6,
  // Double 7, ..., Bool 11, BFloat16 15.
  switch (c) {
    case 0:
      return DT::u8;
    case 1:
      return DT::i8;
    case 2:
      return DT::i16;
    case 3:
      return DT::i32;
    case 4:
      return DT::i64;
    case 5:
      return DT::f16;
    case 6:
      return DT::f32;
    case 7:
      return DT::f64;
    case 11:
      return DT::b8;
    case 15:
      return DT::bf16;
    default:
      return DT::unknown;
  }
}

void ResultType::tensor(const TensorRef& t) {
  const DT d = dt_of(t.dtype());
  if (t.dim() == 0)
    zero_ = combine(zero_, d);
  else
    dim_ = combine(dim_, d);
}

void ResultType::scalar_value(const NpubValue& v) {
  if (v.tag == NPUB_VALUE_DOUBLE)
    scalar_float();
  else if (v.tag == NPUB_VALUE_BOOL)
    scalar_bool();
  else
    scalar_int();
}

DT ResultType::result() const {
  DT r = dim_;
  if (zero_ != DT::unknown && (r == DT::unknown || category(zero_) > category(r))) r = combine(r, zero_);
  if (wrapped_ != DT::unknown && (r == DT::unknown || category(wrapped_) > category(r))) {
    // A wrapped int/float joins at its category's default (int64 / float32).
    r = r == DT::unknown ? wrapped_ : promote(r, wrapped_);
  }
  return r;
}

std::string shape_str(const Shape& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

int64_t numel_of(const Shape& s) {
  int64_t n = 1;
  for (int64_t v : s) n *= v;
  return n;
}

Shape broadcast(const Call& call, const Shape& a, const Shape& b) {
  const size_t n = std::max(a.size(), b.size());
  Shape out(n);
  for (size_t i = 0; i < n; ++i) {
    const int64_t sa = i + a.size() >= n ? a[i + a.size() - n] : 1;
    const int64_t sb = i + b.size() >= n ? b[i + b.size() - n] : 1;
    if (sa != sb && sa != 1 && sb != 1)
      call.fail(NPUB_ERR_INVALID_ARGUMENT, "the size of tensor a (" + std::to_string(sa) +
                                               ") must match the size of tensor b (" + std::to_string(sb) +
                                               ") at non-singleton dimension " + std::to_string(i));
    out[i] = sa == 1 ? sb : sa;
  }
  return out;
}

int64_t wrap_dim(const Call& call, int64_t dim, int64_t ndim, const char* arg) {
  const int64_t n = std::max<int64_t>(ndim, 1);
  if (dim < -n || dim >= n)
    call.fail(NPUB_ERR_INVALID_ARGUMENT, std::string(arg) +
                                             ": dimension out of range (expected to be in range of [" +
                                             std::to_string(-n) + ", " + std::to_string(n - 1) +
                                             "], but got " + std::to_string(dim) + ")");
  return dim < 0 ? dim + n : dim;
}

void check_out(const Call& call, const TensorRef& out, const Shape& shape, const char* name) {
  if (out.sizes() != shape)
    call.fail(NPUB_ERR_INVALID_ARGUMENT, std::string(name) + ": expected shape " + shape_str(shape) +
                                             " but found " + shape_str(out.sizes()));
}

void require_f32(const Call& call, const TensorRef& t, const char* name) {
  if (t.defined() && dt_of(t.dtype()) != DT::f32)
    call.fail(NPUB_ERR_UNSUPPORTED,
              std::string(name) + ": expected float32 but found " + dt_name(dt_of(t.dtype())));
}

void channel_sums(const float* m, int64_t n, int64_t channels, int64_t plane, float* out) {
  for (int64_t c = 0; c < channels; ++c) {
    double s = 0;
    for (int64_t i = 0; i < n; ++i)
      for (int64_t k = 0; k < plane; ++k) s += m[(i * channels + c) * plane + k];
    out[c] = static_cast<float>(s);
  }
}

int64_t pair_at(const std::vector<int64_t>& v, size_t i, const Call& call, const char* name) {
  if (v.size() == 1) return v[0];
  if (v.size() != 2)
    call.fail(NPUB_ERR_INVALID_ARGUMENT,
              std::string(name) + ": expected 1 or 2 values but found " + std::to_string(v.size()));
  return v[i];
}

DT dtype_arg(const Call& call, int32_t i, DT fallback) {
  if (call.is_none(i)) return fallback;
  const DT d = from_scalar_type(call.int_arg(i));
  if (d == DT::unknown)
    call.fail(NPUB_ERR_UNSUPPORTED, "unsupported dtype argument " + std::to_string(call.int_arg(i)));
  return d;
}

DimView dim_view(const TensorRef& t, int64_t dim) {
  DimView v;
  for (int32_t i = 0; i < t.dim(); ++i) {
    if (i < dim)
      v.outer *= t.size(i);
    else if (i == dim)
      v.size = t.size(i);
    else
      v.inner *= t.size(i);
  }
  return v;
}

void Iter::add(const TensorRef& t) {
  const int i = nops++;
  data[i] = t.data<char>();
  dt[i] = dt_of(t.dtype());
  const int64_t es = dt_size(dt[i]);
  const size_t n = shape.size();
  strides[i].assign(n, 0);
  for (int32_t d = 0; d < t.dim(); ++d) {
    const size_t o = n - static_cast<size_t>(t.dim()) + static_cast<size_t>(d);
    strides[i][o] = t.size(d) == 1 ? 0 : t.stride(d) * es;
  }
}

bool Iter::contiguous() const {
  for (int i = 0; i < nops; ++i) {
    const int64_t es = dt_size(dt[i]);
    int64_t expected = es;
    for (size_t d = shape.size(); d-- > 0;) {
      if (shape[d] != 1 && strides[i][d] != expected) return false;
      expected *= shape[d];
    }
  }
  return true;
}

Iter make_iter(const TensorRef& out, std::initializer_list<TensorRef> inputs) {
  Iter it;
  it.shape = out.sizes();
  it.add(out);
  for (const TensorRef& t : inputs) it.add(t);
  return it;
}

std::vector<bool> reduce_mask(const Call& call, const std::vector<int64_t>& dims, int64_t ndim) {
  std::vector<bool> mask(static_cast<size_t>(ndim), dims.empty());
  for (int64_t d : dims) {
    const int64_t w = wrap_dim(call, d, ndim);
    if (ndim == 0) continue;
    if (mask[static_cast<size_t>(w)])
      call.fail(NPUB_ERR_INVALID_ARGUMENT,
                "dim " + std::to_string(w) + " appears multiple times in the list of dims");
    mask[static_cast<size_t>(w)] = true;
  }
  return mask;
}

Shape reduced_shape(const Shape& in, const std::vector<bool>& mask, bool keepdim) {
  Shape out;
  for (size_t d = 0; d < in.size(); ++d) {
    if (!mask[d])
      out.push_back(in[d]);
    else if (keepdim)
      out.push_back(1);
  }
  return out;
}

namespace {
std::vector<int64_t> enumerate_offsets(const std::vector<int64_t>& sizes,
                                       const std::vector<int64_t>& strides) {
  std::vector<int64_t> offs{0};
  for (size_t d = 0; d < sizes.size(); ++d) {
    std::vector<int64_t> next;
    next.reserve(offs.size() * static_cast<size_t>(std::max<int64_t>(sizes[d], 0)));
    for (int64_t o : offs)
      for (int64_t i = 0; i < sizes[d]; ++i) next.push_back(o + i * strides[d]);
    offs.swap(next);
  }
  return offs;
}
}  // namespace

Plan make_plan(const TensorRef& t, const std::vector<bool>& mask) {
  Plan p;
  const int64_t es = dt_size(dt_of(t.dtype()));
  std::vector<int64_t> ks, kst, rs, rst;
  for (int32_t d = 0; d < t.dim(); ++d) {
    if (mask[static_cast<size_t>(d)]) {
      // Merge with the previous reduced dim when memory-adjacent.
      if (!rs.empty() && rst.back() == t.size(d) * t.stride(d) * es && t.size(d) != 0) {
        rs.back() *= t.size(d);
        rst.back() = t.stride(d) * es;
      } else if (t.size(d) != 1 || rs.empty()) {
        rs.push_back(t.size(d));
        rst.push_back(t.stride(d) * es);
      }
    } else {
      ks.push_back(t.size(d));
      kst.push_back(t.stride(d) * es);
    }
  }
  if (!rs.empty()) {
    p.run_len = rs.back();
    p.run_stride = rst.back();
    rs.pop_back();
    rst.pop_back();
  }
  p.run_offsets = enumerate_offsets(rs, rst);
  p.out_offsets = enumerate_offsets(ks, kst);
  p.outputs = static_cast<int64_t>(p.out_offsets.size());
  return p;
}

// Byte offsets of a tensor's elements in row-major order.
std::vector<int64_t> element_offsets(const TensorRef& t) {
  const int64_t es = dt_size(dt_of(t.dtype()));
  std::vector<int64_t> strides;
  for (int32_t d = 0; d < t.dim(); ++d) strides.push_back(t.stride(d) * es);
  return enumerate_offsets(t.sizes(), strides);
}

std::vector<DLDataType> dtypes_all() { return {std::begin(kDtypeOfDT), std::end(kDtypeOfDT)}; }
std::vector<DLDataType> dtypes_numeric() {  // all but bool, the last
  return {std::begin(kDtypeOfDT), std::begin(kDtypeOfDT) + static_cast<int>(DT::b8)};
}
std::vector<DLDataType> dtypes_floating() {  // the first four
  return {std::begin(kDtypeOfDT), std::begin(kDtypeOfDT) + static_cast<int>(DT::i64)};
}

namespace {

// Note [bfloat16 rounding without vcvtneps2bf16]
// AVX512-BF16's vcvtneps2bf16 rounds in one instruction but treats a
// denormal input as zero: exp(-88) in bfloat16 came back 0 instead of
// 6.1e-39, and 1e-39 + 0 came back 0. ATen rounds with integer arithmetic
// and keeps denormals, so these loops do too (round half to even on the
// bits, NaN made quiet); the compiler vectorises them, and the loops are
// memory-bound either way.
inline uint16_t round_to_bf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  const uint32_t rounded = (bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16;
  const bool nan = (bits & 0x7fffffffu) > 0x7f800000u;
  return static_cast<uint16_t>(nan ? ((bits >> 16) | 0x40u) : rounded);
}

// Half-type elements are 2-byte aligned in device memory (allocations are
// 512-byte aligned and offsets are whole elements), so they are read and
// written in place as uint16_t. float16 converts with F16C from the AVX2
// level up.
struct ToFloat {
  template <Isa kIsa>
  static PLUGIN_KERNELS_INLINE void run(const char* src, DT dt, float* dst, int64_t n) {
    const auto* h = reinterpret_cast<const uint16_t*>(src);
    if (dt == DT::bf16) {
      for (int64_t i = 0; i < n; ++i) dst[i] = BF16::load(h[i]);
    } else if constexpr (kIsa >= Isa::kAvx2) {
      plugin_kernels::f16_to_f32_f16c(h, dst, n);
    } else {
      for (int64_t i = 0; i < n; ++i) dst[i] = F16::load(h[i]);
    }
  }
};

struct FromFloat {
  template <Isa kIsa>
  static PLUGIN_KERNELS_INLINE void run(const float* src, char* dst, DT dt, int64_t n) {
    auto* h = reinterpret_cast<uint16_t*>(dst);
    if (dt == DT::bf16) {
      for (int64_t i = 0; i < n; ++i) h[i] = round_to_bf16(src[i]);
    } else if constexpr (kIsa >= Isa::kAvx2) {
      plugin_kernels::f32_to_f16_f16c(src, h, n);
    } else {
      for (int64_t i = 0; i < n; ++i) h[i] = F16::store(src[i]);
    }
  }
};

// One loop per op, so that each vectorises.
PLUGIN_KERNELS_INLINE void bf16_binary_body(HalfBinaryOp op, float alpha, const uint16_t* a,
                                            const uint16_t* b, uint16_t* o, int64_t n) {
  using npub::sdk::bf16_to_float;
  switch (op) {
    case HalfBinaryOp::kAdd:
      for (int64_t i = 0; i < n; ++i) o[i] = round_to_bf16(bf16_to_float(a[i]) + bf16_to_float(b[i]));
      break;
    case HalfBinaryOp::kMul:
      for (int64_t i = 0; i < n; ++i) o[i] = round_to_bf16(bf16_to_float(a[i]) * bf16_to_float(b[i]));
      break;
    case HalfBinaryOp::kAddScaled:
      for (int64_t i = 0; i < n; ++i) o[i] = round_to_bf16(bf16_to_float(a[i]) + alpha * bf16_to_float(b[i]));
      break;
  }
}

// Eight rows per pass over acc, added to each element in row order (the
// same sums as a row at a time): the accumulators are loaded and stored
// once per eight rows rather than once per row, which bounded the loop.
template <typename S>
PLUGIN_KERNELS_INLINE void add_rows_body(double* __restrict acc, const S* __restrict x, int64_t rows,
                                         int64_t ld, int64_t n) {
  int64_t r = 0;
  for (; r + 8 <= rows; r += 8) {
    const S* __restrict p = x + r * ld;
    for (int64_t i = 0; i < n; ++i) {
      double a = acc[i];
      a += static_cast<double>(p[i]);
      a += static_cast<double>(p[ld + i]);
      a += static_cast<double>(p[2 * ld + i]);
      a += static_cast<double>(p[3 * ld + i]);
      a += static_cast<double>(p[4 * ld + i]);
      a += static_cast<double>(p[5 * ld + i]);
      a += static_cast<double>(p[6 * ld + i]);
      a += static_cast<double>(p[7 * ld + i]);
      acc[i] = a;
    }
  }
  for (; r < rows; ++r)
    for (int64_t i = 0; i < n; ++i) acc[i] += static_cast<double>(x[r * ld + i]);
}
PLUGIN_KERNELS_INLINE void add_rows_f32_body(double* acc, const float* x, int64_t rows, int64_t ld,
                                             int64_t n) {
  add_rows_body(acc, x, rows, ld, n);
}
PLUGIN_KERNELS_INLINE void add_rows_f64_body(double* acc, const double* x, int64_t rows, int64_t ld,
                                             int64_t n) {
  add_rows_body(acc, x, rows, ld, n);
}

PLUGIN_KERNELS_ISA_DISPATCH(void, add_rows_f32, add_rows_f32_body,
                            (double* acc, const float* x, int64_t rows, int64_t ld, int64_t n),
                            (acc, x, rows, ld, n))
PLUGIN_KERNELS_ISA_DISPATCH(void, add_rows_f64, add_rows_f64_body,
                            (double* acc, const double* x, int64_t rows, int64_t ld, int64_t n),
                            (acc, x, rows, ld, n))

// sum(x[0..n)) in 32 double partial sums: four vectors of lanes, four add
// chains side by side (one chain of 8 ran at an add's latency, 2.7x ATen's
// time for a mean over rows of 256). The lanes are then combined by halves
// (lane l with lane l + 16, then l + 8, ...), vector adds in a fixed order:
// combined one after another they were a chain of 32 dependent adds, longer
// than the loop itself over a row of 256 (a sum over the last dim of
// [4096, 256] took 2.2x ATen's time).
PLUGIN_KERNELS_INLINE double sum_f32_body(const float* x, int64_t n) {
  constexpr int kLanes = 32;
  double acc[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int l = 0; l < kLanes; ++l) acc[l] += static_cast<double>(x[i + l]);
  double total = sum_lanes_by_halves(acc);
  for (; i < n; ++i) total += static_cast<double>(x[i]);
  return total;
}
PLUGIN_KERNELS_ISA_DISPATCH(double, sum_f32, sum_f32_body, (const float* x, int64_t n), (x, n))

// out[r] = sum_f32_body(x + r * ld, n) for r < rows: one dispatch for a block
// of short rows, not one a row.
PLUGIN_KERNELS_INLINE void sum_rows_f32_body(const float* x, int64_t rows, int64_t ld, int64_t n,
                                             double* out) {
  for (int64_t r = 0; r < rows; ++r) out[r] = sum_f32_body(x + r * ld, n);
}
PLUGIN_KERNELS_ISA_DISPATCH(void, sum_rows_f32, sum_rows_f32_body,
                            (const float* x, int64_t rows, int64_t ld, int64_t n, double* out),
                            (x, rows, ld, n, out))

}  // namespace

double sum_f32_to_f64(const float* x, int64_t n) { return sum_f32(x, n); }
void row_sums_f32_to_f64(const float* x, int64_t rows, int64_t ld, int64_t n, double* out) {
  sum_rows_f32(x, rows, ld, n, out);
}

void add_rows_to_f64(double* acc, const char* x, DT dt, int64_t rows, int64_t ld, int64_t n) {
  switch (dt) {
    case DT::f32:
      return add_rows_f32(acc, reinterpret_cast<const float*>(x), rows, ld, n);
    case DT::f64:
      return add_rows_f64(acc, reinterpret_cast<const double*>(x), rows, ld, n);
    case DT::f16:
    case DT::bf16: {
      constexpr int64_t B = 512;
      float tmp[B];
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t j = 0; j < n; j += B) {
          const int64_t m = std::min(B, n - j);
          half_block_to_float(x + (r * ld + j) * 2, dt, tmp, m);
          add_rows_f32(acc + j, tmp, 1, m, m);
        }
      return;
    }
    default: {
      const int64_t es = dt_size(dt);
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t i = 0; i < n; ++i) acc[i] += load<double>(x + (r * ld + i) * es, dt);
    }
  }
}

void half_block_to_float(const char* src, DT dt, float* dst, int64_t n) {
  run_at_kernel_isa<ToFloat>(src, dt, dst, n);
}
void float_block_to_half(const float* src, char* dst, DT dt, int64_t n) {
  run_at_kernel_isa<FromFloat>(src, dst, dt, n);
}
PLUGIN_KERNELS_ISA_DISPATCH(void, bf16_binary_contiguous, bf16_binary_body,
                            (HalfBinaryOp op, float alpha, const uint16_t* a, const uint16_t* b, uint16_t* o,
                             int64_t n),
                            (op, alpha, a, b, o, n))

}  // namespace cann_like

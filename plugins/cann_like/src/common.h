// cann_like's building blocks: dtypes, ATen's type promotion, and a strided
// broadcasting loop engine (a small TensorIterator). Built on the SDK only.
#pragma once

#include <plugin_kernels/float_access.h>
#include <plugin_kernels/isa.h>
#include <plugin_kernels/vec_math.h>
#include <npubridge/plugin_sdk.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace cann_like {

using npub::sdk::Call;
using npub::sdk::TensorRef;

// ---------------------------------------------------------------------------
// dtypes
// ---------------------------------------------------------------------------

// cann_like's index into the SDK's dtype table (npub::sdk::kFloat32, ...),
// to switch on: the DLPack dtype, name and size of each are the SDK's.
enum class DT : uint8_t { f32, f64, f16, bf16, i64, i32, i16, i8, u8, b8, unknown };

// The SDK dtype of each DT but unknown, in DT's order.
inline constexpr DLDataType kDtypeOfDT[] = {
    npub::sdk::kFloat32, npub::sdk::kFloat64, npub::sdk::kFloat16, npub::sdk::kBFloat16, npub::sdk::kInt64,
    npub::sdk::kInt32,   npub::sdk::kInt16,   npub::sdk::kInt8,    npub::sdk::kUInt8,    npub::sdk::kBool};
static_assert(sizeof kDtypeOfDT / sizeof kDtypeOfDT[0] == static_cast<size_t>(DT::unknown));

inline DT dt_of(DLDataType t) {
  for (int i = 0; i < static_cast<int>(DT::unknown); ++i)
    if (npub::sdk::same_dtype(t, kDtypeOfDT[i])) return static_cast<DT>(i);
  return DT::unknown;
}
inline DLDataType to_dl(DT t) {
  return t == DT::unknown ? npub::sdk::kBool : kDtypeOfDT[static_cast<int>(t)];
}
inline std::string dt_name(DT t) { return t == DT::unknown ? "unknown" : npub::sdk::dtype_name(to_dl(t)); }
inline int64_t dt_size(DT t) { return to_dl(t).bits / 8; }
inline bool is_floating(DT t) { return t == DT::f32 || t == DT::f64 || t == DT::f16 || t == DT::bf16; }
inline bool is_integral(DT t, bool include_bool) {
  return t == DT::i64 || t == DT::i32 || t == DT::i16 || t == DT::i8 || t == DT::u8 ||
         (include_bool && t == DT::b8);
}
inline int category(DT t) { return t == DT::b8 ? 0 : is_floating(t) ? 2 : 1; }

// torch.promote_types for the real dtypes.
DT promote(DT a, DT b);
// torch.can_cast(from, to): no floating -> integral, no non-bool -> bool.
inline bool can_cast(DT from, DT to) {
  if (is_floating(from) && is_integral(to, true)) return false;
  if (from != DT::b8 && to == DT::b8) return false;
  return true;
}

// The dtype for a value of ScalarType code `c` (c10::ScalarType numbering).
DT from_scalar_type(int64_t c);

// ATen's result_type over tensors and scalars: dimensioned tensors decide,
// zero-dim tensors and scalars only when of a higher category (bool <
// integral < floating); a floating scalar counts as float32 (the default
// dtype).
class ResultType {
 public:
  void tensor(const TensorRef& t);
  void scalar_int() { wrapped_ = combine(wrapped_, DT::i64); }
  void scalar_float() { wrapped_ = combine(wrapped_, DT::f32); }
  void scalar_bool() { wrapped_ = combine(wrapped_, DT::b8); }
  void scalar_value(const NpubValue& v);
  DT result() const;

 private:
  static DT combine(DT a, DT b) { return a == DT::unknown ? b : promote(a, b); }
  DT dim_ = DT::unknown, zero_ = DT::unknown, wrapped_ = DT::unknown;
};

// ---------------------------------------------------------------------------
// element access with conversion (compute type T from any dtype)
// ---------------------------------------------------------------------------

template <typename T>
inline T from_float(float v) {
  if constexpr (std::is_same_v<T, bool>)
    return v != 0.0f;
  else
    return static_cast<T>(v);
}

template <typename T>
inline T load(const char* p, DT dt) {
  switch (dt) {
    case DT::f32: {
      float v;
      std::memcpy(&v, p, 4);
      if constexpr (std::is_same_v<T, bool>)
        return v != 0;
      else
        return static_cast<T>(v);
    }
    case DT::f64: {
      double v;
      std::memcpy(&v, p, 8);
      if constexpr (std::is_same_v<T, bool>)
        return v != 0;
      else
        return static_cast<T>(v);
    }
    case DT::f16: {
      uint16_t h;
      std::memcpy(&h, p, 2);
      return from_float<T>(npub::sdk::half_to_float(h));
    }
    case DT::bf16: {
      uint16_t h;
      std::memcpy(&h, p, 2);
      return from_float<T>(npub::sdk::bf16_to_float(h));
    }
    case DT::i64: {
      int64_t v;
      std::memcpy(&v, p, 8);
      if constexpr (std::is_same_v<T, bool>)
        return v != 0;
      else
        return static_cast<T>(v);
    }
    case DT::i32: {
      int32_t v;
      std::memcpy(&v, p, 4);
      if constexpr (std::is_same_v<T, bool>)
        return v != 0;
      else
        return static_cast<T>(v);
    }
    case DT::i16: {
      int16_t v;
      std::memcpy(&v, p, 2);
      if constexpr (std::is_same_v<T, bool>)
        return v != 0;
      else
        return static_cast<T>(v);
    }
    case DT::i8: {
      int8_t v;
      std::memcpy(&v, p, 1);
      if constexpr (std::is_same_v<T, bool>)
        return v != 0;
      else
        return static_cast<T>(v);
    }
    case DT::u8: {
      uint8_t v;
      std::memcpy(&v, p, 1);
      if constexpr (std::is_same_v<T, bool>)
        return v != 0;
      else
        return static_cast<T>(v);
    }
    default:
      return static_cast<T>(*reinterpret_cast<const uint8_t*>(p) != 0);
  }
}

template <typename T>
inline void store(char* p, DT dt, T v) {
  switch (dt) {
    case DT::f32: {
      float x = static_cast<float>(v);
      std::memcpy(p, &x, 4);
      break;
    }
    case DT::f64: {
      double x = static_cast<double>(v);
      std::memcpy(p, &x, 8);
      break;
    }
    case DT::f16: {
      uint16_t h = npub::sdk::float_to_half(static_cast<float>(v));
      std::memcpy(p, &h, 2);
      break;
    }
    case DT::bf16: {
      uint16_t h = npub::sdk::float_to_bf16(static_cast<float>(v));
      std::memcpy(p, &h, 2);
      break;
    }
    case DT::i64: {
      int64_t x = static_cast<int64_t>(v);
      std::memcpy(p, &x, 8);
      break;
    }
    case DT::i32: {
      int32_t x = static_cast<int32_t>(v);
      std::memcpy(p, &x, 4);
      break;
    }
    case DT::i16: {
      int16_t x = static_cast<int16_t>(v);
      std::memcpy(p, &x, 2);
      break;
    }
    case DT::i8: {
      int8_t x = static_cast<int8_t>(v);
      std::memcpy(p, &x, 1);
      break;
    }
    case DT::u8: {
      uint8_t x = static_cast<uint8_t>(v);
      std::memcpy(p, &x, 1);
      break;
    }
    default: {
      uint8_t x = v != T(0) ? 1 : 0;
      std::memcpy(p, &x, 1);
      break;
    }
  }
}

// The C++ type a dtype computes in (fp32 for the half types).
template <DT D>
struct ComputeOf;
template <>
struct ComputeOf<DT::f32> {
  using type = float;
};
template <>
struct ComputeOf<DT::f64> {
  using type = double;
};
template <>
struct ComputeOf<DT::f16> {
  using type = float;
};
template <>
struct ComputeOf<DT::bf16> {
  using type = float;
};
template <>
struct ComputeOf<DT::i64> {
  using type = int64_t;
};
template <>
struct ComputeOf<DT::i32> {
  using type = int32_t;
};
template <>
struct ComputeOf<DT::i16> {
  using type = int16_t;
};
template <>
struct ComputeOf<DT::i8> {
  using type = int8_t;
};
template <>
struct ComputeOf<DT::u8> {
  using type = uint8_t;
};
template <>
struct ComputeOf<DT::b8> {
  using type = bool;
};

// Calls f(T{}) with T the compute type of dt.
template <typename F>
inline void visit_compute(DT dt, F&& f) {
  switch (dt) {
    case DT::f32:
    case DT::f16:
    case DT::bf16:
      return f(float{});
    case DT::f64:
      return f(double{});
    case DT::i64:
      return f(int64_t{});
    case DT::i32:
      return f(int32_t{});
    case DT::i16:
      return f(int16_t{});
    case DT::i8:
      return f(int8_t{});
    case DT::u8:
      return f(uint8_t{});
    case DT::b8:
      return f(bool{});
    default:
      throw npub::sdk::Error(NPUB_ERR_UNSUPPORTED, "unsupported dtype");
  }
}

// Vectorisable float32 exp, tanh, erf, gelu and sigmoid (plugin_kernels'
// vec_math.h, shared with the other in-tree plugins).
using plugin_kernels::exp_nonpositive;
using plugin_kernels::fast_erf;
using plugin_kernels::fast_exp;
using plugin_kernels::fast_gelu;
using plugin_kernels::fast_tanh;
using plugin_kernels::gelu_cdf;
using plugin_kernels::sigmoid;

// The instruction-set levels the loops are compiled for
// (plugin_kernels/isa.h), and the element structs of the floating dtypes
// and the lane sums of the partial-sum loops (plugin_kernels/float_access.h).
using plugin_kernels::BF16;
using plugin_kernels::F16;
using plugin_kernels::F32;
using plugin_kernels::F64;
using plugin_kernels::Isa;
using plugin_kernels::kernel_isa;
using plugin_kernels::run_at_kernel_isa;
using plugin_kernels::sum_lanes_by_halves;

// ---------------------------------------------------------------------------
// shapes
// ---------------------------------------------------------------------------

using Shape = std::vector<int64_t>;

std::string shape_str(const Shape& s);
// Broadcast shapes (numpy rules); fails naming the op and the sizes.
Shape broadcast(const Call& call, const Shape& a, const Shape& b);
// Wraps a dim index into [0, ndim); ndim 0 behaves as 1 (as ATen).
int64_t wrap_dim(const Call& call, int64_t dim, int64_t ndim, const char* arg = "dim");
// Checks a preallocated out tensor: dtype and shape (ATen resizes outs; a
// host passes them sized).
void check_out(const Call& call, const TensorRef& out, const Shape& shape, const char* name = "out");
// Declines (NPUB_ERR_UNSUPPORTED) a defined tensor argument `name` that is
// not float32: the kernels that compute in float32 only (half types reach
// them converted by the dispatcher, others go to the host's fallback).
void require_f32(const Call& call, const TensorRef& t, const char* name);

// out[c] = the sum over i < n and k < plane of m[(i * channels + c) * plane + k], in
// double: a bias's gradient (plane 1: the column sums of an [n, channels] matrix).
void channel_sums(const float* m, int64_t n, int64_t channels, int64_t plane, float* out);
int64_t numel_of(const Shape& s);
// Element i of an int[2] argument given as one or two values (stride=2 is [2, 2]).
int64_t pair_at(const std::vector<int64_t>& v, size_t i, const Call& call, const char* name);
// A ScalarType? argument; `fallback` when None.
DT dtype_arg(const Call& call, int32_t i, DT fallback);

// [outer, size(dim), inner] view of a contiguous tensor.
struct DimView {
  int64_t outer = 1, size = 1, inner = 1;
};
DimView dim_view(const TensorRef& t, int64_t dim);

// ---------------------------------------------------------------------------
// the loop engine
// ---------------------------------------------------------------------------

// Up to 4 operands viewed with the output's shape (broadcast strides of 0).
// Operand 0 is the output.
struct Iter {
  Shape shape;
  int nops = 0;
  char* data[4] = {};
  DT dt[4] = {};
  std::vector<int64_t> strides[4];  // in bytes, per dim

  void add(const TensorRef& t);  // broadcast to shape
  int64_t numel() const { return numel_of(shape); }
  // True when every operand is contiguous with the output's layout and has
  // the output's full shape (no broadcasting).
  bool contiguous() const;
  bool all_dtype(DT d) const {
    for (int i = 0; i < nops; ++i)
      if (dt[i] != d) return false;
    return true;
  }
};

Iter make_iter(const TensorRef& out, std::initializer_list<TensorRef> inputs);

// Runs rows(ptrs, byte_strides, n, count, row_strides) over the iterator:
// `count` runs of n elements, run r's operand i starting at ptrs[i] + r *
// row_strides[i] and stepping byte_strides[i] along it. A run is a piece of
// a row of the coalesced inner dims (Note [Rows are the coalesced inner
// dims]); the runs of one call are consecutive rows along the next dim out,
// so a kernel picks its loop once for them (Note [Rows come in batches]).
// Runs are spread over compute threads.
// Dims after the size-1 ones are dropped: each of them has 2 or more
// elements, so a non-empty tensor has fewer than 64 (the element count is
// an int64_t).
constexpr int kMaxIterDims = 64;
template <typename Rows>
void for_each_rows(const Call& call, const Iter& it, Rows&& rows_fn) {
  const int64_t n = it.numel();
  if (n == 0) return;
  if (it.contiguous()) {  // one flat run, split in chunks
    int64_t es[4], zero[4] = {};
    for (int i = 0; i < it.nops; ++i) es[i] = dt_size(it.dt[i]);
    call.parallel_for(0, n, 1 << 14, [&](int64_t b, int64_t e) {
      char* p[4];
      for (int i = 0; i < it.nops; ++i) p[i] = it.data[i] + b * es[i];
      rows_fn(p, es, e - b, int64_t{1}, zero);
    });
    return;
  }
  // Note [Rows are the coalesced inner dims]
  // A row is the innermost dim merged with every outer dim that all operands
  // walk on from it (stride[d] == stride[d+1] * size[d+1]), size-1 dims
  // dropped first: q * cos[1, 1, S, D] runs B*N rows of S*D elements, not
  // B*N*S rows of D (rows of 8 elements made a rotary embedding's multiply
  // several times slower than ATen's coalescing TensorIterator). The outer
  // dims are merged with each other by the same test: a slice of the last
  // dim (rotate_half's x[..., 32:] of [4,4,128,64]) walks 2048 rows of one
  // outer dim, not of three.
  int64_t shape[kMaxIterDims], strides[4][kMaxIterDims];
  int kd = 0;
  for (size_t d = 0; d < it.shape.size(); ++d) {
    if (it.shape[d] == 1) continue;
    shape[kd] = it.shape[d];
    for (int i = 0; i < it.nops; ++i) strides[i][kd] = it.strides[i][d];
    ++kd;
  }
  // Note [Rows follow the operands' layout]
  // The dims are ordered by stride, largest outermost, as ATen's
  // TensorIterator orders them: by the output's strides, an operand after
  // it deciding where the output's do not (equal strides; a stride of 0, a
  // broadcast, decides nothing), the given order where none decides. A
  // transposed operand's result takes its layout (x.transpose(-1, -2) * s
  // is laid out as x), and walking it along the last dim stepped 1 KB an
  // element: 19x ATen's time for a [4, 4, 64, 128] scale. Every caller maps
  // elements independently, so the order of the walk is free, but for one
  // case: an output with a stride of 0 (an expanded self that fill_ or
  // masked_fill_ write, which ATen allows) has several elements in one
  // location, and a read-modify-write of it (masked_fill_: out = m ? v :
  // self) must see the writes before it. Such a walk keeps the given order
  // and runs on the calling thread alone, as ATen's serial loop does.
  bool out_overlaps = false;
  for (int d = 0; d < kd; ++d) out_overlaps = out_overlaps || strides[0][d] == 0;
  for (int d = 1; d < kd && !out_overlaps; ++d) {
    for (int e = d; e > 0; --e) {
      int order = 0;  // > 0: dim e belongs outside dim e - 1
      for (int i = 0; i < it.nops && order == 0; ++i) {
        const int64_t outer = strides[i][e - 1], inner = strides[i][e];
        if (outer == 0 || inner == 0 || outer == inner) continue;
        order = inner > outer ? 1 : -1;
      }
      if (order <= 0) break;
      std::swap(shape[e - 1], shape[e]);
      for (int i = 0; i < it.nops; ++i) std::swap(strides[i][e - 1], strides[i][e]);
    }
  }
  // One pass from the inside out: dim d is merged into dim d + 1 (which
  // holds every dim merged into it so far) when all operands allow it.
  for (int d = kd - 2; d >= 0; --d) {
    bool merge = true;
    for (int i = 0; i < it.nops && merge; ++i) merge = strides[i][d] == strides[i][d + 1] * shape[d + 1];
    if (!merge) continue;
    shape[d] *= shape[d + 1];
    for (int i = 0; i < it.nops; ++i) strides[i][d] = strides[i][d + 1];
    for (int e = d + 1; e + 1 < kd; ++e) {
      shape[e] = shape[e + 1];
      for (int i = 0; i < it.nops; ++i) strides[i][e] = strides[i][e + 1];
    }
    --kd;
  }
  const int64_t inner = kd > 0 ? shape[kd - 1] : 1;
  const int64_t rows = n / inner;
  int64_t inner_stride[4], row_stride[4] = {};
  for (int i = 0; i < it.nops; ++i) {
    inner_stride[i] = kd > 0 ? strides[i][kd - 1] : 0;
    if (kd > 1) row_stride[i] = strides[i][kd - 2];
  }
  // A long row is cut in pieces of kPiece elements, so that the threads
  // share even one row (x * 2.0 over a contiguous x is a single row).
  constexpr int64_t kPiece = int64_t{1} << 14;
  const int64_t pieces = (inner + kPiece - 1) / kPiece;
  const int64_t piece_len = std::min(inner, kPiece);
  call.parallel_for(
      0, rows * pieces,
      out_overlaps ? rows * pieces : std::max<int64_t>(1, kPiece / std::max<int64_t>(piece_len, 1)),
      [&](int64_t tb, int64_t te) {
        // The first row's position by division, the next
        // ones' by stepping the outer index.
        int64_t idx[kMaxIterDims];
        char* p0[4];
        for (int i = 0; i < it.nops; ++i) p0[i] = it.data[i];
        int64_t rem = tb / pieces, piece = tb % pieces;
        for (int d = kd - 2; d >= 0; --d) {
          idx[d] = rem % shape[d];
          rem /= shape[d];
          for (int i = 0; i < it.nops; ++i) p0[i] += idx[d] * strides[i][d];
        }
        for (int64_t t = tb; t < te;) {
          if (pieces == 1 && kd > 1) {
            // Note [Rows come in batches]
            // The rows left along dim kd - 2 (up to the
            // range's end) go in one call: a rotary
            // embedding's [8,4,64,8] view is 2048 rows of 8,
            // and a call per row (its loop chosen per row)
            // took 3x ATen's time.
            const int64_t count = std::min(shape[kd - 2] - idx[kd - 2], te - t);
            char* p[4];  // the callback's copy: p0 is the walk's position
            for (int i = 0; i < it.nops; ++i) p[i] = p0[i];
            rows_fn(p, inner_stride, inner, count, row_stride);
            t += count;
            idx[kd - 2] += count;
            for (int i = 0; i < it.nops; ++i) p0[i] += count * row_stride[i];
            if (idx[kd - 2] < shape[kd - 2]) continue;
            for (int i = 0; i < it.nops; ++i) p0[i] -= shape[kd - 2] * row_stride[i];
            idx[kd - 2] = 0;
            for (int d = kd - 3; d >= 0; --d) {
              for (int i = 0; i < it.nops; ++i) p0[i] += strides[i][d];
              if (++idx[d] < shape[d]) break;
              for (int i = 0; i < it.nops; ++i) p0[i] -= shape[d] * strides[i][d];
              idx[d] = 0;
            }
            continue;
          }
          const int64_t start = piece * kPiece;
          char* p[4];
          for (int i = 0; i < it.nops; ++i) p[i] = p0[i] + start * inner_stride[i];
          rows_fn(p, inner_stride, std::min(kPiece, inner - start), int64_t{1}, row_stride);
          ++t;
          if (++piece < pieces) continue;
          piece = 0;
          for (int d = kd - 2; d >= 0; --d) {
            for (int i = 0; i < it.nops; ++i) p0[i] += strides[i][d];
            if (++idx[d] < shape[d]) break;
            for (int i = 0; i < it.nops; ++i) p0[i] -= shape[d] * strides[i][d];
            idx[d] = 0;
          }
        }
      });
}

// Runs row(ptrs, byte_strides, n) per run of for_each_rows.
template <typename Row>
void for_each_row(const Call& call, const Iter& it, Row&& row) {
  for_each_rows(call, it, [&](char** p, const int64_t* s, int64_t n, int64_t count, const int64_t* rs) {
    char* q[4];
    for (int i = 0; i < it.nops; ++i) q[i] = p[i];
    for (int64_t r = 0; r < count; ++r) {
      row(q, s, n);
      for (int i = 0; i < it.nops; ++i) q[i] += rs[i];
    }
  });
}

// ---------------------------------------------------------------------------
// reductions
// ---------------------------------------------------------------------------

// Dims to reduce: `dims` wrapped and deduplicated; empty = all dims.
std::vector<bool> reduce_mask(const Call& call, const std::vector<int64_t>& dims, int64_t ndim);
Shape reduced_shape(const Shape& in, const std::vector<bool>& mask, bool keepdim);

// For each output element: where its reduced elements are. The reduced dims
// are merged where contiguous; the last one is walked as a run of run_len
// elements spaced run_stride bytes; the others are enumerated in run_offsets.
struct Plan {
  int64_t outputs = 1;
  std::vector<int64_t> out_offsets;  // byte offsets into the input
  std::vector<int64_t> run_offsets;  // byte offsets of runs within one reduction
  int64_t run_len = 1;
  int64_t run_stride = 0;
  int64_t count() const { return static_cast<int64_t>(run_offsets.size()) * run_len; }
};
Plan make_plan(const TensorRef& t, const std::vector<bool>& mask);
// Byte offsets of a tensor's elements in row-major order.
std::vector<int64_t> element_offsets(const TensorRef& t);

// Registration helpers.
std::vector<DLDataType> dtypes_all();       // every real dtype incl. bool
std::vector<DLDataType> dtypes_numeric();   // all but bool
std::vector<DLDataType> dtypes_floating();  // f32 f64 f16 bf16

}  // namespace cann_like

// The elementwise engine: out = fn(inputs...) with broadcasting, ATen type
// promotion, any input/output dtype (cast on load and store), and a typed,
// vectorisable fast path when every operand has the compute dtype and unit
// stride.
#pragma once

#include "common.h"

namespace cann_like {

// A Scalar argument as a 0-d tensor that can join an Iter.
struct ScalarTensor {
  union {
    double d;
    int64_t i;
    uint8_t b;
    float f;
  } value{};
  DLTensor dl{};
  // A float32 scalar (a float32 op's operand in its compute type).
  explicit ScalarTensor(float f) {
    dl.ndim = 0;
    dl.device = DLDevice{static_cast<DLDeviceType>(NPUB_DEVICE_CPU), 0};
    value.f = f;
    dl.dtype = npub::sdk::kFloat32;
    dl.data = &value;
  }
  explicit ScalarTensor(const NpubValue& v) {
    dl.ndim = 0;
    dl.device = DLDevice{static_cast<DLDeviceType>(NPUB_DEVICE_CPU), 0};
    if (v.tag == NPUB_VALUE_DOUBLE) {
      value.d = v.u.d;
      dl.dtype = npub::sdk::kFloat64;
    } else if (v.tag == NPUB_VALUE_BOOL) {
      value.b = v.u.i != 0;
      dl.dtype = npub::sdk::kBool;
    } else {
      value.i = v.u.i;
      dl.dtype = npub::sdk::kInt64;
    }
    dl.data = &value;
  }
  ScalarTensor(const ScalarTensor&) = delete;
  TensorRef ref() { return TensorRef(&dl); }
};

template <typename T>
constexpr DT dt_for() {
  if constexpr (std::is_same_v<T, float>)
    return DT::f32;
  else if constexpr (std::is_same_v<T, double>)
    return DT::f64;
  else if constexpr (std::is_same_v<T, int64_t>)
    return DT::i64;
  else if constexpr (std::is_same_v<T, int32_t>)
    return DT::i32;
  else if constexpr (std::is_same_v<T, int16_t>)
    return DT::i16;
  else if constexpr (std::is_same_v<T, int8_t>)
    return DT::i8;
  else if constexpr (std::is_same_v<T, uint8_t>)
    return DT::u8;
  else
    return DT::b8;
}

// Block conversions between a half type and float32 (vectorisable loops;
// F16C instructions for float16 where the CPU has them).
void half_block_to_float(const char* src, DT dt, float* dst, int64_t n);
void float_block_to_half(const float* src, char* dst, DT dt, int64_t n);
// acc[i] += x[r * ld + i] for r < rows (in order) and i < n, in double, over
// rows of a contiguous array of any dtype (ld in elements; vectorised loops
// for float32 and float64, the half types through float32 blocks): the sums
// a reduction over leading dims builds row by row.
void add_rows_to_f64(double* acc, const char* x, DT dt, int64_t rows, int64_t ld, int64_t n);
// sum(x[0..n)) of float32 elements, accumulated in double (32 partial sums).
double sum_f32_to_f64(const float* x, int64_t n);
// out[r] = sum_f32_to_f64(x + r * ld, n) for r < rows.
void row_sums_f32_to_f64(const float* x, int64_t rows, int64_t ld, int64_t n, double* out);

// out[i] = a[i] + b[i], a[i] * b[i] or a[i] + alpha * b[i] over contiguous
// bfloat16 arrays, in float32 with one rounding, in one pass (no float
// buffers); out may be a or b.
enum class HalfBinaryOp { kAdd, kMul, kAddScaled };
void bf16_binary_contiguous(HalfBinaryOp op, float alpha, const uint16_t* a, const uint16_t* b, uint16_t* o,
                            int64_t n);

// Note [float32 elementwise loops per ISA level]
// The plugin is compiled for baseline x86-64 (SSE2), where a float32 loop is
// 4 lanes wide without FMA: add, mul and div over a 176k-element parameter
// ran at half ATen's speed. The contiguous float32 loops below (a row of
// one, two or three operands, or two with one broadcast along the row) are
// compiled once per ISA level with fn inlined (run_at_kernel_isa,
// plugin_kernels/isa.h).
struct F32Loop1 {
  template <Isa, typename Fn>
  static PLUGIN_KERNELS_INLINE void run(float* o, const float* a, int64_t n, Fn fn) {
    for (int64_t j = 0; j < n; ++j) o[j] = fn(a[j]);
  }
};
struct F32Loop2 {
  template <Isa, typename Fn>
  static PLUGIN_KERNELS_INLINE void run(float* o, const float* a, const float* b, int64_t n, Fn fn) {
    for (int64_t j = 0; j < n; ++j) o[j] = fn(a[j], b[j]);
  }
};
struct F32Loop3 {
  template <Isa, typename Fn>
  static PLUGIN_KERNELS_INLINE void run(float* o, const float* a, const float* b, const float* c, int64_t n,
                                        Fn fn) {
    for (int64_t j = 0; j < n; ++j) o[j] = fn(a[j], b[j], c[j]);
  }
};
// A binary fn with its second operand one value.
struct F32LoopAs {
  template <Isa, typename Fn>
  static PLUGIN_KERNELS_INLINE void run(float* o, const float* a, float b, int64_t n, Fn fn) {
    for (int64_t j = 0; j < n; ++j) o[j] = fn(a[j], b);
  }
};
// A binary fn with its first operand one value.
struct F32LoopSb {
  template <Isa, typename Fn>
  static PLUGIN_KERNELS_INLINE void run(float* o, float a, const float* b, int64_t n, Fn fn) {
    for (int64_t j = 0; j < n; ++j) o[j] = fn(a, b[j]);
  }
};
// `rows` rows of n, operand i's next row rs[i] floats on (Note [Rows come in
// batches]); bcast 1 or 2: input 1 or 2 of a binary fn is one value per row
// (stride 0 along it).
struct F32LoopRows {
  template <Isa, typename Fn>
  static PLUGIN_KERNELS_INLINE void run(float* o, const float* a, const float* b, const float* c, int64_t n,
                                        int64_t rows, const int64_t* rs, int bcast, Fn fn) {
    for (int64_t r = 0; r < rows; ++r) {
      float* orow = o + r * rs[0];
      const float* arow = a + r * rs[1];
      if constexpr (std::is_invocable_v<Fn, float>) {
        for (int64_t j = 0; j < n; ++j) orow[j] = fn(arow[j]);
      } else if constexpr (std::is_invocable_v<Fn, float, float>) {
        const float* brow = b + r * rs[2];
        if (bcast == 2) {
          const float bv = *brow;
          for (int64_t j = 0; j < n; ++j) orow[j] = fn(arow[j], bv);
        } else if (bcast == 1) {
          const float av = *arow;
          for (int64_t j = 0; j < n; ++j) orow[j] = fn(av, brow[j]);
        } else {
          for (int64_t j = 0; j < n; ++j) orow[j] = fn(arow[j], brow[j]);
        }
      } else {
        const float *brow = b + r * rs[2], *crow = c + r * rs[3];
        for (int64_t j = 0; j < n; ++j) orow[j] = fn(arow[j], brow[j], crow[j]);
      }
    }
  }
};

// Runs out = fn(in1, ..., inK) with inputs loaded as T; K (1..3) is fn's
// arity and must equal it.nops - 1. fn returns R, stored with conversion to
// the output dtype; when every operand already has its C++ type and unit
// stride, a plain (vectorisable) loop runs instead.
template <typename T, typename Fn>
void run_elementwise(const Call& call, const Iter& it, Fn fn) {
  constexpr int K = std::is_invocable_v<Fn, T> ? 1 : std::is_invocable_v<Fn, T, T> ? 2 : 3;
  if (it.nops - 1 != K) call.fail(NPUB_ERR_INTERNAL, "elementwise arity mismatch");
  constexpr DT kT = dt_for<T>();
  auto apply = [&fn](const T* v) {
    if constexpr (K == 1)
      return fn(v[0]);
    else if constexpr (K == 2)
      return fn(v[0], v[1]);
    else
      return fn(v[0], v[1], v[2]);
  };
  using R = decltype(apply(static_cast<const T*>(nullptr)));
  constexpr DT kR = dt_for<R>();
  bool typed = it.dt[0] == kR;
  for (int i = 1; i < it.nops; ++i) typed = typed && it.dt[i] == kT;
  // Every operand float16 (or every one bfloat16), computing in float: convert
  // blocks to float32, compute, convert back.
  bool half_typed = false;
  if constexpr (std::is_same_v<T, float> && std::is_same_v<R, float>) {
    half_typed = it.dt[0] == DT::f16 || it.dt[0] == DT::bf16;
    for (int i = 1; i < it.nops; ++i) half_typed = half_typed && it.dt[i] == it.dt[0];
  }
  auto row = [&](char** p, const int64_t* s, int64_t n) {
    if constexpr (std::is_same_v<T, float> && std::is_same_v<R, float>) {
      bool unit2 = half_typed;
      for (int i = 0; i <= K; ++i) unit2 = unit2 && s[i] == 2;
      if (unit2) {
        constexpr int64_t B = 512;
        float in[3][B], res[B];
        for (int64_t j0 = 0; j0 < n; j0 += B) {
          const int64_t m = std::min(B, n - j0);
          for (int i = 0; i < K; ++i) half_block_to_float(p[i + 1] + j0 * 2, it.dt[i + 1], in[i], m);
          if constexpr (K == 1) {
            for (int64_t j = 0; j < m; ++j) res[j] = fn(in[0][j]);
          } else if constexpr (K == 2) {
            for (int64_t j = 0; j < m; ++j) res[j] = fn(in[0][j], in[1][j]);
          } else {
            for (int64_t j = 0; j < m; ++j) res[j] = fn(in[0][j], in[1][j], in[2][j]);
          }
          float_block_to_half(res, p[0] + j0 * 2, it.dt[0], m);
        }
        return;
      }
    }
    bool unit = typed && s[0] == static_cast<int64_t>(sizeof(R));
    for (int i = 1; i <= K; ++i) unit = unit && s[i] == static_cast<int64_t>(sizeof(T));
    // Binary ops with one operand broadcast along the row (x * rstd[..., 1]):
    // the broadcast value is loaded once.
    if constexpr (K == 2) {
      const bool row = typed && s[0] == static_cast<int64_t>(sizeof(R));
      R* o = reinterpret_cast<R*>(p[0]);
      if (row && s[1] == static_cast<int64_t>(sizeof(T)) && s[2] == 0) {
        const T* a = reinterpret_cast<const T*>(p[1]);
        const T b = *reinterpret_cast<const T*>(p[2]);
        if constexpr (std::is_same_v<T, float> && std::is_same_v<R, float>)
          run_at_kernel_isa<F32LoopAs>(o, a, b, n, fn);
        else
          for (int64_t j = 0; j < n; ++j) o[j] = fn(a[j], b);
        return;
      }
      if (row && s[1] == 0 && s[2] == static_cast<int64_t>(sizeof(T))) {
        const T a = *reinterpret_cast<const T*>(p[1]);
        const T* b = reinterpret_cast<const T*>(p[2]);
        if constexpr (std::is_same_v<T, float> && std::is_same_v<R, float>)
          run_at_kernel_isa<F32LoopSb>(o, a, b, n, fn);
        else
          for (int64_t j = 0; j < n; ++j) o[j] = fn(a, b[j]);
        return;
      }
    }
    if (unit) {
      R* o = reinterpret_cast<R*>(p[0]);
      const T* a = reinterpret_cast<const T*>(p[1]);
      if constexpr (std::is_same_v<T, float> && std::is_same_v<R, float>) {
        if constexpr (K == 1)
          run_at_kernel_isa<F32Loop1>(o, a, n, fn);
        else if constexpr (K == 2)
          run_at_kernel_isa<F32Loop2>(o, a, reinterpret_cast<const T*>(p[2]), n, fn);
        else
          run_at_kernel_isa<F32Loop3>(o, a, reinterpret_cast<const T*>(p[2]),
                                      reinterpret_cast<const T*>(p[3]), n, fn);
        return;
      }
      if constexpr (K == 1) {
        for (int64_t j = 0; j < n; ++j) o[j] = fn(a[j]);
      } else if constexpr (K == 2) {
        const T* b = reinterpret_cast<const T*>(p[2]);
        for (int64_t j = 0; j < n; ++j) o[j] = fn(a[j], b[j]);
      } else {
        const T* b = reinterpret_cast<const T*>(p[2]);
        const T* c = reinterpret_cast<const T*>(p[3]);
        for (int64_t j = 0; j < n; ++j) o[j] = fn(a[j], b[j], c[j]);
      }
      return;
    }
    if (typed) {  // strided, every operand in its C++ type: no dtype switch per element
      for (int64_t j = 0; j < n; ++j) {
        const T* in[3] = {};
        for (int i = 0; i < K; ++i) in[i] = reinterpret_cast<const T*>(p[i + 1] + j * s[i + 1]);
        R* o = reinterpret_cast<R*>(p[0] + j * s[0]);
        if constexpr (K == 1)
          *o = fn(*in[0]);
        else if constexpr (K == 2)
          *o = fn(*in[0], *in[1]);
        else
          *o = fn(*in[0], *in[1], *in[2]);
      }
      return;
    }
    T v[3];
    for (int64_t j = 0; j < n; ++j) {
      for (int i = 0; i < K; ++i) v[i] = load<T>(p[i + 1] + j * s[i + 1], it.dt[i + 1]);
      store<R>(p[0] + j * s[0], it.dt[0], apply(v));
    }
  };
  for_each_rows(call, it, [&](char** p, const int64_t* s, int64_t n, int64_t count, const int64_t* rs) {
    if constexpr (std::is_same_v<T, float> && std::is_same_v<R, float>) {
      // Short float32 rows of unit stride and whole-float row steps: one
      // call for the batch (Note [Rows come in batches]).
      // A binary op's input may be one value per row (x * rstd[..., 1]).
      int bcast = 0;
      if (K == 2 && s[2] == 0 && s[1] == 4) bcast = 2;
      if (K == 2 && s[1] == 0 && s[2] == 4) bcast = 1;
      bool unit_rows = typed && count > 1;
      int64_t rs_f[4] = {};
      for (int i = 0; i <= K && unit_rows; ++i) {
        unit_rows = (s[i] == 4 || (i == bcast && i > 0)) && rs[i] % 4 == 0;
        rs_f[i] = rs[i] / 4;
      }
      if (unit_rows) {
        const float* in[3] = {};
        for (int i = 0; i < K; ++i) in[i] = reinterpret_cast<const float*>(p[i + 1]);
        run_at_kernel_isa<F32LoopRows>(reinterpret_cast<float*>(p[0]), in[0], in[1], in[2], n, count, rs_f,
                                       bcast, fn);
        return;
      }
    }
    char* q[4];
    for (int i = 0; i <= K; ++i) q[i] = p[i];
    for (int64_t r = 0; r < count; ++r) {
      row(q, s, n);
      for (int i = 0; i <= K; ++i) q[i] += rs[i];
    }
  });
}

// Out dtype checks shared by the .out ops.
inline void check_castable(const Call& call, DT common, const TensorRef& out) {
  const DT o = dt_of(out.dtype());
  if (!can_cast(common, o))
    call.fail(NPUB_ERR_INVALID_ARGUMENT, std::string("result type ") + dt_name(common) +
                                             " can't be cast to the desired output type " + dt_name(o));
}

void register_binary(npub::sdk::Registrar& r);
void register_unary(npub::sdk::Registrar& r);
// dst = src (broadcast to dst, cast to its dtype through the source's compute
// type; a plain memory copy when both are contiguous and of one dtype).
void copy_into(const Call& call, const TensorRef& dst, const TensorRef& src);

void register_copy(npub::sdk::Registrar& r);

}  // namespace cann_like

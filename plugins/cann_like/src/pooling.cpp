// 2-d max and average pooling with their backward: ATen's output size
// (ceil_mode), window and divisor (count_include_pad, divisor_override)
// rules; max pooling records the flat index of each maximum.
#include "elementwise.h"
#include "ops.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

namespace cann_like {

namespace {

struct Pool2d {
  int64_t planes, h, w, kh, kw, sh, sw, ph, pw, dh, dw, oh, ow;
  bool ceil_mode;
};

int64_t pool_out(int64_t size, int64_t k, int64_t p, int64_t s, int64_t d, bool ceil_mode) {
  int64_t out = (size + 2 * p - d * (k - 1) - 1 + (ceil_mode ? s - 1 : 0)) / s + 1;
  if (ceil_mode && (out - 1) * s >= size + p) --out;
  return out;
}

Pool2d pool_geometry(const Call& call, const TensorRef& x, const std::vector<int64_t>& kernel,
                     std::vector<int64_t> stride, const std::vector<int64_t>& padding,
                     const std::vector<int64_t>& dilation, bool ceil_mode) {
  if (x.dim() != 3 && x.dim() != 4)
    call.fail(NPUB_ERR_INVALID_ARGUMENT,
              "Expected 3D or 4D (batch mode) tensor for input but got " + std::to_string(x.dim()) + "-d");
  if (stride.empty()) stride = kernel;
  Pool2d p{};
  p.h = x.size(-2);
  p.w = x.size(-1);
  p.planes = x.numel() / std::max<int64_t>(p.h * p.w, 1);
  if (p.h * p.w == 0) p.planes = x.dim() == 4 ? x.size(0) * x.size(1) : x.size(0);
  p.kh = pair_at(kernel, 0, call, "kernel_size");
  p.kw = pair_at(kernel, 1, call, "kernel_size");
  p.sh = pair_at(stride, 0, call, "stride");
  p.sw = pair_at(stride, 1, call, "stride");
  p.ph = pair_at(padding, 0, call, "padding");
  p.pw = pair_at(padding, 1, call, "padding");
  p.dh = dilation.empty() ? 1 : pair_at(dilation, 0, call, "dilation");
  p.dw = dilation.empty() ? 1 : pair_at(dilation, 1, call, "dilation");
  p.ceil_mode = ceil_mode;
  if (p.kh < 1 || p.kw < 1 || p.sh < 1 || p.sw < 1 || p.dh < 1 || p.dw < 1)
    call.fail(NPUB_ERR_INVALID_ARGUMENT, "kernel_size, stride and dilation must be positive");
  if (p.ph > p.kh / 2 || p.pw > p.kw / 2)
    call.fail(NPUB_ERR_INVALID_ARGUMENT, "pad should be at most half of effective kernel size, but got pad=" +
                                             std::to_string(p.ph) + ", kernel_size=" + std::to_string(p.kh));
  p.oh = pool_out(p.h, p.kh, p.ph, p.sh, p.dh, ceil_mode);
  p.ow = pool_out(p.w, p.kw, p.pw, p.sw, p.dw, ceil_mode);
  if (p.oh < 1 || p.ow < 1) call.fail(NPUB_ERR_INVALID_ARGUMENT, "Output size is too small");
  return p;
}

Shape pooled_shape(const TensorRef& x, const Pool2d& p) {
  Shape s = x.sizes();
  s[s.size() - 2] = p.oh;
  s[s.size() - 1] = p.ow;
  return s;
}

// Element i of a pooling operand: float32 and float64 as themselves, other
// dtypes through the converting load/store in double.
template <typename T>
struct TypedAccess {
  T get(const char* base, int64_t i) const { return reinterpret_cast<const T*>(base)[i]; }
  template <typename V>
  void set(char* base, int64_t i, V v) const {
    reinterpret_cast<T*>(base)[i] = static_cast<T>(v);
  }
};
struct ConvertingAccess {
  DT d;
  double get(const char* base, int64_t i) const { return load<double>(base + i * dt_size(d), d); }
  void set(char* base, int64_t i, double v) const { store<double>(base + i * dt_size(d), d, v); }
};
template <typename F>
void with_pool_access(DT d, F&& f) {
  if (d == DT::f32)
    f(TypedAccess<float>{});
  else if (d == DT::f64)
    f(TypedAccess<double>{});
  else
    f(ConvertingAccess{d});
}

// Note [float32 max pooling a row of windows at a time]
// Window by window, a 3x3 stride-2 pool of [16,32,32,32] took 2.6 ms on two
// threads against ATen's 2.1: each tap's compare waits on the one before
// and mispredicts on random data. Here a row of output windows is built
// tap by tap: for tap (i, j) the columns whose window holds it inside the
// plane are one range [lo_j, hi_j), and with the input row split into its
// `stride` phases (phase r holds columns r, r + stride, ...) the tap reads
// one phase contiguously, so the loop over the columns is a vectorised
// compare-and-blend with no chain between columns (compiled per ISA level).
// Each column still sees its taps in window order, so ties and NaNs
// resolve by the same rule; indices are int32 inside (a plane of under
// 2^31 elements, else the per-window loop runs). Rows of fewer than 8
// windows keep the per-window loop, whose set-up per row is smaller.
struct MaxPoolF32 {
  const Pool2d* p;
  const float* x;
  float* out;
  int64_t* indices;
  const int64_t* lo;  // per tap column j: the output columns [lo[j], hi[j]) it is inside the plane for
  const int64_t* hi;
};

PLUGIN_KERNELS_INLINE void max_pool_f32_body(const MaxPoolF32& a, int64_t plane_begin, int64_t plane_end) {
  const Pool2d& p = *a.p;
  // The plane's rows are split into their phases once per plane when the
  // plane is small (with a stride below the window's height an input row is
  // read by several output rows); a larger plane's rows are split as they
  // are read, one row's buffer only.
  constexpr int64_t kWholePlaneBytes = int64_t{1} << 20;
  const int64_t phase_len = (p.w + p.sw - 1) / p.sw, row_len = p.sw * phase_len;
  const bool whole_plane = p.h * row_len * static_cast<int64_t>(sizeof(float)) <= kWholePlaneBytes;
  std::vector<float> best(static_cast<size_t>(p.ow)),
      phases(static_cast<size_t>((whole_plane ? p.h : 1) * row_len));
  std::vector<int32_t> best_at(static_cast<size_t>(p.ow));
  float* __restrict bv = best.data();
  int32_t* __restrict bi = best_at.data();
  auto split_row = [&](int64_t pl, int64_t iy, float* __restrict ph) {
    const float* xr = a.x + (pl * p.h + iy) * p.w;
    for (int64_t r = 0; r < p.sw; ++r)
      for (int64_t m = r, k = r * phase_len; m < p.w; m += p.sw, ++k) ph[k] = xr[m];
  };
  for (int64_t pl = plane_begin; pl < plane_end; ++pl) {
    if (whole_plane)
      for (int64_t iy = 0; iy < p.h; ++iy) split_row(pl, iy, phases.data() + iy * row_len);
    for (int64_t oy = 0; oy < p.oh; ++oy) {
      for (int64_t ox = 0; ox < p.ow; ++ox) {
        bv[ox] = -std::numeric_limits<float>::infinity();
        bi[ox] = -1;
      }
      for (int64_t i = 0; i < p.kh; ++i) {
        const int64_t iy = oy * p.sh - p.ph + i * p.dh;
        if (iy < 0 || iy >= p.h) continue;
        const float* ph = phases.data() + (whole_plane ? iy * row_len : 0);
        if (!whole_plane) split_row(pl, iy, phases.data());
        for (int64_t j = 0; j < p.kw; ++j) {
          const int64_t off = j * p.dw - p.pw;  // the tap's column is ox * sw + off
          const int64_t r = (off % p.sw + p.sw) % p.sw;
          const float* __restrict src = ph + r * phase_len + (off - r) / p.sw;
          const int32_t at0 = static_cast<int32_t>(iy * p.w + off), sw = static_cast<int32_t>(p.sw);
          const int64_t end = a.hi[j];
          for (int64_t ox = a.lo[j]; ox < end; ++ox) {
            const float v = src[ox];
            // The first tap, a larger value, or a NaN: ATen's CPU rule,
            // under which the window's last NaN wins.
            const bool take = (bi[ox] < 0) | (v > bv[ox]) | (v != v);
            bv[ox] = take ? v : bv[ox];
            bi[ox] = take ? at0 + static_cast<int32_t>(ox) * sw : bi[ox];
          }
        }
      }
      float* o = a.out + (pl * p.oh + oy) * p.ow;
      int64_t* oi = a.indices + (pl * p.oh + oy) * p.ow;
      for (int64_t ox = 0; ox < p.ow; ++ox) {
        o[ox] = bv[ox];
        oi[ox] = bi[ox];
      }
    }
  }
}
PLUGIN_KERNELS_ISA_DISPATCH(void, max_pool_f32, max_pool_f32_body,
                            (const MaxPoolF32& a, int64_t plane_begin, int64_t plane_end),
                            (a, plane_begin, plane_end))

// aten::max_pool2d_with_indices.out(self, kernel_size, stride=[], padding=0, dilation=1,
//     ceil_mode=False, *, out!, indices!)
void max_pool2d(Call& call) {
  TensorRef x = call.tensor(0), out = call.tensor(6), indices = call.tensor(7);
  const Pool2d p = pool_geometry(call, x, call.int_list(1), call.int_list(2), call.int_list(3),
                                 call.int_list(4), call.bool_arg(5));
  check_out(call, out, pooled_shape(x, p));
  check_out(call, indices, pooled_shape(x, p), "indices");
  const DT d = dt_of(x.dtype());
  const char* xb = x.data<char>();
  char* ob = out.data<char>();
  int64_t* ib = indices.data<int64_t>();
  // Note [float32 max pooling a row of windows at a time]; rows of fewer
  // than 8 windows (a vector) run window by window.
  if (d == DT::f32 && p.ow >= 8 && p.h * p.w < (int64_t{1} << 31)) {
    std::vector<int64_t> lo(static_cast<size_t>(p.kw)), hi(static_cast<size_t>(p.kw));
    for (int64_t j = 0; j < p.kw; ++j) {
      const int64_t off = j * p.dw - p.pw;
      lo[static_cast<size_t>(j)] = off >= 0 ? 0 : (-off + p.sw - 1) / p.sw;
      hi[static_cast<size_t>(j)] = off > p.w - 1 ? 0 : std::min<int64_t>(p.ow, (p.w - 1 - off) / p.sw + 1);
      lo[static_cast<size_t>(j)] = std::min(lo[static_cast<size_t>(j)], hi[static_cast<size_t>(j)]);
    }
    const MaxPoolF32 args{&p, x.data<float>(), out.data<float>(), ib, lo.data(), hi.data()};
    call.parallel_for(0, p.planes, 1, [&](int64_t b, int64_t e) { max_pool_f32(args, b, e); });
    return;
  }
  // float32 and float64 elements are read as themselves (the max is exact in
  // either type), the half types through the converting load.
  // Per output column, its taps inside the plane (two integer divisions,
  // worked out once here rather than per output).
  std::vector<int64_t> jr(static_cast<size_t>(2 * p.ow));
  for (int64_t ox = 0; ox < p.ow; ++ox) {
    const int64_t x0 = ox * p.sw - p.pw;
    jr[static_cast<size_t>(2 * ox)] = x0 >= 0 ? 0 : (-x0 + p.dw - 1) / p.dw;
    jr[static_cast<size_t>(2 * ox + 1)] = x0 >= p.w ? 0 : std::min<int64_t>(p.kw, (p.w - 1 - x0) / p.dw + 1);
  }
  with_pool_access(d, [&](auto access) {
    call.parallel_for(0, p.planes, 1, [&](int64_t b, int64_t e) {
      for (int64_t pl = b; pl < e; ++pl)
        for (int64_t oy = 0; oy < p.oh; ++oy)
          for (int64_t ox = 0; ox < p.ow; ++ox) {
            using V = decltype(access.get(nullptr, 0));
            V best = -std::numeric_limits<V>::infinity();
            int64_t best_i = -1;
            // The taps inside the plane: j in [j0, j1) (no bounds test per tap).
            const int64_t x0 = ox * p.sw - p.pw;
            const int64_t j0 = jr[static_cast<size_t>(2 * ox)], j1 = jr[static_cast<size_t>(2 * ox + 1)];
            for (int64_t i = 0; i < p.kh; ++i) {
              const int64_t iy = oy * p.sh - p.ph + i * p.dh;
              if (iy < 0 || iy >= p.h) continue;
              const int64_t row = (pl * p.h + iy) * p.w;
              for (int64_t j = j0; j < j1; ++j) {
                const int64_t ix = x0 + j * p.dw;
                const V v = access.get(xb, row + ix);
                // The first tap, a larger value, or a NaN: ATen's CPU rule,
                // under which the window's last NaN wins.
                const bool take = best_i < 0 || v > best || v != v;
                best = take ? v : best;
                best_i = take ? iy * p.w + ix : best_i;
              }
            }
            const int64_t o = (pl * p.oh + oy) * p.ow + ox;
            access.set(ob, o, best);
            ib[o] = best_i;
          }
    });
  });
}

// aten::max_pool2d_with_indices_backward.grad_input(grad_output, self, kernel_size, stride,
//     padding, dilation, ceil_mode, indices, *, grad_input!)
void max_pool2d_backward(Call& call) {
  TensorRef go = call.tensor(0), x = call.tensor(1), indices = call.tensor(7), gi = call.tensor(8);
  const Pool2d p = pool_geometry(call, x, call.int_list(2), call.int_list(3), call.int_list(4),
                                 call.int_list(5), call.bool_arg(6));
  check_out(call, go, pooled_shape(x, p), "grad_output");
  check_out(call, gi, x.sizes(), "grad_input");
  const DT d = dt_of(x.dtype());
  with_pool_access(d, [&](auto access) {
    call.parallel_for(0, p.planes, 1, [&](int64_t b, int64_t e) {
      std::vector<double> acc(static_cast<size_t>(p.h * p.w));
      for (int64_t pl = b; pl < e; ++pl) {
        std::fill(acc.begin(), acc.end(), 0.0);
        for (int64_t o = 0; o < p.oh * p.ow; ++o) {
          const int64_t idx = indices.data<int64_t>()[pl * p.oh * p.ow + o];
          if (idx < 0 || idx >= p.h * p.w)
            call.fail(NPUB_ERR_INVALID_ARGUMENT, "indices: " + std::to_string(idx) +
                                                     " is out of range for an input plane of " +
                                                     std::to_string(p.h * p.w) + " elements");
          acc[static_cast<size_t>(idx)] +=
              static_cast<double>(access.get(go.data<char>(), pl * p.oh * p.ow + o));
        }
        for (int64_t k = 0; k < p.h * p.w; ++k)
          access.set(gi.data<char>(), pl * p.h * p.w + k, acc[static_cast<size_t>(k)]);
      }
    });
  });
}

// The window of output (oy, ox) for avg_pool2d and its divisor (ATen's rule).
struct AvgWindow {
  int64_t y0, y1, x0, x1, divisor;
};
AvgWindow avg_window(const Pool2d& p, int64_t oy, int64_t ox, bool count_include_pad,
                     int64_t divisor_override) {
  int64_t y0 = oy * p.sh - p.ph, x0 = ox * p.sw - p.pw;
  int64_t y1 = std::min(y0 + p.kh, p.h + p.ph), x1 = std::min(x0 + p.kw, p.w + p.pw);
  const int64_t pool_size = (y1 - y0) * (x1 - x0);
  y0 = std::max<int64_t>(y0, 0);
  x0 = std::max<int64_t>(x0, 0);
  y1 = std::min(y1, p.h);
  x1 = std::min(x1, p.w);
  // 0 stands for None (ATen refuses a zero divisor); a negative one divides
  // as given.
  int64_t div = divisor_override != 0 ? divisor_override
                : count_include_pad   ? pool_size
                                      : (y1 - y0) * (x1 - x0);
  return {y0, y1, x0, x1, div};
}

// aten::avg_pool2d.out(self, kernel_size, stride=[], padding=0, ceil_mode=False,
//     count_include_pad=True, divisor_override=None, *, out!)
void avg_pool2d(Call& call) {
  TensorRef x = call.tensor(0), out = call.tensor(7);
  const Pool2d p =
      pool_geometry(call, x, call.int_list(1), call.int_list(2), call.int_list(3), {}, call.bool_arg(4));
  const bool include_pad = call.bool_arg(5);
  const int64_t div_override = call.is_none(6) ? 0 : call.int_arg(6);
  if (!call.is_none(6) && div_override == 0) call.fail(NPUB_ERR_INVALID_ARGUMENT, "divisor must be not zero");
  check_out(call, out, pooled_shape(x, p));
  const DT d = dt_of(x.dtype());
  const int64_t es = dt_size(d);
  call.parallel_for(0, p.planes, 1, [&](int64_t b, int64_t e) {
    for (int64_t pl = b; pl < e; ++pl)
      for (int64_t oy = 0; oy < p.oh; ++oy)
        for (int64_t ox = 0; ox < p.ow; ++ox) {
          const AvgWindow win = avg_window(p, oy, ox, include_pad, div_override);
          double s = 0;
          for (int64_t iy = win.y0; iy < win.y1; ++iy)
            for (int64_t ix = win.x0; ix < win.x1; ++ix)
              s += load<double>(x.data<char>() + ((pl * p.h + iy) * p.w + ix) * es, d);
          store<double>(out.data<char>() + ((pl * p.oh + oy) * p.ow + ox) * es, d,
                        s / static_cast<double>(win.divisor));
        }
  });
}

// aten::avg_pool2d_backward.grad_input(grad_output, self, kernel_size, stride, padding,
//     ceil_mode, count_include_pad, divisor_override?, *, grad_input!)
void avg_pool2d_backward(Call& call) {
  TensorRef go = call.tensor(0), x = call.tensor(1), gi = call.tensor(8);
  const Pool2d p =
      pool_geometry(call, x, call.int_list(2), call.int_list(3), call.int_list(4), {}, call.bool_arg(5));
  const bool include_pad = call.bool_arg(6);
  const int64_t div_override = call.is_none(7) ? 0 : call.int_arg(7);
  if (!call.is_none(7) && div_override == 0) call.fail(NPUB_ERR_INVALID_ARGUMENT, "divisor must be not zero");
  check_out(call, go, pooled_shape(x, p), "grad_output");
  check_out(call, gi, x.sizes(), "grad_input");
  const DT d = dt_of(x.dtype());
  const int64_t es = dt_size(d);
  call.parallel_for(0, p.planes, 1, [&](int64_t b, int64_t e) {
    for (int64_t pl = b; pl < e; ++pl) {
      std::vector<double> acc(static_cast<size_t>(p.h * p.w), 0.0);
      for (int64_t oy = 0; oy < p.oh; ++oy)
        for (int64_t ox = 0; ox < p.ow; ++ox) {
          const AvgWindow win = avg_window(p, oy, ox, include_pad, div_override);
          const double g = load<double>(go.data<char>() + ((pl * p.oh + oy) * p.ow + ox) * es, d) /
                           static_cast<double>(win.divisor);
          for (int64_t iy = win.y0; iy < win.y1; ++iy)
            for (int64_t ix = win.x0; ix < win.x1; ++ix) acc[static_cast<size_t>(iy * p.w + ix)] += g;
        }
      for (int64_t k = 0; k < p.h * p.w; ++k)
        store<double>(gi.data<char>() + (pl * p.h * p.w + k) * es, d, acc[static_cast<size_t>(k)]);
    }
  });
}

}  // namespace

void register_pooling(npub::sdk::Registrar& r) {
  const auto floating = dtypes_floating();
  r.op("aten::max_pool2d_with_indices.out(Tensor self, int[2] kernel_size, int[2] stride=[], int[2] "
       "padding=0, int[2] dilation=1, bool ceil_mode=False, *, Tensor(a!) out, Tensor(b!) indices) -> "
       "(Tensor(a!), Tensor(b!))",
       &max_pool2d)
      .dtypes(floating)
      .arg_dtypes("indices", {npub::sdk::kInt64})
      .contiguous_only();
  r.op("aten::max_pool2d_with_indices_backward.grad_input(Tensor grad_output, Tensor self, int[2] "
       "kernel_size, int[2] stride, int[2] padding, int[2] dilation, bool ceil_mode, Tensor indices, *, "
       "Tensor(a!) grad_input) -> Tensor(a!)",
       &max_pool2d_backward)
      .dtypes(floating)
      .arg_dtypes("indices", {npub::sdk::kInt64})
      .contiguous_only();
  r.op("aten::avg_pool2d.out(Tensor self, int[2] kernel_size, int[2] stride=[], int[2] padding=0, bool "
       "ceil_mode=False, bool count_include_pad=True, int? divisor_override=None, *, Tensor(a!) out) -> "
       "Tensor(a!)",
       &avg_pool2d)
      .dtypes(floating)
      .contiguous_only();
  r.op("aten::avg_pool2d_backward.grad_input(Tensor grad_output, Tensor self, int[2] kernel_size, int[2] "
       "stride, int[2] padding, bool ceil_mode, bool count_include_pad, int? divisor_override, *, Tensor(a!) "
       "grad_input) -> Tensor(a!)",
       &avg_pool2d_backward)
      .dtypes(floating)
      .contiguous_only();
}

}  // namespace cann_like

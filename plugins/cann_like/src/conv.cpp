// Convolutions, 1-d to 3-d, regular and transposed (forward and backward),
// by im2col + GEMM or, for 2-d ones, on oneDNN's convolution primitives, and
// the fused conv2d + bias + relu (the fusion CANN's graph engine applies).
// Pooling is in pooling.cpp.
#include <plugin_kernels/conv.h>
#include <plugin_kernels/gemm.h>

#include "elementwise.h"
#include "ops.h"

#include <array>
#include <cmath>
#include <limits>
#include <memory>

namespace cann_like {

using plugin_kernels::gemm;

namespace {

// Note [Convolutions as three GEMM passes]
// A convolution of any rank (1-d arrives from ATen viewed as 2-d; 3-d as a
// 5-d NCDHW input) is a geometry with three spatial dims (unused ones of
// size 1) and three passes over im2col columns, each one GEMM per image and
// group:
//   forward      y  = W  @ im2col(x)
//   input grad   dx = col2im(W^T @ dy)
//   weight grad  dW = dy @ im2col(x)^T, summed over images.
// A transposed convolution is the adjoint of the regular one whose input is
// its output: its forward is the input-grad pass, its input grad the
// forward pass, and its weight grad the weight-grad pass with x and dy
// swapped. So `Conv` below always describes the regular convolution, with
// `x` the larger tensor and `y` the smaller.
// A 2-d convolution (one of size 1 in depth) first tries oneDNN's
// convolution primitives (Note [Convolutions on oneDNN's convolution
// primitives] in plugin_kernels/conv.h), 1.5 to 2 times as fast on a CNN's
// shapes; the passes below run what they decline.
struct Conv {
  int64_t n, c;                       // images, channels of x
  int64_t oc;                         // channels of y
  std::array<int64_t, 3> in, k, out;  // spatial sizes of x, the kernel, y
  std::array<int64_t, 3> stride, pad, dil;
  int64_t groups;
  int64_t cg() const { return c / groups; }
  int64_t ocg() const { return oc / groups; }
  int64_t in_size() const { return in[0] * in[1] * in[2]; }
  int64_t col_rows() const { return cg() * k[0] * k[1] * k[2]; }
  int64_t col_cols() const { return out[0] * out[1] * out[2]; }
};

// The 2-d convolution `g` is, for plugin_kernels (false: it is 3-d).
bool as_2d(const Conv& g, plugin_kernels::Conv2dShape* s) {
  if (g.in[0] != 1 || g.k[0] != 1 || g.out[0] != 1 || g.pad[0] != 0) return false;
  *s = plugin_kernels::Conv2dShape{};
  s->n = g.n;
  s->c = g.c;
  s->h = g.in[1];
  s->w = g.in[2];
  s->oc = g.oc;
  s->kh = g.k[1];
  s->kw = g.k[2];
  s->oh = g.out[1];
  s->ow = g.out[2];
  s->stride_h = g.stride[1];
  s->stride_w = g.stride[2];
  s->pad_h = g.pad[1];
  s->pad_w = g.pad[2];
  s->dil_h = g.dil[1];
  s->dil_w = g.dil[2];
  s->groups = g.groups;
  return true;
}

// The call's convolution: input `x` [n, cin, *spatial] and weight `wt`
// ([cout, cin/g, *k], transposed: [cin, cout/g, *k]).
struct ConvCall {
  Conv g;
  bool transposed;
  std::vector<int64_t> out_shape;  // the op's result
};

std::string spatial_str(const std::array<int64_t, 3>& v, int spatial) {
  std::string s;
  for (int i = 3 - spatial; i < 3; ++i) {
    if (i > 3 - spatial) s.push_back('x');
    s.append(std::to_string(v[static_cast<size_t>(i)]));
  }
  return s;
}

// The i-th of `spatial` values of a per-dim argument (one value stands for all).
int64_t per_dim(const Call& call, const std::vector<int64_t>& v, int i, int spatial, const char* name) {
  if (v.size() == 1) return v[0];
  if (static_cast<int>(v.size()) != spatial)
    call.fail(NPUB_ERR_INVALID_ARGUMENT, std::string(name) + ": expected 1 or " + std::to_string(spatial) +
                                             " values but found " + std::to_string(v.size()));
  return v[static_cast<size_t>(i)];
}

ConvCall conv_geometry(const Call& call, const TensorRef& x, const TensorRef& wt,
                       const std::vector<int64_t>& stride, const std::vector<int64_t>& padding,
                       const std::vector<int64_t>& dilation, bool transposed,
                       const std::vector<int64_t>& output_padding, int64_t groups) {
  if (x.dim() < 4 || x.dim() > 5)
    call.fail(NPUB_ERR_UNSUPPORTED, "expected a 4-d (N, C, H, W) or 5-d (N, C, D, H, W) input but found a " +
                                        std::to_string(x.dim()) + "-d input");
  if (wt.dim() != x.dim())
    call.fail(NPUB_ERR_INVALID_ARGUMENT, "weight: expected " + std::to_string(x.dim()) +
                                             " dimensions (as the input) but found " +
                                             std::to_string(wt.dim()));
  const int spatial = static_cast<int>(x.dim()) - 2;
  if (groups < 1) call.fail(NPUB_ERR_INVALID_ARGUMENT, "non-positive groups is not supported");
  ConvCall cc{};
  cc.transposed = transposed;
  Conv& g = cc.g;
  g.groups = groups;
  const int64_t cin = x.size(1);
  // Regular: x is the input, y the output. Transposed: y is the input.
  const int64_t wcin = transposed ? wt.size(0) : wt.size(1) * groups;
  const int64_t cout = transposed ? wt.size(1) * groups : wt.size(0);
  if (wcin != cin)
    call.fail(NPUB_ERR_INVALID_ARGUMENT,
              "Given " + std::string(transposed ? "transposed=1, " : "") +
                  "groups=" + std::to_string(groups) + ", weight of size " + shape_str(wt.sizes()) +
                  ", expected input" + shape_str(x.sizes()) + " to have " + std::to_string(wcin) +
                  " channels, but got " + std::to_string(cin) + " channels instead");
  if (cin % groups != 0 || cout % groups != 0)
    call.fail(NPUB_ERR_INVALID_ARGUMENT, "groups " + std::to_string(groups) + " must divide input channels " +
                                             std::to_string(cin) + " and output channels " +
                                             std::to_string(cout));
  g.n = x.size(0);
  g.c = transposed ? cout : cin;
  g.oc = transposed ? cin : cout;
  cc.out_shape = {g.n, cout};
  std::array<int64_t, 3> result{1, 1, 1}, given{1, 1, 1};
  for (int i = 0; i < 3; ++i) {
    const size_t s = static_cast<size_t>(i);
    g.k[s] = g.in[s] = g.out[s] = 1;
    g.stride[s] = g.dil[s] = 1;
    g.pad[s] = 0;
    if (i < 3 - spatial) continue;
    const int d = i - (3 - spatial);
    const int32_t dim = static_cast<int32_t>(2 + d);
    g.k[s] = wt.size(dim);
    g.stride[s] = per_dim(call, stride, d, spatial, "stride");
    g.pad[s] = per_dim(call, padding, d, spatial, "padding");
    g.dil[s] = per_dim(call, dilation, d, spatial, "dilation");
    given[s] = x.size(dim);
    if (g.stride[s] < 1 || g.dil[s] < 1 || g.pad[s] < 0)
      call.fail(NPUB_ERR_INVALID_ARGUMENT, "stride and dilation must be positive and padding non-negative");
    const int64_t span = g.dil[s] * (g.k[s] - 1) + 1;
    if (transposed) {
      const int64_t op = per_dim(call, output_padding, d, spatial, "output_padding");
      if (op < 0 || (op >= g.stride[s] && op >= g.dil[s]))
        call.fail(NPUB_ERR_INVALID_ARGUMENT,
                  "output padding must be smaller than either stride or dilation, but got output_padding=" +
                      std::to_string(op) + ", stride=" + std::to_string(g.stride[s]) +
                      ", dilation=" + std::to_string(g.dil[s]));
      result[s] = (given[s] - 1) * g.stride[s] - 2 * g.pad[s] + span + op;
      g.in[s] = result[s];
      g.out[s] = given[s];
    } else {
      result[s] = (given[s] + 2 * g.pad[s] - span) / g.stride[s] + 1;
      if (given[s] + 2 * g.pad[s] < span) result[s] = 0;
      g.in[s] = given[s];
      g.out[s] = result[s];
    }
  }
  for (int i = 3 - spatial; i < 3; ++i)
    if (result[static_cast<size_t>(i)] < 1)
      call.fail(NPUB_ERR_INVALID_ARGUMENT, "Calculated output size: (" + spatial_str(result, spatial) +
                                               "). Output size is too small for input " +
                                               shape_str(x.sizes()) + " and kernel " +
                                               spatial_str(g.k, spatial));
  for (int i = 3 - spatial; i < 3; ++i) cc.out_shape.push_back(result[static_cast<size_t>(i)]);
  return cc;
}

// The output columns whose input index o*stride + off lies in [0, size):
// [*o0, *o1) of [0, outs).
void inside_range(int64_t off, int64_t stride, int64_t size, int64_t outs, int64_t* o0, int64_t* o1) {
  int64_t a = off >= 0 ? 0 : (-off + stride - 1) / stride;
  int64_t b = size - off <= 0 ? 0 : (size - off + stride - 1) / stride;
  a = std::min(a, outs);
  *o0 = a;
  *o1 = std::min(std::max(b, a), outs);
}

// col[((ci*kd + a)*kh + i)*kw + j, (oz*oh + oy)*ow + ox] =
//     x[ci, oz*sd - pd + a*dd, oy*sh - ph + i*dh, ox*sw - pw + j*dw]
void im2col(const Conv& g, const float* x, float* col) {
  const int64_t kd = g.k[0], kh = g.k[1], kw = g.k[2];
  const int64_t od = g.out[0], oh = g.out[1], ow = g.out[2];
  const int64_t d = g.in[0], h = g.in[1], w = g.in[2];
  for (int64_t ci = 0; ci < g.cg(); ++ci)
    for (int64_t a = 0; a < kd; ++a)
      for (int64_t i = 0; i < kh; ++i)
        for (int64_t j = 0; j < kw; ++j) {
          float* row = col + (((ci * kd + a) * kh + i) * kw + j) * g.col_cols();
          // Output columns whose input column is inside [0, w): one range,
          // zero on either side (no per-element test).
          const int64_t off = j * g.dil[2] - g.pad[2];
          int64_t ox0, ox1;
          inside_range(off, g.stride[2], w, ow, &ox0, &ox1);
          for (int64_t oz = 0; oz < od; ++oz) {
            const int64_t iz = oz * g.stride[0] - g.pad[0] + a * g.dil[0];
            for (int64_t oy = 0; oy < oh; ++oy) {
              const int64_t iy = oy * g.stride[1] - g.pad[1] + i * g.dil[1];
              float* r = row + (oz * oh + oy) * ow;
              if (iz < 0 || iz >= d || iy < 0 || iy >= h) {
                std::fill(r, r + ow, 0.0f);
                continue;
              }
              const float* xr = x + ((ci * d + iz) * h + iy) * w;
              std::fill(r, r + ox0, 0.0f);
              if (g.stride[2] == 1) {
                std::memcpy(r + ox0, xr + ox0 + off, sizeof(float) * static_cast<size_t>(ox1 - ox0));
              } else {
                for (int64_t ox = ox0; ox < ox1; ++ox) r[ox] = xr[ox * g.stride[2] + off];
              }
              std::fill(r + ox1, r + ow, 0.0f);
            }
          }
        }
}

// The adjoint of im2col: accumulates col into x.
void col2im(const Conv& g, const float* col, float* x) {
  const int64_t kd = g.k[0], kh = g.k[1], kw = g.k[2];
  const int64_t od = g.out[0], oh = g.out[1], ow = g.out[2];
  const int64_t d = g.in[0], h = g.in[1], w = g.in[2];
  for (int64_t ci = 0; ci < g.cg(); ++ci)
    for (int64_t a = 0; a < kd; ++a)
      for (int64_t i = 0; i < kh; ++i)
        for (int64_t j = 0; j < kw; ++j) {
          const float* row = col + (((ci * kd + a) * kh + i) * kw + j) * g.col_cols();
          const int64_t off = j * g.dil[2] - g.pad[2];
          int64_t ox0, ox1;
          inside_range(off, g.stride[2], w, ow, &ox0, &ox1);
          for (int64_t oz = 0; oz < od; ++oz) {
            const int64_t iz = oz * g.stride[0] - g.pad[0] + a * g.dil[0];
            if (iz < 0 || iz >= d) continue;
            for (int64_t oy = 0; oy < oh; ++oy) {
              const int64_t iy = oy * g.stride[1] - g.pad[1] + i * g.dil[1];
              if (iy < 0 || iy >= h) continue;
              float* xr = x + ((ci * d + iz) * h + iy) * w;
              const float* r = row + (oz * oh + oy) * ow;
              for (int64_t ox = ox0; ox < ox1; ++ox) xr[ox * g.stride[2] + off] += r[ox];
            }
          }
        }
}

void require_f32(const Call& call, std::initializer_list<std::pair<TensorRef, const char*>> ts) {
  for (const auto& [t, name] : ts) cann_like::require_f32(call, t, name);
}

// Adds bias[channel] to each of the `channels` planes of `plane` elements
// at `y` (and applies relu).
void add_bias(float* y, const float* bias, int64_t channels, int64_t plane, bool relu) {
  for (int64_t oc = 0; oc < channels; ++oc) {
    float* r = y + oc * plane;
    const float bv = bias != nullptr ? bias[oc] : 0.0f;
    if (relu) {
      for (int64_t k = 0; k < plane; ++k) {
        const float v = r[k] + bv;
        r[k] = v > 0.0f ? v : (v != v ? v : 0.0f);
      }
    } else {
      for (int64_t k = 0; k < plane; ++k) r[k] += bv;
    }
  }
}

// The forward pass: y = conv(x, w) (+ bias) (relu), y [n, oc, *out].
void conv_forward(const Call& call, const Conv& g, const float* xp, const float* wp, const float* bp,
                  float* yp, bool relu) {
  plugin_kernels::Conv2dShape s;
  if (as_2d(g, &s) && plugin_kernels::conv2d_forward(call, s, xp, wp, bp, yp)) {
    if (relu) {
      const int64_t plane = g.col_cols();
      call.parallel_for(0, g.n, 1, [&](int64_t b, int64_t e) {
        for (int64_t ni = b; ni < e; ++ni) add_bias(yp + ni * g.oc * plane, nullptr, g.oc, plane, true);
      });
    }
    return;
  }
  call.parallel_for(0, g.n * g.groups, 1, [&](int64_t b, int64_t e) {
    // Uninitialised: im2col writes every element (a zeroed vector would cost
    // one more pass over a buffer of several MB).
    std::unique_ptr<float[]> col(new float[static_cast<size_t>(g.col_rows() * g.col_cols())]);
    for (int64_t job = b; job < e; ++job) {
      const int64_t ni = job / g.groups, gi = job % g.groups;
      im2col(g, xp + (ni * g.c + gi * g.cg()) * g.in_size(), col.get());
      float* o = yp + (ni * g.oc + gi * g.ocg()) * g.col_cols();
      gemm(false, false, g.ocg(), g.col_cols(), g.col_rows(), 1.0f, wp + gi * g.ocg() * g.col_rows(),
           g.col_rows(), col.get(), g.col_cols(), 0.0f, o, g.col_cols());
      if (bp != nullptr || relu)
        add_bias(o, bp != nullptr ? bp + gi * g.ocg() : nullptr, g.ocg(), g.col_cols(), relu);
    }
  });
}

// The input-grad pass: dx = col2im(W^T @ dy), dx [n, c, *in].
void conv_input_grad(const Call& call, const Conv& g, const float* dyp, const float* wp, float* dxp) {
  plugin_kernels::Conv2dShape s;
  if (as_2d(g, &s) && plugin_kernels::conv2d_backward_data(call, s, dyp, wp, dxp)) return;
  std::memset(dxp, 0, sizeof(float) * static_cast<size_t>(g.n * g.c * g.in_size()));
  const int64_t rows = g.col_rows(), cols = g.col_cols();
  call.parallel_for(0, g.n * g.groups, 1, [&](int64_t b, int64_t e) {
    std::vector<float> col(static_cast<size_t>(rows * cols));
    for (int64_t job = b; job < e; ++job) {
      const int64_t ni = job / g.groups, gr = job % g.groups;
      // col = W_g^T [rows, ocg] @ dy [ocg, cols]
      gemm(true, false, rows, cols, g.ocg(), 1.0f, wp + gr * g.ocg() * rows, rows,
           dyp + (ni * g.oc + gr * g.ocg()) * cols, cols, 0.0f, col.data(), cols);
      col2im(g, col.data(), dxp + (ni * g.c + gr * g.cg()) * g.in_size());
    }
  });
}

// The weight-grad pass: dW [oc, cg, *k] = sum over images of dy @ im2col(x)^T.
void conv_weight_grad(const Call& call, const Conv& g, const float* xp, const float* dyp, float* dwp) {
  plugin_kernels::Conv2dShape s;
  if (as_2d(g, &s) && plugin_kernels::conv2d_backward_weights(call, s, xp, dyp, dwp)) return;
  const int64_t rows = g.col_rows(), cols = g.col_cols(), numel = g.oc * rows;
  // Per-thread partial sums over images, added in a fixed order.
  const int64_t chunks = std::min<int64_t>(g.n, std::max<int32_t>(1, call.num_threads()));
  std::vector<std::vector<float>> partial(static_cast<size_t>(chunks),
                                          std::vector<float>(static_cast<size_t>(numel), 0.0f));
  const int64_t per = (g.n + chunks - 1) / chunks;
  call.parallel_for(0, chunks, 1, [&](int64_t b, int64_t e) {
    std::vector<float> col(static_cast<size_t>(rows * cols));
    for (int64_t ch = b; ch < e; ++ch)
      for (int64_t ni = ch * per; ni < std::min(g.n, (ch + 1) * per); ++ni)
        for (int64_t gr = 0; gr < g.groups; ++gr) {
          im2col(g, xp + (ni * g.c + gr * g.cg()) * g.in_size(), col.data());
          // dW_g [ocg, rows] += dy [ocg, cols] @ col^T [cols, rows]
          gemm(false, true, g.ocg(), rows, cols, 1.0f, dyp + (ni * g.oc + gr * g.ocg()) * cols, cols,
               col.data(), cols, 1.0f, partial[static_cast<size_t>(ch)].data() + gr * g.ocg() * rows, rows);
        }
  });
  for (int64_t i = 0; i < numel; ++i) {
    float s = 0;
    for (const auto& p : partial) s += p[static_cast<size_t>(i)];
    dwp[i] = s;
  }
}

int64_t plane_of(const std::vector<int64_t>& shape) {
  int64_t p = 1;
  for (size_t i = 2; i < shape.size(); ++i) p *= shape[i];
  return p;
}

// aten::convolution_overrideable(input, weight, bias?, stride, padding, dilation,
//     transposed, output_padding, groups) -> Tensor
void convolution(Call& call) {
  TensorRef x = call.tensor(0), wt = call.tensor(1), bias = call.optional_tensor(2);
  require_f32(call, {{x, "input"}, {wt, "weight"}, {bias, "bias"}});
  const ConvCall cc = conv_geometry(call, x, wt, call.int_list(3), call.int_list(4), call.int_list(5),
                                    call.bool_arg(6), call.int_list(7), call.int_arg(8));
  const int64_t channels = cc.out_shape[1];
  if (bias.defined() && bias.numel() != channels)
    call.fail(NPUB_ERR_INVALID_ARGUMENT, "bias: expected " + std::to_string(channels) +
                                             " elements but found " + std::to_string(bias.numel()));
  TensorRef out = call.output(0, cc.out_shape, x.dtype());
  const float* bp = bias.defined() ? bias.data<float>() : nullptr;
  if (!cc.transposed) {
    conv_forward(call, cc.g, x.data<float>(), wt.data<float>(), bp, out.data<float>(), false);
    return;
  }
  conv_input_grad(call, cc.g, x.data<float>(), wt.data<float>(), out.data<float>());
  if (bp != nullptr) {
    const int64_t plane = plane_of(cc.out_shape);
    call.parallel_for(0, cc.g.n, 1, [&](int64_t b, int64_t e) {
      for (int64_t ni = b; ni < e; ++ni)
        add_bias(out.data<float>() + ni * channels * plane, bp, channels, plane, false);
    });
  }
}

// cann_like::conv2d_bias_relu(input, weight, bias, int[2] stride, int[2] padding, int[2] dilation, int
// groups) -> Tensor Shape checks and the output (declared, in a meta call); on its own, the op's meta
// function (dtypes are the kernel's business: half types reach it converted).
ConvCall conv2d_bias_relu_output(Call& call, TensorRef* out) {
  TensorRef x = call.tensor(0), wt = call.tensor(1), bias = call.tensor(2);
  if (x.dim() != 4)
    call.fail(NPUB_ERR_INVALID_ARGUMENT,
              "input: expected a 4-d (N, C, H, W) tensor but found a " + std::to_string(x.dim()) + "-d one");
  const ConvCall cc = conv_geometry(call, x, wt, call.int_list(3), call.int_list(4), call.int_list(5), false,
                                    {0}, call.int_arg(6));
  if (bias.numel() != cc.g.oc)
    call.fail(NPUB_ERR_INVALID_ARGUMENT, "bias: expected " + std::to_string(cc.g.oc) +
                                             " elements but found " + std::to_string(bias.numel()));
  *out = call.output(0, cc.out_shape, x.dtype());
  return cc;
}

void conv2d_bias_relu_meta(Call& call) {
  TensorRef out;
  conv2d_bias_relu_output(call, &out);
}

void conv2d_bias_relu(Call& call) {
  TensorRef x = call.tensor(0), wt = call.tensor(1), bias = call.tensor(2);
  require_f32(call, {{x, "input"}, {wt, "weight"}, {bias, "bias"}});
  TensorRef out;
  const ConvCall cc = conv2d_bias_relu_output(call, &out);
  conv_forward(call, cc.g, x.data<float>(), wt.data<float>(), bias.data<float>(), out.data<float>(), true);
}

// cann_like::conv2d_bias_relu_backward(grad, result, input, weight, stride, padding, dilation, groups)
//     -> (grad_input, grad_weight, grad_bias)
// The derivative of conv2d_bias_relu: relu's mask from the forward's result
// (as PyTorch's threshold_backward: `result <= 0 ? 0 : grad`), then the
// convolution's backward. Declares the returns (also the meta function).
ConvCall conv2d_bias_relu_backward_outputs(Call& call, TensorRef* gi, TensorRef* gw, TensorRef* gb) {
  TensorRef go = call.tensor(0), res = call.tensor(1), x = call.tensor(2), wt = call.tensor(3);
  if (x.dim() != 4)
    call.fail(NPUB_ERR_INVALID_ARGUMENT,
              "input: expected a 4-d (N, C, H, W) tensor but found a " + std::to_string(x.dim()) + "-d one");
  const ConvCall cc = conv_geometry(call, x, wt, call.int_list(4), call.int_list(5), call.int_list(6), false,
                                    {0}, call.int_arg(7));
  check_out(call, go, cc.out_shape, "grad");
  check_out(call, res, cc.out_shape, "result");
  *gi = call.output(0, x.sizes(), x.dtype());
  *gw = call.output(1, wt.sizes(), wt.dtype());
  *gb = call.output(2, {cc.g.oc}, x.dtype());
  return cc;
}

void conv2d_bias_relu_backward_meta(Call& call) {
  TensorRef gi, gw, gb;
  conv2d_bias_relu_backward_outputs(call, &gi, &gw, &gb);
}

void conv2d_bias_relu_backward(Call& call) {
  TensorRef go = call.tensor(0), res = call.tensor(1), x = call.tensor(2), wt = call.tensor(3);
  require_f32(call, {{go, "grad"}, {res, "result"}, {x, "input"}, {wt, "weight"}});
  TensorRef gi, gw, gb;
  const ConvCall cc = conv2d_bias_relu_backward_outputs(call, &gi, &gw, &gb);
  const int64_t n = go.numel();
  std::vector<float> masked(static_cast<size_t>(n));
  const float *gp = go.data<float>(), *rp = res.data<float>();
  call.parallel_for(0, n, 1 << 14, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) masked[static_cast<size_t>(i)] = rp[i] <= 0.0f ? 0.0f : gp[i];
  });
  conv_input_grad(call, cc.g, masked.data(), wt.data<float>(), gi.data<float>());
  conv_weight_grad(call, cc.g, x.data<float>(), masked.data(), gw.data<float>());
  channel_sums(masked.data(), cc.g.n, cc.g.oc, plane_of(cc.out_shape), gb.data<float>());
}

// aten::convolution_backward_overrideable(grad_output, input, weight, stride, padding,
//     dilation, transposed, output_padding, groups, bool[3] output_mask)
//     -> (grad_input, grad_weight, grad_bias)
void convolution_backward(Call& call) {
  TensorRef go = call.tensor(0), x = call.tensor(1), wt = call.tensor(2);
  require_f32(call, {{go, "grad_output"}, {x, "input"}, {wt, "weight"}});
  const ConvCall cc = conv_geometry(call, x, wt, call.int_list(3), call.int_list(4), call.int_list(5),
                                    call.bool_arg(6), call.int_list(7), call.int_arg(8));
  const Conv& g = cc.g;
  const auto mask = call.int_list(9);
  if (mask.size() != 3) call.fail(NPUB_ERR_INVALID_ARGUMENT, "output_mask: expected 3 values");
  check_out(call, go, cc.out_shape, "grad_output");
  const float *gp = go.data<float>(), *xp = x.data<float>(), *wp = wt.data<float>();
  if (mask[0]) {
    TensorRef gi = call.output(0, x.sizes(), x.dtype());
    if (cc.transposed)
      conv_forward(call, g, gp, wp, nullptr, gi.data<float>(), false);
    else
      conv_input_grad(call, g, gp, wp, gi.data<float>());
  }
  if (mask[1]) {
    TensorRef gw = call.output(1, wt.sizes(), wt.dtype());
    // Transposed: the regular convolution's x is grad_output, its dy the input.
    if (cc.transposed)
      conv_weight_grad(call, g, gp, xp, gw.data<float>());
    else
      conv_weight_grad(call, g, xp, gp, gw.data<float>());
  }
  if (mask[2]) {
    TensorRef gb = call.output(2, {cc.out_shape[1]}, go.dtype());
    channel_sums(gp, g.n, cc.out_shape[1], plane_of(cc.out_shape), gb.data<float>());
  }
}

}  // namespace

void register_conv(npub::sdk::Registrar& r) {
  using namespace npub::sdk;
  r.op("aten::convolution_overrideable(Tensor input, Tensor weight, Tensor? bias, SymInt[] stride, SymInt[] "
       "padding, SymInt[] dilation, bool transposed, SymInt[] output_padding, SymInt groups) -> Tensor",
       &convolution)
      .dtypes({kFloat32})
      .contiguous_only();
  r.op("aten::convolution_backward_overrideable(Tensor grad_output, Tensor input, Tensor weight, SymInt[] "
       "stride, SymInt[] padding, SymInt[] dilation, bool transposed, SymInt[] output_padding, SymInt "
       "groups, bool[3] output_mask) -> (Tensor grad_input, Tensor grad_weight, Tensor grad_bias)",
       &convolution_backward)
      .dtypes({kFloat32})
      .contiguous_only();
  r.op("cann_like::conv2d_bias_relu(Tensor input, Tensor weight, Tensor bias, int[2] stride=1, int[2] "
       "padding=0, int[2] dilation=1, int groups=1) -> Tensor",
       &conv2d_bias_relu)
      .dtypes({kFloat32})
      .contiguous_only()
      .opt_level(2);
  r.meta<&conv2d_bias_relu_meta>("cann_like::conv2d_bias_relu");
  r.op("cann_like::conv2d_bias_relu_backward(Tensor grad, Tensor result, Tensor input, Tensor weight, int[2] "
       "stride=1, int[2] padding=0, int[2] dilation=1, int groups=1) -> (Tensor grad_input, Tensor "
       "grad_weight, "
       "Tensor grad_bias)",
       &conv2d_bias_relu_backward)
      .dtypes({kFloat32})
      .contiguous_only()
      .opt_level(2);
  r.meta<&conv2d_bias_relu_backward_meta>("cann_like::conv2d_bias_relu_backward");
  // Training through the fused op (a graph compiler's conv2d + relu rewrite,
  // plugins/cann_like/src/fusion_patterns.cpp) takes the plugin's backward.
  r.derivative(
      "cann_like::conv2d_bias_relu",
      "input, weight, bias: cann_like::conv2d_bias_relu_backward(grad, result, input, weight, stride, "
      "padding, dilation, groups)");
}

}  // namespace cann_like

// 2-d convolution (forward and backward) by im2col + GEMM, and the fused
// conv2d + bias + relu (the fusion CANN's graph engine applies). Pooling is
// in pooling.cpp.
#include "elementwise.h"
#include "ops.h"

#include <cmath>
#include <limits>
#include <memory>

namespace cann_like {

// Serial row-major GEMM: C[m,n] = alpha * op(A) @ op(B) + beta * C (matmul.cpp).
void gemm_serial_f32(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
                     int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc);

namespace {

struct Conv2d {
  int64_t n, c, h, w;  // input
  int64_t oc, kh, kw;  // weight [oc, c/groups, kh, kw]
  int64_t sh, sw, ph, pw, dh, dw, groups;
  int64_t oh, ow;
  int64_t cg() const { return c / groups; }
  int64_t ocg() const { return oc / groups; }
  int64_t col_rows() const { return cg() * kh * kw; }
  int64_t col_cols() const { return oh * ow; }
};

Conv2d conv_geometry(const Call& call, const TensorRef& x, const TensorRef& wt,
                     const std::vector<int64_t>& stride, const std::vector<int64_t>& padding,
                     const std::vector<int64_t>& dilation, int64_t groups) {
  if (x.dim() != 4)
    call.fail(NPUB_ERR_UNSUPPORTED, "only 2-d convolution on 4-d NCHW input is implemented, got a " +
                                        std::to_string(x.dim()) + "-d input");
  if (wt.dim() != 4)
    call.fail(NPUB_ERR_INVALID_ARGUMENT,
              "weight: expected 4 dimensions but found " + std::to_string(wt.dim()));
  Conv2d g{x.size(0),
           x.size(1),
           x.size(2),
           x.size(3),
           wt.size(0),
           wt.size(2),
           wt.size(3),
           pair_at(stride, 0, call, "stride"),
           pair_at(stride, 1, call, "stride"),
           pair_at(padding, 0, call, "padding"),
           pair_at(padding, 1, call, "padding"),
           pair_at(dilation, 0, call, "dilation"),
           pair_at(dilation, 1, call, "dilation"),
           groups,
           0,
           0};
  if (groups < 1 || g.c % groups != 0 || g.oc % groups != 0)
    call.fail(NPUB_ERR_INVALID_ARGUMENT, "groups " + std::to_string(groups) + " must divide input channels " +
                                             std::to_string(g.c) + " and output channels " +
                                             std::to_string(g.oc));
  if (wt.size(1) != g.cg())
    call.fail(NPUB_ERR_INVALID_ARGUMENT, "Given groups=" + std::to_string(groups) + ", weight of size " +
                                             shape_str(wt.sizes()) + ", expected input" +
                                             shape_str(x.sizes()) + " to have " +
                                             std::to_string(wt.size(1) * groups) + " channels, but got " +
                                             std::to_string(g.c) + " channels instead");
  if (g.sh < 1 || g.sw < 1 || g.dh < 1 || g.dw < 1 || g.ph < 0 || g.pw < 0)
    call.fail(NPUB_ERR_INVALID_ARGUMENT, "stride and dilation must be positive and padding non-negative");
  g.oh = (g.h + 2 * g.ph - g.dh * (g.kh - 1) - 1) / g.sh + 1;
  g.ow = (g.w + 2 * g.pw - g.dw * (g.kw - 1) - 1) / g.sw + 1;
  if (g.oh < 1 || g.ow < 1)
    call.fail(NPUB_ERR_INVALID_ARGUMENT, "Calculated output size: (" + std::to_string(g.oh) + "x" +
                                             std::to_string(g.ow) + "). Output size is too small for input " +
                                             shape_str(x.sizes()) + " and kernel " + std::to_string(g.kh) +
                                             "x" + std::to_string(g.kw));
  return g;
}

// col[(ci*kh + i)*kw + j, oy*ow + ox] = x[ci, oy*sh - ph + i*dh, ox*sw - pw + j*dw]
void im2col(const Conv2d& g, const float* x, float* col) {
  for (int64_t ci = 0; ci < g.cg(); ++ci)
    for (int64_t i = 0; i < g.kh; ++i)
      for (int64_t j = 0; j < g.kw; ++j) {
        float* row = col + ((ci * g.kh + i) * g.kw + j) * g.oh * g.ow;
        for (int64_t oy = 0; oy < g.oh; ++oy) {
          const int64_t iy = oy * g.sh - g.ph + i * g.dh;
          float* r = row + oy * g.ow;
          if (iy < 0 || iy >= g.h) {
            for (int64_t ox = 0; ox < g.ow; ++ox) r[ox] = 0;
            continue;
          }
          const float* xr = x + (ci * g.h + iy) * g.w;
          // Output columns whose input column ix = ox*sw - pw + j*dw is inside
          // [0, w): one range, zero on either side (no per-element test).
          const int64_t off = j * g.dw - g.pw;
          int64_t ox0 = off >= 0 ? 0 : (-off + g.sw - 1) / g.sw;
          int64_t ox1 = g.w - off <= 0 ? 0 : (g.w - off + g.sw - 1) / g.sw;
          ox0 = std::min(ox0, g.ow);
          ox1 = std::min(std::max(ox1, ox0), g.ow);
          for (int64_t ox = 0; ox < ox0; ++ox) r[ox] = 0.0f;
          if (g.sw == 1) {
            std::memcpy(r + ox0, xr + ox0 + off, sizeof(float) * static_cast<size_t>(ox1 - ox0));
          } else {
            for (int64_t ox = ox0; ox < ox1; ++ox) r[ox] = xr[ox * g.sw + off];
          }
          for (int64_t ox = ox1; ox < g.ow; ++ox) r[ox] = 0.0f;
        }
      }
}

// The adjoint of im2col: accumulates col into x.
void col2im(const Conv2d& g, const float* col, float* x) {
  for (int64_t ci = 0; ci < g.cg(); ++ci)
    for (int64_t i = 0; i < g.kh; ++i)
      for (int64_t j = 0; j < g.kw; ++j) {
        const float* row = col + ((ci * g.kh + i) * g.kw + j) * g.oh * g.ow;
        for (int64_t oy = 0; oy < g.oh; ++oy) {
          const int64_t iy = oy * g.sh - g.ph + i * g.dh;
          if (iy < 0 || iy >= g.h) continue;
          float* xr = x + (ci * g.h + iy) * g.w;
          for (int64_t ox = 0; ox < g.ow; ++ox) {
            const int64_t ix = ox * g.sw - g.pw + j * g.dw;
            if (ix >= 0 && ix < g.w) xr[ix] += row[oy * g.ow + ox];
          }
        }
      }
}

void require_f32(const Call& call, std::initializer_list<TensorRef> ts) {
  for (const TensorRef& t : ts)
    if (t.defined() && dt_of(t.dtype()) != DT::f32)
      call.fail(NPUB_ERR_UNSUPPORTED,
                std::string("expected float32 tensors but found ") + dt_name(dt_of(t.dtype())));
}

// out = conv(x, w) (+ bias) (relu), out preallocated [n, oc, oh, ow].
void conv_forward(const Call& call, const Conv2d& g, const TensorRef& x, const TensorRef& wt,
                  const TensorRef& bias, const TensorRef& out, bool relu) {
  const float* xp = x.data<float>();
  const float* wp = wt.data<float>();
  const float* bp = bias.defined() ? bias.data<float>() : nullptr;
  float* op = out.data<float>();
  const int64_t jobs = g.n * g.groups;
  call.parallel_for(0, jobs, 1, [&](int64_t b, int64_t e) {
    // Uninitialised: im2col writes every element (a zeroed vector would cost
    // one more pass over a buffer of several MB).
    std::unique_ptr<float[]> col(new float[static_cast<size_t>(g.col_rows() * g.col_cols())]);
    for (int64_t job = b; job < e; ++job) {
      const int64_t ni = job / g.groups, gi = job % g.groups;
      im2col(g, xp + (ni * g.c + gi * g.cg()) * g.h * g.w, col.get());
      float* o = op + (ni * g.oc + gi * g.ocg()) * g.oh * g.ow;
      gemm_serial_f32(false, false, g.ocg(), g.col_cols(), g.col_rows(), 1.0f,
                      wp + gi * g.ocg() * g.col_rows(), g.col_rows(), col.get(), g.col_cols(), 0.0f, o,
                      g.col_cols());
      if (bp != nullptr || relu) {
        for (int64_t oc = 0; oc < g.ocg(); ++oc) {
          float* r = o + oc * g.oh * g.ow;
          const float bv = bp != nullptr ? bp[gi * g.ocg() + oc] : 0.0f;
          if (relu) {
            for (int64_t k = 0; k < g.oh * g.ow; ++k) {
              const float v = r[k] + bv;
              r[k] = v > 0.0f ? v : (v != v ? v : 0.0f);
            }
          } else {
            for (int64_t k = 0; k < g.oh * g.ow; ++k) r[k] += bv;
          }
        }
      }
    }
  });
}

// aten::convolution_overrideable(input, weight, bias?, stride, padding, dilation,
//     transposed, output_padding, groups) -> Tensor
void convolution(Call& call) {
  TensorRef x = call.tensor(0), wt = call.tensor(1), bias = call.optional_tensor(2);
  if (call.bool_arg(6)) call.fail(NPUB_ERR_UNSUPPORTED, "transposed convolution is not implemented");
  require_f32(call, {x, wt, bias});
  const Conv2d g =
      conv_geometry(call, x, wt, call.int_list(3), call.int_list(4), call.int_list(5), call.int_arg(8));
  if (bias.defined() && bias.numel() != g.oc)
    call.fail(NPUB_ERR_INVALID_ARGUMENT, "bias: expected " + std::to_string(g.oc) + " elements but found " +
                                             std::to_string(bias.numel()));
  TensorRef out = call.output(0, {g.n, g.oc, g.oh, g.ow}, x.dtype());
  conv_forward(call, g, x, wt, bias, out, false);
}

// cann_like::conv2d_bias_relu(input, weight, bias, int[2] stride, int[2] padding, int[2] dilation, int
// groups) -> Tensor Shape checks and the output (declared, in a meta call); on its own, the op's meta
// function (dtypes are the kernel's business: half types reach it converted).
Conv2d conv2d_bias_relu_output(Call& call, TensorRef* out) {
  TensorRef x = call.tensor(0), wt = call.tensor(1), bias = call.tensor(2);
  const Conv2d g =
      conv_geometry(call, x, wt, call.int_list(3), call.int_list(4), call.int_list(5), call.int_arg(6));
  if (bias.numel() != g.oc)
    call.fail(NPUB_ERR_INVALID_ARGUMENT, "bias: expected " + std::to_string(g.oc) + " elements but found " +
                                             std::to_string(bias.numel()));
  *out = call.output(0, {g.n, g.oc, g.oh, g.ow}, x.dtype());
  return g;
}

void conv2d_bias_relu_meta(Call& call) {
  TensorRef out;
  conv2d_bias_relu_output(call, &out);
}

void conv2d_bias_relu(Call& call) {
  TensorRef x = call.tensor(0), wt = call.tensor(1), bias = call.tensor(2);
  require_f32(call, {x, wt, bias});
  TensorRef out;
  const Conv2d g = conv2d_bias_relu_output(call, &out);
  conv_forward(call, g, x, wt, bias, out, true);
}

// aten::convolution_backward_overrideable(grad_output, input, weight, stride, padding,
//     dilation, transposed, output_padding, groups, bool[3] output_mask)
//     -> (grad_input, grad_weight, grad_bias)
void convolution_backward(Call& call) {
  TensorRef go = call.tensor(0), x = call.tensor(1), wt = call.tensor(2);
  if (call.bool_arg(6)) call.fail(NPUB_ERR_UNSUPPORTED, "transposed convolution is not implemented");
  require_f32(call, {go, x, wt});
  const Conv2d g =
      conv_geometry(call, x, wt, call.int_list(3), call.int_list(4), call.int_list(5), call.int_arg(8));
  const auto mask = call.int_list(9);
  if (mask.size() != 3) call.fail(NPUB_ERR_INVALID_ARGUMENT, "output_mask: expected 3 values");
  check_out(call, go, {g.n, g.oc, g.oh, g.ow}, "grad_output");
  const float* gp = go.data<float>();
  const float* xp = x.data<float>();
  const float* wp = wt.data<float>();
  const int64_t cols = g.col_cols(), rows = g.col_rows();
  if (mask[0]) {
    TensorRef gi = call.output(0, x.sizes(), x.dtype());
    float* gip = gi.data<float>();
    std::memset(gip, 0, sizeof(float) * static_cast<size_t>(gi.numel()));
    call.parallel_for(0, g.n * g.groups, 1, [&](int64_t b, int64_t e) {
      std::vector<float> col(static_cast<size_t>(rows * cols));
      for (int64_t job = b; job < e; ++job) {
        const int64_t ni = job / g.groups, gr = job % g.groups;
        // col = W_g^T [rows, ocg] @ grad_out [ocg, cols]
        gemm_serial_f32(true, false, rows, cols, g.ocg(), 1.0f, wp + gr * g.ocg() * rows, rows,
                        gp + (ni * g.oc + gr * g.ocg()) * cols, cols, 0.0f, col.data(), cols);
        col2im(g, col.data(), gip + (ni * g.c + gr * g.cg()) * g.h * g.w);
      }
    });
  }
  if (mask[1]) {
    TensorRef gw = call.output(1, wt.sizes(), wt.dtype());
    float* gwp = gw.data<float>();
    // Per-thread partial sums over images, added in a fixed order.
    const int64_t chunks = std::min<int64_t>(g.n, std::max<int32_t>(1, call.num_threads()));
    std::vector<std::vector<float>> partial(static_cast<size_t>(chunks),
                                            std::vector<float>(static_cast<size_t>(gw.numel()), 0.0f));
    const int64_t per = (g.n + chunks - 1) / chunks;
    call.parallel_for(0, chunks, 1, [&](int64_t b, int64_t e) {
      std::vector<float> col(static_cast<size_t>(rows * cols));
      for (int64_t ch = b; ch < e; ++ch)
        for (int64_t ni = ch * per; ni < std::min(g.n, (ch + 1) * per); ++ni)
          for (int64_t gr = 0; gr < g.groups; ++gr) {
            im2col(g, xp + (ni * g.c + gr * g.cg()) * g.h * g.w, col.data());
            // dW_g [ocg, rows] += grad_out [ocg, cols] @ col^T [cols, rows]
            gemm_serial_f32(false, true, g.ocg(), rows, cols, 1.0f, gp + (ni * g.oc + gr * g.ocg()) * cols,
                            cols, col.data(), cols, 1.0f,
                            partial[static_cast<size_t>(ch)].data() + gr * g.ocg() * rows, rows);
          }
    });
    for (int64_t i = 0; i < gw.numel(); ++i) {
      float s = 0;
      for (const auto& p : partial) s += p[static_cast<size_t>(i)];
      gwp[i] = s;
    }
  }
  if (mask[2]) {
    TensorRef gb = call.output(2, {g.oc}, go.dtype());
    float* gbp = gb.data<float>();
    for (int64_t oc = 0; oc < g.oc; ++oc) {
      double s = 0;
      for (int64_t ni = 0; ni < g.n; ++ni)
        for (int64_t k = 0; k < cols; ++k) s += gp[(ni * g.oc + oc) * cols + k];
      gbp[oc] = static_cast<float>(s);
    }
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
}

}  // namespace cann_like

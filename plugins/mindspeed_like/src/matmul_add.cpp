// mindspeed_like::npu_matmul_add_fp32: C += x^T . weight into a float32 C,
// whatever x's dtype (MindSpeed's gradient accumulation fusion: a weight
// gradient accumulated in float32 across micro-batches of bf16
// activations).
#include <algorithm>
#include <string>

#include <plugin_kernels/gemm.h>

#include "float_access.h"
#include "ops.h"

namespace mindspeed_like {

namespace {

using npub::sdk::Call;
using npub::sdk::TensorRef;

// mindspeed_like::npu_matmul_add_fp32(Tensor x, Tensor weight, Tensor(a!) C) -> ()
// x [k, m] and weight [k, n] in one dtype, C [m, n] float32.
struct MatmulAddShape {
  int64_t k, m, n;
};
MatmulAddShape matmul_add_shape(Call& call) {
  TensorRef x = call.tensor(0), w = call.tensor(1), c = call.tensor(2);
  if (x.dim() != 2)
    call.fail(NPUB_ERR_INVALID_ARGUMENT,
              "x: expected a 2-d tensor [k, m] but found shape " + Call::shape_str(x.sizes()));
  if (w.dim() != 2 || w.size(0) != x.size(0))
    call.fail(NPUB_ERR_INVALID_ARGUMENT,
              "weight: expected a 2-d tensor [k, n] with x's k = " + std::to_string(x.size(0)) +
                  " but found shape " + Call::shape_str(w.sizes()));
  if (!w.is(x.dtype()))
    call.fail(NPUB_ERR_INVALID_ARGUMENT, "weight: expected the dtype of x (" +
                                             npub::sdk::dtype_name(x.dtype()) + ") but found " +
                                             npub::sdk::dtype_name(w.dtype()));
  const MatmulAddShape s{x.size(0), x.size(1), w.size(1)};
  if (c.sizes() != std::vector<int64_t>{s.m, s.n})
    call.fail(NPUB_ERR_INVALID_ARGUMENT, "C: expected shape [m, n] = " + Call::shape_str({s.m, s.n}) +
                                             " but found " + Call::shape_str(c.sizes()));
  if (!c.is(npub::sdk::kFloat32))
    call.fail(NPUB_ERR_INVALID_ARGUMENT, "C: expected float32 but found " + npub::sdk::dtype_name(c.dtype()));
  return s;
}

// The op writes C and returns nothing: the meta function checks the
// arguments, so that a traced call rejects what the kernel rejects.
void matmul_add_meta(Call& call) { matmul_add_shape(call); }

// Half-type operands widened to float32 (exact), in parallel.
template <typename S>
const float* widened(const Call& call, const TensorRef& t) {
  const typename S::E* src = elements<S>(t);
  float* dst = static_cast<float*>(
      call.scratch(sizeof(float) * static_cast<uint64_t>(std::max<int64_t>(t.numel(), 1))));
  call.parallel_for(0, t.numel(), 1 << 15, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) dst[i] = S::load(src[i]);
  });
  return dst;
}

void matmul_add(Call& call) {
  TensorRef x = call.tensor(0), w = call.tensor(1), c = call.tensor(2);
  const MatmulAddShape s = matmul_add_shape(call);
  if (s.m == 0 || s.n == 0 || s.k == 0) return;  // C += 0
  // Half operands go to the library's half GEMM with a float32 C where it
  // has one, else are widened (exactly) to float32 first.
  const void* a = nullptr;
  const void* b = nullptr;
  plugin_kernels::GemmType type = plugin_kernels::GemmType::f32;
  with_float_types(
      call, x.dtype(),
      [&](auto tag) {
        using S = decltype(tag);
        constexpr auto half_type =
            std::is_same_v<S, BF16> ? plugin_kernels::GemmType::bf16 : plugin_kernels::GemmType::f16;
        if constexpr (std::is_same_v<S, F32>) {
          a = elements<S>(x);
          b = elements<S>(w);
        } else if (plugin_kernels::gemm_supports(half_type)) {
          a = elements<S>(x);
          b = elements<S>(w);
          type = half_type;
        } else {
          a = widened<S>(call, x);
          b = widened<S>(call, w);
        }
      },
      /*with_f64=*/false);
  const size_t elem = type == plugin_kernels::GemmType::f32 ? sizeof(float) : sizeof(uint16_t);
  const char* pa = static_cast<const char*>(a);
  const char* pb = static_cast<const char*>(b);
  float* pc = c.data<float>();
  // Tiles of C over the compute threads, along its longer side (a few per
  // thread for balance); each is one GEMM on its thread: C_tile += x[:, rows]^T . weight[:, cols].
  const bool split_rows = s.m >= s.n;
  const int64_t extent = split_rows ? s.m : s.n;
  const int64_t tiles = std::max<int64_t>(1, std::min<int64_t>(4 * call.num_threads(), (extent + 31) / 32));
  call.parallel_for(0, tiles, 1, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t lo = extent * t / tiles, hi = extent * (t + 1) / tiles;
      if (hi == lo) continue;
      plugin_kernels::GemmArgs g;
      g.type = type;
      g.c_float32 = true;
      g.trans_a = true;  // x [k, m] row-major is x^T [m, k] column-major
      g.k = s.k;
      g.lda = s.m;
      g.ldb = s.n;
      g.ldc = s.n;
      g.beta = 1.0f;
      if (split_rows) {
        g.m = hi - lo, g.n = s.n;
        g.a = pa + lo * elem, g.b = pb, g.c = pc + lo * s.n;
      } else {
        g.m = s.m, g.n = hi - lo;
        g.a = pa, g.b = pb + lo * elem, g.c = pc + lo;
      }
      plugin_kernels::gemm_on_this_thread(g);
    }
  });
}

}  // namespace

void register_matmul_add(npub::sdk::Registrar& r) {
  using namespace npub::sdk;
  r.def("mindspeed_like::npu_matmul_add_fp32(Tensor x, Tensor weight, Tensor(a!) C) -> ()");
  r.kernel("mindspeed_like::npu_matmul_add_fp32", &matmul_add)
      .dtypes({kFloat32, kFloat16, kBFloat16})
      .arg_dtypes("C", {kFloat32})  // float32 whatever x is
      .contiguous_only()
      .opt_level(2);
  r.meta<&matmul_add_meta>("mindspeed_like::npu_matmul_add_fp32");
}

}  // namespace mindspeed_like

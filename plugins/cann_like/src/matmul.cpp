// Matrix multiply: aten::mm.out, fp32, cache-blocked.
#include "ops.h"

#include <algorithm>
#include <cstring>

namespace cann_like {

using npub::sdk::Call;
using npub::sdk::TensorRef;

namespace {

// C[M,N] = A[M,K] * B[K,N], row-major contiguous, rows of C split across the
// device's compute threads; k-blocked so a panel of B stays in cache.
void gemm_f32(Call& call, const float* a, const float* b, float* c, int64_t m, int64_t n, int64_t k) {
  std::memset(c, 0, sizeof(float) * static_cast<size_t>(m * n));
  constexpr int64_t kBlockK = 256;
  call.parallel_for(0, m, 4, [&](int64_t r0, int64_t r1) {
    for (int64_t kb = 0; kb < k; kb += kBlockK) {
      const int64_t ke = std::min(k, kb + kBlockK);
      for (int64_t i = r0; i < r1; ++i) {
        float* ci = c + i * n;
        const float* ai = a + i * k;
        for (int64_t p = kb; p < ke; ++p) {
          const float av = ai[p];
          const float* bp = b + p * n;
          for (int64_t j = 0; j < n; ++j) ci[j] += av * bp[j];
        }
      }
    }
  });
}

// aten::mm.out(Tensor self, Tensor mat2, *, Tensor(a!) out) -> Tensor(a!)
void mm_out(Call& call) {
  TensorRef a = call.tensor(0), b = call.tensor(1), out = call.tensor(2);
  if (a.dim() != 2 || b.dim() != 2)
    call.fail(NPUB_ERR_INVALID_ARGUMENT, "expected 2-d tensors but found self " + std::to_string(a.dim()) +
                                             "-d and mat2 " + std::to_string(b.dim()) + "-d");
  if (a.size(1) != b.size(0))
    call.fail(NPUB_ERR_INVALID_ARGUMENT, "mat1 and mat2 shapes cannot be multiplied (" +
                                             std::to_string(a.size(0)) + "x" + std::to_string(a.size(1)) + " and " +
                                             std::to_string(b.size(0)) + "x" + std::to_string(b.size(1)) + ")");
  if (!a.is(npub::sdk::kFloat32) || !b.is(npub::sdk::kFloat32) || !out.is(npub::sdk::kFloat32))
    call.fail(NPUB_ERR_UNSUPPORTED, "expected float32 tensors");
  if (out.sizes() != std::vector<int64_t>{a.size(0), b.size(1)})
    call.fail(NPUB_ERR_INVALID_ARGUMENT, "out: expected shape [" + std::to_string(a.size(0)) + ", " +
                                             std::to_string(b.size(1)) + "] but found " + Call::shape_str(out.sizes()));
  gemm_f32(call, a.data<float>(), b.data<float>(), out.data<float>(), a.size(0), b.size(1), a.size(1));
}

}  // namespace

void register_matmul(npub::sdk::Registrar& r) {
  r.def("aten::mm.out(Tensor self, Tensor mat2, *, Tensor(a!) out) -> Tensor(a!)");
  r.kernel("aten::mm.out", &mm_out).dtypes({npub::sdk::kFloat32}).contiguous_only();
}

}  // namespace cann_like

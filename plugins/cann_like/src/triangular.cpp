// aten::triu.out / aten::tril.out: the upper or lower triangle of each
// matrix in the last two dims (causal masks are built with them), the rest
// zeros.
#include "common.h"
#include "ops.h"

namespace cann_like {

namespace {

// aten::triu.out / aten::tril.out(self, SymInt diagonal=0, *, out)
template <bool kUpper>
void triangle(Call& call) {
  TensorRef in = call.tensor(0), out = call.tensor(2);
  const int64_t diagonal = call.int_arg(1);
  if (in.dim() < 2)
    call.fail(NPUB_ERR_INVALID_ARGUMENT, std::string(kUpper ? "triu" : "tril") +
                                             ": input tensor must have at least 2 dimensions, but found " +
                                             std::to_string(in.dim()));
  if (dt_of(out.dtype()) != dt_of(in.dtype()))
    call.fail(NPUB_ERR_INVALID_ARGUMENT, std::string("expected out of self's dtype ") +
                                             dt_name(dt_of(in.dtype())) + " but found " +
                                             dt_name(dt_of(out.dtype())));
  check_out(call, out, in.sizes());
  const int64_t rows = in.size(in.dim() - 2), cols = in.size(in.dim() - 1);
  const int64_t es = dt_size(dt_of(in.dtype()));
  const int64_t matrices = rows * cols == 0 ? 0 : in.numel() / (rows * cols);
  const char* src = in.data<char>();
  char* dst = out.data<char>();
  // Contiguous (the registration asks for it): row r of matrix m starts at
  // (m * rows + r) * cols. Element (r, c) is kept where c - r >= diagonal
  // (triu) or c - r <= diagonal (tril); kept elements are copied in place
  // safely when out is self (triu_).
  call.parallel_for(
      0, matrices * rows, std::max<int64_t>(1, 4096 / std::max<int64_t>(cols, 1)), [&](int64_t b, int64_t e) {
        for (int64_t row = b; row < e; ++row) {
          const int64_t r = row % rows;
          // Columns [0, split) and [split, cols): zeros then kept (triu), kept then zeros (tril).
          const int64_t split = std::clamp<int64_t>(kUpper ? r + diagonal : r + diagonal + 1, 0, cols);
          const char* s = src + row * cols * es;
          char* d = dst + row * cols * es;
          const int64_t keep0 = kUpper ? split : 0, keep1 = kUpper ? cols : split;
          if (s != d) std::memcpy(d + keep0 * es, s + keep0 * es, static_cast<size_t>((keep1 - keep0) * es));
          if (kUpper)
            std::memset(d, 0, static_cast<size_t>(split * es));
          else
            std::memset(d + split * es, 0, static_cast<size_t>((cols - split) * es));
        }
      });
}

}  // namespace

void register_triangular(npub::sdk::Registrar& r) {
  r.op("aten::triu.out(Tensor self, SymInt diagonal=0, *, Tensor(a!) out) -> Tensor(a!)", &triangle<true>)
      .dtypes(dtypes_all())
      .contiguous_only()
      .alias_safe();
  r.op("aten::tril.out(Tensor self, SymInt diagonal=0, *, Tensor(a!) out) -> Tensor(a!)", &triangle<false>)
      .dtypes(dtypes_all())
      .contiguous_only()
      .alias_safe();
}

}  // namespace cann_like

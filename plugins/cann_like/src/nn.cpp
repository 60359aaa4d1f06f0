// NN ops: embedding (+ dense backward), nll_loss (forward and backward),
// native_dropout (+ backward). Layer norm is in layer_norm.cpp.
#include "elementwise.h"
#include "ops.h"

#include <npubridge/philox.hpp>

#include <cmath>

namespace cann_like {

namespace {

int64_t read_index(const TensorRef& idx, int64_t i) {
  const DT d = dt_of(idx.dtype());
  return load<int64_t>(idx.data<char>() + i * dt_size(d), d);
}

void check_index_dtype(const Call& call, const TensorRef& idx, const char* name) {
  const DT d = dt_of(idx.dtype());
  if (d != DT::i64 && d != DT::i32)
    call.fail(NPUB_ERR_INVALID_ARGUMENT,
              std::string("Expected tensor for argument '") + name +
                  "' to have one of the following scalar types: Long, Int; but got " + dt_name(d) +
                  " instead");
  if (!idx.is_contiguous()) call.fail(NPUB_ERR_INTERNAL, std::string(name) + " must be contiguous");
}

// aten::embedding(weight, indices, padding_idx=-1, scale_grad_by_freq=False, sparse=False) -> Tensor
void embedding(Call& call) {
  TensorRef w = call.tensor(0), idx = call.tensor(1);
  if (w.dim() != 2)
    call.fail(NPUB_ERR_INVALID_ARGUMENT, "'weight' must be 2-D but is " + std::to_string(w.dim()) + "-D");
  check_index_dtype(call, idx, "indices");
  const int64_t rows = w.size(0), dim = w.size(1), n = idx.numel();
  for (int64_t i = 0; i < n; ++i) {
    const int64_t k = read_index(idx, i);
    if (k < 0 || k >= rows)
      call.fail(NPUB_ERR_INDEX, "index out of range in self: index " + std::to_string(k) + " at position " +
                                    std::to_string(i) + " is not in [0, " + std::to_string(rows) + ")");
  }
  Shape shape = idx.sizes();
  shape.push_back(dim);
  TensorRef out = call.output(0, shape, w.dtype());
  const int64_t es = dt_size(dt_of(w.dtype()));
  const int64_t row_stride = w.stride(0) * es, col_stride = w.stride(1) * es;
  call.parallel_for(0, n, 64, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      const char* src = w.data<char>() + read_index(idx, i) * row_stride;
      char* dst = out.data<char>() + i * dim * es;
      if (col_stride == es)
        std::memcpy(dst, src, static_cast<size_t>(dim * es));
      else
        for (int64_t c = 0; c < dim; ++c)
          std::memcpy(dst + c * es, src + c * col_stride, static_cast<size_t>(es));
    }
  });
}

// aten::embedding_dense_backward(grad_output, indices, num_weights, padding_idx, scale_grad_by_freq) ->
// Tensor
// Note [Embedding gradient rows by bucket]
// Weight row k's gradient is the sum, in index order, of the grad_output
// rows i with indices[i] == k (each times 1 / count(k) with
// scale_grad_by_freq), in double. The positions are bucketed by k first (a
// stable counting sort), then each thread takes a block of weight rows and
// sums each row's bucket into one row of accumulators: rows nothing
// indexes are zero-filled, a row one float32 position indexes is 0 + that
// row (what its sum rounds to), and no pass walks num_weights * dim doubles or
// every index once per column block (which made GPT-2's wte gradient 60x
// slower than ATen's).
void embedding_backward(Call& call) {
  TensorRef g = call.tensor(0), idx = call.tensor(1);
  const int64_t num_weights = call.int_arg(2), padding_idx = call.int_arg(3);
  const bool scale = call.bool_arg(4);
  check_index_dtype(call, idx, "indices");
  const int64_t n = idx.numel();
  const int64_t dim = g.dim() > 0 ? g.size(-1) : 1;
  if (g.numel() != n * dim)
    call.fail(NPUB_ERR_INVALID_ARGUMENT, "grad_output of shape " + shape_str(g.sizes()) +
                                             " does not match indices of shape " + shape_str(idx.sizes()));
  const size_t rows = static_cast<size_t>(std::max<int64_t>(num_weights, 0));
  std::vector<int64_t> index(static_cast<size_t>(n));
  std::vector<int64_t> start(rows + 1, 0);  // bucket k is order[start[k], start[k + 1])
  for (int64_t i = 0; i < n; ++i) {
    const int64_t k = read_index(idx, i);
    if (k < 0 || k >= num_weights)
      call.fail(NPUB_ERR_INVALID_ARGUMENT, "index out of range: " + std::to_string(k) + " is not in [0, " +
                                               std::to_string(num_weights) + ")");
    index[static_cast<size_t>(i)] = k;
    ++start[static_cast<size_t>(k) + 1];
  }
  for (size_t k = 0; k < rows; ++k) start[k + 1] += start[k];
  std::vector<int64_t> order(static_cast<size_t>(n)), fill(start.begin(), start.end() - 1);
  for (int64_t i = 0; i < n; ++i)
    order[static_cast<size_t>(fill[static_cast<size_t>(index[static_cast<size_t>(i)])]++)] = i;
  const DT d = dt_of(g.dtype());
  TensorRef out = call.output(0, {num_weights, dim}, g.dtype());
  const int64_t es = dt_size(d);
  const char* gb = g.data<char>();
  char* ob = out.data<char>();
  call.parallel_for(
      0, num_weights, std::max<int64_t>(1, 4096 / std::max<int64_t>(dim, 1)), [&](int64_t k0, int64_t k1) {
        std::vector<double> acc(static_cast<size_t>(dim));
        for (int64_t k = k0; k < k1; ++k) {
          const int64_t b = start[static_cast<size_t>(k)], e = start[static_cast<size_t>(k) + 1];
          char* dst = ob + k * dim * es;
          if (b == e || k == padding_idx) {
            std::memset(dst, 0, static_cast<size_t>(dim * es));  // 0.0 in every floating dtype
            continue;
          }
          if (d == DT::f32 && !scale && e - b == 1) {
            // One float32 row: 0 + g in double rounds back to 0 + g in float.
            const float* src = reinterpret_cast<const float*>(gb) + order[static_cast<size_t>(b)] * dim;
            float* o = reinterpret_cast<float*>(dst);
            for (int64_t c = 0; c < dim; ++c) o[c] = 0.0f + src[c];
            continue;
          }
          std::fill(acc.begin(), acc.end(), 0.0);
          const double s = 1.0 / static_cast<double>(e - b);
          for (int64_t j = b; j < e; ++j) {
            const char* src = gb + order[static_cast<size_t>(j)] * dim * es;
            if (!scale) {
              add_rows_to_f64(acc.data(), src, d, 1, dim, dim);
              continue;
            }
            for (int64_t c = 0; c < dim; ++c)
              acc[static_cast<size_t>(c)] += load<double>(src + c * es, d) * s;
          }
          if (d == DT::f32) {
            float* o = reinterpret_cast<float*>(dst);
            for (int64_t c = 0; c < dim; ++c) o[c] = static_cast<float>(acc[static_cast<size_t>(c)]);
          } else {
            for (int64_t c = 0; c < dim; ++c) store<double>(dst + c * es, d, acc[static_cast<size_t>(c)]);
          }
        }
      });
}

// aten::nll_loss_forward.output(self, target, weight?, reduction, ignore_index, *, output!, total_weight!)
void nll_loss_forward(Call& call) {
  TensorRef x = call.tensor(0), target = call.tensor(1), w = call.optional_tensor(2);
  const int64_t reduction = call.int_arg(3), ignore = call.int_arg(4);
  TensorRef out = call.tensor(5), total = call.tensor(6);
  if (x.dim() < 1 || x.dim() > 2) call.fail(NPUB_ERR_INVALID_ARGUMENT, "input tensor should be 1D or 2D");
  const int64_t n = x.dim() == 2 ? x.size(0) : 1, c = x.size(-1);
  if ((x.dim() == 2 && (target.dim() != 1 || target.size(0) != n)) || (x.dim() == 1 && target.dim() != 0))
    call.fail(NPUB_ERR_INVALID_ARGUMENT, "size mismatch (got input: " + shape_str(x.sizes()) +
                                             ", target: " + shape_str(target.sizes()) + ")");
  if (w.defined() && w.numel() != c)
    call.fail(NPUB_ERR_INVALID_ARGUMENT,
              "weight tensor should be defined either for all " + std::to_string(c) +
                  " classes or no classes but got weight tensor of shape: " + shape_str(w.sizes()));
  if (dt_of(target.dtype()) != DT::i64)
    call.fail(NPUB_ERR_INVALID_ARGUMENT, "expected target of dtype int64");
  const DT d = dt_of(x.dtype());
  const int64_t es = dt_size(d);
  auto target_at = [&](int64_t i) {
    return load<int64_t>(target.data<char>() + i * 8 * (target.dim() > 0 ? target.stride(0) : 1), DT::i64);
  };
  // The targets first: a bad target is the caller's error whatever out is.
  for (int64_t i = 0; i < n; ++i) {
    const int64_t t = target_at(i);
    if (t != ignore && (t < 0 || t >= c))
      call.fail(NPUB_ERR_INDEX, "Target " + std::to_string(t) + " is out of bounds.");
  }
  check_out(call, out, reduction == 0 && x.dim() == 2 ? Shape{n} : Shape{}, "output");
  double sum = 0, wsum = 0;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t t = target_at(i);
    double loss = 0;
    if (t != ignore) {
      const double wt =
          w.defined() ? load<double>(w.data<char>() + t * dt_size(dt_of(w.dtype())), dt_of(w.dtype())) : 1.0;
      const int64_t off = x.dim() == 2 ? i * x.stride(0) + t * x.stride(1) : t * x.stride(0);
      loss = -load<double>(x.data<char>() + off * es, d) * wt;
      wsum += wt;
    }
    if (reduction == 0 && x.dim() == 2) store<double>(out.data<char>() + i * es, d, loss);
    sum += loss;
  }
  if (reduction == 0 && x.dim() == 1) store<double>(out.data<char>(), d, sum);
  if (reduction == 1) store<double>(out.data<char>(), d, sum / wsum);
  if (reduction == 2) store<double>(out.data<char>(), d, sum);
  store<double>(total.data<char>(), dt_of(total.dtype()), reduction == 0 ? 0.0 : wsum);
}

// aten::nll_loss_backward.grad_input(grad_output, self, target, weight?, reduction, ignore_index,
// total_weight, *, grad_input!)
void nll_loss_backward(Call& call) {
  TensorRef go = call.tensor(0), x = call.tensor(1), target = call.tensor(2), w = call.optional_tensor(3);
  const int64_t reduction = call.int_arg(4), ignore = call.int_arg(5);
  TensorRef total = call.tensor(6), gi = call.tensor(7);
  check_out(call, gi, x.sizes(), "grad_input");
  const DT d = dt_of(x.dtype());
  const int64_t es = dt_size(d);
  const int64_t n = x.dim() == 2 ? x.size(0) : 1, c = x.size(-1);
  std::memset(gi.data<char>(), 0, static_cast<size_t>(gi.numel() * es));
  const double tw = load<double>(total.data<char>(), dt_of(total.dtype()));
  const DT gd = dt_of(go.dtype());
  for (int64_t i = 0; i < n; ++i) {
    const int64_t t =
        load<int64_t>(target.data<char>() + i * 8 * (target.dim() > 0 ? target.stride(0) : 1), DT::i64);
    if (t == ignore) continue;
    if (t < 0 || t >= c) call.fail(NPUB_ERR_INDEX, "Target " + std::to_string(t) + " is out of bounds.");
    const double wt =
        w.defined() ? load<double>(w.data<char>() + t * dt_size(dt_of(w.dtype())), dt_of(w.dtype())) : 1.0;
    const double g = (reduction == 0 && x.dim() == 2)
                         ? load<double>(go.data<char>() + i * dt_size(gd) * go.stride(0), gd)
                         : load<double>(go.data<char>(), gd);
    double v = -wt * g;
    if (reduction == 1) v /= tw;
    store<double>(gi.data<char>() + (i * c + t) * es, d, v);
  }
}

}  // namespace

void register_nn(npub::sdk::Registrar& r) {
  register_layer_norm(r);  // here: the registration order before the split
  const auto floating = dtypes_floating();
  r.op("aten::embedding(Tensor weight, Tensor indices, SymInt padding_idx=-1, bool scale_grad_by_freq=False, "
       "bool sparse=False) -> Tensor",
       &embedding)
      .dtypes(dtypes_all())
      .arg_dtypes("indices", {npub::sdk::kInt64, npub::sdk::kInt32})
      .contiguous_only();
  r.op("aten::embedding_dense_backward(Tensor grad_output, Tensor indices, SymInt num_weights, SymInt "
       "padding_idx, bool scale_grad_by_freq) -> Tensor",
       &embedding_backward)
      .dtypes(floating)
      .arg_dtypes("indices", {npub::sdk::kInt64, npub::sdk::kInt32})
      .contiguous_only();
  r.op("aten::nll_loss_forward.output(Tensor self, Tensor target, Tensor? weight, int reduction, SymInt "
       "ignore_index, *, Tensor(a!) output, Tensor(b!) total_weight) -> (Tensor(a!), Tensor(b!))",
       &nll_loss_forward)
      .dtypes(floating)
      .arg_dtypes("target", {npub::sdk::kInt64})
      .contiguous_only();
  r.op("aten::nll_loss_backward.grad_input(Tensor grad_output, Tensor self, Tensor target, Tensor? weight, "
       "int reduction, SymInt ignore_index, Tensor total_weight, *, Tensor(a!) grad_input) -> Tensor(a!)",
       &nll_loss_backward)
      .dtypes(floating)
      .arg_dtypes("target", {npub::sdk::kInt64})
      .contiguous_only();
}

}  // namespace cann_like

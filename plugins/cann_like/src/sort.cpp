// Ordering: sort.values_stable and topk.values, one stable sort of each
// [dim] slice for both (topk keeps the first k). Registered contiguous-only:
// the dispatcher stages strided tensors.
#include "elementwise.h"
#include "ops.h"

#include <algorithm>
#include <cmath>
#include <utility>

namespace cann_like {

namespace {

// Sorts each [dim] slice; writes the first `k` (values, indices). NaN is
// greater than every number (as ATen); ties keep index order (stable).
template <typename T>
void sort_slices(const Call& call, const TensorRef& self, int64_t dim, int64_t k, bool descending,
                 const TensorRef& values, const TensorRef& indices) {
  const DimView v = dim_view(self, dim);
  const DT d = dt_of(self.dtype());
  const int64_t es = dt_size(d), oes = dt_size(dt_of(values.dtype()));
  call.parallel_for(0, v.outer * v.inner, 16, [&](int64_t b, int64_t e) {
    std::vector<std::pair<T, int64_t>> row(static_cast<size_t>(v.size));
    for (int64_t r = b; r < e; ++r) {
      const int64_t o = r / v.inner, i = r % v.inner;
      for (int64_t j = 0; j < v.size; ++j)
        row[static_cast<size_t>(j)] = {load<T>(self.data<char>() + ((o * v.size + j) * v.inner + i) * es, d),
                                       j};
      auto less = [](const std::pair<T, int64_t>& a, const std::pair<T, int64_t>& c) {
        if constexpr (std::is_floating_point_v<T>) {
          if (std::isnan(a.first)) return false;
          if (std::isnan(c.first)) return true;
        }
        return a.first < c.first;
      };
      if (descending)
        std::stable_sort(row.begin(), row.end(), [&](const auto& a, const auto& c) { return less(c, a); });
      else
        std::stable_sort(row.begin(), row.end(), less);
      for (int64_t j = 0; j < k; ++j) {
        const int64_t pos = (o * k + j) * v.inner + i;
        store<T>(values.data<char>() + pos * oes, dt_of(values.dtype()), row[static_cast<size_t>(j)].first);
        indices.data<int64_t>()[pos] = row[static_cast<size_t>(j)].second;
      }
    }
  });
}

void run_sort(Call& call, const TensorRef& self, int64_t dim_arg, int64_t k, bool descending,
              const TensorRef& values, const TensorRef& indices, const char* op) {
  const int64_t dim = wrap_dim(call, dim_arg, self.dim());
  const int64_t size = self.dim() == 0 ? 1 : self.size(static_cast<int32_t>(dim));
  if (k < 0 || k > size)
    call.fail(NPUB_ERR_INVALID_ARGUMENT, std::string(op) + "(): k (" + std::to_string(k) +
                                             ") out of range for dimension " + std::to_string(dim) +
                                             " of size " + std::to_string(size));
  Shape shape = self.sizes();
  if (self.dim() > 0) shape[static_cast<size_t>(dim)] = k;
  check_out(call, values, shape, "values");
  check_out(call, indices, shape, "indices");
  if (dt_of(indices.dtype()) != DT::i64)
    call.fail(NPUB_ERR_INVALID_ARGUMENT, "indices: expected dtype int64");
  if (dt_of(values.dtype()) != dt_of(self.dtype()))
    call.fail(NPUB_ERR_INVALID_ARGUMENT, "values: expected the dtype of self");
  visit_compute(dt_of(self.dtype()), [&](auto tag) {
    using T = decltype(tag);
    sort_slices<T>(call, self, self.dim() == 0 ? 0 : dim, k, descending, values, indices);
  });
}

// aten::topk.values(self, k, dim=-1, largest=True, sorted=True, *, values!, indices!)
void topk(Call& call) {
  run_sort(call, call.tensor(0), call.int_arg(2), call.int_arg(1), call.bool_arg(3), call.tensor(5),
           call.tensor(6), "topk");
}

// aten::sort.values_stable(self, *, stable?, dim=-1, descending=False, values!, indices!)
void sort(Call& call) {
  TensorRef self = call.tensor(0);
  const int64_t dim = call.int_arg(2);
  const int64_t k = self.dim() == 0 ? 1 : self.size(static_cast<int32_t>(wrap_dim(call, dim, self.dim())));
  run_sort(call, self, dim, k, call.bool_arg(3), call.tensor(4), call.tensor(5), "sort");
}

}  // namespace

void register_sort(npub::sdk::Registrar& r) {
  r.op("aten::topk.values(Tensor self, SymInt k, int dim=-1, bool largest=True, bool sorted=True, *, "
       "Tensor(a!) values, Tensor(b!) indices) -> (Tensor(a!) values, Tensor(b!) indices)",
       &topk)
      .dtypes(dtypes_numeric())
      .arg_dtypes("indices", {npub::sdk::kInt64})
      .contiguous_only();
  r.op("aten::sort.values_stable(Tensor self, *, bool? stable, int dim=-1, bool descending=False, Tensor(a!) "
       "values, Tensor(b!) indices) -> (Tensor(a!) values, Tensor(b!) indices)",
       &sort)
      .dtypes(dtypes_numeric())
      .arg_dtypes("indices", {npub::sdk::kInt64})
      .contiguous_only();
}

}  // namespace cann_like

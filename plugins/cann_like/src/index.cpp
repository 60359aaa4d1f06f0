// Indexing: index_select, index_copy, gather, scatter, scatter_add,
// index.Tensor, index_put_, cat, nonzero (kernel-allocated output). Every index is checked
// before it is used: an out-of-range index is an error, never a stray read.
// Registered contiguous-only: the dispatcher stages strided tensors. sort
// and topk are in sort.cpp.
#include "elementwise.h"
#include "ops.h"

#include <algorithm>
#include <numeric>

namespace cann_like {

namespace {

int64_t idx_at(const TensorRef& idx, int64_t i) {
  const DT d = dt_of(idx.dtype());
  return load<int64_t>(idx.data<char>() + i * dt_size(d), d);
}

void require_index(const Call& call, const TensorRef& idx, const char* name) {
  const DT d = dt_of(idx.dtype());
  if (d != DT::i64 && d != DT::i32)
    call.fail(NPUB_ERR_INVALID_ARGUMENT,
              std::string(name) + "(): Expected dtype int32/int64 for index but found " + dt_name(d));
}

// aten::index_select.out(self, dim, index, *, out)
void index_select(Call& call) {
  TensorRef self = call.tensor(0), index = call.tensor(2), out = call.tensor(3);
  require_index(call, index, "index_select");
  if (index.dim() > 1)
    call.fail(NPUB_ERR_INVALID_ARGUMENT, "index_select(): Index is supposed to be a vector");
  const int64_t dim = wrap_dim(call, call.int_arg(1), self.dim());
  const int64_t n = index.numel();
  Shape shape = self.sizes();
  if (self.dim() > 0) shape[static_cast<size_t>(dim)] = n;
  const DimView v = dim_view(self, dim);
  // The indices first: a bad index is the caller's error whatever out is.
  for (int64_t i = 0; i < n; ++i) {
    const int64_t k = idx_at(index, i);
    if (k < 0 || k >= v.size)
      call.fail(NPUB_ERR_INDEX, "index out of range in self: index_select(): index " + std::to_string(k) +
                                    " out of range for dimension " + std::to_string(dim) + " of size " +
                                    std::to_string(v.size));
  }
  check_out(call, out, shape);
  if (dt_of(out.dtype()) != dt_of(self.dtype()))
    call.fail(NPUB_ERR_INVALID_ARGUMENT, "index_select(): self and out must have the same dtype");
  const int64_t es = dt_size(dt_of(self.dtype()));
  call.parallel_for(0, v.outer * n, std::max<int64_t>(1, 16384 / std::max<int64_t>(v.inner, 1)),
                    [&](int64_t b, int64_t e) {
                      for (int64_t r = b; r < e; ++r) {
                        const int64_t o = r / n, i = r % n;
                        std::memcpy(out.data<char>() + (o * n + i) * v.inner * es,
                                    self.data<char>() + (o * v.size + idx_at(index, i)) * v.inner * es,
                                    static_cast<size_t>(v.inner * es));
                      }
                    });
}

// aten::index_copy.out(self, dim, index, source, *, out): out = self, then
// out's slice index[i] along dim = source's slice i (a static KV cache's
// update: transformers' StaticCache writes the new keys with index_copy_).
// out may be self (the in-place form): registered alias-safe.
void index_copy(Call& call) {
  TensorRef self = call.tensor(0), index = call.tensor(2), source = call.tensor(3), out = call.tensor(4);
  if (dt_of(index.dtype()) != DT::i64)
    call.fail(NPUB_ERR_INVALID_ARGUMENT,
              std::string("index_copy_(): Expected a long tensor for index, but got ") +
                  dt_name(dt_of(index.dtype())));
  if (index.dim() > 1)
    call.fail(NPUB_ERR_INVALID_ARGUMENT,
              "index_copy_(): Index should have dimension 1 or 0 (got " + std::to_string(index.dim()) + ")");
  if (dt_of(source.dtype()) != dt_of(self.dtype()) || dt_of(out.dtype()) != dt_of(self.dtype()))
    call.fail(NPUB_ERR_INVALID_ARGUMENT, "index_copy_(): self, source and out must have the same dtype");
  const int64_t dim = wrap_dim(call, call.int_arg(1), self.dim());
  const int64_t n = index.numel();
  Shape expected = self.sizes();
  if (self.dim() > 0) expected[static_cast<size_t>(dim)] = n;
  if (source.dim() != self.dim() || (self.dim() > 0 && source.sizes() != expected))
    call.fail(NPUB_ERR_INVALID_ARGUMENT, "index_copy_(): source " + shape_str(source.sizes()) +
                                             " must be self " + shape_str(self.sizes()) + " with dimension " +
                                             std::to_string(dim) + " of the index's size " +
                                             std::to_string(n));
  const DimView v = dim_view(self, dim);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t k = idx_at(index, i);
    if (k < 0 || k >= v.size)
      call.fail(NPUB_ERR_INDEX, "index_copy_(): index " + std::to_string(k) +
                                    " is out of bounds for dimension " + std::to_string(dim) + " with size " +
                                    std::to_string(v.size));
  }
  check_out(call, out, self.sizes());
  const int64_t es = dt_size(dt_of(self.dtype()));
  if (out.data<char>() != self.data<char>())
    std::memcpy(out.data<char>(), self.data<char>(), static_cast<size_t>(self.numel() * es));
  for (int64_t o = 0; o < v.outer; ++o)
    for (int64_t i = 0; i < n; ++i)
      std::memcpy(out.data<char>() + (o * v.size + idx_at(index, i)) * v.inner * es,
                  source.data<char>() + (o * n + i) * v.inner * es, static_cast<size_t>(v.inner * es));
}

// Walks every element of `index` (contiguous) with its coordinate along
// `dim` replaced by the index value: f(index_pos, target_offset_elements).
template <typename F>
void for_each_index(const Call& call, const TensorRef& index, const TensorRef& target, int64_t dim,
                    const char* op, F&& f) {
  const int32_t nd = index.dim();
  if (index.numel() == 0) return;
  if (target.dim() == 0 || nd == 0) {  // 0-d: a single element, index must be 0
    for (int64_t i = 0; i < index.numel(); ++i) {
      const int64_t k = idx_at(index, i);
      const int64_t bound = target.dim() == 0 ? 1 : target.size(static_cast<int32_t>(dim));
      if (k < 0 || k >= bound)
        call.fail(NPUB_ERR_INVALID_ARGUMENT, std::string(op) + "(): index " + std::to_string(k) +
                                                 " is out of bounds for dimension " + std::to_string(dim) +
                                                 " with size " + std::to_string(bound));
      f(i, target.dim() == 0 ? 0 : k * target.stride(static_cast<int32_t>(dim)));
    }
    return;
  }
  if (nd != target.dim() && !(nd <= 1 && target.dim() <= 1))
    call.fail(NPUB_ERR_INVALID_ARGUMENT,
              std::string("Index tensor must have the same number of dimensions as ") +
                  (std::string(op) == "gather" ? "input" : "self") + " tensor");
  for (int32_t d = 0; d < nd; ++d)
    if (d != dim && index.size(d) > target.size(d))
      call.fail(NPUB_ERR_INVALID_ARGUMENT,
                std::string("Size does not match at dimension ") + std::to_string(d) + " expected index " +
                    shape_str(index.sizes()) + " to be smaller than self " + shape_str(target.sizes()) +
                    " apart from dimension " + std::to_string(dim));
  const int64_t n = index.numel();
  const int64_t bound = target.dim() == 0 ? 1 : target.size(static_cast<int32_t>(dim));
  for (int64_t i = 0; i < n; ++i) {
    int64_t rem = i, off = 0;
    int64_t k = idx_at(index, i);
    if (k < 0 || k >= bound)
      call.fail(NPUB_ERR_INVALID_ARGUMENT, std::string(op) + "(): index " + std::to_string(k) +
                                               " is out of bounds for dimension " + std::to_string(dim) +
                                               " with size " + std::to_string(bound));
    for (int32_t d = nd - 1; d >= 0; --d) {
      const int64_t c = rem % index.size(d);
      rem /= index.size(d);
      off += (d == dim ? k : c) * target.stride(d);
    }
    f(i, off);
  }
}

// aten::gather.out(self, dim, index, *, sparse_grad, out)
void gather(Call& call) {
  TensorRef self = call.tensor(0), index = call.tensor(2), out = call.tensor(4);
  if (index.numel() > 0) require_index(call, index, "gather");
  const int64_t dim = wrap_dim(call, call.int_arg(1), self.dim());
  check_out(call, out, index.sizes());
  const DT d = dt_of(self.dtype());
  const int64_t es = dt_size(d);
  for_each_index(call, index, self, dim, "gather", [&](int64_t i, int64_t off) {
    std::memcpy(out.data<char>() + i * es, self.data<char>() + off * es, static_cast<size_t>(es));
  });
}

// aten::scatter.src_out / aten::scatter_add.out(self, dim, index, src, *, out)
template <bool kAdd>
void scatter(Call& call) {
  TensorRef self = call.tensor(0), index = call.tensor(2), src = call.tensor(3), out = call.tensor(4);
  if (index.numel() > 0) require_index(call, index, kAdd ? "scatter_add" : "scatter");
  const int64_t dim = wrap_dim(call, call.int_arg(1), self.dim());
  if (dt_of(src.dtype()) != dt_of(self.dtype()))
    call.fail(NPUB_ERR_INVALID_ARGUMENT,
              std::string("scatter(): Expected self.dtype to be equal to src.dtype"));
  for (int32_t d = 0; d < index.dim(); ++d)
    if (index.size(d) > src.size(d))
      call.fail(NPUB_ERR_INVALID_ARGUMENT, "Size does not match at dimension " + std::to_string(d) +
                                               " expected index " + shape_str(index.sizes()) +
                                               " to be smaller than src " + shape_str(src.sizes()));
  check_out(call, out, self.sizes());
  const DT d = dt_of(self.dtype());
  const int64_t es = dt_size(d);
  if (out.data<char>() != self.data<char>())
    std::memcpy(out.data<char>(), self.data<char>(), static_cast<size_t>(self.numel() * es));
  // src element for index position i: same coordinates in src.
  auto src_off = [&](int64_t i) {
    if (src.dim() == 0) return int64_t{0};
    int64_t rem = i, off = 0;
    for (int32_t dd = index.dim() - 1; dd >= 0; --dd) {
      off += (rem % index.size(dd)) * src.stride(dd);
      rem /= index.size(dd);
    }
    return off;
  };
  // Half types accumulate in float32 and round once at the end.
  const bool widen = kAdd && (d == DT::f16 || d == DT::bf16);
  std::vector<float> acc;
  if (widen) {
    acc.resize(static_cast<size_t>(out.numel()));
    for (int64_t i = 0; i < out.numel(); ++i)
      acc[static_cast<size_t>(i)] = load<float>(out.data<char>() + i * es, d);
  }
  for_each_index(call, index, out, dim, kAdd ? "scatter_add" : "scatter", [&](int64_t i, int64_t off) {
    char* dst = out.data<char>() + off * es;
    const char* s = src.data<char>() + src_off(i) * es;
    if (widen) {
      acc[static_cast<size_t>(off)] += load<float>(s, d);
    } else if (kAdd) {
      visit_compute(d, [&](auto tag) {
        using T = decltype(tag);
        if constexpr (std::is_same_v<T, bool>)
          store<bool>(dst, d, load<bool>(dst, d) || load<bool>(s, d));
        else
          store<T>(dst, d, static_cast<T>(load<T>(dst, d) + load<T>(s, d)));
      });
    } else {
      std::memcpy(dst, s, static_cast<size_t>(es));
    }
  });
  if (widen)
    for (int64_t i = 0; i < out.numel(); ++i)
      store<float>(out.data<char>() + i * es, d, acc[static_cast<size_t>(i)]);
}

// aten::cat.out(Tensor[] tensors, int dim=0, *, out)
// cat's parts of another dtype than out's or laid out otherwise
// (x[..., :k], a slice of the last dim, in rotate_half's cat): converted (or
// strided) copies into the view of out that is their slot.
void copy_other_parts(const Call& call, const std::vector<TensorRef>& parts, const TensorRef& out,
                      int64_t dim, DT d, int64_t es) {
  int64_t offset = 0;
  for (const TensorRef& t : parts) {
    const int64_t size = t.size(static_cast<int32_t>(dim));
    if ((dt_of(t.dtype()) != d || !t.is_contiguous()) && t.numel() > 0) {
      DLTensor slot = *out.raw();
      std::vector<int64_t> slot_shape = t.sizes(), slot_strides = out.strides();
      slot.shape = slot_shape.data();
      slot.strides = slot_strides.data();
      slot.byte_offset += static_cast<uint64_t>(offset * out.stride(static_cast<int32_t>(dim)) * es);
      copy_into(call, TensorRef(&slot), t);
    }
    offset += size;
  }
}

// From this many outer rows on, cat splits rows over the threads (Note
// [cat copies in parallel]).
constexpr int64_t kCatRowsAtLeast = 64;

void cat(Call& call) {
  const auto ts = call.tensor_list(0);
  TensorRef out = call.tensor(2);
  if (ts.empty()) call.fail(NPUB_ERR_INVALID_ARGUMENT, "torch.cat(): expected a non-empty list of Tensors");
  // Legacy rule: 1-d empty tensors are skipped.
  std::vector<TensorRef> parts;
  for (const auto& t : ts)
    if (!(t.dim() == 1 && t.size(0) == 0)) parts.push_back(t);
  if (parts.empty()) {
    check_out(call, out, {0});
    return;
  }
  const TensorRef& ref = parts.front();
  const int64_t dim = wrap_dim(call, call.int_arg(1), ref.dim());
  if (ref.dim() == 0)
    call.fail(NPUB_ERR_INVALID_ARGUMENT, "zero-dimensional tensor (at position 0) cannot be concatenated");
  Shape shape = ref.sizes();
  shape[static_cast<size_t>(dim)] = 0;
  const DT d = dt_of(out.dtype());
  for (size_t p = 0; p < parts.size(); ++p) {
    const TensorRef& t = parts[p];
    if (t.dim() != ref.dim())
      call.fail(NPUB_ERR_INVALID_ARGUMENT, "Tensors must have same number of dimensions: got " +
                                               std::to_string(ref.dim()) + " and " + std::to_string(t.dim()));
    for (int32_t i = 0; i < t.dim(); ++i)
      if (i != dim && t.size(i) != ref.size(i))
        call.fail(NPUB_ERR_INVALID_ARGUMENT, "Sizes of tensors must match except in dimension " +
                                                 std::to_string(dim) + ". Expected size " +
                                                 std::to_string(ref.size(i)) + " but got size " +
                                                 std::to_string(t.size(i)) + " for tensor number " +
                                                 std::to_string(p) + " in the list.");
    shape[static_cast<size_t>(dim)] += t.size(static_cast<int32_t>(dim));
  }
  check_out(call, out, shape);
  if (!out.is_contiguous())
    call.fail(NPUB_ERR_UNSUPPORTED,
              "cat: an out laid out other than contiguously (the host's fallback serves it)");
  const int64_t es = dt_size(d);
  const DimView ov = dim_view(out, dim);
  // Note [cat copies in parallel]
  // Parts of out's dtype are byte copies. Along an inner dim (many outer
  // rows: rotate_half's cat of [4,4,128,32] halves has 2048), each output
  // row is one block per part, and the rows are split over the compute
  // threads: listing the 4096 blocks as jobs first took most of the call
  // (47 us against ATen's 16). With few outer rows every (part, outer
  // index) block is a job, and the jobs' bytes, laid end to end, are split
  // evenly over the compute threads (a block may be shared by two
  // threads). Parts of another dtype or layout are copied below.
  if (ov.outer >= kCatRowsAtLeast) {
    struct RowPart {
      const char* src;
      int64_t bytes, at;  // bytes per outer row, and where they go in out's row
    };
    std::vector<RowPart> row_parts;
    int64_t offset = 0;
    for (const TensorRef& t : parts) {
      const DimView v = dim_view(t, dim);
      if (dt_of(t.dtype()) == d && t.is_contiguous() && v.size * v.inner > 0)
        row_parts.push_back({t.data<char>(), v.size * v.inner * es, offset * ov.inner * es});
      offset += v.size;
    }
    const int64_t row_bytes = ov.size * ov.inner * es;
    char* ob = out.data<char>();
    call.parallel_for(0, ov.outer, std::max<int64_t>(1, (int64_t{1} << 16) / std::max<int64_t>(row_bytes, 1)),
                      [&](int64_t b, int64_t e) {
                        for (int64_t o = b; o < e; ++o)
                          for (const RowPart& rp : row_parts)
                            std::memcpy(ob + o * row_bytes + rp.at, rp.src + o * rp.bytes,
                                        static_cast<size_t>(rp.bytes));
                      });
    copy_other_parts(call, parts, out, dim, d, es);
    return;
  }
  struct Job {
    char* dst;
    const char* src;
    int64_t bytes, start;  // start: the job's first byte in the concatenation of all jobs
  };
  std::vector<Job> jobs;
  int64_t total = 0;
  {
    int64_t offset = 0;
    for (const TensorRef& t : parts) {
      const DimView v = dim_view(t, dim);
      if (dt_of(t.dtype()) == d && t.is_contiguous())
        for (int64_t o = 0; o < v.outer; ++o) {
          const int64_t bytes = v.size * v.inner * es;
          if (bytes == 0) continue;
          jobs.push_back({out.data<char>() + (o * ov.size + offset) * ov.inner * es,
                          t.data<char>() + o * v.size * v.inner * es, bytes, total});
          total += bytes;
        }
      offset += v.size;
    }
  }
  call.parallel_for(0, total, 1 << 16, [&](int64_t b, int64_t e) {
    auto it =
        std::upper_bound(jobs.begin(), jobs.end(), b, [](int64_t x, const Job& j) { return x < j.start; });
    for (--it; it != jobs.end() && it->start < e; ++it) {
      const int64_t lo = std::max(b, it->start) - it->start,
                    hi = std::min(e, it->start + it->bytes) - it->start;
      std::memcpy(it->dst + lo, it->src + lo, static_cast<size_t>(hi - lo));
    }
  });
  copy_other_parts(call, parts, out, dim, d, es);
}

// aten::nonzero(Tensor self) -> Tensor: [n, ndim] int64, allocated here (the
// shape depends on the data).
void nonzero(Call& call) {
  TensorRef self = call.tensor(0);
  const DT d = dt_of(self.dtype());
  const int64_t n = self.numel(), es = dt_size(d);
  std::vector<int64_t> hits;
  for (int64_t i = 0; i < n; ++i)
    if (load<bool>(self.data<char>() + i * es, d)) hits.push_back(i);
  TensorRef out = call.output(0, {static_cast<int64_t>(hits.size()), self.dim()}, npub::sdk::kInt64);
  int64_t* po = out.data<int64_t>();
  for (size_t h = 0; h < hits.size(); ++h) {
    int64_t rem = hits[h];
    for (int32_t dd = self.dim() - 1; dd >= 0; --dd) {
      po[h * static_cast<size_t>(self.dim()) + static_cast<size_t>(dd)] = rem % self.size(dd);
      rem /= self.size(dd);
    }
  }
}

// ---------------------------------------------------------------------------
// advanced indexing: index.Tensor_out and index_put_
// ---------------------------------------------------------------------------

// self[indices] as ATen defines it: bool/uint8 masks become the long indices
// of their non-zero elements; the index tensors broadcast together; if the
// indexed dims are adjacent the broadcast shape replaces them in place,
// otherwise it comes first.
// Note [Advanced indexing moves rows]
// The trailing result dims that are self's own (not indexed) and lie
// row-major in self form one contiguous run of `inner` elements (a gathered
// row of x[idx] for x [T, H] is H elements). Offsets are computed per run,
// not per element, and a run moves with one memcpy (or one typed add loop
// for index_put_'s accumulate): x[idx] and index_put_ on rows were 25-60x
// ATen's, an offset per element worked out with a division per dim.
struct AdvancedIndex {
  Shape result;                      // shape of self[indices]
  int64_t inner = 1;                 // elements per run (see the Note)
  std::vector<int64_t> src_offsets;  // per run of the result: element offset into self of its first element
};

AdvancedIndex plan_advanced_index(const Call& call, const TensorRef& self,
                                  const std::vector<TensorRef>& raw) {
  const int32_t nd = self.dim();
  // 1. One (possibly empty) long index per self dim, masks expanded.
  std::vector<std::vector<int64_t>> idx_values;  // per indexed dim
  std::vector<Shape> idx_shapes;
  std::vector<int32_t> idx_dims;
  int32_t dim = 0;
  for (const TensorRef& t : raw) {
    if (!t.defined()) {
      ++dim;
      continue;
    }
    const DT d = dt_of(t.dtype());
    if (d == DT::b8 || d == DT::u8) {
      if (dim + t.dim() > nd)
        call.fail(NPUB_ERR_INVALID_ARGUMENT,
                  "too many indices for tensor of dimension " + std::to_string(nd));
      for (int32_t k = 0; k < t.dim(); ++k)
        if (t.size(k) != self.size(dim + k))
          call.fail(NPUB_ERR_INVALID_ARGUMENT,
                    "The shape of the mask " + shape_str(t.sizes()) + " at index " + std::to_string(k) +
                        " does not match the shape of the indexed tensor " + shape_str(self.sizes()) +
                        " at index " + std::to_string(dim + k));
      std::vector<std::vector<int64_t>> cols(static_cast<size_t>(t.dim()));
      for (int64_t i = 0; i < t.numel(); ++i) {
        if (!load<bool>(t.data<char>() + i * dt_size(d), d)) continue;
        int64_t rem = i;
        for (int32_t k = t.dim() - 1; k >= 0; --k) {
          cols[static_cast<size_t>(k)].push_back(rem % t.size(k));
          rem /= t.size(k);
        }
      }
      for (int32_t k = 0; k < t.dim(); ++k) {
        std::vector<int64_t> v(cols[static_cast<size_t>(k)]);
        idx_shapes.push_back({static_cast<int64_t>(v.size())});
        idx_values.push_back(std::move(v));
        idx_dims.push_back(dim + k);
      }
      dim += t.dim() == 0 ? 1 : t.dim();
      continue;
    }
    if (d != DT::i64 && d != DT::i32)
      call.fail(NPUB_ERR_INVALID_ARGUMENT,
                std::string("tensors used as indices must be long, int, byte or bool tensors, but found ") +
                    dt_name(d));
    if (dim >= nd)
      call.fail(NPUB_ERR_INVALID_ARGUMENT, "too many indices for tensor of dimension " + std::to_string(nd));
    std::vector<int64_t> v(static_cast<size_t>(t.numel()));
    for (int64_t i = 0; i < t.numel(); ++i) {
      int64_t k = load<int64_t>(t.data<char>() + i * dt_size(d), d);
      const int64_t size = self.size(dim);
      if (k < -size || k >= size)
        call.fail(NPUB_ERR_INDEX, "index " + std::to_string(k) + " is out of bounds for dimension " +
                                      std::to_string(dim) + " with size " + std::to_string(size));
      v[static_cast<size_t>(i)] = k < 0 ? k + size : k;
    }
    idx_shapes.push_back(t.sizes());
    idx_values.push_back(std::move(v));
    idx_dims.push_back(dim);
    ++dim;
  }
  if (idx_dims.empty())
    call.fail(NPUB_ERR_INVALID_ARGUMENT, "index: at least one index tensor must be defined");
  // 2. Broadcast the index shapes.
  Shape b = idx_shapes[0];
  for (size_t i = 1; i < idx_shapes.size(); ++i) b = broadcast(call, b, idx_shapes[i]);
  bool adjacent = true;
  for (size_t i = 1; i < idx_dims.size(); ++i) adjacent = adjacent && idx_dims[i] == idx_dims[i - 1] + 1;
  // 3. Result shape: [before..., B..., after...] or [B..., rest...].
  std::vector<int32_t> rest;
  for (int32_t d2 = 0; d2 < nd; ++d2)
    if (std::find(idx_dims.begin(), idx_dims.end(), d2) == idx_dims.end()) rest.push_back(d2);
  AdvancedIndex plan;
  std::vector<int32_t> layout;  // per result dim: self dim (>= 0) or -1 - position in B
  const int32_t first = idx_dims.front();
  auto push_b = [&] {
    for (size_t k = 0; k < b.size(); ++k) layout.push_back(-1 - static_cast<int32_t>(k));
  };
  if (adjacent) {
    for (int32_t d2 : rest)
      if (d2 < first) layout.push_back(d2);
    push_b();
    for (int32_t d2 : rest)
      if (d2 > first) layout.push_back(d2);
  } else {
    push_b();
    for (int32_t d2 : rest) layout.push_back(d2);
  }
  for (int32_t l : layout) plan.result.push_back(l >= 0 ? self.size(l) : b[static_cast<size_t>(-1 - l)]);
  // 4. The contiguous trailing run (Note [Advanced indexing moves rows]).
  size_t outer_dims = layout.size();
  for (int64_t expect = 1;
       outer_dims > 0 && layout[outer_dims - 1] >= 0 && self.stride(layout[outer_dims - 1]) == expect;
       --outer_dims) {
    expect *= self.size(layout[outer_dims - 1]);
    plan.inner = expect;
  }
  // 5. Source offsets, per run.
  const int64_t n = plan.inner == 0 ? 0 : numel_of(plan.result) / plan.inner;
  plan.src_offsets.resize(static_cast<size_t>(n));
  std::vector<int64_t> coord(outer_dims);
  std::vector<int64_t> bcoord(b.size());
  for (int64_t e = 0; e < n; ++e) {
    int64_t rem = e;
    for (size_t k = outer_dims; k-- > 0;) {
      coord[k] = rem % plan.result[k];
      rem /= plan.result[k];
    }
    int64_t off = 0;
    for (size_t k = 0; k < outer_dims; ++k) {
      if (layout[k] >= 0)
        off += coord[k] * self.stride(layout[k]);
      else
        bcoord[static_cast<size_t>(-1 - layout[k])] = coord[k];
    }
    for (size_t i = 0; i < idx_dims.size(); ++i) {
      // Flat position in index tensor i, broadcast from bcoord.
      const Shape& s = idx_shapes[i];
      int64_t flat = 0;
      for (size_t k = 0; k < s.size(); ++k) {
        const size_t bk = b.size() - s.size() + k;
        flat = flat * s[k] + (s[k] == 1 ? 0 : bcoord[bk]);
      }
      off += idx_values[i][static_cast<size_t>(flat)] * self.stride(idx_dims[i]);
    }
    plan.src_offsets[static_cast<size_t>(e)] = off;
  }
  return plan;
}

// aten::index.Tensor_out(self, Tensor?[] indices, *, out)
void index_tensor(Call& call) {
  TensorRef self = call.tensor(0), out = call.tensor(2);
  const AdvancedIndex plan = plan_advanced_index(call, self, call.tensor_list(1));
  check_out(call, out, plan.result);
  if (dt_of(out.dtype()) != dt_of(self.dtype()))
    call.fail(NPUB_ERR_INVALID_ARGUMENT, "index: out must have the dtype of self");
  const int64_t es = dt_size(dt_of(self.dtype()));
  const int64_t runs = static_cast<int64_t>(plan.src_offsets.size()), bytes = plan.inner * es;
  call.parallel_for(0, runs, std::max<int64_t>(1, (1 << 15) / std::max<int64_t>(bytes, 1)),
                    [&](int64_t b, int64_t e) {
                      for (int64_t r = b; r < e; ++r)
                        std::memcpy(out.data<char>() + r * bytes,
                                    self.data<char>() + plan.src_offsets[static_cast<size_t>(r)] * es,
                                    static_cast<size_t>(bytes));
                    });
}

// aten::index_put_(Tensor(a!) self, Tensor?[] indices, Tensor values, bool accumulate=False)
void index_put(Call& call) {
  TensorRef self = call.tensor(0), values = call.tensor(2);
  const bool accumulate = call.bool_arg(3);
  const AdvancedIndex plan = plan_advanced_index(call, self, call.tensor_list(1));
  const Shape vb = broadcast(call, values.sizes(), plan.result);
  if (vb != plan.result)
    call.fail(NPUB_ERR_INVALID_ARGUMENT,
              "shape mismatch: value tensor of shape " + shape_str(values.sizes()) +
                  " cannot be broadcast to indexing result of shape " + shape_str(plan.result));
  const DT d = dt_of(self.dtype()), vd = dt_of(values.dtype());
  if (d != vd)
    call.fail(NPUB_ERR_INVALID_ARGUMENT,
              std::string("Index put requires the source and destination dtypes match, got ") + dt_name(d) +
                  " for the destination and " + dt_name(vd) + " for the source.");
  const int64_t es = dt_size(d);
  // Runs in order, one at a time (duplicate indices: accumulate adds each,
  // and otherwise the last write stays, as ATen's CPU kernel).
  if (values.is_contiguous() && values.sizes() == plan.result) {
    const int64_t bytes = plan.inner * es;
    for (size_t r = 0; r < plan.src_offsets.size(); ++r) {
      char* dst = self.data<char>() + plan.src_offsets[r] * es;
      const char* src = values.data<char>() + static_cast<int64_t>(r) * bytes;
      if (!accumulate) {
        std::memcpy(dst, src, static_cast<size_t>(bytes));
        continue;
      }
      visit_compute(d, [&](auto tag) {
        using T = decltype(tag);
        if (dt_for<T>() == d && !std::is_same_v<T, bool>) {
          T* dt = reinterpret_cast<T*>(dst);
          const T* st = reinterpret_cast<const T*>(src);
          for (int64_t j = 0; j < plan.inner; ++j) dt[j] = static_cast<T>(dt[j] + st[j]);
          return;
        }
        for (int64_t j = 0; j < plan.inner; ++j) {
          if constexpr (std::is_same_v<T, bool>)
            store<bool>(dst + j * es, d, load<bool>(dst + j * es, d) || load<bool>(src + j * es, d));
          else
            store<T>(dst + j * es, d, static_cast<T>(load<T>(dst + j * es, d) + load<T>(src + j * es, d)));
        }
      });
    }
    return;
  }
  const int64_t n = static_cast<int64_t>(plan.src_offsets.size()) * plan.inner;
  for (int64_t e = 0; e < n; ++e) {
    // values element for result position e (broadcast).
    int64_t rem = e, voff = 0;
    for (size_t k = plan.result.size(); k-- > 0;) {
      const int64_t c = rem % plan.result[k];
      rem /= plan.result[k];
      const int64_t vk = static_cast<int64_t>(k) -
                         static_cast<int64_t>(plan.result.size() - static_cast<size_t>(values.dim()));
      if (vk >= 0 && values.size(static_cast<int32_t>(vk)) != 1)
        voff += c * values.stride(static_cast<int32_t>(vk));
    }
    char* dst =
        self.data<char>() + (plan.src_offsets[static_cast<size_t>(e / plan.inner)] + e % plan.inner) * es;
    const char* src = values.data<char>() + voff * es;
    if (accumulate) {
      visit_compute(d, [&](auto tag) {
        using T = decltype(tag);
        if constexpr (std::is_same_v<T, bool>)
          store<bool>(dst, d, load<bool>(dst, d) || load<bool>(src, d));
        else
          store<T>(dst, d, static_cast<T>(load<T>(dst, d) + load<T>(src, d)));
      });
    } else {
      std::memcpy(dst, src, static_cast<size_t>(es));
    }
  }
}

}  // namespace

void register_index(npub::sdk::Registrar& r) {
  const auto all = dtypes_all();
  r.op("aten::index_select.out(Tensor self, int dim, Tensor index, *, Tensor(a!) out) -> Tensor(a!)",
       &index_select)
      .dtypes(all)
      .arg_dtypes("index", {npub::sdk::kInt64, npub::sdk::kInt32})
      .contiguous_only();
  r.op("aten::index_copy.out(Tensor self, int dim, Tensor index, Tensor source, *, Tensor(a!) out) -> "
       "Tensor(a!)",
       &index_copy)
      .dtypes(all)
      .arg_dtypes("index", {npub::sdk::kInt64})
      .contiguous_only()
      .alias_safe();
  r.op("aten::gather.out(Tensor self, int dim, Tensor index, *, bool sparse_grad=False, Tensor(a!) out) -> "
       "Tensor(a!)",
       &gather)
      .dtypes(all)
      .arg_dtypes("index", {npub::sdk::kInt64})
      .contiguous_only();
  r.op("aten::scatter.src_out(Tensor self, int dim, Tensor index, Tensor src, *, Tensor(a!) out) -> "
       "Tensor(a!)",
       &scatter<false>)
      .dtypes(all)
      .arg_dtypes("index", {npub::sdk::kInt64})
      .contiguous_only()
      .alias_safe();  // scatter_: out is self (copied only when apart); ATen refuses out overlapping src
  r.op("aten::scatter_add.out(Tensor self, int dim, Tensor index, Tensor src, *, Tensor(a!) out) -> "
       "Tensor(a!)",
       &scatter<true>)
      .dtypes(dtypes_numeric())
      .arg_dtypes("index", {npub::sdk::kInt64})
      .contiguous_only();
  r.op("aten::index.Tensor_out(Tensor self, Tensor?[] indices, *, Tensor(a!) out) -> Tensor(a!)",
       &index_tensor)
      .dtypes(all)
      .arg_dtypes("indices", {npub::sdk::kInt64, npub::sdk::kInt32, npub::sdk::kBool, npub::sdk::kUInt8})
      .contiguous_only();
  r.op("aten::index_put_(Tensor(a!) self, Tensor?[] indices, Tensor values, bool accumulate=False) -> "
       "Tensor(a!)",
       &index_put)
      .dtypes(all)
      .arg_dtypes("indices", {npub::sdk::kInt64, npub::sdk::kInt32, npub::sdk::kBool, npub::sdk::kUInt8})
      .contiguous_only();
  // What autograd's index backward calls (accumulate=True into zeros);
  // `unsafe` only lets ATen skip its index checks, which this kernel makes.
  r.op("aten::_index_put_impl_(Tensor(a!) self, Tensor?[] indices, Tensor values, bool accumulate=False, "
       "bool "
       "unsafe=False) -> Tensor(a!)",
       &index_put)
      .dtypes(all)
      .arg_dtypes("indices", {npub::sdk::kInt64, npub::sdk::kInt32, npub::sdk::kBool, npub::sdk::kUInt8})
      .contiguous_only();
  r.op("aten::cat.out(Tensor[] tensors, int dim=0, *, Tensor(a!) out) -> Tensor(a!)", &cat)
      .dtypes(all)
      .mixed_dtypes();  // the inputs are promoted to out's dtype, as ATen does; any layout
  r.op("aten::nonzero(Tensor self) -> Tensor", &nonzero).dtypes(all).contiguous_only();
}

}  // namespace cann_like

#include "overlap.h"

#include <npubridge/support/dtype.h>
#include <npubridge/support/error.h>

#include <algorithm>
#include <array>
#include <cstdlib>
#include <string>

namespace npub {

namespace {

// One tensor of the call, with the memory it spans.
struct Extent {
  const DLTensor* t;
  const reg::Argument* arg;  // for messages
  const char* lo;            // first byte
  const char* hi;            // one past the last byte
  bool written;
  bool empty;  // no elements: overlaps nothing
};

int64_t stride_of(const DLTensor& t, int d, int64_t contiguous) {
  return t.strides != nullptr ? t.strides[d] : contiguous;
}

Extent extent_of(const DLTensor* t, const reg::Argument* arg, bool written) {
  Extent e{t, arg, nullptr, nullptr, written, true};
  const int64_t es = element_size(dtype_of(t->dtype));
  int64_t lo = 0, hi = 0, contiguous = 1;
  for (int d = t->ndim - 1; d >= 0; --d) {
    const int64_t n = t->shape[d];
    if (n == 0) return e;
    const int64_t s = stride_of(*t, d, contiguous);
    contiguous *= n;
    if (s >= 0)
      hi += (n - 1) * s;
    else
      lo += (n - 1) * s;
  }
  const char* base = static_cast<const char*>(t->data) + t->byte_offset;
  e.lo = base + lo * es;
  e.hi = base + (hi + 1) * es;
  e.empty = false;
  return e;
}

// Dense (no gaps, no overlap) in some order of the dimensions: ATen's
// is_non_overlapping_and_dense.
bool dense(const DLTensor& t) {
  if (t.strides == nullptr) return true;
  std::array<int64_t, 64> order;
  int n = 0;
  for (int d = 0; d < t.ndim; ++d)
    if (t.shape[d] != 1) order[static_cast<size_t>(n++)] = d;
  std::sort(order.begin(), order.begin() + n,
            [&](int64_t a, int64_t b) { return t.strides[a] < t.strides[b]; });
  int64_t expected = 1;
  for (int i = 0; i < n; ++i) {
    const int64_t d = order[static_cast<size_t>(i)];
    if (t.strides[d] != expected) return false;
    expected *= t.shape[d];
  }
  return true;
}

// ATen's has_internal_overlap() == MemOverlap::Yes.
bool internal_overlap(const DLTensor& t) {
  if (t.strides == nullptr) return false;
  bool stride0 = false;
  for (int d = 0; d < t.ndim; ++d) {
    if (t.shape[d] == 0) return false;  // no elements, nothing to overlap
    stride0 = stride0 || (t.strides[d] == 0 && t.shape[d] > 1);
  }
  return stride0;
}

bool same_view(const DLTensor& a, const DLTensor& b) {
  if (&a == &b) return true;
  if (static_cast<const char*>(a.data) + a.byte_offset != static_cast<const char*>(b.data) + b.byte_offset)
    return false;
  if (a.ndim != b.ndim || a.dtype.bits != b.dtype.bits || a.dtype.lanes != b.dtype.lanes) return false;
  int64_t ca = 1, cb = 1;
  for (int d = a.ndim - 1; d >= 0; --d) {
    if (a.shape[d] != b.shape[d]) return false;
    if (a.shape[d] != 1 && stride_of(a, d, ca) != stride_of(b, d, cb)) return false;
    ca *= a.shape[d];
    cb *= b.shape[d];
  }
  return true;
}

// One dimension of two views with the same stride: an element of a at
// index i and one of b at index j differ by k = i - j in [kmin, kmax] =
// [-(size_b - 1), size_a - 1] steps of `stride`.
struct StepRange {
  int64_t stride, kmin, kmax;
};

// Whether element delta (in elements) is a difference of two index vectors
// of the two views: sum k_i * stride_i with k_i in [kmin_i, kmax_i]. `dims`
// are largest stride first; `rest[i]` bounds what the dimensions after i
// can add. Each dimension tries the few k that leave a remainder the rest
// can still reach (one or two for a layout whose strides nest); beyond 64
// candidates it answers "reachable".
bool reachable(int64_t delta, const std::array<StepRange, 64>& dims, const std::array<int64_t, 65>& rest,
               int i, int n, int* budget) {
  if (i == n) return delta == 0;
  const StepRange& d = dims[static_cast<size_t>(i)];
  const int64_t bound = rest[static_cast<size_t>(i + 1)];
  // k with |delta - k * stride| <= bound, within [kmin, kmax].
  auto floor_div = [](int64_t a, int64_t b) { return a / b - ((a % b != 0) && ((a < 0) != (b < 0))); };
  int64_t lo = -floor_div(-(delta - bound), d.stride), hi = floor_div(delta + bound, d.stride);
  lo = std::max(lo, d.kmin);
  hi = std::min(hi, d.kmax);
  for (int64_t k = lo; k <= hi; ++k) {
    if (--*budget < 0) return true;
    if (reachable(delta - k * d.stride, dims, rest, i + 1, n, budget)) return true;
  }
  return false;
}

// False when two views with the same element size and the same positive
// strides (their sizes may differ) at different offsets provably share no
// element: x[:, 0] and x[:, 1], x[::2] and x[1::2], out=buf[:, :d] beside
// buf[:, d:], the query and key column slices of one qkv projection
// (qkv[:, :q_size], qkv[:, q_size:q_size + kv_size]). True otherwise (they
// may).
bool may_share_an_element(const DLTensor& a, const DLTensor& b) {
  const int64_t es = element_size(dtype_of(a.dtype));
  if (a.ndim != b.ndim || a.dtype.bits != b.dtype.bits || a.dtype.lanes != b.dtype.lanes || es <= 0)
    return true;
  const int64_t delta_bytes =
      (static_cast<const char*>(b.data) + b.byte_offset) - (static_cast<const char*>(a.data) + a.byte_offset);
  if (delta_bytes % es != 0) return true;
  std::array<StepRange, 64> dims;
  int n = 0;
  int64_t ca = 1, cb = 1;
  for (int d = a.ndim - 1; d >= 0; --d) {
    const int64_t sa = stride_of(a, d, ca), sb = stride_of(b, d, cb);
    ca *= a.shape[d];
    cb *= b.shape[d];
    if (a.shape[d] == 1 && b.shape[d] == 1) continue;  // k = 0 whatever the strides
    if (sa != sb || sa <= 0) return true;
    dims[static_cast<size_t>(n++)] = {sa, -(b.shape[d] - 1), a.shape[d] - 1};
  }
  std::sort(dims.begin(), dims.begin() + n,
            [](const StepRange& x, const StepRange& y) { return x.stride > y.stride; });
  std::array<int64_t, 65> rest;
  rest[static_cast<size_t>(n)] = 0;
  for (int i = n - 1; i >= 0; --i) {
    const StepRange& d = dims[static_cast<size_t>(i)];
    rest[static_cast<size_t>(i)] = rest[static_cast<size_t>(i + 1)] + std::max(d.kmax, -d.kmin) * d.stride;
  }
  int budget = 64;
  return reachable(delta_bytes / es, dims, rest, 0, n, &budget);
}

bool same_device(const DLTensor& a, const DLTensor& b) {
  return a.device.device_type == b.device.device_type && a.device.device_id == b.device.device_id;
}

// Ops ATen lets write an internally overlapping (expanded) self: fill_ and
// zero_ (every write the same), and masked_fill_, index_put_ and
// index_fill_, which ATen only warns about (deprecated) and still runs.
bool writes_overlapping_self(const Dispatcher::CallState& cs) {
  const std::string& name = cs.op->name();
  return name == "aten::fill_.Scalar" || name == "aten::fill_.Tensor" || name == "aten::zero_" ||
         name.rfind("aten::masked_fill_", 0) == 0 || name == "aten::index_put_" ||
         name == "aten::_index_put_impl_" || name.rfind("aten::index_fill_", 0) == 0;
}

[[noreturn]] void refuse_as_aten(const Dispatcher::CallState& cs, const Extent& w, const char* what) {
  const std::string name = w.arg->name.empty() ? "return" : w.arg->name;  // returns have no name
  throw Error(ErrorCode::kInvalidArgument, "op '" + cs.op->name() + "', argument '" + name +
                                               "': unsupported operation: " + what +
                                               " Please clone() the tensor before performing the operation.");
}

}  // namespace

Overlap classify_overlap(const Dispatcher::CallState& cs, bool refuse) {
  const auto& sargs = cs.op->schema().arguments;
  const auto& rets = cs.op->schema().returns;
  const auto& alias = cs.op->return_alias();
  // Visits every tensor of the call: fn(tensor, argument, written).
  auto for_each_tensor = [&](auto&& fn) {
    for (int32_t i = 0; i < cs.num_args; ++i) {
      const NpubValue& v = cs.args[i];
      const reg::Argument& a = sargs[static_cast<size_t>(i)];
      if (v.tag == NPUB_VALUE_TENSOR) {
        fn(v.u.tensor, a, a.is_write());
      } else if (v.tag == NPUB_VALUE_TENSOR_LIST) {
        for (int32_t j = 0; j < v.count; ++j)
          if (v.u.tensors[j] != nullptr) fn(v.u.tensors[j], a, a.is_write());
      }
    }
    for (int32_t i = 0; i < cs.num_rets; ++i)
      if (alias[static_cast<size_t>(i)] < 0 && cs.rets[i].tag == NPUB_VALUE_TENSOR)
        fn(cs.rets[i].u.tensor, rets[static_cast<size_t>(i)], true);
  };
  // First pass, allocation-free: internal overlap of the written tensors,
  // and whether there is a pair to compare at all (most calls stop here or
  // compare two or three tensors).
  size_t n = 0;
  bool any_written = false, internal = false;
  for_each_tensor([&](const DLTensor* t, const reg::Argument& a, bool written) {
    ++n;
    if (!written) return;
    any_written = true;
    if (internal_overlap(*t) && !writes_overlapping_self(cs)) {
      Extent w{};
      w.arg = &a;
      if (refuse)
        refuse_as_aten(cs, w,
                       "more than one element of the written-to tensor refers to a single memory location.");
      internal = true;
    }
  });
  if (internal) return Overlap::kUnsafe;
  if (!any_written || n < 2) return Overlap::kNone;

  std::array<Extent, 8> inline_extents;  // not zeroed: written before read
  std::vector<Extent> heap;
  if (n > inline_extents.size()) heap.resize(n);
  Extent* e = n > inline_extents.size() ? heap.data() : inline_extents.data();
  size_t k = 0;
  for_each_tensor(
      [&](const DLTensor* t, const reg::Argument& a, bool written) { e[k++] = extent_of(t, &a, written); });

  Overlap verdict = Overlap::kNone;
  for (size_t i = 0; i < n; ++i) {
    const Extent& w = e[i];
    if (!w.written || w.empty) continue;
    for (size_t j = 0; j < n; ++j) {
      const Extent& r = e[j];
      if (j == i || r.empty || !same_device(*w.t, *r.t)) continue;
      if (!(w.lo < r.hi && r.lo < w.hi)) continue;                                // disjoint memory
      if (!same_view(*w.t, *r.t) && !may_share_an_element(*w.t, *r.t)) continue;  // interleaved
      if (r.written) {
        if (j > i) verdict = Overlap::kUnsafe;  // two written tensors share memory
        continue;
      }
      if (same_view(*w.t, *r.t)) {
        if (verdict == Overlap::kNone) verdict = Overlap::kFull;
      } else if (dense(*w.t) && dense(*r.t) && refuse) {
        refuse_as_aten(cs, w,
                       "some elements of the input tensor and the written-to tensor refer to a single memory "
                       "location.");
      } else {
        verdict = Overlap::kUnsafe;
      }
    }
  }
  return verdict;
}

}  // namespace npub

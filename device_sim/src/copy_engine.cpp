#include <npubridge/device_sim/compute_pool.h>
#include <npubridge/device_sim/copy_engine.h>
#include <npubridge/device_sim/stream.h>
#include <npubridge/support/dtype.h>
#include <npubridge/support/error.h>
#include <npubridge/support/shape.h>
#include <npubridge/half.hpp>

#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

namespace npub::sim {

namespace {

struct BF16 {
  uint16_t bits;
};
struct F16 {
  uint16_t bits;
};

// Converts one element. Floating -> integral truncates toward zero (as a C
// cast); anything -> bool is "non-zero".
template <typename To, typename From>
inline To convert(From v) {
  if constexpr (std::is_same_v<From, BF16>) {
    return convert<To>(half::bf16_to_float(v.bits));
  } else if constexpr (std::is_same_v<From, F16>) {
    return convert<To>(half::half_to_float(v.bits));
  } else if constexpr (std::is_same_v<To, BF16>) {
    return BF16{half::float_to_bf16(static_cast<float>(v))};
  } else if constexpr (std::is_same_v<To, F16>) {
    return F16{half::float_to_half(static_cast<float>(v))};
  } else if constexpr (std::is_same_v<To, bool>) {
    return v != From(0);
  } else {
    return static_cast<To>(v);
  }
}

std::vector<int64_t> strides_of(const DLTensor& t) {
  std::vector<int64_t> s(static_cast<size_t>(t.ndim));
  int64_t acc = 1;
  for (int i = t.ndim - 1; i >= 0; --i) {
    s[static_cast<size_t>(i)] = t.strides != nullptr ? t.strides[i] : acc;
    acc *= t.shape[i];
  }
  return s;
}

struct Plan {
  const DLTensor* dst;
  const DLTensor* src;
  std::vector<int64_t> dst_strides, src_strides;
  int64_t inner;  // elements along the last dim
  int64_t rows;   // product of the other dims
};

template <typename To, typename From>
void copy_rows(const Plan& p, int64_t row_begin, int64_t row_end) {
  const int nd = p.dst->ndim;
  auto* dbase = reinterpret_cast<To*>(static_cast<char*>(p.dst->data) + p.dst->byte_offset);
  auto* sbase = reinterpret_cast<const From*>(static_cast<const char*>(p.src->data) + p.src->byte_offset);
  const int64_t ds = nd > 0 ? p.dst_strides[static_cast<size_t>(nd - 1)] : 1;
  const int64_t ss = nd > 0 ? p.src_strides[static_cast<size_t>(nd - 1)] : 1;
  for (int64_t r = row_begin; r < row_end; ++r) {
    // Decompose the row index over dims [0, nd - 1).
    int64_t doff = 0, soff = 0, rem = r;
    for (int d = nd - 2; d >= 0; --d) {
      const int64_t idx = rem % p.dst->shape[d];
      rem /= p.dst->shape[d];
      doff += idx * p.dst_strides[static_cast<size_t>(d)];
      soff += idx * p.src_strides[static_cast<size_t>(d)];
    }
    To* dp = dbase + doff;
    const From* sp = sbase + soff;
    if (ds == 1 && ss == 1) {
      for (int64_t i = 0; i < p.inner; ++i) dp[i] = convert<To>(sp[i]);
    } else {
      for (int64_t i = 0; i < p.inner; ++i) dp[i * ds] = convert<To>(sp[i * ss]);
    }
  }
}

template <typename F>
void visit_type(DType t, F&& f) {
  switch (t) {
    case DType::kFloat32:
      return f(float{});
    case DType::kFloat64:
      return f(double{});
    case DType::kFloat16:
      return f(F16{});
    case DType::kBFloat16:
      return f(BF16{});
    case DType::kInt64:
      return f(int64_t{});
    case DType::kInt32:
      return f(int32_t{});
    case DType::kInt16:
      return f(int16_t{});
    case DType::kInt8:
      return f(int8_t{});
    case DType::kUInt8:
      return f(uint8_t{});
    case DType::kBool:
      return f(bool{});
    default:
      throw Error(ErrorCode::kInternal, "copy_tensor: unknown dtype");
  }
}

using RowFn = void (*)(const Plan&, int64_t, int64_t);

RowFn row_fn(DType to, DType from) {
  RowFn fn = nullptr;
  visit_type(to,
             [&](auto t) { visit_type(from, [&](auto f) { fn = &copy_rows<decltype(t), decltype(f)>; }); });
  return fn;
}

std::string shape_str(const DLTensor& t) { return npub::shape_str(t.shape, t.ndim); }

}  // namespace

namespace {
// A DLTensor whose shape and strides live in the object itself.
struct OwnedTensorDesc {
  DLTensor t{};
  std::vector<int64_t> shape, strides;
  explicit OwnedTensorDesc(const DLTensor& src)
      : t(src), shape(src.shape, src.shape + src.ndim), strides(strides_of(src)) {
    t.shape = shape.data();
    t.strides = strides.data();
  }
};
}  // namespace

void memcpy_async(Stream& stream, void* dst, const void* src, size_t bytes) {
  if (bytes == 0) return;
  stream.enqueue([dst, src, bytes] { std::memmove(dst, src, bytes); });
}

void copy_tensor_async(Stream& stream, const DLTensor& dst, const DLTensor& src, ComputePool* pool) {
  if (dst.ndim != src.ndim || !std::equal(dst.shape, dst.shape + dst.ndim, src.shape))
    throw Error(ErrorCode::kInvalidArgument, "copy_tensor_async: expected equal shapes but found " +
                                                 shape_str(dst) + " (destination) and " + shape_str(src) +
                                                 " (source)");
  auto d = std::make_shared<OwnedTensorDesc>(dst);
  auto s = std::make_shared<OwnedTensorDesc>(src);
  stream.enqueue([d, s, pool] { copy_tensor(d->t, s->t, pool); });
}

bool is_contiguous(const DLTensor& t) { return npub::is_contiguous(t.shape, t.strides, t.ndim); }

void copy_tensor(const DLTensor& dst, const DLTensor& src, ComputePool* pool) {
  if (dst.ndim != src.ndim || !std::equal(dst.shape, dst.shape + dst.ndim, src.shape))
    throw Error(ErrorCode::kInvalidArgument, "copy_tensor: expected equal shapes but found " +
                                                 shape_str(dst) + " (destination) and " + shape_str(src) +
                                                 " (source)");
  const DType dt = dtype_of(dst.dtype), st = dtype_of(src.dtype);
  if (dt == DType::kUnknown || st == DType::kUnknown)
    throw Error(ErrorCode::kUnsupported, "copy_tensor: unsupported dtype " +
                                             dtype_name(dt == DType::kUnknown ? dst.dtype : src.dtype));
  int64_t numel = 1;
  for (int i = 0; i < dst.ndim; ++i) numel *= dst.shape[i];
  if (numel == 0) return;

  if (dt == st && is_contiguous(dst) && is_contiguous(src)) {
    auto* d = static_cast<char*>(dst.data) + dst.byte_offset;
    auto* s = static_cast<const char*>(src.data) + src.byte_offset;
    const int64_t bytes = numel * element_size(dt);
    struct Mem {
      char* d;
      const char* s;
    } m{d, s};
    constexpr int64_t kGrain = 1 << 20;
    if (pool != nullptr && bytes > 4 * kGrain) {
      pool->parallel_for(
          0, bytes, kGrain,
          [](void* u, int64_t b, int64_t e) {
            auto* mm = static_cast<Mem*>(u);
            std::memmove(mm->d + b, mm->s + b, static_cast<size_t>(e - b));
          },
          &m);
    } else {
      std::memmove(d, s, static_cast<size_t>(bytes));
    }
    return;
  }

  Plan plan{&dst, &src, strides_of(dst), strides_of(src), 1, 1};
  plan.inner = dst.ndim > 0 ? dst.shape[dst.ndim - 1] : 1;
  plan.rows = numel / plan.inner;
  const RowFn fn = row_fn(dt, st);
  struct Work {
    const Plan* plan;
    RowFn fn;
  } work{&plan, fn};
  const int64_t grain = std::max<int64_t>(1, (1 << 16) / std::max<int64_t>(1, plan.inner));
  auto body = [](void* u, int64_t b, int64_t e) {
    auto* w = static_cast<Work*>(u);
    w->fn(*w->plan, b, e);
  };
  if (pool != nullptr)
    pool->parallel_for(0, plan.rows, grain, body, &work);
  else
    body(&work, 0, plan.rows);
}

namespace {

// A row-major float64 host view of `data` with `like`'s shape.
DLTensor host_f64(const DLTensor& like, double* data) {
  DLTensor host{};
  host.data = data;
  host.device = DLDevice{kDLCPU, 0};
  host.ndim = like.ndim;
  host.dtype = DLDataType{kDLFloat, 64, 1};
  host.shape = like.shape;
  return host;
}

size_t numel(const DLTensor& t) {
  int64_t n = 1;
  for (int i = 0; i < t.ndim; ++i) n *= t.shape[i];
  return static_cast<size_t>(n);
}

}  // namespace

std::vector<double> read_doubles(const DLTensor& t) {
  std::vector<double> out(numel(t));
  copy_tensor(host_f64(t, out.data()), t);
  return out;
}

void write_doubles(const DLTensor& t, const std::vector<double>& values) {
  if (values.size() != numel(t))
    throw Error(ErrorCode::kInvalidArgument, "write_doubles: expected " + std::to_string(numel(t)) +
                                                 " values but found " + std::to_string(values.size()));
  copy_tensor(t, host_f64(t, const_cast<double*>(values.data())));
}

}  // namespace npub::sim

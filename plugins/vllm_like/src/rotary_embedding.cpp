// vllm_like::rotary_embedding, in place, as vLLM's
// csrc/pos_encoding_kernels.cu defines it. Per token t at position p and
// per head of query (and key), the first rot_dim dims of the head rotate by
// the angles of row p of cos_sin_cache = cat(cos, sin) [max_position,
// rot_dim]: pairs (x, y) = (h[i], h[rot_dim/2 + i]) (NeoX, rotate-half) or
// (h[2i], h[2i+1]) (GPT-J, interleaved), for i < rot_dim / 2,
//   x' = x cos_i - y sin_i,  y' = y cos_i + x sin_i;
// dims from rot_dim to head_size stay (partial rotary).
//
// Shapes: positions [num_tokens] or [batch, seq] (int64 or int32); query
// and key start with positions' shape and hold heads * head_size values per
// token after it ([T, H*D], [T, H, D], [B, S, H*D], ...), each tensor its
// own head count (GQA's key has fewer heads). key may be None.
// cos_sin_cache is in the query's dtype (as vLLM keeps it) or float32 (a
// more precise table for half-type queries); computed in float32 and
// rounded once. Every position is checked against the cache before any
// element is written.
#include <algorithm>
#include <string>
#include <vector>

#include "loops.h"
#include "ops.h"

namespace vllm_like {

namespace {

using npub::sdk::Call;
using npub::sdk::TensorRef;

struct RotaryShape {
  int64_t num_tokens, rot_dim, max_position, head_size;
  int64_t q_heads, k_heads;  // k_heads 0 without a key
};

// heads * head_size values per token of `t`, whose leading dims are positions'.
int64_t heads_of(const Call& call, const TensorRef& t, const char* name, const TensorRef& positions,
                 int64_t head_size) {
  const int32_t pd = positions.dim();
  bool lead = t.dim() > pd;
  for (int32_t d = 0; lead && d < pd; ++d) lead = t.size(d) == positions.size(d);
  if (!lead)
    call.fail(NPUB_ERR_INVALID_ARGUMENT, std::string(name) + ": expected the leading shape of positions " +
                                             Call::shape_str(positions.sizes()) +
                                             " followed by heads * head_size values but found " +
                                             Call::shape_str(t.sizes()));
  int64_t per_token = 1;
  for (int32_t d = pd; d < t.dim(); ++d) per_token *= t.size(d);
  if (per_token % head_size != 0)
    call.fail(NPUB_ERR_INVALID_ARGUMENT, std::string(name) + ": expected a multiple of head_size " +
                                             std::to_string(head_size) + " values per token but found " +
                                             std::to_string(per_token) + " (shape " +
                                             Call::shape_str(t.sizes()) + ")");
  return per_token / head_size;
}

// The checks on metadata alone; on their own the op's meta function (it
// writes only query and key).
RotaryShape rotary_checks(Call& call) {
  TensorRef pos = call.tensor(0), q = call.tensor(1), k = call.optional_tensor(2), cache = call.tensor(4);
  const int64_t head_size = call.int_arg(3);
  if (!pos.is(npub::sdk::kInt64) && !pos.is(npub::sdk::kInt32))
    call.fail(NPUB_ERR_INVALID_ARGUMENT,
              "positions: expected int64 or int32 but found " + npub::sdk::dtype_name(pos.dtype()));
  if (pos.dim() != 1 && pos.dim() != 2)
    call.fail(NPUB_ERR_INVALID_ARGUMENT, "positions: expected [num_tokens] or [batch, seq] but found shape " +
                                             Call::shape_str(pos.sizes()));
  if (head_size <= 0)
    call.fail(NPUB_ERR_INVALID_ARGUMENT,
              "head_size: expected a positive size but found " + std::to_string(head_size));
  const DLDataType dt = q.dtype();
  if (!q.is(npub::sdk::kFloat32) && !q.is(npub::sdk::kFloat16) && !q.is(npub::sdk::kBFloat16))
    call.fail(NPUB_ERR_INVALID_ARGUMENT,
              "query: expected float32, float16 or bfloat16 but found " + npub::sdk::dtype_name(dt));
  RotaryShape s{};
  s.num_tokens = pos.numel();
  s.head_size = head_size;
  s.q_heads = heads_of(call, q, "query", pos, head_size);
  if (k.defined()) {
    if (!k.is(dt))
      call.fail(NPUB_ERR_INVALID_ARGUMENT, "key: expected the dtype of query (" + npub::sdk::dtype_name(dt) +
                                               ") but found " + npub::sdk::dtype_name(k.dtype()));
    s.k_heads = heads_of(call, k, "key", pos, head_size);
  }
  if (cache.dim() != 2)
    call.fail(NPUB_ERR_INVALID_ARGUMENT, "cos_sin_cache: expected [max_position, rot_dim] but found shape " +
                                             Call::shape_str(cache.sizes()));
  s.max_position = cache.size(0);
  s.rot_dim = cache.size(1);
  if (s.rot_dim < 2 || s.rot_dim % 2 != 0 || s.rot_dim > head_size)
    call.fail(NPUB_ERR_INVALID_ARGUMENT,
              "cos_sin_cache: expected an even rot_dim (size 1) in [2, head_size " +
                  std::to_string(head_size) + "] but found shape " + Call::shape_str(cache.sizes()));
  if (!cache.is(dt) && !cache.is(npub::sdk::kFloat32))
    call.fail(NPUB_ERR_INVALID_ARGUMENT, "cos_sin_cache: expected the dtype of query (" +
                                             npub::sdk::dtype_name(dt) + ") or float32 but found " +
                                             npub::sdk::dtype_name(cache.dtype()));
  return s;
}

void rotary_meta(Call& call) { rotary_checks(call); }

// positions as int64, each checked against the cache (before anything is written).
template <typename P>
void read_positions(const Call& call, const TensorRef& pos, int64_t* out, int64_t n, int64_t max_position) {
  const P* p = pos.data<P>();
  for (int64_t t = 0; t < n; ++t) {
    const int64_t v = static_cast<int64_t>(p[t]);
    if (v < 0 || v >= max_position)
      call.fail(NPUB_ERR_INDEX, "positions: expected positions in [0, " + std::to_string(max_position) +
                                    ") (the rows of cos_sin_cache) but found " + std::to_string(v) +
                                    " at token " + std::to_string(t));
    out[t] = v;
  }
}

// Rotates `heads` heads of head_size from h, by cos/sin (rot_dim / 2 each, float32).
template <typename S, bool Neox>
PLUGIN_KERNELS_INLINE void rotate_heads(typename S::E* h, int64_t heads, int64_t head_size, int64_t half,
                                        const float* __restrict cos, const float* __restrict sin) {
  using E = typename S::E;
  for (int64_t j = 0; j < heads; ++j) {
    E* head = h + j * head_size;
    if constexpr (Neox) {
      E* __restrict x = head;
      E* __restrict y = head + half;
      for (int64_t i = 0; i < half; ++i) {
        const float xv = S::load(x[i]), yv = S::load(y[i]);
        x[i] = S::store(xv * cos[i] - yv * sin[i]);
        y[i] = S::store(yv * cos[i] + xv * sin[i]);
      }
    } else {
      E* __restrict p = head;
      for (int64_t i = 0; i < half; ++i) {
        const float xv = S::load(p[2 * i]), yv = S::load(p[2 * i + 1]);
        p[2 * i] = S::store(xv * cos[i] - yv * sin[i]);
        p[2 * i + 1] = S::store(yv * cos[i] + xv * sin[i]);
      }
    }
  }
}

template <typename S, typename C>
struct RotaryArgs {
  const int64_t* positions;
  typename S::E *q, *k;  // k null without a key
  const typename C::E* cache;
  RotaryShape shape;
};

template <typename S, typename C, bool Neox>
struct RotaryTokens {
  template <Isa>
  static PLUGIN_KERNELS_INLINE void run(const RotaryArgs<S, C>& a, int64_t t0, int64_t t1,
                                        float* __restrict cs) {
    const RotaryShape& s = a.shape;
    const int64_t half = s.rot_dim / 2;
    for (int64_t t = t0; t < t1; ++t) {
      // the token's cos and sin in float32, once for all its heads
      const typename C::E* __restrict row = a.cache + a.positions[t] * s.rot_dim;
      for (int64_t i = 0; i < s.rot_dim; ++i) cs[i] = C::load(row[i]);
      rotate_heads<S, Neox>(a.q + t * s.q_heads * s.head_size, s.q_heads, s.head_size, half, cs, cs + half);
      if (a.k != nullptr)
        rotate_heads<S, Neox>(a.k + t * s.k_heads * s.head_size, s.k_heads, s.head_size, half, cs, cs + half);
    }
  }
};
template <typename S, typename C, bool Neox>
void run_rotary(const Call& call, const RotaryArgs<S, C>& a) {
  const RotaryShape& s = a.shape;
  const int64_t per_token = std::max<int64_t>((s.q_heads + s.k_heads) * s.head_size, 1);
  call.parallel_for(0, s.num_tokens, std::max<int64_t>(1, 16384 / per_token), [&](int64_t b, int64_t e) {
    std::vector<float> cs(static_cast<size_t>(s.rot_dim));
    run_at_kernel_isa<RotaryTokens<S, C, Neox>, Isa::kAvx2>(a, b, e, cs.data());
  });
}

// vllm_like::rotary_embedding(Tensor positions, Tensor(a!) query, Tensor(b!)? key, int head_size,
//                             Tensor cos_sin_cache, bool is_neox) -> ()
void rotary_embedding(Call& call) {
  TensorRef pos = call.tensor(0), q = call.tensor(1), k = call.optional_tensor(2), cache = call.tensor(4);
  const bool neox = call.bool_arg(5);
  const RotaryShape s = rotary_checks(call);
  if (call.is_meta()) return;
  int64_t* positions = static_cast<int64_t*>(
      call.scratch(sizeof(int64_t) * static_cast<uint64_t>(std::max<int64_t>(s.num_tokens, 1))));
  if (pos.is(npub::sdk::kInt64))
    read_positions<int64_t>(call, pos, positions, s.num_tokens, s.max_position);
  else
    read_positions<int32_t>(call, pos, positions, s.num_tokens, s.max_position);
  plugin_kernels::with_float_types(
      call, q.dtype(),
      [&](auto qtag) {
        using S = decltype(qtag);
        auto run = [&](auto ctag) {
          using C = decltype(ctag);
          const RotaryArgs<S, C> a{positions, plugin_kernels::elements<S>(q),
                                   k.defined() ? plugin_kernels::elements<S>(k) : nullptr,
                                   plugin_kernels::elements<C>(cache), s};
          if (neox)
            run_rotary<S, C, true>(call, a);
          else
            run_rotary<S, C, false>(call, a);
        };
        if (cache.is(q.dtype()))
          run(S{});
        else
          run(plugin_kernels::F32{});
      },
      /*with_f64=*/false);
}

}  // namespace

void register_rotary_embedding(npub::sdk::Registrar& r) {
  using namespace npub::sdk;
  r.def(
      "vllm_like::rotary_embedding(Tensor positions, Tensor(a!) query, Tensor(b!)? key, int head_size, "
      "Tensor cos_sin_cache, bool is_neox) -> ()");
  // The dispatch dtype is positions' (the first tensor argument); the data
  // tensors' dtypes are listed per argument, and the body checks that key
  // has query's and the cache query's or float32.
  const auto floats = {kFloat32, kFloat16, kBFloat16};
  r.kernel("vllm_like::rotary_embedding", &rotary_embedding)
      .dtypes({kInt64, kInt32})
      .arg_dtypes("query", floats)
      .arg_dtypes("key", floats)
      .arg_dtypes("cos_sin_cache", floats)
      .contiguous_only()
      .opt_level(2);
  r.meta<&rotary_meta>("vllm_like::rotary_embedding");
}

}  // namespace vllm_like

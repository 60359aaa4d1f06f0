// mindspeed_like::npu_fusion_attention_grad: the flash-attention backward
// (FlashAttention-2's). P is recomputed block by block from the forward's
// statistics, P = exp(S - max) / sum; with Di = sum_j P_ij dP_ij (Note [Di
// from P and dP]):
//   dV = P^T dO, dP = dO V^T, dS = P * (dP - Di), dK = scale dS^T Q, dQ = scale dS K.
// Work is split by (batch, key/value head): one task owns the keys and
// values of its head (dK, dV, summed over the query heads of its group in
// grouped-query attention) and the rows of dQ of those query heads, so no
// two threads write the same element and nothing is reduced afterwards.
#include <algorithm>
#include <limits>
#include <vector>

#include "attention_kernels.h"
#include "ops.h"

namespace mindspeed_like {

namespace {

using npub::sdk::Call;
using npub::sdk::TensorRef;
using namespace attn;

// npu_fusion_attention_grad's tensor arguments past the forward's.
constexpr int32_t kDy = 3, kSoftmaxMax = 9, kSoftmaxSum = 10, kAttentionIn = 12;

inline int64_t backward_scratch_elems(int64_t D) {
  return 4 * kBlockK * D + 2 * kBlockQ * D + 2 * kBlockQ * kBlockK;
}

// Note [Di from P and dP]
// FlashAttention-2 takes Di = rowsum(dO * O) from the saved output O. Both
// equal sum_j P_ij dP_ij, but O is rounded to its dtype (8 bits of
// mantissa in bfloat16), and dS = P * (dP - Di) cancels: where the softmax
// saturates (P one-hot) dP_ij* - Di should be 0 exactly, and a rounded O
// leaves eps * |dO| |V| there, which dQ and dK carry at full size. So Di is
// summed from P and dP themselves, recomputed block by block as the main
// pass will: two more GEMMs per block (about a third of the backward),
// and dS then cancels as the softmax's own derivative does. The saved
// output (attention_in) is not read.
inline int64_t row_terms_scratch_elems(int64_t D) {
  return 2 * kBlockQ * D + 2 * kBlockQ * kBlockK + 2 * kBlockK * D;
}

// Di = sum_j P_ij dP_ij for the rows of one block of queries.
template <typename E, typename Acc>
void row_terms(const AttnProblem& p, const Task& t, const typename E::T* q, const typename E::T* k,
               const typename E::T* v, const typename E::T* dy, const Acc* smax, const Acc* ssum,
               const uint8_t* mask, Acc* drow, Acc* buf) {
  const int64_t D = p.head_dim, b = t.b, n = t.n, nk = n / p.group(), q0 = t.q0;
  const int64_t qn = std::min<int64_t>(kBlockQ, p.q_len[b] - q0);
  Acc* Q = buf;
  Acc* dO = Q + kBlockQ * D;
  Acc* P = dO + kBlockQ * D;
  Acc* dP = P + kBlockQ * kBlockK;
  Acc* K = dP + kBlockQ * kBlockK;
  Acc* V = K + kBlockK * D;
  int64_t lo[kBlockQ], hi[kBlockQ];
  double acc[kBlockQ];
  const Acc scale = static_cast<Acc>(p.scale);
  int64_t kmin = p.kv_len[b], kmax = 0;
  for (int64_t r = 0; r < qn; ++r) {
    p.key_range(b, q0 + r, lo[r], hi[r]);
    if (lo[r] < hi[r] && ssum[p.stats_offset(b, n, q0 + r)] > 0) {
      kmin = std::min(kmin, lo[r]);
      kmax = std::max(kmax, hi[r]);
    }
    acc[r] = 0;
  }
  load_rows<E>(q + p.q_offset(b, n, q0), p.q.ss, qn, D, scale, Q, D);
  const Tile<Acc> dot = tile<E>(dy + p.q_offset(b, n, q0), p.q.ss, qn, D, dO);
  for (int64_t k0 = kmin / kBlockK * kBlockK; k0 < kmax; k0 += kBlockK) {
    const int64_t kn = std::min<int64_t>(kBlockK, kmax - k0);
    const Tile<Acc> kt = tile<E>(k + p.kv_offset(b, nk, k0), p.kv.ss, kn, D, K);
    const Tile<Acc> vt = tile<E>(v + p.kv_offset(b, nk, k0), p.kv.ss, kn, D, V);
    gemm(false, true, qn, kn, D, Acc(1), Q, D, kt.data, kt.ld, Acc(0), P, kBlockK);
    gemm(false, true, qn, kn, D, Acc(1), dot.data, dot.ld, vt.data, vt.ld, Acc(0), dP, kBlockK);
    for (int64_t r = 0; r < qn; ++r) {
      const int64_t so = p.stats_offset(b, n, q0 + r);
      if (!(ssum[so] > 0)) continue;
      Acc* s = P + r * kBlockK;
      mask_scores(p, b, n, q0 + r, k0, kn, lo[r], hi[r], mask, s);
      prob_row(s, kn, smax[so], Acc(1) / ssum[so]);
      acc[r] += dot_row(s, dP + r * kBlockK, kn);
    }
  }
  for (int64_t r = 0; r < qn; ++r) drow[p.stats_offset(b, n, q0 + r) / 8] = static_cast<Acc>(acc[r]);
}

// All of dK and dV of key/value head nk of batch b, and its group's
// contributions to dQ (accumulated into dq, laid out as the query).
template <typename E, typename Acc>
void backward_head(const AttnProblem& p, int64_t b, int64_t nk, const typename E::T* q,
                   const typename E::T* k, const typename E::T* v, const typename E::T* dy, const Acc* smax,
                   const Acc* ssum, const Acc* drow, const uint8_t* mask, Acc* dq, typename E::T* dk,
                   typename E::T* dv, Acc* buf) {
  const int64_t D = p.head_dim, G = p.group(), sq = p.q_len[b], skv = p.kv_len[b];
  Acc* K = buf;
  Acc* V = K + kBlockK * D;
  Acc* dK = V + kBlockK * D;
  Acc* dV = dK + kBlockK * D;
  Acc* Q = dV + kBlockK * D;
  Acc* dO = Q + kBlockQ * D;
  Acc* P = dO + kBlockQ * D;
  Acc* dP = P + kBlockQ * kBlockK;
  int64_t lo[kBlockQ], hi[kBlockQ];
  const Acc scale = static_cast<Acc>(p.scale);
  for (int64_t k0 = 0; k0 < skv; k0 += kBlockK) {
    const int64_t kn = std::min<int64_t>(kBlockK, skv - k0);
    const Tile<Acc> kt = tile<E>(k + p.kv_offset(b, nk, k0), p.kv.ss, kn, D, K);
    const Tile<Acc> vt = tile<E>(v + p.kv_offset(b, nk, k0), p.kv.ss, kn, D, V);
    std::fill(dK, dK + kn * D, Acc(0));
    std::fill(dV, dV + kn * D, Acc(0));
    for (int64_t g = 0; g < G; ++g) {
      const int64_t n = nk * G + g;
      for (int64_t q0 = 0; q0 < sq; q0 += kBlockQ) {
        const int64_t qn = std::min<int64_t>(kBlockQ, sq - q0);
        bool any = false;  // does a row of this block see a key of this one?
        for (int64_t r = 0; r < qn; ++r) {
          p.key_range(b, q0 + r, lo[r], hi[r]);
          any = any || (lo[r] < k0 + kn && hi[r] > k0 && lo[r] < hi[r]);
        }
        if (!any) continue;
        // Q scaled as the forward scaled it, so that S and with it P are
        // the forward's to the bit (a saturated softmax stays exactly 0/1).
        load_rows<E>(q + p.q_offset(b, n, q0), p.q.ss, qn, D, scale, Q, D);
        const Tile<Acc> dot = tile<E>(dy + p.q_offset(b, n, q0), p.q.ss, qn, D, dO);
        gemm(false, true, qn, kn, D, Acc(1), Q, D, kt.data, kt.ld, Acc(0), P, kBlockK);
        for (int64_t r = 0; r < qn; ++r) {
          Acc* s = P + r * kBlockK;
          const int64_t so = p.stats_offset(b, n, q0 + r);
          const Acc l = ssum[so];
          if (!(l > 0)) {  // a row that sees no key: P = 0
            std::fill(s, s + kn, Acc(0));
            continue;
          }
          mask_scores(p, b, n, q0 + r, k0, kn, lo[r], hi[r], mask, s);
          prob_row(s, kn, smax[so], Acc(1) / l);
        }
        // dV += P^T dO; dP = dO V^T
        gemm(true, false, kn, D, qn, Acc(1), P, kBlockK, dot.data, dot.ld, Acc(1), dV, D);
        gemm(false, true, qn, kn, D, Acc(1), dot.data, dot.ld, vt.data, vt.ld, Acc(0), dP, kBlockK);
        for (int64_t r = 0; r < qn; ++r) {
          const Acc di = drow[p.stats_offset(b, n, q0 + r) / 8];
          ds_row(P + r * kBlockK, dP + r * kBlockK, kn, di);  // dS, in place of P
        }
        // dK += dS^T (scale Q); dQ += scale dS K
        gemm(true, false, kn, D, qn, Acc(1), P, kBlockK, Q, D, Acc(1), dK, D);
        gemm(false, false, qn, D, kn, scale, P, kBlockK, kt.data, kt.ld, Acc(1), dq + p.q_offset(b, n, q0),
             p.q.ss);
      }
    }
    for (int64_t c = 0; c < kn; ++c) {
      const int64_t off = p.kv_offset(b, nk, k0 + c);
      for (int64_t d = 0; d < D; ++d) {
        E::store(dk + off + d, dK[c * D + d]);
        E::store(dv + off + d, dV[c * D + d]);
      }
    }
  }
}

struct BackwardOutputs {
  AttnProblem p;
  TensorRef dq, dk, dv;
};
BackwardOutputs backward_outputs(Call& call) {
  BackwardOutputs o;
  o.p = parse_attention(call, kBackwardArgs);
  TensorRef q = call.tensor(0), k = call.tensor(1), v = call.tensor(2), dy = call.tensor(kDy);
  auto same_as_query = [&](const TensorRef& t, const char* name) {
    if (t.defined() && (!t.is(q.dtype()) || t.sizes() != q.sizes()))
      call.fail(NPUB_ERR_INVALID_ARGUMENT,
                std::string(name) + ": expected the shape and dtype of query " + Call::shape_str(q.sizes()) +
                    " " + npub::sdk::dtype_name(q.dtype()) + " but found " + Call::shape_str(t.sizes()) +
                    " " + npub::sdk::dtype_name(t.dtype()));
  };
  same_as_query(dy, "dy");
  same_as_query(call.optional_tensor(kAttentionIn), "attention_in");
  const DLDataType st = stats_dtype(q.dtype());
  for (int32_t i : {kSoftmaxMax, kSoftmaxSum}) {
    const char* name = i == kSoftmaxMax ? "softmax_max" : "softmax_sum";
    TensorRef s = call.optional_tensor(i);
    if (!s.defined())
      call.fail(NPUB_ERR_INVALID_ARGUMENT, std::string(name) + ": required (the forward's statistics)");
    if (!s.is(st) || s.sizes() != o.p.stats_shape)
      call.fail(NPUB_ERR_INVALID_ARGUMENT,
                std::string(name) + ": expected " + Call::shape_str(o.p.stats_shape) + " " +
                    npub::sdk::dtype_name(st) + " but found " + Call::shape_str(s.sizes()) + " " +
                    npub::sdk::dtype_name(s.dtype()));
  }
  o.dq = call.output(0, q.sizes(), q.dtype());
  o.dk = call.output(1, k.sizes(), k.dtype());
  o.dv = call.output(2, v.sizes(), v.dtype());
  call.output(3, {0}, q.dtype());  // dpse: empty (pse is not supported)
  return o;
}

void fusion_attention_grad_meta(Call& call) { backward_outputs(call); }

void fusion_attention_grad(Call& call) {
  const BackwardOutputs o = backward_outputs(call);
  const AttnProblem& p = o.p;
  TensorRef q = call.tensor(0), k = call.tensor(1), v = call.tensor(2), dy = call.tensor(kDy);
  const uint8_t* mask = p.mask.defined() ? p.mask.data<uint8_t>() : nullptr;
  with_attention_types(call, q.dtype(), [&](auto e, auto acc) {
    using E = decltype(e);
    using Acc = decltype(acc);
    using T = typename E::T;
    constexpr bool kDirect = std::is_same_v<T, Acc>;  // dq accumulates in its own memory
    const int64_t D = p.head_dim, nq = q.numel();
    const T* pq = q.data<T>();
    const T* pdy = dy.data<T>();
    T* pdq = o.dq.data<T>();
    Acc* dq =
        kDirect
            ? reinterpret_cast<Acc*>(pdq)
            : static_cast<Acc*>(call.scratch(static_cast<uint64_t>(std::max<int64_t>(nq, 1)) * sizeof(Acc)));
    call.parallel_for(0, nq, 1 << 14, [&](int64_t b, int64_t e) { std::fill(dq + b, dq + e, Acc(0)); });
    const T* pk = k.data<T>();
    const T* pv = v.data<T>();
    const Acc* smax = call.tensor(kSoftmaxMax).data<Acc>();
    const Acc* ssum = call.tensor(kSoftmaxSum).data<Acc>();
    // Di per query row, indexed as the statistics / 8 (Note [Di from P and dP]).
    Acc* drow = static_cast<Acc*>(
        call.scratch(static_cast<uint64_t>(std::max<int64_t>(p.stats_rows, 1)) * sizeof(Acc)));
    const std::vector<Task> rows = query_block_tasks(p);
    if (!rows.empty()) {
      const int64_t per_slot = row_terms_scratch_elems(D);
      const int64_t slots = num_slots(call, static_cast<int64_t>(rows.size()));
      Acc* scratch = static_cast<Acc*>(call.scratch(static_cast<uint64_t>(slots * per_slot) * sizeof(Acc)));
      call.parallel_for(0, slots, 1, [&](int64_t sb, int64_t se) {
        for (int64_t slot = sb; slot < se; ++slot)
          for (size_t i = static_cast<size_t>(slot); i < rows.size(); i += static_cast<size_t>(slots))
            row_terms<E, Acc>(p, rows[i], pq, pk, pv, pdy, smax, ssum, mask, drow, scratch + slot * per_slot);
      });
    }
    const int64_t heads = p.batch * p.kv_heads;
    if (heads > 0) {
      const int64_t per_slot = backward_scratch_elems(D);
      const int64_t slots = num_slots(call, heads);
      Acc* scratch = static_cast<Acc*>(call.scratch(static_cast<uint64_t>(slots * per_slot) * sizeof(Acc)));
      T* pdk = o.dk.data<T>();
      T* pdv = o.dv.data<T>();
      call.parallel_for(0, slots, 1, [&](int64_t sb, int64_t se) {
        for (int64_t slot = sb; slot < se; ++slot)
          for (int64_t h = slot; h < heads; h += slots)
            backward_head<E, Acc>(p, h / p.kv_heads, h % p.kv_heads, pq, pk, pv, pdy, smax, ssum, drow, mask,
                                  dq, pdk, pdv, scratch + slot * per_slot);
      });
    }
    if constexpr (!kDirect) {
      call.parallel_for(0, nq, 1 << 14, [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) E::store(pdq + i, dq[i]);
      });
    }
  });
}

}  // namespace

void register_attention_backward(npub::sdk::Registrar& r) {
  r.def(
      "mindspeed_like::npu_fusion_attention_grad(Tensor query, Tensor key, Tensor value, Tensor dy, int "
      "head_num, "
      "str input_layout, Tensor? pse=None, Tensor? padding_mask=None, Tensor? atten_mask=None, Tensor? "
      "softmax_max=None, Tensor? softmax_sum=None, Tensor? softmax_in=None, Tensor? attention_in=None, float "
      "scale_value=1., float keep_prob=1., int pre_tockens=2147483647, int next_tockens=2147483647, int "
      "inner_precise=0, int[]? prefix=None, int[]? actual_seq_qlen=None, int[]? actual_seq_kvlen=None, int "
      "sparse_mode=0) -> (Tensor, Tensor, Tensor, Tensor)");
  r.kernel("mindspeed_like::npu_fusion_attention_grad", &fusion_attention_grad)
      .dtypes({npub::sdk::kFloat32, npub::sdk::kFloat16, npub::sdk::kBFloat16, npub::sdk::kFloat64})
      .arg_dtypes("atten_mask", {npub::sdk::kBool, npub::sdk::kUInt8})
      .arg_dtypes("softmax_max", {npub::sdk::kFloat32, npub::sdk::kFloat64})  // the body checks which
      .arg_dtypes("softmax_sum", {npub::sdk::kFloat32, npub::sdk::kFloat64})
      .any_dtype("softmax_in")  // not read (torch_npu's is empty)
      .any_dtype("pse")
      .any_dtype("padding_mask")
      .contiguous_only()
      .opt_level(2);
  r.meta<&fusion_attention_grad_meta>("mindspeed_like::npu_fusion_attention_grad");
  // Gradients of attention_out only (the statistics are not differentiable),
  // as op-plugin's derivatives.yaml says for torch_npu's op. pse is listed
  // so that the backward keeps torch_npu's four returns; its gradient is
  // the empty dpse, dropped for a None pse (npubridge/_autograd.py).
  r.derivative(
      "mindspeed_like::npu_fusion_attention",
      "query, key, value, pse: mindspeed_like::npu_fusion_attention_grad(query, key, value, grads[0], "
      "head_num, input_layout, pse, padding_mask, atten_mask, results[1], results[2], results[3], "
      "results[0], scale, keep_prob, pre_tockens, next_tockens, inner_precise, prefix, actual_seq_qlen, "
      "actual_seq_kvlen, sparse_mode)");
}

}  // namespace mindspeed_like

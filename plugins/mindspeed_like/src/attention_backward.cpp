// mindspeed_like::npu_fusion_attention_grad: the flash-attention backward.
// P is recomputed from the forward's statistics, P = exp(S - max) / sum,
// for one block of query rows against all the keys it sees at a time; then
//   dP = dO V^T, Di = sum_j P_ij dP_ij, dS = P * (dP - Di),
//   dV += P^T dO, dK += dS^T (scale Q), dQ = scale dS K.
// The extra memory is that row block's P and dP (kBlockQ x Skv each) and
// one head's dK and dV accumulators (Skv x D each) per worker, O(S * D),
// never Sq x Skv. Work is split by (batch, key/value head): one task owns
// the keys and values of its head (dK, dV, summed over the query heads of
// its group in grouped-query attention) and the rows of dQ of those query
// heads, so no two threads write the same element. With fewer (batch, kv
// head) pairs than workers, a head's row blocks are split over workers
// whose dK/dV partials are summed afterwards (store_kv_grads).
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

// Note [Di from P and dP]
// FlashAttention-2 takes Di = rowsum(dO * O) from the saved output O. Both
// equal sum_j P_ij dP_ij, but O is rounded to its dtype (8 bits of mantissa
// in bfloat16) and its sum runs in another order than the GEMM's dP, while
// dS = P * (dP - Di) cancels: where the softmax saturates (P one-hot) dP_ij*
// - Di must be 0 exactly, and a rounded O leaves eps * |dO| |V| there, which
// dQ and dK carry at full size. With a row block's whole P and dP in memory
// Di is their row sum, which costs no GEMM, and dS cancels as the
// softmax's own derivative does. The saved output (attention_in) is not read.

// Scratch per worker slot: Q, dO, dQ (kBlockQ x D), P and dP (kBlockQ x
// ld), dK and dV (Skv x D), and K and V converted (Skv x D, half types).
struct BackwardScratch {
  int64_t ld, elems;
};
BackwardScratch backward_scratch(const AttnProblem& p, bool convert) {
  const int64_t ld = std::max<int64_t>(16, (p.max_skv + 15) / 16 * 16), D = p.head_dim;
  return {ld, 3 * kBlockQ * D + 2 * kBlockQ * ld + (convert ? 4 : 2) * p.max_skv * D};
}

// dk, dv of head nk of batch b = the sums of `count` partial accumulators.
template <typename Elem, typename Acc>
void store_kv_grads(const AttnProblem& p, int64_t b, int64_t nk, Acc* const* dK, Acc* const* dV,
                    int64_t count, typename Elem::E* dk, typename Elem::E* dv) {
  const int64_t D = p.head_dim;
  for (int64_t c = 0; c < p.kv_len[b]; ++c) {
    const int64_t off = p.kv_offset(b, nk, c);
    for (int64_t d = 0; d < D; ++d) {
      Acc sk = 0, sv = 0;
      for (int64_t j = 0; j < count; ++j) {
        sk += dK[j][c * D + d];
        sv += dV[j][c * D + d];
      }
      dk[off + d] = Elem::store(sk);
      dv[off + d] = Elem::store(sv);
    }
  }
}

// Where a slot keeps its dK and dV (max_skv x D each).
inline int64_t dk_offset(int64_t ld, int64_t D) { return 3 * kBlockQ * D + 2 * kBlockQ * ld; }

// The dK and dV of key/value head nk of batch b (left in the slot's buffer
// when parts > 1, else stored), and the rows of dQ of its group's query
// heads: of the row blocks (of all the group's heads) every parts-th from
// `part` on.
template <typename Elem, typename Acc>
void backward_head(const AttnProblem& p, int64_t b, int64_t nk, const typename Elem::E* q,
                   const typename Elem::E* k, const typename Elem::E* v, const typename Elem::E* dy,
                   const Acc* smax, const Acc* ssum, const uint8_t* mask, typename Elem::E* dq,
                   typename Elem::E* dk, typename Elem::E* dv, int64_t ld, int64_t part, int64_t parts,
                   Acc* buf) {
  const int64_t D = p.head_dim, G = p.group(), sq = p.q_len[b], skv = p.kv_len[b];
  Acc* Q = buf;
  Acc* dO = Q + kBlockQ * D;
  Acc* dQ = dO + kBlockQ * D;
  Acc* P = dQ + kBlockQ * D;
  Acc* dP = P + kBlockQ * ld;
  Acc* dK = buf + dk_offset(ld, D);
  Acc* dV = dK + p.max_skv * D;
  Acc* K = dV + p.max_skv * D;
  Acc* V = K + p.max_skv * D;
  int64_t lo[kBlockQ], hi[kBlockQ];
  Acc di[kBlockQ];
  const Acc scale = static_cast<Acc>(p.scale);
  const Tile<Acc> kt = tile<Elem>(k + p.kv_offset(b, nk, 0), p.kv.ss, skv, D, K);
  const Tile<Acc> vt = tile<Elem>(v + p.kv_offset(b, nk, 0), p.kv.ss, skv, D, V);
  std::fill(dK, dK + skv * D, Acc(0));
  std::fill(dV, dV + skv * D, Acc(0));
  int64_t block = 0;
  for (int64_t g = 0; g < G; ++g) {
    const int64_t n = nk * G + g;
    for (int64_t q0 = 0; q0 < sq; q0 += kBlockQ) {
      if (block++ % parts != part) continue;
      const int64_t qn = std::min<int64_t>(kBlockQ, sq - q0);
      // The keys any row of the block sees (rows that see none have P = 0).
      int64_t kmin = skv, kmax = 0;
      for (int64_t r = 0; r < qn; ++r) {
        p.key_range(b, q0 + r, lo[r], hi[r]);
        if (lo[r] < hi[r] && ssum[p.stats_offset(b, n, q0 + r)] > 0) {
          kmin = std::min(kmin, lo[r]);
          kmax = std::max(kmax, hi[r]);
        }
      }
      const int64_t kw = kmax - kmin;
      if (kw > 0) {
        // Q scaled as the forward scaled it, and the same products: S and
        // with it P are the forward's (a saturated softmax stays 0 / 1).
        load_rows<Elem>(q + p.q_offset(b, n, q0), p.q.ss, qn, D, scale, Q, D);
        const Tile<Acc> dot = tile<Elem>(dy + p.q_offset(b, n, q0), p.q.ss, qn, D, dO);
        const Acc* kb = kt.data + kmin * kt.ld;
        const Acc* vb = vt.data + kmin * vt.ld;
        gemm(false, true, qn, kw, D, Acc(1), Q, D, kb, kt.ld, Acc(0), P, ld);
        gemm(false, true, qn, kw, D, Acc(1), dot.data, dot.ld, vb, vt.ld, Acc(0), dP, ld);
        for (int64_t r = 0; r < qn; ++r) {
          Acc* s = P + r * ld;
          const int64_t so = p.stats_offset(b, n, q0 + r);
          const Acc l = ssum[so];
          if (!(l > 0)) {  // a row that sees no key: P = 0
            std::fill(s, s + kw, Acc(0));
            di[r] = 0;
            continue;
          }
          mask_scores(p, b, n, q0 + r, kmin, kw, lo[r], hi[r], mask, s);
          prob_row(s, kw, smax[so], Acc(1) / l);
          di[r] = dot_row(s, dP + r * ld, kw);  // Note [Di from P and dP]
        }
        gemm(true, false, kw, D, qn, Acc(1), P, ld, dot.data, dot.ld, Acc(1), dV + kmin * D,
             D);                                                                      // dV += P^T dO
        for (int64_t r = 0; r < qn; ++r) ds_row(P + r * ld, dP + r * ld, kw, di[r]);  // dS, in place of P
        gemm(true, false, kw, D, qn, Acc(1), P, ld, Q, D, Acc(1), dK + kmin * D, D);  // dK += dS^T (scale Q)
        gemm(false, false, qn, D, kw, scale, P, ld, kb, kt.ld, Acc(0), dQ, D);        // dQ = scale dS K
      } else {
        std::fill(dQ, dQ + qn * D, Acc(0));
      }
      for (int64_t r = 0; r < qn; ++r) {
        typename Elem::E* o = dq + p.q_offset(b, n, q0 + r);
        for (int64_t d = 0; d < D; ++d) o[d] = Elem::store(dQ[r * D + d]);
      }
    }
  }
  if (parts == 1) store_kv_grads<Elem, Acc>(p, b, nk, &dK, &dV, 1, dk, dv);
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
  const int64_t heads = p.batch * p.kv_heads;
  if (heads == 0) return;
  const uint8_t* mask = p.mask.defined() ? p.mask.data<uint8_t>() : nullptr;
  with_float_types(call, q.dtype(), [&](auto elem) {
    using Elem = decltype(elem);
    using Acc = typename Elem::T;
    using T = typename Elem::E;
    const BackwardScratch bs = backward_scratch(p, !std::is_same_v<T, Acc>);
    // One slot per thread (each holds a head's dK and dV): heads are equal
    // work, so the static split balances. With fewer heads than threads,
    // each head's row blocks are split in `parts` whose dK and dV are
    // summed afterwards.
    const int64_t threads = call.num_threads();
    const int64_t blocks = p.group() * ((p.max_sq + kBlockQ - 1) / kBlockQ);
    const int64_t parts =
        heads >= threads ? 1 : std::max<int64_t>(1, std::min<int64_t>((threads + heads - 1) / heads, blocks));
    const int64_t units = heads * parts;
    const int64_t slots = parts == 1 ? std::max<int64_t>(1, std::min<int64_t>(heads, threads)) : units;
    Acc* scratch = static_cast<Acc*>(call.scratch(static_cast<uint64_t>(slots * bs.elems) * sizeof(Acc)));
    const T* pq = q.data<T>();
    const T* pk = k.data<T>();
    const T* pv = v.data<T>();
    const T* pdy = dy.data<T>();
    const Acc* smax = call.tensor(kSoftmaxMax).data<Acc>();
    const Acc* ssum = call.tensor(kSoftmaxSum).data<Acc>();
    T* pdq = o.dq.data<T>();
    T* pdk = o.dk.data<T>();
    T* pdv = o.dv.data<T>();
    call.parallel_for(0, slots, 1, [&](int64_t sb, int64_t se) {
      for (int64_t slot = sb; slot < se; ++slot)
        for (int64_t u = slot; u < units; u += slots) {
          const int64_t h = u / parts;
          backward_head<Elem, Acc>(p, h / p.kv_heads, h % p.kv_heads, pq, pk, pv, pdy, smax, ssum, mask, pdq,
                                   pdk, pdv, bs.ld, u % parts, parts, scratch + slot * bs.elems);
        }
    });
    if (parts > 1) {
      call.parallel_for(0, heads, 1, [&](int64_t hb, int64_t he) {
        std::vector<Acc*> dK(static_cast<size_t>(parts)), dV(static_cast<size_t>(parts));
        for (int64_t h = hb; h < he; ++h) {
          for (int64_t j = 0; j < parts; ++j) {  // unit h * parts + j ran in slot h * parts + j
            dK[static_cast<size_t>(j)] = scratch + (h * parts + j) * bs.elems + dk_offset(bs.ld, p.head_dim);
            dV[static_cast<size_t>(j)] = dK[static_cast<size_t>(j)] + p.max_skv * p.head_dim;
          }
          store_kv_grads<Elem, Acc>(p, h / p.kv_heads, h % p.kv_heads, dK.data(), dV.data(), parts, pdk, pdv);
        }
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

// mindspeed_like::npu_fusion_attention: flash attention (the role of
// torch_npu's npu_fusion_attention), forward. Tiled online softmax: a block
// of query rows meets the keys one block at a time, keeping per row the
// running maximum m and sum l of exp(score - m) and the unnormalised output;
// the Sq x Skv scores are never stored. The backward is in
// attention_backward.cpp, the argument parsing in attention_layout.cpp.
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

// One block of query rows of head n of batch b: its output rows and
// statistics. `buf` is this slot's scratch (forward_scratch_elems).
template <typename Elem, typename Acc>
void forward_block(const AttnProblem& p, const Task& t, const typename Elem::E* q, const typename Elem::E* k,
                   const typename Elem::E* v, typename Elem::E* out, Acc* smax, Acc* ssum,
                   const uint8_t* mask, Acc* buf) {
  constexpr Acc kNegInf = -std::numeric_limits<Acc>::infinity();
  const int64_t D = p.head_dim, b = t.b, n = t.n, nk = n / p.group();
  const int64_t q0 = t.q0, qn = std::min<int64_t>(kBlockQ, p.q_len[b] - q0);
  Acc* Q = buf;
  Acc* O = Q + kBlockQ * D;
  Acc* S = O + kBlockQ * D;
  Acc* K = S + kBlockQ * kBlockK;
  Acc* V = K + kBlockK * D;
  Acc m[kBlockQ], l[kBlockQ];
  int64_t lo[kBlockQ], hi[kBlockQ];
  const Acc scale = static_cast<Acc>(p.scale);
  int64_t kmin = p.kv_len[b], kmax = 0;
  for (int64_t r = 0; r < qn; ++r) {
    // The scale is folded into Q: S = (scale Q) K^T.
    load_rows<Elem>(q + p.q_offset(b, n, q0 + r), 0, 1, D, scale, Q + r * D, D);
    p.key_range(b, q0 + r, lo[r], hi[r]);
    if (lo[r] < hi[r]) {
      kmin = std::min(kmin, lo[r]);
      kmax = std::max(kmax, hi[r]);
    }
    m[r] = kNegInf;
    l[r] = 0;
  }
  std::fill(O, O + qn * D, Acc(0));
  // Key blocks at multiples of kBlockK. The backward recomputes the scores
  // in one product over the row block's key range: equal to these within
  // the GEMM's rounding, which is all it needs (Di comes from P and dP).
  for (int64_t k0 = kmin / kBlockK * kBlockK; k0 < kmax; k0 += kBlockK) {
    const int64_t kn = std::min<int64_t>(kBlockK, kmax - k0);
    const Tile<Acc> kt = tile<Elem>(k + p.kv_offset(b, nk, k0), p.kv.ss, kn, D, K);
    const Tile<Acc> vt = tile<Elem>(v + p.kv_offset(b, nk, k0), p.kv.ss, kn, D, V);
    gemm(false, true, qn, kn, D, Acc(1), Q, D, kt.data, kt.ld, Acc(0), S, kBlockK);
    for (int64_t r = 0; r < qn; ++r) {
      Acc* s = S + r * kBlockK;
      mask_scores(p, b, n, q0 + r, k0, kn, lo[r], hi[r], mask, s);
      const Acc mx = row_max(s, kn);
      const Acc mnew = std::max(m[r], mx);
      if (mnew == kNegInf) {  // nothing seen yet in this row
        std::fill(s, s + kn, Acc(0));
        continue;
      }
      const Acc alpha = exp_nonpositive(m[r] - mnew);  // 0 when m was -inf
      l[r] = l[r] * alpha + exp_row(s, kn, mnew);
      m[r] = mnew;
      if (alpha != Acc(1))
        for (int64_t d = 0; d < D; ++d) O[r * D + d] *= alpha;
    }
    gemm(false, false, qn, D, kn, Acc(1), S, kBlockK, vt.data, vt.ld, Acc(1), O, D);
  }
  for (int64_t r = 0; r < qn; ++r) {
    // A row that sees no key: output 0, max -inf, sum 0.
    const Acc inv = l[r] > 0 ? Acc(1) / l[r] : Acc(0);
    typename Elem::E* o = out + p.q_offset(b, n, q0 + r);
    for (int64_t d = 0; d < D; ++d) o[d] = Elem::store(O[r * D + d] * inv);
    const int64_t so = p.stats_offset(b, n, q0 + r);
    for (int j = 0; j < 8; ++j) {
      smax[so + j] = m[r];
      ssum[so + j] = l[r];
    }
  }
}

// The returns, declared from the arguments alone (also the meta function).
struct ForwardOutputs {
  AttnProblem p;
  TensorRef out, smax, ssum;
};
ForwardOutputs forward_outputs(Call& call) {
  ForwardOutputs o;
  o.p = parse_attention(call, kForwardArgs);
  TensorRef q = call.tensor(0);
  o.out = call.output(0, q.sizes(), q.dtype());
  o.smax = call.output(1, o.p.stats_shape, stats_dtype(q.dtype()));
  o.ssum = call.output(2, o.p.stats_shape, stats_dtype(q.dtype()));
  call.output(3, {0}, q.dtype());  // softmax_out: empty, as torch_npu returns it
  return o;
}

void fusion_attention_meta(Call& call) { forward_outputs(call); }

void fusion_attention(Call& call) {
  const ForwardOutputs o = forward_outputs(call);
  const AttnProblem& p = o.p;
  TensorRef q = call.tensor(0), k = call.tensor(1), v = call.tensor(2);
  const std::vector<Task> tasks = query_block_tasks(p);
  if (tasks.empty()) return;
  const uint8_t* mask = p.mask.defined() ? p.mask.data<uint8_t>() : nullptr;
  with_float_types(call, q.dtype(), [&](auto elem) {
    using Elem = decltype(elem);
    using Acc = typename Elem::T;
    using T = typename Elem::E;
    const int64_t per_slot = forward_scratch_elems(p.head_dim, !std::is_same_v<T, Acc>);
    const int64_t slots = num_slots(call, static_cast<int64_t>(tasks.size()));
    Acc* scratch = static_cast<Acc*>(call.scratch(static_cast<uint64_t>(slots * per_slot) * sizeof(Acc)));
    const T* pq = q.data<T>();
    const T* pk = k.data<T>();
    const T* pv = v.data<T>();
    T* po = o.out.data<T>();
    Acc* smax = o.smax.data<Acc>();
    Acc* ssum = o.ssum.data<Acc>();
    call.parallel_for(0, slots, 1, [&](int64_t sb, int64_t se) {
      for (int64_t slot = sb; slot < se; ++slot)
        for (size_t i = static_cast<size_t>(slot); i < tasks.size(); i += static_cast<size_t>(slots))
          forward_block<Elem, Acc>(p, tasks[i], pq, pk, pv, po, smax, ssum, mask, scratch + slot * per_slot);
    });
  });
}

}  // namespace

void register_attention(npub::sdk::Registrar& r) {
  const std::initializer_list<DLDataType> dtypes = {npub::sdk::kFloat32, npub::sdk::kFloat16,
                                                    npub::sdk::kBFloat16, npub::sdk::kFloat64};
  r.def(
      "mindspeed_like::npu_fusion_attention(Tensor query, Tensor key, Tensor value, int head_num, str "
      "input_layout, Tensor? pse=None, Tensor? padding_mask=None, Tensor? atten_mask=None, float scale=1., "
      "float "
      "keep_prob=1., int pre_tockens=2147483647, int next_tockens=2147483647, int inner_precise=0, int[]? "
      "prefix=None, int[]? actual_seq_qlen=None, int[]? actual_seq_kvlen=None, int sparse_mode=0) -> "
      "(Tensor, "
      "Tensor, Tensor, Tensor)");
  r.kernel("mindspeed_like::npu_fusion_attention", &fusion_attention)
      .dtypes(dtypes)
      .arg_dtypes("atten_mask", {npub::sdk::kBool, npub::sdk::kUInt8})
      .any_dtype("pse")  // refused by the body with its own message
      .any_dtype("padding_mask")
      .contiguous_only()
      .opt_level(2);
  r.meta<&fusion_attention_meta>("mindspeed_like::npu_fusion_attention");
  register_attention_backward(r);
}

}  // namespace mindspeed_like

// Argument parsing of npu_fusion_attention and its backward
// (attention_layout.h).
#include "attention_layout.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace mindspeed_like {

namespace {

using npub::sdk::Call;
using npub::sdk::TensorRef;

[[noreturn]] void bad(const Call& call, const std::string& what) {
  call.fail(NPUB_ERR_INVALID_ARGUMENT, what);
}

std::string list_str(const std::vector<int64_t>& v) { return Call::shape_str(v); }

std::string num_str(double x) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", x);
  return buf;
}

// Per-batch starts and lengths from torch_npu's cumulative lengths
// (actual_seq_qlen = [len0, len0 + len1, ...]), which must end at `total`.
void cumulative(const Call& call, const char* name, const std::vector<int64_t>& cum, int64_t total,
                std::vector<int64_t>& start, std::vector<int64_t>& len) {
  int64_t prev = 0;
  for (const int64_t c : cum) {
    if (c < prev)
      bad(call,
          std::string(name) + ": expected non-decreasing cumulative lengths but found " + list_str(cum));
    start.push_back(prev);
    len.push_back(c - prev);
    prev = c;
  }
  if (prev != total)
    bad(call, std::string(name) + ": expected cumulative lengths ending at the tensor's " +
                  std::to_string(total) + " tokens but found " + list_str(cum));
}

}  // namespace

AttnProblem parse_attention(const Call& call, const AttnArgIndex& ix) {
  AttnProblem p;
  TensorRef q = call.tensor(ix.query), k = call.tensor(ix.key), v = call.tensor(ix.value);
  // What torch_npu takes and this kernel does not compute: refused, never ignored.
  if (!call.is_none(ix.pse)) call.fail(NPUB_ERR_UNSUPPORTED, "pse: not supported (expected None)");
  if (!call.is_none(ix.padding_mask))
    call.fail(NPUB_ERR_UNSUPPORTED, "padding_mask: not supported (expected None)");
  if (!call.is_none(ix.prefix)) call.fail(NPUB_ERR_UNSUPPORTED, "prefix: not supported (expected None)");
  const double keep_prob = call.double_arg(ix.keep_prob);
  if (keep_prob != 1.0)
    call.fail(NPUB_ERR_UNSUPPORTED,
              "keep_prob: dropout is not supported (expected 1) but found " + num_str(keep_prob));
  const int64_t inner_precise = call.int_arg(ix.inner_precise);
  if (inner_precise != 0 && inner_precise != 1)
    call.fail(NPUB_ERR_UNSUPPORTED, "inner_precise: expected 0 or 1 (both compute in float32) but found " +
                                        std::to_string(inner_precise));
  p.sparse_mode = call.int_arg(ix.sparse_mode);
  if (p.sparse_mode < 0 || p.sparse_mode > 3)
    call.fail(NPUB_ERR_UNSUPPORTED,
              "sparse_mode: expected 0 (mask and band), 1 (mask), 2 (leftUpCausal) or 3 "
              "(rightDownCausal) but found " +
                  std::to_string(p.sparse_mode));
  // A band wider than any sequence means no band: saturated, so that
  // key_range's i - pre and i + next + 1 cannot overflow (next_tockens =
  // INT64_MAX masked every key before).
  constexpr int64_t kNoBand = int64_t(1) << 40;
  p.pre_tockens = std::clamp<int64_t>(call.int_arg(ix.pre_tockens), -kNoBand, kNoBand);
  p.next_tockens = std::clamp<int64_t>(call.int_arg(ix.next_tockens), -kNoBand, kNoBand);
  if (p.sparse_mode == 1) {  // allMask: the mask alone decides
    p.pre_tockens = p.next_tockens = std::numeric_limits<int32_t>::max();
  }
  p.scale = call.double_arg(ix.scale);
  if (!std::isfinite(p.scale)) bad(call, "scale: expected a finite value but found " + num_str(p.scale));

  if (!k.is(q.dtype()) || !v.is(q.dtype()))
    bad(call, "key, value: expected the dtype of query (" + npub::sdk::dtype_name(q.dtype()) +
                  ") but found " + npub::sdk::dtype_name(k.dtype()) + " and " +
                  npub::sdk::dtype_name(v.dtype()));
  if (k.sizes() != v.sizes())
    bad(call, "value: expected the shape of key " + Call::shape_str(k.sizes()) + " but found " +
                  Call::shape_str(v.sizes()));
  const int64_t head_num = call.int_arg(ix.head_num);
  if (head_num <= 0) bad(call, "head_num: expected a positive number but found " + std::to_string(head_num));
  p.layout = call.string_arg(ix.layout);
  const std::string& L = p.layout;
  const int32_t want_dim = (L == "BSND" || L == "BNSD")               ? 4
                           : (L == "BSH" || L == "SBH" || L == "TND") ? 3
                                                                      : 0;
  if (want_dim == 0)
    bad(call, "input_layout: expected one of BSND, BNSD, BSH, SBH, TND but found '" + L + "'");
  if (q.dim() != want_dim || k.dim() != want_dim)
    bad(call, "query, key: expected " + std::to_string(want_dim) + "-d tensors for input_layout " + L +
                  " but found " + Call::shape_str(q.sizes()) + " and " + Call::shape_str(k.sizes()));
  p.heads = head_num;
  int64_t sq = 0, skv = 0;
  if (L == "BSH" || L == "SBH") {
    const int32_t bd = L == "BSH" ? 0 : 1, sd = 1 - bd;
    const int64_t h = q.size(2), hk = k.size(2);
    if (h % head_num != 0)
      bad(call, "head_num: expected a divisor of the query's hidden size " + std::to_string(h) +
                    " but found " + std::to_string(head_num));
    p.head_dim = h / head_num;
    if (p.head_dim == 0 || hk % p.head_dim != 0)
      bad(call, "key: expected a hidden size that is a multiple of the head size " +
                    std::to_string(p.head_dim) + " but found " + std::to_string(hk));
    p.kv_heads = hk / p.head_dim;
    p.batch = q.size(bd);
    sq = q.size(sd);
    skv = k.size(sd);
    if (k.size(bd) != p.batch)
      bad(call,
          "key: expected batch " + std::to_string(p.batch) + " but found " + std::to_string(k.size(bd)));
    const int64_t row_q = L == "BSH" ? h : p.batch * h, row_k = L == "BSH" ? hk : p.batch * hk;
    p.q = {L == "BSH" ? sq * h : h, row_q, p.head_dim};
    p.kv = {L == "BSH" ? skv * hk : hk, row_k, p.head_dim};
  } else {
    const int32_t nd = L == "BNSD" ? 1 : (L == "BSND" ? 2 : 1), sd = L == "BNSD" ? 2 : 1;
    if (q.size(nd) != head_num)
      bad(call, "head_num: expected the query's " + std::to_string(q.size(nd)) + " heads (" + L +
                    ") but found " + std::to_string(head_num));
    p.kv_heads = k.size(nd);
    p.head_dim = q.size(-1);
    if (k.size(-1) != p.head_dim)
      bad(call, "key: expected head size " + std::to_string(p.head_dim) + " but found " +
                    std::to_string(k.size(-1)));
    const int64_t D = p.head_dim, N = p.heads, Nk = p.kv_heads;
    if (L == "TND") {
      p.batch = 0;
      p.q = {0, N * D, D};
      p.kv = {0, Nk * D, D};
    } else {
      p.batch = q.size(0);
      if (k.size(0) != p.batch)
        bad(call,
            "key: expected batch " + std::to_string(p.batch) + " but found " + std::to_string(k.size(0)));
      sq = q.size(sd);
      skv = k.size(sd);
      if (L == "BNSD") {
        p.q = {N * sq * D, D, sq * D};
        p.kv = {Nk * skv * D, D, skv * D};
      } else {
        p.q = {sq * N * D, N * D, D};
        p.kv = {skv * Nk * D, Nk * D, D};
      }
    }
  }
  if (p.kv_heads <= 0 || p.heads % p.kv_heads != 0)
    bad(call, "key: expected a number of heads dividing head_num " + std::to_string(head_num) +
                  " but found " + std::to_string(p.kv_heads));
  if (L == "TND") {
    if (call.is_none(ix.seq_qlen) || call.is_none(ix.seq_kvlen))
      bad(call, "actual_seq_qlen, actual_seq_kvlen: required for input_layout TND");
    const std::vector<int64_t> cq = call.int_list(ix.seq_qlen), ck = call.int_list(ix.seq_kvlen);
    if (cq.size() != ck.size())
      bad(call, "actual_seq_kvlen: expected " + std::to_string(cq.size()) +
                    " batches (as actual_seq_qlen) but found " + std::to_string(ck.size()));
    cumulative(call, "actual_seq_qlen", cq, q.size(0), p.q_start, p.q_len);
    cumulative(call, "actual_seq_kvlen", ck, k.size(0), p.kv_start, p.kv_len);
    p.batch = static_cast<int64_t>(cq.size());
  } else {
    if (!call.is_none(ix.seq_qlen) || !call.is_none(ix.seq_kvlen))
      bad(call, "actual_seq_qlen, actual_seq_kvlen: only taken with input_layout TND (found " + L + ")");
    p.q_start.assign(static_cast<size_t>(p.batch), 0);
    p.kv_start.assign(static_cast<size_t>(p.batch), 0);
    p.q_len.assign(static_cast<size_t>(p.batch), sq);
    p.kv_len.assign(static_cast<size_t>(p.batch), skv);
  }
  for (int64_t b = 0; b < p.batch; ++b) {
    p.max_sq = std::max(p.max_sq, p.q_len[b]);
    p.max_skv = std::max(p.max_skv, p.kv_len[b]);
  }
  // Statistics: [B, N, Sq, 8] (TND: [T, N, 8]), each value repeated 8 times.
  const int64_t N = p.heads;
  if (L == "TND") {
    p.stats_shape = {q.size(0), N, 8};
    p.stats = {0, N * 8, 8};
  } else {
    p.stats_shape = {p.batch, N, sq, 8};
    p.stats = {N * sq * 8, 8, sq * 8};
  }

  TensorRef m = call.optional_tensor(ix.atten_mask);
  if (m.defined()) {
    if (!m.is(npub::sdk::kBool) && !m.is(npub::sdk::kUInt8))
      bad(call, "atten_mask: expected bool or uint8 but found " + npub::sdk::dtype_name(m.dtype()));
    if (p.sparse_mode == 2 || p.sparse_mode == 3) {
      // torch_npu's causal modes take the 2048 x 2048 compressed mask,
      // which only restates the triangle: the triangle is computed, the
      // mask's contents are not read.
      if (m.sizes() != std::vector<int64_t>{2048, 2048})
        bad(call, "atten_mask: sparse_mode " + std::to_string(p.sparse_mode) +
                      " takes None or torch_npu's [2048, 2048] compressed causal mask but found " +
                      Call::shape_str(m.sizes()));
    } else {
      const int64_t mq = p.max_sq, mk = p.max_skv;
      const std::vector<int64_t> s = m.sizes();
      const bool two = s == std::vector<int64_t>{mq, mk};
      const bool four = s.size() == 4 && L != "TND" && (s[0] == p.batch || s[0] == 1) &&
                        (s[1] == N || s[1] == 1) && s[2] == mq && s[3] == mk;
      if (!two && !four)
        bad(call, "atten_mask: expected shape [" + std::to_string(mq) + ", " + std::to_string(mk) + "]" +
                      (L == "TND"
                           ? std::string()
                           : " or [B or 1, N or 1, " + std::to_string(mq) + ", " + std::to_string(mk) + "]") +
                      " but found " + Call::shape_str(s));
      p.mask = m;
      p.m_ss = mk;
      if (four) {
        p.m_sb = s[0] == 1 ? 0 : s[1] * mq * mk;
        p.m_sn = s[1] == 1 ? 0 : mq * mk;
      }
    }
  } else if (p.sparse_mode == 1) {
    bad(call, "atten_mask: sparse_mode 1 (allMask) needs a mask");
  }
  return p;
}

}  // namespace mindspeed_like

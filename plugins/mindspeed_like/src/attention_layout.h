// npu_fusion_attention's arguments, shared by its forward and backward:
// the layout of query/key/value (BSND, BNSD, BSH, SBH, TND) reduced to
// strides, the per-batch sequence lengths, the mask (explicit, causal, band)
// and the statistics' layout. Parsing checks everything a kernel could read
// out of bounds, with messages naming the argument.
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include <npubridge/plugin_sdk.hpp>

namespace mindspeed_like {

// The argument positions of the options both schemas share, after the
// tensors (forward: pse at 5; backward: pse at 6, the saved tensors after).
struct AttnArgIndex {
  int32_t query, key, value, head_num, layout, pse, padding_mask, atten_mask, scale, keep_prob, pre_tockens,
      next_tockens, inner_precise, prefix, seq_qlen, seq_kvlen, sparse_mode;
};
constexpr AttnArgIndex kForwardArgs{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16};
// npu_fusion_attention_grad: dy at 3, softmax_max/sum/in and attention_in at 9..12.
constexpr AttnArgIndex kBackwardArgs{0, 1, 2, 4, 5, 6, 7, 8, 13, 14, 15, 16, 17, 18, 19, 20, 21};

// Element (b, n, s, d) of a tensor in a layout is at
//   b * sb + (start[b] + s) * ss + n * sn + d
// (start is the batch's first row in TND, 0 otherwise).
struct AttnStrides {
  int64_t sb = 0, ss = 0, sn = 0;
};

struct AttnProblem {
  std::string layout;
  int64_t batch = 0, heads = 0, kv_heads = 0, head_dim = 0;
  std::vector<int64_t> q_start, q_len, kv_start, kv_len;  // per batch
  int64_t max_sq = 0, max_skv = 0;
  AttnStrides q, kv;  // query / out / dq and key / value / dk / dv
  AttnStrides stats;  // softmax_max / sum (the first of their 8 repeats)
  std::vector<int64_t> stats_shape;
  double scale = 1.0;
  int64_t sparse_mode = 0;
  int64_t pre_tockens = 0, next_tockens = 0;  // band of sparse_mode 0/1
  // Explicit boolean mask (True = masked out) or undefined; element
  // (b, n, i, j) at b * m_sb + n * m_sn + i * m_ss + j.
  npub::sdk::TensorRef mask;
  int64_t m_sb = 0, m_sn = 0, m_ss = 0;

  int64_t group() const { return heads / kv_heads; }
  int64_t q_offset(int64_t b, int64_t n, int64_t s) const {
    return b * q.sb + (q_start[b] + s) * q.ss + n * q.sn;
  }
  int64_t kv_offset(int64_t b, int64_t n, int64_t s) const {
    return b * kv.sb + (kv_start[b] + s) * kv.ss + n * kv.sn;
  }
  int64_t stats_offset(int64_t b, int64_t n, int64_t s) const {
    return b * stats.sb + (q_start[b] + s) * stats.ss + n * stats.sn;
  }
  // Keys [lo, hi) that query row i of batch b may see before the explicit
  // mask: the causal triangle of sparse_mode 2 (top left) or 3 (bottom
  // right), the pre/next_tockens band of sparse_mode 0 and 1.
  void key_range(int64_t b, int64_t i, int64_t& lo, int64_t& hi) const {
    const int64_t skv = kv_len[b];
    lo = 0;
    hi = skv;
    if (sparse_mode == 2) {
      hi = i + 1;
    } else if (sparse_mode == 3) {
      hi = i + 1 + (skv - q_len[b]);
    } else {
      lo = i - pre_tockens;
      hi = i + next_tockens + 1;
    }
    lo = std::max<int64_t>(lo, 0);
    hi = std::min<int64_t>(hi, skv);
    if (hi < lo) hi = lo;
  }
  const uint8_t* mask_row(const uint8_t* m, int64_t b, int64_t n, int64_t i) const {
    return m + b * m_sb + n * m_sn + i * m_ss;
  }
};

// Parses and checks the arguments at `ix` (query, key and value of the
// same dtype; everything torch_npu takes that this kernel does not compute
// is refused, naming the argument).
AttnProblem parse_attention(const npub::sdk::Call& call, const AttnArgIndex& ix);

// Statistics dtype: float32, float64 for a float64 call.
inline DLDataType stats_dtype(DLDataType t) {
  return npub::sdk::same_dtype(t, npub::sdk::kFloat64) ? npub::sdk::kFloat64 : npub::sdk::kFloat32;
}

}  // namespace mindspeed_like

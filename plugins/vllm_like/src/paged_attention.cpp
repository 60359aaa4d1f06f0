// vllm_like: paged_attention_v1 and paged_attention_v2, the decode
// attention of vLLM's csrc/attention/attention_kernels.cuh over the legacy
// paged cache (kv_cache_layout.h): each sequence's query (one token) against
// its seq_len cached keys and values, read through its row of block_tables.
// v1 runs one (sequence, KV head) over the whole sequence; v2 splits each
// sequence into 512-token partitions, keeps each partition's softmax max
// (max_logits), sum (exp_sums) and normalised output (tmp_out), and reduces
// them into out as vLLM's paged_attention_v2_reduce_kernel does.
// The inner loops are paged_attention_rows.cpp's.
#include "kv_cache_layout.h"
#include "ops.h"
#include "paged_attention_rows.h"

#include <plugin_kernels/float_access.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

namespace vllm_like {

namespace {

using npub::sdk::Call;
using npub::sdk::TensorRef;

constexpr int64_t kPartitionSize = 512;  // vLLM's _PARTITION_SIZE
// vLLM adds it to every softmax denominator (v1's, each v2 partition's, and
// the v2 reduction's); the results follow it.
constexpr float kSumEpsilon = 1e-6f;

// Positions of v1's arguments from `query` on; v2's are 3 further on (after
// exp_sums, max_logits, tmp_out).
enum Arg : int32_t {
  kQuery = 1,
  kKeyCache,
  kValueCache,
  kNumKvHeads,
  kScale,
  kBlockTables,
  kSeqLens,
  kBlockSize,
  kMaxSeqLen,
  kAlibiSlopes,
  kKvCacheDtype,
  kKScale,
  kVScale,
  kTpRank,
  kBlocksparseLocalBlocks,
  kBlocksparseVertStride,
};

struct PagedProblem {
  int64_t num_seqs = 0, num_heads = 0, max_seq_len = 0, max_partitions = 0;
  KvCacheLayout cache;
  PagedView view;  // its data pointers are filled in by the kernels
};

// Everything the kernels index by that metadata decides; also the meta
// functions (the ops write only their written arguments). `o` is 0 for
// v1, 3 for v2.
PagedProblem check_paged(const Call& call, int32_t o) {
  const TensorRef out = call.tensor(0), q = call.tensor(kQuery + o);
  PagedProblem p;
  expect_dim(call, q, "query", 3);
  p.num_seqs = q.size(0);
  p.num_heads = q.size(1);
  expect_shape(call, out, "out (query's shape)", q.sizes());
  expect_dtype(call, out, "out", q.dtype());
  p.cache = check_legacy_caches(call, kKeyCache + o, kValueCache + o, q.dtype());
  if (p.cache.head_size != q.size(2))
    call.fail(NPUB_ERR_INVALID_ARGUMENT, "key_cache: expected head_size " + std::to_string(q.size(2)) +
                                             " (query's) but found " + std::to_string(p.cache.head_size) +
                                             " in shape " +
                                             Call::shape_str(call.tensor(kKeyCache + o).sizes()));
  const int64_t kv_heads = call.int_arg(kNumKvHeads + o);
  if (kv_heads != p.cache.num_kv_heads || kv_heads <= 0 || p.num_heads % kv_heads != 0)
    call.fail(NPUB_ERR_INVALID_ARGUMENT,
              "num_kv_heads: expected key_cache's " + std::to_string(p.cache.num_kv_heads) +
                  ", a positive divisor of num_heads = " + std::to_string(p.num_heads) + ", but found " +
                  std::to_string(kv_heads));
  const int64_t block_size = call.int_arg(kBlockSize + o);
  if (block_size != p.cache.block_size || block_size <= 0)
    call.fail(NPUB_ERR_INVALID_ARGUMENT, "block_size: expected key_cache's " +
                                             std::to_string(p.cache.block_size) + " (positive) but found " +
                                             std::to_string(block_size));
  const TensorRef tables = call.tensor(kBlockTables + o), lens = call.tensor(kSeqLens + o);
  expect_dtype(call, tables, "block_tables", npub::sdk::kInt32);
  expect_dim(call, tables, "block_tables", 2);
  if (tables.size(0) != p.num_seqs)
    call.fail(NPUB_ERR_INVALID_ARGUMENT, "block_tables: expected one row per sequence (" +
                                             std::to_string(p.num_seqs) + ") but found shape " +
                                             Call::shape_str(tables.sizes()));
  expect_dtype(call, lens, "seq_lens", npub::sdk::kInt32);
  expect_shape(call, lens, "seq_lens", {p.num_seqs});
  p.max_seq_len = call.int_arg(kMaxSeqLen + o);
  if (p.max_seq_len < 0)
    call.fail(NPUB_ERR_INVALID_ARGUMENT,
              "max_seq_len: expected >= 0 but found " + std::to_string(p.max_seq_len));
  const TensorRef alibi = call.optional_tensor(kAlibiSlopes + o);
  if (alibi.defined()) {
    expect_dtype(call, alibi, "alibi_slopes", npub::sdk::kFloat32);
    expect_shape(call, alibi, "alibi_slopes ([num_heads])", {p.num_heads});
  }
  check_kv_cache_dtype(call, kKvCacheDtype + o, kKScale + o, kVScale + o);
  const int64_t vert_stride = call.int_arg(kBlocksparseVertStride + o);
  if (vert_stride > 1)
    call.fail(NPUB_ERR_INVALID_ARGUMENT,
              "blocksparse_vert_stride: expected <= 1 (block-sparse attention is not supported) but found " +
                  std::to_string(vert_stride));
  p.max_partitions = (p.max_seq_len + kPartitionSize - 1) / kPartitionSize;
  if (o == 3) {
    const TensorRef es = call.tensor(1), ml = call.tensor(2), tmp = call.tensor(3);
    expect_dtype(call, es, "exp_sums", npub::sdk::kFloat32);
    expect_dtype(call, ml, "max_logits", npub::sdk::kFloat32);
    expect_dtype(call, tmp, "tmp_out", q.dtype());
    expect_dim(call, es, "exp_sums", 3);
    if (es.size(0) != p.num_seqs || es.size(1) != p.num_heads || es.size(2) < p.max_partitions)
      call.fail(NPUB_ERR_INVALID_ARGUMENT,
                "exp_sums: expected [num_seqs, num_heads, max_num_partitions] with max_num_partitions >= "
                "ceil(max_seq_len / 512) = " +
                    std::to_string(p.max_partitions) + ", i.e. [" + std::to_string(p.num_seqs) + ", " +
                    std::to_string(p.num_heads) + ", " + std::to_string(p.max_partitions) + "], but found " +
                    Call::shape_str(es.sizes()));
    p.max_partitions = es.size(2);
    expect_shape(call, ml, "max_logits (exp_sums' shape)", es.sizes());
    expect_shape(call, tmp, "tmp_out ([num_seqs, num_heads, max_num_partitions, head_size])",
                 {p.num_seqs, p.num_heads, p.max_partitions, p.cache.head_size});
  }
  PagedView& v = p.view;
  v.dtype = q.dtype();
  v.num_kv_heads = p.cache.num_kv_heads;
  v.head_size = p.cache.head_size;
  v.block_size = p.cache.block_size;
  v.x = p.cache.x;
  v.group = p.num_heads / p.cache.num_kv_heads;
  v.max_blocks = tables.size(1);
  v.scale = static_cast<float>(call.double_arg(kScale + o));
  return p;
}

// The data the kernels index by: every sequence's length and the ids of
// the blocks it uses. Returns the lengths.
std::vector<int64_t> check_tables(const Call& call, const PagedProblem& p, int32_t o) {
  const int32_t* lens = call.tensor(kSeqLens + o).data<int32_t>();
  const int32_t* tables = call.tensor(kBlockTables + o).data<int32_t>();
  const int64_t B = p.cache.block_size, MB = p.view.max_blocks;
  const int64_t limit = std::min(MB * B, p.max_seq_len);
  std::vector<int64_t> out(static_cast<size_t>(p.num_seqs));
  for (int64_t s = 0; s < p.num_seqs; ++s) {
    const int64_t len = lens[s];
    if (len < 0 || len > limit)
      call.fail(
          NPUB_ERR_INDEX,
          "seq_lens[" + std::to_string(s) +
              "]: expected 0 <= seq_len <= min(max_blocks_per_seq * block_size = " + std::to_string(MB * B) +
              ", max_seq_len = " + std::to_string(p.max_seq_len) + ") but found " + std::to_string(len));
    for (int64_t b = 0; b < (len + B - 1) / B; ++b)
      check_block_id(call, tables[s * MB + b], p.cache.num_blocks, [&] {
        return "block_tables[" + std::to_string(s) + "][" + std::to_string(b) + "]: block id";
      });
    out[static_cast<size_t>(s)] = len;
  }
  return out;
}

void fill_view(const Call& call, PagedProblem& p, int32_t o) {
  p.view.key_cache = call.tensor(kKeyCache + o).data<void>();
  p.view.value_cache = call.tensor(kValueCache + o).data<void>();
  p.view.block_tables = call.tensor(kBlockTables + o).data<int32_t>();
  const TensorRef alibi = call.optional_tensor(kAlibiSlopes + o);
  p.view.alibi_slopes = alibi.defined() ? alibi.data<float>() : nullptr;
}

// A work item: (sequence, KV head, token range).
struct Item {
  int64_t seq, kv_head, t0, t1, partition;
};

// Runs body(item, stats, scratch) over the items on the device's threads,
// each thread taking the next item when it is done (the items' costs
// differ with their lengths, and a core of a shared machine may be slow),
// longest first.
template <typename Body>
void run_items(const Call& call, const PagedView& view, int64_t num_heads_per_item, std::vector<Item>& items,
               Body&& body) {
  if (items.empty()) return;
  std::stable_sort(items.begin(), items.end(),
                   [](const Item& a, const Item& b) { return a.t1 - a.t0 > b.t1 - b.t0; });
  const int64_t longest = items.front().t1 - items.front().t0;
  const int64_t workers = std::min<int64_t>(call.num_threads(), static_cast<int64_t>(items.size()));
  std::atomic<size_t> next{0};
  call.parallel_for(0, workers, 1, [&](int64_t, int64_t) {
    const int64_t G = num_heads_per_item, D = view.head_size;
    // Kept per thread across calls: a fresh buffer of a long sequence's
    // scores would be fresh pages, faulted in and zeroed on every call.
    thread_local std::vector<float> buf;
    const size_t need = static_cast<size_t>(attend_scratch_floats(view, longest) + G * (2 + D));
    if (buf.size() < need) buf.resize(need);
    RangeStats stats{buf.data(), buf.data() + G, buf.data() + 2 * G};
    float* scratch = buf.data() + G * (2 + D);
    for (size_t i = next++; i < items.size(); i = next++) body(items[i], stats, scratch);
  });
}

template <typename S>
void paged_v1(const Call& call, PagedProblem& p, const std::vector<int64_t>& lens) {
  using E = typename S::E;
  const PagedView& v = p.view;
  const int64_t G = v.group, D = v.head_size, H = p.num_heads;
  const E* q = call.tensor(kQuery).data<E>();
  E* out = call.tensor(0).data<E>();
  std::vector<Item> items;
  for (int64_t s = 0; s < p.num_seqs; ++s)
    for (int64_t h = 0; h < v.num_kv_heads; ++h) items.push_back({s, h, 0, lens[static_cast<size_t>(s)], 0});
  run_items(call, v, G, items, [&](const Item& it, const RangeStats& st, float* scratch) {
    const int64_t row = it.seq * H + it.kv_head * G;  // the group's first query head
    attend_range(v, q + row * D, it.seq, it.kv_head, it.t1, it.t0, it.t1, st, scratch);
    for (int64_t g = 0; g < G; ++g) {
      const float inv = 1.0f / (st.sum[g] + kSumEpsilon);
      for (int64_t d = 0; d < D; ++d) out[(row + g) * D + d] = S::store(st.acc[g * D + d] * inv);
    }
  });
}

template <typename S>
void paged_v2(const Call& call, PagedProblem& p, const std::vector<int64_t>& lens) {
  using E = typename S::E;
  constexpr int32_t o = 3;
  const PagedView& v = p.view;
  const int64_t G = v.group, D = v.head_size, H = p.num_heads, P = p.max_partitions;
  const E* q = call.tensor(kQuery + o).data<E>();
  E* out = call.tensor(0).data<E>();
  float* exp_sums = call.tensor(1).data<float>();
  float* max_logits = call.tensor(2).data<float>();
  E* tmp_out = call.tensor(3).data<E>();
  std::vector<Item> items;
  for (int64_t s = 0; s < p.num_seqs; ++s) {
    const int64_t len = lens[static_cast<size_t>(s)];
    for (int64_t h = 0; h < v.num_kv_heads; ++h)
      for (int64_t part = 0; part * kPartitionSize < len; ++part)
        items.push_back({s, h, part * kPartitionSize, std::min(len, (part + 1) * kPartitionSize), part});
  }
  run_items(call, v, G, items, [&](const Item& it, const RangeStats& st, float* scratch) {
    const int64_t row = it.seq * H + it.kv_head * G;
    attend_range(v, q + row * D, it.seq, it.kv_head, lens[static_cast<size_t>(it.seq)], it.t0, it.t1, st,
                 scratch);
    for (int64_t g = 0; g < G; ++g) {
      const int64_t stat = (row + g) * P + it.partition;
      max_logits[stat] = st.max[g];
      exp_sums[stat] = st.sum[g];
      const float inv = 1.0f / (st.sum[g] + kSumEpsilon);
      for (int64_t d = 0; d < D; ++d) tmp_out[stat * D + d] = S::store(st.acc[g * D + d] * inv);
    }
  });
  // The reduction, per (sequence, head): partitions rescaled to the global
  // max; one partition is copied as vLLM does (no rescaling, no epsilon).
  call.parallel_for(0, p.num_seqs * H, std::max<int64_t>(1, 256 / std::max<int64_t>(D, 1)),
                    [&](int64_t b, int64_t e) {
                      std::vector<float> rescaled(static_cast<size_t>(P));
                      for (int64_t sh = b; sh < e; ++sh) {
                        const int64_t len = lens[static_cast<size_t>(sh / H)];
                        const int64_t parts = (len + kPartitionSize - 1) / kPartitionSize;
                        E* o_row = out + sh * D;
                        const E* t = tmp_out + sh * P * D;
                        if (parts == 0) {
                          for (int64_t d = 0; d < D; ++d) o_row[d] = S::store(0.0f);
                          continue;
                        }
                        if (parts == 1) {
                          std::memcpy(o_row, t, sizeof(E) * D);
                          continue;
                        }
                        const float* ml = max_logits + sh * P;
                        const float* es = exp_sums + sh * P;
                        float mx = ml[0];
                        for (int64_t i = 1; i < parts; ++i) mx = std::max(mx, ml[i]);
                        float total = 0;
                        for (int64_t i = 0; i < parts; ++i) {
                          rescaled[static_cast<size_t>(i)] = es[i] * std::exp(ml[i] - mx);
                          total += rescaled[static_cast<size_t>(i)];
                        }
                        const float inv = 1.0f / (total + kSumEpsilon);
                        for (int64_t d = 0; d < D; ++d) {
                          float acc = 0;
                          for (int64_t i = 0; i < parts; ++i)
                            acc += S::load(t[i * D + d]) * rescaled[static_cast<size_t>(i)] * inv;
                          o_row[d] = S::store(acc);
                        }
                      }
                    });
}

void paged_attention_v1_meta(Call& call) { check_paged(call, 0); }
void paged_attention_v2_meta(Call& call) { check_paged(call, 3); }

template <int32_t kOffset>
void paged_attention(Call& call) {
  PagedProblem p = check_paged(call, kOffset);
  const std::vector<int64_t> lens = check_tables(call, p, kOffset);
  fill_view(call, p, kOffset);
  plugin_kernels::with_float_types(
      call, p.view.dtype,
      [&](auto s) {
        using S = decltype(s);
        if constexpr (kOffset == 0)
          paged_v1<S>(call, p, lens);
        else
          paged_v2<S>(call, p, lens);
      },
      false);
}

}  // namespace

void register_paged_attention(npub::sdk::Registrar& r) {
  configure_attention_isa();
  const std::string common =
      "Tensor query, Tensor key_cache, Tensor value_cache, int num_kv_heads, float scale, Tensor "
      "block_tables, "
      "Tensor seq_lens, int block_size, int max_seq_len, Tensor? alibi_slopes, str kv_cache_dtype, "
      "float k_scale=1.0, float v_scale=1.0, int tp_rank=0, int blocksparse_local_blocks=0, "
      "int blocksparse_vert_stride=0, int blocksparse_block_size=64, int blocksparse_head_sliding_step=0) -> "
      "()";
  r.def(("vllm_like::paged_attention_v1(Tensor(a!) out, " + common).c_str());
  r.def(("vllm_like::paged_attention_v2(Tensor(a!) out, Tensor(b!) exp_sums, Tensor(c!) max_logits, "
         "Tensor(d!) tmp_out, " +
         common)
            .c_str());
  const std::initializer_list<DLDataType> dtypes = {npub::sdk::kFloat32, npub::sdk::kFloat16,
                                                    npub::sdk::kBFloat16};
  r.kernel("vllm_like::paged_attention_v1", &paged_attention<0>)
      .dtypes(dtypes)
      .arg_dtypes("block_tables", {npub::sdk::kInt32})
      .arg_dtypes("seq_lens", {npub::sdk::kInt32})
      .arg_dtypes("alibi_slopes", {npub::sdk::kFloat32})
      .contiguous_only()
      .opt_level(1);
  r.meta<&paged_attention_v1_meta>("vllm_like::paged_attention_v1");
  r.kernel("vllm_like::paged_attention_v2", &paged_attention<3>)
      .dtypes(dtypes)
      .arg_dtypes("exp_sums", {npub::sdk::kFloat32})
      .arg_dtypes("max_logits", {npub::sdk::kFloat32})
      .arg_dtypes("block_tables", {npub::sdk::kInt32})
      .arg_dtypes("seq_lens", {npub::sdk::kInt32})
      .arg_dtypes("alibi_slopes", {npub::sdk::kFloat32})
      .contiguous_only()
      .opt_level(1);
  r.meta<&paged_attention_v2_meta>("vllm_like::paged_attention_v2");
}

}  // namespace vllm_like

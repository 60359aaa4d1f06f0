// vllm_like::compute_slot_mapping: each scheduled token's KV-cache slot, the
// role of vLLM's compute_slot_mapping kernel (vllm/v1/worker/block_table.py,
// a Triton kernel on GPUs). Token t of request r, at position p in its
// sequence, goes to slot block_table[r][p / block_size] * block_size +
// p % block_size; the slots after the step's tokens are padding (-1, which
// reshape_and_cache skips). Runs where the block table lives, so that the
// engine's step needs no host round trip for it.
#include "kv_cache_layout.h"
#include "ops.h"

#include <string>

namespace vllm_like {

namespace {

using npub::sdk::Call;
using npub::sdk::TensorRef;

enum SlotArg : int32_t { kQueryStartLoc, kPositions, kBlockTable, kSlotMapping, kSlotBlockSize, kNumTokens };

struct SlotProblem {
  int64_t num_reqs = 0, num_tokens = 0, block_size = 0;
};

SlotProblem check_slot_mapping(const Call& call) {
  const TensorRef qsl = call.tensor(kQueryStartLoc), pos = call.tensor(kPositions),
                  table = call.tensor(kBlockTable), slots = call.tensor(kSlotMapping);
  expect_dtype(call, qsl, "query_start_loc", npub::sdk::kInt32);
  expect_dim(call, qsl, "query_start_loc", 1);
  expect_dtype(call, pos, "positions", npub::sdk::kInt64);
  expect_dim(call, pos, "positions", 1);
  expect_dtype(call, table, "block_table", npub::sdk::kInt32);
  expect_dim(call, table, "block_table", 2);
  expect_dtype(call, slots, "slot_mapping", npub::sdk::kInt64);
  expect_dim(call, slots, "slot_mapping", 1);
  SlotProblem p;
  p.num_reqs = qsl.size(0) - 1;
  p.block_size = call.int_arg(kSlotBlockSize);
  p.num_tokens = call.int_arg(kNumTokens);
  if (p.num_reqs < 0)
    call.fail(NPUB_ERR_INVALID_ARGUMENT, "query_start_loc: expected num_reqs + 1 >= 1 entries but found 0");
  if (p.num_reqs > table.size(0))
    call.fail(NPUB_ERR_INVALID_ARGUMENT, "block_table: expected a row per request (at least " +
                                             std::to_string(p.num_reqs) + ") but found " +
                                             Call::shape_str(table.sizes()));
  if (p.block_size <= 0)
    call.fail(NPUB_ERR_INVALID_ARGUMENT,
              "block_size: expected a positive size but found " + std::to_string(p.block_size));
  if (p.num_tokens < 0 || p.num_tokens > pos.size(0) || p.num_tokens > slots.size(0))
    call.fail(NPUB_ERR_INVALID_ARGUMENT, "num_tokens: expected 0 <= num_tokens <= positions' length " +
                                             std::to_string(pos.size(0)) + " and slot_mapping's " +
                                             std::to_string(slots.size(0)) + " but found " +
                                             std::to_string(p.num_tokens));
  return p;
}

void compute_slot_mapping_meta(Call& call) { check_slot_mapping(call); }

void compute_slot_mapping(Call& call) {
  const SlotProblem p = check_slot_mapping(call);
  const TensorRef table = call.tensor(kBlockTable), slots_t = call.tensor(kSlotMapping);
  const int32_t* qsl = call.tensor(kQueryStartLoc).data<int32_t>();
  const int64_t* pos = call.tensor(kPositions).data<int64_t>();
  const int32_t* bt = table.data<int32_t>();
  const int64_t max_blocks = table.size(1);
  int64_t* slots = slots_t.data<int64_t>();
  // Every range and position checked before anything is written.
  for (int64_t r = 0; r < p.num_reqs; ++r) {
    const int64_t b = qsl[r], e = qsl[r + 1];
    if (b < 0 || e < b || e > p.num_tokens)
      call.fail(NPUB_ERR_INVALID_ARGUMENT,
                "query_start_loc[" + std::to_string(r) + ":" + std::to_string(r + 2) + "]: expected " +
                    "0 <= start <= end <= num_tokens = " + std::to_string(p.num_tokens) + " but found [" +
                    std::to_string(b) + ", " + std::to_string(e) + "]");
    for (int64_t t = b; t < e; ++t)
      if (pos[t] < 0 || pos[t] / p.block_size >= max_blocks)
        call.fail(NPUB_ERR_INDEX, "positions[" + std::to_string(t) + "]: position " + std::to_string(pos[t]) +
                                      " of request " + std::to_string(r) + " is out of range for " +
                                      std::to_string(max_blocks) + " blocks of " +
                                      std::to_string(p.block_size) + " tokens (block_table's columns)");
  }
  for (int64_t r = 0; r < p.num_reqs; ++r) {
    const int32_t* row = bt + r * table.stride(0);
    for (int64_t t = qsl[r]; t < qsl[r + 1]; ++t)
      slots[t] = static_cast<int64_t>(row[pos[t] / p.block_size]) * p.block_size + pos[t] % p.block_size;
  }
  for (int64_t t = qsl[p.num_reqs]; t < slots_t.size(0); ++t) slots[t] = -1;
}

}  // namespace

void register_slot_mapping(npub::sdk::Registrar& r) {
  r.def(
      "vllm_like::compute_slot_mapping(Tensor query_start_loc, Tensor positions, Tensor block_table, "
      "Tensor(a!) slot_mapping, int block_size, int num_tokens) -> ()");
  r.kernel("vllm_like::compute_slot_mapping", &compute_slot_mapping)
      .dtypes({npub::sdk::kInt32})  // query_start_loc's
      .mixed_dtypes()               // the others: the body checks each one's dtype and names it
      .contiguous_only()
      .opt_level(1);
  r.meta<&compute_slot_mapping_meta>("vllm_like::compute_slot_mapping");
}

}  // namespace vllm_like

"""The npu's versions of the Triton kernels vLLM's engine runs outside the
model (vLLM calls them through vllm.triton_utils.dispatcher, which the
platform's register_triton_kernel_overrides fills)."""
from ._custom_ops import _op


def compute_slot_mapping(num_tokens, max_num_tokens, query_start_loc, positions, block_table, block_table_stride,
                         slot_mapping, KV_CACHE_BLOCK_SIZE, TOTAL_CP_WORLD_SIZE=1, TOTAL_CP_RANK=0,
                         CP_KV_CACHE_INTERLEAVE_SIZE=1, PAD_ID=-1, BLOCK_SIZE=1024, **_):
    """vLLM's ComputeSlotMappingKernel: each token's slot, -1 (PAD_ID) after
    the last token up to max_num_tokens (vllm_like::compute_slot_mapping)."""
    if TOTAL_CP_WORLD_SIZE != 1:
        raise NotImplementedError("npu: context parallelism (a KV cache split over ranks) is not supported")
    if PAD_ID != -1:
        raise NotImplementedError(f"npu: compute_slot_mapping pads with -1, vLLM asked for {PAD_ID}")
    table = block_table.reshape(-1, int(block_table_stride))
    _op("compute_slot_mapping")(query_start_loc, positions, table, slot_mapping[:int(max_num_tokens)],
                                int(KV_CACHE_BLOCK_SIZE), int(num_tokens))


def triton_overrides():
    return {"vllm.v1.worker.block_table.ComputeSlotMappingKernel.kernel": compute_slot_mapping}

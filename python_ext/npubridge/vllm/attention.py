"""vLLM's attention backend on the npu: vllm_like's kernels over vLLM's
paged KV cache, in vLLM's own layout.

The cache (vLLM's logical per-layer shape [num_blocks, num_kv_heads,
block_size, 2 * head_size], key then value in the last dim) is seen by the
kernels through the view FlashAttention takes, `kv_cache.transpose(1, 2)
.split(head_size, -1)`: key and value caches of shape [num_blocks,
block_size, num_kv_heads, head_size] with the strides of the physical
layout. The backend asks for the head-major layout (KVCacheLayout.LBHNC):
a block's tokens of one KV head lie together, which is what the attention
kernel reads.

- do_kv_cache_update: vllm_like::reshape_and_cache_flash writes the step's
  keys and values at their slots (padding slots, -1, skipped);
- forward: vllm_like::flash_attn_varlen, one call for the whole batch:
  prefills, chunked prefills and decodes alike (each sequence's query rows
  against its cached tokens through its block table, causal with the
  sequence's offset). Nothing of the step runs on the CPU.
"""
from dataclasses import dataclass
from typing import ClassVar

import torch

from vllm.v1.attention.backend import (AttentionBackend, AttentionImpl, AttentionMetadataBuilder, AttentionType,
                                       CommonAttentionMetadata, MultipleOf)
from vllm.v1.kv_cache_layout import KVCacheLayout

from . import _custom_ops as ops


class NpuAttentionBackend(AttentionBackend):
    forward_includes_kv_cache_update: bool = False
    supported_dtypes: ClassVar[list[torch.dtype]] = [torch.float16, torch.bfloat16, torch.float32]
    supported_kv_cache_dtypes: ClassVar[list[str]] = ["auto"]

    @staticmethod
    def get_supported_kernel_block_sizes(kv_cache_spec=None) -> list:
        return [MultipleOf(16)]

    @classmethod
    def supported_kv_cache_layouts(cls):
        return (KVCacheLayout.LBHNC, )

    @staticmethod
    def get_name() -> str:
        return "CUSTOM"

    @classmethod
    def supports_non_causal(cls) -> bool:
        return True

    @classmethod
    def supports_sliding_window(cls) -> bool:
        return True

    @classmethod
    def supports_attn_type(cls, attn_type: str) -> bool:
        return attn_type == AttentionType.DECODER

    @staticmethod
    def get_impl_cls():
        return NpuAttentionImpl

    @staticmethod
    def get_builder_cls():
        return NpuAttentionMetadataBuilder


@dataclass
class NpuAttentionMetadata:
    num_actual_tokens: int  # the step's query rows (vLLM may count padding: the kernel goes by query_start_loc)
    max_query_len: int
    query_start_loc: torch.Tensor  # int32 [num_seqs + 1], on the npu
    max_seq_len: int
    seq_lens: torch.Tensor  # int32 [num_seqs]: cached tokens incl. this step's
    block_table: torch.Tensor  # int32 [num_seqs, max_blocks]
    slot_mapping: torch.Tensor  # int64 [num_actual_tokens]
    causal: bool = True


class NpuAttentionMetadataBuilder(AttentionMetadataBuilder[NpuAttentionMetadata]):

    def __init__(self, kv_cache_spec, layer_names, vllm_config, device) -> None:
        super().__init__(kv_cache_spec, layer_names, vllm_config, device)

    def build(self, common_prefix_len: int, common_attn_metadata: CommonAttentionMetadata,
              fast_build: bool = False) -> NpuAttentionMetadata:
        m = common_attn_metadata
        if isinstance(m.causal, torch.Tensor):
            raise NotImplementedError("npu attention: per-request causal masks (a tensor `causal`) are not supported")
        num_reqs = m.num_reqs
        return NpuAttentionMetadata(num_actual_tokens=m.num_actual_tokens, max_query_len=m.max_query_len,
                                    query_start_loc=m.query_start_loc[:num_reqs + 1], max_seq_len=m.max_seq_len,
                                    seq_lens=m.seq_lens[:num_reqs], block_table=m.block_table_tensor[:num_reqs],
                                    slot_mapping=m.slot_mapping, causal=bool(m.causal))


class NpuAttentionImpl(AttentionImpl):

    def __init__(self, num_heads: int, head_size: int, scale: float, num_kv_heads: int, alibi_slopes, sliding_window,
                 kv_cache_dtype: str, logits_soft_cap=None, attn_type: str = AttentionType.DECODER,
                 kv_sharing_target_layer_name=None, sinks=None) -> None:
        if alibi_slopes is not None:
            raise NotImplementedError("npu attention: ALiBi slopes are not supported by vllm_like::flash_attn_varlen")
        if sinks is not None:
            raise NotImplementedError("npu attention: attention sinks are not supported by vllm_like::flash_attn_varlen")
        if kv_cache_dtype != "auto":
            raise NotImplementedError(f"npu attention: kv_cache_dtype {kv_cache_dtype!r}: the npu's caches hold the "
                                      f"model's dtype (\"auto\")")
        if attn_type != AttentionType.DECODER:
            raise NotImplementedError(f"npu attention: attention type {attn_type} (decoder attention only)")
        self.num_heads = num_heads
        self.head_size = head_size
        self.scale = float(scale)
        self.num_kv_heads = num_kv_heads
        self.kv_cache_dtype = kv_cache_dtype
        self.kv_sharing_target_layer_name = kv_sharing_target_layer_name
        self.attn_type = attn_type
        # vLLM's sliding_window counts the current token: keys [p - w + 1, p].
        self.window_left = -1 if sliding_window is None else int(sliding_window) - 1
        self.softcap = float(logits_soft_cap or 0.0)

    def _caches(self, kv_cache: torch.Tensor):
        # [B, H, N, 2D] -> key, value [B, N, H, D] (strided views).
        return kv_cache.transpose(1, 2).split(self.head_size, dim=-1)

    def do_kv_cache_update(self, layer, key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor,
                           slot_mapping: torch.Tensor) -> None:
        key_cache, value_cache = self._caches(kv_cache)
        n = slot_mapping.shape[0]
        ops.reshape_and_cache_flash(key[:n], value[:n], key_cache, value_cache, slot_mapping, "auto")

    def forward(self, layer, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor,
                attn_metadata: NpuAttentionMetadata, output: torch.Tensor, output_scale=None,
                output_block_scale=None) -> torch.Tensor:
        if output_scale is not None or output_block_scale is not None:
            raise NotImplementedError("npu attention: fused output quantization is not supported")
        if attn_metadata is None:  # the profile run
            return output.fill_(0)
        if not attn_metadata.causal and self.window_left >= 0:
            # vLLM's FlashAttention widens a non-causal window to both sides;
            # the kernel's window_left limits the left side only.
            raise NotImplementedError("npu attention: a sliding window with non-causal attention is not supported "
                                      "(vllm_like::flash_attn_varlen limits keys on the left only)")
        n = attn_metadata.num_actual_tokens
        key_cache, value_cache = self._caches(kv_cache)
        out = output[:n].view(n, self.num_heads, self.head_size)
        ops.flash_attn_varlen(out, query[:n].view(n, self.num_heads, self.head_size), key_cache, value_cache,
                              attn_metadata.query_start_loc, attn_metadata.seq_lens, attn_metadata.max_query_len,
                              attn_metadata.max_seq_len, self.scale, attn_metadata.causal, attn_metadata.block_table,
                              self.window_left, self.softcap)
        return output

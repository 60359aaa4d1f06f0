"""vLLM's attention and KV-cache ops (the names and argument order of
vllm/_custom_ops.py) over the vllm_like plugin's kernels.

    from npubridge.vllm import _custom_ops as ops
    ops.reshape_and_cache(key, value, key_cache, value_cache, slot_mapping, "auto", 1.0, 1.0)
    ops.paged_attention(out, query, key_cache, value_cache, num_kv_heads, scale,
                        block_tables, seq_lens, block_size, max_seq_len)   # v1 or v2 by vLLM's rule
    ops.swap_blocks(npu_cache, cpu_cache, [(device_block, cpu_block), ...])
    ops.flash_attn_varlen(out, query, key_cache, value_cache, cu_seqlens_q, seqused_k,
                          max_seqlen_q, max_seqlen_k, scale, True, block_table)  # V1's attention

The kernels check their arguments (shapes, layouts, block ids, slots,
lengths) and raise RuntimeError / IndexError naming the op, the argument, what
was expected and what was found. The caches use vLLM's layouts
(plugins/vllm_like/src/kv_cache_layout.h): paged attention's key_cache
[num_blocks, num_kv_heads, head_size/x, block_size, x] with x = 16 //
element_size and value_cache [num_blocks, num_kv_heads, head_size,
block_size]; the flash layout [num_blocks, block_size, num_kv_heads,
head_size].
"""
from typing import Optional, Sequence, Tuple, Union

import torch

import npubridge  # noqa: F401  (the npu device and the plugins)

__all__ = [
    "paged_attention_v1", "paged_attention_v2", "paged_attention", "use_v1", "PARTITION_SIZE", "reshape_and_cache",
    "reshape_and_cache_flash", "copy_blocks", "swap_blocks", "kv_cache_x", "legacy_cache_shapes", "flash_attn_varlen",
]

PLUGIN = "vllm_like"
PARTITION_SIZE = 512  # paged_attention_v2's partition (vLLM's _PARTITION_SIZE)


def _op(name):
    """torch.ops.vllm_like.<name> (the overload packet), or an error saying
    whether the plugin is missing or lacks the op. The one lookup of the
    package (the model runner takes its ops from here). Starts the npu
    runtime: the plugin ops exist from its start on."""
    try:
        torch.npu._lazy_init()
        return getattr(getattr(torch.ops, PLUGIN), name)
    except (AttributeError, RuntimeError):
        loaded = [p for p in npubridge.plugins() if p["name"] == PLUGIN]
        why = (f"the loaded {PLUGIN} plugin ({loaded[0]['path']}) has no such op" if loaded else
               f"the {PLUGIN} plugin is not loaded (it loads at the npu runtime's start from npubridge's plugin "
               f"directory; NPUB_PLUGIN_PATH=/path/to/libnpub_{PLUGIN}.so names it); npubridge.load_failures(): "
               f"{npubridge.load_failures()}")
        raise RuntimeError(f"{PLUGIN}::{name} is not available: {why}") from None


def _scale(v):
    # vLLM passes k_scale / v_scale as floats (older releases) or 0-d tensors.
    return float(v.item() if isinstance(v, torch.Tensor) else v)


def kv_cache_x(dtype: torch.dtype) -> int:
    """x of the legacy key cache: 16 bytes of one key per innermost row (the
    one place it is computed)."""
    return 16 // dtype.itemsize


def legacy_cache_shapes(num_blocks, num_kv_heads, head_size, block_size, dtype) -> Tuple[Tuple[int, ...], ...]:
    """(key_cache shape, value_cache shape) of paged attention's layout."""
    x = kv_cache_x(dtype)
    if head_size % x:
        raise ValueError(f"head_size: expected a multiple of x = 16 / element_size = {x} for {dtype}, "
                         f"found {head_size}")
    return ((num_blocks, num_kv_heads, head_size // x, block_size, x), (num_blocks, num_kv_heads, head_size,
                                                                        block_size))


def paged_attention_v1(out, query, key_cache, value_cache, num_kv_heads, scale, block_tables, seq_lens, block_size,
                       max_seq_len, alibi_slopes, kv_cache_dtype, k_scale=1.0, v_scale=1.0, tp_rank=0,
                       blocksparse_local_blocks=0, blocksparse_vert_stride=0, blocksparse_block_size=64,
                       blocksparse_head_sliding_step=0) -> None:
    _op("paged_attention_v1")(out, query, key_cache, value_cache, num_kv_heads, scale, block_tables, seq_lens,
                              block_size, max_seq_len, alibi_slopes, kv_cache_dtype, _scale(k_scale),
                              _scale(v_scale), tp_rank, blocksparse_local_blocks, blocksparse_vert_stride,
                              blocksparse_block_size, blocksparse_head_sliding_step)


def paged_attention_v2(out, exp_sum, max_logits, tmp_out, query, key_cache, value_cache, num_kv_heads, scale,
                       block_tables, seq_lens, block_size, max_seq_len, alibi_slopes, kv_cache_dtype, k_scale=1.0,
                       v_scale=1.0, tp_rank=0, blocksparse_local_blocks=0, blocksparse_vert_stride=0,
                       blocksparse_block_size=64, blocksparse_head_sliding_step=0) -> None:
    _op("paged_attention_v2")(out, exp_sum, max_logits, tmp_out, query, key_cache, value_cache, num_kv_heads, scale,
                              block_tables, seq_lens, block_size, max_seq_len, alibi_slopes, kv_cache_dtype,
                              _scale(k_scale), _scale(v_scale), tp_rank, blocksparse_local_blocks,
                              blocksparse_vert_stride, blocksparse_block_size, blocksparse_head_sliding_step)


def use_v1(max_seq_len: int, num_seqs: int, num_heads: int) -> bool:
    """vLLM's choice (vllm/attention/ops/paged_attn.py): v1 when the
    sequences fit in 8192 tokens and either one partition covers them or
    there are enough (sequence, head) pairs to keep the device busy without
    splitting them (more than 512)."""
    max_num_partitions = (max_seq_len + PARTITION_SIZE - 1) // PARTITION_SIZE
    return max_seq_len <= 8192 and (max_num_partitions == 1 or num_seqs * num_heads > 512)


def paged_attention(out, query, key_cache, value_cache, num_kv_heads, scale, block_tables, seq_lens, block_size,
                    max_seq_len, alibi_slopes=None, kv_cache_dtype="auto", k_scale=1.0, v_scale=1.0,
                    force: Optional[str] = None) -> str:
    """Decode attention into ``out``, v1 or v2 as vLLM's PagedAttention
    chooses (``force="v1"``/``"v2"`` overrides); allocates v2's partition
    buffers. Returns the version run."""
    num_seqs, num_heads, head_size = query.shape
    version = force or ("v1" if use_v1(max_seq_len, num_seqs, num_heads) else "v2")
    if version == "v1":
        paged_attention_v1(out, query, key_cache, value_cache, num_kv_heads, scale, block_tables, seq_lens,
                           block_size, max_seq_len, alibi_slopes, kv_cache_dtype, k_scale, v_scale)
    elif version == "v2":
        parts = max(1, (max_seq_len + PARTITION_SIZE - 1) // PARTITION_SIZE)
        exp_sums = torch.empty(num_seqs, num_heads, parts, dtype=torch.float32, device=out.device)
        max_logits = torch.empty_like(exp_sums)
        tmp_out = torch.empty(num_seqs, num_heads, parts, head_size, dtype=out.dtype, device=out.device)
        paged_attention_v2(out, exp_sums, max_logits, tmp_out, query, key_cache, value_cache, num_kv_heads, scale,
                           block_tables, seq_lens, block_size, max_seq_len, alibi_slopes, kv_cache_dtype, k_scale,
                           v_scale)
    else:
        raise ValueError(f"paged_attention: force: expected None, 'v1' or 'v2' but found {force!r}")
    return version


def flash_attn_varlen(out, query, key_cache, value_cache, cu_seqlens_q, seqused_k, max_seqlen_q, max_seqlen_k,
                      softmax_scale, causal, block_table, window_left=-1, softcap=0.0) -> None:
    """The attention of vLLM's V1 FlashAttention backend (flash_attn_varlen_func
    with a block_table) into ``out`` [num_tokens, num_heads, head_size]: the
    query rows cu_seqlens_q[s] .. cu_seqlens_q[s + 1] of each sequence s
    against its seqused_k[s] cached tokens (the new ones included), read
    through block_table[s] from caches of the flash layout [num_blocks,
    block_size, num_kv_heads, head_size] (any strides). Query i of a sequence
    of q_len new tokens is at position p = seqused_k - q_len + i; causal, it
    sees keys 0 .. p; window_left >= 0 also drops the keys before
    p - window_left; softcap > 0 maps scores s to softcap * tanh(s / softcap).
    Rows past cu_seqlens_q[-1] are not written."""
    _op("flash_attn_varlen")(out, query, key_cache, value_cache, cu_seqlens_q, seqused_k, int(max_seqlen_q),
                             int(max_seqlen_k), float(softmax_scale), bool(causal), block_table, int(window_left),
                             float(softcap))


def reshape_and_cache(key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype, k_scale=1.0,
                      v_scale=1.0) -> None:
    _op("reshape_and_cache")(key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype, _scale(k_scale),
                             _scale(v_scale))


def reshape_and_cache_flash(key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype, k_scale=1.0,
                            v_scale=1.0) -> None:
    _op("reshape_and_cache_flash")(key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype,
                                   _scale(k_scale), _scale(v_scale))


Mapping = Union[torch.Tensor, Sequence[Tuple[int, int]]]


def _mapping(block_mapping: Mapping, op: str) -> torch.Tensor:
    """block_mapping as an int64 [n, 2] CPU tensor (vLLM keeps it on the CPU)."""
    m = block_mapping if isinstance(block_mapping, torch.Tensor) else torch.tensor(
        list(block_mapping), dtype=torch.int64)
    m = m.detach().to("cpu", torch.int64).reshape(-1, 2) if m.numel() == 0 else m.detach().to("cpu")
    if m.dtype != torch.int64 or m.dim() != 2 or m.shape[1] != 2:
        raise RuntimeError(f"{PLUGIN}::{op}: block_mapping: expected an int64 [num_pairs, 2] tensor of "
                           f"(src, dst) pairs but found {m.dtype} {list(m.shape)}")
    return m


def _check_cache_lists(key_caches, value_caches):
    """Errors the kernel cannot word (or never sees): no layers at all (the
    call would be routed by block_mapping's device, the CPU), and one tensor
    in two places, which the dispatcher reports as an alias of two written
    arguments without saying which."""
    key_caches, value_caches = list(key_caches), list(value_caches)
    if not key_caches or not value_caches:
        raise RuntimeError(f"{PLUGIN}::copy_blocks: key_caches, value_caches: expected one cache per layer but found "
                           f"lists of {len(key_caches)} and {len(value_caches)}")
    spans = []
    for name, caches in (("key_caches", key_caches), ("value_caches", value_caches)):
        for i, t in enumerate(caches):
            if not isinstance(t, torch.Tensor):
                raise TypeError(f"{PLUGIN}::copy_blocks: {name}[{i}]: expected a Tensor but found {type(t).__name__}")
            if t.numel():  # the caches are contiguous (the kernel's requirement): one byte range each
                spans.append((t.data_ptr(), t.data_ptr() + t.numel() * t.element_size(), f"{name}[{i}]"))
    spans.sort()
    for (_, end, a), (start, _, b) in zip(spans, spans[1:]):
        if start < end:
            raise RuntimeError(f"{PLUGIN}::copy_blocks: {a} and {b} overlap in memory: expected a distinct cache "
                               f"per layer and per key/value")


def copy_blocks(key_caches, value_caches, block_mapping: Mapping) -> None:
    """Copies block src to block dst of every layer's key and value cache."""
    m = _mapping(block_mapping, "copy_blocks")
    _check_cache_lists(key_caches, value_caches)
    device = key_caches[0].device
    _op("copy_blocks")(list(key_caches), list(value_caches), m.to(device))


def _check_ids(ids: torch.Tensor, num_blocks: int, column: int, what: str):
    bad = ((ids < 0) | (ids >= num_blocks)).nonzero()
    if len(bad):
        i = int(bad[0])
        raise IndexError(f"{PLUGIN}::swap_blocks: block_mapping[{i}][{column}]: {what} block {int(ids[i])} is out "
                         f"of range for {num_blocks} cache blocks (expected 0 <= id < {num_blocks})")


def swap_blocks(src: torch.Tensor, dst: torch.Tensor, block_mapping: Mapping) -> None:
    """dst[d] = src[s] for each (s, d) of block_mapping, for dim-0 blocks of
    caches on the same device or one on the npu and one on the CPU.

    Note [swap_blocks across devices]: a plugin kernel sees all of a call's
    tensors on one device (the C ABI gives it one device per call), so the
    kernel copies blocks within a device only. Across devices the blocks go
    through the device copy API, the path every npu<->cpu transfer takes:
    npu->cpu gathers the source blocks on the npu with the kernel into one
    staging tensor, copies it to the CPU in one transfer and scatters it
    there with index_copy_; cpu->npu gathers on the CPU, transfers once and
    scatters with the kernel. Every id is checked before anything is copied.
    """
    m = _mapping(block_mapping, "swap_blocks")
    if src.dim() == 0 or dst.dim() == 0:
        raise RuntimeError(f"{PLUGIN}::swap_blocks: src, dst: expected caches with a block dimension (dim 0) but "
                           f"found shapes {list(src.shape)} and {list(dst.shape)}")
    if src.dtype != dst.dtype or src.shape[1:] != dst.shape[1:]:
        raise RuntimeError(f"{PLUGIN}::swap_blocks: dst: expected blocks of src's dtype and shape ({src.dtype} "
                           f"{list(src.shape)}, dims after the first) but found {dst.dtype} {list(dst.shape)}")
    _check_ids(m[:, 0], src.shape[0], 0, "source")
    _check_ids(m[:, 1], dst.shape[0], 1, "destination")
    n = m.shape[0]
    if n == 0:
        return
    src_npu, dst_npu = src.device.type != "cpu", dst.device.type != "cpu"
    if src.device == dst.device:
        if src_npu:
            _op("swap_blocks")(src, dst, m.to(src.device))
        else:  # host caches: the PyTorch extension routes npu kernels only
            dst.index_copy_(0, m[:, 1], src.index_select(0, m[:, 0]))
        return
    k = torch.arange(n, dtype=torch.int64)
    if src_npu and not dst_npu:
        staging = torch.empty((n, ) + tuple(src.shape[1:]), dtype=src.dtype, device=src.device)
        _op("swap_blocks")(src, staging, torch.stack([m[:, 0], k], 1).to(src.device))
        dst.index_copy_(0, m[:, 1], staging.to("cpu"))
    elif dst_npu and not src_npu:
        staging = src.index_select(0, m[:, 0]).to(dst.device)
        _op("swap_blocks")(staging, dst, torch.stack([k, m[:, 1]], 1).to(dst.device))
    else:
        raise RuntimeError(f"{PLUGIN}::swap_blocks: src, dst: expected caches on one device, or one on the npu and "
                           f"one on the CPU, but found {src.device} and {dst.device}")

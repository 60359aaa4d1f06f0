"""LLM: vLLM's offline entry point over npubridge's engine and model runner.

    from npubridge.vllm import LLM, SamplingParams
    llm = LLM(model)                       # a transformers LlamaForCausalLM object
    outs = llm.generate([{"prompt_token_ids": [1, 2, 3]}], SamplingParams(temperature=0, max_tokens=8))
    outs[0].outputs[0].token_ids

Differences from vLLM, all because nothing is downloaded and the cache is
sized by hand: ``model`` is a model object, not a name; the KV cache is
``num_device_blocks`` blocks or ``kv_cache_memory`` bytes (vLLM measures
free GPU memory), and the swap space ``num_cpu_blocks`` blocks or
``swap_space`` bytes (vLLM: GiB, default 4; here default none, so
preemption recomputes unless swap space is given; a swap_space below one
block warns). Options with no meaning here (gpu_memory_utilization,
tensor_parallel_size, enforce_eager, ...) are a TypeError that says what to
use; dtype takes vLLM's strings ("auto", "float16", "bfloat16", "float32").
The model must be one the runner computes exactly (model_check.py).
"""
import warnings
from typing import List, Optional, Sequence, Union

import torch

from .engine import LLMEngine
from .outputs import RequestOutput
from .sampling_params import SamplingParams

__all__ = ["LLM"]

# Default KV budget when neither num_device_blocks nor kv_cache_memory is given.
_DEFAULT_KV_CACHE_MEMORY = 256 << 20


def _num_blocks(what_blocks, blocks, what_bytes, nbytes, block_bytes, default=None):
    if blocks is not None and nbytes is not None:
        raise ValueError(f"LLM: give {what_blocks} or {what_bytes}, not both")
    if blocks is not None:
        if not isinstance(blocks, int) or blocks < 0:
            raise ValueError(f"LLM: {what_blocks} must be an int >= 0, found {blocks!r}")
        return blocks
    if nbytes is None:
        return default
    if nbytes < 0:
        raise ValueError(f"LLM: {what_bytes} must be >= 0 bytes, found {nbytes}")
    return int(nbytes // block_bytes)


_DTYPES = {
    "auto": None, "float16": torch.float16, "half": torch.float16, "fp16": torch.float16,
    "bfloat16": torch.bfloat16, "bf16": torch.bfloat16, "float32": torch.float32, "float": torch.float32,
    "fp32": torch.float32
}
_OPTIONS = ("tokenizer", "block_size", "num_device_blocks", "kv_cache_memory", "num_cpu_blocks", "swap_space",
            "max_num_seqs", "max_num_batched_tokens", "max_model_len", "enable_prefix_caching",
            "enable_chunked_prefill", "preemption_mode", "seed", "device", "dtype")
# vLLM options without a meaning here, and what to use instead.
_VLLM_HINTS = {
    "gpu_memory_utilization": "size the KV cache with num_device_blocks or kv_cache_memory (bytes)",
    "tensor_parallel_size": "npubridge.vllm runs on one npu device",
    "pipeline_parallel_size": "npubridge.vllm runs on one npu device",
    "enforce_eager": "npubridge.vllm always runs eagerly",
}


def _resolve_dtype(dtype):
    """vLLM's dtype strings ("auto", "float16", "bfloat16", "float32", ...) or a torch.dtype."""
    if dtype is None or isinstance(dtype, torch.dtype):
        return dtype
    if isinstance(dtype, str) and dtype.lower() in _DTYPES:
        return _DTYPES[dtype.lower()]
    raise ValueError(f"LLM: dtype must be a torch.dtype or one of {sorted(_DTYPES)}, found {dtype!r}")


def _check_options(block_size, max_model_len, device, unknown):
    if unknown:
        hints = "; ".join(f"{k}: {_VLLM_HINTS[k]}" for k in unknown if k in _VLLM_HINTS)
        raise TypeError(f"LLM: unsupported option(s) {', '.join(sorted(unknown))}"
                        f"{' (' + hints + ')' if hints else ''}; npubridge.vllm.LLM supports {', '.join(_OPTIONS)}")
    if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
        raise ValueError(f"LLM: block_size must be an int >= 1 (tokens per KV block), found {block_size!r}")
    if max_model_len is not None and (isinstance(max_model_len, bool) or not isinstance(max_model_len, int)
                                      or max_model_len < 2):
        raise ValueError(f"LLM: max_model_len must be an int >= 2 (a prompt token and a generated one) or None, "
                         f"found {max_model_len!r}")
    try:
        kind = torch.device(device).type
    except (RuntimeError, TypeError):
        kind = None
    if kind != "npu":
        raise ValueError(f"LLM: device must be an npu device (\"npu\" or \"npu:N\"), found {device!r}")


def _check_swap(preemption_mode, swap_space, cpu_blocks, block_bytes):
    if swap_space and cpu_blocks == 0:
        warnings.warn(f"LLM: swap_space={swap_space} bytes is less than one KV block ({block_bytes} bytes): no swap "
                      f"space (the unit is bytes, not vLLM's GiB)", stacklevel=3)
    if preemption_mode == "swap" and cpu_blocks == 0:
        raise ValueError("LLM: preemption_mode='swap' needs swap space: give num_cpu_blocks >= 1 or swap_space "
                         f"(bytes) of at least one KV block ({block_bytes} bytes)")


def _check_prompt(index, prompt):
    """A prompt's token ids, by its index in the call (the engine checks the rest)."""
    from .engine import check_token_ids

    ids = prompt.get("prompt_token_ids") if isinstance(prompt, dict) else prompt
    if isinstance(prompt, dict) and "prompt_token_ids" in prompt and not isinstance(ids, (list, tuple)):
        raise TypeError(f"LLM.generate: prompts[{index}]['prompt_token_ids'] must be a list of ints, found "
                        f"{type(ids).__name__}")
    if isinstance(ids, (list, tuple)):
        check_token_ids(f"LLM.generate: prompts[{index}]", ids)


def _check_params(params):
    for i, p in enumerate(params):
        if not isinstance(p, SamplingParams):
            raise TypeError(f"LLM.generate: sampling_params{'' if len(params) == 1 else f'[{i}]'} must be a "
                            f"SamplingParams (or a list of them), found {type(p).__name__}"
                            f"{' (use SamplingParams(**d))' if isinstance(p, dict) else ''}")


def _is_token_ids(prompt) -> bool:
    return isinstance(prompt, (list, tuple)) and len(prompt) > 0 and all(
        isinstance(t, int) and not isinstance(t, bool) for t in prompt)


class LLM:

    def __init__(self, model, tokenizer=None, *, block_size: int = 16, num_device_blocks: Optional[int] = None,
                 kv_cache_memory: Optional[int] = None, num_cpu_blocks: Optional[int] = None,
                 swap_space: Optional[int] = None, max_num_seqs: int = 256,
                 max_num_batched_tokens: Optional[int] = None, max_model_len: Optional[int] = None,
                 enable_prefix_caching: bool = False, enable_chunked_prefill: bool = False,
                 preemption_mode: Optional[str] = None, seed: int = 0, device: str = "npu", dtype=None, **unknown):
        if isinstance(model, str):
            raise TypeError("npubridge.vllm.LLM: pass a transformers LlamaForCausalLM object, not a name "
                            f"({model!r}); nothing is downloaded")
        _check_options(block_size, max_model_len, device, unknown)
        dtype = _resolve_dtype(dtype)
        from .model_check import check_model
        from .model_runner import ModelRunner  # here: needs the vllm_like plugin's ops

        check_model(model, "LLM")

        config = model.config
        if max_model_len is None:
            max_model_len = config.max_position_embeddings
        if max_model_len > config.max_position_embeddings:
            raise ValueError(f"LLM: max_model_len ({max_model_len}) is above the model's max_position_embeddings "
                             f"({config.max_position_embeddings})")
        # The runner's own rule (a float64 model computes and caches in float32).
        dtype = ModelRunner.compute_dtype(model, dtype)
        block_bytes = ModelRunner.block_bytes(config, block_size, dtype)
        max_useful = max_num_seqs * -(-max_model_len // block_size)
        device_blocks = _num_blocks("num_device_blocks", num_device_blocks, "kv_cache_memory", kv_cache_memory,
                                    block_bytes)
        if device_blocks is None:
            device_blocks = min(max_useful, _DEFAULT_KV_CACHE_MEMORY // block_bytes)
        if device_blocks < 1:
            raise ValueError(f"LLM: the KV cache holds no block: kv_cache_memory {kv_cache_memory} bytes, one block "
                             f"of {block_size} tokens over all layers is {block_bytes} bytes")
        cpu_blocks = _num_blocks("num_cpu_blocks", num_cpu_blocks, "swap_space", swap_space, block_bytes, 0)
        _check_swap(preemption_mode, swap_space, cpu_blocks, block_bytes)
        self.model_runner = ModelRunner(model, block_size=block_size, num_device_blocks=device_blocks,
                                        num_cpu_blocks=cpu_blocks, device=device, dtype=dtype)
        gen_config = getattr(model, "generation_config", None)
        eos = getattr(gen_config, "eos_token_id", None)
        if eos is None:
            eos = config.eos_token_id
        self.tokenizer = tokenizer
        self.llm_engine = LLMEngine(self.model_runner, block_size=block_size, num_device_blocks=device_blocks,
                                    num_cpu_blocks=cpu_blocks, vocab_size=config.vocab_size,
                                    max_model_len=max_model_len, eos_token_id=eos, tokenizer=tokenizer,
                                    max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
                                    enable_prefix_caching=enable_prefix_caching,
                                    enable_chunked_prefill=enable_chunked_prefill, preemption_mode=preemption_mode,
                                    seed=seed)
        self._request_counter = 0

    def get_tokenizer(self):
        return self.tokenizer

    def generate(self, prompts=None, sampling_params: Union[SamplingParams, Sequence[SamplingParams], None] = None,
                 prompt_token_ids: Optional[List] = None, use_tqdm: bool = False) -> List[RequestOutput]:
        """Run every prompt to completion; one RequestOutput per prompt, in order.

        ``prompts``: one prompt or a list; a prompt is ``{"prompt_token_ids": [...]}``,
        a list of token ids, or, with a tokenizer, a string (or ``{"prompt": str}``).
        A flat list of ints is ONE prompt (``generate([1, 2, 3])``), as vLLM's
        token-id prompt; a list of such lists is several.
        ``prompt_token_ids``: vLLM's older keyword, one list of ids or a list of
        them, instead of ``prompts``.
        ``sampling_params``: one for all prompts, or one per prompt.
        ``use_tqdm`` is accepted for vLLM compatibility and ignored (no progress bar).
        """
        if prompt_token_ids is not None:
            if prompts is not None:
                raise ValueError("LLM.generate: give prompts or prompt_token_ids, not both")
            prompts = prompt_token_ids
        if prompts is None or not isinstance(prompts, (str, dict, list, tuple)):
            raise TypeError(f"LLM.generate: prompts must be a prompt or a list of prompts (a str, a list of token "
                            f"ids, {{'prompt_token_ids': [...]}} or {{'prompt': str}}), found {type(prompts).__name__}")
        if isinstance(prompts, (str, dict)) or _is_token_ids(prompts):
            prompts = [prompts]
        prompts = list(prompts)
        if sampling_params is None:
            sampling_params = SamplingParams()
        params = list(sampling_params) if isinstance(sampling_params, (list, tuple)) else [sampling_params] * len(
            prompts)
        if len(params) != len(prompts):
            raise ValueError(f"LLM.generate: {len(params)} sampling_params for {len(prompts)} prompts")
        _check_params(params)
        engine = self.llm_engine
        ids = []
        try:
            for prompt, p in zip(prompts, params):
                rid = str(self._request_counter)
                self._request_counter += 1
                _check_prompt(len(ids), prompt)
                engine.add_request(rid, prompt, p)
                ids.append(rid)
            done = {}
            while engine.has_unfinished_requests():
                for out in engine.step():
                    if out.finished:
                        done[out.request_id] = out
        except BaseException:
            engine.abort_request(ids)
            raise
        return [done[rid] for rid in ids]

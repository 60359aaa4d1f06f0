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
preemption recomputes unless swap space is given).
"""
from typing import List, Optional, Sequence, Union

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


class LLM:

    def __init__(self, model, tokenizer=None, *, block_size: int = 16, num_device_blocks: Optional[int] = None,
                 kv_cache_memory: Optional[int] = None, num_cpu_blocks: Optional[int] = None,
                 swap_space: Optional[int] = None, max_num_seqs: int = 256,
                 max_num_batched_tokens: Optional[int] = None, max_model_len: Optional[int] = None,
                 enable_prefix_caching: bool = False, enable_chunked_prefill: bool = False,
                 preemption_mode: Optional[str] = None, seed: int = 0, device: str = "npu", dtype=None):
        if isinstance(model, str):
            raise TypeError("npubridge.vllm.LLM: pass a transformers LlamaForCausalLM object, not a name "
                            f"({model!r}); nothing is downloaded")
        from .model_runner import ModelRunner  # here: needs the vllm_like plugin's ops

        config = model.config
        if max_model_len is None:
            max_model_len = config.max_position_embeddings
        if max_model_len > config.max_position_embeddings:
            raise ValueError(f"LLM: max_model_len ({max_model_len}) is above the model's max_position_embeddings "
                             f"({config.max_position_embeddings})")
        block_bytes = ModelRunner.block_bytes(config, block_size, dtype or model.dtype)
        max_useful = max_num_seqs * -(-max_model_len // block_size)
        device_blocks = _num_blocks("num_device_blocks", num_device_blocks, "kv_cache_memory", kv_cache_memory,
                                    block_bytes)
        if device_blocks is None:
            device_blocks = min(max_useful, _DEFAULT_KV_CACHE_MEMORY // block_bytes)
        if device_blocks < 1:
            raise ValueError(f"LLM: the KV cache holds no block: kv_cache_memory {kv_cache_memory} bytes, one block "
                             f"of {block_size} tokens over all layers is {block_bytes} bytes")
        cpu_blocks = _num_blocks("num_cpu_blocks", num_cpu_blocks, "swap_space", swap_space, block_bytes, 0)
        runner_kwargs = {} if dtype is None else {"dtype": dtype}
        self.model_runner = ModelRunner(model, block_size=block_size, num_device_blocks=device_blocks,
                                        num_cpu_blocks=cpu_blocks, device=device, **runner_kwargs)
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

    def generate(self, prompts, sampling_params: Union[SamplingParams, Sequence[SamplingParams], None] = None,
                 use_tqdm: bool = False) -> List[RequestOutput]:
        """Run every prompt to completion; one RequestOutput per prompt, in order.

        ``prompts``: one prompt or a list; a prompt is ``{"prompt_token_ids": [...]}``
        or, with a tokenizer, a string (or ``{"prompt": str}``).
        ``sampling_params``: one for all prompts, or one per prompt.
        """
        if isinstance(prompts, (str, dict)):
            prompts = [prompts]
        prompts = list(prompts)
        if sampling_params is None:
            sampling_params = SamplingParams()
        params = list(sampling_params) if isinstance(sampling_params, (list, tuple)) else [sampling_params] * len(
            prompts)
        if len(params) != len(prompts):
            raise ValueError(f"LLM.generate: {len(params)} sampling_params for {len(prompts)} prompts")
        engine = self.llm_engine
        ids = []
        try:
            for prompt, p in zip(prompts, params):
                rid = str(self._request_counter)
                self._request_counter += 1
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

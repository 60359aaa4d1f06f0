"""npubridge.vllm: vLLM's offline API (LLM, SamplingParams, RequestOutput)
over a paged KV cache on the npu and the vllm_like plugin's kernels.

    from npubridge.vllm import LLM, SamplingParams
    llm = LLM(model, enable_prefix_caching=True)   # a transformers LlamaForCausalLM
    for out in llm.generate([{"prompt_token_ids": ids}], SamplingParams(temperature=0, max_tokens=32)):
        print(out.outputs[0].token_ids)

- engine.py: LLMEngine (add_request / step / abort_request / stats), one
  scheduled batch per step;
- scheduler.py: waiting / running / swapped queues, budgets, preemption by
  swap or recompute; block_manager.py: reference-counted blocks,
  copy-on-write, prefix caching, swapping;
- sampler.py, sampling_params.py, sequence.py, outputs.py;
- model_runner.py: the Llama forward over vllm_like's ops.
"""
import npubridge  # noqa: F401  (the npu device and the plugins)

from .engine import LLMEngine
from .llm import LLM
from .outputs import CompletionOutput, RequestOutput
from .sampling_params import SamplingParams

__all__ = ["LLM", "LLMEngine", "SamplingParams", "RequestOutput", "CompletionOutput"]

"""The sampler: next tokens from the last-token logits of each sampling sequence.

Logits arrive as float32 CPU tensors, one row per sequence. Per row, in
vLLM's order: min_tokens masks the stop tokens (eos unless ignore_eos, and
stop_token_ids) while the completion is shorter; then either greedy, exactly
torch.argmax (ties to the lowest index), or temperature scaling, top-k and
top-p (on the sorted distribution, always keeping the most likely token) and
a draw with torch.multinomial from the request's own torch.Generator when it
has a seed (so it reproduces whatever else is in the batch), else from the
engine's. A row may give several samples: the prompt of an n > 1 request is
sampled n times, once per completion.
"""
from dataclasses import dataclass
from typing import List, Optional, Tuple

import torch

from .sampling_params import SamplingParams

__all__ = ["SampleRequest", "sample"]


@dataclass
class SampleRequest:
    params: SamplingParams
    generator: Optional[torch.Generator]  # None: the engine's generator
    num_samples: int = 1
    num_output_tokens: int = 0  # the completion's length so far (for min_tokens)


def _filter_top_k_top_p(x: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    vocab = x.numel()
    if not (0 < top_k < vocab) and top_p >= 1.0:
        return x
    values, order = torch.sort(x, descending=True, stable=True)
    drop = torch.zeros(vocab, dtype=torch.bool)
    if 0 < top_k < vocab:
        drop[top_k:] = True
        values = values.masked_fill(drop, float("-inf"))
    if top_p < 1.0:
        probs = torch.softmax(values, dim=0)
        # Drop a token when the mass before it already reaches top_p; the first never drops.
        before = torch.cumsum(probs, dim=0) - probs
        drop |= before >= top_p
        drop[0] = False
    out = torch.full_like(x, float("-inf"))
    keep = order[~drop]
    out[keep] = x[keep]
    return out


def _sample_row(row: torch.Tensor, req: SampleRequest, engine_generator: torch.Generator) -> List[Tuple[int, float]]:
    params = req.params
    if req.num_output_tokens < params.min_tokens:
        stops = [t for t in params.all_stop_token_ids() if 0 <= t < row.numel()]
        if stops:
            row = row.clone()
            row[stops] = float("-inf")
    if params.greedy:
        token = int(torch.argmax(row))
        logprob = float(torch.log_softmax(row, dim=0)[token])
        return [(token, logprob)] * req.num_samples
    x = _filter_top_k_top_p(row / params.temperature, params.top_k, params.top_p)
    logprobs = torch.log_softmax(x, dim=0)
    generator = req.generator if req.generator is not None else engine_generator
    tokens = torch.multinomial(logprobs.exp(), req.num_samples, replacement=True, generator=generator)
    return [(int(t), float(logprobs[t])) for t in tokens]


def sample(logits: torch.Tensor, requests: List[SampleRequest],
           engine_generator: torch.Generator) -> List[List[Tuple[int, float]]]:
    """(token, logprob) samples per row of `logits` [len(requests), vocab]."""
    if logits.dim() != 2 or logits.shape[0] != len(requests):
        raise ValueError(f"sampler: logits must be [{len(requests)}, vocab], found {list(logits.shape)}")
    if logits.dtype != torch.float32 or logits.device.type != "cpu":
        raise ValueError(f"sampler: logits must be float32 on the cpu, found {logits.dtype} on {logits.device}")
    return [_sample_row(logits[i], req, engine_generator) for i, req in enumerate(requests)]

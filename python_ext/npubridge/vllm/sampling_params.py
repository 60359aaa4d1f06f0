"""SamplingParams: how one request is decoded, with vLLM's names and defaults.

A temperature below _SAMPLING_EPS means greedy (exact argmax), as in vLLM;
top_k <= 0 (vLLM's -1) and top_p == 1 switch those filters off. Bad values
raise ValueError naming the argument, the expected range and the value found.
"""
from dataclasses import dataclass, field
from typing import List, Optional, Union

__all__ = ["SamplingParams"]

# vLLM's threshold below which a temperature counts as greedy.
_SAMPLING_EPS = 1e-5


@dataclass
class SamplingParams:
    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    seed: Optional[int] = None
    max_tokens: Optional[int] = 16
    min_tokens: int = 0
    stop: Optional[Union[str, List[str]]] = None
    stop_token_ids: Optional[List[int]] = None
    ignore_eos: bool = False
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    logprobs: Optional[int] = None
    # Filled by the engine from the model / tokenizer; not a user setting.
    _eos_token_ids: List[int] = field(default_factory=list, repr=False)

    def __post_init__(self):
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.stop = list(self.stop or [])
        self.stop_token_ids = [int(t) for t in (self.stop_token_ids or [])]
        self._check()

    def _check(self):
        def bad(name, expected, found):
            raise ValueError(f"SamplingParams: {name} must be {expected}, found {found!r}")

        if not isinstance(self.n, int) or self.n < 1:
            bad("n", "an int >= 1", self.n)
        if self.temperature < 0:
            bad("temperature", ">= 0", self.temperature)
        if not 0 < self.top_p <= 1:
            bad("top_p", "in (0, 1]", self.top_p)
        if not isinstance(self.top_k, int) or (self.top_k < 1 and self.top_k not in (0, -1)):
            bad("top_k", "-1 or 0 (off) or an int >= 1", self.top_k)
        if self.max_tokens is not None and self.max_tokens < 1:
            bad("max_tokens", ">= 1 or None", self.max_tokens)
        if self.min_tokens < 0:
            bad("min_tokens", ">= 0", self.min_tokens)
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            bad("min_tokens", f"<= max_tokens ({self.max_tokens})", self.min_tokens)
        if self.seed is not None and not isinstance(self.seed, int):
            bad("seed", "an int or None", self.seed)
        if any(not s for s in self.stop):
            bad("stop", "non-empty strings", self.stop)
        if self.logprobs is not None:
            raise ValueError("SamplingParams: logprobs is not supported by npubridge.vllm (the cumulative logprob of "
                             "each completion is reported in CompletionOutput.cumulative_logprob)")

    @property
    def greedy(self) -> bool:
        return self.temperature < _SAMPLING_EPS

    def all_stop_token_ids(self) -> List[int]:
        """Tokens that end a completion: stop_token_ids, and the model's eos unless ignore_eos."""
        ids = list(self.stop_token_ids)
        if not self.ignore_eos:
            ids += [t for t in self._eos_token_ids if t not in ids]
        return ids

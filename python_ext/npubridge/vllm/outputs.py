"""RequestOutput and CompletionOutput: what generate() and step() return, as in vLLM."""
from dataclasses import dataclass, field
from typing import List, Optional, Union

from .sequence import SequenceGroup

__all__ = ["CompletionOutput", "RequestOutput"]


@dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: List[int]
    cumulative_logprob: Optional[float]
    logprobs: None = None
    finish_reason: Optional[str] = None  # "stop", "length", "abort", None while running
    stop_reason: Union[int, str, None] = None  # the stop token id or stop string, None for eos / length

    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class RequestOutput:
    request_id: str
    prompt: Optional[str]
    prompt_token_ids: List[int]
    outputs: List[CompletionOutput] = field(default_factory=list)
    finished: bool = False
    num_cached_tokens: int = 0  # prompt tokens served by the prefix cache

    @classmethod
    def from_seq_group(cls, group: SequenceGroup) -> "RequestOutput":
        seqs = sorted(group.seqs, key=lambda s: s.index)
        outputs = [
            CompletionOutput(index=s.index, text=s.text, token_ids=list(s.output_token_ids),
                             cumulative_logprob=s.cumulative_logprob, finish_reason=s.status.finish_reason,
                             stop_reason=s.stop_reason) for s in seqs
        ]
        return cls(group.request_id, group.prompt, list(group.prompt_token_ids), outputs, group.is_finished(),
                   group.num_cached_tokens)

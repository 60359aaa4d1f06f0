"""Sequence and SequenceGroup: the engine's record of a request's tokens.

A Sequence is one completion: its prompt tokens, the tokens sampled so far,
and ``num_computed_tokens``, how many of them have their K/V in the cache.
Prefill, chunked prefill, a prefix-cache hit, recompute after preemption and
decode are all the same thing seen from here: compute tokens
[num_computed_tokens, len) and sample after the last one. A SequenceGroup is
one request: one sequence until the prompt is sampled, then ``n`` (parallel
sampling forks the parent, which shares its prompt blocks with the children).
"""
import enum
import time
from typing import List, Optional

from .sampling_params import SamplingParams

__all__ = ["SequenceStatus", "Sequence", "SequenceGroup"]


class SequenceStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    SWAPPED = "swapped"
    FINISHED_STOPPED = "finished_stopped"
    FINISHED_LENGTH_CAPPED = "finished_length_capped"
    FINISHED_ABORTED = "finished_aborted"

    @property
    def finished(self) -> bool:
        return self.name.startswith("FINISHED")

    @property
    def finish_reason(self) -> Optional[str]:
        return {
            SequenceStatus.FINISHED_STOPPED: "stop",
            SequenceStatus.FINISHED_LENGTH_CAPPED: "length",
            SequenceStatus.FINISHED_ABORTED: "abort"
        }.get(self)


class Sequence:

    def __init__(self, seq_id: int, prompt_token_ids: List[int], index: int = 0):
        self.seq_id = seq_id
        self.index = index  # which of the request's n completions
        self.prompt_token_ids = list(prompt_token_ids)
        self.output_token_ids: List[int] = []
        self.num_computed_tokens = 0
        self.status = SequenceStatus.WAITING
        self.cumulative_logprob = 0.0
        self.stop_reason = None  # the stop token id or stop string that ended it
        self.text = ""  # detokenised output (when the engine has a tokenizer)

    def __repr__(self):
        return (f"Sequence(id={self.seq_id}, len={self.get_len()}, computed={self.num_computed_tokens}, "
                f"{self.status.value})")

    def get_len(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    def get_token_ids(self) -> List[int]:
        return self.prompt_token_ids + self.output_token_ids

    def token_at(self, position: int) -> int:
        n = len(self.prompt_token_ids)
        return self.prompt_token_ids[position] if position < n else self.output_token_ids[position - n]

    def token_slice(self, start: int, end: int) -> List[int]:
        """Tokens [start, end) without building the whole list."""
        n = len(self.prompt_token_ids)
        if end <= n:
            return self.prompt_token_ids[start:end]
        if start >= n:
            return self.output_token_ids[start - n:end - n]
        return self.prompt_token_ids[start:] + self.output_token_ids[:end - n]

    def get_num_uncomputed_tokens(self) -> int:
        return self.get_len() - self.num_computed_tokens

    def append_token(self, token_id: int, logprob: float = 0.0):
        self.output_token_ids.append(int(token_id))
        self.cumulative_logprob += logprob

    def reset_for_recompute(self):
        """Preempted by recompute: its blocks are gone, so every token (the
        outputs too) is prefilled again when it is rescheduled."""
        self.num_computed_tokens = 0
        self.status = SequenceStatus.WAITING

    def fork(self, seq_id: int, index: int) -> "Sequence":
        child = Sequence(seq_id, self.prompt_token_ids, index)
        child.output_token_ids = list(self.output_token_ids)
        child.num_computed_tokens = self.num_computed_tokens
        child.status = self.status
        child.cumulative_logprob = self.cumulative_logprob
        return child


class SequenceGroup:

    def __init__(self, request_id: str, seqs: List[Sequence], sampling_params: SamplingParams,
                 prompt: Optional[str] = None, arrival_time: Optional[float] = None, generator=None):
        self.request_id = request_id
        self.seqs = seqs
        self.sampling_params = sampling_params
        self.prompt = prompt
        self.prompt_token_ids = list(seqs[0].prompt_token_ids)
        self.arrival_time = time.monotonic() if arrival_time is None else arrival_time
        self.generator = generator  # per-request torch.Generator when seeded, else None
        self.forked = sampling_params.n == 1  # parallel sampling forks once, at the prompt's sample
        self.num_cached_tokens = 0  # prompt tokens served by the prefix cache at the first schedule
        self.first_scheduled = False

    def __repr__(self):
        return f"SequenceGroup({self.request_id!r}, {self.seqs})"

    def get_seqs(self, status: Optional[SequenceStatus] = None) -> List[Sequence]:
        return list(self.seqs) if status is None else [s for s in self.seqs if s.status == status]

    def unfinished_seqs(self) -> List[Sequence]:
        return [s for s in self.seqs if not s.status.finished]

    def is_finished(self) -> bool:
        return all(s.status.finished for s in self.seqs)

    def max_num_running_seqs(self) -> int:
        """Seats the group needs in max_num_seqs: n once forked, as vLLM counts it."""
        return self.sampling_params.n if not self.forked else len(self.unfinished_seqs())

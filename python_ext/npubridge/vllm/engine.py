"""LLMEngine: requests in, one scheduled batch per step() through the model runner, outputs out.

One step: the scheduler plans the batch (which sequences compute how many
tokens, and the block copies that must happen first); the runner swaps out,
swaps in and copies blocks in that order (a block swapped out this step may
be the destination of a copy or of this step's new K/V); one forward
computes every scheduled token and returns the logits of each sequence
whose chunk reaches its end; the sampler picks the next tokens; stop checks
finish sequences and their blocks are freed at once. A request with n > 1
is prefilled once and forked into n sequences at its first sample; the
forks share the prompt's blocks and copy the partly filled last one when
they first write to it.
"""
import copy
import itertools
import time
from typing import Dict, List, Optional, Union

import torch

from .block_manager import BlockSpaceManager
from .outputs import RequestOutput
from .sampler import SampleRequest, sample
from .sampling_params import SamplingParams
from .scheduler import Scheduler, SchedulerOutputs
from .sequence import Sequence, SequenceGroup, SequenceStatus

__all__ = ["LLMEngine"]

PromptType = Union[str, Dict, List[int]]


class LLMEngine:
    """The engine over a model runner (npubridge.vllm.model_runner.ModelRunner's
    interface: execute, copy_blocks, swap_out, swap_in) that owns
    num_device_blocks device and num_cpu_blocks CPU blocks of block_size."""

    def __init__(self, runner, *, block_size: int, num_device_blocks: int, num_cpu_blocks: int = 0,
                 vocab_size: int, max_model_len: int, eos_token_id=None, tokenizer=None, max_num_seqs: int = 256,
                 max_num_batched_tokens: Optional[int] = None, enable_prefix_caching: bool = False,
                 enable_chunked_prefill: bool = False, preemption_mode: Optional[str] = None, seed: int = 0,
                 watermark: float = 0.01):
        self.runner = runner
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.max_model_len = max_model_len
        if eos_token_id is None:
            eos_token_id = getattr(tokenizer, "eos_token_id", None)
        self.eos_token_ids = ([] if eos_token_id is None else
                              [int(t) for t in (eos_token_id if isinstance(eos_token_id, (list, tuple)) else
                                                [eos_token_id])])
        if max_num_batched_tokens is None:
            max_num_batched_tokens = max(max_model_len, 2048) if not enable_chunked_prefill else 512
        self.block_manager = BlockSpaceManager(block_size, num_device_blocks, num_cpu_blocks, watermark,
                                               enable_prefix_caching)
        self.scheduler = Scheduler(self.block_manager, max_num_seqs=max_num_seqs,
                                   max_num_batched_tokens=max_num_batched_tokens,
                                   enable_chunked_prefill=enable_chunked_prefill, preemption_mode=preemption_mode)
        self.generator = torch.Generator().manual_seed(seed)
        self._seq_ids = itertools.count()
        self._groups: Dict[str, SequenceGroup] = {}
        self._stats = {
            "steps": 0,
            "prompt_tokens_computed": 0,
            "generation_tokens": 0,
            "blocks_copied": 0,
            "blocks_swapped_in": 0,
            "blocks_swapped_out": 0,
            "max_num_running_seqs": 0
        }

    # ---- requests ------------------------------------------------------
    def _prompt_tokens(self, prompt: PromptType):
        if isinstance(prompt, dict):
            if "prompt_token_ids" in prompt:
                return prompt.get("prompt"), list(prompt["prompt_token_ids"])
            if "prompt" in prompt:
                prompt = prompt["prompt"]
            else:
                raise ValueError(f"LLMEngine: a prompt dict needs 'prompt_token_ids' or 'prompt', found keys "
                                 f"{sorted(prompt)}")
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise ValueError("LLMEngine: a text prompt needs a tokenizer (pass tokenizer= to LLM), or give "
                                 "{'prompt_token_ids': [...]}")
            return prompt, list(self.tokenizer(prompt)["input_ids"])
        if isinstance(prompt, (list, tuple)) and all(isinstance(t, int) for t in prompt):
            return None, list(prompt)
        raise TypeError(f"LLMEngine: a prompt must be a str, a dict with 'prompt_token_ids' or a list of ints, "
                        f"found {type(prompt).__name__}")

    def add_request(self, request_id: str, prompt: PromptType, params: Optional[SamplingParams] = None,
                    arrival_time: Optional[float] = None):
        if request_id in self._groups:
            raise ValueError(f"LLMEngine.add_request: request id {request_id!r} is in use")
        params = copy.copy(params or SamplingParams())
        params.stop_token_ids = list(params.stop_token_ids)
        params._eos_token_ids = list(self.eos_token_ids)
        if params.n > self.scheduler.max_num_seqs:
            raise ValueError(f"LLMEngine.add_request({request_id!r}): n={params.n} completions are more than "
                             f"max_num_seqs ({self.scheduler.max_num_seqs})")
        text, ids = self._prompt_tokens(prompt)
        self._check_prompt(request_id, ids)
        generator = torch.Generator().manual_seed(params.seed) if params.seed is not None else None
        seq = Sequence(next(self._seq_ids), ids)
        group = SequenceGroup(request_id, [seq], params, text, arrival_time or time.monotonic(), generator)
        self._groups[request_id] = group
        self.scheduler.add_seq_group(group)

    def _check_prompt(self, request_id, ids):
        where = f"LLMEngine.add_request({request_id!r})"
        if not ids:
            raise ValueError(f"{where}: the prompt is empty")
        bad = [t for t in ids if not 0 <= t < self.vocab_size]
        if bad:
            raise ValueError(f"{where}: token ids must be in [0, {self.vocab_size}), found {bad[:5]}")
        if len(ids) >= self.max_model_len:
            raise ValueError(f"{where}: the prompt has {len(ids)} tokens, the model's limit is "
                             f"{self.max_model_len} (max_model_len) including at least one generated token")
        bm, sched = self.block_manager, self.scheduler
        blocks = -(-(len(ids) + 1) // bm.block_size)
        if blocks > bm.device.num_blocks - bm.watermark_blocks:
            raise ValueError(f"{where}: the prompt needs {blocks} KV blocks of {bm.block_size} tokens, the device "
                             f"pool has {bm.device.num_blocks} (watermark {bm.watermark_blocks}); give more KV "
                             f"cache memory")
        if not sched.enable_chunked_prefill and len(ids) > sched.max_num_batched_tokens:
            raise ValueError(f"{where}: the prompt has {len(ids)} tokens, more than max_num_batched_tokens "
                             f"({sched.max_num_batched_tokens}); raise it or enable chunked prefill")

    def abort_request(self, request_id: Union[str, List[str]]):
        for rid in [request_id] if isinstance(request_id, str) else request_id:
            if self.scheduler.abort_seq_group(rid) is not None:
                self._groups.pop(rid, None)

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished_seqs()

    def get_num_unfinished_requests(self) -> int:
        return self.scheduler.get_num_unfinished_seq_groups()

    # ---- one step ------------------------------------------------------
    def step(self) -> List[RequestOutput]:
        if not self.has_unfinished_requests():
            return []
        sched = self.scheduler.schedule()
        self._stats["steps"] += 1
        if sched.is_empty() and not sched.ignored and not sched.preempted:
            # Every admission rule refused and nothing runs: a bug, not a
            # state to spin in.
            raise RuntimeError(f"LLMEngine.step: nothing could be scheduled with {self.stats()}")
        self._move_blocks(sched)
        touched = list(sched.ignored)
        if sched.scheduled:
            logits = self.runner.execute(self._model_input(sched))
            self._process(sched, logits)
            touched += list(dict.fromkeys(s.group for s in sched.scheduled))
        self.scheduler.free_finished()
        self._stats["max_num_running_seqs"] = max(self._stats["max_num_running_seqs"],
                                                  sum(len(g.unfinished_seqs()) for g in self.scheduler.running))
        outputs = []
        for group in touched:
            outputs.append(RequestOutput.from_seq_group(group))
            if group.is_finished():
                self._groups.pop(group.request_id, None)
        return outputs

    def _move_blocks(self, sched: SchedulerOutputs):
        if sched.blocks_to_swap_out:
            self.runner.swap_out(sched.blocks_to_swap_out)
        if sched.blocks_to_swap_in:
            self.runner.swap_in(sched.blocks_to_swap_in)
        if sched.blocks_to_copy:
            self.runner.copy_blocks(sched.blocks_to_copy)
        self._stats["blocks_swapped_out"] += len(sched.blocks_to_swap_out)
        self._stats["blocks_swapped_in"] += len(sched.blocks_to_swap_in)
        self._stats["blocks_copied"] += len(sched.blocks_to_copy)

    def _model_input(self, sched: SchedulerOutputs):
        # Imported here: the engine's logic imports without the runner (and its plugin ops).
        from .model_runner import ModelInput

        token_ids, positions, seq_index, tables, sample_rows = [], [], [], [], []
        for i, s in enumerate(sched.scheduled):
            start, end = s.seq.num_computed_tokens, s.seq.num_computed_tokens + s.num_new_tokens
            token_ids += s.seq.token_slice(start, end)
            positions += range(start, end)
            seq_index += [i] * s.num_new_tokens
            tables.append(list(self.block_manager.get_block_table(s.seq)))
            if s.do_sample:
                sample_rows.append(len(token_ids) - 1)
        return ModelInput(token_ids, positions, seq_index, tables, sample_rows)

    def _process(self, sched: SchedulerOutputs, logits: torch.Tensor):
        sampling = [s for s in sched.scheduled if s.do_sample]
        if logits.shape[0] != len(sampling):
            raise RuntimeError(f"LLMEngine: the model runner returned {logits.shape[0]} logits rows for "
                               f"{len(sampling)} sampling sequences")
        for s in sched.scheduled:
            if s.seq.num_computed_tokens < len(s.seq.prompt_token_ids):
                self._stats["prompt_tokens_computed"] += min(s.num_new_tokens,
                                                             len(s.seq.prompt_token_ids) - s.seq.num_computed_tokens)
            s.seq.num_computed_tokens += s.num_new_tokens
            self.block_manager.mark_computed(s.seq)
        requests = [
            SampleRequest(s.group.sampling_params, s.group.generator,
                          1 if s.group.forked else s.group.sampling_params.n, len(s.seq.output_token_ids))
            for s in sampling
        ]
        for s, samples in zip(sampling, sample(logits, requests, self.generator)):
            group, seq = s.group, s.seq
            targets = [seq]
            if not group.forked:
                group.forked = True
                for index in range(1, len(samples)):
                    child = seq.fork(next(self._seq_ids), index)
                    self.block_manager.fork(seq, child)
                    group.seqs.append(child)
                    targets.append(child)
            for target, (token, logprob) in zip(targets, samples):
                target.append_token(token, logprob)
                self._stats["generation_tokens"] += 1
                self._check_stop(group, target)

    def _check_stop(self, group: SequenceGroup, seq: Sequence):
        params = group.sampling_params
        num_out = len(seq.output_token_ids)
        token = seq.output_token_ids[-1]
        if self.tokenizer is not None:
            seq.text = self.tokenizer.decode(seq.output_token_ids, skip_special_tokens=params.skip_special_tokens)
        status = None
        if num_out >= params.min_tokens:
            if token in params.stop_token_ids:
                status, seq.stop_reason = SequenceStatus.FINISHED_STOPPED, token
            elif not params.ignore_eos and token in params._eos_token_ids:
                status = SequenceStatus.FINISHED_STOPPED
            elif params.stop and self.tokenizer is not None:
                for stop in params.stop:
                    at = seq.text.find(stop)
                    if at >= 0:
                        seq.text = seq.text[:at + len(stop)] if params.include_stop_str_in_output else seq.text[:at]
                        status, seq.stop_reason = SequenceStatus.FINISHED_STOPPED, stop
                        break
        if status is None and (params.max_tokens is not None and num_out >= params.max_tokens
                               or seq.get_len() >= self.max_model_len):
            status = SequenceStatus.FINISHED_LENGTH_CAPPED
        if status is not None:
            seq.status = status
            self.scheduler.free_seq(seq)

    # ---- figures -------------------------------------------------------
    def stats(self) -> dict:
        bm, sched = self.block_manager, self.scheduler
        return dict(
            self._stats,
            num_waiting=len(sched.waiting),
            num_running=len(sched.running),
            num_swapped=len(sched.swapped),
            num_device_blocks=bm.device.num_blocks,
            num_free_device_blocks=bm.get_num_free_device_blocks(),
            num_cpu_blocks=bm.cpu.num_blocks,
            num_free_cpu_blocks=bm.get_num_free_cpu_blocks(),
            num_cached_blocks=bm.device.num_cached_blocks(),
            num_evictions=bm.device.num_evictions,
            prefix_cache_queries=bm.prefix_queries,
            prefix_cache_hits=bm.prefix_hits,
            prefix_cache_hit_rate=bm.prefix_hits / bm.prefix_queries if bm.prefix_queries else 0.0,
            num_preemptions_swap=sched.num_preemptions["swap"],
            num_preemptions_recompute=sched.num_preemptions["recompute"],
        )

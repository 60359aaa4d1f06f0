"""The continuous-batching scheduler, in vLLM v0's shape.

Three queues, each first-come first-served: ``waiting`` (not yet admitted,
or preempted by recompute), ``running`` (holding device blocks) and
``swapped`` (blocks on the CPU). One schedule() call plans one engine step:

1. Running groups, decodes before prefill chunks (a decode is one token per
   sequence and must not starve behind a long prompt). When a group's next
   tokens need blocks the device does not have, the latest-arrived group not
   yet scheduled in this step is preempted, and the group itself when it is
   the last one: by swap (its blocks copied to the CPU) when the CPU pool can
   hold them and the mode allows, else by recompute (blocks dropped, the
   group back at the front of ``waiting``, its tokens prefilled again).
2. Swapped groups come back in, unless this step preempted (memory is short).
3. Waiting groups are admitted only when nothing is swapped and nothing was
   preempted, so old work finishes before new work takes its memory.

Budgets per step: ``max_num_seqs`` sequences holding seats (a request with
n > 1 counts n from admission) and ``max_num_batched_tokens`` tokens
computed. A prompt is scheduled whole unless chunked prefill is on; a
sequence rebuilt by recompute that is longer than the token budget is
chunked either way (it could never run otherwise).
"""
from collections import deque
from dataclasses import dataclass, field
from typing import List, Optional, Tuple

from .block_manager import AllocStatus, BlockSpaceManager
from .sequence import Sequence, SequenceGroup, SequenceStatus

__all__ = ["Scheduler", "SchedulerOutputs", "ScheduledSeq", "PREEMPTION_MODES"]

PREEMPTION_MODES = (None, "swap", "recompute")


@dataclass
class ScheduledSeq:
    group: SequenceGroup
    seq: Sequence
    num_new_tokens: int  # tokens [seq.num_computed_tokens, + num_new_tokens) computed this step

    @property
    def do_sample(self) -> bool:
        """The chunk reaches the sequence's end: its last token's logits give the next token."""
        return self.seq.num_computed_tokens + self.num_new_tokens == self.seq.get_len()


@dataclass
class SchedulerOutputs:
    scheduled: List[ScheduledSeq] = field(default_factory=list)
    blocks_to_swap_out: List[Tuple[int, int]] = field(default_factory=list)  # (device, cpu)
    blocks_to_swap_in: List[Tuple[int, int]] = field(default_factory=list)  # (cpu, device)
    blocks_to_copy: List[Tuple[int, int]] = field(default_factory=list)  # (src, dst) device blocks
    preempted: List[Tuple[SequenceGroup, str]] = field(default_factory=list)  # (group, "swap"|"recompute")
    ignored: List[SequenceGroup] = field(default_factory=list)  # can never fit the device pool

    @property
    def num_batched_tokens(self) -> int:
        return sum(s.num_new_tokens for s in self.scheduled)

    def is_empty(self) -> bool:
        return not (self.scheduled or self.blocks_to_swap_out or self.blocks_to_swap_in or self.blocks_to_copy)


class Scheduler:

    def __init__(self, block_manager: BlockSpaceManager, *, max_num_seqs: int = 256,
                 max_num_batched_tokens: int = 2048, enable_chunked_prefill: bool = False,
                 preemption_mode: Optional[str] = None):
        if preemption_mode not in PREEMPTION_MODES:
            raise ValueError(f"Scheduler: preemption_mode must be one of {PREEMPTION_MODES}, "
                             f"found {preemption_mode!r}")
        if max_num_seqs < 1 or max_num_batched_tokens < max_num_seqs:
            raise ValueError(f"Scheduler: need max_num_seqs >= 1 and max_num_batched_tokens >= max_num_seqs "
                             f"(every running sequence decodes a token per step), found max_num_seqs="
                             f"{max_num_seqs}, max_num_batched_tokens={max_num_batched_tokens}")
        self.block_manager = block_manager
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.enable_chunked_prefill = enable_chunked_prefill
        self.preemption_mode = preemption_mode
        self.waiting: deque = deque()
        self.running: List[SequenceGroup] = []
        self.swapped: List[SequenceGroup] = []
        self.num_preemptions = {"swap": 0, "recompute": 0}

    # ---- queues --------------------------------------------------------
    def add_seq_group(self, group: SequenceGroup):
        self.waiting.append(group)

    def has_unfinished_seqs(self) -> bool:
        return bool(self.waiting or self.running or self.swapped)

    def get_num_unfinished_seq_groups(self) -> int:
        return len(self.waiting) + len(self.running) + len(self.swapped)

    def abort_seq_group(self, request_id: str) -> Optional[SequenceGroup]:
        for queue in (self.waiting, self.running, self.swapped):
            for group in list(queue):
                if group.request_id == request_id:
                    queue.remove(group)
                    for seq in group.unfinished_seqs():
                        seq.status = SequenceStatus.FINISHED_ABORTED
                        self.block_manager.free(seq)
                    return group
        return None

    def free_finished(self):
        """Drop finished groups from ``running`` (their blocks are freed by free_seq)."""
        self.running = [g for g in self.running if not g.is_finished()]

    def free_seq(self, seq: Sequence):
        self.block_manager.free(seq)

    # ---- one step ------------------------------------------------------
    def schedule(self) -> SchedulerOutputs:
        out = SchedulerOutputs()
        budget = [self.max_num_batched_tokens]
        self._schedule_running(out, budget)
        preempted = bool(out.preempted)
        if not preempted:
            self._schedule_swapped(out, budget)
        if not preempted and not self.swapped:
            self._schedule_waiting(out, budget)
        return out

    def _seats(self) -> int:
        return sum(g.max_num_running_seqs() for g in self.running)

    def _is_decode(self, group: SequenceGroup) -> bool:
        return all(s.get_num_uncomputed_tokens() == 1 for s in group.get_seqs(SequenceStatus.RUNNING))

    def _plan(self, group: SequenceGroup, budget: int) -> List[Tuple[Sequence, int]]:
        """(seq, tokens) for the group's running sequences within `budget`
        (a decode is 1 token, a prefill as much of the rest as fits)."""
        items, left = [], budget
        for seq in group.get_seqs(SequenceStatus.RUNNING):
            k = min(seq.get_num_uncomputed_tokens(), left)
            if k > 0:
                items.append((seq, k))
                left -= k
        return items

    def _commit(self, out: SchedulerOutputs, group: SequenceGroup, items, budget):
        for seq, k in items:
            copy = self.block_manager.append_slots(seq, k)
            if copy is not None:
                out.blocks_to_copy.append(copy)
            out.scheduled.append(ScheduledSeq(group, seq, k))
            budget[0] -= k

    def _schedule_running(self, out: SchedulerOutputs, budget):
        decodes = [g for g in self.running if self._is_decode(g)]
        queue = decodes + [g for g in self.running if not self._is_decode(g)]
        kept = []
        while queue:
            group = queue.pop(0)
            items = self._plan(group, budget[0])
            fits = True
            while not self.block_manager.can_append_slots(items):
                victim = max(queue + [group], key=lambda g: g.arrival_time)
                if victim is group:
                    self._preempt(group, out)
                    fits = False
                    break
                queue.remove(victim)
                self._preempt(victim, out)
            if fits:
                self._commit(out, group, items, budget)
                kept.append(group)
        self.running = sorted(kept, key=lambda g: g.arrival_time)

    def _schedule_swapped(self, out: SchedulerOutputs, budget):
        while self.swapped:
            group = self.swapped[0]
            status = self.block_manager.can_swap_in(group)
            if status == AllocStatus.NEVER:
                self.swapped.pop(0)
                self._ignore(group, out)
                continue
            seqs = group.get_seqs(SequenceStatus.SWAPPED)
            if (status == AllocStatus.LATER or self._seats() + group.max_num_running_seqs() > self.max_num_seqs
                    or budget[0] < len(seqs)):
                break
            self.swapped.pop(0)
            out.blocks_to_swap_in.extend(self.block_manager.swap_in(group))
            for seq in seqs:
                seq.status = SequenceStatus.RUNNING
            items = self._plan(group, budget[0])
            assert self.block_manager.can_append_slots(items), "swap-in reserved a block per sequence"
            self._commit(out, group, items, budget)
            self.running.append(group)
        self.running.sort(key=lambda g: g.arrival_time)

    def _schedule_waiting(self, out: SchedulerOutputs, budget):
        bm = self.block_manager
        while self.waiting:
            group = self.waiting[0]
            status = bm.can_allocate(group)
            if status == AllocStatus.NEVER:
                self.waiting.popleft()
                self._ignore(group, out)
                continue
            if status == AllocStatus.LATER or self._seats() + group.max_num_running_seqs() > self.max_num_seqs:
                break
            seqs = group.get_seqs(SequenceStatus.WAITING)
            todo = sum(s.get_len() - bm.num_cached_prefix_tokens(s) for s in seqs)
            chunk = self.enable_chunked_prefill or todo > self.max_num_batched_tokens
            if budget[0] <= 0 or (not chunk and todo > budget[0]):
                break
            self.waiting.popleft()
            bm.allocate(group)
            if not group.first_scheduled:
                group.first_scheduled = True
                group.num_cached_tokens = seqs[0].num_computed_tokens
            for seq in seqs:
                seq.status = SequenceStatus.RUNNING
            self._commit(out, group, self._plan(group, budget[0]), budget)
            self.running.append(group)
        self.running.sort(key=lambda g: g.arrival_time)

    # ---- preemption ----------------------------------------------------
    def _preempt(self, group: SequenceGroup, out: SchedulerOutputs):
        mode = self.preemption_mode
        if mode != "recompute" and self.block_manager.can_swap_out(group):
            out.blocks_to_swap_out.extend(self.block_manager.swap_out(group))
            for seq in group.get_seqs(SequenceStatus.RUNNING):
                seq.status = SequenceStatus.SWAPPED
            self.swapped.append(group)
            self.swapped.sort(key=lambda g: g.arrival_time)
            mode = "swap"
        else:
            # Also the fallback of "swap" when the CPU pool is full: the
            # output stays right, the work is done again.
            for seq in group.get_seqs(SequenceStatus.RUNNING):
                self.block_manager.free(seq)
                seq.reset_for_recompute()
            self.waiting.appendleft(group)
            mode = "recompute"
        self.num_preemptions[mode] += 1
        out.preempted.append((group, mode))

    def _ignore(self, group: SequenceGroup, out: SchedulerOutputs):
        # More blocks than the device pool holds (vLLM's FINISHED_IGNORED,
        # reported with finish_reason "length").
        for seq in group.unfinished_seqs():
            self.block_manager.free(seq)
            seq.status = SequenceStatus.FINISHED_LENGTH_CAPPED
        out.ignored.append(group)

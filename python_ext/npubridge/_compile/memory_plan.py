"""Memory planning for a lowered graph: intermediate buffers placed in one
arena by liveness.

Each buffer lives from the step that writes it to the last step that reads
it or one of its views (a view keeps its base alive), both inclusive: a
step's output never shares memory with the inputs it reads, which is what
lets Dispatcher::resolve take the outputs of a kernel step not to overlap
its inputs. Graph inputs and outputs are not planned (the caller owns them;
an output must outlive the call). Offsets are aligned to ``ALIGN`` bytes.

Placement is greedy first-fit: buffers taken in one order (largest first,
program order, largest size x lifetime), each at the lowest aligned offset
where no placed buffer with an overlapping lifetime is in the way; the
smallest arena of the orders wins. Not optimal (the problem is NP-hard):
the arena is at least the peak of the live set (``live_peak_bytes``), and
the difference is fragmentation.
"""
from __future__ import annotations

from dataclasses import dataclass

ALIGN = 64


def align(n: int, to: int = ALIGN) -> int:
    return (n + to - 1) // to * to


@dataclass
class Buffer:
    id: int
    size: int   # bytes
    start: int  # the step that writes it
    end: int    # the last step that reads it (>= start)
    offset: int = -1


@dataclass
class Plan:
    arena_bytes: int          # the arena: what the plan allocates per call
    live_peak_bytes: int     # peak of the live set (each freed after its last use): a LOWER BOUND of any plan
    intermediates_bytes: int  # all buffers summed (no reuse at all)
    buffers: list


def live_peak(buffers) -> int:
    """The largest sum of (aligned) sizes of buffers alive at one step."""
    events = {}
    for b in buffers:
        events.setdefault(b.start, 0)
        events[b.start] += align(b.size)
        events.setdefault(b.end + 1, 0)
        events[b.end + 1] -= align(b.size)
    peak = live = 0
    for step in sorted(events):
        live += events[step]
        peak = max(peak, live)
    return peak


# Orders in which the greedy placement takes the buffers; plan() keeps the
# smallest arena of them (each is a few milliseconds for graphs of
# thousands of nodes).
_ORDERS = (
    lambda b: (-align(b.size), b.start, b.id),              # largest first
    lambda b: (b.start, -align(b.size), b.id),              # in program order
    lambda b: (-(b.end - b.start) * align(b.size), b.id),   # largest size x lifetime first
)


def _place(buffers, key) -> int:
    placed = []
    for b in sorted(buffers, key=key):
        size = align(max(b.size, 1))
        conflicts = sorted((p.offset, p.offset + align(max(p.size, 1))) for p in placed
                           if p.start <= b.end and b.start <= p.end)
        offset = 0
        for lo, hi in conflicts:
            if offset + size <= lo:
                break
            offset = max(offset, hi)
        b.offset = offset
        placed.append(b)
    return max((b.offset + align(max(b.size, 1)) for b in buffers), default=0)


def plan(buffers) -> Plan:
    for b in buffers:
        if b.end < b.start:
            raise ValueError(f"buffer {b.id}: last use {b.end} before its definition {b.start}")
        if b.size < 0:
            raise ValueError(f"buffer {b.id}: negative size {b.size}")
    best = None
    for key in _ORDERS:
        arena = _place(buffers, key)
        if best is None or arena < best[0]:
            best = (arena, [b.offset for b in buffers])
    for b, off in zip(buffers, best[1]):
        b.offset = off
    return Plan(best[0], live_peak(buffers), sum(align(b.size) for b in buffers), list(buffers))


def check(p: Plan) -> None:
    """Raises AssertionError when two buffers alive at the same step overlap
    or an offset is unaligned (the planner's invariants, for the tests)."""
    bs = p.buffers
    for b in bs:
        assert b.offset % ALIGN == 0, f"buffer {b.id}: offset {b.offset} not aligned to {ALIGN}"
        assert b.offset + b.size <= p.arena_bytes, f"buffer {b.id} outside the arena"
    for i, a in enumerate(bs):
        for b in bs[i + 1:]:
            if a.start <= b.end and b.start <= a.end and a.size and b.size:
                assert a.offset + a.size <= b.offset or b.offset + b.size <= a.offset, (
                    f"buffers {a.id} and {b.id} are alive together and overlap")

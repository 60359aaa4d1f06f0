"""npubridge.vllm.block_manager: reference counts, copy-on-write, prefix
caching, swapping and exact accounting (pure bookkeeping; the cache contents
these moves produce are checked through the model runner in
test_vllm_engine.py)."""
import itertools
import random

import pytest

from npubridge.vllm.block_manager import AllocStatus, BlockSpaceManager, NoFreeBlocksError
from npubridge.vllm.sampling_params import SamplingParams
from npubridge.vllm.sequence import Sequence, SequenceGroup, SequenceStatus

_ids = itertools.count()


def group_of(tokens, n=1):
    seq = Sequence(next(_ids), tokens)
    return SequenceGroup(f"r{seq.seq_id}", [seq], SamplingParams(n=n))


def admit(bm, group):
    """Allocate, then compute the whole prompt (as one prefill step would)."""
    assert bm.can_allocate(group) == AllocStatus.OK
    bm.allocate(group)
    for seq in group.get_seqs(SequenceStatus.WAITING):
        seq.status = SequenceStatus.RUNNING
        assert bm.append_slots(seq, seq.get_num_uncomputed_tokens()) is None
        seq.num_computed_tokens = seq.get_len()
        bm.mark_computed(seq)
    bm.check_invariants()
    return group


def decode(bm, seq, token):
    """Append a sampled token, then make its slot writable (the next step computes it)."""
    seq.append_token(token)
    copy = bm.append_slots(seq, 1)
    seq.num_computed_tokens += 1
    bm.mark_computed(seq)
    return copy


def fork(bm, group):
    parent = group.seqs[0]
    child = parent.fork(next(_ids), len(group.seqs))
    bm.fork(parent, child)
    group.seqs.append(child)
    return child


def test_allocate_and_free_count_exactly():
    bm = BlockSpaceManager(4, 8)
    g = admit(bm, group_of(list(range(10))))  # 3 blocks
    seq = g.seqs[0]
    assert len(bm.get_block_table(seq)) == 3
    assert bm.get_num_free_device_blocks() == 5
    assert [bm.device.ref_counts[b] for b in bm.get_block_table(seq)] == [1, 1, 1]
    for t in range(2):  # positions 10, 11 fit the third block
        decode(bm, seq, t)
    assert len(bm.get_block_table(seq)) == 3
    decode(bm, seq, 7)  # position 12 opens a fourth block
    assert len(bm.get_block_table(seq)) == 4 and bm.get_num_free_device_blocks() == 4
    bm.free(seq)
    bm.check_invariants()
    assert bm.get_num_free_device_blocks() == 8


def test_allocation_status_and_exhaustion():
    bm = BlockSpaceManager(4, 4)
    assert bm.can_allocate(group_of(list(range(17)))) == AllocStatus.NEVER  # 5 blocks > 4
    admit(bm, group_of(list(range(12))))
    assert bm.can_allocate(group_of(list(range(8)))) == AllocStatus.LATER
    assert bm.can_allocate(group_of(list(range(4)))) == AllocStatus.OK
    admit(bm, group_of(list(range(4))))
    with pytest.raises(NoFreeBlocksError, match="device block pool: all 4 blocks are in use"):
        bm.device.allocate()


def test_watermark_keeps_blocks_for_running_sequences():
    bm = BlockSpaceManager(4, 100, watermark=0.05)  # 5 blocks held back from admissions
    admit(bm, group_of(list(range(4 * 90))))
    assert bm.can_allocate(group_of(list(range(4 * 6)))) == AllocStatus.LATER
    assert bm.can_allocate(group_of(list(range(4 * 5)))) == AllocStatus.OK


def test_fork_shares_blocks_and_copy_on_write_copies_the_partial_last_block():
    bm = BlockSpaceManager(4, 16)
    g = admit(bm, group_of(list(range(10))))  # blocks: full, full, 2/4 filled
    parent = g.seqs[0]
    children = [fork(bm, g) for _ in range(3)]
    table = list(bm.get_block_table(parent))
    assert all(bm.get_block_table(c) == table for c in children)
    assert [bm.device.ref_counts[b] for b in table] == [4, 4, 4]
    bm.check_invariants()
    copies = [decode(bm, s, 100 + i) for i, s in enumerate([parent] + children)]
    # Three writers get a private copy of the shared last block; the fourth
    # finds itself its only holder and writes in place.
    assert [c[0] for c in copies[:3]] == [table[2]] * 3
    assert copies[3] is None
    dsts = [c[1] for c in copies[:3]]
    assert len(set(dsts)) == 3 and table[2] not in dsts
    assert bm.get_block_table(children[-1])[2] == table[2]
    assert [bm.device.ref_counts[b] for b in table] == [4, 4, 1]
    for s in [parent] + children:
        assert bm.get_block_table(s)[:2] == table[:2]
    # No further copies: every last block is private now.
    assert all(decode(bm, s, 1) is None for s in [parent] + children)
    bm.check_invariants()
    for s in [parent] + children:
        bm.free(s)
    bm.check_invariants()
    assert bm.get_num_free_device_blocks() == 16


def test_fork_at_a_block_boundary_copies_nothing():
    bm = BlockSpaceManager(4, 16)
    g = admit(bm, group_of(list(range(8))))
    child = fork(bm, g)
    assert decode(bm, g.seqs[0], 1) is None and decode(bm, child, 2) is None
    assert bm.get_block_table(g.seqs[0])[2] != bm.get_block_table(child)[2]
    bm.check_invariants()


def test_prefix_cache_hits_full_blocks_only_and_keeps_the_last_token_computed():
    bm = BlockSpaceManager(4, 32, enable_prefix_caching=True)
    a = admit(bm, group_of(list(range(12))))  # 3 full blocks, all registered
    assert bm.device.num_cached_blocks() == 3
    ta = bm.get_block_table(a.seqs[0])
    # Same 12 tokens: the last token must be computed, so only 2 blocks hit.
    b = group_of(list(range(12)))
    bm.allocate(b)
    sb = b.seqs[0]
    assert sb.num_computed_tokens == 8
    assert bm.get_block_table(sb)[:2] == ta[:2] and bm.get_block_table(sb)[2] != ta[2]
    assert [bm.device.ref_counts[x] for x in ta] == [2, 2, 1]
    # A longer prompt with the same 12 first tokens hits all 3 blocks.
    c = group_of(list(range(12)) + [50, 51])
    bm.allocate(c)
    assert c.seqs[0].num_computed_tokens == 12 and bm.get_block_table(c.seqs[0])[:3] == ta
    # Same tokens in block 1 but a different block 0: the key chains the prefix, so a miss.
    d = group_of([99, 1, 2, 3] + list(range(4, 12)) + [7])
    bm.allocate(d)
    assert d.seqs[0].num_computed_tokens == 0
    bm.check_invariants()
    assert bm.prefix_hits == 8 + 12 and bm.prefix_queries == 12 + 12 + 14 + 13


def test_prefix_cache_registers_blocks_filled_by_decode():
    bm = BlockSpaceManager(4, 32, enable_prefix_caching=True)
    a = admit(bm, group_of([5, 6, 7]))
    seq = a.seqs[0]
    decode(bm, seq, 8)  # position 3 computed: block 0 full
    assert bm.device.num_cached_blocks() == 1
    b = group_of([5, 6, 7, 8, 9])
    bm.allocate(b)
    assert b.seqs[0].num_computed_tokens == 4
    assert bm.get_block_table(b.seqs[0])[0] == bm.get_block_table(seq)[0]
    bm.check_invariants()


def test_cached_free_blocks_count_as_free_and_are_evicted_lru_tail_first():
    bm = BlockSpaceManager(4, 6, enable_prefix_caching=True)
    a = admit(bm, group_of(list(range(13))))  # 4 blocks, 3 full ones cached
    ta = list(bm.get_block_table(a.seqs[0]))
    bm.free(a.seqs[0])
    bm.check_invariants()
    assert bm.get_num_free_device_blocks() == 6 and bm.device.num_cached_blocks() == 3
    # A hit takes an evictable block back out of the free count.
    h = group_of(list(range(5)))
    assert bm.can_allocate(h) == AllocStatus.OK
    bm.allocate(h)
    assert bm.get_block_table(h.seqs[0])[0] == ta[0] and bm.get_num_free_device_blocks() == 4
    bm.free(h.seqs[0])
    # 4 fresh blocks: the 3 uncached free ones first, then the LRU cached
    # one, which is the tail of a's cached prefix (freed first), block 2.
    x = admit(bm, group_of([200 + i for i in range(16)]))
    assert bm.device.num_evictions == 1
    assert bm.get_block_table(x.seqs[0])[3] == ta[2]
    assert bm.device.num_cached_blocks() == 2 + 4
    # a's first two blocks are still cached.
    again = group_of(list(range(13)))
    assert bm._cached_prefix(again.seqs[0]) == ta[:2]
    bm.check_invariants()


def test_identical_prompts_in_one_step_keep_one_cached_copy():
    bm = BlockSpaceManager(4, 16, enable_prefix_caching=True)
    a, b = group_of(list(range(9))), group_of(list(range(9)))
    for g in (a, b):
        bm.allocate(g)  # both before either computed: no hits
    for g in (a, b):
        seq = g.seqs[0]
        seq.num_computed_tokens = 9
        bm.mark_computed(seq)
    assert bm.device.num_cached_blocks() == 2
    bm.check_invariants()
    for g in (a, b):
        bm.free(g.seqs[0])
    bm.check_invariants()
    assert bm.get_num_free_device_blocks() == 16


def test_swap_out_and_in_keep_sharing_and_accounting():
    bm = BlockSpaceManager(4, 16, num_cpu_blocks=8)
    g = admit(bm, group_of(list(range(10))))
    for _ in range(2):
        fork(bm, g)
    for i, s in enumerate(g.seqs):
        decode(bm, s, i)  # 3 shared blocks + 2 copies
    distinct = {b for s in g.seqs for b in bm.get_block_table(s)}
    assert len(distinct) == 5
    assert bm.can_swap_out(g)
    pairs = bm.swap_out(g)
    for s in g.seqs:
        s.status = SequenceStatus.SWAPPED
    assert sorted(p[0] for p in pairs) == sorted(distinct) and len({p[1] for p in pairs}) == 5
    assert bm.get_num_free_device_blocks() == 16 and bm.get_num_free_cpu_blocks() == 3
    cpu_tables = [bm.cpu_block_tables[s.seq_id] for s in g.seqs]
    assert cpu_tables[0][:2] == cpu_tables[1][:2] == cpu_tables[2][:2]
    assert sorted(bm.cpu.ref_counts)[-2:] == [3, 3]
    bm.check_invariants()
    assert bm.can_swap_in(g) == AllocStatus.OK
    back = bm.swap_in(g)
    for s in g.seqs:
        s.status = SequenceStatus.RUNNING
    assert len(back) == 5 and bm.get_num_free_cpu_blocks() == 8
    back_map = dict(back)
    for s, cpu_table in zip(g.seqs, cpu_tables):
        assert bm.get_block_table(s) == [back_map[c] for c in cpu_table]
    assert bm.get_num_free_device_blocks() == 11
    bm.check_invariants()


def test_swap_out_refused_when_the_cpu_pool_is_short():
    bm = BlockSpaceManager(4, 16, num_cpu_blocks=2)
    g = admit(bm, group_of(list(range(12))))
    assert not bm.can_swap_out(g)
    bm2 = BlockSpaceManager(4, 16)
    g2 = admit(bm2, group_of([1, 2]))
    assert not bm2.can_swap_out(g2)


def test_swap_in_reuses_a_block_cached_meanwhile():
    bm = BlockSpaceManager(4, 16, num_cpu_blocks=8, enable_prefix_caching=True)
    g = admit(bm, group_of(list(range(10))))
    bm.swap_out(g)
    g.seqs[0].status = SequenceStatus.SWAPPED
    assert bm.device.num_cached_blocks() == 2  # evictable, still cached
    back = bm.swap_in(g)
    g.seqs[0].status = SequenceStatus.RUNNING
    # The two cached full blocks come back from the device cache; only the partial one is copied.
    assert len(back) == 1
    bm.check_invariants()


def test_invariants_hold_under_a_random_workload():
    rng = random.Random(0)
    for caching in (False, True):
        bm = BlockSpaceManager(4, 40, num_cpu_blocks=20, enable_prefix_caching=caching)
        running, swapped = [], []
        for _ in range(400):
            op = rng.random()
            if op < 0.25:
                g = group_of([rng.randrange(3) for _ in range(rng.randrange(1, 20))])
                if bm.can_allocate(g) == AllocStatus.OK:
                    admit(bm, g)
                    running.append(g)
            elif op < 0.55 and running:
                g = rng.choice(running)
                seqs = g.get_seqs(SequenceStatus.RUNNING)
                items = [(s, 1) for s in seqs]
                for s in seqs:
                    s.append_token(rng.randrange(3))
                if bm.can_append_slots(items):
                    for s in seqs:
                        bm.append_slots(s, 1)
                        s.num_computed_tokens += 1
                        bm.mark_computed(s)
                else:
                    for s in seqs:
                        s.output_token_ids.pop()
            elif op < 0.65 and running:
                g = rng.choice(running)
                if len(g.seqs) < 4:
                    fork(bm, g)
            elif op < 0.75 and running:
                g = running.pop(rng.randrange(len(running)))
                if bm.can_swap_out(g):
                    bm.swap_out(g)
                    for s in g.seqs:
                        s.status = SequenceStatus.SWAPPED
                    swapped.append(g)
                else:
                    running.append(g)
            elif op < 0.85 and swapped:
                g = swapped[0]
                if bm.can_swap_in(g) == AllocStatus.OK:
                    bm.swap_in(g)
                    for s in g.seqs:
                        s.status = SequenceStatus.RUNNING
                    running.append(swapped.pop(0))
            elif running:
                g = running.pop(rng.randrange(len(running)))
                for s in g.seqs:
                    bm.free(s)
            bm.check_invariants()
        for g in running + swapped:
            for s in g.seqs:
                bm.free(s)
        bm.check_invariants()
        assert bm.get_num_free_device_blocks() == 40 and bm.get_num_free_cpu_blocks() == 20


def test_invariant_check_catches_a_leak():
    bm = BlockSpaceManager(4, 8)
    g = admit(bm, group_of(list(range(5))))
    bm.block_tables[g.seqs[0].seq_id].pop()  # a block leaves the table without being freed
    with pytest.raises(AssertionError, match="reference counts"):
        bm.check_invariants()

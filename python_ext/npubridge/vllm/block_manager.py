"""The KV-cache block manager: which physical blocks hold which sequence's tokens.

Two pools of fixed-size blocks, the device's (where attention reads) and the
CPU's (swap space). Each sequence has a block table, its device block ids in
token order: token at position p lives in slot p % block_size of block
table[p // block_size].

- Reference counts: a block may be in several tables (a forked parallel
  sample shares its parent's prompt blocks; prefix caching shares a cached
  block across requests). A block returns to the free pool when its count
  drops to zero.
- Copy-on-write: before a sequence writes into a block whose count is above
  one (the partly filled last block a fork shares), it gets a fresh block
  and the pair (old, new) goes into the step's blocks_to_copy, which the
  model runner copies before the step's forward writes the new token.
- Prefix caching: a FULL block whose tokens are all computed is registered
  under its content key (parent block's hash, its token ids), so the key
  names the whole prefix up to the block's end. A new sequence takes the
  cached blocks of its longest cached prefix instead of computing them; at
  least the last prompt token is always computed (its logits are needed),
  so a prompt hits at most (len - 1) // block_size blocks. A cached block
  whose count drops to zero stays cached but evictable: it counts as free,
  and allocation takes plain free blocks first, then evicts cached ones in
  least-recently-freed order (a table is freed tail first, so the ends of
  prefixes go before their beginnings). Blocks are never written after they
  are full, so a cached block's contents stay valid while it is cached.
- Swapping: a preempted group's distinct device blocks are copied to CPU
  blocks (shared blocks once, with the same sharing on the CPU) and back;
  blocks_to_swap_out / blocks_to_swap_in are the (src, dst) pairs.

Accounting is exact: in each pool every block is in exactly one of free,
evictable-cached or used, and a used block's count equals the number of
tables holding it. check_invariants() verifies all of it.
"""
from collections import OrderedDict, deque
from typing import Dict, List, Optional, Tuple

from .sequence import Sequence, SequenceGroup, SequenceStatus

__all__ = ["BlockAllocator", "BlockSpaceManager", "NoFreeBlocksError", "AllocStatus"]


class NoFreeBlocksError(RuntimeError):
    pass


class AllocStatus:
    OK = "ok"
    LATER = "later"  # not now; after running sequences finish or are preempted
    NEVER = "never"  # more blocks than the pool has


def _blocks_for(num_tokens: int, block_size: int) -> int:
    return -(-num_tokens // block_size)


class BlockAllocator:
    """One pool's blocks: reference counts, the free list and, with caching,
    content keys and the LRU list of evictable cached blocks."""

    def __init__(self, name: str, num_blocks: int, enable_caching: bool = False):
        self.name = name
        self.num_blocks = num_blocks
        self.enable_caching = enable_caching
        self.ref_counts = [0] * num_blocks
        self._free = deque(range(num_blocks))  # free and holding no cached content
        self._evictable: "OrderedDict[int, None]" = OrderedDict()  # free but cached, oldest first
        self.block_key: List[Optional[tuple]] = [None] * num_blocks  # content key of a cached block
        self._cached: Dict[tuple, int] = {}  # content key -> block
        self.num_evictions = 0

    def get_num_free_blocks(self) -> int:
        return len(self._free) + len(self._evictable)

    def get_num_used_blocks(self) -> int:
        return self.num_blocks - self.get_num_free_blocks()

    def allocate(self) -> int:
        if self._free:
            block = self._free.popleft()
        elif self._evictable:
            block, _ = self._evictable.popitem(last=False)
            del self._cached[self.block_key[block]]
            self.block_key[block] = None
            self.num_evictions += 1
        else:
            raise NoFreeBlocksError(f"{self.name} block pool: all {self.num_blocks} blocks are in use")
        self.ref_counts[block] = 1
        return block

    def incref(self, block: int):
        if self.ref_counts[block] == 0:
            # Only a cached block is taken again from the free side (a prefix hit).
            assert block in self._evictable, f"{self.name} block {block} is free and not cached"
            del self._evictable[block]
        self.ref_counts[block] += 1

    def free(self, block: int):
        assert self.ref_counts[block] > 0, f"{self.name} block {block} freed with reference count 0"
        self.ref_counts[block] -= 1
        if self.ref_counts[block] == 0:
            if self.block_key[block] is not None:
                self._evictable[block] = None
            else:
                self._free.append(block)

    def lookup(self, key: tuple) -> Optional[int]:
        return self._cached.get(key)

    def is_evictable(self, block: int) -> bool:
        return block in self._evictable

    def register(self, block: int, key: tuple) -> bool:
        """Cache `block` (in use, full, computed) under `key`; False when the
        key is cached already (another block holds the same prefix)."""
        if not self.enable_caching or key in self._cached:
            return False
        assert self.ref_counts[block] > 0 and self.block_key[block] is None
        self._cached[key] = block
        self.block_key[block] = key
        return True

    def num_cached_blocks(self) -> int:
        return len(self._cached)

    def check_invariants(self, tables: List[List[int]]):
        where = f"{self.name} block pool"
        free, evictable = list(self._free), list(self._evictable)
        assert len(set(free)) == len(free), f"{where}: a block is twice on the free list"
        assert not set(free) & set(evictable), f"{where}: a block is both free and evictable"
        counts = [0] * self.num_blocks
        for table in tables:
            for b in table:
                assert 0 <= b < self.num_blocks, f"{where}: block id {b} out of range"
                counts[b] += 1
        assert counts == self.ref_counts, f"{where}: reference counts {self.ref_counts} != table counts {counts}"
        used = [b for b in range(self.num_blocks) if counts[b] > 0]
        assert not set(used) & (set(free) | set(evictable)), f"{where}: a used block is on a free list"
        assert len(free) + len(evictable) + len(used) == self.num_blocks, (
            f"{where}: free {len(free)} + evictable {len(evictable)} + used {len(used)} != {self.num_blocks}")
        for b in free:
            assert self.block_key[b] is None, f"{where}: free block {b} still has a cache key"
        for b in evictable:
            assert self.block_key[b] is not None, f"{where}: evictable block {b} has no cache key"
        keyed = {b for b in range(self.num_blocks) if self.block_key[b] is not None}
        assert keyed == set(self._cached.values()), f"{where}: cache map and block keys disagree"
        for key, b in self._cached.items():
            assert self.block_key[b] == key, f"{where}: block {b} is cached under another key"


class BlockSpaceManager:
    """Block tables of the sequences, over a device pool and a CPU pool."""

    def __init__(self, block_size: int, num_device_blocks: int, num_cpu_blocks: int = 0, watermark: float = 0.01,
                 enable_prefix_caching: bool = False):
        if block_size < 1 or num_device_blocks < 1 or num_cpu_blocks < 0:
            raise ValueError(f"BlockSpaceManager: block_size ({block_size}) and num_device_blocks "
                             f"({num_device_blocks}) must be >= 1 and num_cpu_blocks ({num_cpu_blocks}) >= 0")
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.device = BlockAllocator("device", num_device_blocks, enable_prefix_caching)
        # The CPU pool holds swapped blocks only; their content keys travel
        # with them (cpu_block_key) so a swap-in can re-register them.
        self.cpu = BlockAllocator("cpu", num_cpu_blocks)
        self.cpu_block_key: List[Optional[tuple]] = [None] * num_cpu_blocks
        self.watermark_blocks = int(watermark * num_device_blocks)
        self.block_tables: Dict[int, List[int]] = {}  # seq_id -> device blocks
        self.cpu_block_tables: Dict[int, List[int]] = {}  # seq_id -> cpu blocks (swapped)
        self._block_keys: Dict[int, List[tuple]] = {}  # seq_id -> content keys of its full computed blocks
        self._key_memo: Dict[int, List[tuple]] = {}  # seq_id -> content keys of its full blocks so far
        # Prefix-cache statistics, in prompt tokens looked up / found.
        self.prefix_queries = 0
        self.prefix_hits = 0

    # ---- content keys ------------------------------------------------
    def _key(self, parent_key: Optional[tuple], tokens) -> tuple:
        return (hash(parent_key) if parent_key is not None else None, tuple(tokens))

    def _prefix_keys(self, seq: Sequence, num_blocks: int) -> List[tuple]:
        """Content keys of seq's first num_blocks full blocks. Memoised per
        sequence (its tokens only grow, so a full block's key never changes):
        a waiting sequence is looked up in every step until admitted."""
        keys, bs = self._key_memo.setdefault(seq.seq_id, []), self.block_size
        for i in range(len(keys), num_blocks):
            keys.append(self._key(keys[-1] if keys else None, seq.token_slice(i * bs, (i + 1) * bs)))
        return keys[:num_blocks]

    def _cached_prefix(self, seq: Sequence) -> List[int]:
        """The cached blocks of seq's longest cached prefix (without its last token)."""
        if not self.enable_prefix_caching:
            return []
        blocks = []
        for key in self._prefix_keys(seq, (seq.get_len() - 1) // self.block_size):
            b = self.device.lookup(key)
            if b is None:
                break
            blocks.append(b)
        return blocks

    # ---- admission of waiting groups -----------------------------------
    def num_cached_prefix_tokens(self, seq: Sequence) -> int:
        """Tokens of seq the prefix cache would serve now."""
        return len(self._cached_prefix(seq)) * self.block_size

    def can_allocate(self, group: SequenceGroup) -> str:
        needed, hit_blocks, taken_from_free = 0, set(), set()
        for seq in group.get_seqs(SequenceStatus.WAITING):
            hits = self._cached_prefix(seq)
            needed += _blocks_for(seq.get_len(), self.block_size) - len(hits)
            hit_blocks.update(hits)
            # An evictable hit leaves the free count when it is taken.
            taken_from_free.update(b for b in hits if self.device.is_evictable(b))
        if needed + len(hit_blocks) > self.device.num_blocks - self.watermark_blocks:
            return AllocStatus.NEVER
        if self.device.get_num_free_blocks() - needed - len(taken_from_free) >= self.watermark_blocks:
            return AllocStatus.OK
        return AllocStatus.LATER

    def allocate(self, group: SequenceGroup):
        """Block tables for the group's waiting sequences, covering all their
        tokens; a prefix-cache hit sets num_computed_tokens past the hit. All
        hits are taken before any fresh block, so that no fresh allocation
        evicts a block another of the group's sequences was counted to hit."""
        seqs = group.get_seqs(SequenceStatus.WAITING)
        tables = []
        for seq in seqs:
            assert seq.seq_id not in self.block_tables, f"{seq} already has blocks"
            hits = self._cached_prefix(seq)
            for b in hits:
                self.device.incref(b)
            tables.append(hits)
        for seq, table in zip(seqs, tables):
            num_hits = len(table)
            table.extend(self.device.allocate()
                         for _ in range(_blocks_for(seq.get_len(), self.block_size) - num_hits))
            self.block_tables[seq.seq_id] = table
            self._block_keys[seq.seq_id] = self._prefix_keys(seq, num_hits)
            seq.num_computed_tokens = num_hits * self.block_size
            if self.enable_prefix_caching:
                self.prefix_queries += seq.get_len()
                self.prefix_hits += seq.num_computed_tokens

    # ---- growth of running sequences -----------------------------------
    def _slots_needed(self, seq: Sequence, num_new_tokens: int) -> Tuple[int, bool]:
        """(new blocks, whether the first written block must be copied)."""
        table = self.block_tables[seq.seq_id]
        first, end = seq.num_computed_tokens, seq.num_computed_tokens + num_new_tokens
        new = max(0, _blocks_for(end, self.block_size) - len(table))
        idx = first // self.block_size
        cow = idx < len(table) and self.device.ref_counts[table[idx]] > 1
        return new + int(cow), cow

    def num_blocks_to_append(self, seqs_and_tokens) -> int:
        return sum(self._slots_needed(s, k)[0] for s, k in seqs_and_tokens)

    def can_append_slots(self, seqs_and_tokens) -> bool:
        return self.num_blocks_to_append(seqs_and_tokens) <= self.device.get_num_free_blocks()

    def append_slots(self, seq: Sequence, num_new_tokens: int) -> Optional[Tuple[int, int]]:
        """Make positions [num_computed, num_computed + num_new_tokens) writable
        for seq; returns the (src, dst) copy when its block was shared."""
        table = self.block_tables[seq.seq_id]
        new, cow = self._slots_needed(seq, num_new_tokens)
        copy = None
        if cow:
            idx = seq.num_computed_tokens // self.block_size
            old = table[idx]
            # Only a partly filled block can be written, and only full blocks are cached.
            assert self.device.block_key[old] is None, f"copy-on-write of cached block {old}"
            table[idx] = self.device.allocate()
            self.device.free(old)
            copy = (old, table[idx])
            new -= 1
        table.extend(self.device.allocate() for _ in range(new))
        return copy

    def mark_computed(self, seq: Sequence):
        """Register seq's newly full and computed blocks in the prefix cache."""
        if not self.enable_prefix_caching or seq.seq_id not in self.block_tables:
            return
        keys, table = self._block_keys[seq.seq_id], self.block_tables[seq.seq_id]
        full = seq.num_computed_tokens // self.block_size
        for i, key in enumerate(self._prefix_keys(seq, full)[len(keys):], start=len(keys)):
            keys.append(key)
            if self.device.lookup(key) != table[i]:
                self.device.register(table[i], key)  # False when another block holds it: stays uncached

    # ---- fork and free -------------------------------------------------
    def fork(self, parent: Sequence, child: Sequence):
        table = list(self.block_tables[parent.seq_id])
        for b in table:
            self.device.incref(b)
        self.block_tables[child.seq_id] = table
        self._block_keys[child.seq_id] = list(self._block_keys.get(parent.seq_id, []))
        self._key_memo[child.seq_id] = list(self._key_memo.get(parent.seq_id, []))

    def free(self, seq: Sequence):
        """Drop seq's blocks (device or CPU), tail first so that cached prefix
        ends are evicted before their beginnings."""
        for table, pool in ((self.block_tables.pop(seq.seq_id, None), self.device),
                            (self.cpu_block_tables.pop(seq.seq_id, None), self.cpu)):
            for b in reversed(table or []):
                pool.free(b)
                if pool is self.cpu and pool.ref_counts[b] == 0:
                    self.cpu_block_key[b] = None
        self._block_keys.pop(seq.seq_id, None)
        self._key_memo.pop(seq.seq_id, None)

    def get_block_table(self, seq: Sequence) -> List[int]:
        return self.block_tables[seq.seq_id]

    # ---- swapping ------------------------------------------------------
    def _distinct(self, tables: Dict[int, List[int]], seqs) -> int:
        return len({b for s in seqs for b in tables[s.seq_id]})

    def can_swap_out(self, group: SequenceGroup) -> bool:
        seqs = group.get_seqs(SequenceStatus.RUNNING)
        return self._distinct(self.block_tables, seqs) <= self.cpu.get_num_free_blocks()

    def swap_out(self, group: SequenceGroup) -> List[Tuple[int, int]]:
        """Move the group's running sequences to CPU blocks; (device, cpu) pairs."""
        mapping: Dict[int, int] = {}
        for seq in group.get_seqs(SequenceStatus.RUNNING):
            cpu_table = []
            for b in self.block_tables.pop(seq.seq_id):
                if b in mapping:
                    self.cpu.incref(mapping[b])
                else:
                    mapping[b] = self.cpu.allocate()
                    self.cpu_block_key[mapping[b]] = self.device.block_key[b]
                cpu_table.append(mapping[b])
                self.device.free(b)
            self.cpu_block_tables[seq.seq_id] = cpu_table
        return list(mapping.items())

    def can_swap_in(self, group: SequenceGroup) -> str:
        seqs = group.get_seqs(SequenceStatus.SWAPPED)
        # Its blocks plus one per sequence for the token it computes next.
        needed = self._distinct(self.cpu_block_tables, seqs) + len(seqs)
        if needed > self.device.num_blocks - self.watermark_blocks:
            return AllocStatus.NEVER
        if self.device.get_num_free_blocks() - needed >= self.watermark_blocks:
            return AllocStatus.OK
        return AllocStatus.LATER

    def swap_in(self, group: SequenceGroup) -> List[Tuple[int, int]]:
        """Move the group's swapped sequences back; (cpu, device) pairs. A block
        whose prefix is cached on the device meanwhile is taken from the cache
        instead of copied."""
        mapping: Dict[int, int] = {}
        pairs = []
        for seq in group.get_seqs(SequenceStatus.SWAPPED):
            table = []
            for c in self.cpu_block_tables.pop(seq.seq_id):
                if c in mapping:
                    self.device.incref(mapping[c])
                else:
                    key = self.cpu_block_key[c]
                    cached = self.device.lookup(key) if key is not None else None
                    if cached is not None:
                        self.device.incref(cached)
                        mapping[c] = cached
                    else:
                        mapping[c] = self.device.allocate()
                        pairs.append((c, mapping[c]))
                        if key is not None:
                            self.device.register(mapping[c], key)
                table.append(mapping[c])
                self.cpu.free(c)
                if self.cpu.ref_counts[c] == 0:
                    self.cpu_block_key[c] = None
            self.block_tables[seq.seq_id] = table
        return pairs

    # ---- accounting ----------------------------------------------------
    def get_num_free_device_blocks(self) -> int:
        return self.device.get_num_free_blocks()

    def get_num_free_cpu_blocks(self) -> int:
        return self.cpu.get_num_free_blocks()

    def check_invariants(self):
        """Exact accounting in both pools (raises AssertionError naming the fault)."""
        self.device.check_invariants(list(self.block_tables.values()))
        self.cpu.check_invariants(list(self.cpu_block_tables.values()))
        assert not set(self.block_tables) & set(self.cpu_block_tables), "a sequence has device and CPU blocks"
        for b in range(self.cpu.num_blocks):
            assert self.cpu.ref_counts[b] > 0 or self.cpu_block_key[b] is None, f"free CPU block {b} keeps a key"
        for seq_id, keys in self._block_keys.items():
            table = self.block_tables.get(seq_id, self.cpu_block_tables.get(seq_id))
            assert table is not None and len(keys) <= len(table), f"seq {seq_id}: more content keys than blocks"

// The simulated NPU's device memory: a caching allocator with a capacity.
//
// Memory comes from the OS in segments (mmap) and is handed out in blocks,
// as PyTorch's CUDA caching allocator does: requests are rounded up, small
// ones (<= 1 MiB) share 2 MiB segments, blocks are split on allocation and
// merged with free neighbours on free, and freed blocks stay cached for
// reuse until empty_cache(). The sum of segment sizes (`reserved`) never
// exceeds the device's capacity; a request that cannot fit even after
// releasing the cache raises OutOfMemoryError stating request, capacity,
// allocated and reserved bytes.
//
// Note [Blocks are stream-ordered]: a block remembers the stream it was
// allocated for and is reused only by allocations on that stream, so work
// still queued on a stream can never see its memory handed to another
// stream. Use record_stream-like synchronisation (Stream::synchronize) before
// freeing memory another stream still reads.
//
// Note [The memory fraction limits reserved memory]: as CUDA's
// set_per_process_memory_fraction, a fraction f in [0, 1] caps what the
// allocator may reserve at f * capacity; a request that would take the
// reserved bytes beyond it (after the cache is released) is out of memory,
// and the message names the fraction. Lowering the fraction below what is
// already reserved frees nothing: later requests that need a new segment
// fail until memory is freed, as with CUDA.
//
// Note [Private pools]
// A graph capture (graph_capture.h) allocates from a private pool, as CUDA
// graphs do: while a thread routes its allocations to pool P
// (begin_pool_route), every allocation of that thread on this device is
// served from P's segments, whatever the stream. A pool is one more stream
// key (Note [Blocks are stream-ordered]): its blocks are reused only by
// allocations routed to it, so a block freed during a capture is reused later
// in the same capture (the replay runs the work in the same order, so the
// reuse is as safe as in eager mode), and never by eager work. While a graph
// holds the pool (retain_pool), its segments are kept even when fully free
// (empty_cache skips them): the recorded work reads and writes them at every
// replay. When the last holder lets go (release_pool), the free segments go
// back to the OS, and a block still live then (a static output the user still
// holds) takes its segment back when it is freed. Pools are per device; ids
// are unique in the process.
//
// Note [Guard zones]
// With guard bytes G > 0 (NPUB_VALIDATE=1, as DeviceOptions::from_env sets it), every block of the small pool
// (requests up to 1 MiB: those share 2 MiB segments, whose size and number the zones leave as they are) is G
// bytes longer on each side than what it hands out, and those zones are filled with a pattern, as debug
// allocators and ASan's redzones do. A kernel that writes before its buffer or past its end overwrites a
// zone: the dispatcher checks the zones of every tensor of a call after its kernel ran (check_guards), naming
// the op and the plugin; a zone found overwritten when its block is freed (by work no check saw) is reported
// by the device's next synchronize (take_guard_report). Addresses, sizes and the statistics are the caller's:
// the zones count as neither allocated nor free (snapshot() lists them as free blocks). Large blocks have no
// zones: theirs would change the segments they take, which the memory figures, the memory fraction and OOM
// messages depend on (a write past a large buffer is not caught). Blocks of a graph's private pool are not
// checked: a replay writes, through its records, memory the capture freed and reused for a smaller block.
//
// In a process forked after the allocator was made, allocate() throws and
// free() leaves the block alone (Note [A forked child cannot use the npu],
// fork_guard.cpp).
#pragma once

#include <npubridge/device_sim/fork_guard.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

namespace npub::sim {

// One block of a segment, as snapshot() lists it (torch.cuda.memory_snapshot's
// "blocks").
struct BlockSnapshot {
  uintptr_t address = 0;
  size_t size = 0;       // rounded
  size_t requested = 0;  // as requested; 0 for a free block
  bool allocated = false;
};

// One segment (an mmap'd range the allocator reserved) and its blocks in
// address order.
struct SegmentSnapshot {
  uintptr_t address = 0;
  size_t size = 0;
  size_t allocated = 0;  // sum of the allocated blocks' sizes
  size_t requested = 0;
  const void* stream = nullptr;  // the stream its blocks are reused on
  bool small = false;            // the small pool's (2 MiB segments for requests <= 1 MiB)
  std::vector<BlockSnapshot> blocks;
};

struct AllocatorStats {
  int64_t allocated_bytes = 0;  // live blocks, rounded sizes
  int64_t requested_bytes = 0;  // live blocks, as requested
  int64_t reserved_bytes = 0;   // segments held from the OS
  int64_t peak_allocated_bytes = 0;
  int64_t peak_reserved_bytes = 0;
  int64_t num_allocs = 0;
  int64_t num_frees = 0;
  int64_t num_cache_hits = 0;  // allocations served without a new segment
  int64_t num_segments = 0;
  int64_t num_ooms = 0;
  int64_t total_allocated_bytes = 0;  // cumulative, rounded sizes
  int64_t total_freed_bytes = 0;
  int64_t total_reserved_bytes = 0;  // cumulative segment sizes mapped
  int64_t total_released_bytes = 0;  // cumulative segment sizes unmapped
  int64_t active_blocks = 0;
};

class CachingAllocator {
 public:
  CachingAllocator(int device_index, uint64_t capacity_bytes, size_t guard_bytes = 0);
  ~CachingAllocator();
  CachingAllocator(const CachingAllocator&) = delete;
  CachingAllocator& operator=(const CachingAllocator&) = delete;

  // Returns nullptr for 0 bytes. Throws OutOfMemoryError.
  void* allocate(size_t bytes, const void* stream);
  // Frees a pointer returned by allocate(); nullptr is ignored. Throws
  // npub::Error for a pointer this allocator did not hand out. Does nothing
  // in a forked child.
  void free(void* ptr);
  // Returns every fully free segment to the OS.
  void empty_cache();
  AllocatorStats stats() const;
  void reset_peak_stats();
  // Zeroes the cumulative counters (allocs, frees, cache hits, OOMs, totals).
  void reset_accumulated_stats();
  uint64_t capacity() const { return capacity_; }
  // Note [The memory fraction limits reserved memory]. Throws npub::Error
  // (kInvalidArgument) for a fraction outside [0, 1] or NaN.
  void set_memory_fraction(double fraction);
  double memory_fraction() const;
  // What the allocator may reserve: floor(fraction * capacity).
  uint64_t limit() const;
  // Every segment with its blocks, in address order.
  std::vector<SegmentSnapshot> snapshot() const;
  // True when [ptr, ptr + bytes) lies inside one live block.
  bool contains(const void* ptr, size_t bytes) const;

  // Note [Guard zones]. kGuardBytes: what NPUB_VALIDATE=1 sets (a multiple
  // of kMinBlock).
  static constexpr size_t kGuardBytes = 512;
  size_t guard_bytes() const { return guard_; }
  // The zones of the live block holding `ptr`: "" when intact (or `ptr` is
  // in no live block), else what was overwritten ("256 bytes before the
  // start of a block of 48 bytes at 0x..."); the zones are filled again.
  std::string check_guards(const void* ptr);
  // What free() found overwritten since the last call ("" if nothing).
  std::string take_guard_report();

  // Note [Private pools]. A new pool id, unique in the process (no memory
  // until an allocation is routed to it; graph_pool_handle).
  static uint64_t new_pool_id();
  // A graph holds pool `id` (creating its state at the first holder).
  void retain_pool(uint64_t id);
  // Lets go of `id`; the last holder's release returns its free segments.
  // Throws npub::Error for a pool nobody holds.
  void release_pool(uint64_t id);
  // Routes the calling thread's allocations on this allocator to pool `id`
  // until end_pool_route (one route per thread and allocator).
  void begin_pool_route(uint64_t id);
  void end_pool_route();
  // Bytes of the segments pool `id` holds (0 for a pool nobody holds).
  size_t pool_reserved_bytes(uint64_t id) const;

  static constexpr size_t kMinBlock = 512;
  static constexpr size_t kSmallRequest = 1 << 20;  // <= goes to the small pool
  static constexpr size_t kSmallSegment = 2 << 20;
  static constexpr size_t kLargeSegment = 20 << 20;
  static constexpr size_t kLargeRequest = 10 << 20;  // < gets a 20 MiB segment

 private:
  struct Segment;
  struct Block {
    char* ptr;
    size_t size;
    size_t requested = 0;
    const void* stream;
    bool allocated = false;
    bool small;
    Block* prev = nullptr;  // neighbours inside the segment
    Block* next = nullptr;
    Segment* segment;
  };
  struct Segment {
    char* base;
    size_t size;
  };
  struct BlockOrder {
    bool operator()(const Block* a, const Block* b) const {
      if (a->stream != b->stream) return a->stream < b->stream;
      if (a->size != b->size) return a->size < b->size;
      return a->ptr < b->ptr;
    }
  };
  using Pool = std::set<Block*, BlockOrder>;
  using LiveMap = std::unordered_map<void*, Block*>;

  static size_t round_size(size_t bytes);
  static size_t segment_size_for(size_t rounded);
  Block* find_free_block(Pool& pool, size_t size, const void* stream);
  // Note [Private pools]: a pool's stream key has the top bit set (kernel
  // space on every 64-bit Linux), which no Stream's user-space address has.
  static constexpr uintptr_t kPoolKeyBit = uintptr_t{1} << 63;
  static const void* pool_key(uint64_t id) { return reinterpret_cast<const void*>(kPoolKeyBit | id); }
  static bool is_pool_key(const void* key) { return (reinterpret_cast<uintptr_t>(key) & kPoolKeyBit) != 0; }
  bool held_pool_key(const void* key) const;      // caller holds mu_
  static void* map_segment(size_t segment_size);  // null when the OS refuses
  Block* new_segment(size_t segment_size, bool small, const void* stream);
  void release_segment(Block* block);
  size_t release_cached_segments();  // caller holds mu_
  Block* split(Block* block, size_t size, Pool& pool);
  [[noreturn]] void throw_oom(size_t requested);
  // Note [A cache hit does not touch the heap]: a steady stream of
  // allocations and frees (a training step, a decode loop) reuses blocks;
  // the tree and hash nodes and Block objects that bookkeeping needs are
  // recycled too, so only new segments allocate host memory.
  void pool_insert(Pool& pool, Block* b);
  void pool_erase(Pool& pool, Pool::iterator it);
  void live_insert(Block* b);
  Block* live_take(void* ptr);  // null when ptr is not live
  Block* new_block(const Block& init);
  void drop_block(Block* b);

  // Note [Guard zones]: a block's zone size (small blocks only), and the
  // caller's view of the block.
  size_t zone(const Block* b) const { return b->small ? guard_ : 0; }
  char* user_ptr(const Block* b) const { return b->ptr + zone(b); }
  size_t user_size(const Block* b) const { return b->size - 2 * zone(b); }
  void fill_guards(Block* b);
  std::string check_block_guards(Block* b);  // caller holds mu_

  const ForkGuard fork_guard_;
  const int device_index_;
  const uint64_t capacity_;
  const size_t guard_;
  std::map<const char*, Block*> by_address_;  // live blocks by user address, with guards only
  std::string guard_report_;                  // under mu_
  mutable std::mutex mu_;
  double fraction_ = 1.0;  // under mu_
  uint64_t limit_;         // under mu_: capacity_ * fraction_
  Pool small_pool_;
  Pool large_pool_;
  LiveMap live_;
  std::unordered_map<uint64_t, int> pool_holders_;  // under mu_: pool id -> holders
  AllocatorStats stats_;
  static constexpr size_t kMaxSpares = 256;
  std::vector<Pool::node_type> spare_pool_nodes_;
  std::vector<LiveMap::node_type> spare_live_nodes_;
  std::vector<Block*> spare_blocks_;
};

std::string format_bytes(uint64_t bytes);

}  // namespace npub::sim

#include <npubridge/device_sim/caching_allocator.h>
#include <npubridge/support/error.h>

#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <iterator>
#include <string>
#include <utility>
#include <vector>

namespace npub::sim {

std::string format_bytes(uint64_t bytes) {
  char buf[64];
  const double b = static_cast<double>(bytes);
  if (bytes >= (1ull << 30))
    std::snprintf(buf, sizeof buf, "%.2f GiB", b / (1ull << 30));
  else if (bytes >= (1ull << 20))
    std::snprintf(buf, sizeof buf, "%.2f MiB", b / (1ull << 20));
  else if (bytes >= (1ull << 10))
    std::snprintf(buf, sizeof buf, "%.2f KiB", b / (1ull << 10));
  else
    std::snprintf(buf, sizeof buf, "%llu bytes", static_cast<unsigned long long>(bytes));
  return buf;
}

CachingAllocator::CachingAllocator(int device_index, uint64_t capacity_bytes, size_t guard_bytes)
    : device_index_(device_index),
      capacity_(capacity_bytes),
      guard_((guard_bytes + kMinBlock - 1) / kMinBlock * kMinBlock),
      limit_(capacity_bytes) {}

CachingAllocator::~CachingAllocator() {
  // Live blocks at destruction are the host's leak; their memory goes back to
  // the OS with the segments either way. Every segment's first block is in a
  // pool or live, so collecting first blocks finds every segment.
  std::vector<Block*> all(small_pool_.begin(), small_pool_.end());
  all.insert(all.end(), large_pool_.begin(), large_pool_.end());
  for (auto& entry : live_) all.push_back(entry.second);
  for (Block* b : all) {
    if (b->prev == nullptr) {
      ::munmap(b->segment->base, b->segment->size);
      delete b->segment;
    }
  }
  for (Block* b : all) delete b;
  for (Block* b : spare_blocks_) delete b;
}

// See Note [A cache hit does not touch the heap].
void CachingAllocator::pool_insert(Pool& pool, Block* b) {
  if (spare_pool_nodes_.empty()) {
    pool.insert(b);
    return;
  }
  Pool::node_type node = std::move(spare_pool_nodes_.back());
  spare_pool_nodes_.pop_back();
  node.value() = b;
  pool.insert(std::move(node));
}

void CachingAllocator::pool_erase(Pool& pool, Pool::iterator it) {
  Pool::node_type node = pool.extract(it);
  if (spare_pool_nodes_.size() < kMaxSpares) spare_pool_nodes_.push_back(std::move(node));
}

void CachingAllocator::live_insert(Block* b) {
  if (guard_ > 0) by_address_.emplace(user_ptr(b), b);
  if (spare_live_nodes_.empty()) {
    live_.emplace(user_ptr(b), b);
    return;
  }
  LiveMap::node_type node = std::move(spare_live_nodes_.back());
  spare_live_nodes_.pop_back();
  node.key() = user_ptr(b);
  node.mapped() = b;
  live_.insert(std::move(node));
}

CachingAllocator::Block* CachingAllocator::live_take(void* ptr) {
  auto it = live_.find(ptr);
  if (it == live_.end()) return nullptr;
  Block* b = it->second;
  if (guard_ > 0) by_address_.erase(user_ptr(b));
  LiveMap::node_type node = live_.extract(it);
  if (spare_live_nodes_.size() < kMaxSpares) spare_live_nodes_.push_back(std::move(node));
  return b;
}

CachingAllocator::Block* CachingAllocator::new_block(const Block& init) {
  if (spare_blocks_.empty()) return new Block(init);
  Block* b = spare_blocks_.back();
  spare_blocks_.pop_back();
  *b = init;
  return b;
}

void CachingAllocator::drop_block(Block* b) {
  if (spare_blocks_.size() < kMaxSpares)
    spare_blocks_.push_back(b);
  else
    delete b;
}

size_t CachingAllocator::round_size(size_t bytes) {
  if (bytes < kMinBlock) return kMinBlock;
  return (bytes + kMinBlock - 1) / kMinBlock * kMinBlock;
}

size_t CachingAllocator::segment_size_for(size_t rounded) {
  if (rounded <= kSmallRequest) return kSmallSegment;
  if (rounded < kLargeRequest) return kLargeSegment;
  constexpr size_t kRound = 2 << 20;
  return (rounded + kRound - 1) / kRound * kRound;
}

namespace {
// Note [Private pools]: the calling thread's routes, (allocator, pool id).
// Empty on every thread that is not capturing: one test on the hot path.
struct PoolRoute {
  const CachingAllocator* allocator;
  uint64_t pool;
};
thread_local std::vector<PoolRoute> tls_pool_routes;
}  // namespace

uint64_t CachingAllocator::new_pool_id() {
  static std::atomic<uint64_t> next{1};
  return next.fetch_add(1);
}

void CachingAllocator::retain_pool(uint64_t id) {
  std::lock_guard<std::mutex> lock(mu_);
  ++pool_holders_[id];
}

void CachingAllocator::release_pool(uint64_t id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = pool_holders_.find(id);
  if (it == pool_holders_.end())
    throw Error(ErrorCode::kInvalidArgument, "npu:" + std::to_string(device_index_) +
                                                 " caching allocator: release of private pool " +
                                                 std::to_string(id) + ", which no graph holds");
  if (--it->second > 0) return;
  pool_holders_.erase(it);
  const void* key = pool_key(id);
  for (Pool* pool : {&small_pool_, &large_pool_}) {
    for (auto b = pool->begin(); b != pool->end();) {
      if ((*b)->stream == key && (*b)->prev == nullptr && (*b)->next == nullptr) {
        Block* whole = *b;
        b = pool->erase(b);
        release_segment(whole);
      } else {
        ++b;
      }
    }
  }
}

bool CachingAllocator::held_pool_key(const void* key) const {
  if (!is_pool_key(key)) return false;
  return pool_holders_.count(reinterpret_cast<uintptr_t>(key) & ~kPoolKeyBit) != 0;
}

void CachingAllocator::begin_pool_route(uint64_t id) {
  for (const PoolRoute& r : tls_pool_routes)
    if (r.allocator == this)
      throw Error(ErrorCode::kInvalidArgument,
                  "npu:" + std::to_string(device_index_) +
                      " caching allocator: this thread already allocates into private pool " +
                      std::to_string(r.pool) + " (one capture per thread and device)");
  tls_pool_routes.push_back({this, id});
}

void CachingAllocator::end_pool_route() {
  for (auto it = tls_pool_routes.begin(); it != tls_pool_routes.end(); ++it)
    if (it->allocator == this) {
      tls_pool_routes.erase(it);
      return;
    }
}

size_t CachingAllocator::pool_reserved_bytes(uint64_t id) const {
  std::lock_guard<std::mutex> lock(mu_);
  const void* key = pool_key(id);
  size_t bytes = 0;
  auto count = [&](const Block* b) {
    if (b->stream == key && b->prev == nullptr) bytes += b->segment->size;
  };
  for (const Pool* pool : {&small_pool_, &large_pool_})
    for (const Block* b : *pool) count(b);
  for (const auto& entry : live_) count(entry.second);
  return bytes;
}

void* CachingAllocator::allocate(size_t bytes, const void* stream) {
  fork_guard_.check([&] { return "npu:" + std::to_string(device_index_) + "'s caching allocator"; });
  if (bytes == 0) return nullptr;
  if (!tls_pool_routes.empty())
    for (const PoolRoute& r : tls_pool_routes)
      if (r.allocator == this) stream = pool_key(r.pool);
  std::lock_guard<std::mutex> lock(mu_);
  if (bytes > limit_) throw_oom(bytes);
  const bool small = round_size(bytes) <= kSmallRequest;
  const size_t size = round_size(bytes) + (small ? 2 * guard_ : 0);  // Note [Guard zones]
  Pool& pool = small ? small_pool_ : large_pool_;
  Block* block = find_free_block(pool, size, stream);
  if (block != nullptr) {
    ++stats_.num_cache_hits;
  } else {
    size_t seg = segment_size_for(size);
    // Note [The memory fraction limits reserved memory].
    auto fits = [&](size_t s) { return static_cast<uint64_t>(stats_.reserved_bytes) + s <= limit_; };
    if (!fits(seg)) release_cached_segments();
    // Note [Segments shrink to the capacity]
    // Where the preferred segment (2 MiB for small requests, 20 MiB for
    // mid-size ones) no longer fits the device, a segment of just the
    // request's size does, so every request up to the free capacity is
    // served. (Rounded to 2 MiB where that fits, else to a page: segments
    // stay page-aligned so that map_segment trims and release unmap them
    // whole.)
    auto round_up = [](size_t v, size_t to) { return (v + to - 1) / to * to; };
    if (!fits(seg)) seg = round_up(size, size_t{2} << 20);
    if (!fits(seg)) seg = round_up(size, size_t{4096});
    if (!fits(seg)) throw_oom(bytes);
    block = new_segment(seg, small, stream);
    if (block == nullptr) {
      release_cached_segments();
      block = new_segment(seg, small, stream);
      if (block == nullptr) throw_oom(bytes);
    }
  }
  block = split(block, size, pool);
  block->allocated = true;
  block->requested = bytes;
  live_insert(block);
  if (zone(block) > 0) fill_guards(block);
  stats_.allocated_bytes += static_cast<int64_t>(user_size(block));
  stats_.total_allocated_bytes += static_cast<int64_t>(user_size(block));
  stats_.requested_bytes += static_cast<int64_t>(bytes);
  if (stats_.allocated_bytes > stats_.peak_allocated_bytes)
    stats_.peak_allocated_bytes = stats_.allocated_bytes;
  ++stats_.num_allocs;
  ++stats_.active_blocks;
  return user_ptr(block);
}

CachingAllocator::Block* CachingAllocator::find_free_block(Pool& pool, size_t size, const void* stream) {
  Block key{nullptr, size, 0, stream, false, false, nullptr, nullptr, nullptr};
  auto it = pool.lower_bound(&key);
  if (it == pool.end() || (*it)->stream != stream) return nullptr;
  Block* b = *it;
  // Do not carve a request below kLargeRequest out of an oversize segment
  // (one made for a single huge request): that would pin it. Blocks of the
  // shared 20 MiB segments are exactly what such requests are for.
  if (!b->small && size < kLargeRequest && b->segment->size > kLargeSegment) return nullptr;
  pool_erase(pool, it);
  return b;
}

// Segments are 2 MiB aligned and asked to be backed by huge pages (where the
// kernel's transparent huge pages allow it, as with madvise mode): a stream of
// large tensors then costs one TLB entry per 2 MiB instead of 512, as device
// memory uses large pages. Segment sizes are multiples of 2 MiB, or of a
// page where the capacity leaves less (Note [Segments shrink to the capacity]).
void* CachingAllocator::map_segment(size_t segment_size) {
  constexpr size_t kHuge = 2 << 20;
  const size_t span = segment_size + kHuge;
  void* raw =
      ::mmap(nullptr, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (raw == MAP_FAILED) return nullptr;
  const uintptr_t start = reinterpret_cast<uintptr_t>(raw);
  const uintptr_t base = (start + kHuge - 1) & ~(uintptr_t{kHuge} - 1);
  if (base > start) ::munmap(raw, base - start);
  const uintptr_t end = start + span;
  if (end > base + segment_size)
    ::munmap(reinterpret_cast<void*>(base + segment_size), end - (base + segment_size));
#ifdef MADV_HUGEPAGE
  ::madvise(reinterpret_cast<void*>(base), segment_size, MADV_HUGEPAGE);  // advice only: failure is harmless
#endif
  return reinterpret_cast<void*>(base);
}

CachingAllocator::Block* CachingAllocator::new_segment(size_t segment_size, bool small, const void* stream) {
  void* mem = map_segment(segment_size);
  if (mem == nullptr) return nullptr;
  auto* seg = new Segment{static_cast<char*>(mem), segment_size};
  Block* b = new_block(Block{seg->base, segment_size, 0, stream, false, small, nullptr, nullptr, seg});
  stats_.reserved_bytes += static_cast<int64_t>(segment_size);
  stats_.total_reserved_bytes += static_cast<int64_t>(segment_size);
  if (stats_.reserved_bytes > stats_.peak_reserved_bytes) stats_.peak_reserved_bytes = stats_.reserved_bytes;
  ++stats_.num_segments;
  return b;
}

CachingAllocator::Block* CachingAllocator::split(Block* block, size_t size, Pool& pool) {
  const size_t remaining = block->size - size;
  const bool worth_splitting = block->small ? remaining >= kMinBlock : remaining > kSmallRequest;
  if (!worth_splitting) return block;
  Block* rest = new_block(Block{block->ptr + size, remaining, 0, block->stream, false, block->small, block,
                                block->next, block->segment});
  if (block->next != nullptr) block->next->prev = rest;
  block->next = rest;
  block->size = size;
  pool_insert(pool, rest);
  return block;
}

void CachingAllocator::free(void* ptr) {
  // The block belongs to the process this one was forked from (Note [A
  // forked child cannot use the npu]); mu_ may be held for good.
  if (ptr == nullptr || fork_guard_.in_forked_child()) return;
  std::lock_guard<std::mutex> lock(mu_);
  Block* b = live_take(ptr);
  if (b == nullptr) {
    char buf[160];
    std::snprintf(buf, sizeof buf,
                  "npu:%d caching allocator: free of %p, which is not a live allocation of "
                  "this device (double free, or memory of another device)",
                  device_index_, ptr);
    throw Error(ErrorCode::kInvalidArgument, buf);
  }
  if (zone(b) > 0) {
    // Note [Guard zones]: reported by the next synchronize (free has no
    // caller to tell: it runs in a tensor's deleter).
    const std::string found = check_block_guards(b);
    if (!found.empty() && guard_report_.empty())
      guard_report_ = "npu:" + std::to_string(device_index_) +
                      " caching allocator: device memory was written outside its buffer: " + found +
                      " was found overwritten when the block was freed (NPUB_VALIDATE=1 guard zones; "
                      "no kernel check saw it: the write came from work the dispatcher did not run, or "
                      "into a buffer the kernel was not given)";
  }
  stats_.allocated_bytes -= static_cast<int64_t>(user_size(b));
  stats_.total_freed_bytes += static_cast<int64_t>(user_size(b));
  stats_.requested_bytes -= static_cast<int64_t>(b->requested);
  ++stats_.num_frees;
  --stats_.active_blocks;
  b->allocated = false;
  b->requested = 0;
  Pool& pool = b->small ? small_pool_ : large_pool_;
  // Merge with free neighbours of the same segment.
  for (Block* n : {b->prev, b->next}) {
    if (n == nullptr || n->allocated) continue;
    pool_erase(pool, pool.find(n));
    if (n == b->prev) {
      n->size += b->size;
      n->next = b->next;
      if (b->next != nullptr) b->next->prev = n;
      drop_block(b);
      b = n;
    } else {
      b->size += n->size;
      b->next = n->next;
      if (n->next != nullptr) n->next->prev = b;
      drop_block(n);
    }
  }
  // Note [Private pools]: a block of a pool nobody holds any longer gives
  // its segment back once the segment is free.
  if (is_pool_key(b->stream) && b->prev == nullptr && b->next == nullptr && !held_pool_key(b->stream)) {
    release_segment(b);
    return;
  }
  pool_insert(pool, b);
}

size_t CachingAllocator::release_cached_segments() {
  size_t released = 0;
  for (Pool* pool : {&small_pool_, &large_pool_}) {
    for (auto it = pool->begin(); it != pool->end();) {
      Block* b = *it;
      // The whole segment is free, and no graph's recorded work uses it
      // (Note [Private pools]).
      if (b->prev == nullptr && b->next == nullptr && !held_pool_key(b->stream)) {
        it = pool->erase(it);
        released += b->size;
        release_segment(b);
      } else {
        ++it;
      }
    }
  }
  return released;
}

void CachingAllocator::release_segment(Block* block) {
  Segment* seg = block->segment;
  ::munmap(seg->base, seg->size);
  stats_.reserved_bytes -= static_cast<int64_t>(seg->size);
  stats_.total_released_bytes += static_cast<int64_t>(seg->size);
  --stats_.num_segments;
  delete seg;
  drop_block(block);
}

void CachingAllocator::empty_cache() {
  std::lock_guard<std::mutex> lock(mu_);
  release_cached_segments();
}

AllocatorStats CachingAllocator::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

void CachingAllocator::reset_accumulated_stats() {
  std::lock_guard<std::mutex> lock(mu_);
  stats_.num_allocs = stats_.num_frees = stats_.num_cache_hits = stats_.num_ooms = 0;
  stats_.total_allocated_bytes = stats_.total_freed_bytes = 0;
  stats_.total_reserved_bytes = stats_.total_released_bytes = 0;
}

void CachingAllocator::reset_peak_stats() {
  std::lock_guard<std::mutex> lock(mu_);
  stats_.peak_allocated_bytes = stats_.allocated_bytes;
  stats_.peak_reserved_bytes = stats_.reserved_bytes;
}

void CachingAllocator::set_memory_fraction(double fraction) {
  if (!(fraction >= 0.0 && fraction <= 1.0)) {  // NaN fails both
    char buf[160];
    std::snprintf(buf, sizeof buf,
                  "npu:%d caching allocator: expected a memory fraction in [0, 1] but found %g",
                  device_index_, fraction);
    throw Error(ErrorCode::kInvalidArgument, buf);
  }
  std::lock_guard<std::mutex> lock(mu_);
  fraction_ = fraction;
  limit_ = fraction >= 1.0 ? capacity_ : static_cast<uint64_t>(fraction * static_cast<double>(capacity_));
}

double CachingAllocator::memory_fraction() const {
  std::lock_guard<std::mutex> lock(mu_);
  return fraction_;
}

uint64_t CachingAllocator::limit() const {
  std::lock_guard<std::mutex> lock(mu_);
  return limit_;
}

std::vector<SegmentSnapshot> CachingAllocator::snapshot() const {
  std::lock_guard<std::mutex> lock(mu_);
  // Every block is live or in a pool; a segment's first block has no prev.
  std::vector<const Block*> heads;
  for (const Pool* pool : {&small_pool_, &large_pool_})
    for (const Block* b : *pool)
      if (b->prev == nullptr) heads.push_back(b);
  for (const auto& entry : live_)
    if (entry.second->prev == nullptr) heads.push_back(entry.second);
  std::vector<SegmentSnapshot> out;
  out.reserve(heads.size());
  for (const Block* head : heads) {
    SegmentSnapshot seg;
    seg.address = reinterpret_cast<uintptr_t>(head->segment->base);
    seg.size = head->segment->size;
    seg.stream = head->stream;
    seg.small = head->small;
    for (const Block* b = head; b != nullptr; b = b->next) {
      // Note [Guard zones]: an allocated block as its owner sees it.
      if (b->allocated && zone(b) > 0) {  // its zones as free blocks around it
        seg.blocks.push_back({reinterpret_cast<uintptr_t>(b->ptr), zone(b), 0, false});
        seg.blocks.push_back({reinterpret_cast<uintptr_t>(user_ptr(b)), user_size(b), b->requested, true});
        seg.blocks.push_back({reinterpret_cast<uintptr_t>(user_ptr(b) + user_size(b)), zone(b), 0, false});
      } else if (b->allocated)
        seg.blocks.push_back({reinterpret_cast<uintptr_t>(b->ptr), b->size, b->requested, true});
      else
        seg.blocks.push_back({reinterpret_cast<uintptr_t>(b->ptr), b->size, 0, false});
      if (b->allocated) {
        seg.allocated += user_size(b);
        seg.requested += b->requested;
      }
    }
    out.push_back(std::move(seg));
  }
  std::sort(out.begin(), out.end(),
            [](const SegmentSnapshot& a, const SegmentSnapshot& b) { return a.address < b.address; });
  return out;
}

bool CachingAllocator::contains(const void* ptr, size_t bytes) const {
  std::lock_guard<std::mutex> lock(mu_);
  const char* p = static_cast<const char*>(ptr);
  for (const auto& [base, b] : live_) {
    if (p >= user_ptr(b) && p + bytes <= user_ptr(b) + user_size(b)) return true;
  }
  return false;
}

// Note [Guard zones]. The front zone is [ptr, user); the back zone runs from
// the end of the request to G bytes past its rounded size (the rest of a
// block too large to split is not filled: a request's cost stays bounded).
namespace {
constexpr unsigned char kGuardPattern = 0xfd;  // as MSVC's debug heap's no-man's land
}  // namespace

void CachingAllocator::fill_guards(Block* b) {
  const size_t back = round_size(b->requested) - b->requested + zone(b);
  std::memset(b->ptr, kGuardPattern, zone(b));
  std::memset(user_ptr(b) + b->requested, kGuardPattern, back);
}

std::string CachingAllocator::check_block_guards(Block* b) {
  // A graph's private pool is not checked: a capture may free a block and
  // hand its memory to a smaller one, and each replay writes the first
  // block's size there again through the records (in eager order, so the
  // data is right, but over the second block's zones).
  if (zone(b) == 0 || is_pool_key(b->stream)) return "";
  const unsigned char* front = reinterpret_cast<const unsigned char*>(b->ptr);
  const unsigned char* back = reinterpret_cast<const unsigned char*>(user_ptr(b) + b->requested);
  const size_t back_size = round_size(b->requested) - b->requested + zone(b);
  size_t before = 0, after = 0;
  for (size_t i = 0; i < zone(b); ++i)
    if (front[i] != kGuardPattern) {
      before = zone(b) - i;  // the farthest byte written before the start
      break;
    }
  for (size_t i = back_size; i-- > 0;)
    if (back[i] != kGuardPattern) {
      after = i + 1;  // the farthest byte written past the end
      break;
    }
  if (before == 0 && after == 0) return "";
  char where[64];
  std::snprintf(where, sizeof where, "%p", static_cast<const void*>(user_ptr(b)));
  std::string what;
  auto bytes = [](size_t n) { return std::to_string(n) + (n == 1 ? " byte" : " bytes"); };
  if (before > 0) what = bytes(before) + " before the start";
  if (after > 0) what += (what.empty() ? "" : " and ") + bytes(after) + " past the end";
  fill_guards(b);  // reported once
  return what + " of a buffer of " + std::to_string(b->requested) + " bytes at " + where;
}

std::string CachingAllocator::check_guards(const void* ptr) {
  if (guard_ == 0 || ptr == nullptr) return "";
  std::lock_guard<std::mutex> lock(mu_);
  const char* p = static_cast<const char*>(ptr);
  auto it = by_address_.upper_bound(p);
  if (it == by_address_.begin()) return "";
  Block* b = std::prev(it)->second;
  if (p >= user_ptr(b) + std::max<size_t>(b->requested, 1)) return "";
  return check_block_guards(b);
}

std::string CachingAllocator::take_guard_report() {
  if (guard_ == 0) return "";
  std::lock_guard<std::mutex> lock(mu_);
  return std::exchange(guard_report_, std::string());
}

void CachingAllocator::throw_oom(size_t requested) {
  ++stats_.num_ooms;
  const uint64_t cached = static_cast<uint64_t>(stats_.reserved_bytes - stats_.allocated_bytes);
  // Note [The memory fraction limits reserved memory].
  std::string limited;
  if (limit_ < capacity_) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%g", fraction_);
    limited = " (this process may use " + format_bytes(limit_) + " of it: set_per_process_memory_fraction(" +
              buf + "))";
  }
  throw OutOfMemoryError(
      "npu:" + std::to_string(device_index_) + " out of memory: tried to allocate " +
      format_bytes(requested) + "; the device has a capacity of " + format_bytes(capacity_) + limited +
      ", of which " + format_bytes(static_cast<uint64_t>(stats_.allocated_bytes)) + " is allocated and " +
      format_bytes(static_cast<uint64_t>(stats_.reserved_bytes)) + " is reserved by the caching allocator (" +
      format_bytes(cached) + " cached and free). Free tensors, call empty_cache(), or raise " +
      (limit_ < capacity_ ? "the memory fraction." : "NPUB_SIM_MEMORY."));
}

}  // namespace npub::sim

// What the oneDNN kernels of plugin_kernels share (gemm.cpp, conv.cpp): the
// engine and the one-OpenMP-thread guard. Private to the library; only
// compiled with oneDNN (NPUB_KERNELS_HAVE_ONEDNN).
#pragma once

#include <omp.h>

#include <oneapi/dnnl/dnnl.hpp>

#include <cstddef>
#include <memory>
#include <mutex>
#include <unordered_map>

namespace plugin_kernels {

// Note [oneDNN primitives are created once and run from any thread]
// A matmul primitive is created once per key (shape, strides, dtype,
// alpha, beta) for the whole plugin (SharedPrimitives, behind a mutex: JIT
// compilation is 0.1 to 4 ms) and then run by any thread, at once. That is
// safe because every primitive uses a user-managed scratchpad and each
// thread passes its own (oneDNN: execution is thread-safe when two
// executions share no scratchpad). Each thread keeps its own map from key to
// primitive and to the memory objects whose data handles it sets per call
// (ThreadState), so a call takes no lock. oneDNN's own global primitive
// cache is switched off (Debian's libdnnl only: PyTorch links its own
// copy): it would do the same job a second time, and ThreadSanitizer reports
// a race inside it in 2.6 (a cached key's attribute compared under its read
// lock against memory the creating thread allocated); libdnnl is not
// instrumented, so whether that one is real could not be told.
// oneDNN and libgomp are not made to be unloaded: libgomp registers
// thread-exit destructors on every thread that touched OpenMP (the compute
// threads, through OneOpenMPThread), and both keep small heap blocks that
// only their static data points to. They stay loaded when the plugin is
// unloaded (RTLD_NODELETE on the copies already mapped).
void keep_compute_libraries_loaded();

// The CPU engine every primitive is created on (oneDNN's own primitive cache
// switched off first).
const dnnl::engine& cpu_engine();

// Debian's oneDNN runs its parallel loops on OpenMP, and sizes them with
// omp_get_max_threads() of the calling thread, when the primitive is created
// and when it runs. With one thread it enters no parallel region at all (no
// second thread pool, nothing for ThreadSanitizer to see in libgomp). The
// setting is per thread (an OpenMP ICV) and is restored: a host thread that
// runs a kernel inline keeps its own OpenMP setting for everything else
// (PyTorch's CPU ops share that libgomp).
class OneOpenMPThread {
 public:
  OneOpenMPThread() : previous_(omp_get_max_threads()) {
    if (previous_ != 1) omp_set_num_threads(1);
  }
  ~OneOpenMPThread() {
    if (previous_ != 1) omp_set_num_threads(previous_);
  }
  OneOpenMPThread(const OneOpenMPThread&) = delete;
  OneOpenMPThread& operator=(const OneOpenMPThread&) = delete;

 private:
  int previous_;
};

// Values (a primitive and what goes with it) made once per key for the whole
// plugin (Note [oneDNN primitives are created once and run from any
// thread]). Creation happens under the lock: two threads that miss on one
// key at once create it once. Bounded: callers keep what they hold alive; a
// cleared key is created again when next needed.
template <typename Key, typename Value, typename Hash, size_t kMax>
class SharedByKey {
 public:
  // create(key) makes the value of a key not held yet.
  template <typename Create>
  std::shared_ptr<const Value> get(const Key& key, Create&& create) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = map_.find(key);
    if (it != map_.end()) return it->second;
    if (map_.size() >= kMax) map_.clear();
    std::shared_ptr<const Value> created = create(key);
    map_.emplace(key, created);
    return created;
  }

 private:
  std::mutex mutex_;
  std::unordered_map<Key, std::shared_ptr<const Value>, Hash> map_;
};

}  // namespace plugin_kernels

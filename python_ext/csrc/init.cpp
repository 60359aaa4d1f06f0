// The backend's start-up (see init.h).
//
// Note [The runtime starts at the first npu use]
// `import torch` imports npubridge (the torch.backends entry point), so
// whatever npubridge starts at import, every PyTorch program starts, CPU-only
// ones included. As torch.cuda does (torch.cuda._lazy_init), nothing starts
// then: the devices, their threads and the plugins start at the first npu
// use, from the NPUB_* settings as they are at that moment. So
// `os.environ["NPUB_SIM_DEVICES"] = "1"` after `import torch` works as
// CUDA_VISIBLE_DEVICES does, a bad setting fails the first npu use (naming
// the variable) rather than the import, and a plugin that crashes or hangs
// in its initialize cannot touch a program that never uses the npu.
// Every way into the runtime from npubridge._C goes through rt()
// (runtime/npu_runtime.h), which calls ensure_started(); so does the
// allocator, hence every npu tensor. Queries that must not start it
// (is_available, device_count, is_initialized, _is_in_bad_fork) read the
// settings or runtime_started() instead.
#include "init.h"

#include <ATen/core/CachingHostAllocator.h>
#include <c10/core/Allocator.h>
#include <c10/util/Exception.h>
#include <torch/csrc/utils/pybind.h>

#include <npubridge/dispatcher/plugin_loader.h>
#include <npubridge/dispatcher/runtime.h>
#include <npubridge/support/error.h>

#include "aten/fallback.h"
#include "aten/mapped_ops.h"
#include "aten/register_plugin_ops.h"
#include "runtime/allocator.h"
#include "runtime/hooks.h"
#include "runtime/host_allocator.h"

#include <Python.h>

#include <atomic>
#include <mutex>

namespace npub::torch_backend {

namespace {

std::once_flag g_register_once;
std::atomic<bool> g_started{false};
std::mutex g_start_mutex;
thread_local bool t_starting = false;
std::function<void()> g_python_hook;

constexpr const char* kNotStarted = "npubridge: the npu runtime did not start: ";

void start_locked() {
  // A start that failed after the C++ registrations (the Python side
  // raised) does not register twice when tried again.
  static bool registered = false;
  Runtime& runtime = []() -> Runtime& {
    try {
      return Runtime::global();  // the devices and the plugins, from the settings as they are now
    } catch (const Error& e) {
      TORCH_CHECK(false, kNotStarted, e.what());
    }
  }();
  // The fallback keeps the arguments' memory sharing (aliased_fallback.h),
  // so ATen's own overlap checks judge the overlaps no kernel serves.
  if (!registered) {
    runtime.dispatcher().set_fallback(&torch_fallback, /*keeps_aliasing=*/true);
    register_plugin_ops();
    route_mapped_ops();
    registered = true;
  }
  if (g_python_hook && Py_IsInitialized() && !_Py_IsFinalizing()) {
    pybind11::gil_scoped_acquire gil;
    g_python_hook();
  }
}

}  // namespace

void register_backend() {
  std::call_once(g_register_once, [] {
    static NpuHooks hooks;
    at::RegisterPrivateUse1HooksInterface(&hooks);
    c10::SetAllocator(c10::DeviceType::PrivateUse1, npu_allocator());
    at::setHostAllocator(c10::DeviceType::PrivateUse1, npu_host_allocator());
  });
}

int device_count_now() {
  if (runtime_started()) return Runtime::global().devices().count();
  try {
    const RuntimeOptions options = RuntimeOptions::from_env();
    Runtime::default_op_map_path();      // NPUB_OP_MAP
    PluginLoader::default_candidates();  // NPUB_PLUGIN_PATH
    return options.devices.num_devices;
  } catch (const Error& e) {
    TORCH_CHECK(false, kNotStarted, e.what());
  }
}

bool runtime_started() { return g_started.load(std::memory_order_acquire); }

void set_python_start_hook(std::function<void()> hook) { g_python_hook = std::move(hook); }

void ensure_started() {
  if (g_started.load(std::memory_order_acquire) || t_starting) return;
  // Another thread may be starting it and need the GIL for the Python
  // side: wait without holding it.
  std::unique_lock<std::mutex> lock(g_start_mutex, std::defer_lock);
  if (Py_IsInitialized() && PyGILState_Check()) {
    pybind11::gil_scoped_release nogil;
    lock.lock();
  } else {
    lock.lock();
  }
  if (g_started.load(std::memory_order_acquire)) return;
  t_starting = true;
  struct Reset {
    ~Reset() { t_starting = false; }
  } reset;
  start_locked();
  g_started.store(true, std::memory_order_release);
}

}  // namespace npub::torch_backend

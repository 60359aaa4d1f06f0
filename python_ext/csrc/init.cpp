// The backend's start-up (see init.h).
#include "init.h"

#include <ATen/core/CachingHostAllocator.h>
#include <c10/core/Allocator.h>

#include "aten/fallback.h"
#include "aten/mapped_ops.h"
#include "aten/register_plugin_ops.h"
#include "runtime/allocator.h"
#include "runtime/hooks.h"
#include "runtime/host_allocator.h"
#include "runtime/npu_runtime.h"

#include <mutex>

namespace npub::torch_backend {

namespace {

std::once_flag g_init_once;

}  // namespace

void init() {
  std::call_once(g_init_once, [] {
    static NpuHooks hooks;
    at::RegisterPrivateUse1HooksInterface(&hooks);
    c10::SetAllocator(c10::DeviceType::PrivateUse1, npu_allocator());
    at::setHostAllocator(c10::DeviceType::PrivateUse1, npu_host_allocator());
    // The fallback keeps the arguments' memory sharing (aliased_fallback.h),
    // so ATen's own overlap checks judge the overlaps no kernel serves.
    rt().dispatcher().set_fallback(&torch_fallback, /*keeps_aliasing=*/true);
    register_plugin_ops();
    route_mapped_ops();
  });
}

}  // namespace npub::torch_backend

// See onednn.h.
#if defined(NPUB_KERNELS_HAVE_ONEDNN)
#include "onednn.h"

#include <dlfcn.h>

namespace plugin_kernels {

void keep_compute_libraries_loaded() {
  for (const char* library : {"libdnnl.so.2", "libgomp.so.1"})
    if (void* handle = dlopen(library, RTLD_LAZY | RTLD_NOLOAD | RTLD_NODELETE)) dlclose(handle);
}

const dnnl::engine& cpu_engine() {
  static const dnnl::engine engine = [] {
    keep_compute_libraries_loaded();
    dnnl::set_primitive_cache_capacity(0);
    return dnnl::engine(dnnl::engine::kind::cpu, 0);
  }();
  return engine;
}

}  // namespace plugin_kernels

#endif

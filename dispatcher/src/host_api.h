// Internal: the host side of the C ABI (the objects behind the opaque
// handles, and the NpubHostApi table).
#pragma once

#include <npubridge/device_sim/device.h>
#include <npubridge/dispatcher/dispatcher.h>
#include <npubridge/plugin_api.h>
#include <npubridge/registry/op_registry.h>

#include <memory>
#include <string>
#include <vector>

struct NpubError {
  int32_t code;
  std::string message;
};

struct NpubRegistrar {
  npub::reg::Registry* registry = nullptr;
  std::shared_ptr<npub::reg::PluginRecord> plugin;
  // Staged until initialize succeeds (see plugin_loader.h).
  std::vector<npub::reg::Schema> schemas;
  std::vector<std::unique_ptr<npub::reg::Kernel>> kernels;
  std::vector<std::string> kernel_ops;                                     // op name of each staged kernel
  std::vector<std::pair<std::string, NpubMetaFn>> metas;                   // \since 1.2
  std::vector<std::pair<std::string, npub::reg::Derivative>> derivatives;  // \since 1.2
  std::string first_error;                                                 // sticky: the plugin is rejected
  bool open = true;                                                        // false once initialize returned
};

struct NpubCallContext {
  const npub::reg::Kernel* kernel = nullptr;
  npub::sim::Device* device = nullptr;
  npub::sim::Stream* stream = nullptr;
  npub::sim::Generator* generator = nullptr;  // the call's (ScopedCallGenerator); null: the device's
  DLDevice dl_device{};
  NpubValue* rets = nullptr;
  int32_t num_rets = 0;
  npub::OutputAllocator* outputs = nullptr;
  void* workspace = nullptr;
  uint64_t workspace_bytes = 0;
  std::vector<void*> scratch;  // freed when the call ends
};

// One meta-function call (Dispatcher::infer_meta).
struct NpubMetaContext {
  const npub::reg::OpEntry* op = nullptr;
  std::vector<npub::OutputMeta>* outputs = nullptr;  // one per return
};

namespace npub {

const NpubHostApi* host_api();

// Takes ownership of a plugin's error and returns its message (NULL-safe).
std::string consume_error(NpubError* e, int32_t* code = nullptr);

}  // namespace npub

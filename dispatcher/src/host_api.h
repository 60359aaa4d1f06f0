// Internal: the host side of the C ABI (the objects behind the opaque
// handles, and the NpubHostApi table).
#pragma once

#include <npubridge/device_sim/device.h>
#include <npubridge/dispatcher/dispatcher.h>
#include <npubridge/plugin_api.h>
#include <npubridge/registry/op_registry.h>

#include <cstddef>
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
  std::vector<std::pair<std::string, npub::reg::MetaFunction>> metas;      // \since 1.2 (plugin unset)
  std::vector<std::pair<std::string, npub::reg::Derivative>> derivatives;  // \since 1.2
  std::vector<npub::reg::FusionPattern> fusion_patterns;                   // \since 1.5
  std::string first_error;                                                 // sticky: the plugin is rejected
  bool open = true;                                                        // false once initialize returned
};

// Both contexts begin with the public NpubContextHead (ABI 1.4): a kernel
// casts its context pointer to read it (NPUB_CONTEXT_HEAD).
struct NpubCallContext {
  NpubContextHead head;  // set by invoke_kernel (not zeroed first: the call path is hot)
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

static_assert(offsetof(NpubCallContext, head) == 0, "NPUB_CONTEXT_HEAD reads the head at offset 0");

// One meta-function call (Dispatcher::infer_meta).
struct NpubMetaContext {
  NpubContextHead head{};
  const npub::reg::OpEntry* op = nullptr;
  std::vector<npub::OutputMeta>* outputs = nullptr;  // one per return
};

static_assert(offsetof(NpubMetaContext, head) == 0, "NPUB_CONTEXT_HEAD reads the head at offset 0");

namespace npub {

const NpubHostApi* host_api();

// Takes ownership of a plugin's error and returns its message (NULL-safe).
std::string consume_error(NpubError* e, int32_t* code = nullptr);

// The head a context starts with (NpubContextHead, ABI 1.4).
inline NpubContextHead context_head(const std::string& op, void* user_data) {
  return NpubContextHead{NPUB_CONTEXT_HEAD_STRUCT_SIZE, host_api(), user_data, op.c_str()};
}

}  // namespace npub

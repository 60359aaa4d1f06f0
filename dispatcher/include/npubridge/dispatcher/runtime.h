// npub::Runtime: one simulated NPU runtime with its devices, registry,
// op-mapping table, dispatcher and plugin loader. Hosts normally use
// Runtime::global(); tests make their own for isolation.
#pragma once

#include <npubridge/device_sim/device.h>
#include <npubridge/dispatcher/dispatcher.h>
#include <npubridge/dispatcher/plugin_loader.h>
#include <npubridge/registry/op_registry.h>

#include <memory>
#include <string>
#include <vector>

namespace npub {

struct RuntimeOptions {
  sim::DeviceOptions devices;
  DispatcherOptions dispatcher;
  bool load_default_plugins = true;
  bool load_default_op_map = true;
  static RuntimeOptions from_env();
};

class Runtime {
 public:
  explicit Runtime(const RuntimeOptions& options);
  ~Runtime();
  Runtime(const Runtime&) = delete;
  Runtime& operator=(const Runtime&) = delete;

  // The process-wide runtime, created at first use from the environment.
  // Never destroyed (plugins and device threads live until exit). Throws
  // npub::Error naming the variable for a bad NPUB_* setting, at every call.
  static Runtime& global();

  sim::DeviceSet& devices() { return *devices_; }
  reg::Registry& registry() { return *registry_; }
  reg::OpMappingTable& op_map() { return *op_map_; }
  Dispatcher& dispatcher() { return *dispatcher_; }
  PluginLoader& loader() { return *loader_; }
  const std::vector<LoadResult>& initial_load_results() const { return load_results_; }

  // The op-mapping table shipped with npubridge (<datadir>/op_map.txt).
  static std::string default_op_map_path();

 private:
  std::unique_ptr<sim::DeviceSet> devices_;
  std::unique_ptr<reg::Registry> registry_;
  std::unique_ptr<reg::OpMappingTable> op_map_;
  std::unique_ptr<Dispatcher> dispatcher_;
  std::unique_ptr<PluginLoader> loader_;
  std::vector<LoadResult> load_results_;
};

}  // namespace npub

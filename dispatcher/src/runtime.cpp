#include <npubridge/dispatcher/runtime.h>
#include <npubridge/support/env.h>
#include <npubridge/support/error.h>
#include "logging.h"

#include <filesystem>

namespace npub {

RuntimeOptions RuntimeOptions::from_env() {
  RuntimeOptions o;
  o.devices = sim::DeviceOptions::from_env();
  o.dispatcher = DispatcherOptions::from_env();
  log_level_from_env();  // Note [A setting is read strictly or refused]
  return o;
}

std::string Runtime::default_op_map_path() {
  if (auto v = env::get("NPUB_OP_MAP")) {
    // Named by the user: it must be there (a missing table would silently
    // leave the shipped mappings out).
    std::error_code ec;
    if (!std::filesystem::is_regular_file(*v, ec))
      throw Error(ErrorCode::kInvalidArgument,
                  "NPUB_OP_MAP: expected an op-mapping table file but found '" + *v + "' (" +
                      (std::filesystem::exists(*v, ec) ? "not a regular file" : "no such file") + ")");
    return *v;
  }
  const std::string plugins = PluginLoader::builtin_plugin_dir();  // <libdir>/npubridge/plugins
  if (plugins.empty()) return {};
  return (std::filesystem::path(plugins).parent_path() / "op_map.txt").string();
}

Runtime::Runtime(const RuntimeOptions& options)
    : devices_(std::make_unique<sim::DeviceSet>(options.devices)),
      registry_(std::make_unique<reg::Registry>()),
      op_map_(std::make_unique<reg::OpMappingTable>()),
      dispatcher_(std::make_unique<Dispatcher>(*registry_, *op_map_, *devices_, options.dispatcher)),
      loader_(std::make_unique<PluginLoader>(*registry_)) {
  if (options.load_default_op_map) {
    const std::string path = default_op_map_path();
    std::error_code ec;
    if (!path.empty() && std::filesystem::exists(path, ec)) op_map_->load_file(path);
  }
  if (options.load_default_plugins) load_results_ = loader_->load_default();
}

Runtime::~Runtime() {
  for (int i = 0; i < devices_->count(); ++i) {
    try {
      devices_->at(i).synchronize();
    } catch (const std::exception& e) {
      log().error("npu:{}: an asynchronous error was pending at shutdown: {}", i, e.what());
    }
  }
}

Runtime& Runtime::global() {
  // Intentionally leaked: plugins' kernels and device threads must outlive
  // every static destructor that might still dispatch.
  static Runtime* rt = new Runtime(RuntimeOptions::from_env());
  return *rt;
}

}  // namespace npub

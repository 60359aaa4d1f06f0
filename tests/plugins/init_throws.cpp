// A plugin whose initialize throws a C++ exception straight through the C
// boundary (no SDK barrier): the host must catch it and reject the plugin.
#include <npubridge/plugin_api.h>

#include <stdexcept>

static NpubError* initialize(const NpubHostApi*, NpubRegistrar*) {
  throw std::runtime_error("simulated exception from initialize");
}

extern "C" NPUB_PLUGIN_EXPORT const NpubPluginApi* npub_plugin_init_v1(void) {
  static const NpubPluginApi api = {
      sizeof(NpubPluginApi), NPUB_ABI_MAJOR, NPUB_ABI_MINOR, "init_throws", "0.0.1", &initialize, nullptr};
  return &api;
}

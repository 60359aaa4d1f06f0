// A plugin whose init function throws inside the SDK's exception barrier: the
// SDK turns it into an NpubError and the host rejects the plugin.
#include <npubridge/plugin_sdk.hpp>

#include <stdexcept>

static void init(npub::sdk::Registrar&) { throw std::logic_error("simulated SDK init failure"); }

NPUB_DEFINE_PLUGIN(sdk_throws, "0.0.1", init)

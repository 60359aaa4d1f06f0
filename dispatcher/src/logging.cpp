#include "logging.h"
#include <npubridge/support/env.h>

#include <spdlog/sinks/stdout_color_sinks.h>

namespace npub {

spdlog::logger& log() {
  static std::shared_ptr<spdlog::logger> logger = [] {
    auto l = std::make_shared<spdlog::logger>("npubridge",
                                              std::make_shared<spdlog::sinks::stderr_color_sink_mt>());
    l->set_pattern("[npubridge] [%l] %v");
    spdlog::level::level_enum level = spdlog::level::warn;
    if (auto v = env::get("NPUB_LOG_LEVEL")) {
      level = spdlog::level::from_str(*v);
      if (level == spdlog::level::off && *v != "off") {
        level = spdlog::level::warn;
        l->warn("NPUB_LOG_LEVEL: expected trace, debug, info, warn, error or off but found '{}'", *v);
      }
    }
    l->set_level(level);
    return l;
  }();
  return *logger;
}

}  // namespace npub

#include "logging.h"
#include <npubridge/support/env.h>
#include <npubridge/support/error.h>

#include <spdlog/sinks/stdout_color_sinks.h>

namespace npub {

spdlog::logger& log() {
  static std::shared_ptr<spdlog::logger> logger = [] {
    auto l = std::make_shared<spdlog::logger>("npubridge",
                                              std::make_shared<spdlog::sinks::stderr_color_sink_mt>());
    l->set_pattern("[npubridge] [%l] %v");
    spdlog::level::level_enum level = spdlog::level::warn;
    try {
      level = log_level_from_env();
    } catch (const Error&) {
      // Reported by the runtime's start (RuntimeOptions::from_env).
    }
    l->set_level(level);
    return l;
  }();
  return *logger;
}

spdlog::level::level_enum log_level_from_env() {
  const auto v = env::get_choice("NPUB_LOG_LEVEL", {"trace", "debug", "info", "warn", "error", "off"});
  return v ? spdlog::level::from_str(*v) : spdlog::level::warn;
}

}  // namespace npub

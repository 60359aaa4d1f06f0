// npubridge's logger (spdlog), level from NPUB_LOG_LEVEL:
// trace, debug, info, warn (default), error, off.
#pragma once

#include <spdlog/spdlog.h>

#include <memory>

namespace npub {

spdlog::logger& log();

}  // namespace npub

// npubridge's logger (spdlog), level from NPUB_LOG_LEVEL:
// trace, debug, info, warn (default), error, off.
#pragma once

#include <spdlog/spdlog.h>

#include <memory>

namespace npub {

spdlog::logger& log();

// NPUB_LOG_LEVEL's level; throws npub::Error naming the variable for any
// other text (Note [A setting is read strictly or refused]). The runtime
// reads it at start-up so a bad value stops the start; log() itself, which
// must never throw, logs at warn then.
spdlog::level::level_enum log_level_from_env();

}  // namespace npub

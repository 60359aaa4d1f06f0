// Reading npubridge's environment variables (NPUB_*) in one place.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace npub::env {

// The variable's value, or nullopt when unset or empty.
std::optional<std::string> get(const char* name);
// An integer variable; throws npub::Error naming the variable on bad text.
int64_t get_int(const char* name, int64_t fallback);
// A byte size: "17179869184", "16G", "512M", "64K" (binary units).
uint64_t get_bytes(const char* name, uint64_t fallback);
bool get_flag(const char* name, bool fallback);
// Parses a byte size as get_bytes does; throws on bad text.
uint64_t parse_bytes(const std::string& text, const char* what);

}  // namespace npub::env

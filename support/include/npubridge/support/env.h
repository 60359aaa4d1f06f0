// Reading npubridge's environment variables (NPUB_*) in one place.
//
// Note [A setting is read strictly or refused]
// Every NPUB_* value is parsed in full, surrounding white space aside: a
// value that does not parse, or parses out of range, throws npub::Error
// "NAME: expected <what> but found '<value>'" and is never ignored,
// clamped or narrowed. The runtime reads its settings when it starts
// (RuntimeOptions::from_env, Runtime::global), so a bad value stops the
// start with that message; under PyTorch the npu device is disabled with it
// and `import torch` still succeeds (python_ext/npubridge/__init__.py).
// A plugin that reads its own variable refuses a bad value the same way,
// and the loader rejects that plugin alone (Note [A plugin's bad setting
// rejects that plugin only], dispatcher/src/plugin_loader.cpp).
#pragma once

#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>

namespace npub::env {

// `value` in single quotes for a message, every byte outside printable
// ASCII escaped (\xff, \n; \\ and \' for the quote's own characters), so
// that a message holding a setting's value is always valid ASCII (Note
// [Messages quote values safely], env.cpp).
std::string quote(const std::string& value);

// The variable's value without surrounding white space; nullopt when unset
// or blank.
std::optional<std::string> get(const char* name);

// An integer from lo to hi, written in decimal ("-" allowed, nothing else):
// `what` names the quantity for the message ("a device count" gives
// "NAME: expected a device count from 1 to 64 but found '4294967297'").
int64_t parse_int_in(const std::string& text, const char* name, int64_t lo, int64_t hi, const char* what);
int64_t get_int_in(const char* name, int64_t fallback, int64_t lo, int64_t hi, const char* what);

// A byte size: "17179869184", "16G", "512M", "64K" (binary units).
uint64_t parse_bytes(const std::string& text, const char* what);
uint64_t get_bytes(const char* name, uint64_t fallback);
// A byte size from 1 to 2^63 - 1 (it fits an int64_t): 0 is refused
// ("NAME: expected a positive size but found '0'"), and so is 2^63 or more.
uint64_t get_positive_bytes(const char* name, uint64_t fallback);

// 1/true/on/yes or 0/false/off/no.
bool get_flag(const char* name, bool fallback);

// One of `choices`, spelled exactly; nullopt when unset.
std::optional<std::string> get_choice(const char* name, std::initializer_list<const char*> choices);

}  // namespace npub::env

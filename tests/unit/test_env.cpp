// The NPUB_* settings (Note [A setting is read strictly or refused],
// support/include/npubridge/support/env.h): each variable's parser takes its
// documented values, surrounding white space aside, and refuses anything
// else with "NAME: expected ... but found '...'", never reading it as
// something else.
#include "test_util.h"

#include <npubridge/support/env.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <utility>
#include <vector>

using namespace npub;
using test::ScopedEnv;

namespace {

// The message `f` throws with `name` set to `value` ("" when it does not).
std::string error_with(const char* name, const char* value, const std::function<void()>& f) {
  ScopedEnv set(name, value);
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

void device_options() { sim::DeviceOptions::from_env(); }
void dispatcher_options() { DispatcherOptions::from_env(); }
void runtime_options() { RuntimeOptions::from_env(); }

}  // namespace

TEST(Env, IntegersAreDecimalDigitsWithinTheirRange) {
  EXPECT_EQ(env::parse_int_in("64", "X", 1, 64, "a count"), 64);
  EXPECT_EQ(env::parse_int_in("-3", "X", -5, 5, "a count"), -3);
  for (const char* bad : {"0", "65", "-1", "4294967297", "99999999999999999999", "abc", "", "-", "+5", "0x10",
                          "5 6", "1.0", "3e1"})
    EXPECT_EQ(std::string([&] {
                try {
                  env::parse_int_in(bad, "X", 1, 64, "a count");
                } catch (const Error& e) {
                  return std::string(e.what());
                }
                return std::string();
              }()),
              std::string("X: expected a count from 1 to 64 but found '") + bad + "'")
        << bad;
}

TEST(Env, SizesTakeBinaryUnitsAndNothingElse) {
  EXPECT_EQ(env::parse_bytes("16G", "X"), 16ull << 30);
  EXPECT_EQ(env::parse_bytes("512MiB", "X"), 512ull << 20);
  EXPECT_EQ(env::parse_bytes("1024", "X"), 1024u);
  for (const char* bad : {"lots", "-5M", "+5M", "", "M"})
    EXPECT_THROW(env::parse_bytes(bad, "X"), Error) << bad;
  EXPECT_STREQ(error_with("NPUB_SIM_MEMORY", "64Q", device_options).c_str(),
               "NPUB_SIM_MEMORY: unknown unit in '64Q' (expected K, M, G or T)");
  EXPECT_EQ(error_with("NPUB_SIM_MEMORY", "-5M", device_options),
            "NPUB_SIM_MEMORY: expected a size such as 16G, 512M or 1048576 but found '-5M'");
  EXPECT_EQ(error_with("NPUB_SIM_MEMORY", "0", device_options),
            "NPUB_SIM_MEMORY: expected a positive size but found '0'");
  EXPECT_EQ(error_with("NPUB_SIM_MEMORY", "99999999999T", device_options),
            "NPUB_SIM_MEMORY: expected a size below 2^64 bytes but found '99999999999T'");
}

TEST(Env, APositiveSizeFitsAnInt64) {
  // NPUB_SIM_MEMORY's reader, and NPUB_DIST_CHUNK_BYTES's in the PyTorch
  // extension's collective backend (its refusals: tests/python/test_settings.py).
  auto chunk = [] { env::get_positive_bytes("NPUB_DIST_CHUNK_BYTES", 4 << 20); };
  for (const char* good : {"4M", " 65536 ", "8388607T"})
    EXPECT_EQ(error_with("NPUB_DIST_CHUNK_BYTES", good, chunk), "") << good;
  {
    ScopedEnv set("NPUB_DIST_CHUNK_BYTES", "64K");
    EXPECT_EQ(env::get_positive_bytes("NPUB_DIST_CHUNK_BYTES", 1), 64u << 10);
  }
  {
    ScopedEnv unset("NPUB_DIST_CHUNK_BYTES", nullptr);
    EXPECT_EQ(env::get_positive_bytes("NPUB_DIST_CHUNK_BYTES", 1), 1u);
  }
  EXPECT_EQ(error_with("NPUB_DIST_CHUNK_BYTES", "0", chunk),
            "NPUB_DIST_CHUNK_BYTES: expected a positive size but found '0'");
  EXPECT_EQ(error_with("NPUB_DIST_CHUNK_BYTES", "8388608T", chunk),
            "NPUB_DIST_CHUNK_BYTES: expected a size below 2^63 bytes but found '8388608T'");
  EXPECT_EQ(error_with("NPUB_DIST_CHUNK_BYTES", "-4096", chunk),
            "NPUB_DIST_CHUNK_BYTES: expected a size such as 16G, 512M or 1048576 but found '-4096'");
  EXPECT_EQ(error_with("NPUB_SIM_MEMORY", "8388608T", device_options),
            "NPUB_SIM_MEMORY: expected a size below 2^63 bytes but found '8388608T'");
}

TEST(Env, AFractionOfAUnitAsksForAWholeNumber) {
  // "unknown unit" blamed the unit for what is the fraction's fault.
  EXPECT_EQ(error_with("NPUB_SIM_MEMORY", "1.5G", device_options),
            "NPUB_SIM_MEMORY: '1.5G': expected a whole number of bytes, K, M, G or T such as 1536M");
  EXPECT_EQ(error_with("NPUB_SIM_MEMORY", "0.5GiB", device_options),
            "NPUB_SIM_MEMORY: '0.5GiB': expected a whole number of bytes, K, M, G or T such as 512M");
  EXPECT_EQ(error_with("NPUB_SIM_MEMORY", "2.25k", device_options),
            "NPUB_SIM_MEMORY: '2.25k': expected a whole number of bytes, K, M, G or T such as 2304");
  // No whole number of a smaller unit: an example all the same.
  EXPECT_EQ(error_with("NPUB_SIM_MEMORY", "0.1G", device_options),
            "NPUB_SIM_MEMORY: '0.1G': expected a whole number of bytes, K, M, G or T such as 1536M");
  EXPECT_EQ(error_with("NPUB_SIM_MEMORY", "1.5", device_options),
            "NPUB_SIM_MEMORY: '1.5': expected a whole number of bytes, K, M, G or T such as 1536M");
}

// Note [Messages quote values safely]: a value's bytes outside printable
// ASCII are escaped, so the message is ASCII (Python decodes it; raw 0xff
// made `import torch` end in UnicodeDecodeError without naming the variable).
TEST(Env, ValuesInMessagesAreEscapedToAscii) {
  EXPECT_EQ(env::quote("abc"), "'abc'");
  EXPECT_EQ(env::quote("\xff\xfe"), "'\\xff\\xfe'");
  EXPECT_EQ(env::quote("a'b\\c\n\t\x01\x7f\xc3\xa9"), "'a\\'b\\\\c\\n\\t\\x01\\x7f\\xc3\\xa9'");
  auto ascii = [](const std::string& m) {
    for (const char c : m)
      if (static_cast<unsigned char>(c) < 0x20 || static_cast<unsigned char>(c) >= 0x7f) return false;
    return !m.empty();
  };
  const std::string devices = error_with("NPUB_SIM_DEVICES", "\xff\xfe", device_options);
  EXPECT_EQ(devices, "NPUB_SIM_DEVICES: expected a device count from 1 to 64 but found '\\xff\\xfe'");
  const std::string level = error_with("NPUB_LOG_LEVEL", "\xff\xfe", runtime_options);
  EXPECT_EQ(level,
            "NPUB_LOG_LEVEL: expected one of trace, debug, info, warn, error, off but found '\\xff\\xfe'");
  EXPECT_TRUE(ascii(devices) && ascii(level));
  for (const auto& [name, f] : std::vector<std::pair<const char*, std::function<void()>>>{
           {"NPUB_SIM_MEMORY", device_options},
           {"NPUB_SIM_THREADS", device_options},
           {"NPUB_SIM_SPIN_US", device_options},
           {"NPUB_LAUNCH_BLOCKING", device_options},
           {"NPUB_DTYPE_CONVERSION", dispatcher_options},
           {"NPUB_OPT_LEVEL", dispatcher_options},
           {"NPUB_FALLBACK", dispatcher_options},
           {"NPUB_PLUGIN_PATH", [] { PluginLoader::default_candidates(); }}}) {
    const std::string m = error_with(name, "caf\xc3 \xff\x1b[31m", f);
    EXPECT_TRUE(ascii(m)) << name << ": " << m;
    EXPECT_NE(m.find("caf\\xc3 \\xff\\x1b[31m"), std::string::npos) << name << ": " << m;
  }
}

TEST(Env, SimDevices) {
  EXPECT_EQ(error_with("NPUB_SIM_DEVICES", " 3 ", device_options), "");
  for (const char* bad : {"0", "-1", "65", "4294967297", "abc", "2x"})
    EXPECT_EQ(error_with("NPUB_SIM_DEVICES", bad, device_options),
              std::string("NPUB_SIM_DEVICES: expected a device count from 1 to 64 but found '") + bad + "'");
}

TEST(Env, SimThreads) {
  EXPECT_EQ(error_with("NPUB_SIM_THREADS", "8", device_options), "");
  for (const char* bad : {"0", "-2", "1025", "4294967297", "many"})
    EXPECT_EQ(error_with("NPUB_SIM_THREADS", bad, device_options),
              std::string("NPUB_SIM_THREADS: expected a compute thread count from 1 to 1024 but found '") +
                  bad + "'");
}

TEST(Env, SimSpin) {
  for (const char* good : {"0", "50", "1000000"})
    EXPECT_EQ(error_with("NPUB_SIM_SPIN_US", good, device_options), "");
  for (const char* bad : {"-1", "1000001", "2ms", "fast"})
    EXPECT_EQ(
        error_with("NPUB_SIM_SPIN_US", bad, device_options),
        std::string("NPUB_SIM_SPIN_US: expected a spin time in microseconds from 0 to 1000000 but found '") +
            bad + "'");
}

TEST(Env, LaunchBlockingAndDtypeConversionAreFlags) {
  EXPECT_EQ(error_with("NPUB_LAUNCH_BLOCKING", " on", device_options), "");
  EXPECT_EQ(error_with("NPUB_LAUNCH_BLOCKING", "2", device_options),
            "NPUB_LAUNCH_BLOCKING: expected 0 or 1 (or false/true, off/on, no/yes) but found '2'");
  EXPECT_EQ(error_with("NPUB_DTYPE_CONVERSION", "0", dispatcher_options), "");
  EXPECT_EQ(error_with("NPUB_DTYPE_CONVERSION", "maybe", dispatcher_options),
            "NPUB_DTYPE_CONVERSION: expected 0 or 1 (or false/true, off/on, no/yes) but found 'maybe'");
}

TEST(Env, OptLevel) {
  EXPECT_EQ(error_with("NPUB_OPT_LEVEL", "0", dispatcher_options), "");
  for (const char* bad : {"9", "-1", "4294967298", "high"})
    EXPECT_EQ(
        error_with("NPUB_OPT_LEVEL", bad, dispatcher_options),
        std::string("NPUB_OPT_LEVEL: expected an optimisation level from 0 to 3 but found '") + bad + "'");
}

TEST(Env, Fallback) {
  EXPECT_EQ(error_with("NPUB_FALLBACK", "error ", dispatcher_options), "");
  EXPECT_EQ(error_with("NPUB_FALLBACK", "maybe", dispatcher_options),
            "NPUB_FALLBACK: expected 'allow' or 'error' but found 'maybe'");
}

TEST(Env, ValidateIsAFlag) {
  EXPECT_EQ(error_with("NPUB_VALIDATE", "1", dispatcher_options), "");
  EXPECT_EQ(error_with("NPUB_VALIDATE", "yes please", dispatcher_options),
            "NPUB_VALIDATE: expected 0 or 1 (or false/true, off/on, no/yes) but found 'yes please'");
  EXPECT_EQ(error_with("NPUB_VALIDATE", "yes please", runtime_options),
            "NPUB_VALIDATE: expected 0 or 1 (or false/true, off/on, no/yes) but found 'yes please'");
}

TEST(Env, LogLevel) {
  EXPECT_EQ(error_with("NPUB_LOG_LEVEL", " debug ", runtime_options), "");
  EXPECT_EQ(error_with("NPUB_LOG_LEVEL", "loud", runtime_options),
            "NPUB_LOG_LEVEL: expected one of trace, debug, info, warn, error, off but found 'loud'");
}

TEST(Env, OpMapMustNameAFile) {
  EXPECT_EQ(error_with("NPUB_OP_MAP", "/nonexistent", [] { Runtime::default_op_map_path(); }),
            "NPUB_OP_MAP: expected an op-mapping table file but found '/nonexistent' (no such file)");
  EXPECT_EQ(error_with("NPUB_OP_MAP", "/tmp", [] { Runtime::default_op_map_path(); }),
            "NPUB_OP_MAP: expected an op-mapping table file but found '/tmp' (not a regular file)");
  // The runtime refuses to start with it.
  RuntimeOptions o;
  o.devices.num_devices = 1;
  o.load_default_plugins = false;
  EXPECT_EQ(error_with("NPUB_OP_MAP", "/nonexistent", [&] { Runtime rt(o); }),
            "NPUB_OP_MAP: expected an op-mapping table file but found '/nonexistent' (no such file)");
}

TEST(Env, PluginPathEntriesMustHoldPlugins) {
  auto candidates = [] { PluginLoader::default_candidates(); };
  EXPECT_EQ(error_with("NPUB_PLUGIN_PATH", NPUB_TEST_PLUGIN_DIR, candidates), "");
  EXPECT_EQ(
      error_with("NPUB_PLUGIN_PATH", (std::string(NPUB_TEST_PLUGIN_DIR) + ":/nonexistent").c_str(),
                 candidates),
      "NPUB_PLUGIN_PATH: expected ':'-separated directories or plugin files (.so) but found '/nonexistent' "
      "(no such file)");
  EXPECT_EQ(error_with("NPUB_PLUGIN_PATH", "/dev/null", candidates),
            "NPUB_PLUGIN_PATH: expected ':'-separated directories or plugin files (.so) but found "
            "'/dev/null' (not a "
            "directory or a .so file)");
}

TEST(Env, APluginsBadSettingRejectsThatPluginOnly) {
  // The in-tree plugins refuse NPUB_PLUGINS_MAX_ISA in their initialize:
  // they are rejected with the setting's message; the runtime and the other
  // plugins (here a test plugin) start.
  ScopedEnv cap("NPUB_PLUGINS_MAX_ISA", "sse9");
  const std::string other = test::test_plugin("npub_test_good_c");
  ScopedEnv plugin_path("NPUB_PLUGIN_PATH", other.c_str());
  RuntimeOptions o;
  o.devices.num_devices = 1;
  o.load_default_op_map = false;
  Runtime rt(o);
  int rejected = 0;
  for (const LoadResult& r : rt.initial_load_results())
    for (const char* name : {"npub_cann_like", "npub_mindspeed_like", "npub_vllm_like"})
      if (r.path == test::builtin_plugin(name))
        rejected += !r.ok && r.error.find(
                                 "NPUB_PLUGINS_MAX_ISA: expected one of baseline, avx2, avx512 (or unset) "
                                 "but found 'sse9'") != std::string::npos;
  EXPECT_EQ(rejected, 3);
  EXPECT_EQ(rt.loader().plugin("cann_like"), nullptr);
  EXPECT_EQ(rt.loader().plugin("vllm_like"), nullptr);
  EXPECT_NE(rt.loader().plugin("good_c"), nullptr);
  // White space around a good value is no error.
  ScopedEnv good("NPUB_PLUGINS_MAX_ISA", " avx2 ");
  Runtime rt2(o);
  EXPECT_NE(rt2.loader().plugin("cann_like"), nullptr);
  EXPECT_NE(rt2.loader().plugin("vllm_like"), nullptr);
}

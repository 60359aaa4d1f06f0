// Loading plugins at run time (Boost.DLL, RTLD_NOW | RTLD_LOCAL).
//
// Search order, deterministic: the built-in plugin directory
// (<libdir>/npubridge/plugins next to libnpubridge.so), then each entry of
// NPUB_PLUGIN_PATH (colon-separated files or directories) in order; inside a
// directory, files named lib*.so in name order.
//
// Every failure is reported as a LoadResult naming the file and the reason;
// the host and every other plugin keep working.
//
// Note [A directory may hold libraries that are not plugins]
// A plugin often ships helper libraries beside it (its kernels, a vendor
// runtime), so a lib*.so found by scanning a directory that does not export
// any npub_plugin_init_v<N> is skipped, not rejected: it is logged at info
// level as "skipped: not an npubridge plugin (no npub_plugin_init_v1)" and
// listed by skipped(), not by failures(). A file named explicitly (load(), or
// a .so entry of NPUB_PLUGIN_PATH) is meant to be a plugin, so there the same
// file is rejected. A file with the entry symbol that fails any later check,
// or one the dynamic loader refuses (whose symbols cannot be read), is
// rejected wherever it was found. A plugin's registrations are
// staged and committed only when its initialize succeeded and no
// registration failed, so a rejected plugin leaves nothing behind.
//
// How the loader can be misused, and what happens:
//  - Loading the same file twice: the second load is rejected (same plugin
//    name), the first stays.
//  - Unloading: there is no unload. A library stays mapped while anything it
//    registered is alive (its kernels hold it), i.e. until the runtime goes.
//  - Calling host registration functions after initialize returned: rejected
//    with an error (the registrar is closed).
//  - A plugin that links npubridge symbols instead of using the host table:
//    works by accident at best; its load fails with "undefined symbol" when
//    the host is not libnpubridge.
#pragma once

#include <npubridge/registry/op_registry.h>

#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace npub {

struct LoadResult {
  std::string path;
  bool ok = false;
  std::string plugin_name;  // when ok
  std::string error;        // when not ok: "plugin '<path>' rejected: <reason>" (or "... skipped: ...")
  bool skipped = false;     // not ok, but not a plugin either (Note [A directory may hold ...])
};

// A file load_default() tries, and whether a directory scan found it.
struct PluginCandidate {
  std::string path;
  bool from_directory = false;
};

class PluginLoader {
 public:
  explicit PluginLoader(reg::Registry& registry) : registry_(registry) {}

  // Loads one file. Never throws for a bad plugin: the result says why.
  // `from_directory`: found by a directory scan, so a library without the
  // entry symbol is skipped rather than rejected.
  LoadResult load(const std::string& path, bool from_directory = false);
  // Loads every plugin of the built-in directory and NPUB_PLUGIN_PATH.
  std::vector<LoadResult> load_default();
  // Files that load_default() would try, in order. Throws npub::Error for an
  // NPUB_PLUGIN_PATH entry that is neither a directory nor a .so file.
  static std::vector<std::string> default_candidates();
  static std::vector<PluginCandidate> default_plugin_candidates();
  // <libdir>/npubridge/plugins of the libnpubridge.so in use.
  static std::string builtin_plugin_dir();

  std::vector<std::shared_ptr<reg::PluginRecord>> plugins() const;
  std::shared_ptr<reg::PluginRecord> plugin(const std::string& name) const;
  std::vector<LoadResult> failures() const;
  // Libraries of a scanned directory that are not plugins (no entry symbol).
  std::vector<LoadResult> skipped() const;

 private:
  reg::Registry& registry_;
  std::mutex load_mu_;     // held through a whole load(): loads run one at a time
  mutable std::mutex mu_;  // plugins_, failures_ and skipped_
  std::vector<std::shared_ptr<reg::PluginRecord>> plugins_;
  std::vector<LoadResult> failures_;
  std::vector<LoadResult> skipped_;
};

}  // namespace npub

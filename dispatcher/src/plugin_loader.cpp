#include "host_api.h"

#include <npubridge/dispatcher/plugin_loader.h>
#include <npubridge/support/env.h>
#include <npubridge/support/error.h>
#include "logging.h"

#define BOOST_DLL_USE_STD_FS 1
#include <boost/dll/shared_library.hpp>

#include <elf.h>

#include <dlfcn.h>

#include <algorithm>
#include <cctype>
#include <cstddef>
#include <cstring>
#include <filesystem>
#include <fstream>

namespace npub {

namespace fs = std::filesystem;

namespace {

// Boost.DLL resets dlerror() and reports "Bad file descriptor" for most
// failures; say what is wrong with the file ourselves.
std::string explain_open_failure(const std::string& path) {
  std::error_code ec;
  if (!fs::exists(path, ec)) return "no such file";
  if (fs::is_directory(path, ec)) return "is a directory, not a shared library";
  std::ifstream f(path, std::ios::binary);
  if (!f) return "cannot be read (permission denied?)";
  char magic[4] = {0, 0, 0, 0};
  f.read(magic, 4);
  if (f.gcount() < 4 || magic[0] != 0x7f || magic[1] != 'E' || magic[2] != 'L' || magic[3] != 'F')
    return "not a shared library (no ELF header)";
  // An ELF file that still failed: ask the dynamic loader for its reason.
  void* h = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (h != nullptr) {
    ::dlclose(h);
    return "the dynamic loader refused it";
  }
  const char* why = ::dlerror();
  return std::string("the dynamic loader refused it: ") + (why != nullptr ? why : "unknown reason");
}

// Note [A truncated plugin is rejected before dlopen]
// The dynamic loader maps a shared library's loadable segments as they are
// described in its program headers; when the file is shorter than they say
// (an interrupted copy or download), touching the missing pages raises
// SIGBUS inside dlopen and kills the host. So the loader first checks that
// the file holds its ELF header, its program headers and every PT_LOAD
// segment's file bytes. "" when it does (or when the file is not a 64-bit
// ELF file, which dlopen rejects by itself), else the reason.
std::string check_elf_complete(const std::string& path) {
  std::ifstream f(path, std::ios::binary | std::ios::ate);
  if (!f) return "";
  const auto size = static_cast<uint64_t>(f.tellg());
  f.seekg(0);
  Elf64_Ehdr eh{};
  f.read(reinterpret_cast<char*>(&eh), sizeof eh);
  if (static_cast<size_t>(f.gcount()) < EI_NIDENT || std::memcmp(eh.e_ident, ELFMAG, SELFMAG) != 0) return "";
  if (eh.e_ident[EI_CLASS] != ELFCLASS64) return "";
  auto truncated = [&](uint64_t needed, const char* what) {
    return "truncated: the file has " + std::to_string(size) + " bytes but its " + what + " need " +
           std::to_string(needed) + " (an interrupted copy or download?)";
  };
  if (size < sizeof eh) return truncated(sizeof eh, "ELF header");
  const uint64_t ph_end = eh.e_phoff + static_cast<uint64_t>(eh.e_phnum) * eh.e_phentsize;
  if (eh.e_phentsize < sizeof(Elf64_Phdr) && eh.e_phnum > 0)
    return "malformed ELF file: program header entries too small";
  if (ph_end > size) return truncated(ph_end, "program headers");
  for (uint16_t i = 0; i < eh.e_phnum; ++i) {
    Elf64_Phdr ph{};
    f.seekg(static_cast<std::streamoff>(eh.e_phoff + static_cast<uint64_t>(i) * eh.e_phentsize));
    f.read(reinterpret_cast<char*>(&ph), sizeof ph);
    if (!f) return truncated(ph_end, "program headers");
    if (ph.p_type == PT_LOAD && ph.p_offset + ph.p_filesz > size)
      return truncated(ph.p_offset + ph.p_filesz, "loadable segments");
  }
  return "";
}

bool valid_plugin_name(const char* name) {
  if (name == nullptr || *name == '\0') return false;
  for (const char* p = name; *p; ++p)
    if (!std::isalnum(static_cast<unsigned char>(*p)) && *p != '_') return false;
  return std::strlen(name) <= 64;
}

std::vector<std::string> plugin_files_in(const std::string& dir) {
  std::vector<std::string> out;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("lib", 0) == 0 && name.size() > 3 && name.substr(name.size() - 3) == ".so")
      out.push_back(entry.path().string());
  }
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace

std::string PluginLoader::builtin_plugin_dir() {
  Dl_info info{};
  if (::dladdr(reinterpret_cast<void*>(&PluginLoader::builtin_plugin_dir), &info) == 0 ||
      info.dli_fname == nullptr)
    return {};
  // lexically_normal: a host found through an $ORIGIN/../lib run path names
  // its plugins /prefix/lib/..., not /prefix/bin/../lib/...
  return (fs::path(info.dli_fname).parent_path() / "npubridge" / "plugins").lexically_normal().string();
}

std::vector<std::string> PluginLoader::default_candidates() {
  std::vector<std::string> paths;
  for (auto& c : default_plugin_candidates()) paths.push_back(std::move(c.path));
  return paths;
}

std::vector<PluginCandidate> PluginLoader::default_plugin_candidates() {
  std::vector<PluginCandidate> files;
  const std::string builtin = builtin_plugin_dir();
  if (!builtin.empty())
    for (auto& f : plugin_files_in(builtin)) files.push_back({f, true});
  if (auto path = env::get("NPUB_PLUGIN_PATH")) {
    size_t start = 0;
    while (start <= path->size()) {
      size_t colon = path->find(':', start);
      std::string entry = path->substr(start, colon == std::string::npos ? std::string::npos : colon - start);
      if (!entry.empty()) {
        // Note [A setting is read strictly or refused]: an entry that cannot
        // hold a plugin is a mistake in the setting, not a plugin to reject.
        std::error_code ec;
        const bool so_file = fs::is_regular_file(entry, ec) && entry.size() > 3 &&
                             entry.compare(entry.size() - 3, 3, ".so") == 0;
        if (fs::is_directory(entry, ec)) {
          for (auto& f : plugin_files_in(entry)) files.push_back({f, true});
        } else if (so_file) {
          files.push_back({entry, false});
        } else {
          throw Error(
              ErrorCode::kInvalidArgument,
              "NPUB_PLUGIN_PATH: expected ':'-separated directories or plugin files (.so) but found " +
                  env::quote(entry) + " (" +
                  (fs::exists(entry, ec) ? "not a directory or a .so file" : "no such file") + ")");
        }
      }
      if (colon == std::string::npos) break;
      start = colon + 1;
    }
  }
  return files;
}

std::vector<LoadResult> PluginLoader::load_default() {
  std::vector<LoadResult> results;
  for (const auto& c : default_plugin_candidates()) results.push_back(load(c.path, c.from_directory));
  return results;
}

LoadResult PluginLoader::load(const std::string& path, bool from_directory) {
  // One load at a time: two initialize calls never overlap (the ABI
  // promises plugins a single-threaded initialize), and the name check
  // below holds until the commit.
  std::lock_guard<std::mutex> serial(load_mu_);
  LoadResult result;
  result.path = path;
  auto reject = [&](const std::string& reason) {
    result.ok = false;
    result.error = "plugin '" + path + "' rejected: " + reason;
    log().error("{}", result.error);
    std::lock_guard<std::mutex> lock(mu_);
    failures_.push_back(result);
    return result;
  };

  // 1. Open (Note [A truncated plugin is rejected before dlopen]).
  if (const std::string incomplete = check_elf_complete(path); !incomplete.empty()) return reject(incomplete);
  auto lib = std::make_shared<boost::dll::shared_library>();
  {
    boost::dll::fs::error_code ec;
    lib->load(boost::dll::fs::path(path), boost::dll::load_mode::rtld_now | boost::dll::load_mode::rtld_local,
              ec);
    if (ec || !lib->is_loaded()) return reject(explain_open_failure(path));
  }

  // 2. Find the entry point; recognise other ABI majors by their symbol.
  if (!lib->has(NPUB_PLUGIN_ENTRY_SYMBOL)) {
    for (int major = 0; major <= 99; ++major) {
      if (major == NPUB_ABI_MAJOR) continue;
      const std::string other = "npub_plugin_init_v" + std::to_string(major);
      if (lib->has(other))
        return reject("built for plugin ABI major " + std::to_string(major) + " (exports '" + other +
                      "'), but this host supports ABI major " + std::to_string(NPUB_ABI_MAJOR) +
                      " ('" NPUB_PLUGIN_ENTRY_SYMBOL "')");
    }
    if (from_directory) {  // Note [A directory may hold libraries that are not plugins]
      result.skipped = true;
      result.error = "'" + path + "' skipped: not an npubridge plugin (no " NPUB_PLUGIN_ENTRY_SYMBOL ")";
      log().info("{}", result.error);
      std::lock_guard<std::mutex> lock(mu_);
      skipped_.push_back(result);
      return result;
    }
    return reject("entry symbol '" NPUB_PLUGIN_ENTRY_SYMBOL
                  "' not found; a plugin must export it "
                  "(see plugin_api.h)");
  }
  auto entry = lib->get<const NpubPluginApi*()>(NPUB_PLUGIN_ENTRY_SYMBOL);

  // 3. Check what the entry point returns.
  const NpubPluginApi* api = nullptr;
  try {
    api = entry();
  } catch (const std::exception& e) {
    return reject(std::string(NPUB_PLUGIN_ENTRY_SYMBOL "() threw an exception: ") + e.what());
  } catch (...) {
    return reject(NPUB_PLUGIN_ENTRY_SYMBOL "() threw an exception");
  }
  if (api == nullptr) return reject(NPUB_PLUGIN_ENTRY_SYMBOL "() returned NULL");
  constexpr size_t kV1Size = NPUB_PLUGIN_API_STRUCT_SIZE_1_0;  // frozen: see NPUB_STRUCT_SIZE
  if (api->struct_size < kV1Size)
    return reject("NpubPluginApi.struct_size is " + std::to_string(api->struct_size) +
                  " but ABI 1.0 requires at least " + std::to_string(kV1Size) + " (struct too small)");
  if (api->abi_major != NPUB_ABI_MAJOR)
    return reject("NpubPluginApi.abi_major is " + std::to_string(api->abi_major) +
                  " but this host supports ABI major " + std::to_string(NPUB_ABI_MAJOR));
  if (api->initialize == nullptr) return reject("required function NpubPluginApi.initialize is NULL");
  if (!valid_plugin_name(api->name))
    return reject("NpubPluginApi.name must be 1 to 64 characters of [A-Za-z0-9_] but is " +
                  (api->name ? "'" + std::string(api->name) + "'" : std::string("NULL")));
  const std::string name = api->name;
  if (auto existing = plugin(name))
    return reject("a plugin named '" + name + "' is already loaded from '" + existing->path + "'");

  // 4. Initialise, staging every registration.
  auto record = std::make_shared<reg::PluginRecord>();
  record->name = name;
  record->version = api->version != nullptr ? api->version : "";
  record->path = path;
  record->abi_minor = api->abi_minor;
  record->library = lib;
  NpubRegistrar registrar;
  registrar.registry = &registry_;
  registrar.plugin = record;
  NpubError* err = nullptr;
  try {
    err = api->initialize(host_api(), &registrar);
  } catch (const std::exception& e) {
    registrar.open = false;
    return reject("initialize threw an exception: " + std::string(e.what()));
  } catch (...) {
    registrar.open = false;
    return reject("initialize threw an exception of unknown type");
  }
  registrar.open = false;
  // Note [A plugin's bad setting rejects that plugin only]
  // A plugin reads its own settings in its initialize (NPUB_PLUGINS_MAX_ISA
  // for the in-tree ones: plugin_kernels::configure_isa_from_environment) as
  // strictly as the
  // host reads its own (Note [A setting is read strictly or refused]), and
  // a bad value fails initialize with "NAME: expected ... but found '...'".
  // That is a failed initialize like any other: the plugin is rejected with
  // the message (LoadResult::error: npub-demo, npubridge.load_failures()),
  // and the runtime starts with the other plugins, the ops it would have
  // served falling back. Only the host's own settings stop the start; the
  // loader never reads a setting's name out of a plugin's error to stop it,
  // since a plugin is optional and the others still serve.
  if (err != nullptr) return reject("initialize failed: " + consume_error(err));
  if (!registrar.first_error.empty()) return reject(registrar.first_error);

  // 5. Commit, all or nothing (Note [A plugin's registrations commit as
  // one]). Checked while staging too; a host-side writer between the two
  // (Registry::define from another thread) is what can still conflict.
  reg::Registrations batch;
  batch.defined_by = "plugin '" + name + "'";
  batch.schemas = std::move(registrar.schemas);
  for (size_t i = 0; i < registrar.kernels.size(); ++i)
    batch.kernels.emplace_back(registrar.kernel_ops[i], std::move(registrar.kernels[i]));
  for (const auto& [op, meta] : registrar.metas) {
    batch.metas.emplace_back(op, meta);
    batch.metas.back().second.plugin = record;
  }
  batch.derivatives = std::move(registrar.derivatives);
  batch.fusion_patterns = std::move(registrar.fusion_patterns);
  const size_t num_schemas = batch.schemas.size(), num_kernels = batch.kernels.size();
  try {
    registry_.commit(std::move(batch));
  } catch (const Error& e) {
    return reject(e.what());
  }
  // Only now may the plugin's shutdown run (when its last kernel goes).
  record->shutdown = api->struct_size >= NPUB_STRUCT_SIZE(NpubPluginApi, shutdown) ? api->shutdown : nullptr;
  {
    std::lock_guard<std::mutex> lock(mu_);
    plugins_.push_back(record);
  }
  result.ok = true;
  result.plugin_name = name;
  log().info("loaded plugin '{}' {} from {} ({} ops defined, {} kernels)", name, record->version, path,
             num_schemas, num_kernels);
  return result;
}

std::vector<std::shared_ptr<reg::PluginRecord>> PluginLoader::plugins() const {
  std::lock_guard<std::mutex> lock(mu_);
  return plugins_;
}

std::shared_ptr<reg::PluginRecord> PluginLoader::plugin(const std::string& name) const {
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& p : plugins_)
    if (p->name == name) return p;
  return nullptr;
}

std::vector<LoadResult> PluginLoader::failures() const {
  std::lock_guard<std::mutex> lock(mu_);
  return failures_;
}

std::vector<LoadResult> PluginLoader::skipped() const {
  std::lock_guard<std::mutex> lock(mu_);
  return skipped_;
}

}  // namespace npub

// npub-plugins --check FILE...: vets plugin files before they are installed
// where hosts load them. Each file is loaded in a child process, as the
// runtime loads plugins (the same checks, then the plugin's initialize), so
// a plugin that crashes or hangs in its own initialize, which would take a
// host's process down (plugins run in the host's process and cannot be
// isolated there), is reported here instead.
#include <npubridge/dispatcher/runtime.h>

#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

void usage(std::FILE* to) {
  std::fprintf(to,
               "usage: npub-plugins --check FILE... [--timeout SECONDS]\n"
               "  Loads each plugin file in a child process, as a host would, and prints one line per file:\n"
               "    FILE: ok: plugin 'NAME' VERSION, ABI 1.N\n"
               "    FILE: rejected: REASON         (e.g. no npub_plugin_init_v1, initialize failed: ...)\n"
               "    FILE: crashed: ... / hung: ... (in its initialize; a host loading it would die or hang)\n"
               "  Each FILE is named explicitly, so a library without the entry symbol is rejected here\n"
               "  (in a directory of NPUB_PLUGIN_PATH the loader skips it instead).\n"
               "  --timeout SECONDS  how long initialize may take (default 60)\n"
               "Exit status: 0 when every file is accepted, 1 otherwise, 2 for a usage error.\n");
}

// In the child: load `path` into a fresh runtime and write the verdict to fd.
[[noreturn]] void check_in_child(const std::string& path, int fd) {
  npub::RuntimeOptions o;
  o.devices.num_devices = 1;
  o.load_default_plugins = false;
  o.load_default_op_map = false;
  std::string line;
  bool ok = false;
  try {
    // Never destroyed: the verdict is about loading and initialize, so it
    // is written before any unload or shutdown could crash or hang, and
    // the child leaves with _exit.
    auto* rt = new npub::Runtime(o);
    const npub::LoadResult r = rt->loader().load(path);
    ok = r.ok;
    if (r.ok) {
      const auto p = rt->loader().plugin(r.plugin_name);
      line = "ok: plugin '" + r.plugin_name + "' " + (p ? p->version : std::string("?")) + ", ABI 1." +
             std::to_string(p ? p->abi_minor : 0);
    } else {
      line = "rejected: " + r.error;
    }
  } catch (const std::exception& e) {
    line = std::string("rejected: ") + e.what();
  }
  line += "\n";
  if (::write(fd, line.data(), line.size()) < 0) _exit(3);
  ::close(fd);
  _exit(ok ? 0 : 1);
}

std::string signal_name(int sig) {
  const char* d = ::strsignal(sig);
  return "signal " + std::to_string(sig) + (d != nullptr ? std::string(", ") + d : std::string());
}

// Returns true when the file is accepted; prints the verdict.
bool check(const std::string& path, int timeout_s) {
  int fds[2];
  if (::pipe(fds) != 0) {
    std::printf("%s: error: pipe: %s\n", path.c_str(), std::strerror(errno));
    return false;
  }
  std::fflush(stdout);
  const pid_t pid = ::fork();
  if (pid < 0) {
    std::printf("%s: error: fork: %s\n", path.c_str(), std::strerror(errno));
    return false;
  }
  if (pid == 0) {
    ::close(fds[0]);
    check_in_child(path, fds[1]);
  }
  ::close(fds[1]);
  std::string verdict;
  bool timed_out = false;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(timeout_s);
  for (;;) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      timed_out = true;
      break;
    }
    pollfd p{fds[0], POLLIN, 0};
    const int n = ::poll(&p, 1, static_cast<int>(left.count()));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) continue;
    char buf[4096];
    const ssize_t got = ::read(fds[0], buf, sizeof buf);
    if (got <= 0) break;  // the child closed its end: done (or dead)
    verdict.append(buf, static_cast<size_t>(got));
  }
  ::close(fds[0]);
  if (timed_out) ::kill(pid, SIGKILL);
  int status = 0;
  ::waitpid(pid, &status, 0);
  if (timed_out) {
    std::printf(
        "%s: hung: no verdict within %d s (the loader or the plugin's initialize did not return; "
        "killed)\n",
        path.c_str(), timeout_s);
    return false;
  }
  if (WIFSIGNALED(status)) {
    std::printf(
        "%s: crashed: the loader or the plugin's initialize died with %s; a host loading it would "
        "die too\n",
        path.c_str(), signal_name(WTERMSIG(status)).c_str());
    return false;
  }
  if (verdict.empty())
    verdict = "error: the check ended without a verdict (exit " +
              std::to_string(WIFEXITED(status) ? WEXITSTATUS(status) : -1) + ")\n";
  std::printf("%s: %s", path.c_str(), verdict.c_str());
  return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> files;
  bool checking = false;
  int timeout_s = 60;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--check") {
      checking = true;
    } else if (a == "--timeout" && i + 1 < argc) {
      timeout_s = std::atoi(argv[++i]);
      if (timeout_s <= 0 || timeout_s > 86400) {
        std::fprintf(stderr, "npub-plugins: --timeout expects 1 to 86400 seconds but found '%s'\n", argv[i]);
        return 2;
      }
    } else if (a == "-h" || a == "--help") {
      usage(stdout);
      return 0;
    } else if (!a.empty() && a[0] == '-') {
      std::fprintf(stderr, "npub-plugins: unknown option '%s'\n", a.c_str());
      usage(stderr);
      return 2;
    } else {
      files.push_back(a);
    }
  }
  if (!checking || files.empty()) {
    usage(stderr);
    return 2;
  }
  bool all_ok = true;
  for (const std::string& f : files) all_ok = check(f, timeout_s) && all_ok;
  return all_ok ? 0 : 1;
}

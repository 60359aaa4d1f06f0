// npub-conformance's verdicts (one Cell per plugin x op x dtype), its reports,
// and the crash and hang isolation of its runs: the cells run in a forked
// child, which reports each cell and each sample it starts on a pipe; a
// child that dies (a kernel that segfaults, aborts or calls _exit) or is
// silent for the timeout (a kernel that never returns) has its cell in
// flight reported "crashed" or "hung", with the sample, and the run goes on
// in a new child from the next cell. No torch here: this file compiles fast.
#pragma once

#include <cstddef>
#include <functional>
#include <string>
#include <vector>

namespace npub::conformance {

struct Cell {
  std::string plugin, op, dtype;
  std::string status;  // pass | fail | crashed | hung | not covered
  int samples = 0, passed = 0;
  double worst = 0;
  std::string detail;  // first failure, why not covered, or where the run died
  int declined = 0;    // samples the kernel declined (the host's fallback serves them)
};

void write_reports(const std::vector<Cell>& cells, const std::string& md, const std::string& json,
                   const std::vector<std::string>& plugins, const char* torch_version);

struct IsolatedRun;

// A child's side of the pipe; fd -1: in process, the cells and plugins go
// to `sink` directly.
class Progress {
 public:
  explicit Progress(int fd, IsolatedRun* sink = nullptr) : fd_(fd), sink_(sink) {}
  void plugin_loaded(const std::string& name);
  void load_failed();
  void cell_started(size_t index, const Cell& cell);  // plugin, op, dtype of the cell
  void sample_started(const std::string& name);
  void cell_done(size_t index, const Cell& cell);
  void end();

 private:
  void line(const std::string& text);
  int fd_;
  IsolatedRun* sink_;
};

struct IsolatedRun {
  std::vector<Cell> cells;
  std::vector<std::string> plugins;
  bool load_failed = false;
  std::string error;  // a child that died outside a cell: the run could not go on
};

// Runs child(progress, first cell index) in forked children (its return
// value is the child's exit status) until one reports its end; timeout:
// seconds a sample (or a cell with no samples) may take.
IsolatedRun run_isolated(const std::function<int(Progress&, size_t)>& child, double timeout_s);

}  // namespace npub::conformance

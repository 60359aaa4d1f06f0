// Graph mode's execution loop (program.cpp): a lowered FX graph as slots
// (the tensors of the graph: where each one's memory comes from) and steps
// (the nodes that compute), run by one C++ loop per call. Built by
// npubridge/_compile/lowering.py through program_bindings.cpp; the lowering
// and the loop are described in docs/graph-mode.md.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/ivalue.h>
#include <c10/core/Storage.h>

#include <npubridge/dispatcher/dispatcher.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace npub::torch_backend {

struct Boxed;

// One tensor of the graph. Sizes, strides and the storage offset (in
// elements) are the node's meta value's: static shapes.
struct SlotSpec {
  enum class Kind {
    kInput,     // graph input `index`
    kArena,     // the arena, at byte offset `index` (the memory plan's)
    kOutput,    // its own allocation per call (a graph output, or the base of one)
    kView,      // a view of slot `index` (same storage)
    kHost,      // the result of a host step (ATen allocated it)
    kConstant,  // `constant`, made once at lowering
  };
  Kind kind = Kind::kInput;
  int64_t index = 0;
  at::ScalarType dtype = at::kFloat;
  std::vector<int64_t> sizes, strides;
  int64_t offset = 0;
  at::Tensor constant;
};

// One argument of a step, in the ATen op's schema order.
struct ArgSpec {
  enum class Kind { kSlot, kSlots, kValue };
  Kind kind = Kind::kValue;
  int64_t slot = -1;
  std::vector<int64_t> slots;  // -1: None in an optional-tensor list
  c10::IValue value;
};

struct StepSpec {
  std::string node;        // the FX node's name, for errors
  c10::OperatorHandle op;  // the ATen op of the node
  std::string target;      // kernel steps: the registry op ("aten::add.out"); "" for a host step
  bool via_out = false;    // the target is the op's .out form: outputs are passed as out=
  std::vector<ArgSpec> args;
  std::vector<int64_t> outs;  // per return: its slot, or -1 (unused)
};

// How a step was resolved, for Compiled.summary().
struct StepInfo {
  std::string node, kind, plugin, kernel_op, conversion, reason;
};

class Program {
 public:
  Program(int device, std::vector<SlotSpec> slots, int64_t arena_bytes, std::vector<StepSpec> steps,
          std::vector<int64_t> outputs, bool keep_arena);
  ~Program();
  Program(const Program&) = delete;
  Program& operator=(const Program&) = delete;

  // One run: binds the inputs, runs every step, returns the outputs
  // (undefined for a None output). Throws c10::Error naming the node.
  // `inputs` is taken by value: with the caller's references given up
  // (AOTAutograd's boxed convention), an input is released after the last
  // step that reads it (set_input_last_use), as eager autograd frees a
  // saved tensor once its backward node ran.
  std::vector<at::Tensor> run(std::vector<at::Tensor> inputs);
  // Per graph input, the step after which the loop drops its reference
  // (-1 or past the last step: kept to the end).
  void set_input_last_use(const std::vector<int64_t>& last_use);
  const std::vector<StepInfo>& info() const { return info_; }
  int64_t arena_bytes() const { return arena_bytes_; }
  // The step the calling thread's last run() failed in ("graph node 'x'
  // (aten::op)"), for an error whose message cannot carry it: a Python
  // exception raised under the run (a __torch_dispatch__ mode's, such as
  // AOTAutograd's runtime wrapper), which python_error carries unchanged
  // (program_bindings.cpp names the step in it).
  static const std::string& failed_step();

 private:
  struct Slot;
  struct Step;
  void bind(const std::vector<at::Tensor>& inputs);
  void place_views(int64_t root);
  void allocate(int64_t slot);
  const at::Tensor& tensor(int64_t slot);
  void run_kernel(Step& s);
  void run_host(Step& s);
  void take_result(Step& s, size_t ret, const at::Tensor& t);
  std::vector<c10::IValue> host_args(const Step& s);

  int device_;
  std::vector<Slot> slots_;
  std::vector<Step> steps_;
  std::vector<int64_t> outputs_;
  std::vector<int64_t> inputs_;                        // slot per graph input
  std::vector<std::vector<int64_t>> allocate_before_;  // per step: kOutput slots it writes first
  std::vector<std::vector<int64_t>> views_of_;         // per root slot: its views, in order
  std::vector<std::vector<int64_t>> release_after_;    // per step: graph inputs read for the last time
  int64_t arena_bytes_;
  bool keep_arena_;
  // Note [One run at a time]: the slots, their DLTensors and the arena are
  // the program's, so runs from several threads (a compiled model used
  // concurrently, as eager allows) take turns on `run_mutex_`; the GIL is
  // released before, so a waiting caller blocks nobody else. `runner_`
  // catches a run re-entered from its own thread (a host step calling the
  // same compiled graph), which would otherwise deadlock.
  std::mutex run_mutex_;
  std::atomic<std::thread::id> runner_{};
  c10::Storage arena_;
  std::vector<StepInfo> info_;
};

}  // namespace npub::torch_backend

// The execution loop of a lowered graph (see program.h).
#include "compile/program.h"
#include "compile/step_call.h"

#include <ATen/core/stack.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/TensorImpl.h>
#include <c10/util/Exception.h>

#include <npubridge/dispatcher/kernel_error.h>
#include <npubridge/support/error.h>
#include <npubridge/support/shape.h>

#include "aten/boxing.h"
#include "aten/fallback.h"
#include "runtime/allocator.h"
#include "runtime/npu_runtime.h"

#include <algorithm>

namespace npub::torch_backend {

// Note [One loop over resolved steps]
// A lowered graph runs as one C++ loop: no Python and no ATen dispatch per
// kernel node. Everything a node's call needs that does not depend on the
// data was decided at lowering: each tensor is a slot with fixed dtype,
// sizes and strides, described by a DLTensor built once; each kernel step
// holds its NpubValue arguments, built once and pointing at those
// DLTensors, and its CallPlan (the kernel and the dtype conversion,
// Note [One call plan per signature]). A run only patches the slots' data
// pointers (inputs, the arena, per-call output allocations, views as base
// plus offset) and runs each step's plan (Dispatcher::run). Host steps
// (npubridge's own native kernels, and the ops no plugin serves) call their
// ATen op boxed, on at::Tensors made over the slots' memory; a kernel that
// declines at run time goes to the dispatcher's fallback with the step's
// ATen call as its host call (TorchCall), as an eager call does.

struct Program::Slot {
  SlotSpec spec;
  DLTensor dl{};
  size_t itemsize = 0;
  at::Tensor t;  // this run's tensor over the slot's memory, made when needed
};

struct Program::Step {
  StepSpec spec;
  std::optional<CallPlan> rc;  // kernel steps
  StepCall call;               // kernel steps: the NpubValue arguments and returns
  std::vector<int64_t> after;  // host steps: slots whose views are placed once it ran
};

namespace {

std::string step_where(const StepSpec& s) {
  return "graph node '" + s.node + "' (" + full_name(s.op.schema().operator_name()) + ")";
}

std::string& failed_step_of_thread() {
  thread_local std::string where;
  return where;
}

// Bytes from the storage's start the tensor's elements reach.
int64_t slot_extent_bytes(const SlotSpec& s, size_t itemsize) {
  int64_t last = s.offset;
  for (size_t d = 0; d < s.sizes.size(); ++d) {
    if (s.sizes[d] == 0) return s.offset * static_cast<int64_t>(itemsize);
    last += (s.sizes[d] - 1) * s.strides[d];
  }
  return (last + 1) * static_cast<int64_t>(itemsize);
}

// Note [The real result against the meta value]
// A graph's slots have the dtypes and shapes of its meta values (ATen's
// meta functions, which follow CUDA); the op on this backend may return
// otherwise: ATen's CPU kernels and the plugins compute LayerNorm's
// mean/rstd and BatchNorm's save_mean/save_invstd of reduced-precision
// input in the input's dtype where the meta says float32. Returns the graph
// never reads get no slot (lowering.py). A host step's read one is taken
// when its real dtype converts exactly to the slot's (bfloat16 ->
// float32): the same values the op computed, in the dtype the graph was
// traced with; anything else (another shape, a narrowing) is an error
// naming the node. A kernel step's are known before it runs, from its call
// plan's returns (Note [A plan's returns are its kernel's], dispatcher),
// and the lowering widens them by an exact copy_ step.
bool converts_exactly(at::ScalarType from, at::ScalarType to) {
  if (from == to) return true;
  const bool fl = c10::isFloatingType(from) && c10::isFloatingType(to);
  const bool in = c10::isIntegralType(from, false) && c10::isIntegralType(to, false);
  return (fl || in) && c10::promoteTypes(from, to) == to && c10::elementSize(from) < c10::elementSize(to);
}

at::Tensor tensor_over(const c10::Storage& storage, const SlotSpec& s, int64_t offset_elems) {
  at::Tensor t = at::detail::make_tensor<c10::TensorImpl>(c10::Storage(storage),
                                                          c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
                                                          caffe2::TypeMeta::fromScalarType(s.dtype));
  t.unsafeGetTensorImpl()->set_sizes_and_strides(s.sizes, s.strides, offset_elems);
  return t;
}

c10::Storage graph_storage(int64_t bytes) {
  return c10::Storage(c10::Storage::use_byte_size_t(), static_cast<size_t>(bytes),
                      npu_allocator()->allocate(static_cast<size_t>(bytes)), npu_allocator(),
                      /*resizable=*/false);
}

}  // namespace

Program::Program(int device, std::vector<SlotSpec> slots, int64_t arena_bytes, std::vector<StepSpec> steps,
                 std::vector<int64_t> outputs, bool keep_arena)
    : device_(device), outputs_(std::move(outputs)), arena_bytes_(arena_bytes), keep_arena_(keep_arena) {
  slots_.resize(slots.size());
  views_of_.resize(slots.size());
  for (size_t i = 0; i < slots.size(); ++i) {
    Slot& s = slots_[i];
    s.spec = std::move(slots[i]);
    TORCH_CHECK(s.spec.sizes.size() == s.spec.strides.size(), "graph slot ", i, ": sizes and strides differ");
    s.itemsize = c10::elementSize(s.spec.dtype);
    describe_slot(s.dl, s.spec, device);
    using K = SlotSpec::Kind;
    if (s.spec.kind == K::kInput) {
      if (inputs_.size() <= static_cast<size_t>(s.spec.index)) inputs_.resize(s.spec.index + 1, -1);
      inputs_[static_cast<size_t>(s.spec.index)] = static_cast<int64_t>(i);
    } else if (s.spec.kind == K::kView) {
      TORCH_CHECK(s.spec.index >= 0 && static_cast<size_t>(s.spec.index) < i, "graph slot ", i,
                  ": a view of slot ", s.spec.index, ", which does not come before it");
      int64_t root = s.spec.index;
      while (slots_[static_cast<size_t>(root)].spec.kind == K::kView) root = slots_[root].spec.index;
      views_of_[static_cast<size_t>(root)].push_back(static_cast<int64_t>(i));
    } else if (s.spec.kind == K::kConstant) {
      s.t = s.spec.constant;
      s.dl.data = s.t.data_ptr();
    } else if (s.spec.kind == K::kArena) {
      TORCH_CHECK(s.spec.index >= 0 && s.spec.index + slot_extent_bytes(s.spec, s.itemsize) <= arena_bytes,
                  "graph slot ", i, ": arena offset ", s.spec.index, " outside the arena of ", arena_bytes,
                  " bytes");
    }
  }
  rt().dispatcher();  // the runtime is up
  steps_.reserve(steps.size());
  for (size_t n = 0; n < steps.size(); ++n) {
    steps_.push_back(Step{std::move(steps[n]), {}, {}, {}});
    Step& st = steps_.back();
    StepInfo info{st.spec.node, "fallback", "", "", "", ""};
    for (int64_t o : st.spec.outs)
      if (o >= 0 && slots_[static_cast<size_t>(o)].spec.kind == SlotSpec::Kind::kHost) st.after.push_back(o);
    if (!st.spec.target.empty()) {
      const OpHandle target = rt().dispatcher().op(st.spec.target);
      box_step(
          st.spec, target, device, [&](int64_t k) { return &slots_[static_cast<size_t>(k)].dl; }, st.call);
      try {
        st.rc =
            rt().dispatcher().plan(target, st.call.args.data(), static_cast<int32_t>(st.call.args.size()));
      } catch (const Error& e) {
        TORCH_CHECK(false, step_where(st.spec), ": ", e.what());
      }
      if (st.rc->kernel == nullptr) {
        // No kernel for these dtypes: ATen's own route serves the node
        // (the dispatcher's fallback, counted there).
        info.reason = st.rc->fallback_reason;
        st.rc.reset();
      } else {
        info.kind = "kernel";
        info.plugin = st.rc->plugin();
        info.kernel_op = st.spec.target;
        info.conversion = st.rc->conversion();
      }
    }
    info_.push_back(std::move(info));
  }
  // Note [Outputs are allocated when first written]: a graph's outputs
  // (a backward's gradients, a forward's saved activations) are allocated
  // by the step that first writes them, not all when the run starts, so
  // that the run's peak is the eager one's: eager allocates each result
  // when its op runs.
  std::vector<bool> seen(slots_.size(), false);
  allocate_before_.resize(steps_.size());
  auto first_write = [&](size_t k, int64_t slot) {
    if (slot < 0) return;
    while (slots_[static_cast<size_t>(slot)].spec.kind == SlotSpec::Kind::kView)
      slot = slots_[static_cast<size_t>(slot)].spec.index;
    if (slots_[static_cast<size_t>(slot)].spec.kind != SlotSpec::Kind::kOutput ||
        seen[static_cast<size_t>(slot)])
      return;
    seen[static_cast<size_t>(slot)] = true;
    allocate_before_[k].push_back(slot);
  };
  for (size_t k = 0; k < steps_.size(); ++k) {
    for (int64_t o : steps_[k].spec.outs) first_write(k, o);
    const auto& sargs = steps_[k].spec.op.schema().arguments();
    for (size_t a = 0; a < steps_[k].spec.args.size() && a < sargs.size(); ++a)
      if (sargs[a].alias_info() != nullptr && sargs[a].alias_info()->isWrite() &&
          steps_[k].spec.args[a].kind == ArgSpec::Kind::kSlot)
        first_write(k, steps_[k].spec.args[a].slot);
  }
  for (size_t i = 0; i < slots_.size(); ++i)  // an output no step writes (none in practice)
    if (slots_[i].spec.kind == SlotSpec::Kind::kOutput && !seen[i] && !steps_.empty())
      allocate_before_[0].push_back(static_cast<int64_t>(i));
}

void Program::allocate(int64_t i) {
  Slot& s = slots_[static_cast<size_t>(i)];
  s.t = tensor_over(graph_storage(std::max<int64_t>(slot_extent_bytes(s.spec, s.itemsize), 1)), s.spec,
                    s.spec.offset);
  s.dl.data = s.t.data_ptr();
  place_views(i);
}

Program::~Program() = default;

void Program::bind(const std::vector<at::Tensor>& inputs) {
  TORCH_CHECK(inputs.size() == inputs_.size(), "compiled graph: expected ", inputs_.size(),
              " tensor inputs but found ", inputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (inputs_[i] < 0) continue;  // not used by the graph
    Slot& s = slots_[static_cast<size_t>(inputs_[i])];
    const at::Tensor& t = inputs[i];
    TORCH_CHECK(t.defined() && t.device().is_privateuseone() && t.device().index() == device_,
                "compiled graph: input ", i, ": expected a tensor on npu:", device_, " but found ",
                t.defined() ? t.device().str() : std::string("None"));
    TORCH_CHECK(t.scalar_type() == s.spec.dtype && t.sizes().equals(s.spec.sizes) &&
                    t.strides().equals(s.spec.strides),
                "compiled graph: input ", i, ": expected ", s.spec.dtype, " ", shape_str(s.spec.sizes),
                " strides ", shape_str(s.spec.strides), " (the shapes it was compiled for) but found ",
                t.scalar_type(), " ", shape_str(t.sizes()), " strides ", shape_str(t.strides()));
    s.t = t;
    s.dl.data = t.data_ptr();
  }
}

// Places the views of `root` on its memory (base plus the byte distance
// between their storage offsets, as the meta values have them).
void Program::place_views(int64_t root) {
  for (int64_t v : views_of_[static_cast<size_t>(root)]) {
    Slot& s = slots_[static_cast<size_t>(v)];
    const Slot& b = slots_[static_cast<size_t>(s.spec.index)];
    const int64_t delta =
        s.spec.offset * static_cast<int64_t>(s.itemsize) - b.spec.offset * static_cast<int64_t>(b.itemsize);
    s.dl.data = static_cast<char*>(b.dl.data) + delta;
    s.t.reset();
  }
}

const at::Tensor& Program::tensor(int64_t i) {
  Slot& s = slots_[static_cast<size_t>(i)];
  if (s.t.defined()) return s.t;
  using K = SlotSpec::Kind;
  if (s.spec.kind == K::kArena) {
    s.t = tensor_over(arena_, s.spec, s.spec.index / static_cast<int64_t>(s.itemsize));
  } else if (s.spec.kind == K::kView) {
    const at::Tensor& b = tensor(s.spec.index);
    const Slot& bs = slots_[static_cast<size_t>(s.spec.index)];
    const int64_t bytes = b.storage_offset() * static_cast<int64_t>(bs.itemsize) +
                          s.spec.offset * static_cast<int64_t>(s.itemsize) -
                          bs.spec.offset * static_cast<int64_t>(bs.itemsize);
    s.t = tensor_over(b.storage(), s.spec, bytes / static_cast<int64_t>(s.itemsize));
  } else {
    TORCH_CHECK(false, "compiled graph: slot ", i, " has no tensor yet (a step reads it before it is made)");
  }
  return s.t;
}

std::vector<c10::IValue> Program::host_args(const Step& s) {
  std::vector<c10::IValue> args;
  args.reserve(s.spec.args.size());
  for (const ArgSpec& a : s.spec.args) {
    if (a.kind == ArgSpec::Kind::kSlot) {
      args.emplace_back(tensor(a.slot));
    } else if (a.kind == ArgSpec::Kind::kSlots) {
      bool optional = false;
      for (int64_t k : a.slots) optional = optional || k < 0;
      if (optional) {
        c10::List<std::optional<at::Tensor>> l;
        for (int64_t k : a.slots) l.push_back(k < 0 ? std::optional<at::Tensor>() : tensor(k));
        args.emplace_back(l);
      } else {
        c10::List<at::Tensor> l;
        for (int64_t k : a.slots) l.push_back(tensor(k));
        args.emplace_back(l);
      }
    } else {
      args.push_back(a.value);
    }
  }
  return args;
}

// A host step's (or a declined kernel's) result into its slot: a host slot
// takes the tensor (copied to the strides the plan expects when ATen laid
// it out otherwise); a planned slot receives a copy.
void Program::take_result(Step& s, size_t ret, const at::Tensor& t) {
  const int64_t o = s.spec.outs[ret];
  if (o < 0) return;
  Slot& slot = slots_[static_cast<size_t>(o)];
  // Note [The real result against the meta value]
  TORCH_CHECK(
      t.defined() && converts_exactly(t.scalar_type(), slot.spec.dtype) && t.sizes().equals(slot.spec.sizes),
      step_where(s.spec), ": return ", ret, " is ", t.defined() ? c10::toString(t.scalar_type()) : "None",
      " ", t.defined() ? shape_str(t.sizes()) : "", " but the graph's meta value says ", slot.spec.dtype, " ",
      shape_str(slot.spec.sizes));
  if (slot.spec.kind == SlotSpec::Kind::kHost) {
    if (t.scalar_type() == slot.spec.dtype && t.strides().equals(slot.spec.strides) &&
        t.device().is_privateuseone()) {
      slot.t = t;
    } else {
      slot.t = tensor_over(graph_storage(std::max<int64_t>(slot_extent_bytes(slot.spec, slot.itemsize), 1)),
                           slot.spec, slot.spec.offset);
      slot.t.copy_(t);
    }
    slot.dl.data = slot.t.data_ptr();
    place_views(o);
  } else {
    tensor(o).copy_(t);
  }
}

void Program::run_host(Step& s) {
  torch::jit::Stack stack = host_args(s);
  s.spec.op.callBoxed(stack);
  TORCH_CHECK(stack.size() == s.spec.outs.size(), step_where(s.spec), ": expected ", s.spec.outs.size(),
              " returns but found ", stack.size());
  for (size_t r = 0; r < stack.size(); ++r)
    if (s.spec.outs[r] >= 0) take_result(s, r, stack[r].toTensor());
}

void Program::run_kernel(Step& s) {
  // The rets as built (Dispatcher::run fills aliasing slots; a kernel fills
  // the empty ones it allocates).
  NpubValue rets_small[8];
  std::vector<NpubValue> rets_big;
  NpubValue* rets = rets_small;
  if (s.call.rets.size() > 8) {
    rets_big = s.call.rets;
    rets = rets_big.data();
  } else {
    std::copy(s.call.rets.begin(), s.call.rets.end(), rets_small);
  }
  // A kernel that declines goes to the dispatcher's fallback, which runs
  // the step's ATen op on the CPU from this call's arguments.
  struct Ctx {
    Program* p;
    Step* s;
  } ctx{this, &s};
  TorchCall call(&s.spec.op, nullptr);
  call.push_ctx = &ctx;
  call.push_args = [](const void* c, torch::jit::Stack& stack) {
    const Ctx& x = *static_cast<const Ctx*>(c);
    for (auto& v : x.p->host_args(*x.s)) stack.push_back(std::move(v));
  };
  TorchOutputs outs;
  try {
    rt().dispatcher().run(*s.rc, s.call.args.data(), static_cast<int32_t>(s.call.args.size()), rets,
                          static_cast<int32_t>(s.call.rets.size()), &outs, &call);
  } catch (const Error& e) {
    if (e.code() == ErrorCode::kOutOfMemory)
      TORCH_CHECK_WITH(OutOfMemoryError, false, step_where(s.spec), ": ", e.what());
    TORCH_CHECK(false, step_where(s.spec), ": ", e.what());
  }
  if (call.fell_back) {
    const size_t n = s.spec.outs.size();
    TORCH_CHECK(call.own.size() >= n, step_where(s.spec), ": the fallback left ", call.own.size(),
                " results");
    for (size_t r = 0; r < n; ++r)
      if (s.spec.outs[r] >= 0) take_result(s, r, call.own[call.own.size() - n + r].toTensor());
  }
}

const std::string& Program::failed_step() { return failed_step_of_thread(); }

void Program::set_input_last_use(const std::vector<int64_t>& last_use) {
  release_after_.assign(steps_.size(), {});
  for (size_t i = 0; i < last_use.size(); ++i)
    if (last_use[i] >= 0 && static_cast<size_t>(last_use[i]) < steps_.size())
      release_after_[static_cast<size_t>(last_use[i])].push_back(static_cast<int64_t>(i));
}

std::vector<at::Tensor> Program::run(std::vector<at::Tensor> inputs) {
  TORCH_CHECK(runner_.load() != std::this_thread::get_id(),
              "compiled graph: called again from inside its own run (a host step of the graph calls it)");
  std::lock_guard<std::mutex> lock(run_mutex_);  // Note [One run at a time]
  runner_.store(std::this_thread::get_id());
  struct Done {
    Program& p;
    ~Done() {
      for (Slot& s : p.slots_)
        if (s.spec.kind != SlotSpec::Kind::kConstant) s.t.reset();
      if (!p.keep_arena_) p.arena_ = c10::Storage();
      p.runner_.store(std::thread::id());
    }
  } done{*this};
  c10::OptionalDeviceGuard guard;
  if (device_ != current_index()) guard.reset_device(at::Device(c10::DeviceType::PrivateUse1, device_));
  bind(inputs);
  // Note [The arena per call]: one allocation from the caching allocator
  // per run, returned at its end, so that memory a graph does not use
  // between runs (a forward's, during the backward) is there for others;
  // the caching allocator makes it a free-list lookup (figures in
  // docs/graph-mode.md). keep_arena holds it across runs instead.
  if (arena_bytes_ > 0 && !arena_) arena_ = graph_storage(arena_bytes_);
  char* base = arena_bytes_ > 0 ? static_cast<char*>(arena_.mutable_data()) : nullptr;
  for (size_t i = 0; i < slots_.size(); ++i) {
    Slot& s = slots_[i];
    if (s.spec.kind == SlotSpec::Kind::kArena) s.dl.data = base + s.spec.index;
  }
  for (size_t i = 0; i < slots_.size(); ++i) {
    const SlotSpec::Kind kind = slots_[i].spec.kind;
    if (kind != SlotSpec::Kind::kView && kind != SlotSpec::Kind::kHost && kind != SlotSpec::Kind::kOutput)
      place_views(static_cast<int64_t>(i));
  }
  failed_step_of_thread().clear();
  for (size_t k = 0; k < steps_.size(); ++k) {
    Step& s = steps_[k];
    for (int64_t o : allocate_before_[k]) allocate(o);
    try {
      if (s.rc)
        run_kernel(s);
      else
        run_host(s);
    } catch (...) {
      failed_step_of_thread() = step_where(s.spec);
      throw;
    }
    if (release_after_.empty()) continue;
    for (int64_t i : release_after_[k]) {
      const int64_t slot = inputs_[static_cast<size_t>(i)];
      inputs[static_cast<size_t>(i)].reset();
      if (slot < 0) continue;
      slots_[static_cast<size_t>(slot)].t.reset();
      for (int64_t v : views_of_[static_cast<size_t>(slot)]) slots_[static_cast<size_t>(v)].t.reset();
    }
  }
  std::vector<at::Tensor> out;
  out.reserve(outputs_.size());
  for (int64_t o : outputs_) out.push_back(o < 0 ? at::Tensor() : tensor(o));
  return out;
}

}  // namespace npub::torch_backend

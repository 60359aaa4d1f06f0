// A kernel launch inside a graph capture (Note [Capture records instead of
// running], graph_capture.h): what invoke_kernel records instead of calling
// the kernel, and what replay calls.
#include "captured_kernel.h"

#include <npubridge/dispatcher/trace.h>
#include "call_state.h"
#include "host_api.h"

#include <npubridge/device_sim/graph_capture.h>
#include <npubridge/dispatcher/kernel_error.h>
#include <npubridge/support/error.h>

#include <deque>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace npub {

void call_kernel_fn(const KernelLaunch& launch, const NpubValue* args, int32_t num_args, NpubValue* rets,
                    int32_t num_rets, OutputAllocator* outputs) {
  const reg::Kernel& k = *launch.kernel;
  NpubCallContext ctx;
  static const NpubHostApi* const host = host_api();
  ctx.head = NpubContextHead{NPUB_CONTEXT_HEAD_STRUCT_SIZE, host, k.user_data, launch.op_name->c_str()};
  ctx.kernel = &k;
  ctx.device = launch.device;
  ctx.stream = launch.stream;
  ctx.generator = launch.generator;
  ctx.dl_device = launch.dl_device;
  ctx.rets = rets;
  ctx.num_rets = num_rets;
  ctx.outputs = outputs;
  ctx.workspace = launch.workspace;
  ctx.workspace_bytes = launch.workspace_bytes;
  struct Cleanup {
    NpubCallContext& c;
    ~Cleanup() {
      for (void* p : c.scratch) c.device->free(p);
    }
  } cleanup{ctx};
  auto fail = [&](int32_t code, const std::string& msg) {
    throw KernelError(
        static_cast<ErrorCode>(
            code >= NPUB_ERR_INVALID_ARGUMENT && code <= NPUB_ERR_INDEX ? code : NPUB_ERR_INTERNAL),
        "op '" + *launch.op_name + "' failed in the kernel of plugin '" + k.plugin_name() + "': " + msg);
  };
  NpubError* e = nullptr;
  try {
    e = k.fn(&ctx, args, num_args, rets, num_rets);
  } catch (const std::exception& ex) {
    fail(NPUB_ERR_INTERNAL, std::string("a C++ exception crossed the C ABI: ") + ex.what());
  } catch (...) {
    fail(NPUB_ERR_INTERNAL, "a C++ exception crossed the C ABI");
  }
  if (e != nullptr) {
    int32_t code = 0;
    std::string msg = consume_error(e, &code);
    fail(code, msg);
  }
}

uint64_t query_workspace(const KernelLaunch& launch, const NpubValue* args, int32_t num_args) {
  const reg::Kernel& k = *launch.kernel;
  if (k.workspace_size == nullptr) return 0;
  uint64_t bytes = 0;
  if (NpubError* e = k.workspace_size(k.user_data, args, num_args, &bytes)) {
    int32_t code = 0;
    const std::string msg = consume_error(e, &code);
    throw KernelError(static_cast<ErrorCode>(code >= NPUB_ERR_INVALID_ARGUMENT && code <= NPUB_ERR_INDEX
                                                 ? code
                                                 : NPUB_ERR_INTERNAL),
                      "op '" + *launch.op_name + "' failed in the kernel of plugin '" + k.plugin_name() +
                          "': workspace query: " + msg);
  }
  return bytes;
}

namespace {

// Note [A record owns its arguments]: the call's NpubValues borrow
// everything (plugin_api.h); the record copies what they point to, except
// tensor data, which is the graph's static memory: DLTensor structs with
// their shapes and strides, lists, strings. The same DLTensor twice in a
// call (an out= that is its return) stays one object, as kernels may
// compare the pointers.
class CapturedKernel final : public sim::GraphNode {
 public:
  CapturedKernel(const KernelLaunch& launch, const NpubValue* args, int32_t num_args, const NpubValue* rets,
                 int32_t num_rets)
      : op_name_(*launch.op_name), launch_(launch) {
    launch_.op_name = &op_name_;
    launch_.stream = nullptr;  // the replay's
    // An explicit generator is the caller's object and may be gone at
    // replay: capture_kernel refuses those calls, so the replay draws from
    // the device's generator.
    launch_.generator = nullptr;
    args_.reserve(static_cast<size_t>(num_args));
    for (int32_t i = 0; i < num_args; ++i) args_.push_back(own(args[i]));
    rets_.reserve(static_cast<size_t>(num_rets));
    for (int32_t i = 0; i < num_rets; ++i) rets_.push_back(own(rets[i]));
  }

  void replay(sim::Device& device, sim::Stream& stream) override {
    KernelLaunch l = launch_;
    l.device = &device;
    l.stream = &stream;
    NoOutputs no_outputs(op_name_);  // every return was allocated at capture
    // The same slice as the eager run's (invoke_kernel), nested under the
    // replay's.
    const trace::Scope slice(trace::Kind::kKernel,
                             [&] { return launch_.kernel->plugin_name() + ": " + op_name_; });
    call_kernel_fn(l, args_.data(), static_cast<int32_t>(args_.size()), rets_.data(),
                   static_cast<int32_t>(rets_.size()), &no_outputs);
    const_cast<reg::Kernel*>(launch_.kernel)->calls.fetch_add(1, std::memory_order_relaxed);
  }

  std::string describe() const override {
    return "kernel " + launch_.kernel->plugin_name() + ": " + op_name_;
  }

 private:
  DLTensor* own_tensor(DLTensor* t) {
    if (t == nullptr) return nullptr;
    auto it = owned_.find(t);
    if (it != owned_.end()) return it->second;
    tensors_.emplace_back(*t);
    DLTensor* copy = tensors_.back().dl();
    owned_.emplace(t, copy);
    return copy;
  }

  NpubValue own(const NpubValue& v) {
    NpubValue c = v;
    switch (v.tag) {
      case NPUB_VALUE_TENSOR:
        c.u.tensor = own_tensor(v.u.tensor);
        break;
      case NPUB_VALUE_TENSOR_LIST: {
        lists_.emplace_back();
        for (int32_t j = 0; j < v.count; ++j) lists_.back().push_back(own_tensor(v.u.tensors[j]));
        c.u.tensors = lists_.back().data();
        break;
      }
      case NPUB_VALUE_INT_LIST:
        ints_.emplace_back(v.u.ints, v.u.ints + v.count);
        c.u.ints = ints_.back().data();
        break;
      case NPUB_VALUE_DOUBLE_LIST:
        doubles_.emplace_back(v.u.doubles, v.u.doubles + v.count);
        c.u.doubles = doubles_.back().data();
        break;
      case NPUB_VALUE_STRING:
        strings_.emplace_back(v.u.s, static_cast<size_t>(v.count));
        c.u.s = strings_.back().c_str();
        break;
      default:
        break;
    }
    return c;
  }

  std::string op_name_;
  KernelLaunch launch_;
  std::vector<NpubValue> args_;
  std::vector<NpubValue> rets_;
  // deques: what earlier values point to stays put as later ones are added
  std::deque<sim::OwnedTensor> tensors_;
  std::unordered_map<const DLTensor*, DLTensor*> owned_;
  std::deque<std::vector<DLTensor*>> lists_;
  std::deque<std::vector<int64_t>> ints_;
  std::deque<std::vector<double>> doubles_;
  std::deque<std::string> strings_;
};

bool draws_random_numbers(const reg::OpEntry& op) {
  for (const reg::Argument& a : op.schema().arguments)
    if (a.type.base == reg::BaseType::kGenerator) return true;
  return false;
}

}  // namespace

void capture_kernel(sim::Graph& graph, const Dispatcher::CallState& cs, KernelLaunch launch,
                    const NpubValue* args, NpubValue* rets, OutputAllocator* outputs) {
  const reg::OpEntry& op = *cs.op;
  // Note [Random ops in a capture]: the replay reserves its counters from
  // the device's generator when it runs (philox_reserve), so each replay
  // draws new numbers and advances the generator as the eager op would; a
  // call bound to an explicit generator cannot be replayed (the generator is
  // the caller's object).
  if (launch.generator != nullptr && draws_random_numbers(op))
    graph.forbid("op '" + op.name() + "'",
                 "a random op with an explicit generator; the replay can only draw from the device's "
                 "default generator");
  // Returns the kernel would allocate: from the op's meta function (shapes
  // from shapes), in the graph's pool; without one the shape depends on
  // the data, which the capture does not compute.
  const auto& alias = op.return_alias();
  std::vector<OutputMeta> metas;
  for (int32_t i = 0; i < cs.num_rets; ++i) {
    if (rets[i].tag != NPUB_VALUE_NONE || alias[static_cast<size_t>(i)] >= 0) continue;
    const reg::Argument& r = op.schema().returns[static_cast<size_t>(i)];
    if (r.type.base != reg::BaseType::kTensor || r.type.list)
      graph.forbid("op '" + op.name() + "'",
                   "return " + std::to_string(i) + " is a " + reg::type_to_string(r.type) +
                       " the kernel computes from the data (a data-dependent output)");
    if (metas.empty()) {
      const reg::MetaFunction* meta = op.meta();
      if (meta == nullptr)
        graph.forbid("op '" + op.name() + "'",
                     "its kernel allocates return " + std::to_string(i) +
                         " and the op has no meta function, so the output's shape depends on the data "
                         "(a data-dependent output)");
      metas.resize(static_cast<size_t>(cs.num_rets));
      for (size_t j = 0; j < metas.size(); ++j) metas[j].alias = alias[j];
      NpubMetaContext mctx{context_head(op.name(), meta->user_data), &op, &metas};
      if (NpubError* e = meta->fn(&mctx, args, cs.num_args)) {
        int32_t code = 0;
        const std::string msg = consume_error(e, &code);
        throw Error(code == 0 ? ErrorCode::kInternal : static_cast<ErrorCode>(code),
                    "op '" + op.name() + "' (plugin '" + meta->plugin->name + "'): " + msg);
      }
    }
    const OutputMeta& m = metas[static_cast<size_t>(i)];
    if (!m.set) continue;  // stays undefined, as the kernel would leave it
    DLTensor* t = outputs->allocate(i, launch.dl_device, static_cast<int32_t>(m.shape.size()), m.shape.data(),
                                    to_dl(m.dtype));
    rets[i].tag = NPUB_VALUE_TENSOR;
    rets[i].count = 0;
    rets[i].u.tensor = t;
  }
  // Note [Workspace in a capture]: the workspace is sized now and taken
  // from the graph's pool, held until reset; every replay of the record
  // uses the same bytes (the records run one after another).
  const uint64_t bytes = query_workspace(launch, args, cs.num_args);
  if (bytes > 0) {
    launch.workspace = launch.device->allocate(bytes);
    launch.workspace_bytes = bytes;
    graph.hold(launch.workspace);
  }
  graph.add_node(std::make_unique<CapturedKernel>(launch, args, cs.num_args, rets, cs.num_rets));
}

}  // namespace npub

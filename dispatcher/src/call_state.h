// Internal: the state of one Dispatcher::call, shared by the call path
// (dispatcher.cpp), conversion (conversion.cpp) and the precision check
// (precision_check.cpp).
#pragma once

#include <npubridge/device_sim/copy_engine.h>
#include <npubridge/dispatcher/dispatcher.h>
#include <npubridge/support/dtype.h>

#include <array>
#include <cstdint>
#include <string>
#include <vector>

namespace npub {

struct Dispatcher::CallState {
  const OpHandle* handle = nullptr;
  reg::OpEntry* op = nullptr;
  const NpubValue* args = nullptr;
  int32_t num_args = 0;
  NpubValue* rets = nullptr;
  int32_t num_rets = 0;
  OutputAllocator* outputs = nullptr;
  void* host_call = nullptr;  // the host's view of the call, for its fallback (FallbackCall::host_call)
  DLDevice device{};
  bool has_device = false;
  DType dtype = DType::kUnknown;     // the dispatch dtype
  bool mixed_dtypes = false;         // a tensor argument or return of another dtype than `dtype`
  bool meta = false;                 // infer_meta: tensors carry metadata only (data may be NULL)
  Overlap overlap = Overlap::kNone;  // how written tensors share memory; decides eligible kernels
  // Arguments with defaults filled in, when the caller omitted some.
  std::array<NpubValue, 24> inline_args;  // not zeroed: written before read
  std::vector<NpubValue> heap_args;
};

// "npu:0", "cpu": a device as errors name it (dispatcher.cpp).
std::string device_str(const DLDevice& d);

// Why no kernel serves a validated call (selection.cpp), for the fallback's
// reason and its error under NPUB_FALLBACK=error.
std::string explain_no_kernel(const Dispatcher& d, const Dispatcher::CallState& cs);

// Runs one kernel with the given (possibly staged) arguments on the call's
// device and stream. Throws npub::Error naming the op and the plugin.
void invoke_kernel(sim::DeviceSet& devices, const Dispatcher::CallState& cs, const reg::Kernel& k,
                   const NpubValue* args, NpubValue* rets, OutputAllocator* outputs);

using sim::is_contiguous;

// Note [Which tensors are staged]
// One rule, asked by the call path (run the kernel on the caller's tensors,
// or stage?) and by run_staged (which tensors?): a tensor is staged when the
// call is converted (a half-type call served by a float32 kernel) and the
// tensor is of the converted dtype, or when the kernel takes contiguous
// tensors only (NPUB_KERNEL_CONTIGUOUS_ONLY) and the tensor is strided.
struct StagingRule {
  StagingRule(const reg::Kernel& k, DType convert_from_)
      : convert_from(convert_from_), contiguous_only((k.flags & NPUB_KERNEL_CONTIGUOUS_ONLY) != 0) {}
  DType convert_from;  // kUnknown: not a converted call
  bool contiguous_only;

  bool converting() const { return convert_from != DType::kUnknown; }
  bool needs(const DLTensor* t) const {
    return t != nullptr &&
           ((converting() && dtype_of(t->dtype) == convert_from) || (contiguous_only && !is_contiguous(*t)));
  }
  // Whether the call must go through run_staged: a converted call always
  // does (its outputs come back in float32), any other when one of its
  // tensors, arguments or preallocated returns, needs staging.
  bool applies_to(const Dispatcher::CallState& cs) const {
    if (converting()) return true;
    if (!contiguous_only) return false;
    for (int32_t i = 0; i < cs.num_args; ++i) {
      const NpubValue& v = cs.args[i];
      if (v.tag == NPUB_VALUE_TENSOR && needs(v.u.tensor)) return true;
      if (v.tag == NPUB_VALUE_TENSOR_LIST)
        for (int32_t j = 0; j < v.count; ++j)
          if (needs(v.u.tensors[j])) return true;
    }
    for (int32_t i = 0; i < cs.num_rets; ++i)
      if (cs.rets[i].tag == NPUB_VALUE_TENSOR && needs(cs.rets[i].u.tensor)) return true;
    return false;
  }
};

// An OutputAllocator that refuses: for callers that preallocate everything.
class NoOutputs final : public OutputAllocator {
 public:
  explicit NoOutputs(const std::string& op) : op_(op) {}  // op outlives the call
  DLTensor* allocate(int32_t ret_index, const DLDevice&, int32_t, const int64_t*, DLDataType) override;

 private:
  const std::string& op_;
};

}  // namespace npub

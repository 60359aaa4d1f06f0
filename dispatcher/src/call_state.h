// Internal: the state of one Dispatcher::call, shared by the call path
// (dispatcher.cpp), conversion (conversion.cpp) and the precision check
// (precision_check.cpp).
#pragma once

#include <npubridge/device_sim/copy_engine.h>
#include <npubridge/dispatcher/dispatcher.h>
#include <npubridge/support/dtype.h>

#include <array>
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
  DLDevice device{};
  bool has_device = false;
  DType dtype = DType::kUnknown;  // the dispatch dtype
  bool meta = false;  // infer_meta: tensors carry metadata only (data may be NULL)
  // Arguments with defaults filled in, when the caller omitted some.
  std::array<NpubValue, 24> inline_args;  // not zeroed: written before read
  std::vector<NpubValue> heap_args;
};

// Runs one kernel with the given (possibly staged) arguments on the call's
// device and stream. Throws npub::Error naming the op and the plugin.
void invoke_kernel(sim::DeviceSet& devices, const Dispatcher::CallState& cs,
                   const reg::Kernel& k, const NpubValue* args, NpubValue* rets,
                   OutputAllocator* outputs);

using sim::is_contiguous;

// An OutputAllocator that refuses: for callers that preallocate everything.
class NoOutputs final : public OutputAllocator {
 public:
  explicit NoOutputs(const std::string& op) : op_(op) {}  // op outlives the call
  DLTensor* allocate(int32_t ret_index, const DLDevice&, int32_t, const int64_t*, DLDataType) override;

 private:
  const std::string& op_;
};

}  // namespace npub

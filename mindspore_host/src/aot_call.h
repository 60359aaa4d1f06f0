// One MindSpore AOT call run on the npu, and the routing question asked
// before MindSpore makes the call (which kernel would serve it).
//
// Note [A MindSpore call moves through the copy engine]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// MindSpore's CPU target hands an AOT function host buffers. The simulated
// npu owns its memory, so the call copies each input into a device tensor
// (sim::copy_tensor), runs the registry op through Dispatcher::call (kernel
// selection, the dtype conversion, validation, statistics as for any host),
// and copies each output back into MindSpore's buffer. A MindSpore op that
// no kernel serves never reaches here: npubridge.mindspore asks plan_slot
// first and calls MindSpore's own operator instead (the fallback is the
// framework's own implementation, reached through the framework).
#pragma once

#include <cstdint>
#include <string>

namespace npub::ms {

// The AOT call's view of its tensors: `nparam` of them, the binding's
// inputs then its outputs.
struct AotParams {
  int nparam = 0;
  void** data = nullptr;  // NULL for a plan (metadata only)
  const int* ndims = nullptr;
  int64_t* const* shapes = nullptr;
  const char* const* dtypes = nullptr;  // MindSpore's names: "float32", "bfloat16", ...
  const double* scalars = nullptr;      // a plan's values of the 0-d inputs (NULL: data holds them)
};

// Runs slot's binding on the params; throws npub::Error naming the op.
void run_slot(int slot, const AotParams& p);

// What serves slot's call on tensors of these dtypes and shapes: true and
// `plugin` (and `conversion`, "float16->float32" or "") when a kernel does;
// false and `reason` when none does. Throws npub::Error naming the op for
// arguments the op rejects.
bool plan_slot(int slot, const AotParams& p, std::string& plugin, std::string& conversion,
               std::string& reason);

}  // namespace npub::ms

// The npu's device track in torch.profiler (profiler_kineto.cpp), fed by the
// trace hooks (profiler_trace.cpp).
#pragma once

#include <cstdint>
#include <string>

namespace npub::torch_backend {

// Is a kineto session with npu activities recording (cheap: one load).
bool npu_trace_recording();
// One device slice, CLOCK_REALTIME nanoseconds (c10::getTime(), the clock of
// the profiler's CPU events).
void npu_trace_add(std::string name, int64_t start_ns, int64_t end_ns, int device);

}  // namespace npub::torch_backend

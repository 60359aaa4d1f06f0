// The backend's start-up (init.cpp), in two steps, as torch.cuda's:
//  - register_backend(), at `import npubridge` (which `import torch` runs
//    through the torch.backends entry point): the hooks and allocators
//    PyTorch asks for. No device, no thread, no plugin.
//  - ensure_started(), at the first npu use (an npu tensor, a device or
//    stream query, torch.npu.init()): the runtime from the NPUB_* settings
//    as they are then, the plugins, the dispatcher's fallback, the plugin
//    ops' registrations, then the Python side's (npubridge._on_start).
// Note [The runtime starts at the first npu use].
#pragma once

#include <functional>

namespace npub::torch_backend {

void register_backend();

// Starts the runtime once; later calls cost one atomic load. Throws c10's
// error (RuntimeError in Python) naming the setting when an NPUB_* setting
// is bad, at every call until it is fixed. Re-entry from the start itself
// (a registration that reaches the runtime) returns at once.
void ensure_started();

// The device count now, without starting anything: the runtime's once it
// has started, before that the count the NPUB_* settings ask for, every
// setting checked as the start would check it. Throws c10's error naming
// the variable (as ensure_started() would) for a bad one.
int device_count_now();

// Whether the runtime has started (never starts it).
bool runtime_started();

// Run once by ensure_started() after the C++ registrations, with the GIL:
// the Python side's part of the start (npubridge/__init__.py).
void set_python_start_hook(std::function<void()> hook);

}  // namespace npub::torch_backend

// The backend's start-up (init.cpp), what npubridge._C._init runs once, at
// import: the hooks, the allocator, the dispatcher's fallback and the
// plugin ops' registrations.
#pragma once

namespace npub::torch_backend {

void init();

}  // namespace npub::torch_backend

// Trace hooks (Note [Trace hooks cost one load when off], trace.h).
#include <npubridge/dispatcher/trace.h>

namespace npub::trace {

namespace detail {
std::atomic<const Hooks*> g_hooks{nullptr};
}

void set_hooks(const Hooks* hooks) { detail::g_hooks.store(hooks, std::memory_order_release); }

}  // namespace npub::trace

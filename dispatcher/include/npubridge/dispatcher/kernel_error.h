// The error a plugin kernel reported for a call, as the dispatcher raises
// it ("op 'X' failed in the kernel of plugin 'P': reason"), apart from the
// dispatcher's own errors (validation, selection, overlap): a host may let
// its framework word a kernel's refusal of arguments instead (python_ext
// does for out= calls, whose checks ATen words per op).
#pragma once

#include <npubridge/support/error.h>

namespace npub {

class KernelError : public Error {
 public:
  using Error::Error;
};

}  // namespace npub

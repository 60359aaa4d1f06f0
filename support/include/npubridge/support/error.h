// The C++ error type of npubridge's host side. Every layer throws npub::Error;
// the C boundary turns it into NpubError and back (dispatcher/host_api.cpp).
#pragma once

#include <npubridge/plugin_api.h>

#include <stdexcept>
#include <string>

namespace npub {

enum class ErrorCode : int32_t {
  kInvalidArgument = NPUB_ERR_INVALID_ARGUMENT,
  kUnsupported = NPUB_ERR_UNSUPPORTED,
  kOutOfMemory = NPUB_ERR_OUT_OF_MEMORY,
  kInternal = NPUB_ERR_INTERNAL,
  kAbi = NPUB_ERR_ABI,
  kNotFound = NPUB_ERR_NOT_FOUND,
  kIndex = NPUB_ERR_INDEX,
};

class Error : public std::runtime_error {
 public:
  Error(ErrorCode code, const std::string& message) : std::runtime_error(message), code_(code) {}
  ErrorCode code() const noexcept { return code_; }

 private:
  ErrorCode code_;
};

// The allocator's out-of-memory error; python_ext maps it to
// torch.OutOfMemoryError.
class OutOfMemoryError : public Error {
 public:
  explicit OutOfMemoryError(const std::string& message) : Error(ErrorCode::kOutOfMemory, message) {}
};

}  // namespace npub

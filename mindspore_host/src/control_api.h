// The C functions libnpub_mindspore.so exports: the AOT entry points
// MindSpore calls (one per slot, Note [One exported function per slot]) and
// the control functions npubridge.mindspore calls through ctypes.
//
// Every control function returns 0 on success and -1 on failure, with the
// message in npub_ms_last_error() (per thread); none throws across the C
// boundary. An AOT entry point returns 0, or 1 with the message printed to
// stderr and kept for npub_ms_last_call_error() (process-wide: MindSpore
// calls AOT kernels from threads of its own, and reports only that the
// custom op failed).
#pragma once

#include "binding.h"

#include <cstdint>

#define NPUB_MS_EXPORT __attribute__((visibility("default")))

extern "C" {

// The AOT signature of MindSpore's ops.Custom(func_type="aot").
NPUB_MS_EXPORT int npub_ms_aot_call(int slot, int nparam, void** params, int* ndims, int64_t** shapes,
                                    const char** dtypes);

// The last error message of this thread's control calls ("" if none).
NPUB_MS_EXPORT const char* npub_ms_last_error(void);

// The last failed AOT call's message, from any thread; returns the length
// needed (writes nothing past out_len).
NPUB_MS_EXPORT int npub_ms_last_call_error(char* out, int out_len);

// Whether bind would accept `op` with `layout` and `outputs`, without
// binding a slot. 0 or -1.
NPUB_MS_EXPORT int npub_ms_check_layout(const char* op, const char* layout, const char* outputs);

// Starts the runtime (devices, plugins) if it is not running. 0 or -1.
NPUB_MS_EXPORT int npub_ms_start(void);

// Binds the next free slot to `op` (binding.h's layout and outputs
// grammar); returns the slot, or -1.
NPUB_MS_EXPORT int npub_ms_bind(const char* op, const char* layout, const char* outputs);

// Which kernel would serve slot's call on these tensors (the binding's
// inputs then outputs; `scalars` holds the 0-d inputs' values, by input
// index). Returns 1 (served: `plugin`, `conversion` written), 0 (the
// fallback: `reason` written) or -1 (the op rejects the arguments).
NPUB_MS_EXPORT int npub_ms_plan(int slot, int nparam, const int* ndims, int64_t* const* shapes,
                                const char* const* dtypes, const double* scalars, char* plugin,
                                int plugin_len, char* conversion, int conversion_len, char* reason,
                                int reason_len);

// Judges `got` against the float64 reference `reference` and the host's own
// result `host` (the same computation in `dtype`), `numel` values each, by
// npubridge's one comparator for an op without an entry of its own
// (numerics::compare, kHostCalibrated: Note [The error model]). Returns 1
// (every element within its bound), 0 (not: `worst` gets the worst element's
// index, value, reference, error and bound, and the count of mismatched
// elements), or -1 (an unknown dtype).
NPUB_MS_EXPORT int npub_ms_judge(const char* dtype, int64_t numel, const double* got, const double* reference,
                                 const double* host, double* worst);

// The schema of a registry op, printed ("" and -1 when unknown).
NPUB_MS_EXPORT int npub_ms_schema(const char* op, char* out, int out_len);

// Settings of the dispatcher (shared with every other host of the process).
NPUB_MS_EXPORT int npub_ms_set_opt_level(int level);
NPUB_MS_EXPORT int npub_ms_opt_level(void);
NPUB_MS_EXPORT int npub_ms_set_dtype_conversion(int on);
NPUB_MS_EXPORT int npub_ms_dtype_conversion(void);

// The dispatcher's statistics as JSON: [{"op", "calls", "fallbacks",
// "conversions", "errors", "kernels": [{"plugin", "calls"}]}]; the loaded
// plugins as JSON: {"loaded": [{"name", "version", "path"}], "rejected":
// ["reason", ...]}. Return the length needed (write nothing past out_len).
NPUB_MS_EXPORT int npub_ms_stats_json(char* out, int out_len);
NPUB_MS_EXPORT int npub_ms_reset_stats(void);
NPUB_MS_EXPORT int npub_ms_plugins_json(char* out, int out_len);

}  // extern "C"

#define NPUB_MS_SLOT(i)                                                                                   \
  extern "C" NPUB_MS_EXPORT int npub_ms_slot_##i(int nparam, void** params, int* ndims, int64_t** shapes, \
                                                 const char** dtypes, void*, void*) {                     \
    return npub_ms_aot_call(i, nparam, params, ndims, shapes, dtypes);                                    \
  }

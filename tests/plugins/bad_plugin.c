/* One purpose-built bad plugin per failure mode, selected by BAD_MODE at
 * compile time (tests/CMakeLists.txt builds one library per mode). Each
 * mode's expected rejection message is asserted in tests/unit/test_loader.cpp;
 * the crash and hang modes are npub-plugins --check's (tests/CMakeLists.txt). */
#define _POSIX_C_SOURCE 200809L /* raise, pause */
#include <npubridge/plugin_api.h>

#include <string.h>

#include <signal.h>
#include <stddef.h>
#include <unistd.h>

#define MODE_NO_ENTRY 1
#define MODE_WRONG_MAJOR_SYMBOL 2
#define MODE_STRUCT_TOO_SMALL 3
#define MODE_NULL_INITIALIZE 4
#define MODE_INIT_ERROR 5
#define MODE_BAD_SCHEMA 6
#define MODE_SCHEMA_CONFLICT 7
#define MODE_UNDEFINED_OP 8
#define MODE_DUPLICATE_KERNEL 9
#define MODE_KERNEL_ERROR 10
#define MODE_NULL_KERNEL_FN 11
#define MODE_KERNEL_DESC_TOO_SMALL 12
#define MODE_API_MAJOR_MISMATCH 13
#define MODE_BAD_NAME 14
#define MODE_ENTRY_RETURNS_NULL 15
#define MODE_IGNORED_ERROR 16
#define MODE_DERIVATIVE_UNKNOWN_INPUT 17
#define MODE_DERIVATIVE_ARITY 18
#define MODE_DERIVATIVE_RETURNS 19
#define MODE_META_UNDEFINED_OP 20
#define MODE_CRASH_IN_INIT 21
#define MODE_HANG_IN_INIT 22
#define MODE_FUSION_PATTERN_SYNTAX 23
#define MODE_FUSION_PATTERN_UNDEFINED_OP 24

#ifndef BAD_MODE
#error "BAD_MODE must be defined"
#endif

#define STR2(x) #x
#define STR(x) STR2(x)

static const NpubHostApi* g_host = NULL;

static NpubError* failing_kernel(NpubCallContext* ctx, const NpubValue* args, int32_t num_args,
                                 NpubValue* rets, int32_t num_rets) {
  (void)ctx;
  (void)args;
  (void)num_args;
  (void)rets;
  (void)num_rets;
  return g_host->error_create(NPUB_ERR_INVALID_ARGUMENT, "simulated failure inside the kernel");
}

static NpubError* any_meta(NpubMetaContext* ctx, const NpubValue* args, int32_t num_args) {
  (void)ctx;
  (void)args;
  (void)num_args;
  return NULL;
}

/* Two ops for the derivative modes. */
static NpubError* define_pair(NpubRegistrar* reg) {
  NpubError* err = g_host->define_op(reg, "bd::f(Tensor self, Tensor w) -> Tensor");
  if (err != NULL) return err;
  return g_host->define_op(reg, "bd::f_backward(Tensor grad, Tensor self, Tensor w) -> (Tensor, Tensor)");
}

static NpubKernelDesc make_desc(const char* op) {
  NpubKernelDesc d;
  memset(&d, 0, sizeof d);
  d.struct_size = sizeof d;
  d.op_name = op;
  d.device_type = NPUB_DEVICE_NPU;
  d.priority = 0;
  d.dtypes = NULL;
  d.num_dtypes = 0;
  d.flags = 0;
  d.fn = failing_kernel;
  d.supports = NULL;
  d.workspace_size = NULL;
  d.user_data = NULL;
  d.user_data_deleter = NULL;
  d.min_opt_level = 1;
  return d;
}

static NpubError* initialize(const NpubHostApi* host, NpubRegistrar* reg) {
  NpubKernelDesc d;
  NpubError* err;
  g_host = host;
  switch (BAD_MODE) {
    case MODE_INIT_ERROR:
      return host->error_create(NPUB_ERR_INTERNAL, "simulated failure: device firmware not found");
    case MODE_BAD_SCHEMA:
      return host->define_op(reg, "bad::op(Tensor self, -> Tensor");
    case MODE_SCHEMA_CONFLICT:
      /* testc::scale exists (good_c) as (Tensor self, float factor) -> Tensor */
      return host->define_op(reg, "testc::scale(Tensor self, int factor) -> Tensor");
    case MODE_UNDEFINED_OP:
      d = make_desc("nowhere::undefined_op");
      return host->register_kernel(reg, &d);
    case MODE_DUPLICATE_KERNEL:
      if ((err = host->define_op(reg, "dup::op(Tensor self) -> Tensor")) != NULL) return err;
      d = make_desc("dup::op");
      if ((err = host->register_kernel(reg, &d)) != NULL) return err;
      return host->register_kernel(reg, &d);
    case MODE_KERNEL_ERROR:
      if ((err = host->define_op(reg, "badk::fail(Tensor self) -> Tensor")) != NULL) return err;
      d = make_desc("badk::fail");
      return host->register_kernel(reg, &d);
    case MODE_NULL_KERNEL_FN:
      if ((err = host->define_op(reg, "nullfn::op(Tensor self) -> Tensor")) != NULL) return err;
      d = make_desc("nullfn::op");
      d.fn = NULL;
      return host->register_kernel(reg, &d);
    case MODE_KERNEL_DESC_TOO_SMALL:
      if ((err = host->define_op(reg, "small::op(Tensor self) -> Tensor")) != NULL) return err;
      d = make_desc("small::op");
      d.struct_size = 16;
      return host->register_kernel(reg, &d);
    case MODE_IGNORED_ERROR:
      /* The plugin ignores the error and reports success: still rejected. */
      err = host->define_op(reg, "ignored::op(NotAType self) -> Tensor");
      if (err != NULL) host->error_destroy(err);
      return NULL;
    case MODE_DERIVATIVE_UNKNOWN_INPUT:
      if ((err = define_pair(reg)) != NULL) return err;
      return host->define_derivative(reg, "bd::f", "self, bias: bd::f_backward(grad, self, w)");
    case MODE_DERIVATIVE_ARITY:
      if ((err = define_pair(reg)) != NULL) return err;
      return host->define_derivative(reg, "bd::f", "self, w: bd::f_backward(grad, self)");
    case MODE_DERIVATIVE_RETURNS:
      if ((err = define_pair(reg)) != NULL) return err;
      return host->define_derivative(reg, "bd::f", "self: bd::f_backward(grads[0], self, results[1])");
    case MODE_META_UNDEFINED_OP:
      return host->register_meta(reg, "nowhere::op", any_meta);
    case MODE_FUSION_PATTERN_SYNTAX:
      /* ABI 1.5: a malformed pattern rejects the plugin, and with it the
       * op and kernel it registered first. */
      if ((err = host->define_op(reg, "bfp::op(Tensor self) -> Tensor")) != NULL) return err;
      d = make_desc("bfp::op");
      if ((err = host->register_kernel(reg, &d)) != NULL) return err;
      return host->register_fusion_pattern(reg,
                                           "pattern fine\n  %a = aten::relu(%x)\n  => bfp::op(%a)\nend\n"
                                           "pattern broken\n  %a = aten::relu(%x\n  => bfp::op(%a)\nend\n");
    case MODE_FUSION_PATTERN_UNDEFINED_OP:
      return host->register_fusion_pattern(reg,
                                           "pattern p\n  %a = aten::relu(%x)\n  => nowhere::op(%a)\nend\n");
    case MODE_CRASH_IN_INIT:
      raise(SIGSEGV); /* as a wild pointer would */
      return NULL;
    case MODE_HANG_IN_INIT:
      for (;;) pause(); /* waits for a device that never answers */
    default:
      return NULL;
  }
}

#if BAD_MODE == MODE_NO_ENTRY
NPUB_PLUGIN_EXPORT int npub_plugin_something_else(void) { return 42; }
#elif BAD_MODE == MODE_WRONG_MAJOR_SYMBOL
NPUB_PLUGIN_EXPORT const NpubPluginApi* npub_plugin_init_v2(void) { return NULL; }
#else
NPUB_PLUGIN_EXPORT const NpubPluginApi* npub_plugin_init_v1(void) {
  static NpubPluginApi api = {
      sizeof(NpubPluginApi), NPUB_ABI_MAJOR, NPUB_ABI_MINOR, "bad_" STR(BAD_MODE), "0.0.1", initialize, NULL};
#if BAD_MODE == MODE_STRUCT_TOO_SMALL
  api.struct_size = offsetof(NpubPluginApi, name);
#elif BAD_MODE == MODE_NULL_INITIALIZE
  api.initialize = NULL;
#elif BAD_MODE == MODE_API_MAJOR_MISMATCH
  api.abi_major = 7;
#elif BAD_MODE == MODE_BAD_NAME
  api.name = "bad name!";
#elif BAD_MODE == MODE_ENTRY_RETURNS_NULL
  return NULL;
#endif
  return &api;
}
#endif

/* A plugin written entirely in C (C99) against plugin_api.h: proof that the
 * ABI needs no C++. Ops:
 *   testc::scale(Tensor self, float factor) -> Tensor      (host-allocated output, parallel_for)
 *   testc::add_one_(Tensor(a!) self) -> Tensor(a!)          (in place)
 *   testc::count_positive(Tensor self) -> int              (scalar return)
 * NPUB_TEST_GOOD_C_INIT_DELAY_MS makes initialize sleep first (the loader's
 * concurrency test widens the window between two loads with it).
 */
#define _POSIX_C_SOURCE 199309L
#include <npubridge/plugin_api.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static const NpubHostApi* g_host = NULL;

static int is_f32_contiguous(const DLTensor* t) {
  int64_t expected = 1;
  int i;
  if (t->dtype.code != kDLFloat || t->dtype.bits != 32 || t->dtype.lanes != 1) return 0;
  if (t->strides == NULL) return 1;
  for (i = t->ndim - 1; i >= 0; --i) {
    if (t->shape[i] != 1 && t->strides[i] != expected) return 0;
    expected *= t->shape[i];
  }
  return 1;
}

static int64_t numel(const DLTensor* t) {
  int64_t n = 1;
  int i;
  for (i = 0; i < t->ndim; ++i) n *= t->shape[i];
  return n;
}

typedef struct {
  const float* in;
  float* out;
  float factor;
} ScaleJob;

static void scale_body(void* user, int64_t begin, int64_t end) {
  ScaleJob* job = (ScaleJob*)user;
  int64_t i;
  for (i = begin; i < end; ++i) job->out[i] = job->in[i] * job->factor;
}

static NpubError* scale_kernel(NpubCallContext* ctx, const NpubValue* args, int32_t num_args, NpubValue* rets,
                               int32_t num_rets) {
  const DLTensor* x = args[0].u.tensor;
  DLTensor* y = NULL;
  NpubError* err;
  ScaleJob job;
  (void)num_args;
  (void)rets;
  (void)num_rets;
  if (!is_f32_contiguous(x))
    return g_host->error_create(NPUB_ERR_UNSUPPORTED, "testc::scale: expected a contiguous float32 tensor");
  err = g_host->alloc_output(ctx, 0, x->ndim, x->shape, x->dtype, &y);
  if (err != NULL) return err;
  job.in = (const float*)((const char*)x->data + x->byte_offset);
  job.out = (float*)((char*)y->data + y->byte_offset);
  job.factor = (float)(args[1].tag == NPUB_VALUE_DOUBLE ? args[1].u.d : (double)args[1].u.i);
  g_host->parallel_for(ctx, 0, numel(x), 1024, scale_body, &job);
  return NULL;
}

static NpubError* add_one_kernel(NpubCallContext* ctx, const NpubValue* args, int32_t num_args,
                                 NpubValue* rets, int32_t num_rets) {
  DLTensor* x = args[0].u.tensor;
  float* p;
  int64_t i, n;
  (void)ctx;
  (void)num_args;
  (void)rets;
  (void)num_rets;
  if (!is_f32_contiguous(x))
    return g_host->error_create(NPUB_ERR_UNSUPPORTED,
                                "testc::add_one_: expected a contiguous float32 tensor");
  p = (float*)((char*)x->data + x->byte_offset);
  n = numel(x);
  for (i = 0; i < n; ++i) p[i] += 1.0f;
  return NULL;
}

static NpubError* count_positive_kernel(NpubCallContext* ctx, const NpubValue* args, int32_t num_args,
                                        NpubValue* rets, int32_t num_rets) {
  const DLTensor* x = args[0].u.tensor;
  const float* p;
  int64_t i, n, count = 0;
  (void)ctx;
  (void)num_args;
  (void)num_rets;
  if (!is_f32_contiguous(x))
    return g_host->error_create(NPUB_ERR_UNSUPPORTED, "testc::count_positive: expected contiguous float32");
  p = (const float*)((const char*)x->data + x->byte_offset);
  n = numel(x);
  for (i = 0; i < n; ++i) count += p[i] > 0.0f;
  rets[0].tag = NPUB_VALUE_INT;
  rets[0].count = 0;
  rets[0].u.i = count;
  return NULL;
}

/* Meta function of testc::scale (ABI 1.2): the result is like self. */
static NpubError* scale_meta(NpubMetaContext* ctx, const NpubValue* args, int32_t num_args) {
  const DLTensor* self = args[0].u.tensor;
  (void)num_args;
  return g_host->set_output_meta(ctx, 0, self->ndim, self->shape, self->dtype);
}

static NpubError* register_one(NpubRegistrar* reg, const char* op, NpubKernelFn fn) {
  static const DLDataType f32 = {kDLFloat, 32, 1};
  NpubKernelDesc desc;
  /* Zeroed first: fields a later minor version appends then read as absent. */
  memset(&desc, 0, sizeof desc);
  desc.struct_size = NPUB_KERNEL_DESC_STRUCT_SIZE;
  desc.op_name = op;
  desc.device_type = NPUB_DEVICE_NPU;
  desc.priority = 0;
  desc.dtypes = &f32;
  desc.num_dtypes = 1;
  desc.flags = 0;
  desc.fn = fn;
  desc.supports = NULL;
  desc.workspace_size = NULL;
  desc.user_data = NULL;
  desc.user_data_deleter = NULL;
  desc.min_opt_level = 1;
  return g_host->register_kernel(reg, &desc);
}

static NpubError* initialize(const NpubHostApi* host, NpubRegistrar* reg) {
  NpubError* err;
  const char* delay = getenv("NPUB_TEST_GOOD_C_INIT_DELAY_MS");
  if (delay != NULL) {
    struct timespec ts;
    const long ms = atol(delay);
    ts.tv_sec = ms / 1000;
    ts.tv_nsec = (ms % 1000) * 1000000L;
    nanosleep(&ts, NULL);
  }
  g_host = host;
  if ((err = host->define_op(reg, "testc::scale(Tensor self, float factor) -> Tensor")) != NULL) return err;
  if ((err = host->define_op(reg, "testc::add_one_(Tensor(a!) self) -> Tensor(a!)")) != NULL) return err;
  if ((err = host->define_op(reg, "testc::count_positive(Tensor self) -> int")) != NULL) return err;
  if ((err = register_one(reg, "testc::scale", scale_kernel)) != NULL) return err;
  if ((err = register_one(reg, "testc::add_one_", add_one_kernel)) != NULL) return err;
  if ((err = register_one(reg, "testc::count_positive", count_positive_kernel)) != NULL) return err;
  /* register_meta and define_derivative came with ABI 1.2: an older host's
   * table ends before them, so the plugin checks before calling. */
  if (host->struct_size >= NPUB_HOST_API_STRUCT_SIZE_1_2) {
    if ((err = host->register_meta(reg, "testc::scale", scale_meta)) != NULL) return err;
    /* d(self * factor)/d(self) applied to grad is scale(grad, factor). */
    if ((err = host->define_derivative(reg, "testc::scale", "self: testc::scale(grads[0], factor)")) != NULL)
      return err;
  }
  host->log(NPUB_LOG_DEBUG, "good_c_plugin initialised");
  return NULL;
}

NPUB_PLUGIN_EXPORT const NpubPluginApi* npub_plugin_init_v1(void) {
  static const NpubPluginApi api = {
      sizeof(NpubPluginApi), NPUB_ABI_MAJOR, NPUB_ABI_MINOR, "good_c", "1.0.0", initialize, NULL};
  return &api;
}

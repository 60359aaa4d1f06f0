/* A complete npubridge plugin in C99, against npubridge/plugin_api.h alone.
 *
 *   cplug::hardtanh(Tensor self, float min_val=-1, float max_val=1) -> Tensor
 *
 * clamps each element of a float32 tensor to [min_val, max_val] into a new
 * tensor the host allocates, on the device's compute threads. From PyTorch:
 * torch.ops.cplug.hardtanh(x.to("npu"), -0.5, 0.5).
 *
 * It registers a meta function too (so torch.compile can trace the op), a
 * host service ABI 1.2 added: a plugin checks the host table's struct_size
 * before it uses an entry added after 1.0, and works without it on an older
 * host.
 */
#include <npubridge/plugin_api.h>

#include <stddef.h>
#include <string.h>

static const NpubHostApi* g_host = NULL;

static int is_contiguous_f32(const DLTensor* t) {
  int64_t expected = 1;
  int i;
  if (t->dtype.code != kDLFloat || t->dtype.bits != 32 || t->dtype.lanes != 1) return 0;
  if (t->strides == NULL) return 1; /* NULL strides: compact row-major (DLPack) */
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

/* A float argument arrives as a double, or as an int when the caller wrote one. */
static float float_arg(const NpubValue* v) {
  return (float)(v->tag == NPUB_VALUE_DOUBLE ? v->u.d : (double)v->u.i);
}

typedef struct {
  const float* in;
  float* out;
  float lo, hi;
} HardtanhJob;

static void hardtanh_range(void* user, int64_t begin, int64_t end) {
  const HardtanhJob* job = (const HardtanhJob*)user;
  int64_t i;
  for (i = begin; i < end; ++i) {
    const float x = job->in[i];
    job->out[i] = x < job->lo ? job->lo : (x > job->hi ? job->hi : x);
  }
}

static NpubError* hardtanh_kernel(NpubCallContext* ctx, const NpubValue* args, int32_t num_args,
                                  NpubValue* rets, int32_t num_rets) {
  const DLTensor* self = args[0].u.tensor;
  DLTensor* out = NULL;
  NpubError* err;
  HardtanhJob job;
  (void)num_args;
  (void)rets;
  (void)num_rets;
  job.lo = float_arg(&args[1]);
  job.hi = float_arg(&args[2]);
  if (!(job.lo <= job.hi))
    return g_host->error_create(NPUB_ERR_INVALID_ARGUMENT, "cplug::hardtanh: expected min_val <= max_val");
  /* The kernel is registered contiguous-only for float32, so the host has
   * converted anything else; checked anyway, as the contract is cheap to test. */
  if (!is_contiguous_f32(self))
    return g_host->error_create(NPUB_ERR_UNSUPPORTED,
                                "cplug::hardtanh: expected a contiguous float32 tensor");
  err = g_host->alloc_output(ctx, 0, self->ndim, self->shape, self->dtype, &out);
  if (err != NULL) return err;
  job.in = (const float*)((const char*)self->data + self->byte_offset);
  job.out = (float*)((char*)out->data + out->byte_offset);
  g_host->parallel_for(ctx, 0, numel(self), 4096, hardtanh_range, &job);
  return NULL;
}

/* The result has self's shape and dtype. */
static NpubError* hardtanh_meta(NpubMetaContext* ctx, const NpubValue* args, int32_t num_args) {
  const DLTensor* self = args[0].u.tensor;
  (void)num_args;
  return g_host->set_output_meta(ctx, 0, self->ndim, self->shape, self->dtype);
}

static NpubError* initialize(const NpubHostApi* host, NpubRegistrar* reg) {
  static const DLDataType f32 = {kDLFloat, 32, 1};
  NpubKernelDesc desc;
  NpubError* err;
  g_host = host;
  err = host->define_op(reg, "cplug::hardtanh(Tensor self, float min_val=-1, float max_val=1) -> Tensor");
  if (err != NULL) return err;
  /* Zero it first: a field a later header appends then reads as absent. */
  memset(&desc, 0, sizeof desc);
  desc.struct_size = NPUB_KERNEL_DESC_STRUCT_SIZE;
  desc.op_name = "cplug::hardtanh";
  desc.device_type = NPUB_DEVICE_NPU;
  desc.priority = 0;
  desc.dtypes = &f32;
  desc.num_dtypes = 1;
  desc.flags = NPUB_KERNEL_CONTIGUOUS_ONLY;
  desc.fn = hardtanh_kernel;
  desc.supports = NULL;
  desc.workspace_size = NULL;
  desc.user_data = NULL;
  desc.user_data_deleter = NULL;
  desc.min_opt_level = 1;
  if ((err = host->register_kernel(reg, &desc)) != NULL) return err;
  /* register_meta is \since 1.2: only when the host's table has it. */
  if (host->struct_size >= NPUB_STRUCT_SIZE(NpubHostApi, register_meta) && host->register_meta != NULL) {
    if ((err = host->register_meta(reg, "cplug::hardtanh", hardtanh_meta)) != NULL) return err;
  } else {
    host->log(NPUB_LOG_INFO, "cplug: host before ABI 1.2, no meta function for cplug::hardtanh");
  }
  return NULL;
}

NPUB_PLUGIN_EXPORT const NpubPluginApi* npub_plugin_init_v1(void) {
  static const NpubPluginApi api = {
      NPUB_PLUGIN_API_STRUCT_SIZE, NPUB_ABI_MAJOR, NPUB_ABI_MINOR, "cplug", "1.0.0", initialize, NULL};
  return &api;
}
